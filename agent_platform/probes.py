"""Probes and metrics for operators: ``/healthz`` (liveness), ``/readyz`` (readiness) and ``/metrics``
(Prometheus).

The web and the workers are separate processes, often on separate machines, so ``/metrics`` holds no counters of
its own: every figure is computed from the database at scrape time (runs, approvals, audit events, breaker
states, worker heartbeats), which every process writes. So any web process answers for the whole platform, and a
restart loses nothing. The cost is a handful of aggregate queries per scrape (the histograms and tool-call counts
aggregate over the ``runs`` and ``audit`` tables; scrape every 15-60 s, and archive old audit events). The
tool-call counters and latency histogram also add what the latest archive checkpoint saved of the events
``archive_audit`` moved out of the table (``audit.archive.tool_call_figures_total``): they never go down.
"""

from __future__ import annotations

import contextlib
import errno
import hmac
import ipaddress
import logging
import re
import socket
import time
from collections.abc import Iterator, Mapping
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db import InterfaceError, OperationalError, connection, transaction
from django.db.models import Count, DurationField, ExpressionWrapper, F, Q, Sum
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET, require_safe
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from agent_platform.client_ip import FORWARDED_HEADERS, client_ip, forwarded_client
from agent_platform.errors import database_unreachable
from audit.archive import TOOL_CALL_BUCKETS_S
from audit.masking import mask_text

logger = logging.getLogger(__name__)

# The Retry-After of a 503 while the database does not answer (seconds).
DATABASE_RETRY_AFTER_S = 5

RUN_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
# The tool-call latency histogram's buckets: audit.archive's, whose checkpoints save the archived calls' counts in them.
TOOL_BUCKETS_S = TOOL_CALL_BUCKETS_S


@require_safe
def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness: the process answers. (A database outage is ``/readyz``'s business: restarting a web process
    would not cure it.) Answered whatever the request's Host, like ``/readyz`` (``probe_middleware``)."""
    return JsonResponse({"status": "ok"})


# How long /readyz lets PostgreSQL take over its SELECT 1 once connected (milliseconds); connecting is bounded by
# DB_CONNECT_TIMEOUT (the connection's connect_timeout).
DATABASE_CHECK_STATEMENT_TIMEOUT_MS = 2000


def _check_database() -> None:
    """SELECT 1 on the request's connection. On PostgreSQL every step is bounded: opening the connection by its
    ``connect_timeout`` and the statement by a ``statement_timeout`` set for its own transaction only (the
    connection may outlive the request: CONN_MAX_AGE; and a pooler in transaction mode hands it to others)."""
    if connection.vendor != "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"SET LOCAL statement_timeout = {DATABASE_CHECK_STATEMENT_TIMEOUT_MS:d}")
        cursor.execute("SELECT 1")


# How long the broker check waits for a connection and for each answer (seconds).
BROKER_CHECK_TIMEOUT_S = 2


def _check_broker() -> None:
    """One connection to the broker, at most one retry, each socket operation bounded. A Redis broker's socket
    takes its timeouts only from the transport options (``connect_timeout`` stops at kombu): without them a Redis
    that accepts the connection and never answers holds the probe, and its web thread, for ever."""
    from agent_platform.celery import app

    options = {
        **(app.conf.broker_transport_options or {}),
        "socket_connect_timeout": BROKER_CHECK_TIMEOUT_S,
        "socket_timeout": BROKER_CHECK_TIMEOUT_S,
    }
    with app.connection_for_write(connect_timeout=BROKER_CHECK_TIMEOUT_S, transport_options=options) as broker:
        broker.ensure_connection(max_retries=1, interval_start=0, timeout=BROKER_CHECK_TIMEOUT_S)


