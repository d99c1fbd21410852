"""The plain-loop API and the channel: requests, the vote, deciding,
checkpoints, resuming, relieving, and the no-op outside oomguard."""

import gc
import json
import os
import time

import pytest

import oomguard
from oomguard import Guard


# -- outside oomguard -------------------------------------------------------


def test_outside_oomguard_every_call_is_a_cheap_no_op(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    g = oomguard.guard()
    assert not g.active
    start = time.perf_counter()
    for step in range(10000):
        assert g.step(step) is False
    per_call = (time.perf_counter() - start) / 10000
    assert per_call < 50e-6, "a no-op step took %.1f us" % (per_call * 1e6)
    g.checkpointed(["x.pt"])
    assert not g.checkpoint_requested()
    assert not g.should_exit()
    assert g.resume_path() is None
    assert os.listdir(str(tmp_path)) == [], "nothing is written outside oomguard"


def test_guard_is_one_per_process():
    assert oomguard.guard() is oomguard.guard()


# -- reading requests ---------------------------------------------------------


def test_a_request_is_read_when_it_changes_and_bad_ones_are_ignored(control):
    g = Guard()
    assert g._read_request() is None, "no request file yet"
    control.request(5, "checkpoint_and_exit", detail="d")
    req = g._read_request()
    assert req["id"] == 5 and req["kind"] == "checkpoint_and_exit" and req["detail"] == "d"
    for bad in ("not json", "[1, 2]", '{"id": "5", "kind": "checkpoint"}', '{"kind": "checkpoint"}'):
        control.write("request", bad)
        assert g._read_request() is None, bad
    control.request(6)
    assert g._read_request()["id"] == 6


def test_an_unchanged_request_file_is_not_read_again(control, monkeypatch):
    g = Guard()
    control.request(3)
    assert g._read_request()["id"] == 3
    opened = []
    real_open = open
    monkeypatch.setattr("builtins.open", lambda *a, **k: opened.append(a) or real_open(*a, **k))
    for _ in range(5):
        assert g._read_request()["id"] == 3
    assert opened == [], "one stat per step, no read"


def test_only_unserved_checkpoint_kinds_are_pending(control):
    g = Guard()
    g._served = 4
    for id, kind, pending in ((4, "checkpoint", False), (5, "relieve", False), (5, "other", False), (5, "checkpoint", True)):
        control.request(id, kind)
        g._request_now = g._read_request()
        assert (g._pending() is not None) == pending, (id, kind)


# -- the vote: its packing, and deciding --------------------------------------


def test_the_vote_packs_the_request_id_above_the_node(control, monkeypatch):
    monkeypatch.setenv("GROUP_RANK", "3")
    g = Guard()
    assert g.node == 3
    voted = []
    monkeypatch.setattr(g, "_all_max_async", lambda values: voted.append(list(values)))
    control.request(1234567, "checkpoint_and_exit")
    assert g.step(10) is True
    assert voted == [[(1234567 << 16) | 3, 2]]
    assert voted[0][0] >> oomguard._NODE_BITS == 1234567
    assert voted[0][0] & oomguard._NODE_MASK == 3
    # No request: a zero vote.
    g2 = Guard()
    monkeypatch.setattr(g2, "_all_max_async", lambda values: voted.append(list(values)))
    os.remove(os.path.join(str(control.path), "request"))
    assert g2.step(1) is False
    assert voted[-1] == [0, 0]


def test_the_node_comes_from_torchrun_then_slurm_and_fits_its_bits(monkeypatch):
    monkeypatch.setenv("SLURM_NODEID", "7")
    assert Guard(control="x").node == 7
    monkeypatch.setenv("GROUP_RANK", "2")
    assert Guard(control="x").node == 2
    monkeypatch.setenv("GROUP_RANK", str((1 << 16) + 5))
    assert Guard(control="x").node == 5


def _slurm_task(monkeypatch, procid, localid, node, ntasks=4, per_node="2(x2)"):
    for k, v in dict(
        SLURM_PROCID=procid, SLURM_LOCALID=localid, SLURM_NODEID=node, SLURM_NTASKS=ntasks,
        SLURM_STEP_TASKS_PER_NODE=per_node,
    ).items():
        monkeypatch.setenv(k, str(v))


def test_a_rank_slurm_started_takes_its_ranks_from_slurm(control, monkeypatch):
    _slurm_task(monkeypatch, procid=3, localid=1, node=1)
    g = Guard()
    assert (g.task, g.rank, g.local_rank, g.node, g.origin) == (3, 3, 1, 1, 3)
    g.step(1)
    hello = control.events()[0]
    assert (hello["rank"], hello["local_rank"], hello["node"], hello["task"]) == (3, 1, 1, 3)
    assert (hello["world"], hello["local_world"]) == (4, 2)
    # Under torchrun (GROUP_RANK), SLURM's task is the launcher's, not the rank's.
    monkeypatch.setenv("GROUP_RANK", "1")
    monkeypatch.setenv("RANK", "2")
    g = Guard()
    assert (g.task, g.rank, g.origin) == (None, 2, 1)
    # One task: nothing to tell apart.
    monkeypatch.delenv("GROUP_RANK")
    monkeypatch.delenv("RANK")
    monkeypatch.setenv("SLURM_NTASKS", "1")
    assert Guard().task is None


def test_the_node_task_count_reads_slurms_compressed_list(monkeypatch):
    monkeypatch.setenv("SLURM_STEP_TASKS_PER_NODE", "2(x3),1")
    assert [oomguard._slurm_node_tasks(n, 7) for n in range(4)] == [2, 2, 2, 1]
    monkeypatch.setenv("SLURM_STEP_TASKS_PER_NODE", "garbage(x")
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "8")
    assert oomguard._slurm_node_tasks(0, 16) == 8


