"""Admin for agents, rules, runs and API keys. A run's page shows its whole trace in order."""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from agent_platform.errors import ApplicationError
from agents.api.throttling import parse_rate
from agents.approvals import approval_decide
from agents.models import (
    Agent,
    ApiKey,
    Approval,
    DeterministicRule,
    Run,
    registered_flow_graphs,
    scripted_model_allowed,
)
from agents.rule_form import DeterministicRuleForm
from agents.selectors import tool_name_conflicts
from agents.services import (
    agent_create,
    agent_delete,
    agent_update,
    api_key_delete,
    api_key_revoke,
    api_key_update,
    deterministic_rule_create,
    deterministic_rule_delete,
    deterministic_rule_update,
)
from audit.admin_changes import ADMIN_VIA, ServiceAdminMixin, form_data
from mcpregistry.models import McpServer


class DeterministicRuleInline(admin.TabularInline):
    """The rules of an agent as JSON (for power users); each row's link opens the structured rule editor."""

    model = DeterministicRule
    extra = 0
    show_change_link = True
    fields = ["order", "name", "enabled", "server", "tool_name", "when", "params"]


class AgentForm(forms.ModelForm):
    """Every setting of an agent; the page shows those of its mode (``agents/static/agents/agent_form.js``)."""

    flow_graph = forms.ChoiceField(
        label=_("flow graph"),
        required=False,
        help_text=_("Flow mode: the registered graph the agent runs (PLATFORM_FLOW_GRAPHS adds your own)."),
    )

    class Meta:
        model = Agent
        fields = [
            "slug",
            "name",
            "enabled",
            "mode",
            "flow_graph",
            "system_prompt",
            "deterministic_instruction",
            "answer_from_deterministic",
            "answer_template",
            "no_match_answer",
            "language",
            "model_provider",
            "model_id",
            "model_params",
            "servers",
            "max_iterations",
            "time_limit_s",
            "caller_approves_model_writes",
        ]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        provider = self.fields.get("model_provider")
        if provider is not None and not scripted_model_allowed():
            provider.choices = [c for c in provider.choices if c[0] != Agent.Provider.SCRIPTED]  # type: ignore[attr-defined]
        graphs = [("", "—"), *((path, path) for path in registered_flow_graphs())]
        if self.instance.flow_graph and self.instance.flow_graph not in dict(graphs):
            graphs.append((self.instance.flow_graph, self.instance.flow_graph))
        self.fields["flow_graph"].choices = graphs
        # A post that leaves these out (a script written before they were on the form) keeps their values.
        for name in ("time_limit_s", "language"):
            self.fields[name].required = False

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        for name in ("time_limit_s", "language"):
            if cleaned.get(name) in (None, ""):
                cleaned[name] = getattr(self.instance, name)
        servers = cleaned.get("servers")
        if servers is not None:
            conflicts = tool_name_conflicts(list(servers))
            if conflicts:
                raise forms.ValidationError(
                    _(
                        "These servers expose the same tool name: %(conflicts)s. Give one of them a tool name "
                        "prefix, or disable the duplicate tool."
                    )
                    % {"conflicts": "; ".join(f"{name} ({', '.join(ids)})" for name, ids in conflicts.items())}
                )
        return cleaned


def _rule_save(*, obj: DeterministicRule, actor: Any, via: str, creating: bool) -> None:
    if creating:
        deterministic_rule_create(actor=actor, via=via, data=form_data(obj))
    else:
        deterministic_rule_update(rule=obj, actor=actor, via=via)


def _rule_delete(*, obj: DeterministicRule, actor: Any, via: str) -> None:
    deterministic_rule_delete(rule=obj, actor=actor, via=via)