def _check_worker() -> None:
    """A worker able to take live runs wrote its heartbeat within ``PLATFORM_READY_WORKER_MAX_AGE_S``: one that
    consumes their queue (a worker of the shadow queue only would leave them queued) on this process's own broker
    (one on another Redis database never sees them). Says which of the two the workers seen lack."""
    from agents.heartbeats import live_run_queue, this_broker, worker_last_seen, workers_seen

    max_age_s = float(settings.PLATFORM_READY_WORKER_MAX_AGE_S)
    queue = live_run_queue()
    seen = workers_seen(since=timezone.now() - timedelta(seconds=max_age_s), queue=queue, broker=this_broker())
    if seen.able:
        return
    if not seen.recent:
        # Not "no worker is running": a worker cut off from its broker removes its row, one cut off from the
        # database cannot write it, and both may be running and heal by themselves.
        problem = (
            f"no worker has written a heartbeat within {max_age_s:.0f} s (a worker cut off from its broker or "
            "database stops writing one)"
        )
        last = worker_last_seen()
        if last is not None:
            problem += f"; the last one was written {(timezone.now() - last).total_seconds():.0f} s ago"
        raise LookupError(problem)
    workers = "1 worker has" if seen.recent == 1 else f"{seen.recent} workers have"
    if not seen.on_queue:
        lacking = f"none consumes the queue {queue!r}"
    elif not seen.on_broker:
        lacking = "none on this broker"
    else:
        lacking = f"none consumes the queue {queue!r} on this broker"
    raise LookupError(f"{workers} a recent heartbeat, {lacking}")


def _check_keys() -> None:
    """The configured audit chain and secrets keys can be built (``audit.E001``, ``audit.E003``): a key that cannot
    makes every audited write fail, while the process still answers. Says which setting and which key by its place,
    never a key."""
    from audit.checks import unusable_keys

    problems = unusable_keys()
    if problems:
        raise LookupError("; ".join(problems))


def _check_audit_record() -> None:
    """The audit tables exist (a database never migrated has none: no audited write can succeed) and the record is
    append-only in the database (``audit.E004``): on SQLite, a ``migrate`` interrupted or failed leaves its tables
    without their triggers, open to raw UPDATE and DELETE, while every request succeeds. Names the tables or
    triggers missing and what puts them back."""
    from django.apps import apps

    from audit.checks import sqlite_triggers_missing

    tables = {model._meta.db_table for model in apps.get_app_config("audit").get_models() if model._meta.managed}
    absent = sorted(tables - set(connection.introspection.table_names()))
    if absent:
        raise LookupError(f"the audit tables are missing ({', '.join(absent)}): run manage.py migrate")
    missing = sqlite_triggers_missing(connection.alias)
    if missing:
        raise LookupError(
            f"the audit tables lack their append-only triggers ({', '.join(missing)}): run manage.py migrate"
        )


# What a failed connection's errors say, in the exceptions' types or, where the client library raises one bare
# exception (psycopg), in their text: the reasons /readyz gives, which tell the cases an operator acts on apart.
REFUSED = "connection refused"
HOST_UNKNOWN = "host name not resolved"
UNREACHABLE = "host unreachable"
TIMED_OUT = "timed out"
CREDENTIALS_REFUSED = "authentication failed"
NO_DATABASE = "database does not exist"
# A table or column the code reads is not there: the database was never migrated, or not since an upgrade.
NOT_MIGRATED = "database not migrated: run manage.py migrate"
_REASON_PATTERNS = tuple(
    (reason, re.compile(pattern))
    for reason, pattern in (
        (
            CREDENTIALS_REFUSED,
            r"authentication failed|no password supplied|wrongpass|noauth|authentication required"
            r'|invalid username-password pair|role "[^"]*" does not exist',
        ),
        (NO_DATABASE, r'database "[^"]*" does not exist'),
        (
            NOT_MIGRATED,
            r'no such table|no such column|relation "[^"]*" does not exist|column \S+ (of relation \S+ )?does not exist',
        ),
        (REFUSED, r"connection refused"),
        (
            HOST_UNKNOWN,
            r"could not translate host name|failed to resolve host|name or service not known"
            r"|temporary failure in name resolution|nodename nor servname",
        ),
        (UNREACHABLE, r"no route to host|network is unreachable"),
        (TIMED_OUT, r"timeout expired|timed out|timeout reading|timeout connecting"),
    )
)