def test_every_slurm_task_speaks_and_hears_the_other_task_of_its_node(control, monkeypatch):
    # Two tasks on one node: each has its own oomguard, so a request of the
    # other task is another oomguard's, though the node is the same.
    _slurm_task(monkeypatch, procid=1, localid=1, node=0)
    g = Guard()
    assert g._decide([(77 << 16) | 0, 2], None, step=9) is True
    [remote] = control.events()
    assert (remote["type"], remote["task"], remote["rank"]) == ("remote", 0, 1)
    g.checkpointed(["x"])
    assert "done" in control.types(), "local rank 1 speaks for its own oomguard"
    voted = []
    monkeypatch.setattr(g, "_all_max_async", lambda values: voted.append(list(values)))
    control.request(100, "checkpoint_and_exit")
    g.step(10)
    assert voted[-1][0] & oomguard._NODE_MASK == 1, "the vote names the task"


def test_a_larger_vote_wins_with_the_newer_request_and_the_exit(control):
    # What MAX over ranks gives: the newest id (whatever the node) and
    # checkpoint_and_exit over checkpoint.
    a = [(100 << 16) | 9, oomguard._KIND_CODE["checkpoint"]]
    b = [(101 << 16) | 0, oomguard._KIND_CODE["checkpoint_and_exit"]]
    assert max(a[0], b[0]) >> 16 == 101
    assert oomguard._CODE_KIND[max(a[1], b[1])] == "checkpoint_and_exit"


def test_deciding_on_this_nodes_request_acks_it(control):
    g = Guard()
    control.request(42, "checkpoint")
    g._request_now = g._read_request()
    assert g._decide([(42 << 16) | 0, 1], g._pending(), step=7) is True
    assert g._agreed == (42, "checkpoint")
    assert g.checkpoint_requested()
    [ack] = control.events()
    assert (ack["type"], ack["id"], ack["step"], ack["v"]) == ("ack", 42, 7, oomguard.PROTOCOL)


