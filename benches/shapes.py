#!/usr/bin/env python3
"""A job that reproduces one memory shape of a training job inside a memory cgroup.

Used by the policy benchmark and by the integration tests: oomguard launches
it (``oomguard run -- python3 benches/shapes.py SHAPE ...``), measures it, and
must stop the leaking shapes before the kernel OOM killer and never stop the
healthy ones. Standard library only.

    python3 shapes.py SHAPE --usage-file PATH --limit BYTES
                      [--seed N] [--seconds S] [--level F] [--rate MIBPS]

``--usage-file`` is the cgroup file the ceiling is measured against (v1
``memory.usage_in_bytes``, v2 ``memory.current``) and ``--limit`` that
cgroup's limit in bytes. Every level below is a fraction of the limit as
*cgroup usage*: the script reads the usage file and allocates until usage
reaches the target, so a level is exact whatever else (the supervisor, the
interpreter, page cache) is charged to the cgroup. ``--seed`` picks the
parameters within the ranges below (random.Random(seed); without it a seed is
drawn); the chosen ones go to stderr as one JSON line at start
(``{"shape":..., "seed":..., "limit":..., "params":{...}}``) so a failing run
can be reproduced. Memory is real: anonymous private mappings, every page
written, freed by munmap (usage drops at once, whatever glibc's thresholds).

Healthy shapes (peak below 0.90 of the limit as usage, short spikes included;
end on their own with exit 0; ``--seconds`` sets the total time, by default
about 6-8 s, 4-6.5 s for checkpoint_save; ``--level`` sets L, P, B or D, the
final level for stairs; ``--rate`` does not apply):

  load_plateau       load to L in [0.80,0.88] in 0.5-3 s, then flat with
                     allocator noise (1-4 MiB freed and allocated every ~100 ms)
  stairs             3-5 epochs, each a step (0.3-1 s) then flat (1-2 s), from
                     0.45 up to the final L in [0.80,0.88]
  spikes             plateau P in [0.70,0.78]; every 1-2 s a validation spike up
                     to S in [0.84,0.89] (built in 0.2-0.4 s, held 0.3-0.6 s,
                     freed); 3-4 spikes
  sawtooth           base B in [0.60,0.72]; 3-4 cycles of growing by 10-15 % of
                     the limit over 1-2 s (peak <= 0.87) and freeing it at once
  reforking_workers  the trainer holds D in [0.45,0.60]; 3 epochs of ~2 s, each
                     forking 2-4 workers that write W private bytes each
                     (D + workers <= 0.85, copy-on-write included), sleep, exit
                     and are reaped; the parent's data stays shared
  checkpoint_save    plateau P in [0.68,0.76] for 2 s, a save buffer of 8-12 %
                     of the limit (<= 0.88 in all) built in 0.2-0.5 s, held
                     0.5-1 s, freed, then flat 1-2 s

Leaking shapes (never end on their own; a hard stop after ``--seconds``,
default 60, exits 3; ``--level`` sets the start, for fast too (default:
nothing allocated), and ``--rate`` the growth in MiB/s except for step and
fast):

  linear             from ~0.30 grow at R in [50,200] MiB/s
  creep              quickly to C in [0.84,0.87], then creep at 0.5-1.5 % of
                     the limit per second
  burst              flat at F in [0.55,0.70] with noise for 2-4 s, then a
                     burst at 300-800 MiB/s
  step               from ~0.50, a jump of 4-8 % of the limit (allocated within
                     ~0.1 s) every 1.5-3 s, never freed
  fast               two processes (one forked child), each allocating 32-64 MiB
                     chunks without sleeping from a small start (as fast as
                     memset goes); the parent reaps the child

A rate or duration beyond what Python manages just means as fast as possible
(loading 0.88 of 2 GiB in 0.5 s, say). Pacing is
against time.monotonic(); after a stall (SIGSTOP, a slow page fault) a leak
resumes at its rate instead of catching up in one burst.

SIGTERM (and SIGINT) end every shape promptly, between two bounded chunks:
the trainer forwards SIGTERM to its children, reaps them, prints
``shapes: terminated at usage X (F of the limit)`` (``interrupted`` for
SIGINT) to stderr and exits 143 (130). Children die of the signal itself.
"""

import argparse
import json
import mmap
import os
import random
import signal
import sys
import time

