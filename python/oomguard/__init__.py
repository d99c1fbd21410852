"""oomguard's in-process companion.

oomguard (the supervisor) names a private control directory in the job's
environment (``OOMGUARD_CONTROL``). It writes a *request* there (checkpoint,
checkpoint and exit, relieve); the trainer answers at its next step boundary:

* every rank calls :meth:`Guard.step` once per step; the ranks agree on the
  newest request through the job's own process group (one small all-reduce,
  ``MAX``, started at one step and read at the next), so they all save the
  same step, and no rank waits for a vote another skips (the vote happens
  on every step of every rank);
* all ranks save, then meet in a barrier; local rank 0 of each node writes
  the ``done`` record its node's oomguard waits for;
* in a job across nodes, threads of each rank carry *faults* the vote
  cannot (a rank stopped by a signal or killed, so no step comes): they
  put their node's fault (the ``fault`` file) in the job's store, and local
  rank 0 brings the other nodes' faults to its oomguard. The threads run
  while the training thread waits in a collective.

Outside ``oomguard run`` (no ``OOMGUARD_CONTROL``) every call is a cheap
no-op. Nothing here prints, and a failure of the channel never stops
training. This module needs nothing but the standard library; torch is used
only when the job itself has initialised ``torch.distributed``.
"""

from __future__ import annotations

import atexit
import gc
from datetime import timedelta
import json
import os
import sys
import threading
import time

# Type hints only: `typing` is not imported at run time (this module is
# imported at the start of every Python job oomguard runs).
TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

    _Path = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]

__all__ = ["Guard", "guard", "PROTOCOL", "__version__"]

# The protocol's names and version: src/vocab/companion.rs has the same, and a
# test there fails when the two disagree.
PROTOCOL = 1
ENV_CONTROL = "OOMGUARD_CONTROL"
ENV_FAULTS = "OOMGUARD_FAULTS"
REQUEST = "request"
EVENTS = "events"
FAULT = "fault"
# How often each rank looks for its node's fault file: a node whose rank
# was killed has well under a second before its launcher ends the others.
_FAULT_POLL = 0.05
# A wait for the next fault is renewed this often (seconds).
_FAULT_WAIT = 600
# A store that takes longer than this to answer a connection is gone.
_STORE_GONE = 5
# Vote codes: the larger one wins when ranks hold different requests.
_KIND_CODE = {"checkpoint": 1, "checkpoint_and_exit": 2}
_CODE_KIND = {1: "checkpoint", 2: "checkpoint_and_exit"}
# Progress records are rate-limited and come from each node's local rank 0
# only (the ranks step together): oomguard needs the step, not a stream, and
# a day-long run of any width appends under 10 MB.
_PROGRESS_EVERY = 1.0
# The vote's value: request id << _NODE_BITS | the requesting node.
_NODE_BITS = 16
_NODE_MASK = (1 << _NODE_BITS) - 1
# A line below PIPE_BUF is written whole even beside other ranks' writes.
_MAX_LINE = 4000

_GUARD = None  # type: Optional[Guard]


def __getattr__(name: str) -> str:
    # PEP 562: `oomguard.__version__` is worked out on first use only.
    if name == "__version__":
        version = _package_version()
        globals()["__version__"] = version
        return version
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


def _package_version() -> str:
    """This copy's version, which is Cargo.toml's: written beside it by the
    binary that embedded it (``_embedded.py``), else the installed
    distribution's when it is this copy, else the checkout's Cargo.toml."""
    here = os.path.dirname(os.path.realpath(__file__))
    try:
        from . import _embedded  # type: ignore[attr-defined]

        return str(_embedded.VERSION)  # type: ignore[attr-defined]
    except ImportError:
        pass
    try:
        from importlib import metadata

        dist = metadata.distribution("oomguard")
        located = os.path.realpath(str(dist.locate_file("oomguard/__init__.py")))
        if os.path.dirname(located) == here:
            return str(dist.version)
    except Exception:
        pass
    return _cargo_version(os.path.join(here, os.pardir, os.pardir, "Cargo.toml")) or "0+unknown"


