"""Tool metrics over a period, from the audit record (seed 002, section 9): per server and tool, how often it is
called, how often it fails and why, how long it takes (p50, p95, mean), and how many calls a run and a caller
make.

What counts: every ``tool.call`` audit event in the period is a call: each attempt sent to a server, and the
calls the gate answered itself (memo hits) or refused before sending (contract, unknown tool, open circuit). A
retried call is therefore several calls, as its server saw it; ``retries`` counts the attempts after the first.
Latency is measured over the attempts sent to a server (``attempt >= 1``), never over refusals or memo hits.

Counts, means and groupings are database aggregations. Percentiles are exact, read from one streamed, sorted
pass over ``latency_ms`` that keeps only the two values it needs per group (the group sizes come first), so a
period of any size is measured in constant memory.
"""

from __future__ import annotations

import datetime as dt
import itertools
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from django.db.models import Avg, Count, Max, Q, QuerySet
from django.utils import timezone

from agents.models import ApiKey
from audit.archive import NOT_PRODUCTION_SOURCES
from audit.changes import configured_secrets
from audit.masking import mask_known
from audit.models import AuditCheckpoint, AuditEvent
from audit.services import audit_chain_catch_up
from auditor.selectors import EXPORT_CHUNK_SIZE, AuditEventFilters, audit_event_filter

# Tool calls of eval and shadow runs and an admin's trials: visible and filterable, never in production metrics.

DEFAULT_PERIOD = dt.timedelta(days=7)
PERCENTILES = (0.50, 0.95)

_SENT = Q(attempt__gte=1, latency_ms__isnull=False)
_IN_RUN = Q(run_id__isnull=False)


@dataclass
class ToolMetrics:
    mcp_id: str
    tool: str
    calls: int
    errors: int
    error_rate: float
    errors_by_reason: dict[str, int]
    retries: int
    latency_p50_ms: float | None
    latency_p95_ms: float | None
    latency_mean_ms: float | None
    runs: int
    calls_per_run: float | None
    callers: dict[str, int] = field(default_factory=dict)


@dataclass
class CallerMetrics:
    actor: str
    name: str
    calls: int
    errors: int
    runs: int
    calls_per_run: float | None


@dataclass
class ToolMetricsReport:
    since: dt.datetime
    until: dt.datetime
    calls: int
    errors: int
    error_rate: float
    runs: int
    calls_per_run: float | None
    tools: list[ToolMetrics]
    callers: list[CallerMetrics]

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["since"] = self.since.isoformat()
        data["until"] = self.until.isoformat()
        return data


