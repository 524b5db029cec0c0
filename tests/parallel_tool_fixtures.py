"""A local tool for the parallel-call tests: ``rendezvous`` answers only when a second call is in flight at the
same time (each waits up to 3 s for the other at a barrier), so calls made one after the other fail."""

from __future__ import annotations

import threading

from mcpregistry.local_tools import local_tool

RENDEZVOUS = threading.Barrier(2, timeout=3)


@local_tool
def rendezvous(label: str) -> str:
    """Waits until a second call arrives, then answers with its label."""
    RENDEZVOUS.wait()
    return f"met {label}"
