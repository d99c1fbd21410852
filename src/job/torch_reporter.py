# oomguard --torch-stats reporter.
#
# oomguard writes this file as `sitecustomize.py` into a private directory and
# puts that directory first on the job's PYTHONPATH, so every Python process
# of the job runs it at startup. It:
#
# 1. runs the sitecustomize it shadows (the next one on sys.path), as Python
#    would have without oomguard, and takes its own directory off sys.path;
# 2. with OOMGUARD_CONTROL set, puts the companion package (companion/ beside
#    this file) last on sys.path and imports oomguard._auto, which waits for a
#    Lightning or Hugging Face Trainer to be imported and gives it the
#    checkpoint-on-request callback (docs/design.md, the control channel);
# 3. with OOMGUARD_TORCH_STATS set, does nothing more until the process
#    imports torch (a finder on sys.meta_path that never finds anything, it
#    only notices "torch"; it never imports torch itself), then starts one
#    daemon thread which, every OOMGUARD_TORCH_STATS_INTERVAL
#    seconds, and only while torch.cuda.is_initialized() in this very
#    process, appends one JSON line per report to OOMGUARD_TORCH_STATS:
#    {"v":1,"pid":P,"seq":N,"part":0,"parts":1,"t":UNIX,"devices":[{"device":D,
#    "allocated_bytes":A,"reserved_bytes":R,"max_allocated_bytes":M,
#    "alloc_retries":K}, ...]}
#    Each line is written with one os.write() of fewer than PIPE_BUF bytes on
#    an O_APPEND descriptor, so lines of concurrent processes never interleave.
#    Devices with nothing allocated, reserved or retried are left out; a report
#    with many devices is split into parts of one `seq`.
#
# Forked children do not inherit the thread. A child forked while CUDA was
# initialised (a DataLoader worker) never reports; a child forked before
# (a fork-based launcher whose children each take a GPU) gets its own thread.
#
# Whatever goes wrong here stays here: every step is guarded, nothing is ever
# printed, and the job's exit code and output are its own. The syntax is kept
# to what old Python 3 releases parse; below the floor this file does nothing.

# The oldest Python the companion and the reporter run on: pyproject.toml's
# `requires-python` (a test in src/companion.rs checks that they agree, and
# `vermin -t=3.8-` in .ci/run that neither needs a newer one).
_OOMGUARD_MIN_PYTHON = (3, 8)


def _oomguard_torch_stats():
    import os
    import sys

    here = _oomguard_realpath(os.path.dirname(os.path.abspath(__file__)))
    # The job should see the sys.path it would have had without oomguard.
    sys.path[:] = [p for p in sys.path if _oomguard_realpath(p) != here]
    _oomguard_run_shadowed_sitecustomize()
    _oomguard_companion(here)

    path = os.environ.get("OOMGUARD_TORCH_STATS")
    if not path or sys.version_info < _OOMGUARD_MIN_PYTHON:
        return
    interval = _oomguard_interval(os.environ.get("OOMGUARD_TORCH_STATS_INTERVAL"))
    reporter = _OomguardReporter(path, interval)
    if "torch" in sys.modules:
        reporter.start()
    else:
        sys.meta_path.insert(0, _OomguardTorchWatch(reporter))


def _oomguard_companion(here):
    # The companion package (python/oomguard in oomguard's repository) sits
    # in `companion/` beside this file. It goes last on sys.path, so a copy
    # the job installed itself wins (docs/install.md, "Which copy of the
    # companion runs"), and it only waits for a Trainer import.
    import os
    import sys

    if not os.environ.get("OOMGUARD_CONTROL") or sys.version_info < _OOMGUARD_MIN_PYTHON:
        return
    sys.path.append(os.path.join(here, "companion"))
    try:
        import oomguard._auto  # noqa: F401
    except Exception:
        pass


def _oomguard_realpath(entry):
    import os

    try:
        return os.path.normcase(os.path.realpath(entry or os.curdir))
    except Exception:
        return entry