def test_deciding_on_another_nodes_request_says_who_asked(control, monkeypatch):
    monkeypatch.setenv("GROUP_RANK", "1")
    g = Guard()
    assert g._decide([(77 << 16) | 4, 2], None, step=9) is True
    [remote] = control.events()
    assert remote["type"] == "remote"
    assert (remote["id"], remote["node"], remote["kind"], remote["step"]) == (77, 4, "checkpoint_and_exit", 9)


def test_a_served_or_unknown_vote_is_not_decided(control):
    g = Guard()
    g._served = 50
    assert g._decide([(50 << 16) | 1, 1], None, 1) is False
    assert g._decide([(51 << 16) | 1, 3], None, 1) is False
    assert g._decide([0, 0], None, 1) is False
    assert control.events() == []


def test_a_broken_vote_never_stops_training(control, monkeypatch):
    g = Guard()

    def broken(values):
        raise RuntimeError("the process group is gone")

    monkeypatch.setattr(g, "_all_max_async", broken)
    control.request(1)
    assert g.step(1) is False


# -- checkpoints ----------------------------------------------------------------


def test_a_served_checkpoint_is_reported_once_and_training_goes_on(control, tmp_path):
    g = Guard()
    control.request(8, "checkpoint")
    assert g.step(3, epoch=0) is True
    g.checkpointed("rel.pt")
    assert not g.should_exit()
    assert not g.checkpoint_requested()
    done = [e for e in control.events() if e["type"] == "done"]
    assert len(done) == 1
    assert done[0]["id"] == 8 and done[0]["step"] == 3 and done[0]["ok"] is True
    assert done[0]["paths"] == [os.path.abspath("rel.pt")]
    assert done[0]["kind"] == "checkpoint"
    # The same request is not served again.
    assert g.step(4) is False
    control.request(9, "checkpoint_and_exit")
    assert g.step(5) is True
    g.checkpointed([tmp_path / "a", "b"], ok=False)
    assert g.should_exit()
    last = control.events()[-1]
    assert last["type"] == "done" and last["ok"] is False and last["id"] == 9
    assert last["paths"] == [str(tmp_path / "a"), os.path.abspath("b")]


def test_the_saved_files_and_their_directories_are_fsynced_before_done(control, tmp_path, monkeypatch):
    # A file, and an HF-style directory of files: each file, each
    # directory and the parent are on disk before `done` is written.
    ckpt = tmp_path / "model.pt"
    ckpt.write_bytes(b"weights")
    hf = tmp_path / "checkpoint-4"
    (hf / "sub").mkdir(parents=True)
    (hf / "sub" / "model.safetensors").write_bytes(b"w")
    (hf / "trainer_state.json").write_text("{}")
    synced = []
    real_fsync, real_open = os.fsync, os.open
    names = {}

    def opening(path, flags, *a):
        fd = real_open(path, flags, *a)
        names[fd] = str(path)
        return fd

    dones = [0]

    def fsync(fd):
        # Nothing is reported done before the last fsync.
        assert control.types().count("done") == dones[0]
        synced.append(names[fd])
        real_fsync(fd)

    monkeypatch.setattr(os, "open", opening)
    monkeypatch.setattr(os, "fsync", fsync)
    g = Guard()
    control.request(5, "checkpoint")
    assert g.step(4) is True
    g.checkpointed([ckpt, hf])
    assert control.types()[-1] == "done"
    for p in [ckpt, hf / "sub" / "model.safetensors", hf / "trainer_state.json", hf, hf / "sub", tmp_path]:
        assert str(p) in synced, (p, synced)
    # A path that is not there is passed on as it is (oomguard judges it).
    dones[0] = 1
    control.request(6, "checkpoint")
    assert g.step(5) is True
    g.checkpointed([tmp_path / "missing.pt"])
    assert control.events()[-1]["ok"] is True


