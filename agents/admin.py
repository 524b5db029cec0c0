"""Admin for agents, rules, runs and API keys. A run's page shows its whole trace in order."""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext_lazy as _

from agent_platform.errors import ApplicationError
from agents.approvals import approval_decide
from agents.models import Agent, ApiKey, Approval, DeterministicRule, Run
from agents.selectors import tool_name_conflicts


class DeterministicRuleInline(admin.TabularInline):
    model = DeterministicRule
    extra = 0
    fields = ["order", "name", "enabled", "server", "tool_name", "when", "params"]


class AgentForm(forms.ModelForm):
    class Meta:
        model = Agent
        fields = [
            "slug",
            "name",
            "enabled",
            "mode",
            "system_prompt",
            "deterministic_instruction",
            "answer_template",
            "model_provider",
            "model_id",
            "model_params",
            "servers",
            "max_iterations",
        ]

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
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


@admin.register(Agent)
class AgentAdmin(admin.ModelAdmin):
    form = AgentForm
    list_display = ["slug", "name", "enabled", "model_provider", "model_id", "mode"]
    list_filter = ["enabled", "model_provider", "mode"]
    search_fields = ["slug", "name"]
    filter_horizontal = ["servers"]
    inlines = [DeterministicRuleInline]


@admin.register(DeterministicRule)
class DeterministicRuleAdmin(admin.ModelAdmin):
    list_display = ["order", "name", "agent", "server", "tool_name", "enabled"]
    list_display_links = ["name"]
    list_filter = ["enabled", "agent", "server"]
    search_fields = ["name", "tool_name"]
    ordering = ["order", "id"]


def _pretty(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=2)


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ["created_at", "agent", "status", "short_query", "error_code", "total_ms"]
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
        rows = []
        for step in obj.messages or []:
            kind = step.get("type", "")
            if kind == "rule":
                detail = (
                    _("matched → %(params)s") % {"params": _pretty(step.get("params"))}
                    if step.get("matched")
                    else _("skipped: %(reason)s") % {"reason": step.get("reason")}
                )
                rows.append((_("rule"), step.get("rule", ""), detail))
            elif kind == "deterministic_call":
                rows.append(
                    (
                        _("deterministic call"),
                        f"{step['mcp_id']}.{step['tool']}({_pretty(step['args'])})",
                        f"ok={step['ok']} {step.get('error') or ''}\n{_pretty(step.get('value') if step['ok'] else step.get('message'))}",
                    )
                )
            elif kind == "system":
                rows.append((_("system message"), "", step.get("content", "")))
            elif kind == "human":
                rows.append((_("user"), "", step.get("content", "")))
            elif kind == "ai":
                calls = "\n".join(f"→ {c['name']}({_pretty(c['args'])})" for c in step.get("tool_calls") or [])
                rows.append((_("model"), calls, step.get("content", "")))
            elif kind == "tool":
                rows.append((_("tool result"), step.get("name", ""), step.get("content", "")))
        return format_html(
            '<table style="width:100%"><tbody>{}</tbody></table>',
            format_html_join(
                "",
                '<tr><th style="width:12em">{}</th><td><code>{}</code></td><td><pre style="white-space:pre-wrap;margin:0">{}</pre></td></tr>',
                rows,
            ),
        )


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ["name", "prefix", "created_at", "last_used_at", "revoked_at"]
    readonly_fields = ["prefix", "created_at", "last_used_at"]
    fields = ["name", "prefix", "agents", "created_at", "last_used_at", "revoked_at"]
    filter_horizontal = ["agents"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        # Keys are issued with `manage.py create_api_key`, which shows the key once.
        return False


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

    @admin.action(description=_("Approve the selected calls (the runs resume and execute them once)"))
    def approve(self, request: HttpRequest, queryset: Any) -> None:
        self._decide(request, queryset, "approve")

    @admin.action(description=_("Reject the selected calls (the model is told)"))
    def reject(self, request: HttpRequest, queryset: Any) -> None:
        self._decide(request, queryset, "reject")
