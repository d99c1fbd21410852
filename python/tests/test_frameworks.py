"""Where each framework's checkpoint goes, and the companion under a
single-process gloo group (the job's own process group, as torchrun makes
it; the vote then needs no all-reduce)."""

import os
import types

import pytest

import oomguard
from oomguard import Guard
from oomguard.accelerate import AccelerateGuard


class FakeAccelerator:
    def __init__(self, fail=False):
        self.saved = []
        self.fail = fail

    def save_state(self, path):
        if self.fail:
            raise OSError("disk full")
        os.makedirs(path)
        self.saved.append(path)


def test_accelerate_saves_under_step_n_and_reports_it(control, tmp_path):
    acc = FakeAccelerator()
    og = AccelerateGuard(acc, str(tmp_path / "ckpts"))
    assert og.step(1) is False
    control.request(5, "checkpoint_and_exit")
    assert og.step(2) is True
    assert acc.saved == [str(tmp_path / "ckpts" / "step_2")]
    assert og.should_exit()
    done = [e for e in control.events() if e["type"] == "done"][0]
    assert done["paths"] == [str(tmp_path / "ckpts" / "step_2")] and done["ok"] is True


def test_accelerate_reports_a_failed_save(control, tmp_path):
    og = AccelerateGuard(FakeAccelerator(fail=True), str(tmp_path))
    control.request(5)
    assert og.step(1) is True
    done = [e for e in control.events() if e["type"] == "done"][0]
    assert done["ok"] is False and not og.should_exit()


def test_lightnings_checkpoint_directory():
    pytest.importorskip("lightning")
    from oomguard.lightning import checkpoint_dir

    with_cb = types.SimpleNamespace(checkpoint_callback=types.SimpleNamespace(dirpath="/ck"), default_root_dir="/r")
    assert checkpoint_dir(with_cb) == "/ck"
    without = types.SimpleNamespace(checkpoint_callback=None, default_root_dir="/r")
    assert checkpoint_dir(without) == os.path.join("/r", "checkpoints")
    no_dir = types.SimpleNamespace(checkpoint_callback=types.SimpleNamespace(dirpath=None), default_root_dir="/r")
    assert checkpoint_dir(no_dir) == os.path.join("/r", "checkpoints")


@pytest.fixture
def gloo(tmp_path):
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    dist.init_process_group("gloo", init_method="file://" + str(tmp_path / "store"), rank=0, world_size=1)
    try:
        yield dist
    finally:
        dist.destroy_process_group()


def test_a_single_process_gloo_group_decides_at_once(control, gloo):
    assert oomguard._dist() is gloo
    assert oomguard._world_size() == 1
    g = Guard()
    assert g._all_max_async([1, 1]) is None, "one rank: no all-reduce"
    control.request(21, "checkpoint")
    assert g.step(1) is True
    g.checkpointed(["p"])  # the barrier of one rank returns
    assert [e["type"] for e in control.events()] == ["hello", "progress", "ack", "done"]
    assert control.events()[0]["world"] == 1
