"""A pytest plugin (``-p tests.worker_dirs``, in pyproject's addopts): with pytest-xdist (``-n 2``) each test worker
keeps its own platform folder, ``$PLATFORM_VAR_DIR/<worker id>`` (its SQLite databases, embedded broker, keys
and anchors), so two workers never share a file; the processes a test starts inherit it. The third-party
servers' installation stays shared (``tests/thirdparty.py`` reads ``PLATFORM_TEST_SHARED_DIR``).

It runs as pytest imports its plugins: before pytest-django loads the settings, which read the folder once (a
conftest would be too late). pyproject's ``pythonpath = ["."]`` lets a bare ``pytest`` import it too."""

from __future__ import annotations

import os
from pathlib import Path

_worker = os.environ.get("PYTEST_XDIST_WORKER")
if _worker:
    _shared = Path(os.environ.get("PLATFORM_VAR_DIR") or Path(__file__).resolve().parent.parent / "var" / "test")
    os.environ.setdefault("PLATFORM_TEST_SHARED_DIR", str(_shared))
    os.environ["PLATFORM_VAR_DIR"] = str(_shared / _worker)
