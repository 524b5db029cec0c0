"""The Celery application. Workers start with ``celery -A agent_platform worker``."""

from __future__ import annotations

import os

from celery import Celery
from celery.signals import worker_process_shutdown, worker_shutdown

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agent_platform.settings")

app = Celery("agent_platform")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_shutdown.connect
@worker_process_shutdown.connect
def _close_mcp_sessions(**_kwargs: object) -> None:
    """Close every pooled MCP session (and so every stdio server process) when a worker stops."""
    from mcpregistry.pool import shutdown_default_pool

    shutdown_default_pool()
