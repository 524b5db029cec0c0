"""Deployment settings read from the environment: how HTTPS reaches the app, and the run lifecycle (leases,
deliveries, time limits, the reconciler). Merged into ``agent_platform.settings`` by lines at its end:

    from agent_platform.settings_deploy import *  # noqa: E402, F403
    if not CELERY_BROKER_URL.startswith("filesystem://"):
        CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": CELERY_VISIBILITY_TIMEOUT_S, ...}  # noqa: F405

The code reads the lifecycle values with ``agents.execution.lifecycle_setting(NAME)``, which falls back to this
module, so it keeps working (with the same environment) where a settings module lacks them.

HTTPS, ``PLATFORM_TLS`` — where TLS is terminated, as the operator declares it:

- ``off`` (the default): plain HTTP, for a machine's own use (``bin/up``, the tests). Nothing is added and
  nothing is silenced: ``manage.py check --deploy`` says what a deployment would lack.
- ``proxy``: a TLS-terminating proxy (load balancer, ingress, Caddy, nginx) in front redirects ``http`` to
  ``https`` and sets ``X-Forwarded-Proto: https`` (and strips a client's own). Django trusts that header, sends
  HSTS on HTTPS responses and Secure cookies; ``security.W008`` (no ``SECURE_SSL_REDIRECT``) is silenced
  because the redirect is the proxy's job — that warning's own text names this case.
- ``django``: Django itself redirects to HTTPS (``SECURE_SSL_REDIRECT``), sends HSTS, Secure cookies.

HSTS defaults (proxy or django) are the strict ones ``check --deploy`` asks for: a year, subdomains included,
preload. Each can be lowered from the environment (``SECURE_HSTS_SECONDS``, ``SECURE_HSTS_INCLUDE_SUBDOMAINS``,
``SECURE_HSTS_PRELOAD``; e.g. preload off on an apex domain you do not want on the browsers' preload list);
``check --deploy`` then warns, which is accurate. Browsers ignore HSTS received over plain HTTP, so the header
never pins a plain-HTTP host.
"""

from __future__ import annotations

import math
import os

from django.core.exceptions import ImproperlyConfigured

__all__ = [
    "CELERY_VISIBILITY_TIMEOUT_S",
    "CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS",
    "PLATFORM_RECONCILE_BATCH",
    "PLATFORM_RECONCILE_INTERVAL_S",
    "PLATFORM_RECONCILE_IN_WORKER",
    "PLATFORM_RUN_LEASE_S",
    "PLATFORM_RUN_MAX_DELIVERIES",
    "PLATFORM_RUN_MAX_TIME_LIMIT_S",
    "PLATFORM_RUN_QUEUED_STALE_S",
    "PLATFORM_RUN_TIME_LIMIT_GRACE_S",
    "PLATFORM_TLS",
    "PLATFORM_WORKER_DB_CONN_MAX_AGE",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS",
    "SECURE_HSTS_PRELOAD",
    "SECURE_HSTS_SECONDS",
    "SECURE_PROXY_SSL_HEADER",
    "SECURE_REDIRECT_EXEMPT",
    "SECURE_SSL_REDIRECT",
    "SILENCED_SYSTEM_CHECKS",
]


def _env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    return raw.strip().lower() in {"1", "true", "yes", "on"}


# The number variables of every settings module (this one, agent_platform/settings.py, settings_api.py) are read
# by the two functions below: unset or blank is the default (a compose file's ``${VAR:-}`` passes an unset variable
# on as blank), and anything else that is not a number within the setting's bound stops the process as it starts,
# saying which variable and which value (a bare int() said only "invalid literal for int()", and took a negative
# value: PLATFORM_READY_WORKER_MAX_AGE_S=-5 made /readyz never ready, PLATFORM_RUN_QUERY_MAX_CHARS=-5 every run a 413).


def _env_int(name: str, default: int, *, at_least: int | None = None) -> int:
    """``name``'s whole number, ``default`` when unset or blank. Raises ImproperlyConfigured, naming the variable
    and its value, for anything else that is not a whole number of ``at_least`` or more."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    value: int | None
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or (at_least is not None and value < at_least):
        raise ImproperlyConfigured(f"{name} must be a whole number{_bound_text(at_least)}, not {raw!r}")
    return value


def _env_float(name: str, default: float, *, at_least: float | None = None, above: float | None = None) -> float:
    """``name``'s number of seconds, ``default`` when unset or blank. Raises ImproperlyConfigured, naming the
    variable and its value, for anything else that is not a finite number of ``at_least`` or more (where 0 means
    "off" or "at once") or more than ``above`` (where 0 means nothing sensible: a limit nothing fits in, a poll
    that never pauses)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    too_low = (at_least is not None and value < at_least) or (above is not None and value <= above)
    # NaN compares false with every bound, and infinity is no number of seconds.
    if not math.isfinite(value) or too_low:
        raise ImproperlyConfigured(f"{name} must be a number of seconds{_bound_text(at_least, above)}, not {raw!r}")
    return value