def _oomguard_run_shadowed_sitecustomize():
    import sys

    try:
        import importlib.machinery
        import importlib.util

        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", sys.path)
    except Exception:
        return
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    ours = sys.modules.get("sitecustomize")
    sys.modules["sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        if ours is not None:
            sys.modules["sitecustomize"] = ours
        # What site.py itself reports for a failing sitecustomize, so the job
        # sees what it would have seen without oomguard.
        if sys.flags.verbose:
            sys.excepthook(*sys.exc_info())
        else:
            sys.stderr.write(
                "Error in sitecustomize; set PYTHONVERBOSE for traceback:\n"
                "%s: %s\n" % (err.__class__.__name__, err)
            )


def _oomguard_interval(text):
    try:
        value = float(text)
    except Exception:
        return 1.0
    if not value == value:  # NaN
        return 1.0
    return min(max(value, 0.05), 3600.0)


class _OomguardTorchWatch(object):
    """A meta-path finder that finds nothing: it only notices `import torch`.

    It stays on sys.meta_path as a no-op after that, because removing a finder
    while the import system iterates over the list would skip the next one.
    """

    def __init__(self, reporter):
        self._reporter = reporter

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "torch":
            try:
                self._reporter.start()
            except Exception:
                pass
        return None

    def find_module(self, fullname, path=None):
        return None

    def invalidate_caches(self):
        pass


class _OomguardReporter(object):
    PIPE_BUF = 4096
    DEVICES_PER_LINE = 16

    def __init__(self, path, interval):
        self.path = path
        self.interval = interval
        self.pid = None  # the process whose thread is running
        self.cuda_at_fork = False
        self.hooked_fork = False

    def start(self):
        import os
        import threading

        if self.pid == os.getpid():
            return
        self.pid = os.getpid()
        if not self.hooked_fork and hasattr(os, "register_at_fork"):
            os.register_at_fork(
                before=self._before_fork, after_in_child=self._after_fork_in_child
            )
            self.hooked_fork = True
        thread = threading.Thread(
            target=self._run, name="oomguard-torch-stats", args=(self.pid,)
        )
        thread.daemon = True
        thread.start()

    def _before_fork(self):
        try:
            self.cuda_at_fork = self._cuda() is not None
        except Exception:
            self.cuda_at_fork = True

    def _after_fork_in_child(self):
        # A child of a process that had CUDA initialised cannot use CUDA (a
        # DataLoader worker): it gets no thread. Otherwise it may take a GPU.
        try:
            if self.pid is not None and not self.cuda_at_fork:
                self.start()
        except Exception:
            pass

    def _cuda(self):
        import sys

        torch = sys.modules.get("torch")
        if torch is None:
            return None
        spec = getattr(torch, "__spec__", None)
        if spec is not None and getattr(spec, "_initializing", False):
            return None  # still being imported by the job
        cuda = getattr(torch, "cuda", None)
        if cuda is None or not cuda.is_initialized():
            return None
        return cuda

    def _collect(self, cuda):
        devices = []
        for d in range(int(cuda.device_count())):
            allocated = max(int(cuda.memory_allocated(d)), 0)
            reserved = max(int(cuda.memory_reserved(d)), 0)
            peak = max(int(cuda.max_memory_allocated(d)), 0)
            stats = cuda.memory_stats(d) or {}
            retries = max(int(stats.get("num_alloc_retries", 0) or 0), 0)
            if allocated or reserved or peak or retries:
                devices.append(
                    {
                        "device": d,
                        "allocated_bytes": allocated,
                        "reserved_bytes": reserved,
                        "max_allocated_bytes": peak,
                        "alloc_retries": retries,
                    }
                )
        return devices

    def _lines(self, pid, seq, devices):
        import json
        import time

        step = self.DEVICES_PER_LINE
        chunks = [devices[i : i + step] for i in range(0, len(devices), step)] or [[]]
        now = round(time.time(), 3)
        for part, chunk in enumerate(chunks):
            record = {
                "v": 1,
                "pid": pid,
                "seq": seq,
                "part": part,
                "parts": len(chunks),
                "t": now,
                "devices": chunk,
            }
            data = (json.dumps(record, separators=(",", ":")) + "\n").encode("ascii")
            if len(data) < self.PIPE_BUF:
                yield data

    def _run(self, pid):
        import os
        import signal
        import time

        try:
            # A write to a FIFO nobody reads must fail with EPIPE here rather
            # than raise SIGPIPE, which a job may have set to kill it.
            signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGPIPE])
        except Exception:
            pass
        fd = None
        seq = 0
        while True:
            time.sleep(self.interval)
            if os.getpid() != pid:
                return
            try:
                cuda = self._cuda()
                if cuda is None:
                    continue
                devices = self._collect(cuda)
            except Exception:
                continue
            seq += 1
            for data in self._lines(pid, seq, devices):
                fd = self._write(fd, data)

    def _write(self, fd, data):
        import os

        try:
            if fd is None:
                flags = os.O_WRONLY | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
                # A FIFO without a reader must not block the job.
                flags |= getattr(os, "O_NONBLOCK", 0)
                fd = os.open(self.path, flags)
            os.write(fd, data)
            return fd
        except Exception:
            if fd is not None:
                try:
                    os.close(fd)
                except Exception:
                    pass
            return None


try:
    _oomguard_torch_stats()
except Exception:
    pass
