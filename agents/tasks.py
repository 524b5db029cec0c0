"""Celery tasks: ids in, the service does the work."""

from __future__ import annotations

from celery import shared_task


@shared_task(name="agents.run_agent", acks_late=True, reject_on_worker_lost=True)
def run_agent(run_id: str) -> None:
    from agents.execution import run_execute

    run_execute(run_id=run_id)
