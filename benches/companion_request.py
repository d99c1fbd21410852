"""Time from oomguard's checkpoint request to the companion's `done`, on the
plain-loop fixture (50 ms steps, 8 MiB leaked per step) stopped by the
default policy under a 400 MiB budget:

    python3 benches/companion_request.py target/release/oomguard [RUNS]

Per run, the `t` of the stop's `checkpoint_request` and of the matching
`checkpoint_done` in the log; prints one JSON line: runs, median, max (s)."""
import json
import os
import statistics
import subprocess
import sys
import tempfile

binary = sys.argv[1]
runs = int(sys.argv[2]) if len(sys.argv) > 2 else 5
here = os.path.dirname(os.path.abspath(__file__))
job = os.path.join(here, "..", "tests", "fixtures", "jobs", "companion", "plain.py")
delays = []
for _ in range(runs):
    with tempfile.TemporaryDirectory() as d:
        log = os.path.join(d, "log.ndjson")
        env = dict(os.environ, CKPT_DIR=d)
        subprocess.run(
            [binary, "run", "--no-tui", "--quiet", "--cgroup", "off", "--budget", "400M",
             "--log", log, "--", "python3", job],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120,
        )
        asked, done = {}, {}
        for line in open(log):
            v = json.loads(line)
            if v["event"] == "checkpoint_request":
                asked[v["id"]] = v["t"]
            elif v["event"] == "checkpoint_done":
                done[v["id"]] = v["t"]
        last = max(i for i in done if i in asked)
        delays.append(done[last] - asked[last])
print(json.dumps({"runs": runs, "median_s": round(statistics.median(delays), 3),
                  "max_s": round(max(delays), 3)}))
