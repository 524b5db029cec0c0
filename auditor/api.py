"""The auditors' API: the audit record (filtered, paged, exported) and tool metrics. One class per operation.

Only people read it: Django users in the ``auditor`` group, or superusers, by session (the admin's login) or
HTTP basic auth. An API caller's key is recognised, so that it gets a 403 rather than a login prompt.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any
from urllib.parse import quote

from asgiref.sync import sync_to_async
from django.contrib.auth.base_user import AbstractBaseUser
from django.core.handlers.asgi import ASGIRequest
from django.http import StreamingHttpResponse
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from rest_framework import authentication, permissions, serializers
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from agent_platform.client_ip import client_ip
from agents.api.auth import ApiKeyAuthentication
from agents.api.errors import LoginLocked
from agents.api.serializers import AsciiIntegerField
from agents.api.views import query_params_once_check
from audit.changes import configured_secrets
from audit.logins import login_lockout_get
from audit.models import AuditEvent
from auditor.event_details import MASKED_AFTER_RECORDING, masked_when_shown
from auditor.metrics import ArchivedPart, archived_part, tool_metrics
from auditor.selectors import (
    EXPORT_COLUMNS,
    AuditEventFilters,
    audit_event_export_rows,
    audit_event_page,
    moment_parse,
    run_reference_parse,
)

EXPORT_BLOCK_ROWS = 500
"""Rows per block written to the client (one hop to the database thread per block under ASGI)."""

# The ASCII starts, their full-width forms (a spreadsheet in a CJK locale reads ＝ as =) and the spaces a
# spreadsheet skips before reading one.
_CSV_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "＝", "＋", "－", "＠")
_CSV_SKIPPED_SPACES = " \u00a0\u3000"

CSV_CELL_MAX_UNITS = 32_000
"""The longest JSON cell (``args``, ``result``) a CSV export writes, in UTF-16 code units as Excel counts them: a
spreadsheet holds at most 32,767 in a cell and cuts or splits a longer one silently. A longer cell is cut to fit,
with a marker saying so; the JSON Lines export always holds the whole event."""


class IsAuditor(permissions.BasePermission):
    """A Django user who may view the audit record (``audit.view_auditevent``: the ``auditor`` group's, or a
    superuser's), as the admin's audit list decides: a group named so but stripped of the permission reads
    nothing, and a permission granted another way reads here too. An API key is never an auditor."""

    message = gettext_lazy("Only auditors may read the audit record.")

    def has_permission(self, request: Request, view: Any) -> bool:
        user = request.user
        if not isinstance(user, AbstractBaseUser) or not user.is_active:
            return False
        return bool(user.has_perm("audit.view_auditevent"))  # type: ignore[attr-defined]


class ReadsOnly(permissions.BasePermission):
    """The audit record is read, never written, through this API: a write (POST, PUT, PATCH, DELETE) is a 403
    for everyone, auditors included, rather than a 405 that reads as "try another method"."""

    message = gettext_lazy("The audit record is read-only.")

    def has_permission(self, request: Request, view: Any) -> bool:
        return request.method in permissions.SAFE_METHODS


class _FormatIsOurs(BaseContentNegotiation):
    """``?format=`` chooses an export here, not a DRF renderer; whatever DRF renders (a page, an error) is JSON."""

    def select_parser(self, request: Request, parsers: list[Any]) -> Any:
        return parsers[0] if parsers else None

    def select_renderer(self, request: Request, renderers: list[Any], format_suffix: str | None = None) -> Any:
        return renderers[0], renderers[0].media_type


class MomentField(serializers.CharField):
    """An ISO 8601 date or date-time; a bare date as ``until`` includes that whole day."""

    def __init__(self, *, end_of_day: bool = False, **kwargs: Any) -> None:
        self.end_of_day = end_of_day
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> dt.datetime:  # type: ignore[override]
        text = super().to_internal_value(data)
        try:
            return moment_parse(text, end_of_day=self.end_of_day)
        except ValueError:
            raise serializers.ValidationError(
                _("Enter an ISO 8601 date or date-time, e.g. 2026-03-01 or 2026-03-01T09:00:00+09:00.")
            ) from None


class OutcomeField(serializers.BooleanField):
    """``ok``: true or false (1 or 0), as the admin's list takes it; any other word (DRF's yes, on, t) is refused
    there, so it is here too, rather than an export that holds other events than the list it was linked from."""

    def to_internal_value(self, data: Any) -> bool:
        text = str(data).lower()
        if text in {"true", "1"}:
            return True
        if text in {"false", "0"}:
            return False
        raise serializers.ValidationError(_("Use true or false (or 1 or 0)."))


class FiltersSerializer(serializers.Serializer):
    """The filters both operations read from the query string (``AuditEventFilters``)."""

    agent = serializers.CharField(required=False, max_length=64)
    mcp_id = serializers.CharField(required=False, max_length=64)
    tool = serializers.CharField(required=False, max_length=200)
    source = serializers.ChoiceField(required=False, choices=AuditEvent.Source.choices)
    action = serializers.CharField(required=False, max_length=100)
    ok = OutcomeField(required=False, allow_null=True, default=None)
    reason = serializers.CharField(required=False, max_length=200)
    actor = serializers.CharField(required=False, max_length=200)
    run = serializers.CharField(
        required=False, max_length=64, help_text=gettext_lazy("A run id, or its start (the short id the admin shows).")
    )
    since = MomentField(required=False)
    until = MomentField(required=False, end_of_day=True)

    def validate_run(self, value: str) -> tuple[uuid.UUID | None, str | None]:
        try:
            return run_reference_parse(value)
        except ValueError:
            raise serializers.ValidationError(_("Enter a run id, or at least its first 4 characters.")) from None

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        since, until = attrs.get("since"), attrs.get("until")
        if since and until and since >= until:
            raise serializers.ValidationError({"until": [_("'until' must be later than 'since'.")]})
        return attrs

    def filters(self) -> AuditEventFilters:
        data = dict(self.validated_data)
        data["run"], data["run_prefix"] = data.get("run") or (None, None)
        return AuditEventFilters(**{name: data.get(name) for name in AuditEventFilters.__dataclass_fields__})


def _validated(serializer_class: type[FiltersSerializer], request: Request) -> FiltersSerializer:
    """The query string, validated: empty values are absent, an unknown parameter is an error (a misspelt
    filter must not silently return everything), and so is one given more than once, as the REST API refuses it
    (``?ok=false&ok=true`` read only its last value)."""
    params = {k: v for k, v in request.query_params.dict().items() if v != ""}
    serializer = serializer_class(data=params)
    unknown = sorted(set(params) - set(serializer.fields))
    if not unknown:
        query_params_once_check(request.query_params)
    serializer.is_valid(raise_exception=False)
    errors = dict(serializer.errors)
    for name in unknown:
        errors[name] = [_("Unknown parameter.")]
    if errors:
        raise serializers.ValidationError(errors)
    return serializer


class LockoutBasicAuthentication(authentication.BasicAuthentication):
    """HTTP Basic, throttled like the admin's login (``audit/logins.py``): a locked username or address gets a
    ``429 login_locked`` with ``Retry-After``, before its password is checked."""

    def authenticate_credentials(self, userid: str, password: str, request: Any = None) -> Any:
        ip = client_ip(request.META) if request is not None else "unknown"
        self._refuse_if_locked(userid, ip)
        try:
            return super().authenticate_credentials(userid, password, request)
        except AuthenticationFailed:
            self._refuse_if_locked(userid, ip)  # this failure may have started a lockout: say so
            raise

    @staticmethod
    def _refuse_if_locked(userid: str, ip: str) -> None:
        lockout = login_lockout_get(username=userid, ip=ip)
        if lockout is not None:
            raise LoginLocked(lockout.message(), wait=lockout.retry_after_s)


class _AuditorApi(APIView):
    # Not in the callers' OpenAPI schema (/api/v1/schema/): that describes the bearer-key API; this one is for
    # people, with other credentials, and is described in the README.
    schema = None
    authentication_classes = [
        LockoutBasicAuthentication,
        ApiKeyAuthentication,
        authentication.SessionAuthentication,
    ]
    permission_classes = [IsAuditor, ReadsOnly]
    content_negotiation_class = _FormatIsOurs


class AuditEventListApi(_AuditorApi):
    """``GET /api/v1/audit/events``: the events matching the filters, oldest first, in keyset pages
    (``?cursor=`` is the previous page's ``next_cursor``), or the whole selection streamed as
    ``?format=csv`` (UTF-8 with a BOM, so Excel shows Korean) or ``?format=jsonl``."""

    class InputSerializer(FiltersSerializer):
        cursor = AsciiIntegerField(required=False, min_value=0)
        limit = AsciiIntegerField(required=False, min_value=1, max_value=1000, default=100)
        format = serializers.ChoiceField(required=False, choices=["json", "csv", "jsonl"], default="json")

    def get(self, request: Request) -> Response | StreamingHttpResponse:
        serializer = _validated(self.InputSerializer, request)
        data = serializer.validated_data
        filters = serializer.filters()
        if data["format"] in {"csv", "jsonl"}:
            paging: dict[str, list[str]] = {}  # ``limit`` has a default: only one the caller gave is refused
            if "cursor" in data:
                paging["cursor"] = [_("An export has no pages: leave 'cursor' out.")]
            if "limit" in serializer.initial_data:
                paging["limit"] = [_("An export holds every matching event: leave 'limit' out.")]
            if paging:
                raise serializers.ValidationError(paging)
            return _export_response(request, filters, data["format"])
        events, next_cursor = audit_event_page(filters=filters, after_id=data.get("cursor"), limit=data["limit"])
        secrets = configured_secrets()
        for event in events:
            if masked_when_shown(event, secrets):
                event[MASKED_AFTER_RECORDING] = True
        next_url = None
        if next_cursor is not None:
            query = request.query_params.copy()
            query["cursor"] = str(next_cursor)
            next_url = request.build_absolute_uri(f"{request.path}?{query.urlencode()}")
        archived = _archived_in(filters)
        return Response(
            {
                "results": events,
                "next_cursor": str(next_cursor) if next_cursor is not None else None,
                "next": next_url,
                # The events of the period that ``archive_audit`` moved out are in no page: where they are.
                "archived": (
                    {"seq": archived.seq, "file": archived.file_name, "before": archived.before.isoformat()}
                    if archived is not None
                    else None
                ),
            }
        )


class AuditMetricsApi(_AuditorApi):
    """``GET /api/v1/audit/metrics``: tool metrics over ``since``..``until`` (default: the last 7 days),
    optionally for one agent, server, tool, source or caller."""

    class InputSerializer(FiltersSerializer):
        def get_fields(self) -> dict[str, serializers.Field]:
            fields = super().get_fields()
            for name in ("ok", "reason", "run", "action"):  # metrics are of tool calls: none of these applies
                fields.pop(name)
            return fields

        def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
            """The period's end is ``until`` or now, and both ends are written in the current time zone: a
            ``since`` now or later ends before it starts (refused, as the admin's metrics page refuses it), and
            a report's ``since`` and ``until`` read in one zone whichever offsets were typed."""
            attrs = super().validate(attrs)
            until_given = attrs.get("until") is not None
            attrs["until"] = timezone.localtime(attrs.get("until") or timezone.now())
            if attrs.get("since"):
                attrs["since"] = timezone.localtime(attrs["since"])
                if attrs["since"] >= attrs["until"] and until_given:
                    raise serializers.ValidationError({"until": [_("'until' must be later than 'since'.")]})
                if attrs["since"] >= attrs["until"]:  # the period ends now: the parameter given is the one to mend
                    raise serializers.ValidationError({"since": [_("'since' must be in the past.")]})
            return attrs

    def get(self, request: Request) -> Response:
        serializer = _validated(self.InputSerializer, request)
        data = serializer.validated_data
        filters = AuditEventFilters(**{name: data.get(name) for name in ("agent", "mcp_id", "tool", "source", "actor")})
        report = tool_metrics(since=data.get("since"), until=data["until"], filters=filters)
        return Response(report.as_dict())


# --- exports ---------------------------------------------------------------------------------------------


def _export_response(request: Request, filters: AuditEventFilters, kind: str) -> StreamingHttpResponse:
    rows = audit_event_export_rows(filters=filters)
    # Translated now, in the request's language: the blocks are written after the view has returned.
    cut_marker = _("…[cut: %(cut)d of %(total)d characters; the whole event is in ?format=jsonl]")
    secrets = configured_secrets()  # read now, on the request's thread: masks every event served (_served)
    blocks = (
        _csv_blocks(rows, cut_marker=cut_marker, secrets=secrets)
        if kind == "csv"
        else _jsonl_blocks(rows, secrets=secrets)
    )
    content_type = "text/csv; charset=utf-8" if kind == "csv" else "application/x-ndjson; charset=utf-8"
    stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
    response = StreamingHttpResponse(_streamed(request, blocks), content_type=content_type)
    response["Content-Disposition"] = f'attachment; filename="audit-events-{stamp}.{kind}"'
    response["Cache-Control"] = "no-store"
    archived = _archived_in(filters)
    if archived is not None:  # the period's archived events are in no export: where they are
        response["X-Audit-Archived"] = f"seq<={archived.seq}; file={quote(archived.file_name)}"
    return response


def _archived_in(filters: AuditEventFilters) -> ArchivedPart | None:
    """The archived part of the record (``archive_audit``) where the period asked for (from ``since``; none: from
    the start) reaches into it, else None: its events are in the archive files, not served here."""
    archived = archived_part()
    if archived is None or (filters.since is not None and filters.since >= archived.before):
        return None
    return archived


def _streamed(request: Request, blocks: Iterator[bytes]) -> Iterator[bytes] | AsyncIterator[bytes]:
    """Under WSGI, the blocks as they are. Under ASGI, an async iterator that pulls each block on the request's
    database thread: Django would otherwise read a sync iterator to its end into memory before sending."""
    if not isinstance(request._request, ASGIRequest):
        return blocks
    pull = sync_to_async(next, thread_sensitive=True)
    close = sync_to_async(blocks.close, thread_sensitive=True)  # type: ignore[attr-defined]
    done = object()

    async def stream() -> AsyncIterator[bytes]:
        try:
            while (block := await pull(blocks, done)) is not done:
                yield block  # type: ignore[misc]
        finally:
            await close()

    return stream()


def _served(row: tuple[Any, ...], secrets: list[str]) -> tuple[dict[str, Any], bool]:
    """An exported row by column, masked as it is served (``masked_when_shown``: with the secrets bound now, which
    an event recorded before one was bound was not masked with), and whether that changed it."""
    event = dict(zip(EXPORT_COLUMNS, row, strict=True))
    return event, masked_when_shown(event, secrets)


def _plain(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    return value


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _csv_text(value: Any) -> str:
    """A cell as text. Text that a spreadsheet would run as a formula (a tool name a model made up, say) gets a
    leading apostrophe, so opening an export never executes anything."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    text = str(_plain(value))
    return f"'{text}" if text.lstrip(_CSV_SKIPPED_SPACES).startswith(_CSV_FORMULA_STARTS) else text


def _utf16_units(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def _csv_json(value: Any, *, cut_marker: str) -> str:
    """``value`` as JSON for a CSV cell; over ``CSV_CELL_MAX_UNITS`` its start and ``cut_marker`` (a
    ``%(cut)d``/``%(total)d`` template, in characters), at most that long together. A cut cell is no longer valid
    JSON (its hash cannot be checked from it): the marker says so and where the whole event is."""
    text = _json(value)
    if _utf16_units(text) <= CSV_CELL_MAX_UNITS:
        return text
    longest_marker = cut_marker % {"cut": len(text), "total": len(text)}  # no count cut has more digits
    room = CSV_CELL_MAX_UNITS - _utf16_units(longest_marker)
    # Cut in UTF-16 units, as a spreadsheet counts (a character outside the BMP is two), never inside one of them.
    kept = text[:room].encode("utf-16-le", "surrogatepass")[: room * 2].decode("utf-16-le", "ignore")
    return kept + cut_marker % {"cut": len(text) - len(kept), "total": len(text)}


def _csv_blocks(rows: Iterable[tuple[Any, ...]], *, cut_marker: str, secrets: list[str]) -> Iterator[bytes]:
    """The CSV export, a block of rows at a time: a BOM and the header first (before any row is read), then
    every row, masked as served (``_served``); ``args`` and ``result`` are JSON in their cells, cut to
    ``CSV_CELL_MAX_UNITS`` (``_csv_json``)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    buffer.write("\ufeff")
    writer.writerow(EXPORT_COLUMNS)
    yield buffer.getvalue().encode("utf-8")
    buffer.seek(0)
    buffer.truncate()
    json_columns = {EXPORT_COLUMNS.index("args"), EXPORT_COLUMNS.index("result")}
    for count, row in enumerate(rows, start=1):
        event, _masked = _served(row, secrets)
        writer.writerow(
            [
                _csv_json(cell, cut_marker=cut_marker) if i in json_columns else _csv_text(cell)
                for i, cell in enumerate(event.values())
            ]
        )
        if count % EXPORT_BLOCK_ROWS == 0:
            yield buffer.getvalue().encode("utf-8")
            buffer.seek(0)
            buffer.truncate()
    if buffer.tell():
        yield buffer.getvalue().encode("utf-8")


def _jsonl_blocks(rows: Iterable[tuple[Any, ...]], *, secrets: list[str]) -> Iterator[bytes]:
    """The JSON Lines export: one event per line (``EXPORT_COLUMNS`` as keys), Korean text as itself, masked as
    served (``_served``). A line that masking changed no longer hashes to its ``hash`` (that is of the event as
    recorded): it says so, ``"masked_after_recording": true``, for whoever recomputes the chain from the export."""
    lines: list[str] = []
    for row in rows:
        event, masked = _served(row, secrets)
        line = {name: _plain(cell) for name, cell in event.items()}
        if masked:
            line[MASKED_AFTER_RECORDING] = True
        lines.append(_json(line))
        if len(lines) == EXPORT_BLOCK_ROWS:
            yield ("\n".join(lines) + "\n").encode("utf-8")
            lines = []
    if lines:
        yield ("\n".join(lines) + "\n").encode("utf-8")
