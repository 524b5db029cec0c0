"""The audit record in the admin: read-only for everyone, filterable the way the audit API is (the filters use
the API's parameter names, so the list's export links carry them over), and tool metrics at
``/admin/audit/auditevent/metrics/``."""

from __future__ import annotations

import datetime as dt
import io
import json
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.views.main import SEARCH_VAR, ChangeList
from django.core.exceptions import PermissionDenied
from django.core.management import CommandError, call_command
from django.db.models import Count, Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.templatetags.static import static
from django.urls import NoReverseMatch, URLPattern, path, reverse
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext, pgettext_lazy
from django.utils.translation import gettext_lazy as _

from agents.admin_runs import DateDrillDownChangeList
from agents.models import Agent
from audit.admin_readonly import ReadOnlyAdminMixin, WritesRefusedMixin
from audit.archive import tool_call_reason_label
from audit.changes import configured_secrets
from audit.labels import action_label, actor_in_words, breakable, reason_label, when_cell
from audit.masking import MASK, mask_known, truncate
from audit.models import AuditCheckpoint, AuditEvent
from audit.services import audit_chain_catch_up
from audit.verification import CannotCheck
from audit.visible import visible_text
from auditor.charts import bar_chart
from auditor.event_details import change_html, event_masked_when_shown, rule_decision_html
from auditor.metrics import (
    MAX_BUCKETS,
    ToolSeries,
    archived_part,
    series_bucket,
    tool_metrics,
    tool_metrics_series,
)
from auditor.selectors import (
    AuditEventFilters,
    audit_event_filter,
    moment_parse,
    run_reference_parse,
    with_agent_slug,
)
from mcpregistry.list_fields import argument_rows

logger = logging.getLogger(__name__)

FILTER_PARAMETERS = ("agent", "mcp_id", "tool", "source", "action", "ok", "reason", "actor", "run", "since", "until")
"""The list's filter parameters: the same names, and meanings, as ``GET /api/v1/audit/events``."""


def _drilled_period(query: Any, *, since: str | None, until: str | None) -> dict[str, str]:
    """The date drill-down (``created_at__year/month/day``) as the API's ``since``/``until``, within a period
    already chosen (the tighter ends win); nothing where the drill-down is not a date."""
    try:
        year = int(query.get("created_at__year", ""))
        month = int(query.get("created_at__month") or 0)
        day = int(query.get("created_at__day") or 0)
        first = dt.date(year, month or 1, day or 1)
        if day:
            last = first
        elif month:
            last = (first.replace(day=28) + dt.timedelta(days=4)).replace(day=1) - dt.timedelta(days=1)
        else:
            last = dt.date(year, 12, 31)
        drilled_since, drilled_until = first.isoformat(), last.isoformat()
        if since and moment_parse(since) > moment_parse(drilled_since):
            drilled_since = since
        if until and moment_parse(until, end_of_day=True) < moment_parse(drilled_until, end_of_day=True):
            drilled_until = until
    except (ValueError, OverflowError):
        return {}
    return {"since": drilled_since, "until": drilled_until}


def _drilled_past_since(query: Any, drilled: Mapping[str, str]) -> bool:
    """Whether the date drilled into (``drilled``: :func:`_drilled_period`) ends before it starts (a ``since``
    later than the date), where the period typed does not itself (the period filter refuses that one)."""
    if not drilled or moment_parse(drilled["since"]) < moment_parse(drilled["until"], end_of_day=True):
        return False
    since, until = query.get("since", "").strip(), query.get("until", "").strip()
    return not (since and until and moment_parse(since) >= moment_parse(until, end_of_day=True))


def _filtered(request: HttpRequest, queryset: QuerySet[AuditEvent], **filters: Any) -> QuerySet[AuditEvent]:
    return audit_event_filter(queryset, AuditEventFilters(**filters))


def _refused(request: HttpRequest, queryset: QuerySet[AuditEvent], message: str) -> QuerySet[AuditEvent]:
    """A filter value that cannot be used shows no events and says why (rather than every event)."""
    messages.error(request, message)
    return queryset.none()


def _secrets_of(request: HttpRequest) -> list[str]:
    """The secrets bound now (``configured_secrets``), read once for the request's filters and rows."""
    secrets: list[str] | None = getattr(request, "_audit_secrets", None)
    if secrets is None:
        secrets = configured_secrets()
        request._audit_secrets = secrets  # type: ignore[attr-defined]
    return secrets


def _shown_as_recorded(value: str, secrets: list[str]) -> bool:
    """Whether a recorded value shows as it was recorded: a value holding a secret bound since (the events show it
    masked, ``masked_when_shown``) is no filter's choice, whose link would carry it in clear."""
    return bool(mask_known(value, secrets=secrets) == value)


class _ChoiceFilter(admin.SimpleListFilter):
    """A list of values, read from the data; narrows through the shared selector."""

    def queryset(self, request: HttpRequest, queryset: QuerySet[AuditEvent]) -> QuerySet[AuditEvent]:
        value = self.value()
        if not value:
            return queryset
        return _filtered(request, queryset, **{self.parameter_name: value})


class AgentFilter(_ChoiceFilter):
    title = _("agent")
    parameter_name = "agent"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(slug, visible_text(slug)) for slug in Agent.objects.order_by("slug").values_list("slug", flat=True)]


