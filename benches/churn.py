# A parent that holds SHARED MiB and re-forks WORKERS workers every epoch,
# as PyTorch's DataLoader does with persistent_workers=False. Used by
# tests/pss.rs and benches/pss.rs.
#
# With a 9th argument EVENTS, every step that changes the tree's memory is
# appended to that file as `WHAT PID EPOCH_SECONDS`: `shared` (the parent's
# SHARED MiB are written), `fork` (by the parent, after fork), `ready` (by
# the worker, its PRIV MiB written), `exit` (by the worker, just before it
# exits), `reaped` (by the parent, after waitpid), `end`. tests/pss.rs
# builds the true footprint from it.
import os, sys, time
shared, priv, workers, epochs = (int(a) for a in sys.argv[1:5])
epoch_s, gap_s, lead_s, tail_s = (float(a) for a in sys.argv[5:9])
events = sys.argv[9] if len(sys.argv) > 9 else None
def note(what, pid):
    if events:
        fd = os.open(events, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, ("%s %d %.6f\n" % (what, pid, time.time())).encode())
        os.close(fd)
buf = bytearray(shared << 20)
buf[::4096] = b"\x01" * (len(buf) // 4096)
note("shared", os.getpid())
time.sleep(lead_s)
for e in range(epochs):
    kids = []
    end = time.monotonic() + epoch_s
    for w in range(workers):
        pid = os.fork()
        if pid == 0:
            seen = sum(buf[::4096])
            own = bytearray(priv << 20)
            own[::4096] = b"\x02" * (len(own) // 4096)
            note("ready", os.getpid())
            time.sleep(max(0.0, end - time.monotonic()))
            note("exit", os.getpid())
            os._exit(0 if seen or not shared else 1)
        note("fork", pid)
        kids.append(pid)
    for k in kids:
        os.waitpid(k, 0)
        note("reaped", k)
    time.sleep(gap_s)
time.sleep(tail_s)
note("end", os.getpid())
