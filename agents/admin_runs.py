"""The admin's pages for runs and approvals: a run reads as a timeline that follows the run live, an approval is
decided on its own page (arguments shown masked, a reason required to reject, a confirmation), and nothing here
deletes or edits a run, an approval or an audit row.

Writes go through the services: ``run_cancel`` and ``approval_decide``. The live view is the run's own event
stream (``RunEventFeed``, the one ``GET /api/v1/runs/{id}/events`` serves), authorised by the admin's session
instead of an API key; each event makes the page fetch the timeline again (one small HTML fragment).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.core.handlers.asgi import ASGIRequest
from django.db.models import Case, F, IntegerField, Value, When
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBase,
    HttpResponseRedirect,
    StreamingHttpResponse,
)
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from agent_platform.errors import ApplicationError
from agents.api.config import api_setting
from agents.api.events import RunEventFeed, stream_async, stream_sync
from agents.api.throttling import StreamSlot
from agents.approvals import approval_decide, asked_by_the_model
from agents.decision_reasons import approval_reason_text, reason_text
from agents.models import Approval, Run
from agents.services import CANCELLABLE, run_cancel
from audit.admin_readonly import ReadOnlyAdminMixin, WritesRefusedMixin
from audit.labels import breakable, reason_label, when_cell
from mcpregistry.list_fields import argument_rows

StepStatus = str
"""``ok``, ``degraded`` (it worked, after a retry, a fallback, a reused result or an uncertain outcome),
``failed``, ``skipped``, ``pending`` or ``""`` (neither: a message)."""


@dataclass
class Attempt:
    number: int
    ok: bool
    reason: str
    latency_ms: float | None
    # Named where a step's attempts went to more than one tool (the contract's fallback called by the gate).
    tool: str = ""

    @property
    def reason_words(self) -> str:
        """The reason in the reader's words (its code when there are none)."""
        return reason_label(self.reason)


@dataclass
class TimelineStep:
    """One step of a run as the admin shows it. ``args`` and ``result`` are already masked (the trace and the
    audit store them masked) and pretty-printed."""

    kind: str
    label: str
    title: str = ""
    status: StepStatus = ""
    status_text: str = ""
    duration_ms: float | None = None
    args: str = ""
    result: str = ""
    attempts: list[Attempt] = field(default_factory=list)
    note: str = ""
    # The arguments a row each (``name``, value as the rule editor writes it), where they are an object.
    arg_rows: list[tuple[str, str]] | None = None

    def with_args(self, value: Any) -> TimelineStep:
        """Set the arguments: rows for an object, its JSON otherwise (nothing when there are none)."""
        self.args = _pretty(value)
        self.arg_rows = argument_rows(value) if self.args else None
        return self


def _pretty(value: Any) -> str:
    if value in (None, "", {}, []):
        return ""
    return json.dumps(value, ensure_ascii=False, indent=2)


def _text(content: Any) -> str:
    return content if isinstance(content, str) else _pretty(content)


def _failed_text(reason: str) -> str:
    """ "failed: <the reason in words> (<its code>)", or the code alone where there are no words for it."""
    words = reason_label(reason) if reason else ""
    shown = f"{words} ({reason})" if words and words != reason else (reason or "?")
    return gettext("failed: %(reason)s") % {"reason": shown}


def _call_step(step: TimelineStep, events: list[Any], *, ok_in_trace: bool | None, error: str = "") -> TimelineStep:
    """Fill a tool call's outcome, attempts and duration from its audit events (or, with none, from the trace)."""
    sent = [e for e in events if e.attempt >= 1]
    several = len({e.tool for e in sent}) > 1
    step.attempts = [Attempt(e.attempt, e.ok, e.reason, e.latency_ms, e.tool if several else "") for e in sent]
    if sent:
        step.duration_ms = round(sum(e.latency_ms or 0.0 for e in sent), 2)
    if not events:
        if ok_in_trace is None:
            step.status, step.status_text = "", gettext("not audited")
        elif ok_in_trace:
            step.status, step.status_text = "ok", gettext("ok")
        else:
            step.status, step.status_text = "failed", _failed_text(error)
        return step
    last = events[-1]
    if last.ok:
        step.status, step.status_text = "ok", gettext("ok")
        if last.reason == "memo:hit":
            step.status, step.status_text = "degraded", gettext("ok (reused within the run)")
        elif len(sent) > 1:
            step.status = "degraded"
    else:
        step.status, step.status_text = "failed", _failed_text(last.reason)
    if sent:  # the time is the step's duration, shown once beside it
        step.status_text += " · " + gettext("%(n)d attempt(s)") % {"n": len(sent)}
    if not step.result and last.result not in (None, "", {}):
        step.result = _pretty(last.result)
    return step