MIB = 1 << 20
PAGE = mmap.PAGESIZE
# No MAP_POPULATE: the pages are faulted in by writes from user space, as a
# real allocation's first touch is, so a SIGSTOP takes effect at the next
# page (a populate of a 64 MiB chunk runs to its end in the kernel).
MAP_FLAGS = mmap.MAP_PRIVATE

HEALTHY = (
    "load_plateau",
    "stairs",
    "spikes",
    "sawtooth",
    "reforking_workers",
    "checkpoint_save",
)
LEAKING = ("linear", "creep", "burst", "step", "fast")

KIDS = []  # child pids the trainer forwards SIGTERM to and reaps
HARD = float("inf")  # time.monotonic() of the hard stop
USAGE_FD = -1
LIMIT = 1
PEAK_SEEN = 0  # the highest usage this process read


class HardStop(Exception):
    pass


def usage():
    """The cgroup's usage in bytes (re-read at offset 0 of one open file)."""
    global PEAK_SEEN
    v = int(os.pread(USAGE_FD, 64, 0))
    PEAK_SEEN = max(PEAK_SEEN, v)
    return v


def frac(b):
    return "%.3f" % (b / LIMIT)


def say(msg):
    try:
        sys.stderr.write("shapes: %s\n" % msg)
        sys.stderr.flush()
    except OSError:
        pass


def reap_kids(sig):
    for pid in KIDS:
        if sig:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
    for pid in KIDS:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
    KIDS.clear()


def on_signal(signum, _frame):
    # Runs between two bytecodes of the main thread, so at most one chunk
    # (<= 64 MiB) after the signal arrived.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    try:  # before the children go
        now = usage()
        at = "%d (%s of the limit)" % (now, frac(now))
    except (OSError, ValueError):
        at = "unknown"
    reap_kids(signal.SIGTERM)
    word = "terminated" if signum == signal.SIGTERM else "interrupted"
    say("%s at usage %s" % (word, at))
    os._exit(143 if signum == signal.SIGTERM else 130)


def fork_child():
    """fork() with SIGTERM/SIGINT blocked so that no signal falls between the
    fork and the parent's record of the pid. The child dies of either signal
    by default; returns 0 in the child, the pid in the parent."""
    sigs = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    pid = os.fork()
    if pid == 0:
        KIDS.clear()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    else:
        KIDS.append(pid)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, sigs)
    return pid


def nap(until):
    """Sleep until time.monotonic() reaches `until` (or the hard stop)."""
    while True:
        now = time.monotonic()
        if now >= HARD:
            raise HardStop
        left = min(until, HARD) - now
        if left <= 0:
            return
        time.sleep(left)


