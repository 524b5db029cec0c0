"""Celery tasks: ids in, the service does the work (imported inside the body: the tasks are the top of the import
graph, and the web process, which only publishes them through ``agents.dispatch``, never loads the engine).

``run_agent`` is acknowledged late and rejected (so delivered again) when its worker process is lost; the run's
claim and lease (``agents.execution``) make a second delivery harmless. A database or broker hiccup is retried
with exponential backoff and jitter; a tool's failure is not a task failure (the gate owns tool retries, and
``run_execute`` never raises for one). ``agents.dispatch.run_dispatch`` publishes it with the run's time limits.
"""

from __future__ import annotations

from celery import shared_task

from agents.dispatch import RETRYABLE_ERRORS, RUN_TASK


@shared_task(
    name=RUN_TASK,
    acks_late=True,
    reject_on_worker_lost=True,
    autoretry_for=RETRYABLE_ERRORS,
    retry_backoff=2,
    retry_backoff_max=60,
    retry_jitter=True,
    # With the first delivery, ``agents.execution.RETRIED_PASSES_MAX`` passes: the last fails the run
    # (``retries_exhausted``) where every pass met such an error, rather than leave it queued for ever.
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