class ServerFilter(_ChoiceFilter):
    title = _("server")
    parameter_name = "mcp_id"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        values = AuditEvent.objects.exclude(mcp_id="").order_by("mcp_id").values_list("mcp_id", flat=True).distinct()
        secrets = _secrets_of(request)
        return [(v, visible_text(v)) for v in values if _shown_as_recorded(v, secrets)]


class ToolFilter(_ChoiceFilter):
    """The tools that were called or decided on. A name a model made up (a call refused ``tool:unknown``) is the
    model's, not a tool: every such name is one entry, "unknown tool (any name)", which chooses the reason
    ``tool:unknown`` (so the export link carries it), as the reason filter folds ``args:unknown:*``."""

    title = _("tool")
    parameter_name = "tool"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        # A configuration change names what it changed there (a request category its department), and a sign-in
        # (``security.login*``) records "login": neither is a tool.
        events = AuditEvent.objects.exclude(tool="").exclude(action__startswith="config.")
        events = events.exclude(action__startswith="security.")
        if request.GET.get("mcp_id"):
            events = events.filter(mcp_id=request.GET["mcp_id"])  # the chosen server's tools only
        # The names refused as unknown, each with how many of its events were not (a tool of another server, say):
        # a name never anything but refused is made up. Grouped apart, so that the names are read, as before, from
        # the (tool, action) index alone.
        refused = (
            events.filter(tool__in=events.filter(reason=UNKNOWN_TOOL).values("tool"))
            .values("tool")
            .annotate(other=Count("id", filter=~Q(reason=UNKNOWN_TOOL)))
            .order_by()
        )
        made_up = {row["tool"] for row in refused if not row["other"]}
        names = events.order_by("tool").values_list("tool", flat=True).distinct()
        # A tool's name is its server's text: shown with what does not show itself written out (``audit.visible``).
        secrets = _secrets_of(request)
        choices = [(v, visible_text(v)) for v in names if v not in made_up and _shown_as_recorded(v, secrets)]
        if refused:
            choices.append((UNKNOWN_TOOL, gettext("unknown tool (any name)")))
        return choices

    def queryset(self, request: HttpRequest, queryset: QuerySet[AuditEvent]) -> QuerySet[AuditEvent]:
        # The folded entry's events (its count beside it, ``?tool=tool:unknown`` typed by hand).
        if self.value() == UNKNOWN_TOOL:
            return _filtered(request, queryset, reason=UNKNOWN_TOOL)
        return super().queryset(request, queryset)

    def choices(self, changelist: Any) -> Iterator[Any]:
        """The folded entry links to the reason ``tool:unknown`` (the API's parameter), and is chosen by it."""
        folded = not self.value() and self.request.GET.get("reason") == UNKNOWN_TOOL
        entries = iter(super().choices(changelist))
        every = next(entries)
        yield {**every, "selected": every["selected"] and not folded}
        for (value, _title), entry in zip(self.lookup_choices, entries, strict=True):
            if value == UNKNOWN_TOOL:
                query = changelist.get_query_string({"reason": UNKNOWN_TOOL}, remove=[self.parameter_name])
                entry = {**entry, "selected": folded or entry["selected"], "query_string": query}
            yield entry


class SourceFilter(_ChoiceFilter):
    title = _("source")
    parameter_name = "source"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return list(AuditEvent.Source.choices)


class ActionFilter(_ChoiceFilter):
    """What happened: ``tool.call``, ``rule.decision``, an approval's steps, or a change of the configuration
    (``config.*`` selects them all)."""

    title = _("action")
    parameter_name = "action"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        actions = list(AuditEvent.objects.order_by("action").values_list("action", flat=True).distinct())
        prefixes = sorted({a.split(".", 1)[0] + ".*" for a in actions if a.startswith("config.")})
        return [(p, str(_("every configuration change"))) for p in prefixes] + [
            (a, visible_text(action_label(a))) for a in actions
        ]


NEUTRAL_REASONS: dict[str, bool] = {
    "approval:pending": False,  # a write call waiting for a person: recorded not ok (not made), yet nothing failed
    "rule:skipped": True,  # a rule whose conditions did not hold: recorded ok (decided), yet nothing was called
}
"""Reasons that are neither a success nor a failure, each with the ``ok`` it is recorded with (what the API's
``ok`` filter sees). The list shows them by their words, without ✓ or ✗, and leaves them out of both outcome
filters: an approval awaited was shown and counted as a failed event, a skipped rule as a succeeded one."""


def _outcome_icon(event: AuditEvent) -> str:
    """✓ or ✗ with its words (in the reader's language) as the icon's text; nothing for an event of a neutral
    reason (``NEUTRAL_REASONS``), which is neither."""
    if event.reason in NEUTRAL_REASONS:
        return ""
    return format_html(
        '<img src="{}" alt="{}">',
        static(f"admin/img/icon-{'yes' if event.ok else 'no'}.svg"),
        gettext("succeeded") if event.ok else gettext("failed"),
    )


