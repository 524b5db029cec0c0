"""The admin's landing page (``/admin/``): what needs a person now, above Django's list of models.

Servers with their health and circuit, pending approvals oldest first (one click to decide; one past its expiry,
not yet swept, shown expired), the last 24 hours' runs by status, and the tools failing most. Each panel is shown
to whoever may view what it lists: an auditor sees runs, approvals (read-only) and tool metrics, never the
bindings.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any
from urllib.parse import urlencode

from django.apps import apps
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.db.models import Count, Model, Sum
from django.http import HttpRequest, HttpResponse
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.utils.translation import gettext

from agents.budgets import MICROS_PER_USD, period_bounds, usage_by_day, usd_text
from agents.models import Approval, Budget, ModelPrice, Run
from audit.change_guard import actor_label
from audit.changes import CONFIG_ACTION_PREFIX, recorded_name
from audit.labels import action_label, actor_in_words
from audit.models import AuditEvent
from audit.visible import visible_text
from auditor.charts import bar_chart
from auditor.metrics import ToolMetrics, tool_metrics
from mcpregistry.models import McpServer

RECENT = dt.timedelta(hours=24)
PENDING_SHOWN = 10
QUERY_SHOWN_CHARS = 120
FAILED_RUNS_SHOWN = 5
TOOLS_SHOWN = 5
USAGE_DAYS = 30
USAGE_ROWS = 5
MY_CHANGES_SHOWN = 10


def _url(name: str, *args: Any) -> str | None:
    try:
        return reverse(name, args=args)
    except NoReverseMatch:
        return None


def _changelist_url(request: HttpRequest, model: type[Model]) -> str | None:
    """The model's admin list, for a reader its page lets in (``_may_view``), else None."""
    if not _may_view(request, model):
        return None
    return _url(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")


def _may_view(request: HttpRequest, model: type[Model]) -> bool:
    """Whether the model's admin pages let this reader in (may view or change): the dashboard links to no page
    that answers its reader with a 403."""
    return bool(admin.site.get_model_admin(model).has_view_permission(request))


def _compact(value: Any, limit: int = 160) -> str:
    return _shortened(json.dumps(value, ensure_ascii=False, separators=(", ", ": ")), limit)


def dashboard_servers(request: HttpRequest) -> list[dict[str, Any]] | None:
    if not request.user.has_perm("mcpregistry.view_mcpserver"):
        return None
    rows = []
    for server in McpServer.objects.order_by("mcp_id"):
        failing = server.health == McpServer.Health.ERROR or server.breaker_state != McpServer.BreakerState.CLOSED
        rows.append(
            {
                "server": server,
                "failing": failing,
                "url": _url("admin:mcpregistry_mcpserver_change", server.pk),
                "error_events_url": (
                    f"{_url('admin:audit_auditevent_changelist')}?{urlencode({'mcp_id': server.mcp_id, 'ok': 'false'})}"
                    if request.user.has_perm("audit.view_auditevent")
                    else None
                ),
            }
        )
    return rows


def dashboard_approvals(request: HttpRequest) -> dict[str, Any] | None:
    """The approvals waiting for a decision, oldest first, then those past their expiry that the periodic expiry
    has not reached yet: shown expired, as their own page shows them, with no decision offered (one would be
    refused as expired) and not counted as waiting."""
    if not request.user.has_perm("agents.view_approval"):
        return None
    now = timezone.now()
    pending = Approval.objects.filter(status=Approval.Status.PENDING).select_related("run__agent")
    waiting = pending.filter(expires_at__gt=now)
    shown = list(waiting.order_by("created_at")[:PENDING_SHOWN])
    shown += pending.filter(expires_at__lte=now).order_by("created_at")[: PENDING_SHOWN - len(shown)]
    may_decide = request.user.has_perm("agents.change_approval")
    # The run's page only for whoever it lets in, as the approval pages link it: one who may decide approvals but
    # not view runs is linked to no page that answers a 403.
    may_view_run = _may_view(request, Run)
    return {
        "count": waiting.count(),
        "rows": [
            _approval_row(approval, now=now, may_decide=may_decide, may_view_run=may_view_run) for approval in shown
        ],
        "list_url": f"{_url('admin:agents_approval_changelist')}?status__exact=pending",
    }


def _shortened(text: str, limit: int = QUERY_SHOWN_CHARS) -> str:
    """``text`` with what does not show itself written out (``audit.visible``), cut to ``limit`` characters with
    an ellipsis; a written-out character (``⟦U+E0049⟧``) is never cut in two."""
    shown = visible_text(text)
    if len(shown) <= limit:
        return shown
    cut = shown[: limit - 1]
    opened = cut.rfind("⟦")
    if opened > cut.rfind("⟧"):
        cut = cut[:opened]
    return cut + "…"


def _approval_row(approval: Approval, *, now: dt.datetime, may_decide: bool, may_view_run: bool) -> dict[str, Any]:
    expired = approval.expires_at <= now
    decides = may_decide and not expired
    return {
        "approval": approval,
        "expired": expired,
        "expired_label": Approval.Status.EXPIRED.label,
        # The question that led to the call (masked, as stored), shortened: the approval's page has it whole.
        "query": _shortened(approval.run.query),
        "args": _compact(approval.args),
        # Who asked, in words (``system:live`` → "live run (no API key)"); the record keeps its code.
        "requested_by": actor_in_words(approval.requested_by),
        "url": _url("admin:agents_approval_change", approval.pk),
        "run_url": _url("admin:agents_run_change", approval.run_id) if may_view_run else None,
        "approve_url": _url("admin:agents_approval_decide", approval.pk, "approve") if decides else None,
        "reject_url": _url("admin:agents_approval_decide", approval.pk, "reject") if decides else None,
    }


def dashboard_runs(request: HttpRequest, *, since: dt.datetime) -> dict[str, Any] | None:
    if not request.user.has_perm("agents.view_run"):
        return None
    recent = Run.objects.filter(created_at__gte=since, purpose=Run.Purpose.LIVE)
    counts = dict(recent.values_list("status").annotate(n=Count("id")).values_list("status", "n"))
    changelist = _url("admin:agents_run_changelist")
    by_status = [
        {
            "status": status,
            "label": label,
            "count": counts.get(status, 0),
            # The list shows what the count counts: live runs (evaluations and shadows are counted apart).
            "url": f"{changelist}?"
            + urlencode(
                {"status__exact": status, "purpose__exact": Run.Purpose.LIVE, "created_at__gte": since.isoformat()}
            ),
        }
        for status, label in Run.Status.choices
    ]
    failed = [
        {"run": run, "url": _url("admin:agents_run_change", run.pk)}
        for run in recent.filter(status=Run.Status.FAILED)
        .select_related("agent")
        .order_by("-created_at")[:FAILED_RUNS_SHOWN]
    ]
    return {"total": sum(counts.values()), "by_status": by_status, "failed": failed}


UNKNOWN_TOOL_REASON = "tool:unknown"
"""The reason of a call to a name its server does not have (a name a model made up)."""


def dashboard_tools(request: HttpRequest, *, since: dt.datetime) -> list[dict[str, Any]] | None:
    if not request.user.has_perm("audit.view_auditevent"):
        return None
    report = tool_metrics(since=since)
    tools, unknown = _unknown_tools_folded(report.tools)
    # Only tools that failed: a tool at 0 % is not "failing most", however often it was called.
    worst = sorted(
        (t for t in [*tools, *([unknown] if unknown else [])] if t.calls and t.error_rate > 0),
        key=lambda t: (-t.error_rate, -t.calls, t.mcp_id, t.tool),
    )
    events = _url("admin:audit_auditevent_changelist")
    rows = []
    for t in worst[:TOOLS_SHOWN]:
        # The folded row lists what the audit list's "unknown tool (any name)" lists: the reason's events.
        folded = t is unknown
        query = {"reason": UNKNOWN_TOOL_REASON} if folded else {"mcp_id": t.mcp_id, "tool": t.tool, "ok": "false"}
        rows.append(
            {
                "tool": t,
                "label": t.tool if folded else f"{t.mcp_id}.{t.tool}",
                "error_pct": round(t.error_rate * 100, 1),
                "events_url": f"{events}?{urlencode(query)}",
            }
        )
    return rows


def _unknown_tools_folded(tools: list[ToolMetrics]) -> tuple[list[ToolMetrics], ToolMetrics | None]:
    """``tools`` less the calls to a name no server has (refused ``tool:unknown``, or naming no server: the model's
    made-up names), and those calls as one row, "unknown tool (any name)" (None: there were none), as ``/metrics``
    counts them under one label and the audit list's tool filter lists them once: a model that makes up names
    takes one row of the panel, not every row."""
    kept: list[ToolMetrics] = []
    calls = errors = 0
    for tool in tools:
        refused = tool.calls if not tool.mcp_id else tool.errors_by_reason.get(UNKNOWN_TOOL_REASON, 0)
        failed = tool.errors if not tool.mcp_id else refused  # a refusal is a failed call
        calls, errors = calls + refused, errors + failed
        if refused < tool.calls:
            left_calls, left_errors = tool.calls - refused, tool.errors - failed
            kept.append(replace(tool, calls=left_calls, errors=left_errors, error_rate=left_errors / left_calls))
    if not calls:
        return kept, None
    unknown = ToolMetrics(
        mcp_id="", tool=gettext("unknown tool (any name)"), calls=calls, errors=errors, error_rate=errors / calls,
        errors_by_reason={}, retries=0, latency_p50_ms=None, latency_p95_ms=None, latency_mean_ms=None, runs=0,
        calls_per_run=None,
    )  # fmt: skip
    return kept, unknown


def dashboard_usage(request: HttpRequest) -> dict[str, Any] | None:
    """Tokens and cost per day over the last 30 days (charts), and this month's agents and keys by cost. Its days
    and month are UTC ones, as ``GET /api/v1/usage``'s and the budgets' (``usage_by_day``, ``period_bounds``), and
    labelled so: the admin shows other times in the server's time zone."""
    if not request.user.has_perm("agents.view_run"):
        return None
    now = timezone.now()
    runs = Run.objects.all()
    days = usage_by_day(runs, days=USAGE_DAYS, now=now)
    labels = [d["day"] for d in days]
    month_start, _end = period_bounds(Budget.Period.MONTH, now)
    month = runs.filter(created_at__gte=month_start)

    def top(field: str, *shown: str, name: Callable[[dict[str, Any]], str]) -> list[dict[str, Any]]:
        """The month's ``USAGE_ROWS`` dearest, grouped by ``field`` (an id: two keys of one name are two rows),
        each named by ``name`` from the ``shown`` fields."""
        rows = (
            month.exclude(**{f"{field}__isnull": True})
            .values(field, *shown)
            .annotate(tokens=Sum("tokens"), cost=Sum("cost_micros"), n=Count("id"))
            .order_by("-cost", "-tokens", field)[:USAGE_ROWS]
        )
        return [
            {"name": name(r), "runs": r["n"], "tokens": r["tokens"] or 0, "cost_usd": usd_text(r["cost"])} for r in rows
        ]

    cost_micros = month.aggregate(c=Sum("cost_micros"))["c"] or 0
    return {
        "tokens_chart": bar_chart(
            [d["tokens"] for d in days], labels, colour="#417690", title=gettext("tokens per day (UTC)")
        ),
        "cost_chart": bar_chart(
            [round(d["cost_usd"] * MICROS_PER_USD) for d in days],
            labels,
            colour="#ba6c0b",
            title=gettext("cost per day (USD, UTC)"),
            show=lambda micros: f"${usd_text(micros)}",
        ),
        "tokens_month": month.aggregate(t=Sum("tokens"))["t"] or 0,
        "cost_month": usd_text(cost_micros),
        "priced": bool(cost_micros),
        "agents": top("agent", "agent__slug", name=lambda r: r["agent__slug"]),
        # A key by its name and prefix, as the admin's list of keys shows it (``ApiKey.__str__``): names repeat.
        "keys": top("api_key", "api_key__name", "api_key__prefix", name=_api_key_label),
        "budgets_url": _changelist_url(request, Budget),
        "prices_url": _changelist_url(request, ModelPrice),
    }


def _api_key_label(row: dict[str, Any]) -> str:
    return f"{row['api_key__name']} ({row['api_key__prefix']}…)"


def _names_in_readers_language(events: list[AuditEvent]) -> dict[int, str]:
    """Each change event's row as its reader calls it: the record names a row in no language (``recorded_name``:
    "key … / day" for a budget a Korean page changed); where the row is still there and still so named, its
    ``str`` now, in the page's language. A row deleted or renamed since keeps the name recorded."""
    recorded = {e.pk: e.result for e in events if isinstance(e.result, dict)}
    wanted: dict[str, set[Any]] = {}
    for result in recorded.values():
        if isinstance(result.get("model"), str) and result.get("id") is not None:
            wanted.setdefault(result["model"], set()).add(result["id"])
    live: dict[tuple[str, str], Model] = {}
    for label, ids in wanted.items():
        try:
            model = apps.get_model(label)
        except (LookupError, ValueError):
            continue
        try:
            rows = model._base_manager.in_bulk(list(ids))
        except (ValueError, TypeError, ValidationError):  # an id its key type does not take: none live
            continue
        live.update({(label, str(pk)): row for pk, row in rows.items()})
    names = {}
    for pk, result in recorded.items():
        name = str(result.get("name", ""))
        row = live.get((str(result.get("model")), str(result.get("id"))))
        names[pk] = str(row) if row is not None and recorded_name(row) == name else name
    return names


def dashboard_my_changes(request: HttpRequest) -> dict[str, Any]:
    """The reader's own latest changes of the configuration, from the audit record (Django's "recent actions"
    log is never written here: every change is an audit event), each linked to its event for whoever may read
    the record."""
    actor = actor_label(request.user)
    events = AuditEvent.objects.filter(source="admin", actor=actor, action__startswith=CONFIG_ACTION_PREFIX)
    can_read = request.user.has_perm("audit.view_auditevent")
    shown = list(events.order_by("-id")[:MY_CHANGES_SHOWN])
    names = _names_in_readers_language(shown)
    rows = [
        {
            "action": action_label(event.action),
            "name": names.get(event.pk, ""),
            "created_at": event.created_at,
            "url": _url("admin:audit_auditevent_change", event.pk) if can_read else None,
        }
        for event in shown
    ]
    list_url = _url("admin:audit_auditevent_changelist") if can_read else None
    return {
        "rows": rows,
        "list_url": f"{list_url}?{urlencode({'actor': actor, 'action': 'config.*'})}" if list_url and rows else None,
    }


def dashboard_context(request: HttpRequest) -> dict[str, Any]:
    since = timezone.now() - RECENT
    return {
        "dashboard": {
            "servers": dashboard_servers(request),
            "approvals": dashboard_approvals(request),
            "runs": dashboard_runs(request, since=since),
            "tools": dashboard_tools(request, since=since),
            "usage": dashboard_usage(request),
            "my_changes": dashboard_my_changes(request),
            # The tester runs rules (and may call their tools): it asks for the permission to change them.
            "rule_tester_url": _url("rule-tester")
            if request.user.has_perm("agents.change_deterministicrule")
            else None,
            "metrics_url": (
                _url("admin:audit_auditevent_metrics") if request.user.has_perm("audit.view_auditevent") else None
            ),
            "api_docs_url": _url("api-docs"),
        }
    }


def dashboard_index(request: HttpRequest) -> HttpResponse:
    """Django's admin index with the dashboard above the list of models (``admin/index.html``)."""
    return admin.site.index(request, extra_context=dashboard_context(request))
