"""Publishing a run's Celery task, and the run lifecycle's settings: the one place the rest of ``agents`` sends
work to a worker from. It names the task (``agents.run_agent``) rather than importing ``agents.tasks``, so the
tasks (the top of the import graph: they import the services inside their bodies) import this module, never the
other way round.

This module stays light (no engine, no LangGraph), so that the web process can dispatch runs cheaply.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from celery import current_app
from django.conf import settings
from django.db import InterfaceError, OperationalError
from kombu.exceptions import OperationalError as BrokerError

from agent_platform.telemetry import RUN_TRACEPARENT_HEADER

logger = logging.getLogger(__name__)

T = TypeVar("T")

RUN_TASK = "agents.run_agent"
# What a worker retries (the task retries itself with backoff): the database or the broker hiccuped.
RETRYABLE_ERRORS: tuple[type[BaseException], ...] = (OperationalError, InterfaceError, BrokerError)
# Publishing a run's message: retried a few times, then left to the reconciler's re-dispatch.
PUBLISH_RETRY_POLICY = {"max_retries": 3, "interval_start": 0.2, "interval_step": 0.5, "interval_max": 2.0}


def lifecycle_setting(name: str) -> Any:
    """``settings.<name>`` for the run lifecycle (``agent_platform.settings_deploy`` defines them from the
    environment; ``agent_platform.settings`` merges that module)."""
    return getattr(settings, name)


def run_time_limits(time_limit_s: int) -> tuple[int, int]:
    """(soft, hard) seconds for a run of an agent with this time limit: the soft one is the agent's (at least 1 s,
    at most ``PLATFORM_RUN_MAX_TIME_LIMIT_S``), the hard one ``PLATFORM_RUN_TIME_LIMIT_GRACE_S`` later."""
    soft = max(1, min(int(time_limit_s), int(lifecycle_setting("PLATFORM_RUN_MAX_TIME_LIMIT_S"))))
    return soft, soft + max(1, int(lifecycle_setting("PLATFORM_RUN_TIME_LIMIT_GRACE_S")))


def run_queue(purpose: str | None) -> str | None:
    """The Celery queue a run of this ``purpose`` is sent to, whoever sends it (its creation, a resume after an
    approval, the reconciler's re-dispatch): shadow runs to ``PLATFORM_SHADOW_QUEUE`` when it is set, so that they
    never wait in front of live runs; live and eval runs to the default queue (None)."""
    if purpose == "shadow":
        return getattr(settings, "PLATFORM_SHADOW_QUEUE", "") or None
    return None


def run_dispatch(*, run_id: str, time_limit_s: int, purpose: str | None = None, traceparent: str = "") -> bool:
    """Publish the run's task with its soft and hard time limits, retrying the publish (``PUBLISH_RETRY_POLICY``).

    Call it once the run's row is committed (``transaction.on_commit``). Returns False, and logs, when the broker
    cannot be reached even after the retries: the run stays queued and the reconciler dispatches it again after
    ``PLATFORM_RUN_QUEUED_STALE_S``. Never raises for a broker failure (the caller's transaction has committed).
    ``purpose``: the run's (``Run.purpose``), which picks its queue (``run_queue``); every dispatch of one run
    passes it, so that a run sent again goes where it was first sent. ``traceparent``: the run's first trace
    (``Run.traceparent``), passed by every later pass (a resume, a re-dispatch), whose task span links to it
    (``agent_platform.telemetry.RUN_TRACEPARENT_HEADER``); the first pass's parent is that trace already."""
    soft, hard = run_time_limits(time_limit_s)
    options: dict[str, Any] = {
        "soft_time_limit": soft,
        "time_limit": hard,
        "retry": True,
        "retry_policy": PUBLISH_RETRY_POLICY,
    }
    queue = run_queue(purpose)
    if queue:
        options["queue"] = queue
    if traceparent:
        options["headers"] = {RUN_TRACEPARENT_HEADER: traceparent}
    try:
        task = current_app.tasks.get(RUN_TASK)
        if task is not None:
            task.apply_async(args=[str(run_id)], **options)
        else:  # a process that has not imported agents.tasks (the app registry imports it: agents.apps)
            current_app.send_task(RUN_TASK, args=[str(run_id)], **options)
    except (BrokerError, OSError) as exc:
        logger.warning("run %s: could not publish its task (%s); the reconciler dispatches it later", run_id, exc)
        return False
    return True


def repaired_alone(what: str, repair: Callable[[], T], nothing: T, *, run_id: Any = None) -> T:
    """``repair()``, on its own: what it returns, or ``nothing`` where it raised, logged with what it was doing
    (and the run's id), so that the pass of repairs it is one of (the reconciler's, the approvals' expiry) goes on. Every repair of a run is a transaction of its own (rolled back
    when it raises); what a retry can fix (``RETRYABLE_ERRORS``) is raised: every other repair would meet it too."""
    try:
        return repair()
    except RETRYABLE_ERRORS:
        raise
    except Exception:
        if run_id is None:
            logger.exception("could not %s; the pass goes on", what)
        else:
            logger.exception("run %s: could not %s; the pass goes on", run_id, what)
        return nothing
