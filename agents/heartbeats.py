"""Workers' heartbeats: each worker writes one row every ``PLATFORM_WORKER_HEARTBEAT_S`` (its timer thread,
``agent_platform.celery``) while its consumer is connected to the broker, and removes it while not; ``/readyz``
asks whether any was written within ``PLATFORM_READY_WORKER_MAX_AGE_S``. A worker that stops cleanly removes its
own row; the row of one that was killed ages out, and rows of workers gone for a day are removed by the next
heartbeat of any worker."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.utils import timezone

from agents.models import WorkerHeartbeat

FORGET_AFTER = timedelta(days=1)


def worker_heartbeat_record(*, worker: str, now: datetime | None = None) -> None:
    """Note that ``worker`` (``host:pid``) is alive now."""
    now = now or timezone.now()
    WorkerHeartbeat.objects.update_or_create(worker=worker[:200], defaults={"seen_at": now})
    WorkerHeartbeat.objects.filter(seen_at__lt=now - FORGET_AFTER).delete()


def worker_last_seen() -> datetime | None:
    """When any worker last said it was alive, or None if none ever did."""
    return WorkerHeartbeat.objects.order_by("-seen_at").values_list("seen_at", flat=True).first()


def worker_heartbeat_forget(*, worker: str) -> None:
    """Remove ``worker``'s (``host:pid``) row as it stops: otherwise ``/readyz`` and ``platform_workers_alive`` count
    it alive for up to ``PLATFORM_READY_WORKER_MAX_AGE_S`` after (the only worker stopped: ready all the same; a
    restarted one: counted twice)."""
    WorkerHeartbeat.objects.filter(worker=worker[:200]).delete()