_APPROVAL_STATUS = {
    "approved": "ok",
    "executed": "ok",
    "executing": "pending",
    "pending": "pending",
    "rejected": "failed",
    "expired": "failed",
    "outcome_unknown": "degraded",
}


def _approval_step(approval: Approval | None, *, label: str, title: str, args: Any) -> TimelineStep:
    step = TimelineStep(kind="approval", label=label, title=title).with_args(args)
    if approval is None:
        step.status, step.status_text = "pending", gettext("pending")
        return step
    step.status = _APPROVAL_STATUS.get(approval.status, "")
    step.status_text = approval.get_status_display()
    if approval.decided_by:
        step.status_text += " · " + gettext("by %(who)s") % {"who": approval.decided_by}
    step.note = approval_reason_text(approval.reason)
    if approval.result:
        step.result = _pretty(approval.result)
    return step


def run_timeline(run: Run) -> list[TimelineStep]:
    """A run's steps in order: rule decisions, deterministic calls (with their attempts), the model's turns, its
    tool calls (with their attempts and approvals), approvals, and the answer (or error) last."""
    calls: dict[str, list[Any]] = {}
    for event in run.audit_events.filter(action="tool.call").order_by("id"):
        calls.setdefault(event.call_id, []).append(event)
    approvals = list(run.approvals.order_by("created_at"))
    by_id = {str(a.pk): a for a in approvals}
    by_call = {a.call_id: a for a in approvals if a.call_id}
    shown: set[str] = set()
    steps: list[TimelineStep] = []
    for entry in run.messages or []:
        kind = entry.get("type", "")
        if kind == "rule":
            target = f"{entry.get('mcp_id', '')}.{entry.get('tool', '')}".strip(".")
            matched = bool(entry.get("matched"))
            steps.append(
                TimelineStep(
                    kind="rule",
                    label=gettext("rule decision"),
                    title=f"{entry.get('rule', '')} → {target}" if target else str(entry.get("rule", "")),
                    status="ok" if matched else "skipped",
                    status_text=gettext("matched") if matched else gettext("skipped"),
                    note="" if matched else reason_text(str(entry.get("reason") or "")),
                ).with_args(entry.get("params") if matched else None)
            )
        elif kind in ("deterministic_call", "flow_call"):
            step = TimelineStep(
                kind="deterministic" if kind == "deterministic_call" else "flow",
                label=gettext("deterministic call") if kind == "deterministic_call" else gettext("flow call"),
                title=f"{entry.get('mcp_id', '')}.{entry.get('tool', '')}",
                result=_pretty(entry.get("value")) if entry.get("ok") else "",
                note="" if entry.get("ok") else str(entry.get("message") or ""),
            ).with_args(entry.get("args"))
            key = f"rule:{entry.get('rule_id')}" if kind == "deterministic_call" else str(entry.get("call_id") or "")
            _call_step(step, calls.get(key, []), ok_in_trace=bool(entry.get("ok")), error=str(entry.get("error") or ""))
            if entry.get("ok") and (entry.get("fallback_for") or entry.get("memo_hit")) and step.status == "ok":
                step.status = "degraded"
            if entry.get("ok") and entry.get("fallback_for"):
                step.note = gettext("from the fallback tool, because %(tool)s failed") % {"tool": entry["fallback_for"]}
            if step.duration_ms is None and entry.get("latency_ms") is not None:
                step.duration_ms = entry.get("latency_ms")
            steps.append(step)
        elif kind == "approval":
            approval = by_id.get(str(entry.get("approval_id")))
            if approval is not None:
                shown.add(str(approval.pk))
            steps.append(
                _approval_step(
                    approval,
                    label=gettext("approval requested"),
                    title=str(entry.get("tool", "")),
                    args=entry.get("args"),
                )
            )
        elif kind == "system":
            steps.append(
                TimelineStep(kind="message", label=gettext("system message"), result=_text(entry.get("content", "")))
            )
        elif kind == "human":
            steps.append(
                TimelineStep(kind="message", label=gettext("user query"), result=_text(entry.get("content", "")))
            )
        elif kind == "ai":
            wanted = [
                f"→ {c['name']}({json.dumps(c.get('args'), ensure_ascii=False)})" for c in entry.get("tool_calls") or []
            ]
            steps.append(
                TimelineStep(
                    kind="model",
                    label=gettext("model turn"),
                    title="\n".join(wanted),
                    result=_text(entry.get("content", "")),
                )
            )
        elif kind == "tool":
            call_id = str(entry.get("tool_call_id") or "")
            step = TimelineStep(kind="tool", label=gettext("tool call"), title=str(entry.get("name", "")))
            step.result = _text(entry.get("content", ""))
            events = calls.get(call_id, [])
            if events and events[0].args:
                step.with_args(events[0].args)
            _call_step(step, events, ok_in_trace=None if entry.get("status") != "error" else False)
            approval = by_call.get(call_id)
            if approval is not None:
                shown.add(str(approval.pk))
                step.note = gettext("approval: %(status)s") % {"status": approval.get_status_display()}
                if approval.decided_by:
                    step.note += " · " + gettext("by %(who)s") % {"who": approval.decided_by}
                if approval.reason:
                    step.note += f" · {approval_reason_text(approval.reason)}"
                if approval.status == Approval.Status.OUTCOME_UNKNOWN:
                    step.status = "degraded"
            steps.append(step)
        elif kind == "outcome":
            steps.append(
                TimelineStep(
                    kind="outcome",
                    label=gettext("outcome"),
                    title=_code_in_words(str(entry.get("reason", ""))),
                    status="failed",
                    note=", ".join(_code_in_words(str(c)) for c in entry.get("tool_errors") or []),
                )
            )
        elif kind == "answer":
            continue  # the run's answer is the last step, below
        else:
            steps.append(TimelineStep(kind="other", label=kind or "?", result=_pretty(entry)))
    for approval in approvals:
        if str(approval.pk) not in shown:
            steps.append(
                _approval_step(
                    approval,
                    label=gettext("approval"),
                    title=f"{approval.mcp_id}.{approval.tool}",
                    args=approval.args,
                )
            )
    total = (run.timings or {}).get("total_ms")
    if run.error_code:
        steps.append(
            TimelineStep(
                kind="error",
                label=gettext("error"),
                title=_code_in_words(run.error_code),
                status="failed",
                status_text=run.get_status_display(),
                duration_ms=total,
                result=run.error_message,
            )
        )
    elif run.answer:
        steps.append(
            TimelineStep(
                kind="answer",
                label=gettext("answer"),
                status="ok",
                status_text=run.get_status_display(),
                duration_ms=total,
                result=run.answer,
            )
        )
    else:
        steps.append(
            TimelineStep(kind="status", label=gettext("status"), status="pending", status_text=run.get_status_display())
        )
    return steps