def chunk_for(rate):
    """Chunk size for a rate in bytes/s: about 20 ms of growth, 256 KiB-8 MiB."""
    if not rate:
        return 8 * MIB
    return max(PAGE, min(8 * MIB, max(256 << 10, int(rate * 0.02))) // PAGE * PAGE)


class Pool:
    """Memory held in anonymous private mappings, each page written; freed
    (munmap) at once by free()."""

    def __init__(self):
        self.maps = []
        self.bytes = 0

    def alloc(self, n):
        n = max(PAGE, n // PAGE * PAGE)
        m = mmap.mmap(-1, n, flags=MAP_FLAGS)
        m[::PAGE] = b"\x01" * (n // PAGE)
        self.maps.append(m)
        self.bytes += n

    def free(self):
        for m in self.maps:
            m.close()
        self.maps.clear()
        self.bytes = 0

    def grow(self, rate=None, target=None, amount=None, chunk=None):
        """Allocate at `rate` bytes/s (None: as fast as possible) until the
        cgroup's usage reaches `target` bytes or `amount` bytes are allocated
        (neither: until the hard stop)."""
        chunk = chunk or chunk_for(rate)
        t0 = time.monotonic()
        done = 0
        while True:
            if time.monotonic() >= HARD:
                raise HardStop
            n = chunk
            if target is not None:
                n = min(n, target - usage())
            if amount is not None:
                n = min(n, amount - done)
            if n < PAGE:
                return
            self.alloc(n)
            done += n // PAGE * PAGE
            if rate:
                due = t0 + done / rate
                now = time.monotonic()
                if due > now:
                    nap(due)
                elif now - due > 0.25:
                    t0 = now - done / rate  # no catch-up burst after a stall

    def grow_to(self, level, seconds=0.0):
        """Grow until usage is `level` of the limit, paced over `seconds`."""
        target = int(level * LIMIT)
        need = target - usage()
        if need <= 0:
            return
        rate = need / seconds if seconds > 0 else None
        self.grow(rate=rate, target=target)


def flat(until, rng, noise=True):
    """Hold still until `until`; with noise, free and allocate 1-4 MiB every
    ~100 ms like an allocator's churn."""
    nz = Pool()
    while time.monotonic() < until:
        nz.free()
        if noise:
            nz.alloc(rng.randint(1 * MIB // PAGE, 4 * MIB // PAGE) * PAGE)
        nap(min(until, time.monotonic() + rng.uniform(0.08, 0.12)))
    nz.free()


def u(rng, lo, hi, nd=3):
    return round(rng.uniform(lo, hi), nd)


# ---------------------------------------------------------------- parameters


def params_for(shape, rng, a):
    """The shape's parameters: drawn from rng, then --level/--rate/--seconds."""
    total = u(rng, 6.0, 8.0, 2)  # drawn always: --seconds shifts no other draw
    if a.seconds is not None:
        total = a.seconds
    p = {}
    if shape == "load_plateau":
        p["level"] = u(rng, 0.80, 0.88)
        p["load_s"] = u(rng, 0.5, 3.0, 2)
        p["total_s"] = total
    elif shape == "stairs":
        k = rng.randint(3, 5)
        if a.seconds is None:
            total = max(total, round(k * 1.3, 2))
        per = total / k
        step = u(rng, 0.3, max(0.3, min(1.0, per - 1.0)), 2)
        p.update(epochs=k, level=u(rng, 0.80, 0.88), first=0.45)
        p.update(step_s=step, flat_s=round(max(per - step, 0.3), 2))
    elif shape == "spikes":
        n = rng.randint(3, 4)
        load = u(rng, 0.5, 1.0, 2)
        p.update(level=u(rng, 0.70, 0.78), spike=u(rng, 0.84, 0.89), spikes=n)
        p.update(load_s=load, rise_s=u(rng, 0.2, 0.4, 2), hold_s=u(rng, 0.3, 0.6, 2))
        every = (total - load - 0.5) / n
        if a.seconds is None:
            every = min(2.0, max(1.0, every))
        p["every_s"] = round(max(every, p["rise_s"] + p["hold_s"] + 0.1), 2)
        p["total_s"] = total
    elif shape == "sawtooth":
        n = rng.randint(3, 4)
        load = u(rng, 0.5, 1.0, 2)
        base = u(rng, 0.60, 0.72)
        p.update(level=base, grow=u(rng, 0.10, 0.15), cycles=n, load_s=load)
        p["dwell_s"] = u(rng, 0.2, 0.4, 2)
        g = (total - load - 0.5) / n - p["dwell_s"]
        if a.seconds is None:
            g = min(2.0, max(1.0, g))
        p["grow_s"] = round(max(g, 0.2), 2)
        p["total_s"] = total
    elif shape == "reforking_workers":
        n = rng.randint(2, 4)
        p.update(level=u(rng, 0.45, 0.60), workers=n, epochs=3)
        p["load_s"] = u(rng, 0.5, 1.0, 2)
        p["epoch_s"] = u(rng, 1.8, 2.2, 2)
        if a.seconds is not None:
            p["epoch_s"] = round(max(0.3, (a.seconds - p["load_s"]) / 3 - 0.1), 2)
        p["worker_fill"] = u(rng, 0.5, 1.0)  # of the room left under 0.85
    elif shape == "checkpoint_save":
        p.update(level=u(rng, 0.68, 0.76), save=u(rng, 0.08, 0.12))
        p.update(load_s=u(rng, 0.5, 1.0, 2), plateau_s=2.0)
        p.update(build_s=u(rng, 0.2, 0.5, 2), hold_s=u(rng, 0.5, 1.0, 2))
        tail = u(rng, 1.0, 2.0, 2)
        if a.seconds is not None:
            tail = round(max(0.3, a.seconds - p["load_s"] - p["plateau_s"]
                             - p["build_s"] - p["hold_s"]), 2)
        p["tail_s"] = tail
    elif shape == "linear":
        p.update(level=u(rng, 0.28, 0.32), rate_mibps=u(rng, 50, 200, 1))
    elif shape == "creep":
        p.update(level=u(rng, 0.84, 0.87), creep_pct=u(rng, 0.5, 1.5, 2))
        p["rate_mibps"] = round(p["creep_pct"] / 100 * LIMIT / MIB, 2)
    elif shape == "burst":
        p.update(level=u(rng, 0.55, 0.70), flat_s=u(rng, 2.0, 4.0, 2))
        p["rate_mibps"] = u(rng, 300, 800, 1)
    elif shape == "step":
        p.update(level=u(rng, 0.48, 0.52), jump=u(rng, 0.04, 0.08))
        p.update(every_s=u(rng, 1.5, 3.0, 2), jump_s=0.1)
    elif shape == "fast":
        p.update(level=None, chunk_mib=rng.randint(32, 64))

    if a.level is not None:
        if "level" in p:
            p["level"] = a.level
        else:
            say("--level does not apply to %s" % shape)
    if a.rate is not None:
        if "rate_mibps" in p:
            p["rate_mibps"] = a.rate
        else:
            say("--rate does not apply to %s" % shape)
    if shape in LEAKING:
        p["hard_stop_s"] = a.seconds if a.seconds is not None else 60.0
    return p


# -------------------------------------------------------------------- shapes


def load_plateau(p, rng):
    t0 = time.monotonic()
    data = Pool()
    data.grow_to(p["level"], p["load_s"])
    flat(max(t0 + p["total_s"], time.monotonic() + 0.3), rng)


def stairs(p, rng):
    data = Pool()
    k = p["epochs"]
    for i in range(k):
        level = p["first"] + (p["level"] - p["first"]) * i / (k - 1)
        t = time.monotonic()
        data.grow_to(level, p["step_s"])
        flat(t + p["step_s"] + p["flat_s"], rng)


def spikes(p, rng):
    data, spike = Pool(), Pool()
    data.grow_to(p["level"], p["load_s"])
    t0 = time.monotonic()
    for i in range(p["spikes"]):
        # the spike ends `every` after the previous one
        start = t0 + (i + 1) * p["every_s"] - p["rise_s"] - p["hold_s"]
        flat(start, rng)
        spike.grow_to(p["spike"], p["rise_s"])
        nap(time.monotonic() + p["hold_s"])
        spike.free()
    flat(max(t0 + p["total_s"] - p["load_s"], time.monotonic() + 0.5), rng)


def sawtooth(p, rng):
    base, heap = Pool(), Pool()
    t0 = time.monotonic()
    base.grow_to(p["level"], p["load_s"])
    peak = min(p["level"] + p["grow"], 0.87)
    for _ in range(p["cycles"]):
        flat(time.monotonic() + p["dwell_s"], rng, noise=False)
        heap.grow_to(peak, p["grow_s"])
        heap.free()  # the collector runs
    flat(max(t0 + p["total_s"], time.monotonic() + 0.5), rng, noise=False)


def reforking_workers(p, rng):
    data = Pool()
    data.grow_to(p["level"], p["load_s"])
    n = p["workers"]
    held = usage()
    # Per worker beyond what it writes: the interpreter pages it dirties
    # (copy-on-write of refcounts, ~1-3 MiB), its page tables (8 bytes per
    # 4 KiB the trainer maps) and the 256 KiB of the trainer's data it touches.
    overhead = 6 * MIB + data.bytes // 512
    room = 0.85 * LIMIT - held - n * overhead
    each = max(0, int(p["worker_fill"] * room / n)) // PAGE * PAGE
    say("reforking_workers: data %s of the limit, %d workers x %d MiB"
        % (frac(held), n, each // MIB))
    for _ in range(p["epochs"]):
        end = time.monotonic() + p["epoch_s"]
        for w in range(n):
            if fork_child() == 0:
                try:
                    own = Pool()
                    if each:
                        own.grow(amount=each)
                    # a little of the trainer's data (stays shared otherwise)
                    first = data.maps[0] if data.maps else None
                    if first is not None:
                        for off in range(0, min(len(first), 64 * PAGE), PAGE):
                            first[off] = 2
                    nap(end - 0.05)
                    os._exit(0)
                except BaseException:
                    os._exit(1)
        failed = 0
        for pid in list(KIDS):
            _, status = os.waitpid(pid, 0)
            KIDS.remove(pid)
            failed += status != 0
        if failed:
            say("reforking_workers: %d workers failed" % failed)
            raise SystemExit(1)
        nap(time.monotonic() + 0.1)
    flat(time.monotonic() + 0.3, rng)


def checkpoint_save(p, rng):
    data, save = Pool(), Pool()
    data.grow_to(p["level"], p["load_s"])
    flat(time.monotonic() + p["plateau_s"], rng)
    save.grow_to(min(p["level"] + p["save"], 0.88), p["build_s"])
    nap(time.monotonic() + p["hold_s"])
    save.free()
    flat(time.monotonic() + p["tail_s"], rng)


def linear(p, rng):
    leak = Pool()
    leak.grow_to(p["level"])
    leak.grow(rate=p["rate_mibps"] * MIB)


def creep(p, rng):
    leak = Pool()
    leak.grow_to(p["level"])
    leak.grow(rate=p["rate_mibps"] * MIB)


def burst(p, rng):
    leak = Pool()
    leak.grow_to(p["level"])
    flat(time.monotonic() + p["flat_s"], rng)
    leak.grow(rate=p["rate_mibps"] * MIB)


def step(p, rng):
    leak = Pool()
    leak.grow_to(p["level"])
    jump = int(p["jump"] * LIMIT)
    while True:
        nap(time.monotonic() + p["every_s"])
        leak.grow(rate=jump / p["jump_s"], amount=jump)


def fast(p, rng):
    leak = Pool()
    if p["level"] is not None:
        leak.grow_to(p["level"])
    chunk = p["chunk_mib"] * MIB
    if fork_child() == 0:
        try:
            while time.monotonic() < HARD:
                leak.alloc(chunk)
            os._exit(3)
        except BaseException:
            os._exit(1)
    while True:
        if time.monotonic() >= HARD:
            raise HardStop
        leak.alloc(chunk)
        if KIDS and os.waitpid(KIDS[0], os.WNOHANG)[0]:
            KIDS.clear()  # the kernel took the child; the parent goes on


SHAPES = {f.__name__: f for f in (
    load_plateau, stairs, spikes, sawtooth, reforking_workers, checkpoint_save,
    linear, creep, burst, step, fast)}


def main():
    global HARD, USAGE_FD, LIMIT
    ap = argparse.ArgumentParser(
        description="Reproduce one memory shape of a training job in a memory cgroup.")
    ap.add_argument("shape", choices=HEALTHY + LEAKING)
    ap.add_argument("--usage-file", required=True,
                    help="memory.usage_in_bytes (v1) or memory.current (v2)")
    ap.add_argument("--limit", type=int, required=True, help="the cgroup's limit in bytes")
    ap.add_argument("--seed", type=int, help="randomises the parameters (default: drawn)")
    ap.add_argument("--seconds", type=float,
                    help="healthy: total time (default ~6-8); leaking: hard stop (default 60)")
    ap.add_argument("--level", type=float, help="the shape's level as a fraction of the limit")
    ap.add_argument("--rate", type=float, help="a leak's growth in MiB/s")
    a = ap.parse_args()
    if a.limit <= 0:
        ap.error("--limit must be positive")
    if a.seconds is not None and a.seconds <= 0:
        ap.error("--seconds must be positive")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    LIMIT = a.limit
    USAGE_FD = os.open(a.usage_file, os.O_RDONLY | os.O_CLOEXEC)
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(1 << 31)
    rng = random.Random(seed)
    p = params_for(a.shape, rng, a)
    sys.stderr.write(json.dumps({"shape": a.shape, "seed": seed, "limit": LIMIT,
                                 "params": p}) + "\n")
    sys.stderr.flush()

    t0 = time.monotonic()
    if a.shape in LEAKING:
        HARD = t0 + p["hard_stop_s"]
    else:  # a safety net only: the plan ends well before
        HARD = t0 + 2 * (a.seconds or 10.0) + 10.0
    try:
        SHAPES[a.shape](p, rng)
    except HardStop:
        u_now = usage()
        reap_kids(signal.SIGTERM)
        say("hard stop after %.1f s at usage %d (%s of the limit)"
            % (time.monotonic() - t0, u_now, frac(u_now)))
        sys.exit(3)
    say("%s done after %.1f s, peak usage seen %d (%s of the limit)"
        % (a.shape, time.monotonic() - t0, PEAK_SEEN, frac(PEAK_SEEN)))
    sys.exit(0)


if __name__ == "__main__":
    main()
