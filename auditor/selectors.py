"""Reads of the audit record that carry rules: the filters an auditor uses (the same in the admin and the API),
keyset pages, and the streamed export. Nothing here materializes an unbounded queryset."""

from __future__ import annotations

import datetime as dt
import unicodedata
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from django.db.models import OuterRef, Q, QuerySet, Subquery
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from agents.models import Run
from audit.models import AuditEvent
from audit.services import audit_chain_catch_up

EXPORT_CHUNK_SIZE = 2000
"""Rows fetched from the database at a time by an export (a server-side cursor on PostgreSQL)."""

# Each export column and the ORM path it is read from (most are the event's own field).
_EXPORT_FIELDS: tuple[tuple[str, str], ...] = (
    ("id", "id"),
    ("created_at", "created_at"),
    ("run", "run_id"),
    ("agent", "agent_slug"),
    *((name, name) for name in ("source", "action", "mcp_id", "tool", "call_id", "ok", "reason", "attempt")),
    *((name, name) for name in ("latency_ms", "actor", "args", "result", "seq", "prev_hash", "hash", "nonce")),
)
EXPORT_COLUMNS: tuple[str, ...] = tuple(column for column, _path in _EXPORT_FIELDS)
"""The columns of an export and of the API's JSON events, in order. ``seq``, ``prev_hash`` and ``hash`` are the
event's place in the hash chain, so that an export can be checked against ``verify_audit``'s head; ``nonce`` (an
event chained from the pending table; empty for others) is hashed with it."""
_EXPORT_VALUES: tuple[str, ...] = tuple(path for _column, path in _EXPORT_FIELDS)


@dataclass(frozen=True)
class AuditEventFilters:
    """What an auditor narrows the record to. Every field is optional; given ones must all hold.

    ``reason`` and ``action`` are exact, or a prefix when they end with ``*`` (``args:*``, ``config.*`` for every
    change of the configuration); a leading ``!`` keeps every event but those (``!rule:skipped``: the record
    without the rules that did not match). ``actor`` is the caller: the event's
    actor (``api_key:<prefix>``, an admin's username, ``local``) or the name or prefix of the API key of the
    event's run. ``run_prefix`` is the start of a run id (the short id the admin's list shows), in hex.
    ``since`` is inclusive, ``until`` exclusive.
    """

    agent: str | None = None
    mcp_id: str | None = None
    tool: str | None = None
    source: str | None = None
    action: str | None = None
    ok: bool | None = None
    reason: str | None = None
    actor: str | None = None
    run: uuid.UUID | None = None
    run_prefix: str | None = None
    since: dt.datetime | None = None
    until: dt.datetime | None = None


def _code_filter(queryset: QuerySet[AuditEvent], field: str, value: str) -> QuerySet[AuditEvent]:
    """``value`` exact, a prefix when it ends with ``*``, and either of them left out when it starts with ``!``; in
    either Unicode normalization form (``args:allowed:지역`` pasted decomposed finds the code recorded composed)."""
    negated = value.startswith("!")
    code = value[1:] if negated else value
    if code.endswith("*"):
        condition = Q()
        for prefix in _spellings(code[:-1]):
            condition |= Q(**{f"{field}__startswith": prefix})
    else:
        condition = Q(**{f"{field}__in": _spellings(code)})
    return queryset.exclude(condition) if negated else queryset.filter(condition)


RUN_PREFIX_MIN = 4
"""The fewest hex digits a run id's start may have to be used as a filter."""


def run_reference_parse(value: str) -> tuple[uuid.UUID | None, str | None]:
    """A run as an auditor types it: a whole id (``(uuid, None)``) or its start, e.g. the 8 characters the
    admin's list shows (``(None, prefix)``, lower-case hex without dashes). Raises ``ValueError`` otherwise."""
    text = value.strip().lower()
    try:
        return uuid.UUID(text), None
    except ValueError:
        pass
    digits = text.replace("-", "")
    if RUN_PREFIX_MIN <= len(digits) < 32 and all(c in "0123456789abcdef" for c in digits):
        return None, digits
    raise ValueError(f"not a run id or the start of one: {value!r}")


EARLIEST = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
LATEST = dt.datetime(9000, 1, 1, tzinfo=dt.UTC)
"""The range a typed moment is kept in: ``since=0001-01-01`` means "from the start" and ``until=9999-12-31``
"to the end" (both as typed would overflow on the way to UTC or in date arithmetic: a 500, not an answer). The
start is 1970, not earlier: a moment before 1908 in Asia/Seoul carries its local mean time's offset (+08:27:52),
which the API echoed and JavaScript's ``Date`` cannot read."""