def _code_in_words(code: str) -> str:
    """An error code in the reader's words, the code beside them (``every deterministic call failed
    (deterministic:tool_failed)``); the code alone where no words are known."""
    words = reason_label(code)
    return code if words == code else f"{words} ({code})"


def _events_url(admin_site: admin.AdminSite, run_id: Any) -> str:
    return f"{reverse('admin:audit_auditevent_changelist', current_app=admin_site.name)}?run={run_id}"


def _resume_point(request: HttpRequest) -> int:
    """Where a stream resumes: ``Last-Event-ID`` (an EventSource reconnecting), ``?after=``, or the start."""
    for raw in (request.headers.get("Last-Event-ID"), request.GET.get("after")):
        if raw and raw.strip().isdigit() and raw.strip().isascii() and len(raw.strip()) <= 18:
            return int(raw.strip())
    return 0


def _staff_may_still_view(user_id: Any) -> bool:
    user = get_user_model().objects.filter(pk=user_id, is_active=True, is_staff=True).first()
    return user is not None and user.has_perm("agents.view_run")


@admin.register(Run)
class RunAdmin(ReadOnlyAdminMixin, WritesRefusedMixin, admin.ModelAdmin):
    """Runs are read-only here (no add, change or delete for anyone); an admin may cancel one that has not
    finished."""

    change_form_template = "admin/agents/run/change_form.html"
    # Beside the menu and the filters at 1,400 px: the start's date above its time, the error code under the status.
    list_display = ["created", "agent", "status_badge", "short_query", "tool_failures", "total_ms"]
    list_display_links = ["created"]
    list_filter = ["status", "purpose", "agent"]
    search_fields = ["id", "query", "answer"]
    date_hierarchy = "created_at"
    readonly_fields = [f.name for f in Run._meta.fields if f.name not in ("messages", "conversation")] + ["trace_json"]
    fieldsets = [
        (
            _("Raw data"),
            {
                "classes": ["collapse"],
                "fields": [f.name for f in Run._meta.fields if f.name not in ("messages", "conversation")]
                + ["trace_json"],
            },
        )
    ]

    def may_cancel(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("agents.change_run"))

    @admin.display(description=_("created"), ordering="created_at")
    def created(self, obj: Run) -> str:
        return when_cell(obj.created_at)

    @admin.display(description=_("status"), ordering="status")
    def status_badge(self, obj: Run) -> str:
        badge = format_html('<span class="run-status run-status-{}">{}</span>', obj.status, obj.get_status_display())
        if not obj.error_code:
            return badge
        return format_html(
            '{}<code class="cell-code" title="{}">{}</code>',
            badge,
            reason_label(obj.error_code),
            breakable(obj.error_code),
        )

    @admin.display(description=_("query"))
    def short_query(self, obj: Run) -> str:
        return obj.query[:80]

    @admin.display(description=_("total (ms)"))
    def total_ms(self, obj: Run) -> Any:
        total = (obj.timings or {}).get("total_ms")
        return f"{total:,.1f}" if isinstance(total, int | float) else "—"

    @admin.display(description=_("trace (raw)"))
    def trace_json(self, obj: Run) -> str:
        return format_html('<pre style="white-space:pre-wrap">{}</pre>', _pretty(obj.messages))

    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        return [
            path("<path:object_id>/cancel/", wrap(self.cancel_view), name="agents_run_cancel"),
            path("<path:object_id>/timeline/", wrap(self.timeline_view), name="agents_run_timeline"),
            path("<path:object_id>/events/", wrap(self.events_view), name="agents_run_events"),
            *super().get_urls(),
        ]

    def _run_or_404(self, request: HttpRequest, object_id: str) -> Run:
        if not self.has_view_permission(request):
            raise PermissionDenied
        run = self.get_object(request, object_id)
        if run is None:
            raise Http404(gettext("Run not found."))
        return run

    def timeline_context(self, request: HttpRequest, run: Run) -> dict[str, Any]:
        return {
            "run": run,
            "timeline": run_timeline(run),
            "finished": run.is_finished,
            "may_cancel": self.may_cancel(request) and run.status in CANCELLABLE,
            "cancel_url": reverse("admin:agents_run_cancel", args=[run.pk], current_app=self.admin_site.name),
            "timeline_url": reverse("admin:agents_run_timeline", args=[run.pk], current_app=self.admin_site.name),
            "events_stream_url": reverse("admin:agents_run_events", args=[run.pk], current_app=self.admin_site.name),
            "audit_events_url": _events_url(self.admin_site, run.pk),
            "pending_approvals": [
                {
                    "approval": a,
                    "url": reverse("admin:agents_approval_change", args=[a.pk], current_app=self.admin_site.name),
                }
                for a in run.approvals.filter(status=Approval.Status.PENDING).order_by("created_at")
            ],
        }

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        run = self.get_object(request, object_id)
        extra = dict(extra_context or {})
        if run is not None and self.has_view_permission(request, run):
            extra.update(self.timeline_context(request, run))
        return super().change_view(request, object_id, form_url, extra)

    def timeline_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """The timeline alone, as the run page shows it: what the live page fetches after each event."""
        run = self._run_or_404(request, object_id)
        return TemplateResponse(request, "admin/agents/run/timeline.html", self.timeline_context(request, run))

    def events_view(self, request: HttpRequest, object_id: str) -> HttpResponseBase:
        """The run's event stream (server-sent events) for someone logged in to the admin who may view runs; it
        re-checks at intervals that they still may, and closes when the run has finished."""
        run = self._run_or_404(request, object_id)
        user_id = request.user.pk
        feed = RunEventFeed(
            run_id=run.pk,
            after=_resume_point(request),
            poll_s=float(api_setting("PLATFORM_SSE_POLL_S")),
            keepalive_s=float(api_setting("PLATFORM_SSE_KEEPALIVE_S")),
            max_s=float(api_setting("PLATFORM_SSE_MAX_S")),
            still_authorized=lambda: _staff_may_still_view(user_id),
            auth_recheck_s=min(15.0, float(api_setting("PLATFORM_SSE_AUTH_RECHECK_S"))),
        )
        no_slot = StreamSlot(cache_key="", token="")  # streams per API key are capped; a session has none
        stream = stream_async(feed, no_slot) if isinstance(request, ASGIRequest) else stream_sync(feed, no_slot)
        response = StreamingHttpResponse(stream, content_type="text/event-stream; charset=utf-8")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"
        return response

    def cancel_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        run = self._run_or_404(request, object_id)
        if request.method != "POST" or not self.may_cancel(request):
            raise PermissionDenied
        try:
            run_cancel(run=run, actor=f"admin:{request.user.get_username()}")
            self.message_user(request, gettext("The run was cancelled."), messages.SUCCESS)
        except ApplicationError as exc:
            self.message_user(request, exc.message, messages.WARNING)
        return HttpResponseRedirect(reverse("admin:agents_run_change", args=[run.pk], current_app=self.admin_site.name))


