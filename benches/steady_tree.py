#!/usr/bin/env python3
"""A steady node for the log-size measurement (docs/log-schema.md): a parent
and 40 forked children, 20 MiB each, nothing moving, for SECONDS (default
1800), then the children are ended. Standard library only.

    python3 benches/steady_tree.py [SECONDS]
"""
import os
import signal
import sys
import time

seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 1800.0
kids = []
for _ in range(40):
    pid = os.fork()
    if pid == 0:
        held = bytearray(os.urandom(1)) * (20 << 20)
        while True:
            time.sleep(3600)
    kids.append(pid)
held = bytearray(20 << 20)
for i in range(0, len(held), 4096):
    held[i] = 1
time.sleep(seconds)
for k in kids:
    os.kill(k, signal.SIGTERM)
