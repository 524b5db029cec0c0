"""Admin for agents, rules and API keys. Runs and approvals have their pages in ``agents.admin_runs``."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from agents import admin_runs  # noqa: F401  (registers RunAdmin and ApprovalAdmin)
from agents.api.throttling import parse_rate
from agents.models import Agent, ApiKey, DeterministicRule, scripted_model_allowed
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
            "caller_approves_model_writes",
        ]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        provider = self.fields.get("model_provider")
        if provider is not None and not scripted_model_allowed():
            provider.choices = [c for c in provider.choices if c[0] != Agent.Provider.SCRIPTED]  # type: ignore[attr-defined]

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

    def service_save(self, *, obj: DeterministicRule, actor: Any, m2m: dict[str, list[Any]], change: bool) -> None:
        if change:
            deterministic_rule_update(rule=obj, actor=actor, via=ADMIN_VIA)
        else:
            saved = deterministic_rule_create(actor=actor, via=ADMIN_VIA, data=form_data(obj))
            obj.pk = saved.pk
            obj._state.adding = False

    def service_delete(self, *, obj: DeterministicRule, actor: Any) -> None:
        deterministic_rule_delete(rule=obj, actor=actor, via=ADMIN_VIA)


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