@admin.register(Approval)
class ApprovalAdmin(WritesRefusedMixin, admin.ModelAdmin):
    """Approvals, pending first (oldest first among them: closest to expiring), with their masked arguments. A
    decision is taken on the approval's page: Approve, or Reject with a reason, each confirmed on a page of its
    own; nobody edits or deletes an approval."""

    change_form_template = "admin/agents/approval/change_form.html"
    list_display = [
        "created_at",
        "status_badge",
        "call",
        "masked_args",
        "run_link",
        "requested_by",
        "decided_by",
        "reason_text",
        "expires",
    ]
    list_display_links = ["created_at"]
    list_filter = ["status", "mcp_id", "tool"]
    search_fields = ["tool", "run__id"]
    readonly_fields = [f.name for f in Approval._meta.fields if f.name != "exact_args"]
    list_select_related = ["run__agent"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_ordering(self, request: HttpRequest) -> list[Any]:
        pending = Case(
            When(status=Approval.Status.PENDING, then=Value(0)), default=Value(1), output_field=IntegerField()
        )
        pending_since = Case(When(status=Approval.Status.PENDING, then=F("created_at")), default=None)
        return [pending.asc(), pending_since.asc(nulls_last=True), F("created_at").desc()]

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        return {}  # decisions are taken one at a time, with the arguments in view (the approval's page)

    @admin.display(description=_("status"), ordering="status")
    def status_badge(self, obj: Approval) -> str:
        return format_html(
            '<span class="approval-status approval-status-{}">{}</span>', obj.status, obj.get_status_display()
        )

    @admin.display(description=_("reason"), ordering="reason")
    def reason_text(self, obj: Approval) -> str:
        return approval_reason_text(obj.reason)

    @admin.display(description=_("expires"), ordering="expires_at")
    def expires(self, obj: Approval) -> str:
        """When a pending approval expires; an ended one's "expires" is no time to come."""
        return when_cell(obj.expires_at) if obj.status == Approval.Status.PENDING else "—"

    @admin.display(description=_("call"))
    def call(self, obj: Approval) -> str:
        return f"{obj.mcp_id}.{obj.tool}"

    @admin.display(description=_("arguments (masked)"))
    def masked_args(self, obj: Approval) -> str:
        text = json.dumps(obj.args, ensure_ascii=False)
        return format_html("<code>{}</code>", text if len(text) <= 200 else text[:199] + "…")

    @admin.display(description=_("run"), ordering="run")
    def run_link(self, obj: Approval) -> str:
        url = reverse("admin:agents_run_change", args=[obj.run_id], current_app=self.admin_site.name)
        return format_html('<a href="{}">{} {}</a>', url, obj.run.agent.slug, str(obj.run_id)[:8])

    def get_urls(self) -> list[URLPattern]:
        decide = self.admin_site.admin_view(self.decide_view)
        return [
            path("<path:object_id>/decide/<str:decision>/", decide, name="agents_approval_decide"),
            *super().get_urls(),
        ]

    def may_decide(self, request: HttpRequest, approval: Approval) -> bool:
        return bool(self.has_change_permission(request, approval)) and approval.status == Approval.Status.PENDING

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if request.method == "POST":
            raise PermissionDenied  # nothing on an approval is edited; decisions go through decide_view
        approval = self.get_object(request, object_id)
        extra = dict(extra_context or {})
        extra.update(show_save=False, show_save_and_continue=False, show_save_and_add_another=False, show_delete=False)
        if approval is not None and self.has_view_permission(request, approval):
            extra.update(self._approval_context(request, approval))
        return super().change_view(request, object_id, form_url, extra)

    def _approval_context(self, request: HttpRequest, approval: Approval) -> dict[str, Any]:
        name = self.admin_site.name
        return {
            "approval": approval,
            "reason_text": approval_reason_text(approval.reason),
            "args_pretty": _pretty(approval.args) or "{}",
            "arg_rows": argument_rows(approval.args),
            "may_decide": self.may_decide(request, approval),
            "asked_by_the_model": asked_by_the_model(approval),
            "approve_url": reverse("admin:agents_approval_decide", args=[approval.pk, "approve"], current_app=name),
            "reject_url": reverse("admin:agents_approval_decide", args=[approval.pk, "reject"], current_app=name),
            "run_url": reverse("admin:agents_run_change", args=[approval.run_id], current_app=name),
            "timeline": run_timeline(approval.run),
            "audit_events_url": _events_url(self.admin_site, approval.run_id),
        }

    def decide_view(self, request: HttpRequest, object_id: str, decision: str) -> HttpResponse:
        """GET: the confirmation (the call, its masked arguments, a reason: required to reject). POST: the
        decision, through ``approval_decide``; then the run's page, where the resumed run can be followed."""
        if decision not in ("approve", "reject"):
            raise Http404
        approval = self.get_object(request, object_id)
        if approval is None:
            raise Http404(gettext("Approval not found."))
        if not self.has_change_permission(request, approval):
            raise PermissionDenied
        error = ""
        reason = request.POST.get("reason", "").strip() if request.method == "POST" else ""
        if request.method == "POST":
            if decision == "reject" and not reason:
                error = gettext("Give a reason for rejecting: the model and the caller are told it.")
            else:
                try:
                    approval_decide(
                        run=approval.run,
                        approval_id=str(approval.pk),
                        decision=decision,
                        actor=f"admin:{request.user.get_username()}",
                        reason=reason,
                    )
                except ApplicationError as exc:
                    self.message_user(request, exc.message, messages.ERROR)
                else:
                    done = gettext("Approved: the run resumes and makes the call once.")
                    if decision == "reject":
                        done = gettext("Rejected: the run resumes and the model is told why.")
                    self.message_user(request, done, messages.SUCCESS)
                run_url = reverse("admin:agents_run_change", args=[approval.run_id], current_app=self.admin_site.name)
                if not error:
                    return HttpResponseRedirect(run_url)
        context = {
            **self.admin_site.each_context(request),
            **self._approval_context(request, approval),
            "title": gettext("Approve this call?") if decision == "approve" else gettext("Reject this call?"),
            "opts": self.model._meta,
            "decision": decision,
            "reason": reason,
            "error": error,
            "change_url": reverse("admin:agents_approval_change", args=[approval.pk], current_app=self.admin_site.name),
        }
        return TemplateResponse(request, "admin/agents/approval/decide.html", context)