def tool_metrics(
    *,
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
    filters: AuditEventFilters | None = None,
    secrets: Iterable[str] | None = None,
) -> ToolMetricsReport:
    """The metrics of tool calls from ``since`` (inclusive, default ``until`` minus 7 days) to ``until``
    (exclusive, default now), narrowed by ``filters`` (their own ``since``/``until`` are ignored). Tools are
    ordered by calls, most first; callers likewise. Its recorded texts (a tool's name, a reason, a caller) are
    masked with ``secrets`` (default: those bound now, ``configured_secrets``), as the events are when shown: a
    value bound as a secret after a call recorded it is in no mask of the record."""
    until = until or timezone.now()
    since = since or until - DEFAULT_PERIOD
    filters = filters or AuditEventFilters()
    audit_chain_catch_up()  # events committed but not chained yet (deferred chaining) are counted too
    calls = AuditEvent.objects.filter(action="tool.call")
    if not filters.source:  # production metrics: eval, shadow and admin trial calls only when asked for by source
        calls = calls.exclude(source__in=NOT_PRODUCTION_SOURCES)
    base = audit_event_filter(calls, filters)
    base = base.filter(created_at__gte=since, created_at__lt=until)
    # Events are append-only: bounding every query below by the newest id seen now gives them one set of rows.
    newest = base.aggregate(newest=Max("id"))["newest"]
    base = base.filter(id__lte=newest or 0)

    groups = list(
        base.values("mcp_id", "tool")
        .annotate(
            calls=Count("id"),
            errors=Count("id", filter=Q(ok=False)),
            retries=Count("id", filter=Q(attempt__gt=1)),
            sent=Count("id", filter=_SENT),
            latency_mean=Avg("latency_ms", filter=_SENT),
            runs=Count("run_id", distinct=True),
            calls_in_runs=Count("id", filter=_IN_RUN),
        )
        .order_by("mcp_id", "tool")
    )
    reasons: dict[tuple[str, str], dict[str, int]] = {}
    for row in (
        base.filter(ok=False).values("mcp_id", "tool", "reason").annotate(n=Count("id")).order_by("-n", "reason")
    ):
        reasons.setdefault((row["mcp_id"], row["tool"]), {})[row["reason"]] = row["n"]
    callers_of: dict[tuple[str, str], dict[str, int]] = {}
    for row in base.values("mcp_id", "tool", "actor").annotate(n=Count("id")).order_by("-n", "actor"):
        callers_of.setdefault((row["mcp_id"], row["tool"]), {})[row["actor"]] = row["n"]
    percentiles = _latency_percentiles(base, {(g["mcp_id"], g["tool"]): g["sent"] for g in groups})

    tools = [
        ToolMetrics(
            mcp_id=g["mcp_id"],
            tool=g["tool"],
            calls=g["calls"],
            errors=g["errors"],
            error_rate=_ratio(g["errors"], g["calls"]) or 0.0,
            errors_by_reason=reasons.get((g["mcp_id"], g["tool"]), {}),
            retries=g["retries"],
            latency_p50_ms=percentiles.get((g["mcp_id"], g["tool"]), {}).get(0.50),
            latency_p95_ms=percentiles.get((g["mcp_id"], g["tool"]), {}).get(0.95),
            latency_mean_ms=_round(g["latency_mean"]),
            runs=g["runs"],
            calls_per_run=_ratio(g["calls_in_runs"], g["runs"]),
            callers=callers_of.get((g["mcp_id"], g["tool"]), {}),
        )
        for g in groups
    ]
    tools.sort(key=lambda t: (-t.calls, t.mcp_id, t.tool))

    caller_rows = list(
        base.values("actor")
        .annotate(
            calls=Count("id"),
            errors=Count("id", filter=Q(ok=False)),
            runs=Count("run_id", distinct=True),
            calls_in_runs=Count("id", filter=_IN_RUN),
        )
        .order_by("-calls", "actor")
    )
    names = _api_key_names([r["actor"] for r in caller_rows])
    callers = [
        CallerMetrics(
            actor=r["actor"],
            name=names.get(r["actor"], ""),
            calls=r["calls"],
            errors=r["errors"],
            runs=r["runs"],
            calls_per_run=_ratio(r["calls_in_runs"], r["runs"]),
        )
        for r in caller_rows
    ]
    totals = base.aggregate(
        calls=Count("id"), errors=Count("id", filter=Q(ok=False)), runs=Count("run_id", distinct=True),
        calls_in_runs=Count("id", filter=_IN_RUN),
    )  # fmt: skip
    shown = _shown(configured_secrets() if secrets is None else secrets)
    for tool in tools:
        tool.mcp_id, tool.tool = shown(tool.mcp_id), shown(tool.tool)
        tool.errors_by_reason = _counts_shown(tool.errors_by_reason, shown)
        tool.callers = _counts_shown(tool.callers, shown)
    for caller in callers:
        caller.actor, caller.name = shown(caller.actor), shown(caller.name)
    return ToolMetricsReport(
        since=since,
        until=until,
        calls=totals["calls"],
        errors=totals["errors"],
        error_rate=_ratio(totals["errors"], totals["calls"]) or 0.0,
        runs=totals["runs"],
        calls_per_run=_ratio(totals["calls_in_runs"], totals["runs"]),
        tools=tools,
        callers=callers,
    )


def _shown(secrets: Iterable[str]) -> Callable[[str], str]:
    """A recorded text as a report shows it: masked with ``secrets`` and the registered ones (``mask_known``)."""
    known = list(secrets)

    def shown(text: str) -> str:
        return str(mask_known(text, secrets=known))

    return shown


def _counts_shown(counts: dict[str, int], shown: Callable[[str], str]) -> dict[str, int]:
    """``counts`` by their texts as shown: two texts that mask alike are counted together."""
    masked: dict[str, int] = {}
    for text, n in counts.items():
        label = shown(text)
        masked[label] = masked.get(label, 0) + n
    return masked


@dataclass
class ArchivedPart:
    """What ``archive_audit`` took out of the table, as its latest checkpoint says: every event created before
    ``before`` (seq 1 to ``seq``) is in the archive files, the last of them ``file_name``; a period that starts
    before ``before`` is counted here without them."""

    before: dt.datetime
    seq: int
    file_name: str