class OutcomeFilter(admin.SimpleListFilter):
    """``ok`` as the API takes it (true or false), narrowed to what a reader means by the words: *succeeded* is
    the events recorded ok, *failed* those recorded not ok, each without the events of a neutral reason
    (``NEUTRAL_REASONS``: an approval awaited, a rule skipped), which the reason filter lists. Where a reason is
    chosen too, the outcome is the API's ``ok`` alone, as the export link can carry it (``_export_outcome``): the
    reason chosen says which events the reader means."""

    title = _("outcome")
    parameter_name = "ok"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [("true", _("succeeded")), ("false", _("failed"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[AuditEvent]) -> QuerySet[AuditEvent]:
        value = (self.value() or "").lower()
        if not value:
            return queryset
        if value not in {"true", "false", "1", "0"}:
            return _refused(request, queryset, gettext("Outcome: use true or false."))
        outcome = _filtered(request, queryset, ok=value in {"true", "1"})
        return outcome if request.GET.get("reason") else outcome.exclude(reason__in=list(NEUTRAL_REASONS))


def _export_outcome(chosen: Mapping[str, Any]) -> dict[str, str]:
    """The list's outcome filter as the API can take it: the API's ``ok`` keeps the neutral events, and its
    ``reason`` leaves one reason out (``!code``). Where no reason is chosen, the neutral reason recorded with the
    chosen ``ok`` (one for each) is left out, so that the export holds what the list shows."""
    ok = chosen.get("ok", "").lower()
    if ok not in {"true", "false", "1", "0"} or chosen.get("reason"):
        return {}
    neutral = [code for code, stored_ok in NEUTRAL_REASONS.items() if stored_ok == (ok in {"true", "1"})]
    return {"reason": f"!{neutral[0]}"} if len(neutral) == 1 else {}


class ReasonFilter(_ChoiceFilter):
    title = _("reason code")
    parameter_name = "reason"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        values = AuditEvent.objects.exclude(reason="").order_by("reason").values_list("reason", flat=True).distinct()
        # Each run writes a decision for every rule it tried: the ones that did not match are left out in a click
        # (the same "!" the API takes, so the export links carry it).
        fewer = [("!rule:skipped", gettext("all but skipped rule decisions"))] if "rule:skipped" in values else []
        # An unknown argument's name is the model's: every name it made up is one entry (``args:unknown:*``, a
        # prefix the filter and the API take), as ``/metrics`` folds its label, not an entry per name.
        secrets = _secrets_of(request)
        codes = dict.fromkeys(c for c in map(_reason_choice, values) if _shown_as_recorded(c, secrets))
        return fewer + [
            (c, gettext("unknown argument (any name)") if c == UNKNOWN_ARGUMENTS else visible_text(reason_label(c)))
            for c in codes
        ]


UNKNOWN_ARGUMENTS = "args:unknown:*"
"""The reason filter's one entry for every unknown argument's name (``args:unknown:<name>``)."""

UNKNOWN_TOOL = "tool:unknown"
"""The reason of a call to a tool its server does not have (a name a model made up): the tool filter's one entry
for every such name."""


def _reason_choice(reason: str) -> str:
    return UNKNOWN_ARGUMENTS if tool_call_reason_label(reason) != reason else reason


class _InputFilter(admin.ListFilter):
    """Free-text values typed into the sidebar (a caller, a run id, a period), with their own small form."""

    template = "admin/audit/input_filter.html"
    inputs: tuple[tuple[str, Any, str], ...] = ()  # (parameter, label, placeholder)

    def __init__(self, request: HttpRequest, params: dict[str, list[str]], model: Any, model_admin: Any) -> None:
        super().__init__(request, params, model, model_admin)
        for name, _label, _placeholder in self.inputs:
            if name in params:
                value = params.pop(name)[-1].strip()
                if value:
                    self.used_parameters[name] = value

    def has_output(self) -> bool:
        return True

    def expected_parameters(self) -> list[str]:
        return [name for name, _label, _placeholder in self.inputs]

    def choices(self, changelist: Any) -> Iterator[dict[str, Any]]:
        mine = set(self.expected_parameters())
        yield {
            "fields": [
                {"name": name, "label": label, "placeholder": placeholder, "value": self.used_parameters.get(name, "")}
                for name, label, placeholder in self.inputs
            ],
            "keep": [(k, v) for k, v in changelist.params.items() if k not in mine],
            "selected": bool(self.used_parameters),
            "clear_url": changelist.get_query_string(remove=list(mine)),
        }


class CallerFilter(_InputFilter):
    title = _("caller")
    inputs = (("actor", _("actor, API key name or prefix"), "api_key:apk_…"),)

    def queryset(self, request: HttpRequest, queryset: QuerySet[AuditEvent]) -> QuerySet[AuditEvent]:
        actor = self.used_parameters.get("actor")
        return _filtered(request, queryset, actor=actor) if actor else queryset


class RunFilter(_InputFilter):
    title = _("run")
    inputs = (("run", _("run id, or its first 8 characters"), "8c2f1a9b"),)

    def queryset(self, request: HttpRequest, queryset: QuerySet[AuditEvent]) -> QuerySet[AuditEvent]:
        value = self.used_parameters.get("run")
        if not value:
            return queryset
        try:
            run_id, prefix = run_reference_parse(value)
        except ValueError:
            return _refused(request, queryset, gettext("Run: %(value)s is not a run id.") % {"value": value})
        return _filtered(request, queryset, run=run_id, run_prefix=prefix)


class PeriodFilter(_InputFilter):
    title = _("period")
    inputs = (
        ("since", _("from (inclusive)"), "2026-03-01"),
        ("until", _("to (a date: that whole day)"), "2026-03-31T18:00"),
    )

    def queryset(self, request: HttpRequest, queryset: QuerySet[AuditEvent]) -> QuerySet[AuditEvent]:
        bounds: dict[str, dt.datetime] = {}
        for name, end_of_day in (("since", False), ("until", True)):
            value = self.used_parameters.get(name)
            if not value:
                continue
            try:
                bounds[name] = moment_parse(value, end_of_day=end_of_day)
            except ValueError:
                return _refused(
                    request,
                    queryset,
                    gettext("Period: %(value)s is not a date (YYYY-MM-DD) or date-time.") % {"value": value},
                )
        if "since" in bounds and "until" in bounds and bounds["since"] >= bounds["until"]:
            # Refused as the export (the API) refuses it, rather than an empty list that says nothing.
            return _refused(
                request,
                queryset,
                gettext("Period: %(since)s to %(until)s ends before it starts.")
                % {"since": self.used_parameters["since"], "until": self.used_parameters["until"]},
            )
        return _filtered(request, queryset, **bounds) if bounds else queryset


def api_url(name: str) -> str | None:
    """The auditors' API URL, where the project mounts it."""
    try:
        return reverse(name)
    except NoReverseMatch:
        return None


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdminMixin, WritesRefusedMixin, admin.ModelAdmin):
    # A column per question an auditor asks (when, what, which tool, how it ended, how long, in which run, who),
    # so the list fits beside the menu and the filters at 1,400 px; the codes stay beside their words. Sortable
    # by time, action, tool, outcome, latency (the slowest calls), agent and actor.
    list_display = ["id", "when", "event", "tool_column", "outcome_column", "latency", "run_link", "actor_column"]
    list_filter = [
        AgentFilter,
        ServerFilter,
        ToolFilter,
        SourceFilter,
        ActionFilter,
        OutcomeFilter,
        ReasonFilter,
        CallerFilter,
        PeriodFilter,
        RunFilter,
    ]
    search_fields = ["tool", "mcp_id", "reason", "actor", "=run_id"]
    date_hierarchy = "created_at"  # from the ends of the created_at index (DateDrillDownChangeList)
    ordering = ["-id"]  # newest first (ids are the order events were written)
    show_full_result_count = False  # no COUNT(*) of the whole table on every page
    readonly_fields = [
        "id",
        "created_at",
        "run_id",
        "agent",
        "source",
        "action_text",
        "server_text",
        "tool_text",
        "call_id_text",
        "args_pretty",
        "args_rows",
        "result_pretty",
        "outcome_text",
        "reason_text",
        "attempt",
        "latency",
        "actor_text",
        "seq",
        "prev_hash",
        "hash",
    ]
    exclude = ["args", "result"]

    @admin.display(description=_("latency (ms)"), ordering="latency_ms")
    def latency(self, obj: AuditEvent) -> str:
        """Milliseconds as people read them (``4072.5``, not ``4072.4961050000275``)."""
        return "—" if obj.latency_ms is None else f"{obj.latency_ms:,.1f}"

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        # The chain's fields where the model has them, and this page's readings of the record.
        names = {f.name for f in AuditEvent._meta.get_fields()}
        return [f for f in self.readonly_fields if f in names or hasattr(self, f)] + [
            "run_page",
            "change_summary",
            "decision_summary",
        ]

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> list[tuple[Any, dict[str, Any]]]:
        """An event's page in sections, in this order: what happened, when and at whose request; then what it
        says (a configuration change's settings before and after, a rule's decision in a sentence, a call's
        arguments and result); the record as stored; the chain's fields. Codes and raw numbers are shown
        through their readable forms, beside them."""
        chain = [f for f in ("seq", "prev_hash", "hash") if f in {f.name for f in AuditEvent._meta.get_fields()}]
        head = ["id", "created_at", "action_text", "source", "actor_text"]
        recorded = (_("As recorded (masked)"), {"fields": ["args_pretty", "result_pretty"], "classes": ["collapse"]})
        if obj is not None:
            # This page's readings of the record, made once for this reader (who may follow which links).
            def can_view(model: Any) -> bool:
                return bool(request.user.has_perm(f"{model._meta.app_label}.view_{model._meta.model_name}"))

            obj.change_reading = change_html(obj, site_name=self.admin_site.name, can_view=can_view)
            obj.decision_reading = rule_decision_html(obj, site_name=self.admin_site.name, can_view=can_view)
        if obj is not None and obj.change_reading is not None:
            sections = [
                (None, {"fields": head}),
                (pgettext_lazy("audit event section", "Change"), {"fields": ["change_summary"]}),
                recorded,
            ]
        elif obj is not None and obj.action == "rule.decision":
            sections = [
                (None, {"fields": [*head, "run_page", "agent"]}),
                (
                    _("Decision"),
                    {"fields": ["decision_summary", "server_text", "tool_text", "args_rows", "reason_text"]},
                ),
                (_("As recorded (masked)"), {"fields": ["result_pretty"], "classes": ["collapse"]}),
            ]
        else:
            # A tool call's arguments a row each; a record of another kind as it was recorded.
            args = "args_rows" if obj is not None and str(obj.action).startswith("tool.") else "args_pretty"
            call = [
                *("server_text", "tool_text", "call_id_text", args, "result_pretty"),
                *("outcome_text", "reason_text", "attempt"),
            ]
            sections = [
                (None, {"fields": [*head, "run_page", "agent"]}),
                (_("Call"), {"fields": [*call, "latency"]}),
            ]
        return [*sections, (_("Chain"), {"fields": chain})] if chain else sections

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Any = None,
    ) -> HttpResponse:
        # The title (``#185 tool.call · local.calculate``) names the recorded tool: shown, in the title, the heading
        # and the breadcrumbs (the template's ``event_title``), with what does not show itself written out.
        if obj is not None:
            context["subtitle"] = context["event_title"] = visible_text(str(obj))
        return super().render_change_form(request, context, add, change, form_url, obj)

    @admin.display(description=_("what was changed"))
    def change_summary(self, obj: AuditEvent) -> str:
        return getattr(obj, "change_reading", None) or "—"

    @admin.display(description=_("rule"))
    def decision_summary(self, obj: AuditEvent) -> str:
        return getattr(obj, "decision_reading", None) or "—"

    @admin.display(description=_("run"))
    def run_page(self, obj: AuditEvent) -> str:
        """The run, linked to its page (its whole id, which the filters and the API take)."""
        if not obj.run_id:
            return "—"
        url = reverse("admin:agents_run_change", args=[obj.run_id], current_app=self.admin_site.name)
        return format_html('<a href="{}">{}</a>', url, obj.run_id)

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return DateDrillDownChangeList

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None) -> Any:
        """The event as its page shows it: masked again with the secrets bound now (``event_masked_when_shown``),
        which one recorded before a value was bound as a secret was not masked with. Never saved."""
        obj = super().get_object(request, object_id, from_field)
        if obj is not None:
            event_masked_when_shown(obj, _secrets_of(request))
        return obj

    def get_changelist_instance(self, request: HttpRequest) -> ChangeList:
        """The list's page of events, what its rows show (server, tool, reason, actor) masked as an event's page
        masks them."""
        changelist = super().get_changelist_instance(request)
        secrets = _secrets_of(request)
        for event in changelist.result_list:
            event_masked_when_shown(event, secrets, fields=("mcp_id", "tool", "reason", "actor"))
        return changelist

    def get_queryset(self, request: HttpRequest) -> QuerySet[AuditEvent]:
        audit_chain_catch_up()  # events committed but not chained yet (deferred chaining) are listed too
        return with_agent_slug(super().get_queryset(request))

    @admin.display(description=_("time"), ordering="id")
    def when(self, obj: AuditEvent) -> str:
        """To the second, with the time zone (the admin's list would otherwise show minutes): the date above the
        time, neither of them broken."""
        return when_cell(obj.created_at)

    @admin.display(description=_("event"), ordering="action")
    def event(self, obj: AuditEvent) -> str:
        """What happened, in words, who asked for it (the source), and the action's code."""
        return format_html(
            '{}<div class="audit-sub">{}</div><code class="audit-code">{}</code>',
            visible_text(action_label(obj.action)),
            obj.get_source_display(),
            breakable(obj.action),
        )

    @admin.display(description=_("tool"), ordering="tool")
    def tool_column(self, obj: AuditEvent) -> str:
        """The tool under its server (for a configuration change: what was changed, under its server if any)."""
        if not obj.tool and not obj.mcp_id:
            return "—"
        return format_html('<div class="audit-sub">{}</div>{}', breakable(obj.mcp_id or ""), breakable(obj.tool or "—"))

    @admin.display(description=_("outcome"), ordering="ok")
    def outcome_column(self, obj: AuditEvent) -> str:
        """Succeeded or failed (an icon), why in words with its code, and the attempt's number when it was a retry.
        An event of a neutral reason (``NEUTRAL_REASONS``: waiting for an approval, a rule skipped) has no icon:
        its reason's words say what happened, neither a success nor a failure."""
        icon = _outcome_icon(obj)
        reason = (
            format_html(
                ' {}<code class="audit-code">{}</code>', visible_text(reason_label(obj.reason)), breakable(obj.reason)
            )
            if obj.reason
            else ""
        )
        retried = obj.attempt is not None and obj.attempt > 1
        attempt = format_html('<div class="audit-sub">{}</div>', gettext("attempt %(n)s") % {"n": obj.attempt})
        return format_html("{}{}{}", icon, reason, attempt if retried else "")

    @admin.display(description=_("agent"), ordering="agent_slug")
    def agent(self, obj: AuditEvent) -> str:
        return visible_text(getattr(obj, "agent_slug", None) or "—")

    @admin.display(description=_("actor"), ordering="actor")
    def actor_column(self, obj: AuditEvent) -> str:
        """Who acted, in words, above its recorded code (which the filters and exports use): ``boss (admin)`` over
        ``admin:boss``; a username or another form that has no other words, once."""
        if not obj.actor:
            return "—"
        words = actor_in_words(obj.actor)
        if words == visible_text(obj.actor):
            return breakable(obj.actor)
        return format_html('{}<br><code class="audit-code">{}</code>', words, breakable(obj.actor))

    @admin.display(description=_("action"))
    def action_text(self, obj: AuditEvent) -> str:
        return format_html(
            '{} <code class="audit-code">{}</code>', visible_text(action_label(obj.action)), visible_text(obj.action)
        )

    # The event page's recorded texts, each with what does not show itself written out (``audit.visible``), as
    # the list shows them: a tool's name is its server's text, an actor and a call id a caller's, and a direction
    # override in ``get\u202eeteled`` would make it read ``getdeleted`` (the admin shows a model field's text raw).

    @admin.display(description=_("server"))
    def server_text(self, obj: AuditEvent) -> str:
        return visible_text(obj.mcp_id) or "—"

    @admin.display(description=_("tool"))
    def tool_text(self, obj: AuditEvent) -> str:
        return visible_text(obj.tool) or "—"

    @admin.display(description=_("call id"))
    def call_id_text(self, obj: AuditEvent) -> str:
        return visible_text(obj.call_id) or "—"

    @admin.display(description=_("actor"))
    def actor_text(self, obj: AuditEvent) -> str:
        return visible_text(obj.actor) or "—"

    @admin.display(description=_("outcome"))
    def outcome_text(self, obj: AuditEvent) -> str:
        """As the list shows it: ✓ or ✗ with its words in the reader's language, and for a neutral reason
        (``NEUTRAL_REASONS``: an approval awaited, a rule skipped) neither; the reason's words follow."""
        if obj.reason in NEUTRAL_REASONS:
            return gettext("neither succeeded nor failed")
        return format_html("{} {}", _outcome_icon(obj), gettext("succeeded") if obj.ok else gettext("failed"))

    @admin.display(description=_("reason code"))
    def reason_text(self, obj: AuditEvent) -> str:
        if not obj.reason:
            return "—"
        # A reason may quote a caller's text (``args:unknown:<a name the model wrote>``).
        return format_html(
            '{} <code class="audit-code">{}</code>', visible_text(reason_label(obj.reason)), visible_text(obj.reason)
        )

    @admin.display(description=_("agent and run"), ordering="agent_slug")
    def run_link(self, obj: AuditEvent) -> str:
        if not obj.run_id:
            return visible_text(getattr(obj, "agent_slug", None) or "—")
        url = reverse("admin:agents_run_change", args=[obj.run_id], current_app=self.admin_site.name)
        return format_html(
            '{}<div><a href="{}">{}</a></div>',
            visible_text(getattr(obj, "agent_slug", None) or ""),
            url,
            str(obj.run_id)[:8],
        )

    @admin.display(description=_("arguments (masked)"))
    def args_pretty(self, obj: AuditEvent) -> str:
        shown = json.dumps(_args_shown(obj), ensure_ascii=False, indent=2)
        return format_html("<pre>{}</pre>", visible_text(shown))

    @admin.display(description=_("arguments (masked)"))
    def args_rows(self, obj: AuditEvent) -> str:
        """A call's arguments a row each (name, value as the rule editor writes it); other shapes as JSON."""
        rows = argument_rows(obj.args) if _args_shown(obj) is obj.args else None
        if rows is None:
            return self.args_pretty(obj)
        if not rows:
            return str(_("No arguments."))
        return format_html(
            '<table class="audit-arg-rows">{}</table>',
            format_html_join("", "<tr><th><code>{}</code></th><td>{}</td></tr>", rows),
        )

    @admin.display(description=_("result (masked)"))
    def result_pretty(self, obj: AuditEvent) -> str:
        """The result as recorded (what the tool sent, masked: its value, its error text, the gate's message),
        with what does not show itself written out (``⟦U+E0049⟧``, ``audit.visible``), as the arguments are: a
        result's tag characters are instructions a model reads and an auditor would otherwise not see."""
        recorded = json.dumps(obj.result, ensure_ascii=False, indent=2)
        return format_html("<pre style='white-space:pre-wrap'>{}</pre>", visible_text(recorded))

    # --- the list's links, and the metrics page -------------------------------------------------------------

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        chosen = {k: v for k, v in request.GET.items() if k in FILTER_PARAMETERS and v}
        drilled = _drilled_period(request.GET, since=chosen.get("since"), until=chosen.get("until"))
        chosen.update(drilled)
        if chosen.get("tool") == UNKNOWN_TOOL and chosen.get("reason", UNKNOWN_TOOL) == UNKNOWN_TOOL:
            # The tool filter's folded entry, typed by hand: its events are the reason's (``ToolFilter.queryset``).
            del chosen["tool"]
            chosen["reason"] = UNKNOWN_TOOL
        chosen.update(_export_outcome(chosen))
        export = api_url("audit-event-list")
        if _drilled_past_since(request.GET, drilled):
            # A date drilled into that ends before the period's ``since``: refused as the period filter refuses
            # one, rather than an empty list that says nothing and an export link the API refuses.
            messages.error(
                request,
                gettext("Period: %(since)s to %(until)s ends before it starts.")
                % {"since": drilled["since"], "until": drilled["until"]},
            )
            export = None
        extra_context = {
            **(extra_context or {}),
            "audit_metrics_url": reverse("admin:audit_auditevent_metrics", current_app=self.admin_site.name),
            "audit_verify_url": reverse("admin:audit_auditevent_verify", current_app=self.admin_site.name),
            "audit_export_url": f"{export}?{urlencode(chosen)}{'&' if chosen else ''}" if export else None,
            # The API has no search: an export of a searched list would hold more than the list shows.
            "audit_export_unsearched": bool(request.GET.get(SEARCH_VAR, "").strip()),
            "audit_archived_note": _list_archived_note(str(chosen.get("since") or "")),
        }
        return super().changelist_view(request, extra_context)

    def get_urls(self) -> list[URLPattern]:
        metrics = path("metrics/", self.admin_site.admin_view(self.metrics_view), name="audit_auditevent_metrics")
        verify = path("verify/", self.admin_site.admin_view(self.verify_view), name="audit_auditevent_verify")
        return [metrics, verify, *super().get_urls()]

    def verify_view(self, request: HttpRequest) -> HttpResponse:
        """*Verify chain*: runs ``manage.py verify_audit`` itself (so the button and the command always agree)
        and shows its verdict. A POST (it walks the whole chain); whoever may view the audit record may ask."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        verdict = audit_chain_verdict() if request.method == "POST" else None
        context = {
            **self.admin_site.each_context(request),
            "title": gettext("Verify the audit chain"),
            "opts": self.model._meta,
            "verdict": verdict,
        }
        return TemplateResponse(request, "admin/audit/verify.html", context)

    def metrics_view(self, request: HttpRequest) -> HttpResponse:
        """Tool metrics over a period (default: the last 7 days) for whoever may view the audit record."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        since, until = _period(request)
        secrets = configured_secrets()  # masks the report's texts and its charts' names alike
        report = tool_metrics(since=since, until=until, secrets=secrets)
        # A row's link lists the calls the row counts: the same period, tool calls only (of every source: the
        # note under the table says so).
        period_query = {
            "since": request.GET["since"].strip() if since is not None else report.since.isoformat(),
            "until": request.GET["until"].strip() if until is not None else report.until.isoformat(),
            "action": "tool.call",
        }
        most_calls = max((t.calls for t in report.tools), default=0)
        slowest = max((t.latency_p95_ms or 0.0 for t in report.tools), default=0.0)
        events_url = reverse("admin:audit_auditevent_changelist", current_app=self.admin_site.name)
        rows = [
            {
                "tool": t,
                "calls_pct": _pct(t.calls, most_calls),
                "error_pct": round(t.error_rate * 100, 1),
                "error_pct_bar": _pct(t.errors, t.calls),
                "p95_pct": _pct(t.latency_p95_ms or 0.0, slowest),
                "reasons": _reasons_in_words(t.errors_by_reason),
                # Recorded texts (a server's tool name, a caller) with what does not show itself written out.
                "server": visible_text(t.mcp_id),
                # A tool's name breaks after its dots and underscores, not after any letter.
                "name": breakable(t.tool),
                "callers": [
                    (_caller_html(actor), n) for actor, n in sorted(t.callers.items(), key=lambda kv: (-kv[1], kv[0]))
                ],
                # A name masked for a secret bound since its calls were recorded filters on what is left of it: the
                # masked text matches no event (the link listed none), and the recorded one must not be shown.
                "events_url": f"{events_url}?{urlencode({**_unmasked(mcp_id=t.mcp_id, tool=t.tool), **period_query})}",
            }
            for t in report.tools
        ]
        callers = [{"caller": c, "actor": _caller_html(c.actor), "name": visible_text(c.name)} for c in report.callers]
        metrics_api = api_url("audit-metrics")
        period = {"since": request.GET.get("since", ""), "until": request.GET.get("until", "")}
        asked = request.GET.get("bucket", "")
        bucket = series_bucket(since=report.since, until=report.until, asked=asked)
        if bucket is None:
            messages.info(
                request,
                gettext("The period is too long to chart (at most %(max)d days); its totals are shown.")
                % {"max": MAX_BUCKETS},
            )
        elif asked in ("hour", "day") and bucket != asked:
            messages.info(request, gettext("The period is too long to chart by the hour; charted by the day."))
        context = {
            **self.admin_site.each_context(request),
            "title": gettext("Tool metrics"),
            "opts": self.model._meta,
            "report": report,
            "rows": rows,
            "callers": callers,
            "archived_note": _archived_note(
                report.since,
                gettext(
                    "Events before %(date)s (up to seq %(seq)s) are archived in %(file)s; their figures are not "
                    "shown here."
                ),
            ),
            "error_rate_pct": round(report.error_rate * 100, 1),
            "since_value": period["since"],
            "until_value": period["until"],
            "api_url": f"{metrics_api}?{urlencode({k: v for k, v in period.items() if v})}" if metrics_api else None,
            "bucket": bucket or "day",
            "series": (
                _series_charts(
                    tool_metrics_series(since=report.since, until=report.until, bucket=bucket, secrets=secrets),
                    bucket=bucket,
                )
                if bucket is not None
                else []
            ),
        }
        return TemplateResponse(request, "admin/audit/metrics.html", context)