def _causes(exc: BaseException) -> list[BaseException]:
    """``exc`` and what it was raised from or during (kombu's error wraps redis-py's, which wraps the socket's)."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain and len(chain) < 8:
        chain.append(current)
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    return chain


def _typed_reason(exc: BaseException) -> str | None:
    if isinstance(exc, socket.gaierror):
        return HOST_UNKNOWN
    if isinstance(exc, ConnectionRefusedError):
        return REFUSED
    if isinstance(exc, TimeoutError) or type(exc).__name__ in {"TimeoutError", "ConnectionTimeout"}:
        return TIMED_OUT  # the socket's, redis-py's, psycopg's
    if isinstance(exc, OSError) and exc.errno in {errno.EHOSTUNREACH, errno.ENETUNREACH}:
        return UNREACHABLE
    sqlstate = str(getattr(exc, "sqlstate", "") or "")
    if type(exc).__name__ == "AuthenticationError" or sqlstate.startswith("28"):
        return CREDENTIALS_REFUSED  # redis-py's; PostgreSQL's class 28, invalid authorization
    if sqlstate in {"42P01", "42703"}:
        return NOT_MIGRATED  # PostgreSQL's undefined table, undefined column
    return None


def failure_reason(exc: BaseException) -> str:
    """A failed check's reason in a few fixed words (``REFUSED``, ``HOST_UNKNOWN``, ``UNREACHABLE``, ``TIMED_OUT``,
    ``CREDENTIALS_REFUSED``, ``NO_DATABASE``, ``NOT_MIGRATED``), else the exception's class name: never the error's own text, which may
    quote a URL and its password."""
    causes = _causes(exc)
    for cause in causes:
        reason = _typed_reason(cause)
        if reason is not None:
            return reason
    text = " ".join(str(cause) for cause in causes).lower()
    for reason, pattern in _REASON_PATTERNS:
        if pattern.search(text):
            return reason
    return type(exc).__name__


def _masked_causes(exc: BaseException) -> str:
    """The failure's chain of errors for the log, masked: URLs' credentials and every secret the masking knows, and
    the database's and the broker's passwords even where a library quotes one bare."""
    from agent_platform.celery import app

    passwords = [str(connection.settings_dict.get("PASSWORD") or "")]
    for url in str(app.conf.broker_url or "").split(";"):
        with contextlib.suppress(ValueError):
            passwords.append(urlsplit(url.strip()).password or "")
    text = " <- ".join(f"{type(cause).__name__}: {cause}" for cause in _causes(exc))
    return mask_text(" ".join(text.split()), secrets=[p for p in passwords if p])


@require_safe
def readyz(request: HttpRequest) -> JsonResponse:
    """Readiness: the database answers, the broker accepts a connection, a worker able to take live runs
    (``_check_worker``) wrote its heartbeat within ``PLATFORM_READY_WORKER_MAX_AGE_S``, the keys can be used, and the audit record is append-only (its triggers). 200 when all hold, else 503; the body names each
    check. A failure is named by its reason in a few fixed words (``failure_reason``: a broker's error may quote its
    URL and password) and logged at WARNING with its errors' text, masked. Answered whatever the request's Host
    (``probe_middleware``)."""
    checks: dict[str, dict[str, Any]] = {}
    for name, check in (
        ("database", _check_database),
        ("broker", _check_broker),
        ("worker", _check_worker),
        ("keys", _check_keys),
        ("audit", _check_audit_record),
    ):
        if name in {"worker", "audit"} and not checks["database"]["ok"]:
            # The heartbeats and the triggers are in the database: asking it again would only wait as long again.
            checks[name] = {"ok": False, "error": "the database did not answer", "ms": 0.0}
            continue
        started = time.perf_counter()
        try:
            check()
            checks[name] = {"ok": True}
        except LookupError as exc:
            # Said by the check in words with no secret in them (Django's own line for the 503 is not written:
            # ``agent_platform.telemetry``): the log says why, as the answer does.
            logger.warning("readyz: the %s check failed: %s", name, exc)
            checks[name] = {"ok": False, "error": str(exc)}
        except Exception as exc:  # noqa: BLE001 - a failed check is the answer, never a 500
            reason = failure_reason(exc)
            logger.warning("readyz: the %s check failed (%s): %s", name, reason, _masked_causes(exc))
            checks[name] = {"ok": False, "error": reason}
        checks[name]["ms"] = round((time.perf_counter() - started) * 1000, 1)
    ready = all(c["ok"] for c in checks.values())
    return JsonResponse({"status": "ok" if ready else "unavailable", "checks": checks}, status=200 if ready else 503)


# Headers in which other proxies name the client instead of ``X-Forwarded-For`` (nginx's ``X-Real-IP``, Akamai's and
# Cloudflare's, ingress controllers'): the platform never reads them for an address, but a request that carries one
# came through a proxy all the same.
CLIENT_ADDRESS_HEADERS = (
    "HTTP_X_REAL_IP",
    "HTTP_TRUE_CLIENT_IP",
    "HTTP_CF_CONNECTING_IP",
    "HTTP_X_CLIENT_IP",
    "HTTP_X_ORIGINAL_FORWARDED_FOR",
)


def _forwarded_client_unknown(meta: Mapping[str, Any]) -> bool:
    """Whether a proxy forwarded the request (it carries forwarded headers, which ``ForwardedHeadersMiddleware``
    left only on a trusted proxy's requests, or a client's address in a header of another proxy's,
    ``CLIENT_ADDRESS_HEADERS``) without saying who the client is: no ``PLATFORM_PROXY_HOPS``, or fewer
    ``X-Forwarded-For`` entries than hops. ``client_ip`` is then the proxy's own address, loopback for a proxy on
    this machine, and every client behind it would pass for a local scraper. So does an entry that is no address
    (``unknown``): ``client_ip`` falls back to the proxy's own address then (``forwarded_client``)."""
    if not any(meta.get(name) for name in (*FORWARDED_HEADERS, *CLIENT_ADDRESS_HEADERS)):
        return False
    return forwarded_client(meta) is None


