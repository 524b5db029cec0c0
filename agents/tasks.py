"""Celery tasks: ids in, the service does the work; and how a run's task is published.

``run_agent`` is acknowledged late and rejected (so delivered again) when its worker process is lost; the run's
claim and lease (``agents.execution``) make a second delivery harmless. A database or broker hiccup is retried
with exponential backoff and jitter; a tool's failure is not a task failure (the gate owns tool retries, and
``run_execute`` never raises for one). ``run_dispatch`` publishes it with the run's soft and hard time limits.

This module stays light (no engine, no LangGraph), so that the web process can dispatch runs cheaply.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task
from django.conf import settings
from django.db import InterfaceError, OperationalError
from kombu.exceptions import OperationalError as BrokerError

from agent_platform import settings_deploy

logger = logging.getLogger(__name__)

# What a worker retries (the task retries itself with backoff): the database or the broker hiccuped.
RETRYABLE_ERRORS: tuple[type[BaseException], ...] = (OperationalError, InterfaceError, BrokerError)
# Publishing a run's message: retried a few times, then left to the reconciler's re-dispatch.
PUBLISH_RETRY_POLICY = {"max_retries": 3, "interval_start": 0.2, "interval_step": 0.5, "interval_max": 2.0}


def lifecycle_setting(name: str) -> Any:
    """``settings.<name>`` for the run lifecycle, else the value ``agent_platform.settings_deploy`` read from
    the environment (the same one), so the code works with or without those lines in the settings module."""
    return getattr(settings, name, getattr(settings_deploy, name))


def run_time_limits(time_limit_s: int) -> tuple[int, int]:
    """(soft, hard) seconds for a run of an agent with this time limit: the soft one is the agent's (at least 1 s,
    at most ``PLATFORM_RUN_MAX_TIME_LIMIT_S``), the hard one ``PLATFORM_RUN_TIME_LIMIT_GRACE_S`` later."""
    soft = max(1, min(int(time_limit_s), int(lifecycle_setting("PLATFORM_RUN_MAX_TIME_LIMIT_S"))))
    return soft, soft + max(1, int(lifecycle_setting("PLATFORM_RUN_TIME_LIMIT_GRACE_S")))


@shared_task(
    name="agents.run_agent",
    acks_late=True,
    reject_on_worker_lost=True,
    autoretry_for=RETRYABLE_ERRORS,
    retry_backoff=2,
    retry_backoff_max=60,
    retry_jitter=True,
    max_retries=5,
)
def run_agent(run_id: str) -> None:
    from agents.execution import run_execute

    run_execute(run_id=run_id)


@shared_task(name="agents.reconcile_runs", ignore_result=True)
def reconcile_runs() -> None:
    """One pass of the reconciler (``celery beat`` schedules it; every worker also runs it on a timer)."""
    from agents.reconciler import runs_reconcile

    runs_reconcile()


def run_dispatch(*, run_id: str, time_limit_s: int) -> bool:
    """Publish the run's task with its soft and hard time limits, retrying the publish (``PUBLISH_RETRY_POLICY``).

    Call it once the run's row is committed (``transaction.on_commit``). Returns False, and logs, when the broker
    cannot be reached even after the retries: the run stays queued and the reconciler dispatches it again after
    ``PLATFORM_RUN_QUEUED_STALE_S``. Never raises for a broker failure (the caller's transaction has committed)."""
    soft, hard = run_time_limits(time_limit_s)
    try:
        run_agent.apply_async(
            args=[str(run_id)],
            soft_time_limit=soft,
            time_limit=hard,
            retry=True,
            retry_policy=PUBLISH_RETRY_POLICY,
        )
    except (BrokerError, OSError) as exc:
        logger.warning("run %s: could not publish its task (%s); the reconciler dispatches it later", run_id, exc)
        return False
    return True