def _caller_html(actor: str) -> str:
    """Who called, in words ("API key apk_ab12…", "live run (no API key)"), the recorded code in its title (what the
    list's actor filter takes); "" for none."""
    if not actor:
        return ""
    return format_html('<span title="{}">{}</span>', visible_text(actor), actor_in_words(actor))


@dataclass
class ChainVerdict:
    """``outcome``: ``intact``; ``altered`` (``problem`` names the first altered, removed, inserted or forged event);
    ``unchecked`` (an archive file is missing or unreadable: the events in it were not checked, which says nothing
    of whether they were altered); ``error`` (the check itself stopped, logged: no verdict)."""

    outcome: Literal["intact", "altered", "unchecked", "error"]
    lines: list[str]
    problem: str
    checked_at: dt.datetime

    @property
    def ok(self) -> bool:
        return self.outcome == "intact"


def audit_chain_verdict() -> ChainVerdict:
    """What ``verify_audit`` says of the chain now: its output lines, and the first problem if it failed. Never
    raises: an error of the check itself (a bug, a database gone) is a failed verdict, logged, not a server error."""
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("verify_audit", stdout=out, stderr=err)
    except CommandError as exc:
        problem = exc.args[0] if exc.args else ""
        outcome: Literal["altered", "unchecked"] = "unchecked" if isinstance(problem, CannotCheck) else "altered"
        return ChainVerdict(outcome, out.getvalue().splitlines(), str(exc), timezone.now())
    except Exception as exc:
        logger.exception("verify_audit stopped with an error")
        problem = gettext("verify_audit stopped with an error (%(error)s); see the server log.") % {
            "error": type(exc).__name__
        }
        return ChainVerdict("error", out.getvalue().splitlines(), problem, timezone.now())
    return ChainVerdict("intact", out.getvalue().splitlines(), "", timezone.now())