def _scraper_allowed(request: HttpRequest) -> bool:
    """A bearer token equal to ``PLATFORM_METRICS_TOKEN``, or a client address in
    ``PLATFORM_METRICS_ALLOWED_NETWORKS``: the client's own, never that of the proxy that forwarded it
    (``_forwarded_client_unknown``)."""
    token = str(settings.PLATFORM_METRICS_TOKEN or "")
    # The scheme is case-insensitive (RFC 7235), as the API reads it: "bearer" and "BEARER" too.
    scheme, *credentials = request.META.get("HTTP_AUTHORIZATION", "").split(None, 1) or [""]
    sent = credentials[0].strip() if credentials else ""
    if token and scheme.lower() == "bearer" and hmac.compare_digest(sent.encode(), token.encode()):
        return True
    if _forwarded_client_unknown(request.META):
        return False
    try:
        address = ipaddress.ip_address(client_ip(request.META))
    except ValueError:
        return False
    # Every entry is a network: the settings refuse to load otherwise.
    networks = [ipaddress.ip_network(network, strict=False) for network in settings.PLATFORM_METRICS_ALLOWED_NETWORKS]
    return any(candidate in network for candidate in _address_forms(address) for network in networks)


def _address_forms(
    address: ipaddress.IPv4Address | ipaddress.IPv6Address,
) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """The address as given and, for an IPv4-mapped one (``::ffff:a.b.c.d``: what a dual-stack socket, gunicorn
    --bind [::]:8000, reports for an IPv4 client), its IPv4 form too: an entry written either way (``10.0.0.0/8``;
    ``::ffff:0:0/96``, ``::/0``, as lists written for such a socket have) lets it in."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return [address, address.ipv4_mapped]
    return [address]


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """The platform's figures in Prometheus' text format (see the module's docstring for where they come from)."""
    if not _scraper_allowed(request):
        return JsonResponse(
            {"error": {"code": "forbidden", "message": _("Not allowed to read the metrics.")}},
            status=403,
            json_dumps_params={"ensure_ascii": False},  # "메트릭을 읽을 권한이 없습니다.", not \uba54…
        )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PlatformCollector())
    try:
        exposition = generate_latest(registry)
    except (OperationalError, InterfaceError) as exc:
        if not database_unreachable(exc):
            raise  # a bug, not an outage: a 500 with its traceback
        # Every figure comes from the database: without it there are none to give, and a scraper reads a 503 as
        # "down, try again" (Django's HTML 500 said the platform was broken).
        logger.warning("metrics: the database did not answer: %s", exc)
        response = JsonResponse(
            {
                "error": {
                    "code": "unavailable",
                    "message": _("The database is not available right now. Try again shortly."),
                }
            },
            status=503,
            json_dumps_params={"ensure_ascii": False},
        )
        response["Retry-After"] = str(DATABASE_RETRY_AFTER_S)
        # The warning above says why; Django's own ERROR line for the 503 would be written at every scrape (every
        # 15 s or so) for as long as the outage lasts, paging whoever alerts on ERROR lines for what is no error of
        # the platform's.
        response._has_been_logged = True  # type: ignore[attr-defined]  # Django's flag: log_response() writes nothing
        return response
    return HttpResponse(exposition, content_type=CONTENT_TYPE_LATEST)