def test_only_local_rank_0_writes_done(control, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    g = Guard()
    control.request(2)
    assert g.step(1) is True
    g.checkpointed(["x"])
    assert "done" not in control.types()
    assert g.step(2) is False, "served on this rank too"


def test_hello_progress_and_the_records_format(control):
    g = Guard(framework="plain")
    g.step(1)
    g.step(2)
    events = control.events()
    hello = events[0]
    assert hello["type"] == "hello"
    assert hello["v"] == oomguard.PROTOCOL and hello["pid"] == os.getpid()
    assert hello["framework"] == "plain" and hello["world"] == 1 and hello["local_rank"] == 0
    assert hello["version"] == oomguard.__version__
    assert hello["path"] == os.path.dirname(os.path.abspath(oomguard.__file__))
    assert [e["type"] for e in events].count("hello") == 1
    assert events[1]["type"] == "progress" and events[1]["step"] == 1
    with open(os.path.join(str(control.path), "events"), "rb") as f:
        for line in f:
            assert len(line) <= oomguard._MAX_LINE and line.endswith(b"\n")


def test_a_record_too_long_for_one_write_is_dropped(control):
    g = Guard()
    g._emit({"type": "done", "id": 1, "paths": ["x" * oomguard._MAX_LINE]})
    g._emit({"type": "ack", "id": 1, "step": 1})
    assert control.types() == ["ack"]


# -- resuming -------------------------------------------------------------------


def test_resume_path_is_the_reported_checkpoint_on_a_restart_only(tmp_path, monkeypatch):
    ckpt = tmp_path / "ckpt"
    ckpt.write_text("x")
    g = Guard(control=str(tmp_path))
    assert g.resume_path() is None
    monkeypatch.setenv("OOMGUARD_CHECKPOINT", str(ckpt))
    assert g.resume_path() is None, "the first attempt has nothing to resume"
    monkeypatch.setenv("OOMGUARD_ATTEMPT", "2")
    assert g.resume_path() == str(ckpt)
    monkeypatch.setenv("OOMGUARD_ATTEMPT", "x")
    assert g.resume_path() is None
    monkeypatch.setenv("OOMGUARD_ATTEMPT", "3")
    monkeypatch.setenv("OOMGUARD_CHECKPOINT", str(tmp_path / "gone"))
    assert g.resume_path() is None


# -- relieving ----------------------------------------------------------------------


def test_a_relieve_request_is_served_once_and_accounted(control):
    g = Guard()
    control.request(11, "relieve")
    assert g.step(1) is False, "relieve is no checkpoint"
    g.step(2)
    relieved = [e for e in control.events() if e["type"] == "relieved"]
    assert len(relieved) == 1
    assert relieved[0]["id"] == 11
    freed = relieved[0]["freed"]
    assert set(freed) >= {"gc", "malloc_trim"}
    assert all(isinstance(v, int) and v >= 0 for v in freed.values())
    control.request(12, "relieve")
    g.step(3)
    assert [e["id"] for e in control.events() if e["type"] == "relieved"] == [11, 12]


def test_relieve_counts_each_steps_fall_in_resident_memory(monkeypatch):
    rss = iter([1000, 400, 400, 500])
    monkeypatch.setattr(oomguard, "_rss", lambda: next(rss))
    freed = oomguard.relieve()
    # gc: 1000 -> 400; malloc_trim: 400 -> 500 is no negative saving.
    assert freed["gc"] == 600
    assert freed["malloc_trim"] == 0


def test_relieve_frees_real_cyclic_garbage():
    class Node:
        pass

    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(64):
            a, b = Node(), Node()
            a.other, b.other = b, a
            a.blob = bytearray(1 << 20)  # mmap'd: returned to the kernel when freed
        del a, b
        freed = oomguard.relieve()
    finally:
        if was_enabled:
            gc.enable()
    assert freed["gc"] > 32 << 20, freed


# -- the version ------------------------------------------------------------------------


def test_the_checkouts_version_is_cargo_tomls():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "Cargo.toml")) as f:
        text = f.read()
    package = text.split("[package]", 1)[1].split("\n[", 1)[0]
    version = [l.split("=", 1)[1].strip().strip('"') for l in package.splitlines() if l.startswith("version")][0]
    assert oomguard.__version__ == version
    assert oomguard._cargo_version(os.path.join(root, "Cargo.toml")) == version
    assert oomguard._cargo_version(os.path.join(root, "missing.toml")) is None


