"""``python -m oomguard ARGS``: runs the installed ``oomguard ARGS``.

The binary replaces this process (``execv``), so it keeps the pid, and a
signal sent to it (SIGTERM from a scheduler, Ctrl-C) reaches oomguard
itself, as with ``oomguard ARGS``.
"""

from __future__ import annotations

import os
import sys

from oomguard._find_bin import OomguardNotFound, find_oomguard_bin


def main() -> None:
    try:
        path = find_oomguard_bin()
    except OomguardNotFound as e:
        sys.stderr.write("python -m oomguard: %s\n" % e)
        sys.exit(127)
    if sys.stdout is not None:
        sys.stdout.flush()
    os.execv(path, [path] + sys.argv[1:])


if __name__ == "__main__":
    main()
