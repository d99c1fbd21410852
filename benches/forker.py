# A tree of N processes like a trainer with forked workers: the parent
# touches MIB MiB, then forks N-1 children that keep it (copy-on-write) and
# sleep. Prints "ready" when all exist.
import os, sys, time
n, mib, secs = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
buf = bytearray(mib << 20)
for i in range(0, len(buf), 4096):
    buf[i] = 1
kids = []
for _ in range(n - 1):
    pid = os.fork()
    if pid == 0:
        time.sleep(secs)
        os._exit(0)
    kids.append(pid)
print("ready", flush=True)
time.sleep(secs)
for k in kids:
    os.waitpid(k, 0)
