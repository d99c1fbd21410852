"""Finds the ``oomguard`` binary that the wheel installed beside this package.

Not part of the copy that ``oomguard run`` embeds in a job (that copy has the
binary that wrote it); only the wheel has it, for ``python -m oomguard``.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List, Optional


class OomguardNotFound(FileNotFoundError):
    """The binary is in none of the places an install puts it."""


def find_oomguard_bin() -> str:
    """The path of the ``oomguard`` executable installed with this package.

    Looks where pip, uv and pipx put a wheel's scripts: this interpreter's
    scripts directory (a venv's ``bin/``), the base interpreter's, a
    ``--prefix`` layout (``<prefix>/lib/pythonX.Y/site-packages/oomguard``
    -> ``<prefix>/bin``), a ``--target`` layout (``<target>/oomguard`` ->
    ``<target>/bin``), the user scheme (``pip install --user``:
    ``~/.local/bin``), and ``PATH`` last.
    """
    exe = "oomguard" + (sysconfig.get_config_var("EXE") or "")
    seen = []  # type: List[str]
    for directory in _candidates():
        if not directory or directory in seen:
            continue
        seen.append(directory)
        path = os.path.join(directory, exe)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    on_path = shutil.which(exe)
    if on_path:
        return on_path
    raise OomguardNotFound(
        "could not find the oomguard binary; looked in:\n"
        + "".join(" - %s\n" % d for d in seen)
        + " - PATH\n"
        + "install the wheel (pip install oomguard-*.whl) or build it with "
        + "`cargo install --locked --path .`"
    )


def _candidates() -> List[Optional[str]]:
    package = os.path.dirname(os.path.abspath(__file__))
    return [
        sysconfig.get_path("scripts"),
        sysconfig.get_path("scripts", vars={"base": sys.base_prefix}),
        # `pip install --prefix P`: P/lib/pythonX.Y/site-packages/oomguard.
        _above(package, 4, "bin"),
        # `pip install --target T`: T/oomguard, with the scripts in T/bin.
        _above(package, 1, "bin"),
        _user_scripts(),
    ]


def _above(path: str, levels: int, child: str) -> Optional[str]:
    for _ in range(levels):
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent
    return os.path.join(path, child)


def _user_scripts() -> Optional[str]:
    scheme = "posix_user"
    get_preferred = getattr(sysconfig, "get_preferred_scheme", None)
    if get_preferred is not None:  # Python 3.10+
        scheme = get_preferred("user")
    try:
        return sysconfig.get_path("scripts", scheme=scheme)
    except KeyError:
        return None
