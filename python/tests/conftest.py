"""The companion's own tests: the logic that needs no process group, or a
single-process gloo one. Run from the repository's root:

    python -m pytest -q python/tests

They import the package from this checkout (python/), not an installed copy.
"""

import json
import os
import sys

import pytest

PYTHON_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir))
ROOT = os.path.dirname(PYTHON_DIR)
if sys.path[0] != PYTHON_DIR:
    sys.path.insert(0, PYTHON_DIR)

import oomguard  # noqa: E402

assert os.path.dirname(os.path.abspath(oomguard.__file__)) == os.path.join(PYTHON_DIR, "oomguard"), (
    "the tests must import python/oomguard of this checkout, not %s" % oomguard.__file__
)

_ENV = (
    "OOMGUARD_CONTROL",
    "OOMGUARD_CHECKPOINT",
    "OOMGUARD_ATTEMPT",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "SLURM_NODEID",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NTASKS",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
    "SLURM_STEP_TASKS_PER_NODE",
    "TORCHELASTIC_RUN_ID",
    "MASTER_ADDR",
    "MASTER_PORT",
    "OOMGUARD_FAULTS",
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """Each test starts outside oomguard and outside torchrun."""
    for name in _ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(oomguard, "_GUARD", None)
    # A guard's hello chains the exception hook; each test gets its own.
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)


class Control:
    """A control directory as oomguard makes it: `events` exists, `request`
    is replaced whole (a temporary file renamed over it)."""

    def __init__(self, path):
        self.path = path
        os.chmod(str(path), 0o700)
        open(os.path.join(str(path), "events"), "w").close()

    def request(self, id, kind="checkpoint", **extra):
        body = dict(dict(v=1, id=id, kind=kind, reason="test", deadline=0.0), **extra)
        self.write("request", json.dumps(body))

    def write(self, name, text):
        tmp = os.path.join(str(self.path), "." + name + ".tmp")
        with open(tmp, "w") as f:
            f.write(text)
        os.rename(tmp, os.path.join(str(self.path), name))

    def events(self):
        with open(os.path.join(str(self.path), "events")) as f:
            return [json.loads(line) for line in f]

    def types(self):
        return [e["type"] for e in self.events()]


@pytest.fixture
def control(tmp_path, monkeypatch):
    d = tmp_path / "control"
    d.mkdir()
    c = Control(d)
    monkeypatch.setenv("OOMGUARD_CONTROL", str(d))
    return c
