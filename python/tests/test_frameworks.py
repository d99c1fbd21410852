"""Where each framework's checkpoint goes, and the companion under a
single-process gloo group (the job's own process group, as torchrun makes
it; the vote then needs no all-reduce)."""

import importlib
import os
import sys
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


@pytest.fixture
def lightning_module(monkeypatch):
    """oomguard.lightning over a stand-in ``lightning.pytorch.callbacks``:
    the callback's logic without Lightning's import (seconds per run)."""

    class Callback:
        pass

    callbacks = types.ModuleType("lightning.pytorch.callbacks")
    callbacks.Callback = Callback
    for name in ("lightning", "lightning.pytorch"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "lightning.pytorch.callbacks", callbacks)
    monkeypatch.delitem(sys.modules, "oomguard.lightning", raising=False)
    module = importlib.import_module("oomguard.lightning")
    yield module
    sys.modules.pop("oomguard.lightning", None)


def trainer(tmp_path, dirpath=None, step=5, epoch=1):
    t = types.SimpleNamespace(
        checkpoint_callback=types.SimpleNamespace(dirpath=dirpath) if dirpath is not None else None,
        default_root_dir=tmp_path,
        global_step=step,
        current_epoch=epoch,
        should_stop=False,
        saved=[],
    )
    t.save_checkpoint = t.saved.append
    return t


def test_lightnings_checkpoint_directory(lightning_module, tmp_path):
    checkpoint_dir = lightning_module.checkpoint_dir
    assert checkpoint_dir(trainer(tmp_path, dirpath="/ck")) == "/ck"
    assert checkpoint_dir(trainer(tmp_path)) == os.path.join(str(tmp_path), "checkpoints")
    assert checkpoint_dir(trainer(tmp_path, dirpath="")) == os.path.join(str(tmp_path), "checkpoints")


def test_the_lightning_callback_saves_the_agreed_step_and_stops_the_fit(lightning_module, control, tmp_path, capsys):
    cb = lightning_module.OomguardCallback(Guard(framework="lightning"))
    t = trainer(tmp_path, step=7, epoch=2)
    # Lightning's ModelCheckpoint, as far as the callback touches it.
    mc = types.SimpleNamespace(_last_global_step_saved=0, _last_checkpoint_saved=None, save_last=None)
    t.checkpoint_callbacks = [mc]
    cb.on_train_batch_end(t, None, None, None, 0)
    assert t.saved == [] and not t.should_stop
    control.request(3, "checkpoint_and_exit", reason="critical-headroom")
    t.global_step = 8
    cb.on_train_batch_end(t, None, None, None, 1)
    expected = os.path.join(str(tmp_path), "checkpoints", "epoch=2-step=8.ckpt")
    assert t.saved == [expected]
    assert t.should_stop
    assert (mc._last_global_step_saved, mc._last_checkpoint_saved) == (8, expected), "saved once"
    err = capsys.readouterr().err
    assert "oomguard: stopping the fit after the checkpoint at step 8 (critical-headroom)\n" == err
    done = [e for e in control.events() if e["type"] == "done"][0]
    assert done["paths"] == [expected] and done["step"] == 8 and done["epoch"] == 2


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


def test_a_last_ckpt_the_user_asked_for_is_still_made_of_the_companions_save(lightning_module, control, tmp_path):
    cb = lightning_module.OomguardCallback(Guard(framework="lightning"))
    t = trainer(tmp_path, step=4, epoch=0)
    made = []
    mc = types.SimpleNamespace(
        _last_global_step_saved=0,
        _last_checkpoint_saved=None,
        save_last=True,
        _monitor_candidates=lambda trainer: {"step": trainer.global_step},
        _save_last_checkpoint=lambda trainer, candidates: made.append(candidates),
    )
    t.checkpoint_callbacks = [mc]
    control.request(5, "checkpoint")
    cb.on_train_batch_end(t, None, None, None, 0)
    assert len(t.saved) == 1 and not t.should_stop
    assert made == [{"step": 4}], "save_last still honoured"
    assert mc._last_global_step_saved == 4


def test_lightnings_own_slurm_requeue_is_off_under_oomguard(lightning_module):
    class SLURMEnvironment:
        auto_requeue = True

    env = SLURMEnvironment()
    t = types.SimpleNamespace(_accelerator_connector=types.SimpleNamespace(cluster_environment=env))
    lightning_module.no_second_requeue(t)
    assert env.auto_requeue is False
    # Any other cluster, or a Trainer without one, is left alone.
    other = types.SimpleNamespace(auto_requeue=True)
    lightning_module.no_second_requeue(types.SimpleNamespace(_accelerator_connector=types.SimpleNamespace(cluster_environment=other)))
    assert other.auto_requeue is True
    lightning_module.no_second_requeue(types.SimpleNamespace())
