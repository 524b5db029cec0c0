"""A local tool whose normal answer carries an ``error`` field beside its data (``tests/mcpregistry/test_final_review_fixes.py``)."""

from __future__ import annotations

from typing import Any

from mcpregistry.local_tools import local_tool

CALLS: list[str] = []


@local_tool
def job_status(job: str) -> dict[str, Any]:
    """A job's status."""
    CALLS.append(job)
    return {"job": job, "state": "failed", "error": "disk full", "progress": 250, "rows": list(range(50))}
