"""A stdio "server" that dies at start quoting its ``UP_TOKEN`` on stderr, far into long lines: for each number in
``STDERR_PADS`` (comma-separated) one line ``config: <that many c> <token> end``, then exit status 3."""

from __future__ import annotations

import os
import sys

for pad in os.environ.get("STDERR_PADS", "0").split(","):
    sys.stderr.write("config: " + "c" * int(pad) + os.environ["UP_TOKEN"] + " end\n")
sys.stderr.flush()
sys.exit(3)