def _cargo_version(path: str) -> Optional[str]:
    """The ``[package]`` version of a Cargo.toml (a source checkout)."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    section = None
    for line in lines:
        line = line.strip()
        if line.startswith("["):
            section = line
        elif section == "[package]" and line.startswith("version") and "=" in line:
            return line.split("=", 1)[1].strip().strip('"')
    return None


def _fsync(path: str, directory: bool = False) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        # A file system that cannot (some network and FUSE ones): what it
        # does is all there is.
        pass
    finally:
        os.close(fd)


def _durable(paths: Sequence[str]) -> None:
    """fsync each saved file (a directory: every file under it, and the
    directories themselves) and the directory each path is in, so the save
    is on disk when it is reported done."""
    dirs = []  # type: List[str]
    for p in paths:
        if os.path.isdir(p):
            for root, _, files in os.walk(p):
                for name in files:
                    _fsync(os.path.join(root, name))
                dirs.append(root)
        elif os.path.isfile(p):
            _fsync(p)
        dirs.append(os.path.dirname(p) or ".")
    for d in dict.fromkeys(dirs):
        _fsync(d, directory=True)


def guard(framework: str = "plain") -> Guard:
    """The process-wide :class:`Guard` (created on first use)."""
    global _GUARD
    if _GUARD is None or _GUARD._pid != os.getpid():
        _GUARD = Guard(framework=framework)
    return _GUARD


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def _slurm_task() -> Optional[int]:
    """SLURM_PROCID when SLURM started this rank as a task of its own: a
    step of several tasks and no launcher (torchrun sets GROUP_RANK)."""
    if "GROUP_RANK" in os.environ or "TORCHELASTIC_RUN_ID" in os.environ:
        return None
    if "SLURM_PROCID" not in os.environ or _env_int("SLURM_NTASKS", 1) < 2:
        return None
    return _env_int("SLURM_PROCID", 0)


def _slurm_node_tasks(node: int, world: int) -> int:
    """The number of tasks on node `node`, from SLURM_STEP_TASKS_PER_NODE
    (or SLURM_TASKS_PER_NODE): ``2(x3),1`` is 2, 2, 2, 1."""
    spec = os.environ.get("SLURM_STEP_TASKS_PER_NODE") or os.environ.get("SLURM_TASKS_PER_NODE", "")
    counts = []  # type: List[int]
    try:
        for part in spec.split(","):
            n, _, times = part.partition("(x")
            counts.extend([int(n)] * (int(times.rstrip(")")) if times else 1))
    except ValueError:
        counts = []
    if 0 <= node < len(counts):
        return counts[node]
    return _env_int("SLURM_NTASKS_PER_NODE", world)


class Guard:
    """One process's end of the channel. Use :func:`guard` to share it."""

    def __init__(self, control: Optional[str] = None, framework: str = "plain") -> None:
        self.control = control if control is not None else os.environ.get(ENV_CONTROL)  # type: Optional[str]
        self.framework = framework
        #: This rank's task number when SLURM started it as a task of its
        #: own (``srun --ntasks-per-node=N python train.py``, Lightning's
        #: SLURM mode: no launcher, one oomguard per rank); else None.
        self.task = _slurm_task()
        slurm = self.task is not None
        self.rank = _env_int("RANK", self.task if slurm else 0)
        self.local_rank = _env_int("LOCAL_RANK", _env_int("SLURM_LOCALID", 0) if slurm else 0)
        self._pid = os.getpid()
        self._fd = None  # type: Optional[int]
        self._request_key = None  # type: Optional[Tuple[int, int, int]]
        self._request = None  # type: Optional[Dict[str, Any]]
        self._served = 0
        self._relieved = 0
        self._agreed = None  # type: Optional[Tuple[int, str]]
        self._agreed_at = None  # type: Optional[float]
        self._local_id = 0
        self._exit = False
        self._agreed_reason = None  # type: Optional[str]
        #: Why the job was asked to stop (the rule, the signal), once
        #: :meth:`should_exit` is true; for a line in the job's output.
        self.stop_reason = None  # type: Optional[str]
        self._last_progress = 0.0
        self._last_step = None  # type: Optional[int]
        self._reported = None  # type: Optional[int]
        self._epoch = None  # type: Optional[float]
        self._phase = "train"
        self._said_hello = False
        self._request_now = None  # type: Optional[Dict[str, Any]]
        self._work = None  # type: Optional[Tuple[Any, Any, Optional[Dict[str, Any]]]]
        self._group = None  # type: Optional[Tuple[Any, Any]]
        self._published_id = None  # type: Optional[int]
        self._faults = None  # type: Optional[_Faults]
        self._crashed = False
        # torchrun's node rank (GROUP_RANK), else SLURM's.
        self.node = _env_int("GROUP_RANK", _env_int("SLURM_NODEID", 0)) & _NODE_MASK
        # Which oomguard of the job this rank answers to: its node's under a
        # launcher, its own task's when SLURM started each rank. A vote
        # carries it, so every other oomguard learns whose request won.
        self.origin = (self.task if slurm else self.node) & _NODE_MASK
        # Whether this rank speaks for its oomguard (done, progress, other
        # nodes' news): local rank 0 under a launcher, every rank when each
        # has an oomguard of its own.
        self._speaks = slurm or self.local_rank == 0

    @property
    def active(self) -> bool:
        """Whether oomguard supervises this process."""
        return bool(self.control)

    # -- the trainer's calls -------------------------------------------

    def step(self, step: int, epoch: Optional[float] = None, phase: str = "train") -> bool:
        """Call once per completed step on every rank. True when every rank
        has agreed to checkpoint now: save, then call :meth:`checkpointed`."""
        if not self.active:
            return False
        self._last_step = step
        self._hello()
        now = time.monotonic()
        self._epoch, self._phase = epoch, phase
        if now - self._last_progress >= _PROGRESS_EVERY:
            self._last_progress = now
            self._progress()
        # One `stat` of the request per step, for the relief and the vote.
        self._request_now = self._read_request()
        self._maybe_relieve()
        if self._agreed is not None:
            return True
        try:
            return self._vote(step)
        except Exception:
            # A broken vote must never stop training.
            return False

    def checkpoint_requested(self) -> bool:
        """True between an agreed request and :meth:`checkpointed`."""
        return self._agreed is not None

    def checkpointed(self, paths: Union[_Path, Sequence[_Path]], ok: bool = True) -> None:
        """Call on every rank once this rank's part of the save is written.
        Waits for the other ranks, then reports the checkpoint to oomguard."""
        if self._agreed is None:
            return
        agreed_id, kind = self._agreed
        if isinstance(paths, (str, bytes, os.PathLike)):
            paths = [paths]
        absolute = [os.path.abspath(os.fspath(p)) for p in paths]  # type: List[Any]
        # On disk before any rank says done: oomguard's exit 75 tells the
        # scheduler the job is safe to requeue, and a node that loses power
        # right after must not leave the next run a partial file.
        _durable(absolute)
        _barrier()
        seconds = time.monotonic() - (self._agreed_at or time.monotonic())
        if self._speaks:
            self._emit(
                {
                    "type": "done",
                    "id": self._local_id or agreed_id,
                    "kind": kind,
                    "step": self._last_step,
                    "epoch": self._epoch,
                    "paths": absolute,
                    "ok": bool(ok),
                    "seconds": round(seconds, 3),
                }
            )
        self._served = max(self._served, agreed_id, self._local_id)
        self._agreed = None
        self._local_id = 0
        if kind == "checkpoint_and_exit":
            self._exit = True
            self.stop_reason = self._agreed_reason

    def should_exit(self) -> bool:
        """True once a ``checkpoint_and_exit`` request has been served: leave
        the training loop (oomguard ends the job otherwise)."""
        return self._exit

    def resume_path(self) -> Optional[str]:
        """The checkpoint to resume from: a previous attempt's, on a
        restart, or the save a previous run of the same job left (a SLURM
        requeue, a new pod, the command typed again)."""
        path = os.environ.get("OOMGUARD_CHECKPOINT")
        again = _env_int("OOMGUARD_ATTEMPT", 1) > 1 or os.environ.get("OOMGUARD_RESUMED") == "1"
        if path and os.path.exists(path) and again:
            return path
        return None

    # -- the channel ----------------------------------------------------

    def _vote(self, step: int) -> bool:
        # With several ranks the vote is asynchronous: the all-reduce
        # started at one step is read at the next, so it overlaps a whole
        # step of training instead of adding a round trip to each. Every
        # rank reads it at the same step, so all still agree on one step.
        if self._work is not None:
            work, tensor, req = self._work
            self._work = None
            work.wait()
            return self._decide([int(x) for x in tensor.tolist()], req, step)
        req = self._pending()
        # The origin rides in the low bits, so the newest request of any
        # oomguard wins and names where it came from.
        local = [(req["id"] << _NODE_BITS) | self.origin, _KIND_CODE[req["kind"]]] if req else [0, 0]
        if req:
            # Any rank that holds the request says why (the same value):
            # a rank of this node may have voted before the file came.
            self._publish(req)
        started = self._all_max_async(local)
        if started is None:
            return self._decide(local, req, step)
        self._work = started + (req,)
        return False

    def _all_max_async(self, values: List[int]) -> Optional[Tuple[Any, Any]]:
        """Starts the all-reduce MAX of `values` over the job's process
        group: (work, tensor), or None in a single process. The group, its
        device and the tensor are looked up once."""
        if self._group is None:
            dist = _dist()
            if dist is None or dist.get_world_size() < 2:
                return None
            import torch

            device = "cpu"
            if dist.get_backend() == "nccl":
                device = torch.device("cuda", torch.cuda.current_device())
            self._group = (dist, torch.zeros(2, dtype=torch.int64, device=device))
        dist, t = self._group
        t[0] = values[0]
        t[1] = values[1]
        return dist.all_reduce(t, op=dist.ReduceOp.MAX, async_op=True), t

    def _decide(self, agreed: List[int], req: Optional[Dict[str, Any]], step: int) -> bool:
        vote_id, origin = agreed[0] >> _NODE_BITS, agreed[0] & _NODE_MASK
        if vote_id <= self._served or agreed[1] not in _CODE_KIND:
            return False
        kind = _CODE_KIND[agreed[1]]
        self._agreed = (vote_id, kind)
        self._agreed_at = time.monotonic()
        # This rank may have voted before its node's request came: the
        # request it serves is the one there now.
        req = req or self._pending()
        self._local_id = req["id"] if req else 0
        self._agreed_reason = req.get("reason") if req else None
        if req:
            self._emit({"type": "ack", "id": req["id"], "step": step})
        elif self._speaks and origin != self.origin:
            # Another oomguard's request: this one learns who asked and why,
            # and waits for the same save.
            record = {"type": "remote", "id": vote_id, "kind": kind, "node": origin, "step": step}
            record.update(self._published(vote_id))
            if self.task is not None:
                record["task"] = origin
            self._agreed_reason = record.get("reason")
            self._emit(record)
        return True

    def _publish(self, req: Dict[str, Any]) -> None:
        """Puts the request's reason in the job's rendezvous store (once), for
        the other nodes' oomguards."""
        if self._published_id == req["id"]:
            return
        self._published_id = req["id"]
        store = _store()
        if store is None:
            return
        # oomguard names the rank behind its fastest-growing process; else
        # the rank that holds the request says it.
        cause = req.get("cause_rank")
        info = {
            "cause_rank": cause if isinstance(cause, int) else self.rank,
            "reason": req.get("reason"),
            "detail": req.get("detail"),
            "node": self.node,
        }
        if req.get("then"):
            # The asking node restarts the job after the save: the others'
            # oomguards restart with it (the rendezvous needs every node).
            info["then"] = req["then"]
        try:
            store.set("oomguard/request/%d" % req["id"], json.dumps(info))
        except Exception:
            pass

    def _published(self, vote_id: int) -> Dict[str, Any]:
        store = _store()
        key = "oomguard/request/%d" % vote_id
        try:
            if store is not None and store.check([key]):
                info = json.loads(store.get(key))
                return info if isinstance(info, dict) else {}
        except Exception:
            pass
        return {}

    def _pending(self) -> Optional[Dict[str, Any]]:
        req = self._request_now
        if req and req.get("id", 0) > self._served and req.get("kind") in _KIND_CODE:
            return req
        return None

    def _read_request(self) -> Optional[Dict[str, Any]]:
        path = os.path.join(self.control or "", REQUEST)
        try:
            st = os.stat(path)
        except OSError:
            return None
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if key != self._request_key:
            self._request_key = key
            try:
                with open(path) as f:
                    req = json.load(f)
                self._request = req if isinstance(req, dict) and isinstance(req.get("id"), int) else None
            except (OSError, ValueError):
                self._request = None
        return self._request

    def _maybe_relieve(self) -> None:
        req = self._request_now
        if not req or req.get("kind") != "relieve" or req["id"] <= self._relieved:
            return
        self._relieved = req["id"]
        freed = relieve()
        self._emit({"type": "relieved", "id": req["id"], "freed": freed})

    def _progress(self) -> None:
        if not self._speaks:
            return
        if self._last_step is not None and self._last_step != self._reported:
            self._reported = self._last_step
            self._emit(
                {"type": "progress", "step": self._last_step, "epoch": self._epoch, "phase": self._phase}
            )

    def _hello(self) -> None:
        if self._said_hello:
            return
        self._said_hello = True
        # The last step is reported even when the rate limit held it back.
        atexit.register(self._progress)
        # How this rank ends is news to the other nodes: an exception
        # nothing caught, or Python's own shutdown; a rank that says
        # neither was killed by a signal.
        atexit.register(self._emit, {"type": "bye"})
        _chain_excepthook(self)
        world = _world_size()
        local_world = _env_int("LOCAL_WORLD_SIZE", world)
        if self.task is not None:
            if _dist() is None:
                world = _env_int("SLURM_NTASKS", world)
            local_world = _slurm_node_tasks(self.node, world)
        addr, port = os.environ.get("MASTER_ADDR"), _env_int("MASTER_PORT", 0)
        # Other oomguards to tell: other nodes', or, with one oomguard per
        # rank, every other rank's.
        others = world > (1 if self.task is not None else local_world)
        across = others and bool(addr) and port > 0
        self._emit(
            {
                "type": "hello",
                "framework": self.framework,
                "world": world,
                "local_world": local_world,
                "local_rank": self.local_rank,
                # Which copy runs: the one oomguard embedded, or one
                # installed in the job's environment (docs/install.md).
                "version": _safe_version(),
                "path": os.path.dirname(os.path.abspath(__file__)),
                "node": self.node,
                "task": self.task,
                "store": "%s:%d" % (addr, port) if across else None,
            }
        )
        if self.task is not None and self.rank == 0 and across:
            # Rank 0's process serves the job's store (no launcher): the
            # other oomguards must not take its normal end for a death.
            atexit.register(self._store_closing)
        # oomguard carries the faults itself when it says so (it needs no
        # rank of the node alive for it); an older one leaves it to us.
        carried = os.environ.get(ENV_FAULTS) == "oomguard"
        if across and not carried and _dist() is not None:
            self._faults = _Faults(self, addr, port)
            self._faults.start()

    def _store_closing(self) -> None:
        if self._crashed:
            return
        store = _store()
        if store is None:
            return
        note = {"id": 0, "node": self.node, "origin": self.origin, "reason": "store-closing", "t": time.time()}
        try:
            n = store.add("oomguard/faults", 1)
            store.set("oomguard/fault/%d" % n, json.dumps(note))
        except Exception:
            pass

    def _emit(self, record: Dict[str, Any]) -> None:
        record = dict(record, v=PROTOCOL, pid=os.getpid(), rank=self.rank, t=round(time.time(), 3))
        line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        if len(line) > _MAX_LINE:
            return
        try:
            if self._fd is None or self._pid != os.getpid():
                self._pid = os.getpid()
                self._fd = os.open(os.path.join(self.control or "", EVENTS), os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
            os.write(self._fd, line)
        except OSError:
            pass


def _chain_excepthook(owner: Guard) -> None:
    before = sys.excepthook

    def hook(kind: Any, value: Any, tb: Any) -> None:
        owner._crashed = True
        try:
            owner._emit({"type": "crash", "error": ("%s: %s" % (kind.__name__, value))[:500]})
        except Exception:
            pass
        before(kind, value, tb)

    sys.excepthook = hook


class _Faults:
    """One rank's carrier of faults between its node's oomguard and the
    other nodes (see the module's docstring), on two daemon threads with
    their own connections to the job's store (``MASTER_ADDR``:
    ``MASTER_PORT``), so that a blocking wait never holds the training
    thread's. Keys: ``oomguard/faults`` counts the faults put, and
    ``oomguard/fault/<n>`` is the n-th. Every rank carries its node's fault
    out (the first rank of the node that still lives does it; a killed
    rank's node has moments before its launcher ends the rest); local rank
    0 brings the other nodes' in, woken by the store the moment one is put."""

    def __init__(self, owner: Guard, addr: str, port: int) -> None:
        self.owner = owner
        self.addr, self.port = addr, port
        self.key = None  # type: Optional[Tuple[int, int, int]]
        self.put = 0

    def start(self) -> None:
        threading.Thread(target=self._carry_out, name="oomguard-fault-out", daemon=True).start()
        if self.owner._speaks:
            threading.Thread(target=self._bring_in, name="oomguard-fault-in", daemon=True).start()

    def _connect(self, seconds: float = _FAULT_WAIT) -> Any:
        from torch.distributed import TCPStore

        return TCPStore(
            host_name=self.addr,
            port=self.port,
            is_master=False,
            timeout=timedelta(seconds=seconds),
            wait_for_workers=False,
        )

    def _carry_out(self) -> None:
        # A `stat` every 50 ms, on a connection made beforehand: the fault
        # file is written when a rank of this node was killed, and the
        # launcher ends the others (and with node 0's launcher, the store)
        # within a fraction of a second.
        path = os.path.join(self.owner.control or "", FAULT)
        store = None
        while True:
            time.sleep(_FAULT_POLL)
            try:
                store = store or self._connect(_STORE_GONE)
            except Exception:
                store = None
            fault = self._new_fault(path)
            if fault is None or store is None:
                continue
            try:
                info = {k: fault.get(k) for k in ("id", "cause_rank", "reason", "detail", "then")}
                info["node"] = self.owner.node
                info["origin"] = self.owner.origin
                n = store.add("oomguard/faults", 1)
                store.set("oomguard/fault/%d" % n, json.dumps(info))
                self.owner._emit({"type": "fault_published", "id": fault["id"]})
            except Exception:
                store = None

    def _new_fault(self, path: str) -> Optional[Dict[str, Any]]:
        try:
            st = os.stat(path)
        except OSError:
            return None
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if key == self.key:
            return None
        self.key = key
        try:
            with open(path) as f:
                fault = json.load(f)
        except (OSError, ValueError):
            return None
        if not isinstance(fault, dict) or not isinstance(fault.get("id"), int) or fault["id"] <= self.put:
            return None
        self.put = fault["id"]
        return fault

    def _bring_in(self) -> None:
        store, n = None, None
        while True:
            try:
                if store is None:
                    store = self._connect(_STORE_GONE)
                if n is None:
                    n = store.add("oomguard/faults", 0) + 1
                key = "oomguard/fault/%d" % n
                # Returns once the key is put; raises at the timeout.
                store.wait([key], timedelta(seconds=_FAULT_WAIT))
                info = json.loads(store.get(key))
                n += 1
            except Exception:
                # A timeout (wait again on a new connection), or the store
                # is gone. Under torchrun the store lives in node 0's
                # launcher until every node has finished, so losing it while
                # this rank still runs means node 0's part of the job ended:
                # this node's ranks would wait for it in their next
                # collective. Said once; nothing is left to hear.
                store = None
                try:
                    store = self._connect(_STORE_GONE)
                except Exception:
                    self.owner._emit({"type": "store_lost", "addr": "%s:%d" % (self.addr, self.port)})
                    return
                continue
            if isinstance(info, dict) and info.get("origin", info.get("node")) != self.owner.origin:
                record = {"type": "fault"}  # type: Dict[str, Any]
                record.update({k: info.get(k) for k in ("id", "node", "cause_rank", "reason", "detail", "then")})
                self.owner._emit(record)


def relieve() -> Dict[str, int]:
    """Frees what can be freed without changing the job: Python's garbage,
    the C heap's free pages, PyTorch's cached CUDA blocks. Returns the bytes
    each step freed (by resident memory, or by CUDA reserved memory)."""
    freed = {}  # type: Dict[str, int]
    before = _rss()
    gc.collect()
    after = _rss()
    freed["gc"] = max(0, before - after)
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        before = after
        libc.malloc_trim(0)
        after = _rss()
        freed["malloc_trim"] = max(0, before - after)
    except (OSError, AttributeError):
        pass
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
            before = torch.cuda.memory_reserved()
            torch.cuda.empty_cache()
            freed["cuda_empty_cache"] = max(0, before - torch.cuda.memory_reserved())
    except Exception:
        pass
    return freed


def _rss() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _dist() -> Any:
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return dist
    except Exception:
        pass
    return None


def _world_size() -> int:
    dist = _dist()
    return dist.get_world_size() if dist is not None else _env_int("WORLD_SIZE", 1)


def _store() -> Any:
    """The job's rendezvous store (torchrun's TCPStore), when there is one."""
    if _dist() is None:
        return None
    try:
        from torch.distributed import distributed_c10d

        return distributed_c10d._get_default_store()
    except Exception:
        return None


def _barrier() -> None:
    dist = _dist()
    if dist is not None and dist.get_world_size() > 1:
        try:
            dist.barrier()
        except Exception:
            pass


def _safe_version() -> str:
    try:
        return str(globals().get("__version__") or __getattr__("__version__"))
    except Exception:
        return "0+unknown"