def moment_parse(value: str, *, end_of_day: bool = False) -> dt.datetime:
    """An ISO 8601 date or date-time as an aware date-time (naive ones are in the current time zone), within
    ``EARLIEST``–``LATEST`` (a moment outside is the nearer end).

    A bare date is its midnight, or with ``end_of_day`` the next midnight (so ``until=2026-03-01`` includes
    that day). Raises ``ValueError`` for anything else."""
    text = value.strip()
    moment: dt.datetime | None = None
    if len(text) <= 10:
        day = parse_date(text)
        if day is not None:
            if end_of_day and day == dt.date.max:
                return LATEST
            moment = dt.datetime.combine(day + dt.timedelta(days=1 if end_of_day else 0), dt.time())
    if moment is None:
        moment = parse_datetime(text.replace(" ", "+", 1) if text.count(" ") == 1 and "T" in text else text)
    if moment is None:
        raise ValueError(f"not an ISO 8601 date or date-time: {value!r}")
    if moment.year < EARLIEST.year - 1:  # (1969 is compared below: late in it with an offset is 1970 in UTC)
        return EARLIEST
    if moment.year >= LATEST.year:
        return LATEST
    if timezone.is_naive(moment):
        moment = timezone.make_aware(moment)
    return max(moment, EARLIEST)


def with_agent_slug(queryset: QuerySet[AuditEvent]) -> QuerySet[AuditEvent]:
    """``queryset`` with ``agent_slug``: the agent of the event's run (a run is referred to by id; a run removed
    under retention leaves ``None``)."""
    return queryset.annotate(agent_slug=Subquery(Run.objects.filter(pk=OuterRef("run_id")).values("agent__slug")[:1]))


def _spellings(text: str) -> list[str]:
    """``text`` as given and in both Unicode normalization forms: a name an auditor pastes decomposed finds the
    events recorded composed, and the reverse."""
    return list(dict.fromkeys([text, unicodedata.normalize("NFC", text), unicodedata.normalize("NFD", text)]))


def audit_event_filter(queryset: QuerySet[AuditEvent], filters: AuditEventFilters) -> QuerySet[AuditEvent]:
    """``queryset`` narrowed by ``filters`` (the admin's list and the API share this)."""
    if filters.agent:
        queryset = queryset.filter(run_id__in=Run.objects.filter(agent__slug=filters.agent).values("id"))
    if filters.mcp_id:
        queryset = queryset.filter(mcp_id=filters.mcp_id)
    # A Korean name pasted decomposed (macOS) and one stored composed are one name: both spellings are looked for.
    if filters.tool:
        queryset = queryset.filter(tool__in=_spellings(filters.tool))
    if filters.source:
        queryset = queryset.filter(source=filters.source)
    if filters.action:
        queryset = _code_filter(queryset, "action", filters.action)
    if filters.ok is not None:
        queryset = queryset.filter(ok=filters.ok)
    if filters.reason:
        queryset = _code_filter(queryset, "reason", filters.reason)
    if filters.actor:
        actors = _spellings(filters.actor)
        queryset = queryset.filter(
            Q(actor__in=actors)
            | Q(
                run_id__in=Run.objects.filter(Q(api_key__name__in=actors) | Q(api_key__prefix=filters.actor)).values(
                    "id"
                )
            )
        )
    if filters.run:
        queryset = queryset.filter(run_id=filters.run)
    if filters.run_prefix:
        # Ids starting with the prefix are one range of ids: an index range scan, on every database.
        low, high = uuid.UUID(filters.run_prefix.ljust(32, "0")), uuid.UUID(filters.run_prefix.ljust(32, "f"))
        queryset = queryset.filter(run_id__gte=low, run_id__lte=high)
    if filters.since:
        queryset = queryset.filter(created_at__gte=filters.since)
    if filters.until:
        queryset = queryset.filter(created_at__lt=filters.until)
    return queryset


def audit_event_list(*, filters: AuditEventFilters, after_id: int | None = None) -> QuerySet[AuditEvent]:
    """Events matching ``filters`` in id order (the order they were written), after ``after_id`` if given:
    a keyset page is ``audit_event_list(...)[:limit]``, and the next one starts after its last id. Events
    committed but not chained yet (deferred chaining) are chained first, so a reader finds them."""
    audit_chain_catch_up()
    queryset = audit_event_filter(AuditEvent.objects.all(), filters)
    if after_id is not None:
        queryset = queryset.filter(id__gt=after_id)
    return with_agent_slug(queryset).order_by("id")


def audit_event_page(
    *, filters: AuditEventFilters, after_id: int | None, limit: int
) -> tuple[list[dict[str, Any]], int | None]:
    """One keyset page as plain rows (``EXPORT_COLUMNS``) and the cursor of the next page (None at the end)."""
    rows = list(_values(audit_event_list(filters=filters, after_id=after_id))[: limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    events = [dict(zip(EXPORT_COLUMNS, row, strict=True)) for row in rows]
    return events, (events[-1]["id"] if more and events else None)


def audit_event_export_rows(*, filters: AuditEventFilters) -> Iterator[tuple[Any, ...]]:
    """Every matching event as a tuple of ``EXPORT_COLUMNS``, in id order, streamed: the rows are read in
    chunks of ``EXPORT_CHUNK_SIZE`` from one cursor (server-side on PostgreSQL) and never held all at once."""
    return _values(audit_event_list(filters=filters)).iterator(chunk_size=EXPORT_CHUNK_SIZE)


def _values(queryset: QuerySet[AuditEvent]) -> QuerySet[Any]:
    return with_agent_slug(queryset).values_list(*_EXPORT_VALUES)
