"""A local tool that tells the context it ran in (``tests/test_ops_review_fixes.py``)."""

from __future__ import annotations

import logging

from opentelemetry import trace

from agent_platform.telemetry import current_run_id
from mcpregistry.local_tools import local_tool


@local_tool
def which_run(note: str) -> dict[str, object]:
    """Logs a line and says the run and the span it ran under."""
    logging.getLogger("tests.local_tool_context").warning("working on %s", note)
    return {"run_id": current_run_id.get(), "span_valid": trace.get_current_span().get_span_context().is_valid}
