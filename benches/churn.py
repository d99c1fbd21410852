# A parent that holds SHARED MiB and re-forks WORKERS workers every epoch,
# as PyTorch's DataLoader does with persistent_workers=False. Used by
# tests/pss.rs and benches/pss.rs.
import os, sys, time
shared, priv, workers, epochs = (int(a) for a in sys.argv[1:5])
epoch_s, gap_s, lead_s, tail_s = (float(a) for a in sys.argv[5:9])
buf = bytearray(shared << 20)
buf[::4096] = b"\x01" * (len(buf) // 4096)
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
            time.sleep(max(0.0, end - time.monotonic()))
            os._exit(0 if seen else 1)
        kids.append(pid)
    for k in kids:
        os.waitpid(k, 0)
    time.sleep(gap_s)
time.sleep(tail_s)
