"""What the engine's stages share about failing: the errors that must propagate, and seed 000's error texts.

A stage (the deterministic stage, the ReAct loop, a Flow graph) turns a tool's or a model's failure into a value
(a failed ``RunOutcome``); the errors in ``MUST_PROPAGATE`` are never turned into one: a database error is the
task's to retry, Celery's soft time limit is the run's to report as ``time_limit``, and a cancellation is the
run's to record. Every stage re-raises them with ``except MUST_PROPAGATE: raise`` before its catch-all.
"""

from __future__ import annotations

from celery.exceptions import SoftTimeLimitExceeded
from django.db import DatabaseError


class RunCancelled(Exception):
    """The run was cancelled while it ran (checked between steps)."""


MUST_PROPAGATE: tuple[type[BaseException], ...] = (DatabaseError, SoftTimeLimitExceeded, RunCancelled)

# Seed 000's error texts, in its own words.
DETERMINISTIC_STAGE_FAILED = "확정 호출된 MCP 단계에서 오류가 발생했습니다"
MCP_NOT_LOADED = "MCP '{mcp_id}'의 tool이 로드되지 않음"
