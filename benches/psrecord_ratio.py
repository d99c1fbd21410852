#!/usr/bin/env python3
"""oomguard's own CPU against psrecord's on the same 64-process tree.

    python3 benches/psrecord_ratio.py OOMGUARD PSRECORD [SECS] [PAIRS] [--nobody LIMIT]

Alternating pairs: `oomguard run --no-tui --log /dev/null` (defaults) over
`benches/forker.py 64 30 SECS`, then the same tree alone watched by
`psrecord PID --include-children --interval 1` (the tool from PyPI). oomguard's
CPU is its utime + stime read from /proc every 0.2 s while it runs (the
last 0.2 s may be missed); psrecord's comes from wait4, exactly.

--nobody LIMIT: oomguard runs as uid 65534 (setpriv) inside a cgroup v1
memory cgroup of LIMIT bytes made here (root needed), as a normal user in a
SLURM step or a container would: no cgroup of its own, no kernel
thresholds, so its cheap loop over the limit's usage counter runs. Needs
root and the cgroup v1 memory controller.
"""
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
FORKER = os.path.join(HERE, "forker.py")
HZ = os.sysconf("SC_CLK_TCK")
CG = "/sys/fs/cgroup/memory/oomguard-psrecord-bench"


def ticks(pid):
    try:
        f = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
        return int(f[11]) + int(f[12])
    except OSError:
        return None


def oomguard_cpu(og, secs, nobody):
    argv = [og, "run", "-q", "--no-tui", "--log", "/dev/null", "--", "python3", FORKER, "64", "30", str(secs)]
    if nobody:
        argv = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', CG,
                "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *argv]
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
    last = 0
    while p.poll() is None:
        t = ticks(p.pid)
        if t is not None:
            last = t
        time.sleep(0.2)
    return last / HZ


def psrecord_cpu(psrecord, secs):
    f = subprocess.Popen(["python3", FORKER, "64", "30", str(secs)], stdout=subprocess.PIPE)
    f.stdout.readline()
    q = subprocess.Popen([psrecord, str(f.pid), "--include-children", "--interval", "1", "--log", "/dev/null"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, _, ru = os.wait4(q.pid, 0)
    f.wait()
    return ru.ru_utime + ru.ru_stime


def main():
    args = sys.argv[1:]
    nobody = None
    if "--nobody" in args:
        i = args.index("--nobody")
        nobody = int(args[i + 1])
        del args[i:i + 2]
    og, psrecord = args[0], args[1]
    secs = int(args[2]) if len(args) > 2 else 32
    pairs = int(args[3]) if len(args) > 3 else 3
    if nobody:
        os.makedirs(CG, exist_ok=True)
        open(CG + "/memory.limit_in_bytes", "w").write(str(nobody))
    total = [0.0, 0.0]
    try:
        for i in range(pairs):
            o = oomguard_cpu(og, secs, nobody)
            s = psrecord_cpu(psrecord, secs)
            total[0] += o
            total[1] += s
            print("pair %d: oomguard %.2f s, psrecord %.2f s, ratio %.2f" % (i + 1, o, s, o / s), flush=True)
    finally:
        if nobody:
            time.sleep(0.5)
            try:
                os.rmdir(CG)
            except OSError:
                pass
    print("%d pairs of %d s%s: oomguard %.2f s, psrecord %.2f s, ratio %.2f"
          % (pairs, secs, " (as uid 65534 in a %d MiB memory cgroup)" % (nobody >> 20) if nobody else "",
             total[0], total[1], total[0] / total[1]))


main()
