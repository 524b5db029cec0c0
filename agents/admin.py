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
from agents.models import Agent, ApiKey, DeterministicRule, registered_flow_graphs, scripted_model_allowed
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