@admin.register(Agent)
class AgentAdmin(ServiceAdminMixin, admin.ModelAdmin):
    form = AgentForm
    list_display = ["slug", "name", "enabled", "model_provider", "model_id", "mode"]
    list_filter = ["enabled", "model_provider", "mode"]
    search_fields = ["slug", "name"]
    filter_horizontal = ["servers"]
    inlines = [DeterministicRuleInline]
    fieldsets = [
        (None, {"fields": ["slug", "name", "enabled", "mode", "servers", "time_limit_s", "language", "model_params"]}),
        (_("flow graph"), {"fields": ["flow_graph"], "classes": ["agent-mode-flow"]}),
        (
            _("model"),
            {
                "fields": ["model_provider", "model_id", "max_iterations", "system_prompt"],
                "classes": ["agent-mode-react"],
            },
        ),
        (
            _("deterministic results and answers"),
            {
                "fields": [
                    "deterministic_instruction",
                    "answer_from_deterministic",
                    "answer_template",
                    "no_match_answer",
                    "caller_approves_model_writes",
                ],
                "classes": ["agent-mode-react"],
            },
        ),
    ]

    class Media:
        js = ["agents/agent_form.js"]

    inline_services = {DeterministicRule: (_rule_save, _rule_delete)}

    def service_save(self, *, obj: Agent, actor: Any, m2m: dict[str, list[Any]], change: bool) -> None:
        if change:
            agent_update(agent=obj, actor=actor, via=ADMIN_VIA, servers=m2m.get("servers"))
        else:
            saved = agent_create(actor=actor, via=ADMIN_VIA, data=form_data(obj), servers=m2m.get("servers", []))
            obj.pk = saved.pk
            obj._state.adding = False

    def service_delete(self, *, obj: Agent, actor: Any) -> None:
        agent_delete(agent=obj, actor=actor, via=ADMIN_VIA)