def archived_part() -> ArchivedPart | None:
    """The archived part of the record (None: nothing archived). An archive takes the events older than its cutoff
    from the start of the chain, so each one archived was created before the first event it left in the table,
    and before the archive was made."""
    latest = AuditCheckpoint.objects.order_by("-seq").values_list("seq", "file_name", "archived_at").first()
    if latest is None:
        return None
    seq, file_name, archived_at = latest
    first_left = AuditEvent.objects.filter(seq__gt=seq).order_by("seq").values_list("created_at", flat=True).first()
    return ArchivedPart(before=min(archived_at, first_left or archived_at), seq=seq, file_name=file_name)


def percentile_positions(count: int, fraction: float) -> tuple[int, int, float]:
    """Where the ``fraction`` percentile of ``count`` sorted values lies, by linear interpolation between the
    closest ranks (numpy's default, ``statistics.quantiles(method="inclusive")``): the two indexes and the
    weight of the upper one."""
    position = (count - 1) * fraction
    lower = math.floor(position)
    return lower, math.ceil(position), position - lower


def _latency_percentiles(
    base: QuerySet[AuditEvent], sizes: dict[tuple[str, str], int]
) -> dict[tuple[str, str], dict[float, float]]:
    rows: Iterator[tuple[str, str, float]] = (
        base.filter(_SENT)
        .order_by("mcp_id", "tool", "latency_ms")
        .values_list("mcp_id", "tool", "latency_ms")
        .iterator(chunk_size=EXPORT_CHUNK_SIZE)
    )
    found: dict[tuple[str, str], dict[float, float]] = {}
    for key, group in itertools.groupby(rows, key=lambda row: (row[0], row[1])):
        count = sizes.get(key, 0)
        wanted = {p: percentile_positions(count, p) for p in PERCENTILES} if count else {}
        needed = {i for lower, upper, _w in wanted.values() for i in (lower, upper)}
        picked: dict[int, float] = {}
        last = 0.0
        for index, (_mcp_id, _tool, latency) in enumerate(group):
            last = latency
            if index in needed:
                picked[index] = latency
        found[key] = {}
        for p, (lower, upper, weight) in wanted.items():
            low, high = picked.get(lower, last), picked.get(upper, last)
            found[key][p] = round(low + (high - low) * weight, 2)
    return found


def _api_key_names(actors: list[str]) -> dict[str, str]:
    """``api_key:<prefix>`` actors → the key's name, so that a person can tell callers apart."""
    prefixes = {a.removeprefix("api_key:"): a for a in actors if a.startswith("api_key:")}
    return {
        prefixes[prefix]: name
        for prefix, name in ApiKey.objects.filter(prefix__in=list(prefixes)).values_list("prefix", "name")
    }