def _period(request: HttpRequest) -> tuple[dt.datetime | None, dt.datetime | None]:
    bounds: dict[str, dt.datetime | None] = {"since": None, "until": None}
    for name, end_of_day in (("since", False), ("until", True)):
        value = request.GET.get(name, "").strip()
        if value:
            try:
                bounds[name] = moment_parse(value, end_of_day=end_of_day)
            except ValueError:
                messages.error(
                    request, gettext("%(value)s is not a date (YYYY-MM-DD) or date-time.") % {"value": value}
                )
    since, until = bounds["since"], bounds["until"]
    if since and since >= (until or timezone.now()):  # a since in the future ends before it starts too
        messages.error(request, gettext("The period ends before it starts; showing the last 7 days."))
        return None, None
    return since, until


def _archived_note(since: dt.datetime | None, words: str) -> str:
    """Where a page's period (from ``since``; None: from the start) reaches into the archived part of the record
    (``archive_audit``), ``words`` that say so: which events, up to which seq, in which file (``%(date)s``,
    ``%(seq)s``, ``%(file)s``); else "". An archived period reads as one without events otherwise."""
    archived = archived_part()
    if archived is None or (since is not None and since >= archived.before):
        return ""
    return words % {
        "date": date_format(timezone.localtime(archived.before), "DATETIME_FORMAT"),
        "seq": archived.seq,
        "file": visible_text(archived.file_name),
    }


