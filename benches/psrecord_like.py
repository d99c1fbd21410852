# What psrecord does each interval, without psutil: find the descendants of
# PID through /proc, read each one's stat and statm. Prints its own CPU
# seconds when PID is gone.
import os, sys, time
root, interval = int(sys.argv[1]), float(sys.argv[2])
while os.path.exists("/proc/%d" % root):
    parents = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                st = open("/proc/%s/stat" % d).read()
            except OSError:
                continue
            parents.setdefault(int(st.rsplit(")", 1)[1].split()[1]), []).append(int(d))
    todo, tree = [root], []
    while todo:
        p = todo.pop()
        tree.append(p)
        todo.extend(parents.get(p, []))
    cpu = rss = 0
    for p in tree:
        try:
            f = open("/proc/%d/stat" % p).read().rsplit(")", 1)[1].split()
            cpu += int(f[11]) + int(f[12])
            rss += int(open("/proc/%d/statm" % p).read().split()[1])
        except OSError:
            pass
    time.sleep(interval)
t = os.times()
print(t.user + t.system, flush=True)
