"""``find_oomguard_bin()`` in each install layout, and ``python -m oomguard``
replacing itself with the binary."""

import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig

import pytest

import oomguard
from oomguard import _find_bin

PACKAGE = os.path.dirname(os.path.abspath(oomguard.__file__))


def fake_bin(directory, body='echo "$$ $*"'):
    os.makedirs(str(directory), exist_ok=True)
    path = os.path.join(str(directory), "oomguard")
    with open(path, "w") as f:
        f.write("#!/bin/sh\n" + body + "\n")
    os.chmod(path, 0o755)
    return path


def load_copy(package_dir):
    """_find_bin as if installed in `package_dir` (its __file__ is there)."""
    os.makedirs(str(package_dir), exist_ok=True)
    dest = os.path.join(str(package_dir), "_find_bin.py")
    shutil.copy(os.path.join(PACKAGE, "_find_bin.py"), dest)
    spec = importlib.util.spec_from_file_location("oomguard_find_bin_copy", dest)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def nowhere(monkeypatch, tmp_path):
    """No oomguard in this interpreter's scripts, the user's or PATH."""
    empty = str(tmp_path / "empty")
    monkeypatch.setenv("PATH", empty)
    monkeypatch.setattr(sysconfig, "get_path", lambda *a, **k: empty)


def test_a_target_install(tmp_path, nowhere):
    # pip install --target T: T/oomguard/ and T/bin/oomguard
    module = load_copy(tmp_path / "T" / "oomguard")
    expected = fake_bin(tmp_path / "T" / "bin")
    assert module.find_oomguard_bin() == expected


def test_a_prefix_install(tmp_path, nowhere):
    # pip install --prefix P: P/lib/python3.X/site-packages/oomguard/, P/bin/oomguard
    module = load_copy(tmp_path / "P" / "lib" / "python3.11" / "site-packages" / "oomguard")
    expected = fake_bin(tmp_path / "P" / "bin")
    assert module.find_oomguard_bin() == expected


def test_the_scripts_directory_comes_first(tmp_path, monkeypatch):
    scripts = tmp_path / "venv" / "bin"
    expected = fake_bin(scripts)
    fake_bin(tmp_path / "onpath")
    monkeypatch.setenv("PATH", str(tmp_path / "onpath"))
    monkeypatch.setattr(sysconfig, "get_path", lambda name, *a, **k: str(scripts))
    assert _find_bin.find_oomguard_bin() == expected


def test_the_user_scheme(tmp_path, monkeypatch):
    user = tmp_path / "home" / ".local" / "bin"
    expected = fake_bin(user)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))

    def get_path(name, scheme=None, vars=None):
        return str(user) if scheme is not None and scheme.endswith("_user") else str(tmp_path / "venv")

    monkeypatch.setattr(sysconfig, "get_path", get_path)
    assert _find_bin.find_oomguard_bin() == expected


def test_path_last_then_a_clear_error(tmp_path, nowhere, monkeypatch):
    module = load_copy(tmp_path / "site" / "oomguard")
    with pytest.raises(module.OomguardNotFound) as e:
        module.find_oomguard_bin()
    assert "PATH" in str(e.value)
    expected = fake_bin(tmp_path / "onpath")
    monkeypatch.setenv("PATH", str(tmp_path / "onpath"))
    assert module.find_oomguard_bin() == expected


def test_python_m_oomguard_becomes_the_binary(tmp_path):
    # A --target layout holding this checkout's package and a stand-in
    # binary that prints its pid: the same pid as the `python -m` process
    # proves an exec, not a child (signals sent to it reach oomguard).
    target = tmp_path / "T"
    shutil.copytree(PACKAGE, str(target / "oomguard"))
    fake_bin(target / "bin")
    env = dict(os.environ, PYTHONPATH=str(target), PATH=str(tmp_path / "empty"))
    p = subprocess.Popen(
        [sys.executable, "-m", "oomguard", "run", "--", "x y"], stdout=subprocess.PIPE, env=env
    )
    out, _ = p.communicate(timeout=30)
    assert p.returncode == 0
    assert out.decode().split(" ", 1) == [str(p.pid), "run -- x y\n"]


def test_python_m_oomguard_without_a_binary_says_so(tmp_path):
    target = tmp_path / "T"
    shutil.copytree(PACKAGE, str(target / "oomguard"))
    env = dict(os.environ, PYTHONPATH=str(target), PATH=str(tmp_path / "empty"))
    p = subprocess.run([sys.executable, "-m", "oomguard", "--version"], capture_output=True, env=env)
    if p.returncode == 0:
        pytest.skip("an oomguard is installed with this interpreter")
    assert p.returncode == 127
    assert b"could not find the oomguard binary" in p.stderr
