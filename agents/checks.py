"""System checks of the run lifecycle's settings (registered by ``AgentsConfig.ready``).

- ``agents.E001``: the broker redelivers an unacknowledged message after its visibility timeout (Redis, SQS).
  A run still inside its hard time limit would then be delivered a second time while it runs, so the timeout
  must be longer than the longest hard limit (``PLATFORM_RUN_MAX_TIME_LIMIT_S`` +
  ``PLATFORM_RUN_TIME_LIMIT_GRACE_S``; every agent's limit is capped there).
- ``agents.E002``: ``PLATFORM_RUN_MAX_DELIVERIES`` must be at least 1.
- ``agents.E003``: ``PLATFORM_RUN_LEASE_S`` must be positive, and shorter than the visibility timeout (a lost
  worker's run is taken over by its lease long before the broker would redeliver it).
- ``agents.E004``: ``PLATFORM_RUN_WAKEUP`` must be a known value that the setup can have (``postgres`` needs
  PostgreSQL, ``redis`` a Redis); where it cannot, waiters poll (and a warning is logged).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, register

# Brokers that redeliver an unacknowledged message after a visibility timeout, and kombu's default for it.
VISIBILITY_TIMEOUT_SCHEMES = ("redis://", "rediss://", "sentinel://", "sqs://")
KOMBU_DEFAULT_VISIBILITY_TIMEOUT_S = 3600


@register("celery")
def check_run_lifecycle(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    from agents.dispatch import lifecycle_setting

    messages: list[CheckMessage] = []
    hard_max = int(lifecycle_setting("PLATFORM_RUN_MAX_TIME_LIMIT_S")) + int(
        lifecycle_setting("PLATFORM_RUN_TIME_LIMIT_GRACE_S")
    )
    lease_s = float(lifecycle_setting("PLATFORM_RUN_LEASE_S"))
    broker_url = str(getattr(settings, "CELERY_BROKER_URL", "") or "")
    visibility: float | None = None
    if broker_url.startswith(VISIBILITY_TIMEOUT_SCHEMES):
        options = getattr(settings, "CELERY_BROKER_TRANSPORT_OPTIONS", None) or {}
        visibility = float(options.get("visibility_timeout", KOMBU_DEFAULT_VISIBILITY_TIMEOUT_S))
        if visibility <= hard_max:
            messages.append(
                Error(
                    f"The broker's visibility timeout ({visibility:g} s) is not longer than the longest hard time "
                    f"limit of a run ({hard_max} s): a run still running would be delivered again.",
                    hint="Raise CELERY_VISIBILITY_TIMEOUT_S, or lower PLATFORM_RUN_MAX_TIME_LIMIT_S / "
                    "PLATFORM_RUN_TIME_LIMIT_GRACE_S.",
                    id="agents.E001",
                )
            )
    if int(lifecycle_setting("PLATFORM_RUN_MAX_DELIVERIES")) < 1:
        messages.append(Error("PLATFORM_RUN_MAX_DELIVERIES must be at least 1.", id="agents.E002"))
    if lease_s <= 0 or (visibility is not None and lease_s >= visibility):
        messages.append(
            Error(
                f"PLATFORM_RUN_LEASE_S ({lease_s:g}) must be positive and shorter than the broker's visibility "
                "timeout.",
                id="agents.E003",
            )
        )
    return messages


@register()
def check_run_wakeup(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    from agents.run_wakeup import wakeup_problem

    problem = wakeup_problem()
    if not problem:
        return []
    return [Error(problem, hint="Set PLATFORM_RUN_WAKEUP to auto, or to what the setup has.", id="agents.E004")]