@admin.register(DeterministicRule)
class DeterministicRuleAdmin(ServiceAdminMixin, admin.ModelAdmin):
    list_display = ["order", "name", "agent", "server", "tool_name", "enabled"]
    list_display_links = ["name"]
    list_filter = ["enabled", "agent", "server"]
    search_fields = ["name", "tool_name"]
    ordering = ["order", "id"]
    form = DeterministicRuleForm
    fieldsets = [
        (None, {"fields": ["agent", "name", "order", "enabled", "server", "tool_name"]}),
        (_("conditions (all that are given must hold)"), {"fields": ["when"]}),
        (_("parameters"), {"fields": ["params", "answer_template"]}),
        (_("code rule (instead of the above)"), {"fields": ["code"], "classes": ["collapse"]}),
        (_("advanced: the rule as JSON"), {"fields": ["rule_json"], "classes": ["collapse"]}),
    ]

    class Media:
        css = {"all": ["mcpregistry/editors.css"]}
        js = ["agents/rule_editor.js"]

    def render_change_form(self, request: HttpRequest, context: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        form = context["adminform"].form
        context["tool_catalogue"] = {
            "servers": {str(s.pk): s.mcp_id for s in McpServer.objects.all()},
            "tools": getattr(form, "catalogue", {}),
        }
        return super().render_change_form(request, context, *args, **kwargs)

    def service_save(self, *, obj: DeterministicRule, actor: Any, m2m: dict[str, list[Any]], change: bool) -> None:
        if change:
            deterministic_rule_update(rule=obj, actor=actor, via=ADMIN_VIA)
        else:
            saved = deterministic_rule_create(actor=actor, via=ADMIN_VIA, data=form_data(obj))
            obj.pk = saved.pk
            obj._state.adding = False

    def service_delete(self, *, obj: DeterministicRule, actor: Any) -> None:
        deterministic_rule_delete(rule=obj, actor=actor, via=ADMIN_VIA)


def _pretty(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=2)


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ["created_at", "agent", "status", "short_query", "error_code", "tool_failures", "total_ms"]
    list_filter = ["status", "agent"]
    search_fields = ["id", "query", "answer"]
    date_hierarchy = "created_at"
    readonly_fields = [f.name for f in Run._meta.fields if f.name != "messages"] + ["trace"]
    exclude = ["messages"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description=_("query"))
    def short_query(self, obj: Run) -> str:
        return obj.query[:80]

    @admin.display(description=_("total (ms)"))
    def total_ms(self, obj: Run) -> Any:
        return (obj.timings or {}).get("total_ms")

    @admin.display(description=_("trace"))
    def trace(self, obj: Run) -> str:
        rows = run_trace_rows(obj)
        events_url = f"{reverse('admin:audit_auditevent_changelist', current_app=self.admin_site.name)}?run={obj.pk}"
        return format_html(
            '<p><a href="{}">{}</a></p><table style="width:100%"><thead><tr><th>#</th><th>{}</th><th>{}</th>'
            "<th>{}</th><th>{}</th></tr></thead><tbody>{}</tbody></table>",
            events_url,
            _("All audit events of this run"),
            _("step"),
            _("what"),
            _("details"),
            _("outcome"),
            format_html_join(
                "",
                '<tr><td>{}</td><th style="width:10em">{}</th><td><code style="white-space:pre-wrap">{}</code></td>'
                '<td><pre style="white-space:pre-wrap;margin:0">{}</pre></td><td style="color:{};width:14em;white-space:pre-line">{}</td></tr>',
                ((n, *row[:3], _OUTCOME_COLOURS[row[4]], row[3]) for n, row in enumerate(rows, start=1)),
            ),
        )


TraceRow = tuple[str, str, str, str, bool | None]
"""A step of a run's trace as shown: its label, what it concerns, its details, its outcome, and whether that
outcome was a success (None: neither)."""

_OUTCOME_COLOURS = {True: "green", False: "#ba2121", None: "inherit"}


def _call_outcome(events: list[Any], step: dict[str, Any] | None = None) -> tuple[str, bool | None]:
    """A tool call's outcome as the audit recorded it (its last attempt, the attempts and their latency), or,
    where no event is found, as the trace kept it."""
    if not events:
        if step is None:
            return str(_("not audited")), None
        ok = bool(step.get("ok"))
        return (str(_("ok")) if ok else str(_("failed: %(reason)s") % {"reason": step.get("error") or "?"})), ok
    last = events[-1]
    sent = [e for e in events if e.attempt >= 1]
    text = str(_("ok")) if last.ok else str(_("failed: %(reason)s") % {"reason": last.reason})
    if last.reason == "memo:hit":
        text = str(_("ok (reused within the run)"))
    if sent:
        latency = sum(e.latency_ms or 0.0 for e in sent)
        text += "\n" + str(_("%(n)d attempt(s), %(ms).1f ms") % {"n": len(sent), "ms": latency})
    return text, last.ok


def _approval_outcome(approval: Approval) -> tuple[str, bool | None]:
    text = approval.get_status_display()
    if approval.decided_by:
        text += "\n" + str(_("by %(who)s") % {"who": approval.decided_by})
    if approval.reason:
        text += f"\n{approval.reason}"
    # outcome_unknown is neither: the call went out and nobody knows whether it took effect.
    ok = {"approved": True, "executed": True, "executing": None, "rejected": False, "expired": False}
    return text, ok.get(approval.status)


def run_trace_rows(run: Run) -> list[TraceRow]:
    """A run's whole trace in order: rule decisions, deterministic calls, the messages of the model loop with
    each tool call's audited outcome, approvals and their decisions, and the answer (or error) last."""
    calls: dict[str, list[Any]] = {}
    for event in run.audit_events.filter(action="tool.call").order_by("id"):
        calls.setdefault(event.call_id, []).append(event)
    approvals = list(run.approvals.order_by("created_at"))
    by_id = {str(a.pk): a for a in approvals}
    by_call = {a.call_id: a for a in approvals if a.call_id}
    shown: set[str] = set()
    rows: list[TraceRow] = []
    for step in run.messages or []:
        kind = step.get("type", "")
        if kind == "rule":
            target = f"{step.get('mcp_id', '')}.{step.get('tool', '')}".strip(".")
            matched = bool(step.get("matched"))
            detail = _pretty(step.get("params")) if matched else str(step.get("reason") or "")
            verdict = str(_("matched")) if matched else str(_("skipped"))
            rows.append((str(_("rule decision")), f"{step.get('rule', '')} → {target}", detail, verdict, None))
        elif kind == "deterministic_call":
            outcome, ok = _call_outcome(calls.get(f"rule:{step.get('rule_id')}", []), step)
            detail = (
                _pretty(step.get("value")) if step.get("ok") else str(step.get("message") or step.get("error") or "")
            )
            what = f"{step.get('mcp_id', '')}.{step.get('tool', '')}({_pretty(step.get('args'))})"
            rows.append((str(_("deterministic call")), what, detail, outcome, ok))
        elif kind == "approval":
            approval = by_id.get(str(step.get("approval_id")))
            outcome, ok = _approval_outcome(approval) if approval else (str(_("pending")), None)
            if approval:
                shown.add(str(approval.pk))
            rows.append(
                (str(_("approval requested")), f"{step.get('tool', '')}({_pretty(step.get('args'))})", "", outcome, ok)
            )
        elif kind == "system":
            rows.append((str(_("system message")), "", str(step.get("content", "")), "", None))
        elif kind == "human":
            rows.append((str(_("user query")), "", str(step.get("content", "")), "", None))
        elif kind == "ai":
            wanted = "\n".join(f"→ {c['name']}({_pretty(c['args'])})" for c in step.get("tool_calls") or [])
            rows.append((str(_("model turn")), wanted, _text(step.get("content", "")), "", None))
        elif kind == "tool":
            call_id = str(step.get("tool_call_id") or "")
            outcome, ok = _call_outcome(calls.get(call_id, []))
            approval = by_call.get(call_id)
            if approval is not None:
                decision, _ok = _approval_outcome(approval)
                outcome = f"{outcome}\n{_('approval')}: {decision}"
                shown.add(str(approval.pk))
            rows.append((str(_("tool call")), str(step.get("name", "")), _text(step.get("content", "")), outcome, ok))
        else:
            rows.append((kind or "?", "", _pretty(step), "", None))
    for approval in approvals:
        if str(approval.pk) not in shown:
            outcome, ok = _approval_outcome(approval)
            rows.append(
                (str(_("approval")), f"{approval.mcp_id}.{approval.tool}({_pretty(approval.args)})", "", outcome, ok)
            )
    if run.error_code:
        rows.append((str(_("error")), run.error_code, run.error_message, run.get_status_display(), False))
    elif run.answer:
        rows.append((str(_("answer")), "", run.answer, run.get_status_display(), True))
    else:
        rows.append((str(_("status")), "", "", run.get_status_display(), None))
    return rows


def _text(content: Any) -> str:
    return content if isinstance(content, str) else _pretty(content)


class ApiKeyForm(forms.ModelForm):
    class Meta:
        model = ApiKey
        fields = ["name", "agents", "rate"]

    def clean_rate(self) -> str:
        rate = self.cleaned_data["rate"].strip()
        if rate and parse_rate(rate) is None:
            raise forms.ValidationError(_("Enter a rate like 60/min, 1000/hour or 5/10s."))
        return rate


@admin.register(ApiKey)
class ApiKeyAdmin(ServiceAdminMixin, admin.ModelAdmin):
    form = ApiKeyForm
    list_display = ["name", "prefix", "rate", "created_at", "last_used_at", "revoked_at"]
    list_filter = [("revoked_at", admin.EmptyFieldListFilter)]
    readonly_fields = ["prefix", "created_at", "last_used_at", "revoked_at"]
    fields = ["name", "prefix", "agents", "rate", "created_at", "last_used_at", "revoked_at"]
    filter_horizontal = ["agents"]
    actions = ["revoke"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        # Keys are issued with `manage.py create_api_key`, which shows the key once.
        return False

    def service_save(self, *, obj: ApiKey, actor: Any, m2m: dict[str, list[Any]], change: bool) -> None:
        api_key_update(api_key=obj, actor=actor, via=ADMIN_VIA, agents=m2m.get("agents"))

    def service_delete(self, *, obj: ApiKey, actor: Any) -> None:
        api_key_delete(api_key=obj, actor=actor, via=ADMIN_VIA)

    @admin.action(description=_("Revoke the selected API keys"), permissions=["change"])
    def revoke(self, request: HttpRequest, queryset: Any) -> None:
        revoked = sum(api_key_revoke(api_key=key, actor=request.user, via=ADMIN_VIA) for key in queryset)
        self.message_user(
            request, ngettext("%(n)d key revoked.", "%(n)d keys revoked.", revoked) % {"n": revoked}, messages.SUCCESS
        )


@admin.register(Approval)
class ApprovalAdmin(admin.ModelAdmin):
    list_display = ["created_at", "status", "mcp_id", "tool", "run", "requested_by", "decided_by", "expires_at"]
    list_filter = ["status", "mcp_id", "tool"]
    search_fields = ["tool", "run__id"]
    readonly_fields = [f.name for f in Approval._meta.fields]
    actions = ["approve", "reject"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def _decide(self, request: HttpRequest, queryset: Any, decision: str) -> None:
        done = 0
        for approval in queryset.select_related("run"):
            try:
                approval_decide(
                    run=approval.run,
                    approval_id=str(approval.pk),
                    decision=decision,
                    actor=f"admin:{request.user.get_username()}",
                    reason=str(_("decided in the admin")),
                )
                done += 1
            except ApplicationError as exc:
                self.message_user(request, f"{approval}: {exc.message}", level=messages.WARNING)
        if done:
            self.message_user(request, _("%(n)d approval(s) decided; their runs resume.") % {"n": done})

    @admin.action(
        description=_("Approve the selected calls (the runs resume and execute them once)"), permissions=["change"]
    )
    def approve(self, request: HttpRequest, queryset: Any) -> None:
        self._decide(request, queryset, "approve")

    @admin.action(description=_("Reject the selected calls (the model is told)"), permissions=["change"])
    def reject(self, request: HttpRequest, queryset: Any) -> None:
        self._decide(request, queryset, "reject")
