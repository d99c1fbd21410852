"""The companion's cost per training step, on the ranks of one torchrun job:
the time spent inside `guard.step()` (the request `stat`, the rate-limited
progress line, and the all-reduce vote over the job's gloo process group)
as a share of a STEP_MS step (compute, then a gradient all-reduce as in
DDP, which keeps the ranks in step). Run under oomguard, which provides the
channel:

    oomguard run --no-tui -- torchrun --nproc-per-node 2 benches/companion_step.py [STEPS] [STEP_MS]

Rank 0 prints one JSON line: steps, step_ms, median and p99 of the time in
guard.step() in microseconds, and the share of the step time."""
import json
import os
import sys
import time

import torch
import torch.distributed as dist

import oomguard

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 400
step_ms = float(sys.argv[2]) if len(sys.argv) > 2 else 50.0
dist.init_process_group("gloo")
g = oomguard.guard()
assert g.active, "run this under oomguard run"
spent = []
# A DDP step: compute, then the gradients' all-reduce (64 K floats here),
# which is what keeps the ranks in step in real training.
grad = torch.zeros(1 << 16)
for step in range(1, steps + 1):
    time.sleep(step_ms / 1000.0)
    dist.all_reduce(grad)
    t0 = time.perf_counter()
    g.step(step)
    spent.append(time.perf_counter() - t0)
spent.sort()
if int(os.environ.get("RANK", "0")) == 0:
    med = spent[len(spent) // 2]
    p99 = spent[int(len(spent) * 0.99)]
    mean = sum(spent) / len(spent)
    print(json.dumps({
        "steps": steps,
        "step_ms": step_ms,
        "median_us": round(med * 1e6, 1),
        "p99_us": round(p99 * 1e6, 1),
        "mean_us": round(mean * 1e6, 1),
        "share_percent": round(100 * mean / (step_ms / 1000.0), 3),
    }), flush=True)
dist.destroy_process_group()