def _ratio(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def _round(value: float | None) -> float | None:
    return round(value, 2) if value is not None else None


# --- over time --------------------------------------------------------------------------------------------------

Bucket = Literal["hour", "day"]
SERIES_TOOLS = 8
"""Tools charted one by one (the most called); the rest count in the total."""


@dataclass
class SeriesPoint:
    start: dt.datetime
    calls: int = 0
    errors: int = 0
    latency_p95_ms: float | None = None

    @property
    def error_rate(self) -> float | None:
        return _ratio(self.errors, self.calls)


@dataclass
class ToolSeries:
    """One tool's calls, errors and p95 latency per hour or day (``mcp_id`` and ``tool`` empty: every tool)."""

    mcp_id: str
    tool: str
    calls: int
    points: list[SeriesPoint]


MAX_BUCKETS = 2_000
"""The most points a chart's line has: about 83 days by the hour, 5½ years by the day. A longer period is charted
by the day, or not at all (its totals are still counted): a year 1 to 9999 by the hour would be 87 million
points, built in memory for every charted tool."""


def series_bucket(*, since: dt.datetime, until: dt.datetime, asked: str = "") -> Bucket | None:
    """The bucket to chart ``since``..``until`` by: ``asked`` where it gives at most :data:`MAX_BUCKETS` points,
    else hours for two days or less and days otherwise; None where even days give more points than that."""
    span = until - since
    hours, days = span / dt.timedelta(hours=1), span / dt.timedelta(days=1)
    if asked == "hour" and hours <= MAX_BUCKETS:
        return "hour"
    if asked not in ("hour", "day") and span <= dt.timedelta(days=2):
        return "hour"
    return "day" if days <= MAX_BUCKETS else None


def bucket_starts(*, since: dt.datetime, until: dt.datetime, bucket: Bucket) -> list[dt.datetime]:
    """The starts of the hours or days (in the current time zone) that cover ``since``..``until`` (at most
    :data:`MAX_BUCKETS` + 1: :func:`series_bucket` chooses a bucket that fits)."""
    local = timezone.localtime(since)
    start = local.replace(minute=0, second=0, microsecond=0)
    if bucket == "day":
        start = start.replace(hour=0)
    step = dt.timedelta(hours=1) if bucket == "hour" else dt.timedelta(days=1)
    starts = []
    while start < until and len(starts) <= MAX_BUCKETS:
        starts.append(start)
        # Local wall-clock steps: a day is the next local midnight, whatever the offset does.
        start = timezone.make_aware(timezone.make_naive(start) + step) if bucket == "day" else start + step
    return starts


def tool_metrics_series(
    *,
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
    bucket: Bucket = "hour",
    filters: AuditEventFilters | None = None,
    secrets: Iterable[str] | None = None,
) -> list[ToolSeries]:
    """Calls, errors and p95 latency per ``bucket`` for every tool together (first) and for the
    ``SERIES_TOOLS`` most called tools, over the same events as :func:`tool_metrics` counts. One streamed pass;
    it keeps the latencies of one period in memory to take their p95 (use days over long periods). Tools are
    named as :func:`tool_metrics` names them (masked with ``secrets``)."""
    until = until or timezone.now()
    since = since or until - DEFAULT_PERIOD
    filters = filters or AuditEventFilters()
    audit_chain_catch_up()  # events committed but not chained yet (deferred chaining) are counted too
    calls = AuditEvent.objects.filter(action="tool.call")
    if not filters.source:  # production metrics: eval, shadow and admin trial calls only when asked for by source
        calls = calls.exclude(source__in=NOT_PRODUCTION_SOURCES)
    base = audit_event_filter(calls, filters)
    base = base.filter(created_at__gte=since, created_at__lt=until)
    starts = bucket_starts(since=since, until=until, bucket=bucket)
    if not starts:
        return []
    totals = {
        (row["mcp_id"], row["tool"]): row["n"]
        for row in base.values("mcp_id", "tool").annotate(n=Count("id")).order_by("-n", "mcp_id", "tool")
    }
    charted = sorted(totals, key=lambda key: (-totals[key], key))[:SERIES_TOOLS]
    keys: list[tuple[str, str]] = [("", ""), *charted]
    counts = {key: [[0, 0] for _ in starts] for key in keys}
    latencies: dict[tuple[str, str], list[list[float]]] = {key: [[] for _ in starts] for key in keys}
    rows = base.order_by().values_list("mcp_id", "tool", "created_at", "ok", "attempt", "latency_ms")
    for mcp_id, tool, created_at, ok, attempt, latency_ms in rows.iterator(chunk_size=EXPORT_CHUNK_SIZE):
        index = _bucket_index(starts, timezone.localtime(created_at))
        for key in (("", ""), (mcp_id, tool)):
            if key not in counts:
                continue
            counts[key][index][0] += 1
            counts[key][index][1] += 0 if ok else 1
            if attempt >= 1 and latency_ms is not None:
                latencies[key][index].append(latency_ms)
    shown = _shown(configured_secrets() if secrets is None else secrets)
    series = []
    for key in keys:
        points = [
            SeriesPoint(start=start, calls=calls, errors=errors, latency_p95_ms=_p95(latencies[key][i]))
            for i, (start, (calls, errors)) in enumerate(zip(starts, counts[key], strict=True))
        ]
        calls_in_all = sum(p.calls for p in points)
        series.append(ToolSeries(mcp_id=shown(key[0]), tool=shown(key[1]), calls=calls_in_all, points=points))
    return series


def _bucket_index(starts: list[dt.datetime], moment: dt.datetime) -> int:
    low, high = 0, len(starts) - 1
    while low < high:  # the last start at or before the moment
        middle = (low + high + 1) // 2
        if starts[middle] <= moment:
            low = middle
        else:
            high = middle - 1
    return low


def _p95(values: list[float]) -> float | None:
    if not values:
        return None
    values.sort()
    lower, upper, weight = percentile_positions(len(values), 0.95)
    return round(values[lower] + (values[upper] - values[lower]) * weight, 2)