def _list_archived_note(since: str | None) -> str:
    """The list's :func:`_archived_note`, from the period it shows (a ``since`` it refuses: none, it says why)."""
    try:
        moment = moment_parse(since) if since else None
    except ValueError:
        return ""
    return _archived_note(
        moment,
        gettext("Events before %(date)s (up to seq %(seq)s) are archived in %(file)s; they are not listed here."),
    )


def _series_charts(series: list[ToolSeries], *, bucket: str) -> list[dict[str, Any]]:
    """Each series as three charts over time: calls, error rate and p95 latency."""
    charts = []
    for line in series:
        labels = [date_format(p.start, "Y-m-d H:00" if bucket == "hour" else "Y-m-d") for p in line.points]
        charts.append(
            {
                "name": breakable(f"{line.mcp_id}.{line.tool}") if line.tool else gettext("all tools"),
                "calls": line.calls,
                "calls_chart": bar_chart(
                    [p.calls for p in line.points], labels, colour="#417690", title=gettext("calls")
                ),
                "errors_chart": bar_chart(
                    [round(p.error_rate * 100, 1) if p.error_rate is not None else None for p in line.points],
                    labels,
                    colour="#ba2121",
                    unit="%",
                    title=gettext("error rate"),
                ),
                "p95_chart": bar_chart(
                    [p.latency_p95_ms for p in line.points], labels, colour="#b8860b", unit=" ms", title="p95"
                ),
            }
        )
    return charts


