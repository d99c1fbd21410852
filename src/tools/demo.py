# oomguard demo: a trainer holding shared "weights" and 4 forked DataLoader
# workers whose per-worker cache grows without bound, the leak that ends so
# many training runs at step 580. Standard library only.
import os
import signal
import sys
import time

MiB = 1 << 20
ckpt_dir = sys.argv[1]
workers = int(os.environ.get("NUM_WORKERS", "4"))
leak_mib = float(os.environ.get("DEMO_LEAK_MIB", "1.5"))

weights = bytearray(128 * MiB)          # shared with the workers (copy-on-write)
for i in range(0, len(weights), 4096):
    weights[i] = 1


def worker(wfd):
    cache = []                          # the unbounded per-worker cache
    while True:
        time.sleep(0.1)
        item = bytearray(int(leak_mib * MiB))
        for i in range(0, len(item), 4096):
            item[i] = 1
        cache.append(item)
        try:
            os.write(wfd, b"b")
        except OSError:
            os._exit(0)


pipes = []
for _ in range(workers):
    r, w = os.pipe()
    if os.fork() == 0:
        os.close(r)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        worker(w)
    os.close(w)
    pipes.append(r)

stop = False


def on_term(sig, frame):
    global stop
    stop = True


signal.signal(signal.SIGTERM, on_term)
print(f"demo trainer: 128 MiB of weights, {workers} DataLoader workers, each caching {leak_mib} MiB per batch", flush=True)
step = 0
while True:
    if not os.read(pipes[step % len(pipes)], 1):
        sys.exit(3)
    step += 1
    if step % 40 == 0:
        cached = step * leak_mib
        print(f"step {step:4d} | loss {2.5 / (1 + step / 400):.3f} | worker caches ~{cached:.0f} MiB in total", flush=True)
    if stop:
        os.makedirs(ckpt_dir, exist_ok=True)
        path = os.path.join(ckpt_dir, f"step-{step}.ckpt")
        with open(path + ".tmp", "w") as f:
            f.write(str(step))
        os.rename(path + ".tmp", path)
        print(f"demo trainer: SIGTERM received, checkpoint saved at step {step} ({path}); exiting", flush=True)
        sys.exit(0)
