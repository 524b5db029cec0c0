"""What the engine's stages share about failing: the errors that must propagate, and seed 000's error texts.

A stage (the deterministic stage, the ReAct loop, a Flow graph) turns a tool's or a model's failure into a value
(a failed ``RunOutcome``); the errors in ``MUST_PROPAGATE`` are never turned into one: a database error is the
task's to retry, Celery's soft time limit is the run's to report as ``time_limit``, and a cancellation is the
run's to record. Every stage re-raises them with ``except MUST_PROPAGATE: raise`` before its catch-all.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import billiard.common
from celery.exceptions import SoftTimeLimitExceeded, WorkerShutdown, WorkerTerminate
from django.db import DatabaseError


class RunCancelled(Exception):
    """The run was cancelled while it ran (checked between steps)."""


MUST_PROPAGATE: tuple[type[BaseException], ...] = (DatabaseError, SoftTimeLimitExceeded, RunCancelled)


# billiard's handler of a terminate signal in a pool's child process (``_shutdown_cleanup``) raises a plain
# ``SystemExit`` and says so here. Its type stubs do not list the function.
_terminate_handler_fired: Callable[[], bool] = getattr(billiard.common, "terminate_handler_fired", lambda: False)


def worker_interruption(exc: BaseException) -> bool:
    """Whether ``exc``, no ``Exception``, out of a flow or a code rule is the worker's own interruption, which
    propagates (the run is then redelivered or ended by its task, not failed as the flow's or the rule's):
    Celery's shutdown (``WorkerShutdown``, ``WorkerTerminate``), billiard's ``SystemExit`` once its terminate
    handler fired, a ``KeyboardInterrupt`` and a ``GeneratorExit``, and a cancellation of the flow's coroutine (the
    flow's own is a ``FlowCancelledItself``).

    Anything else is the flow's or the rule's failure (``sys.exit()`` in a node or a rule, argparse on its input, a
    library's ``BaseException`` subclass): let
    through, it would leave its run ``running``. Unlike a local tool's thread (``mcpregistry.local_tools``), the
    flow's code is not alone: ``check`` and ``emit`` run in the worker's own thread, where a signal arrives, and
    what they raise goes back through the flow's nodes; a ``KeyboardInterrupt`` may be a person's Ctrl-C there.
    Celery's time limits are ``Exception`` s (``SoftTimeLimitExceeded`` is in ``MUST_PROPAGATE``)."""
    if isinstance(exc, WorkerShutdown | WorkerTerminate | KeyboardInterrupt | GeneratorExit | asyncio.CancelledError):
        return True
    return isinstance(exc, SystemExit) and _terminate_handler_fired()


# Seed 000's error texts, in its own words.
DETERMINISTIC_STAGE_FAILED = "확정 호출된 MCP 단계에서 오류가 발생했습니다"
MCP_NOT_LOADED = "MCP '{mcp_id}'의 tool이 로드되지 않음"