def _histogram(
    name: str, documentation: str, label_names: list[str], rows: list[dict[str, Any]], buckets: tuple[float, ...]
) -> HistogramMetricFamily:
    """Rows carry the labels, ``le_<i>`` (count at or under bucket i), ``count`` and ``sum_s``."""
    family = HistogramMetricFamily(name, documentation, labels=label_names)
    for row in rows:
        cumulative = [(_le(bound), int(row[f"le_{i}"] or 0)) for i, bound in enumerate(buckets)]
        cumulative.append(("+Inf", int(row["count"] or 0)))
        family.add_metric([str(row[label] or "") for label in label_names], cumulative, float(row["sum_s"] or 0.0))
    return family


def _le(bound: float) -> str:
    return repr(float(bound))


class PlatformCollector(Collector):
    """Computes every metric from the database when collected."""

    def collect(self) -> Iterator[Metric]:
        from agents.heartbeats import live_run_queue, this_broker, workers_seen
        from agents.models import Approval, Run
        from audit.archive import tool_call_figures_total
        from audit.services import audit_chain_catch_up
        from auditor.chain_lag import audit_chain_lag
        from mcpregistry.models import McpServer

        runs = GaugeMetricFamily("platform_runs", "Runs by agent and status.", labels=["agent", "status"])
        for run_count in (
            Run.objects.filter(purpose=Run.Purpose.LIVE)
            .values("agent__slug", "status")
            .annotate(n=Count("id"))
            .order_by()
        ):
            runs.add_metric([run_count["agent__slug"] or "", run_count["status"]], run_count["n"])
        yield runs

        duration = ExpressionWrapper(F("finished_at") - F("created_at"), output_field=DurationField())
        run_rows: list[dict[str, Any]] = [
            dict(row)
            for row in (
                Run.objects.filter(finished_at__isnull=False, purpose=Run.Purpose.LIVE)
                .annotate(duration=duration)
                .values("agent__slug", "status")
                .annotate(
                    count=Count("id"),
                    total=Sum("duration"),
                    **{
                        f"le_{i}": Count("id", filter=Q(duration__lte=timedelta(seconds=bound)))
                        for i, bound in enumerate(RUN_BUCKETS_S)
                    },
                )
                .order_by()
            )
        ]
        for run_row in run_rows:
            run_row["sum_s"] = run_row["total"].total_seconds() if run_row["total"] else 0.0
            run_row["agent"] = run_row["agent__slug"]
        yield _histogram(
            "platform_run_duration_seconds",
            "Finished runs, from submission to finish, by agent and final status.",
            ["agent", "status"],
            run_rows,
            RUN_BUCKETS_S,
        )

        # The chain's lag as it stands, read before this scrape chains anything: chained first, it read 0 whether or
        # not a chainer runs, and an alert on it could never fire for a dead one.
        lag = audit_chain_lag()
        # Production figures: eval and shadow runs (and their tool calls) stay out of them. Events committed but
        # not chained yet (deferred chaining) are chained first, so that they are counted.
        audit_chain_catch_up()
        # Counted from the events in the table plus what the latest archive checkpoint saved of those archived
        # (archive_audit deletes events: counted from the table alone, the counters would go down).
        figures = tool_call_figures_total()
        calls = CounterMetricFamily(
            "platform_tool_calls",
            "Gated tool calls (every attempt, refusal and memo hit) by server, tool, outcome and reason code (tool "
            '"(unknown)": a name no server lists).',
            labels=["mcp_id", "tool", "outcome", "reason"],
        )
        for labels, n in sorted(figures.calls.items()):
            calls.add_metric(list(labels), n)
        yield calls

        tool_rows: list[dict[str, Any]] = [
            {
                "mcp_id": mcp_id,
                "tool": tool,
                "count": histogram.count,
                "sum_s": histogram.sum_ms / 1000,
                **{f"le_{i}": n for i, n in enumerate(histogram.le)},
            }
            for (mcp_id, tool), histogram in sorted(figures.latency.items())
        ]
        yield _histogram(
            "platform_tool_call_duration_seconds",
            "Tool calls sent to a server (each attempt), by server and tool.",
            ["mcp_id", "tool"],
            tool_rows,
            TOOL_BUCKETS_S,
        )

        breaker = GaugeMetricFamily(
            "platform_breaker_state",
            "Each server's circuit breaker: 1 for its current state.",
            labels=["mcp_id", "state"],
        )
        failures = GaugeMetricFamily(
            "platform_breaker_failures", "Consecutive counted failures per server.", labels=["mcp_id"]
        )
        for server in McpServer.objects.values("mcp_id", "breaker_state", "breaker_failures").order_by("mcp_id"):
            for state in McpServer.BreakerState.values:
                breaker.add_metric([server["mcp_id"], state], 1.0 if server["breaker_state"] == state else 0.0)
            failures.add_metric([server["mcp_id"]], server["breaker_failures"])
        yield breaker
        yield failures

        yield GaugeMetricFamily(
            "platform_queue_depth",
            "Runs waiting for a worker (queued).",
            value=Run.objects.filter(status=Run.Status.QUEUED).count(),
        )
        yield GaugeMetricFamily(
            "platform_pending_approvals",
            "Write calls waiting for a person's decision.",
            # Not those past their expiry the sweep has not marked yet: expired, as the dashboard and the API say.
            value=Approval.objects.filter(status=Approval.Status.PENDING, expires_at__gt=timezone.now()).count(),
        )
        yield GaugeMetricFamily(
            "platform_audit_chain_lag_seconds",
            "How long the oldest audit event not yet chained has waited (0: the chain is current).",
            value=lag.oldest_age_s,
        )
        yield GaugeMetricFamily(
            "platform_audit_chain_pending_events",
            "Audit events written but not chained yet (deferred chaining; 0 inline).",
            value=lag.count,
        )
        alive_since = timezone.now() - timedelta(seconds=float(settings.PLATFORM_READY_WORKER_MAX_AGE_S))
        yield GaugeMetricFamily(
            "platform_workers_alive",
            "Workers able to take live runs (they consume their queue on this broker) whose heartbeat is recent "
            "(within PLATFORM_READY_WORKER_MAX_AGE_S).",
            value=workers_seen(since=alive_since, queue=live_run_queue(), broker=this_broker()).able,
        )