def test_the_embedded_copy_reads_its_version_beside_it(tmp_path, monkeypatch):
    import shutil
    import subprocess
    import sys

    pkg = tmp_path / "oomguard"
    shutil.copytree(os.path.dirname(oomguard.__file__), str(pkg))
    (pkg / "_embedded.py").write_text('VERSION = "9.8.7"\n')
    out = subprocess.check_output(
        [sys.executable, "-c", "import oomguard; print(oomguard.__version__)"],
        env=dict(os.environ, PYTHONPATH=str(tmp_path)),
    )
    assert out.decode().strip() == "9.8.7"


def _run_rank(control, script, **env):
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-c", "import oomguard\ng = oomguard.guard()\ng.step(1)\n" + script],
        env=dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(oomguard.__file__)), **env),
        capture_output=True,
        timeout=60,
    )


def test_a_rank_says_how_it_ends_an_exception_or_pythons_shutdown(control):
    r = _run_rank(control, "raise ValueError('bad batch')")
    assert r.returncode == 1 and b"ValueError: bad batch" in r.stderr, "the job's own hook still runs"
    events = control.events()
    assert [e["type"] for e in events if e["type"] in ("crash", "bye")] == ["crash", "bye"]
    crash = [e for e in events if e["type"] == "crash"][0]
    assert crash["error"] == "ValueError: bad batch"
    open(os.path.join(str(control.path), "events"), "w").close()
    r = _run_rank(control, "import sys; sys.exit(3)")
    assert r.returncode == 3
    assert [e["type"] for e in control.events() if e["type"] in ("crash", "bye")] == ["bye"]
    open(os.path.join(str(control.path), "events"), "w").close()
    r = _run_rank(control, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert r.returncode == -9
    assert [e["type"] for e in control.events() if e["type"] in ("crash", "bye")] == [], "a kill says nothing"


def test_a_rank_of_a_job_across_nodes_names_its_node_and_store_and_leaves_the_faults_to_oomguard(control):
    env = dict(WORLD_SIZE="4", LOCAL_WORLD_SIZE="2", RANK="3", LOCAL_RANK="1", GROUP_RANK="1")
    env.update(MASTER_ADDR="node0.example", MASTER_PORT="29500", OOMGUARD_FAULTS="oomguard")
    r = _run_rank(control, "import threading; print(sorted(t.name for t in threading.enumerate()))", **env)
    assert r.returncode == 0, r.stderr
    hello = control.events()[0]
    assert hello["node"] == 1 and hello["store"] == "node0.example:29500"
    assert b"oomguard-fault" not in r.stdout, "oomguard carries the faults"
    open(os.path.join(str(control.path), "events"), "w").close()
    r = _run_rank(control, "pass", WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", MASTER_ADDR="h", MASTER_PORT="1")
    assert control.events()[0]["store"] is None, "one node: no store to tell"


def test_rank_0_of_one_task_per_rank_says_its_normal_end_in_the_store(control, monkeypatch):
    # Its process serves the job's store: a normal end must not read as a death.
    _slurm_task(monkeypatch, procid=0, localid=0, node=0)
    g = Guard()
    put = {}

    class Store:
        def add(self, key, n):
            put[key] = put.get(key, 0) + n
            return put[key]

        def set(self, key, value):
            put[key] = json.loads(value)

    monkeypatch.setattr(oomguard, "_store", lambda: Store())
    g._store_closing()
    assert put["oomguard/fault/1"]["reason"] == "store-closing"
    assert put["oomguard/fault/1"]["origin"] == 0
    # After an exception nothing caught, the end is no normal one.
    put.clear()
    g._crashed = True
    g._store_closing()
    assert put == {}