def _bound_text(at_least: float | None, above: float | None = None) -> str:
    if at_least is not None:
        return f" of {at_least:g} or more"
    if above is not None:
        return f" above {above:g}"
    return ""


# --- HTTPS ----------------------------------------------------------------------------------------
PLATFORM_TLS = os.environ.get("PLATFORM_TLS", "off").strip().lower() or "off"
if PLATFORM_TLS not in {"off", "proxy", "django"}:
    raise ImproperlyConfigured(f"PLATFORM_TLS must be off, proxy or django, not {PLATFORM_TLS!r}")
_TLS = PLATFORM_TLS != "off"

SECURE_SSL_REDIRECT = _env_bool("SECURE_SSL_REDIRECT", default=PLATFORM_TLS == "django")
# The probes answer on plain HTTP too: a probe that is redirected never sees their answer (a kubelet's httpGet
# probe counts a redirect it does not follow as success, whatever /readyz would say). agent_platform/urls.py's
# paths, matched against the path without its leading slash.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]
# Trusted only where a proxy sets it: anywhere else a client could claim HTTPS with this header.
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if PLATFORM_TLS == "proxy" else None
SECURE_HSTS_SECONDS = _env_int("SECURE_HSTS_SECONDS", 31_536_000 if _TLS else 0, at_least=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = _env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", default=_TLS)
SECURE_HSTS_PRELOAD = _env_bool("SECURE_HSTS_PRELOAD", default=_TLS)
# The proxy redirects to HTTPS (see above); with PLATFORM_TLS=off or django nothing is silenced.
SILENCED_SYSTEM_CHECKS = ["security.W008"] if PLATFORM_TLS == "proxy" and not SECURE_SSL_REDIRECT else []

# --- the run lifecycle (agents.execution, agents.reconciler) ---------------------------------------
# A worker's claim on a running run lasts this long and is extended every third of it by a heartbeat (so two
# heartbeats in a row may fail before a live worker loses its run); a run whose lease lapsed (its worker died)
# is re-claimed by a redelivered message or re-queued by the reconciler, which wakes when a lease is due. A run
# of a dead worker is taken over within this plus one reconcile interval at worst, about this plus a second
# usually (bench/recovery.py: worker_loss_recovery_s_p50). Was 60 (with a 30-s interval: 89-109 s).
PLATFORM_RUN_LEASE_S = _env_float("PLATFORM_RUN_LEASE_S", 15.0)
# Deliveries (claims) of one pass of a run before a lost worker fails it with ``worker_lost``.
PLATFORM_RUN_MAX_DELIVERIES = _env_int("PLATFORM_RUN_MAX_DELIVERIES", 3, at_least=1)
# A queued run that no worker has claimed after this long is dispatched again (its message was lost).
PLATFORM_RUN_QUEUED_STALE_S = _env_float("PLATFORM_RUN_QUEUED_STALE_S", 300.0)
# Soft time limit of a run = its agent's time_limit_s, capped here; the hard limit (the worker process is
# killed) comes this much later. The broker's visibility timeout must exceed cap + grace (agents.checks). A cap of
# 0 failed every run (``time_limit``) while checks and /readyz said all was well; no grace left the run no time to
# record how it ended.
PLATFORM_RUN_MAX_TIME_LIMIT_S = _env_int("PLATFORM_RUN_MAX_TIME_LIMIT_S", 1800, at_least=1)
PLATFORM_RUN_TIME_LIMIT_GRACE_S = _env_int("PLATFORM_RUN_TIME_LIMIT_GRACE_S", 30, at_least=1)
# The reconciler: every worker runs it on a timer (no beat needed, also on the embedded broker), and
# ``celery beat`` may run it too (agents.reconcile_runs); every change it makes is compare-and-swap.
# Every worker's pass also runs early when the earliest lease of a running run is due (agent_platform.celery).
PLATFORM_RECONCILE_INTERVAL_S = _env_float("PLATFORM_RECONCILE_INTERVAL_S", 10.0)
PLATFORM_RECONCILE_IN_WORKER = _env_bool("PLATFORM_RECONCILE_IN_WORKER", default=True)
# At most this many runs re-dispatched (and as many re-queued) per pass, so a backlog does not flood the broker.
PLATFORM_RECONCILE_BATCH = _env_int("PLATFORM_RECONCILE_BATCH", 100, at_least=1)
# A worker process keeps its database connection across runs for this many seconds (or until it breaks); 0 opens
# one per run (agent_platform/celery.py).
PLATFORM_WORKER_DB_CONN_MAX_AGE = _env_int("PLATFORM_WORKER_DB_CONN_MAX_AGE", 600, at_least=0)
# Redis (and SQS) redeliver an unacknowledged message after this long: longer than any run's hard time limit.
CELERY_VISIBILITY_TIMEOUT_S = _env_int("CELERY_VISIBILITY_TIMEOUT_S", 3600, at_least=1)
# A broker connection blip must not kill running runs: their leases guard them, and a message that cannot be
# acknowledged any more is redelivered later and finds its run finished.
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = False
