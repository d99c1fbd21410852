"""Time from a signal sent to oomguard to the ranks' `done`, and to
oomguard's exit, on 2 gloo ranks under torchrun (the plain-loop fixture,
50 ms steps, no leak):

    python3 benches/signal_save.py target/release/oomguard VENV [RUNS] [SIGNAL]

VENV is the torch environment (its bin/torchrun runs the ranks); SIGNAL is
TERM (default) or USR1. Per run: the job trains 20 steps, the signal is
sent, and the log gives the `t` of the `action` the signal started and of
the matching `checkpoint_done`; the exit is timed from the signal on this
side. Prints one JSON line: runs, and median and max of both (s)."""
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

binary, venv = os.path.abspath(sys.argv[1]), sys.argv[2]
runs = int(sys.argv[3]) if len(sys.argv) > 3 else 5
sig = getattr(signal, "SIG" + (sys.argv[4] if len(sys.argv) > 4 else "TERM"))
here = os.path.dirname(os.path.abspath(__file__))
job = os.path.join(here, "..", "tests", "fixtures", "jobs", "companion", "plain.py")
to_done, to_exit = [], []
for n in range(runs):
    with tempfile.TemporaryDirectory() as d:
        log = os.path.join(d, "log.ndjson")
        out = os.path.join(d, "out")
        env = dict(os.environ, CKPT_DIR=d, DIST="1", LEAK_MB="0")
        argv = [binary, "run", "--no-tui", "--quiet", "--cgroup", "off", "--log", log, "--",
                os.path.join(venv, "bin", "torchrun"), "--nproc-per-node", "2",
                "--master-port", str(29700 + n), job, "100000"]
        with open(out, "w") as f:
            p = subprocess.Popen(argv, env=env, cwd=d, stdout=f, stderr=subprocess.DEVNULL)
        deadline = time.time() + 120
        while "rank 1 completed step 20\n" not in open(out).read():
            if time.time() > deadline or p.poll() is not None:
                sys.exit("the job did not train")
            time.sleep(0.05)
        sent = time.monotonic()
        p.send_signal(sig)
        p.wait(timeout=60)
        to_exit.append(time.monotonic() - sent)
        asked, done = None, None
        for line in open(log):
            v = json.loads(line)
            if v["event"] == "action" and v["reason"].endswith("received") and asked is None:
                asked = v["t"]
            elif v["event"] == "checkpoint_done":
                done = v["t"]
        to_done.append(done - asked)
print(json.dumps({
    "runs": runs,
    "signal": signal.Signals(sig).name,
    "to_done_median_s": round(statistics.median(to_done), 3),
    "to_done_max_s": round(max(to_done), 3),
    "to_exit_median_s": round(statistics.median(to_exit), 3),
    "to_exit_max_s": round(max(to_exit), 3),
}))