def _reasons_in_words(errors_by_reason: dict[str, int]) -> list[dict[str, Any]]:
    """A tool's errors per reason, most first, each code with its words in the reader's language beside it, as
    every other admin page shows a reason ("rate limit exceeded ``rate_limit``"); ``words`` is empty for a code
    that has none, shown alone rather than twice."""
    rows = []
    for code, count in sorted(errors_by_reason.items(), key=lambda kv: (-kv[1], kv[0])):
        words = reason_label(code)
        rows.append({"code": visible_text(code), "words": words if words != code else "", "count": count})
    return rows


def _args_shown(event: AuditEvent) -> Any:
    """A call's arguments as its page shows them: cut as they are stored now (``truncate``: an event recorded before
    they were kept whole, megabytes of them); a configuration change's whole, as they are stored."""
    if event.action.startswith("config."):
        return event.args
    return truncate(event.args, max_chars=settings.PLATFORM_AUDIT_RESULT_MAX_CHARS)


def _unmasked(**names: str) -> dict[str, str]:
    """The ``names`` a link may filter on: those no secret was masked in."""
    return {key: value for key, value in names.items() if MASK not in value}


def _pct(part: float, whole: float) -> int:
    return round(100 * part / whole) if whole else 0


@admin.register(AuditCheckpoint)
class AuditCheckpointAdmin(ReadOnlyAdminMixin, WritesRefusedMixin, admin.ModelAdmin):
    """Where archived events end: what ``verify_audit`` starts from. Read-only."""

    list_display = ["seq", "hash", "archived_at", "count", "file_name"]
    readonly_fields = [f.name for f in AuditCheckpoint._meta.fields]
