"""Admin for agents, rules and API keys. Runs and approvals have their pages in ``agents.admin_runs``."""

from __future__ import annotations

import re
import secrets
import unicodedata
from typing import Any

import regex  # type: ignore[import-untyped]
from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.widgets import AdminBigIntegerFieldWidget
from django.core.exceptions import NON_FIELD_ERRORS, PermissionDenied, ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.translation import gettext, ngettext, pgettext, pgettext_lazy
from django.utils.translation import gettext_lazy as _
from pydantic import ValidationError as PydanticValidationError

from agent_platform.json import bounded_json_overrides
from agent_platform.model_choices import InRangeModelMultipleChoiceField, key_in_range
from agent_platform.text import nfc
from agents import (
    admin_runs,  # noqa: F401  (registers RunAdmin and ApprovalAdmin)
    admin_versions,  # registers AgentVersionAdmin, AgentArmAdmin, ShadowComparisonAdmin; says what publish did
)
from agents.agent_settings_form import (
    McpContextWidget,
    ToolSelectionWidget,
    agent_tool_names,
    agent_tool_tags,
    context_problems,
    selection_problems,
)
from agents.api.throttling import parse_rate
from agents.budgets import (
    BUDGET_OWNER_FIELDS,
    MICROS_PER_USD,
    budget_create,
    budget_delete,
    budget_runs_spend,
    budget_state,
    budget_update,
    budgets_with_current_usage,
    model_price_create,
    model_price_delete,
    model_price_update,
    usd_text,
)
from agents.deterministic import WhenSpec
from agents.models import (
    Agent,
    AgentVersion,
    ApiKey,
    Budget,
    DeterministicRule,
    ModelPrice,
    Run,
    registered_flow_graphs,
    scripted_model_allowed,
    tool_choice_name,
)
from agents.rule_form import DeterministicRuleForm, saved_elsewhere_text
from agents.rule_summary import conditions_html, parameters_html, target_html
from agents.selectors import rules_calling, servers_leaving, tool_name_conflict_problem
from agents.services import (
    agent_create,
    agent_delete,
    agent_update,
    agent_version_publish,
    agents_publish_held_on_save,
    api_key_create,
    api_key_delete,
    api_key_revoke,
    api_key_update,
    api_key_widened,
    api_key_widening_refused,
    api_key_with_runs_refused,
    deterministic_rule_create,
    deterministic_rule_delete,
    deterministic_rule_update,
    keys_left_without_agents,
    live_version_clearing_refused,
    publish_on_save_deferred,
    publish_on_save_digests,
    unbinding_refused,
    version_unrunnable_problem,
)
from agents.versions import content_digest, version_content
from audit.admin_changes import ADMIN_VIA, ServiceAdminMixin, form_data
from audit.models import AuditEvent
from mcpregistry.binding_policy import readable_variables_text
from mcpregistry.contracts import pydantic_message
from mcpregistry.crypto import readable
from mcpregistry.list_fields import (
    EditedJSONField,
    KeyValueLinesWidget,
    changed_texts_problems,
    object_from_path_lines,
    path_lines,
)
from mcpregistry.models import McpServer


class ModelParamsWidget(KeyValueLinesWidget):
    """An agent's model parameters as ``KEY=value`` lines, a nested one by its path (``temperature=0.2``,
    ``retry.max_attempts=3``, ``retry.on=throttled, timeout``, ``guardrail.id=…``, ``flow.mcp_id=…``); what lines
    cannot carry back exactly (a flow's script of turns, say) is edited as JSON."""

    rows = 4
    placeholder = "temperature=0.2\nmax_tokens=1024\nretry.max_attempts=3"

    def as_lines(self, value: Any) -> str | None:
        if value == {}:
            return ""  # nothing set: no lines (they read back as the empty object)
        lines = path_lines(value)
        if lines is None:
            return None  # the JSON box: flat lines would read back nested
        from typing import get_args

        from agents.providers import ModelErrorKind  # the providers' SDKs load when a page shows the lines

        retry = value.get("retry") if isinstance(value, dict) else None
        on = retry.get("on") if isinstance(retry, dict) else None
        if isinstance(on, list) and on and all(kind in get_args(ModelErrorKind) for kind in on):
            # The failure kinds, as words: retry.on=throttled, timeout
            words = f"retry.on={', '.join(on)}"
            lines = "\n".join(words if line.startswith("retry.on=") else line for line in lines.splitlines())
        return lines

    def from_lines(self, text: str) -> Any:
        params = object_from_path_lines(text)
        retry = params.get("retry")
        if isinstance(retry, dict) and isinstance(retry.get("on"), str):
            retry["on"] = [w.strip() for w in retry["on"].split(",") if w.strip()]
        return params


class RuleRowForm(forms.ModelForm):
    """A row of the agent's rules table. A problem with what the row does not show (its parameters no longer fit
    its tool's contract, say) is told on the row, naming the setting and where to fix it, instead of failing
    the page."""

    # The row's settings a page edits in place: each posts back, beside what is typed, what the page showed
    # (``show_hidden_initial``), so an untouched row on a page opened before another save is untouched, not a change
    # back to what it showed, and a row edited over a newer save is refused (``clean``).
    IN_PLACE = ("order", "name", "enabled")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name in self.IN_PLACE:
            # A post without what the page showed (a script's) compares with the stored row, as before.
            if name in self.fields and not (self.is_bound and self[name].html_initial_name not in self.data):
                self.fields[name].show_hidden_initial = True
        if "name" in self.fields:  # a Korean rule's name whole ("프리미엄 고객 자산 조회" was cut at "자신")
            self.fields["name"].widget.attrs.setdefault("size", 28)

    def clean(self) -> dict[str, Any]:
        cleaned: dict[str, Any] = super().clean()
        if self.instance.pk is None or not self.has_changed():
            return cleaned
        # Saved elsewhere since the page showed it: the stored row (read as this post came) differs from what the
        # page showed. A post without what it showed (a script) is taken as it comes, as before.
        changed = []
        for name in self.IN_PLACE:
            if name not in self.fields or not self.fields[name].show_hidden_initial:
                continue
            field = self.fields[name]
            shown = field.to_python(
                field.hidden_widget().value_from_datadict(self.data, self.files, self[name].html_initial_name)
            )
            if field.has_changed(getattr(self.instance, name), shown):
                changed.append(str(field.label))
        if changed:
            raise ValidationError(saved_elsewhere_text(changed))
        return cleaned

    def _post_clean(self) -> None:
        if self.instance.pk is not None and not self.has_changed():
            return  # an untouched row is not saved, so a stale rule does not stop the agent's own changes
        super()._post_clean()

    def add_error(self, field: str | None, error: Any) -> None:
        if field is None and isinstance(error, ValidationError) and hasattr(error, "error_dict"):
            elsewhere = {k: v for k, v in error.error_dict.items() if k != NON_FIELD_ERRORS and k not in self.fields}
            for name, problems in elsewhere.items():
                label = DeterministicRule._meta.get_field(name).verbose_name
                for problem in ValidationError(problems).messages:
                    super().add_error(
                        None,
                        gettext("%(setting)s: %(problem)s (change it in the rule editor)")
                        % {"setting": label, "problem": problem},
                    )
            error = ValidationError({k: v for k, v in error.error_dict.items() if k not in elsewhere})
            if not error.error_dict:
                return
        super().add_error(field, error)


class DeterministicRuleInline(admin.TabularInline):
    """The rules of an agent at a glance: what each calls, when and with what, in words (``agents/rule_summary``).
    Their order, name and switch are changed here; what they call, when and with what in the rule editor, which
    each row links to, as does the link that adds a rule for this agent (it checks the tool and its parameters,
    which a row of this table could not)."""

    # JSON nested too deeply, or with a number no JSON column stores (NaN, 1e400): refused at its field.
    formfield_overrides = bounded_json_overrides(finite=True)

    model = DeterministicRule
    form = RuleRowForm
    extra = 0
    show_change_link = True
    fields = ["order", "name", "enabled", "calls", "conditions", "parameters"]
    readonly_fields = ["calls", "conditions", "parameters"]
    template = "admin/agents/agent/rules_inline.html"

    class Media:
        css = {"all": ["agents/rule_summary.css"]}

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).select_related("server")

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # added in the rule editor (the link under the table)

    @admin.display(description=pgettext_lazy("rule", "calls"))
    def calls(self, rule: DeterministicRule) -> str:
        return target_html(rule)

    @admin.display(description=pgettext_lazy("rule", "when"))
    def conditions(self, rule: DeterministicRule) -> str:
        return conditions_html(rule)

    @admin.display(description=pgettext_lazy("rule", "with"))
    def parameters(self, rule: DeterministicRule) -> str:
        return parameters_html(rule)


# The agent's settings that change without its page (a publish or a roll back moves the live version,
# ``agent_version shadow`` the shadow): a save keeps them as stored where the page left them as it showed them.
MOVED_ELSEWHERE = ("live_version", "shadow_version", "shadow_sample_rate")


# The model parameters each network provider reads (``agents.providers.build_provider_model``); the offline model
# reads none of them. The scripted one (tests, demos) is not checked.
_NETWORK_PARAMS = ("temperature", "max_tokens", "top_p", "timeout_s", "tool_choice", "retry")
PROVIDER_PARAMS: dict[str, frozenset[str]] = {
    Agent.Provider.BEDROCK: frozenset({*_NETWORK_PARAMS, "region_name", "guardrail"}),
    Agent.Provider.OPENAI_COMPATIBLE: frozenset({*_NETWORK_PARAMS, "base_url", "stream"}),
    Agent.Provider.OFFLINE: frozenset(),
}

# The providers that send no model API key, and why.
KEYLESS_PROVIDERS = {
    Agent.Provider.BEDROCK: _(
        "Bedrock takes no model API key: it uses the worker's AWS credentials (its environment, profile or role). "
        "Leave this empty."
    ),
    Agent.Provider.OFFLINE: _("The offline model calls no model service and reads no API key. Leave this empty."),
}


class AgentForm(forms.ModelForm):
    """Every setting of an agent; the page shows those of its mode (``agents/static/agents/agent_form.js``)."""

    flow_graph = forms.ChoiceField(
        label=_("flow graph"),
        required=False,
        help_text=_("Flow mode: the registered graph the agent runs (PLATFORM_FLOW_GRAPHS adds your own)."),
    )
    # The model's API key is write-only: entered here, stored encrypted, never rendered back.
    new_model_api_key = forms.CharField(
        label=_("new model API key"),
        required=False,
        strip=True,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text=_("Leave empty to keep the stored key. Stored encrypted; never shown again."),
    )
    model_api_key_from_env = forms.CharField(
        label=_("or read the model API key from this worker variable"),
        required=False,
        max_length=200,
    )
    clear_model_api_key = forms.BooleanField(label=_("clear the stored model API key"), required=False)

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
            "publish_on_save",
            "shadow_version",
            "shadow_sample_rate",
        ]
        widgets = {
            "tool_selection": ToolSelectionWidget,
            "mcp_context": McpContextWidget,
            "model_params": ModelParamsWidget,
        }
        field_classes = {"model_params": EditedJSONField, "servers": InRangeModelMultipleChoiceField}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._settings_editors()
        from_env = self.fields.get("model_api_key_from_env")
        if from_env is not None:
            from_env.help_text = format_html(
                "{} {}",
                _("Read on the worker."),
                readable_variables_text(settings.PLATFORM_MCP_ENV_PASSTHROUGH),
            )
        params = self.fields.get("model_params")
        if params is not None:
            params.help_text = _(
                "KEY=value, a line each; a nested one by its path (retry.max_attempts=3). For Bedrock and "
                "OpenAI-compatible models: temperature (0–2), max_tokens, top_p (0–1), timeout_s (seconds, at most "
                "900), stream (true/false), tool_choice (auto, any or a tool's name), retry.max_attempts (1–10), "
                "retry.on (comma-separated: throttled, timeout, connection, unavailable, validation, auth, error; "
                "default: the first four), retry.backoff_s (0.5), retry.max_backoff_s (8); Bedrock also region_name "
                "and guardrail.id, guardrail.version (DRAFT), guardrail.trace (enabled, disabled or enabled_full); "
                "OpenAI-compatible also base_url. The offline model reads none of them. Flow mode: flow.mcp_id, the "
                "server its nodes call."
            )
        if "language" in self.fields:
            languages = list(settings.LANGUAGES)
            if self.instance.language and self.instance.language not in dict(languages):
                languages.append((self.instance.language, self.instance.language))  # shown as stored, refused on save
            self.fields["language"].widget = forms.Select(choices=languages)
        provider = self.fields.get("model_provider")
        if provider is not None and not scripted_model_allowed():
            provider.choices = [c for c in provider.choices if c[0] != Agent.Provider.SCRIPTED]  # type: ignore[attr-defined]
        graphs = [("", "—"), *((path, path) for path in registered_flow_graphs())]
        if self.instance.flow_graph and self.instance.flow_graph not in dict(graphs):
            graphs.append((self.instance.flow_graph, self.instance.flow_graph))
        self.fields["flow_graph"].choices = graphs
        # Only this agent's versions can be saved (``Agent.clean``), a new agent has none; each option's label
        # names its agent, read with it (one query for the dropdown, not one per version of every agent).
        for name in ("live_version", "shadow_version"):
            versions = self.fields.get(name)
            if versions is not None:
                versions.queryset = (  # type: ignore[attr-defined]
                    AgentVersion.objects.filter(agent_id=self.instance.pk).select_related("agent")
                    if self.instance.pk is not None
                    else AgentVersion.objects.none()
                )
        # A post that leaves these out (a script written before they were on the form) keeps their values.
        for name in ("time_limit_s", "language", "shadow_sample_rate"):
            if name in self.fields:  # not on a page its reader may only view
                self.fields[name].required = False
        # What the page showed travels with the post (``initial-<name>``), so that a save tells a value the admin
        # chose from one a publish or a roll back moved meanwhile (``_keep_moved_versions``).
        for name in MOVED_ELSEWHERE:
            if name in self.fields:
                self.fields[name].show_hidden_initial = True
        self.kept_notes: list[str] = []

    def full_clean(self) -> None:
        super().full_clean()
        if self.is_bound and self._errors:
            self.key_not_kept()

    def key_not_kept(self) -> None:
        """A refused page sends no key back (the box is blank): a model API key typed in it is said to be not kept,
        so that it is typed again (left empty, the next save kept the old key, unsaid). Never echoes the key."""
        name = "new_model_api_key"
        if (
            name not in self.fields
            or name in (self._errors or {})
            or not str(self.data.get(self.add_prefix(name)) or "")
        ):
            return
        self.add_error(name, _("The key typed here was not kept, as the page was refused: type it again."))

    def _update_errors(self, errors: ValidationError) -> None:
        # The model validates model_secrets; on this form the key is entered as a key or a worker variable.
        if hasattr(errors, "error_dict") and "model_secrets" in errors.error_dict:
            field = "new_model_api_key" if self.cleaned_data.get("new_model_api_key") else "model_api_key_from_env"
            errors = ValidationError({(field if k == "model_secrets" else k): v for k, v in errors.error_dict.items()})
        super()._update_errors(errors)

    def clean_model_params(self) -> Any:
        return self._posted_settings("model_params", _("Enter a JSON object: parameter name → its value."))

    def clean_tool_selection(self) -> Any:
        return self._posted_settings("tool_selection", f"(root): {_('must be a JSON object')}")

    def clean_mcp_context(self) -> Any:
        return self._posted_settings("mcp_context", f"(root): {_('must be a JSON object')}")

    def _posted_settings(self, name: str, no_object: str) -> Any:
        """The JSON settings ``name`` as posted, refused with ``no_object`` where the post gave no object (``null``
        typed into its JSON: the column holds no NULL and the save was a 500; ``[]``, stored as a list no reader
        takes), and where a text in an entry holds a NUL (PostgreSQL's jsonb refuses it: a 500) or another control
        character, as a rule's parameters are (``list_fields.changed_texts_problems``; an entry saved unchanged is
        left as stored). A post that leaves the field out keeps the stored value."""
        value = self.cleaned_data.get(name)
        widget = self.fields[name].widget
        if widget.value_omitted_from_data(self.data, self.files, self.add_prefix(name)):
            return value
        if not isinstance(value, dict):
            raise forms.ValidationError(no_object, code="invalid")
        stored = getattr(self.instance, name) if self.instance.pk else {}
        if problems := changed_texts_problems(value, stored):
            raise forms.ValidationError(problems, code="control_characters")
        return value

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        # Applied before the model's own validation (``Agent.clean`` checks a from_env name).
        new_key, from_env = cleaned.get("new_model_api_key"), (cleaned.get("model_api_key_from_env") or "").strip()
        if new_key and from_env:
            raise forms.ValidationError(_("Give the model API key or a variable to read it from, not both."))
        provider = cleaned.get("model_provider")
        if (new_key or from_env) and provider in KEYLESS_PROVIDERS:
            # Stored, it was never sent: Bedrock signs with the worker's AWS credentials, the offline model calls
            # nothing.
            self.add_error("new_model_api_key" if new_key else "model_api_key_from_env", KEYLESS_PROVIDERS[provider])
            new_key = from_env = ""
        self._check_unread_params(cleaned)
        if cleaned.get("clear_model_api_key"):
            self.instance.model_secrets = {}
        if new_key:
            self.instance.model_secrets = {"api_key": new_key}
        elif from_env:
            self.instance.model_secrets = {"api_key": {"from_env": from_env}}
        for name in ("time_limit_s", "language", "shadow_sample_rate"):
            if cleaned.get(name) in (None, ""):
                cleaned[name] = getattr(self.instance, name)
        servers = cleaned.get("servers")
        if servers is not None:
            # The model's validation (next) checks the flow's server against the servers posted, not those stored.
            self.instance.servers_given = [server.mcp_id for server in servers]
        self._check_settings(servers)
        self._check_tool_choice(cleaned, servers)
        self._keep_moved_versions(cleaned)
        self._check_version_choices(cleaned)
        if servers is not None:
            leaving = servers_leaving(agent=self.instance, servers=list(servers))
            if needing := rules_calling(agent=self.instance, mcp_ids=leaving):
                self.add_error("servers", unbinding_refused(needing))
        if servers is not None and (conflict := tool_name_conflict_problem(list(servers))):
            raise forms.ValidationError(conflict)
        return cleaned

    def _check_unread_params(self, cleaned: dict[str, Any]) -> None:
        """Model parameters the chosen provider never reads (``PROVIDER_PARAMS``, as
        ``agents.providers.build_provider_model`` reads them), said after the save naming each and the provider
        (``kept_notes``): saved unsaid, they looked in force (a Bedrock agent's base_url, an offline agent's
        temperature). A warning, not a refusal: a parameter kept for another provider is meant to stay (an agent
        switched back and forth, the many stored so). Said for a model agent where the parameter or the provider
        changes."""
        provider, params = cleaned.get("model_provider"), cleaned.get("model_params")
        if provider not in PROVIDER_PARAMS or not isinstance(params, dict) or cleaned.get("mode") == Agent.Mode.FLOW:
            return
        stored = self.instance.model_params if self.instance.pk and isinstance(self.instance.model_params, dict) else {}
        provider_changed = self.instance.pk is None or provider != self.instance.model_provider
        from agents.providers import ModelParams  # the providers' SDKs load when an agent is saved

        unread = [
            key
            for key in params
            if key in ModelParams.model_fields
            and key not in PROVIDER_PARAMS[provider]
            and (provider_changed or params[key] != stored.get(key))
        ]
        if unread:
            self.kept_notes.append(
                ngettext(
                    "Agent %(agent)s: the %(provider)s provider does not read the model parameter %(names)s; it "
                    "was saved but has no effect (remove it).",
                    "Agent %(agent)s: the %(provider)s provider does not read the model parameters %(names)s; "
                    "they were saved but have no effect (remove them).",
                    len(unread),
                )
                % {
                    "agent": cleaned.get("slug") or self.instance.slug,
                    "names": ", ".join(map(str, unread)),
                    "provider": provider,
                }
            )

    def _keep_moved_versions(self, cleaned: dict[str, Any]) -> None:
        """The live version, the shadow and its rate as stored where the admin left them as the page showed them
        and they moved since it was opened (a publish, a roll back, ``agent_version shadow``): the page's old value
        put the old version back live, unsaid, on a save of the name alone. Each kept is said
        (``kept_notes``). A post without the page's values (``initial-<name>``: a script) is taken as posted."""
        if self.instance.pk is None:
            return
        for name in MOVED_ELSEWHERE:
            if name not in cleaned or name not in self.fields or name in self.changed_data:
                continue
            if self[name].html_initial_name not in self.data:
                continue
            stored = getattr(self.instance, name)
            if cleaned[name] == stored:
                continue
            cleaned[name] = stored
            shown = (
                "—" if stored is None else f"v{stored.number}" if isinstance(stored, AgentVersion) else f"{stored:g}"
            )
            self.kept_notes.append(
                gettext(
                    "Agent %(agent)s: the %(field)s changed to %(value)s after this page was opened (a publish, a "
                    "roll back or another save); this save kept %(value)s."
                )
                % {"agent": self.instance.slug, "field": Agent._meta.get_field(name).verbose_name, "value": shown}
            )

    def _check_version_choices(self, cleaned: dict[str, Any]) -> None:
        """``agent_update``'s refusals of the live version and the shadow, told at their fields (raised by the
        service they were a server error): a published agent's live version left empty (its draft would serve live
        traffic), and another version chosen that can no longer run. A version left as it was is not checked."""
        for name in ("live_version", "shadow_version"):
            if self.instance.pk is None or name not in cleaned or name not in self.changed_data:
                continue
            version = cleaned[name]  # one of this agent's versions (the field's choices) or None
            if version is None and name == "live_version":
                self.add_error(name, live_version_clearing_refused())
            elif version is not None and (problem := version_unrunnable_problem(version)):
                self.add_error(name, problem)

    def _check_tool_choice(self, cleaned: dict[str, Any], servers: Any) -> None:
        """``model_params.tool_choice`` naming one tool: a tool the model is offered (one of the chosen servers'),
        where it changes (every run would fail at the provider otherwise)."""
        params = cleaned.get("model_params")
        choice = params.get("tool_choice") if isinstance(params, dict) else None
        try:
            forced = tool_choice_name(choice)  # text, or an object naming the tool
        except ValueError:
            return  # an object that names no tool: refused by the model's validation, saying the forms
        if forced is None or forced in ("auto", "any", "none") or servers is None:
            return
        stored = self.instance.model_params if self.instance.pk and isinstance(self.instance.model_params, dict) else {}
        if self.instance.pk and stored.get("tool_choice") == choice:
            return
        names = sorted({t.exposed_name for s in servers for t in s.tools.all() if t.callable})
        if forced not in names:
            self.add_error(
                "model_params",
                _("tool_choice: '%(tool)s' is no tool of the chosen servers; use auto, any, or one of: %(names)s")
                % {"tool": forced, "names": ", ".join(names) or "—"},
            )

    def _bound_servers(self) -> list[McpServer]:
        """The servers the page binds: those posted (a bound form), else the agent's."""
        if self.is_bound:
            # Ids the lookup can take (``²`` is a digit to ``isdigit``; one past 64 bits overflows SQLite): the
            # field refuses the others, naming them.
            posted = [str(i) for i in self.data.getlist(self.add_prefix("servers"))]
            ids = [i for i in posted if i.isascii() and i.isdigit() and key_in_range(McpServer.objects.all(), i)]
            return list(McpServer.objects.filter(pk__in=ids).order_by("mcp_id"))
        return list(self.instance.servers.order_by("mcp_id")) if self.instance.pk else []

    def _settings_editors(self) -> None:
        """The tool selection and MCP context editors offer this agent's tools, servers, resources, prompts."""
        selection, context = self.fields.get("tool_selection"), self.fields.get("mcp_context")
        if selection is None and context is None:
            return
        servers = self._bound_servers()
        if selection is not None:
            # The model field's help text is written for configuration as code (JSON); the editor's inputs are
            # named on the page, so this one says what the setting does.
            selection.help_text = _(
                "Offer the model only the tools that fit each question: the top K by a lexical or embedding "
                "ranking, always with the pinned ones, within the servers and tags chosen; the first call may be "
                "forced to any tool or to a named one."
            )
            widget = selection.widget
            widget.stored = dict(self.instance.tool_selection or {})
            widget.tool_names = agent_tool_names(servers)
            widget.server_ids = [s.mcp_id for s in servers]
            widget.known_tags = agent_tool_tags(servers)
        if context is not None:
            context.help_text = _(
                "What the bound servers give the model besides tools: resources read at the start of a run as "
                "context (as data, never instructions), a server's prompt as the system prompt (its arguments may "
                "take {context.KEY} values; with {query} or {data.PATH} it is the asker's text too and is attached "
                "as data instead), and a tool with which the model may read their resources itself."
            )
            context.widget.stored = dict(self.instance.mcp_context or {})
            context.widget.servers = servers

    def _check_settings(self, servers: Any) -> None:
        """Names in the tool selection and MCP context must be this agent's (the errors list the valid ones)."""
        bound = list(servers) if servers is not None else self._bound_servers()
        if "tool_selection" in self.cleaned_data and "tool_selection" in self.fields:
            problems = selection_problems(
                self.cleaned_data["tool_selection"],
                tool_names=agent_tool_names(bound),
                server_ids=[s.mcp_id for s in bound],
            )
            if problems:
                self.add_error("tool_selection", problems)
        if "mcp_context" in self.cleaned_data and "mcp_context" in self.fields:
            problems = context_problems(self.cleaned_data["mcp_context"], servers=bound)
            if problems:
                self.add_error("mcp_context", problems)


def _rule_save(*, obj: DeterministicRule, actor: Any, via: str, creating: bool) -> None:
    if creating:
        deterministic_rule_create(actor=actor, via=via, data=form_data(obj))
    else:
        deterministic_rule_update(rule=obj, actor=actor, via=via)


def _rule_delete(*, obj: DeterministicRule, actor: Any, via: str) -> None:
    deterministic_rule_delete(rule=obj, actor=actor, via=via)


def _rule_history_name(event: AuditEvent) -> str:
    """A rule's change on its agent's History page, by the name the rule had then (``result.name``)."""
    name = event.result.get("name", "") if isinstance(event.result, dict) else ""
    return pgettext("object history", "rule %(name)s") % {"name": name}


# A published agent's edit is a draft that live traffic does not run until the agent is published again (unless it
# publishes on save). The admin's "was changed successfully" said nothing of it: an admin edited a rule and the next
# API run used the live version without it. A save that changed an agent's draft so that it is not the live version
# says so; one that published (on save), or that changed nothing a version freezes, keeps the usual messages.


def draft_digests(agents: QuerySet[Agent]) -> dict[int, str]:
    """The digest of what publishing each of ``agents`` that has a live version would freeze, as stored now, by
    its id: read before a save, for ``draft_notes`` after it."""
    return {agent.pk: content_digest(version_content(agent)) for agent in agents.exclude(live_version=None)}


def draft_notes(before: dict[int, str]) -> list[str]:
    """For each agent of ``before`` (``draft_digests``, read before the save) whose draft the save changed and that
    does not run it (its live version froze other content): that the change is a draft and which version stays
    live. Read in the save's transaction (the admin's POST holds the configuration's lock), after any publish."""
    agents = Agent.objects.filter(pk__in=list(before)).exclude(live_version=None).select_related("live_version")
    notes = []
    for agent in agents.order_by("slug"):
        digest = content_digest(version_content(agent))
        live = agent.live_version
        if live is not None and digest != before[agent.pk] and digest != live.digest:
            notes.append(
                gettext(
                    "Agent %(agent)s: saved as a draft. v%(number)s stays live until you publish the agent (the "
                    "Publish action of the agents list)."
                )
                % {"agent": agent.slug, "number": live.number}
            )
    return notes


def tell_draft_notes(model_admin: admin.ModelAdmin[Any], request: HttpRequest, before: dict[int, str]) -> None:
    """``draft_notes`` as warnings below the save's own message: live traffic does not get the change yet."""
    for note in draft_notes(before):
        model_admin.message_user(request, note, messages.WARNING)


def publish_refused_message(agent: Agent, exc: ValidationError) -> str:
    """Why the publish action published nothing for ``agent`` (``agent_version_publish``'s refusal), worded as a
    refused roll back is."""
    return gettext("Agent %(agent)s cannot be published: %(problems)s") % {
        "agent": agent.slug,
        "problems": "; ".join(exc.messages),
    }


@admin.register(Agent)
class AgentAdmin(ServiceAdminMixin, admin.ModelAdmin):
    form = AgentForm
    formfield_overrides = bounded_json_overrides(finite=True)  # NaN, 1e400 in posted JSON: refused at its field
    list_display = ["slug", "name", "enabled", "model_provider", "model_id", "mode"]
    list_filter = ["enabled", "model_provider", "mode"]
    search_fields = ["slug", "name"]
    filter_horizontal = ["servers"]
    inlines = [DeterministicRuleInline]
    actions = ["publish"]
    fieldsets = [
        (None, {"fields": ["slug", "name", "enabled", "mode", "servers", "time_limit_s", "language", "model_params"]}),
        (_("flow graph"), {"fields": ["flow_graph"], "classes": ["agent-mode-flow"]}),
        (
            _("model"),
            {
                "fields": [
                    "model_provider",
                    "model_id",
                    "model_key_state",
                    "new_model_api_key",
                    "model_api_key_from_env",
                    "clear_model_api_key",
                    "max_iterations",
                    "system_prompt",
                ],
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
        (
            _("tools offered to the model, MCP resources and prompt"),
            {"fields": ["tool_selection", "mcp_context"], "classes": ["agent-mode-react"]},
        ),
        (
            _("versions and shadow"),
            {"fields": ["live_version", "publish_on_save", "shadow_version", "shadow_sample_rate"]},
        ),
    ]

    readonly_fields = ["model_key_state"]

    class Media:
        css = {"all": ["mcpregistry/editors.css"]}
        js = ["agents/agent_form.js"]

    @admin.display(description=_("model API key"))
    def model_key_state(self, obj: Agent) -> str:
        if obj.pk and not readable(obj.model_secrets):
            return format_html(
                '<p class="errornote">{}</p>',
                _(
                    "The stored key cannot be decrypted with this server's keys (SECRETS_ENCRYPTION_KEYS lacks the key "
                    "it was encrypted with); runs of this agent fail until it can. Add that key back, or enter the "
                    "model API key (or its variable) again."
                ),
            )
        entry = (obj.model_secrets or {}).get("api_key") if obj.pk else None
        if isinstance(entry, dict) and "from_env" in entry:
            return str(_("read from the worker variable %(name)s") % {"name": entry["from_env"]})
        return str(_("set (hidden)")) if entry else str(_("not set"))

    inline_services = {DeterministicRule: (_rule_save, _rule_delete)}
    inline_history_names = {DeterministicRule: _rule_history_name}

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Agent | None = None,
    ) -> HttpResponse:
        form = context["adminform"].form if "adminform" in context else None
        if request.method == "POST" and isinstance(form, AgentForm) and form.is_bound:
            form.key_not_kept()  # refused for a rule row alone, the agent's form has no error of its own
        return super().render_change_form(request, context, add, change, form_url, obj)

    @admin.action(
        description=_("Publish the selected agents (their edits become the live version)"), permissions=["change"]
    )
    def publish(self, request: HttpRequest, queryset: Any) -> None:
        for agent in queryset:
            try:
                version = agent_version_publish(agent=agent, actor=request.user, via=ADMIN_VIA)
            except ValidationError as exc:  # a draft that cannot run: nothing published, as a roll back refused
                self.message_user(request, publish_refused_message(agent, exc), messages.ERROR)
                continue
            # A warning while weighted A/B arms take the live traffic, as the roll back's (``admin_versions``).
            text, warning = admin_versions.publish_message(agent=agent, number=version.number)
            self.message_user(request, text, messages.WARNING if warning else messages.SUCCESS)

    def service_save(self, *, obj: Agent, actor: Any, m2m: dict[str, list[Any]], change: bool) -> None:
        if change:
            agent_update(agent=obj, actor=actor, via=ADMIN_VIA, servers=m2m.get("servers"))
        else:
            saved = agent_create(actor=actor, via=ADMIN_VIA, data=form_data(obj), servers=m2m.get("servers", []))
            obj.pk = saved.pk
            obj._state.adding = False

    # One save of the page (the agent and its rule rows) publishes on save at most once, at its end
    # (``save_related``), as ``config_import`` does for a document: a publish per step put versions in the
    # history that no one saved, and a rule row's publish undid the live version the same save chose.

    def save_model(self, request: HttpRequest, obj: Agent, form: Any, change: bool) -> None:
        obj.__dict__["_drafts_before"] = draft_digests(Agent.objects.filter(pk=obj.pk)) if change else {}
        # What each agent that publishes on save freezes before the page's save (a rule row can reach any): only
        # those whose frozen content it changed publish (a disabled rule renamed undid a roll back).
        obj.__dict__["_frozen_before"] = publish_on_save_digests(Agent.objects.filter(publish_on_save=True))
        with publish_on_save_deferred() as held:
            super().save_model(request, obj, form, change)
        obj.__dict__["_publishes_held"] = set(held)
        obj.__dict__["_kept_notes"] = list(getattr(form, "kept_notes", []))

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        """Saves the rule rows, then publishes what the agent's edit and its rows held back, in the page's
        transaction; not where the same save chose the live version (the admin's choice wins, as for the agent's
        own edit: ``agents.services._edit_publishes_on_save``)."""
        agent = form.instance
        with publish_on_save_deferred() as held:
            super().save_related(request, form, formsets, change)
        held |= agent.__dict__.pop("_publishes_held", set())
        frozen_before = agent.__dict__.pop("_frozen_before", None)
        live_chosen = "live_version" in form.changed_data
        if live_chosen:
            held.discard(agent.pk)
        # One agent at a time: a draft that cannot run is refused (``agent_version_publish``) and stays a draft,
        # said, while the page's edit is saved and the others publish.
        published: dict[int, AgentVersion] = {}
        refused: list[str] = []
        for held_agent in Agent.objects.filter(pk__in=held).order_by("slug"):
            try:
                published |= agents_publish_held_on_save(
                    agent_ids=[held_agent.pk], actor=request.user, via=ADMIN_VIA, before=frozen_before
                )
            except ValidationError as exc:
                refused.append(
                    gettext("Agent %(agent)s was not published on save: %(problems)s")
                    % {"agent": held_agent.slug, "problems": "; ".join(exc.messages)}
                )
        if agent.pk in published:
            agent.live_version = published[agent.pk]
        agent.__dict__["_live_version_told"] = live_chosen or agent.pk in published
        agent.__dict__["_publishes_refused"] = refused

    def response_add(self, request: HttpRequest, obj: Agent, post_url_continue: str | None = None) -> HttpResponse:
        response = super().response_add(request, obj, post_url_continue)
        self._tell_refusals(request, obj)
        self._tell_live_version(request, obj)
        return response

    def response_change(self, request: HttpRequest, obj: Agent) -> HttpResponse:
        response = super().response_change(request, obj)
        self._tell_refusals(request, obj)
        tell_draft_notes(self, request, obj.__dict__.pop("_drafts_before", {}))  # next to the save's own message
        self._tell_live_version(request, obj)
        return response

    def _tell_refusals(self, request: HttpRequest, agent: Agent) -> None:
        """The versions the save kept as stored (``AgentForm._keep_moved_versions``) and the publishes on save
        refused (a draft that cannot run), as warnings below the save's own message."""
        for note in [*agent.__dict__.pop("_kept_notes", []), *agent.__dict__.pop("_publishes_refused", [])]:
            self.message_user(request, note, messages.WARNING)

    def _tell_live_version(self, request: HttpRequest, agent: Agent) -> None:
        """Where the save published on save or chose the live version: which version is live now (a warning while
        weighted A/B arms take the live traffic, as the publish action's)."""
        if not agent.__dict__.pop("_live_version_told", False) or agent.live_version is None:
            return
        text, warning = admin_versions.publish_message(agent=agent, number=agent.live_version.number)
        self.message_user(request, text, messages.WARNING if warning else messages.SUCCESS)

    def service_delete(self, *, obj: Agent, actor: Any) -> None:
        agent_delete(agent=obj, actor=actor, via=ADMIN_VIA)

    def get_deleted_objects(self, objs: Any, request: HttpRequest) -> Any:
        # A key that may use only the agents deleted would be left with none, which means every agent: the page
        # names such keys among what stops the delete, as Django names the runs an agent keeps.
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        for key in keys_left_without_agents(objs):
            protected = [
                *protected,
                _("API key %(name)s (%(prefix)s…) may use only these agents: give it others or revoke it first")
                % {"name": key.name, "prefix": key.prefix},
            ]
        return deleted, counts, perms_needed, protected


@admin.register(DeterministicRule)
class DeterministicRuleAdmin(ServiceAdminMixin, admin.ModelAdmin):
    formfield_overrides = bounded_json_overrides(finite=True)  # NaN, 1e400 in posted JSON: refused at its field
    # What each rule calls and when, in words, beside its order and switch; its agent under its name.
    list_display = ["order", "rule_name", "calls", "conditions", "enabled"]
    list_display_links = ["rule_name"]
    list_filter = ["enabled", "agent", "server"]
    search_fields = ["name", "tool_name"]
    ordering = ["order", "id"]
    form = DeterministicRuleForm
    fieldsets = [
        (None, {"fields": ["agent", "name", "order", "enabled", "server", "tool_name"]}),
        (_("conditions (all that are given must hold)"), {"fields": ["when"]}),
        (_("parameters"), {"fields": ["params", "answer_template"]}),
        (_("the model's first tool"), {"fields": ["force_first_tool"], "classes": ["collapse"]}),
        (_("code rule (instead of the above)"), {"fields": ["code"], "classes": ["collapse"]}),
        (_("advanced: the rule as JSON"), {"fields": ["rule_json"], "classes": ["collapse"]}),
    ]

    class Media:
        css = {"all": ["mcpregistry/editors.css", "agents/rule_summary.css"]}
        js = ["agents/rule_editor.js"]

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).select_related("agent", "server")

    @admin.display(description=_("name"), ordering="name")
    def rule_name(self, rule: DeterministicRule) -> str:
        agent = rule.agent.slug if rule.agent is not None else gettext("no agent")
        return format_html('{}<div class="rule-summary-key">{}</div>', rule.name, agent)

    @admin.display(description=pgettext_lazy("rule", "calls"), ordering="tool_name")
    def calls(self, rule: DeterministicRule) -> str:
        return target_html(rule)

    @admin.display(description=pgettext_lazy("rule", "when"))
    def conditions(self, rule: DeterministicRule) -> str:
        return conditions_html(rule)

    def render_change_form(self, request: HttpRequest, context: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        form = context["adminform"].form
        context["tool_catalogue"] = {
            "servers": {str(s.pk): s.mcp_id for s in McpServer.objects.all()},
            "tools": getattr(form, "catalogue", {}),
            "regex_check": reverse("admin:agents_deterministicrule_regex_check", current_app=self.admin_site.name),
        }
        return super().render_change_form(request, context, *args, **kwargs)

    def get_urls(self) -> list[URLPattern]:
        check = path(
            "regex-check/",
            self.admin_site.admin_view(self.regex_check_view),
            name="agents_deterministicrule_regex_check",
        )
        return [check, *super().get_urls()]

    def regex_check_view(self, request: HttpRequest) -> JsonResponse:
        """The rule editor's live check of its regex (``rule_editor.js``, as it is typed): the verdict and the words
        of the rule's own validation (``WhenSpec``, which the form runs on save), and the named groups the rule may
        use as ``{match.NAME}``. A check in the browser's RegExp disagreed with Python both ways. A GET: it
        changes nothing; for whoever may add or change rules."""
        if not (self.has_add_permission(request) or self.has_change_permission(request)):
            raise PermissionDenied
        pattern = request.GET.get("regex", "")
        try:
            WhenSpec.model_validate({"regex": pattern})
        except PydanticValidationError as exc:
            return JsonResponse({"valid": False, "message": "; ".join(pydantic_message(e) for e in exc.errors())})
        index = regex.compile(nfc(pattern)).groupindex if pattern else {}  # composed, as the rules compile it
        return JsonResponse({"valid": True, "groups": sorted(index, key=index.__getitem__)})

    def save_model(self, request: HttpRequest, obj: DeterministicRule, form: Any, change: bool) -> None:
        obj.__dict__["_drafts_before"] = draft_digests(self._agents_reached(obj))
        super().save_model(request, obj, form, change)

    @staticmethod
    def _agents_reached(rule: DeterministicRule) -> QuerySet[Agent]:
        """The agents whose draft a save of ``rule`` may change: its agent before and after the save; where it is (or
        was) a global rule, the agents bound to its server (a code rule's, naming none here: every agent). Each is
        digested twice in the save's transaction: every agent for every global rule cost some 12 queries apiece."""
        stored = DeterministicRule.objects.filter(pk=rule.pk).values_list("agent_id", "server_id") if rule.pk else []
        sides = {*stored, (rule.agent_id, rule.server_id)}
        agent_ids = {agent_id for agent_id, _server in sides if agent_id is not None}
        server_ids = {server_id for agent_id, server_id in sides if agent_id is None}
        if None in server_ids:
            return Agent.objects.all()
        return Agent.objects.filter(Q(pk__in=agent_ids) | Q(servers__in=server_ids)).distinct()

    def response_add(
        self, request: HttpRequest, obj: DeterministicRule, post_url_continue: str | None = None
    ) -> HttpResponse:
        response = super().response_add(request, obj, post_url_continue)
        tell_draft_notes(self, request, obj.__dict__.pop("_drafts_before", {}))
        return response

    def response_change(self, request: HttpRequest, obj: DeterministicRule) -> HttpResponse:
        response = super().response_change(request, obj)
        tell_draft_notes(self, request, obj.__dict__.pop("_drafts_before", {}))
        return response

    def service_save(self, *, obj: DeterministicRule, actor: Any, m2m: dict[str, list[Any]], change: bool) -> None:
        if change:
            deterministic_rule_update(rule=obj, actor=actor, via=ADMIN_VIA)
        else:
            saved = deterministic_rule_create(actor=actor, via=ADMIN_VIA, data=form_data(obj))
            obj.pk = saved.pk
            obj._state.adding = False

    def service_delete(self, *, obj: DeterministicRule, actor: Any) -> None:
        deterministic_rule_delete(rule=obj, actor=actor, via=ADMIN_VIA)


class ApiKeyStateFilter(admin.SimpleListFilter):
    """Live or revoked, in words (the revocation time's "empty / not empty" left the admin to work it out)."""

    title = pgettext_lazy("api key state", "state")
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [
            ("live", pgettext_lazy("api key state", "live")),
            ("revoked", pgettext_lazy("api key state", "revoked")),
        ]

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        if self.value() == "live":
            return queryset.filter(revoked_at__isnull=True)
        if self.value() == "revoked":
            return queryset.filter(revoked_at__isnull=False)
        return queryset


ISSUE_TOKEN_PATTERN = re.compile(r"[A-Za-z0-9_-]{16,64}")

# What an admin key may do through ``/api/v1/evals/`` (``evals.api``): read, create and replace eval sets and
# their cases, start eval runs and read them. Only a user who may do all of it here may hand it to a key: else a
# key would be a way round the admin's permissions (an eval set's sandbox servers take real writes).
ADMIN_KEY_PERMISSIONS = (
    "evals.view_evalset",
    "evals.add_evalset",
    "evals.change_evalset",
    "evals.view_evalcase",
    "evals.add_evalcase",
    "evals.change_evalcase",
    "evals.delete_evalcase",
    "evals.view_evalrun",
    "evals.add_evalrun",
    "evals.change_evalrun",  # an admin key may cancel an eval run (POST /api/v1/evals/runs/{id}/cancel)
)
ADMIN_KEY_REFUSED = _(
    "Only a superuser, or a user who may manage eval sets and start eval runs, may make a key an admin key: "
    "an admin key does both through the API."
)


def may_make_admin_keys(user: Any) -> bool:
    """Whether ``user`` may issue an admin key or make a key one (a superuser holds every permission)."""
    return bool(user.has_perms(ADMIN_KEY_PERMISSIONS))


def _made_admin(key: ApiKey) -> bool:
    """Whether saving ``key`` would make it an admin key that it is not yet (a new key, or a stored caller's key)."""
    if not key.admin:
        return False
    return key.pk is None or not ApiKey.objects.filter(pk=key.pk, admin=True).exists()


class ApiKeyForm(forms.ModelForm):
    # The add form's own token (a fresh one each time the page is made; agents/api_key_form.js keeps it across the
    # back button): the same form sent again, or twice at once, issues one key (``ApiKey.issue_token`` is unique).
    form_token = forms.CharField(widget=forms.HiddenInput, required=False)

    # Whether the user may tick "admin key" (``ApiKeyAdmin.get_form`` sets it); else the box is shown disabled.
    may_make_admin = True

    class Meta:
        model = ApiKey
        fields = ["name", "agents", "rate", "admin"]
        field_classes = {"agents": InRangeModelMultipleChoiceField}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self.is_bound:
            self.initial["form_token"] = secrets.token_urlsafe(18)  # never one from the address
        if not self.may_make_admin and "admin" in self.fields:
            self.fields["admin"].disabled = True  # keeps the stored value; the browser sends none
            self.fields["admin"].help_text = ADMIN_KEY_REFUSED

    def clean(self) -> dict[str, Any]:
        """A tick sent for the disabled box (a forged or stale form) is refused, not silently dropped: the user
        asked for an admin key and is told why there is none. Unticking a key's last agent is refused at the
        field: with none it could use every agent (``api_key_update`` refuses it too; here the page says why)."""
        super().clean()
        field = self.fields.get("admin")
        if field is not None and field.disabled and not self.instance.admin:
            ticked = field.widget.value_from_datadict(self.data, self.files, self.add_prefix("admin"))
            if ticked:
                self.add_error("admin", ADMIN_KEY_REFUSED)
        agents = self.cleaned_data.get("agents")
        if agents is not None and api_key_widened(api_key=self.instance, agents=list(agents)):
            self.add_error("agents", api_key_widening_refused())
        return self.cleaned_data

    def clean_name(self) -> str:
        """Control characters are refused, as ``create_api_key`` refuses them (no one can type them to find the key
        again, and they garble the list); a new name is stored composed (NFC), as the command stores it, so a name
        typed on a keyboard that sends 김 as three jamo is found by one that sends one syllable. A stored name saves
        as it is."""
        name = str(self.cleaned_data["name"])
        if name == (self.instance.name if self.instance.pk else None):
            return name
        if any(unicodedata.category(c) == "Cc" for c in name):
            raise forms.ValidationError(_("a key's name may not contain control characters"))
        return unicodedata.normalize("NFC", name)

    def clean_rate(self) -> str:
        rate = self.cleaned_data["rate"].strip()
        if rate and parse_rate(rate) is None:
            raise forms.ValidationError(_("Enter a rate like 60/min, 1000/hour or 5/10s, over at most 31 days."))
        return rate

    def clean_form_token(self) -> str | None:
        token = self.cleaned_data.get("form_token") or ""
        return token if ISSUE_TOKEN_PATTERN.fullmatch(token) else None


def posted_issue_token(request: HttpRequest) -> str | None:
    token = request.POST.get("form_token", "") if request.method == "POST" else ""
    return token if ISSUE_TOKEN_PATTERN.fullmatch(token) else None


@admin.register(ApiKey)
class ApiKeyAdmin(ServiceAdminMixin, admin.ModelAdmin):
    form = ApiKeyForm
    list_display = ["name", "prefix", "rate", "created_at", "last_used_at", "revoked_at"]
    list_filter = [ApiKeyStateFilter]
    readonly_fields = ["prefix", "created_at", "last_used_at", "revoked_at"]
    fields = ["name", "prefix", "agents", "rate", "admin", "created_at", "last_used_at", "revoked_at"]
    filter_horizontal = ["agents"]
    actions = ["revoke"]

    # Issued here (or with `manage.py create_api_key`): the key is shown once, on the page that follows the
    # save, and never stored (only its digest and its first characters).

    class Media:
        js = ["agents/api_key_form.js"]

    def get_fields(self, request: HttpRequest, obj: ApiKey | None = None) -> list[str]:
        fields = list(super().get_fields(request, obj))
        return [*fields, "form_token"] if obj is None else fields

    def get_form(self, request: HttpRequest, obj: ApiKey | None = None, change: bool = False, **kwargs: Any) -> Any:
        form = super().get_form(request, obj, change, **kwargs)
        return type(form.__name__, (form,), {"may_make_admin": may_make_admin_keys(request.user)})

    def add_view(
        self, request: HttpRequest, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        token = posted_issue_token(request)
        if token is not None:
            if not self.has_add_permission(request):
                raise PermissionDenied
            issued = ApiKey.objects.filter(issue_token=token).first()
            if issued is not None:
                return self._already_issued(request, issued)
        return super().add_view(request, form_url, extra_context)

    def _already_issued(self, request: HttpRequest, key: ApiKey) -> HttpResponse:
        context = {
            **self.admin_site.each_context(request),
            "title": gettext("API key already issued"),
            "opts": self.model._meta,
            "key": key,
            "list_url": reverse("admin:agents_apikey_changelist", current_app=self.admin_site.name),
            "add_url": reverse("admin:agents_apikey_add", current_app=self.admin_site.name),
            "key_url": reverse("admin:agents_apikey_change", args=[key.pk], current_app=self.admin_site.name),
        }
        return TemplateResponse(request, "admin/agents/apikey/already_issued.html", context)

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        # Checked again whatever the form was (the form disables the box): an admin key opens the evals API.
        if _made_admin(obj) and not may_make_admin_keys(request.user):
            raise PermissionDenied(ADMIN_KEY_REFUSED)
        obj._issue_token = None if change else form.cleaned_data.get("form_token")
        super().save_model(request, obj, form, change)

    def service_save(self, *, obj: ApiKey, actor: Any, m2m: dict[str, list[Any]], change: bool) -> None:
        if change:
            api_key_update(api_key=obj, actor=actor, via=ADMIN_VIA, agents=m2m.get("agents"))
            return
        token = obj.__dict__.pop("_issue_token", None)
        try:
            with transaction.atomic():
                issued, raw = api_key_create(
                    name=obj.name,
                    rate=obj.rate,
                    admin=obj.admin,
                    agents=m2m.get("agents", []),
                    actor=actor,
                    via=ADMIN_VIA,
                    issue_token=token,
                )
        except (IntegrityError, ValidationError):
            # The same form sent twice at once (a double click): the other request issued its key (found by the
            # model's unique check, or by the database's when both checked before either inserted); this one
            # issued nothing (its insert and audit event rolled back) and says so.
            earlier = ApiKey.objects.filter(issue_token=token).first() if token else None
            if earlier is None:
                raise
            obj.pk, obj._already_issued = earlier.pk, earlier
            obj._state.adding = False
            return
        obj.pk, obj.prefix, obj.digest, obj.created_at = issued.pk, issued.prefix, issued.digest, issued.created_at
        obj._state.adding = False
        obj._issued_key = raw  # for the next page only; never saved, logged or put in a message

    def response_add(self, request: HttpRequest, obj: ApiKey, post_url_continue: str | None = None) -> HttpResponse:
        earlier = obj.__dict__.pop("_already_issued", None)
        if earlier is not None:
            return self._already_issued(request, earlier)
        # Whatever the button (save, save and continue, save and add another), the page that follows shows the
        # key once; from there the admin goes on.
        raw = obj.__dict__.pop("_issued_key", None)
        if raw is None:
            return super().response_add(request, obj, post_url_continue)
        context = {
            **self.admin_site.each_context(request),
            "title": gettext("API key issued"),
            "opts": self.model._meta,
            "key": obj,
            "raw_key": raw,
            "list_url": reverse("admin:agents_apikey_changelist", current_app=self.admin_site.name),
            "key_url": reverse("admin:agents_apikey_change", args=[obj.pk], current_app=self.admin_site.name),
        }
        # The admin's pages are never cached (no-store): the key stays on this page only.
        return TemplateResponse(request, "admin/agents/apikey/issued.html", context)

    def service_delete(self, *, obj: ApiKey, actor: Any) -> None:
        api_key_delete(api_key=obj, actor=actor, via=ADMIN_VIA)

    def get_deleted_objects(self, objs: Any, request: HttpRequest) -> Any:
        # A key with runs is not deleted (``api_key_delete``): the page names it among what stops the delete, with
        # the way out (revoke it), as Django names the rows that protect an object.
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        keys = list(objs)
        with_runs = set(Run.objects.filter(api_key__in=keys).values_list("api_key_id", flat=True).distinct())
        protected = [*protected, *(api_key_with_runs_refused(key) for key in keys if key.pk in with_runs)]
        return deleted, counts, perms_needed, protected

    @admin.action(description=_("Revoke the selected API keys"), permissions=["change"])
    def revoke(self, request: HttpRequest, queryset: Any) -> None:
        revoked = sum(api_key_revoke(api_key=key, actor=request.user, via=ADMIN_VIA) for key in queryset)
        self.message_user(
            request, ngettext("%(n)d key revoked.", "%(n)d keys revoked.", revoked) % {"n": revoked}, messages.SUCCESS
        )


@admin.register(ModelPrice)
class ModelPriceAdmin(ServiceAdminMixin, admin.ModelAdmin):
    list_display = ["provider", "model_id", "input_per_mtok", "output_per_mtok", "cache_read_per_mtok", "updated_at"]
    list_filter = ["provider"]
    search_fields = ["model_id"]
    fields = [
        "provider",
        "model_id",
        "input_per_mtok",
        "output_per_mtok",
        "cache_read_per_mtok",
        "cache_write_per_mtok",
    ]

    def get_form(self, request: HttpRequest, obj: ModelPrice | None = None, **kwargs: Any) -> Any:
        form = super().get_form(request, obj, **kwargs)
        field = form.base_fields.get("model_id")
        if field is not None:
            used = sorted(
                {f"{p}: {m}" for p, m in Agent.objects.exclude(model_id="").values_list("model_provider", "model_id")}
            )
            field.help_text = format_html(
                "{} {}",
                _(
                    "The model id exactly as an agent names it; empty: every model of the provider that has no "
                    "price of its own."
                ),
                _("The agents' models: %(models)s.") % {"models": ", ".join(used)} if used else "",
            )
        return form

    def service_save(self, *, obj: ModelPrice, actor: Any, m2m: dict[str, list[Any]], change: bool) -> None:
        if change:
            model_price_update(price=obj, actor=actor, via=ADMIN_VIA)
        else:
            saved = model_price_create(actor=actor, via=ADMIN_VIA, data=form_data(obj))
            obj.pk = saved.pk
            obj._state.adding = False

    def service_delete(self, *, obj: ModelPrice, actor: Any) -> None:
        model_price_delete(price=obj, actor=actor, via=ADMIN_VIA)


class _UnrevokedKeyChoices(forms.models.ModelChoiceIterator):
    """The API keys a budget may be given: those not revoked (a revoked key submits no run to limit)."""

    def __init__(self, field: forms.ModelChoiceField) -> None:
        super().__init__(field)
        self.queryset = self.queryset.filter(revoked_at__isnull=True)


class BudgetForm(forms.ModelForm):
    """A limit refused at its own field (a negative one, a word) is told there only: the model, which never saw
    it, would also say that no limit was given.

    The API keys offered are those not revoked; one posted all the same (revoked since the page was read) is
    refused by name (``clean_api_key``), not as a choice the list lacks. The cost limit is a text input: a number
    input in a browser whose locale writes a decimal comma drops the comma ("1,5" was saved as $15), where the
    server's refusal of "1,5" is what the admin must see."""

    LIMITS = ("max_tokens", "max_cost")

    class Meta:
        # ``modelform_factory`` (the admin's ``get_form``) takes these into the form it builds.
        help_texts = {"period": _("A UTC day or month: a day starts at 00:00 UTC (09:00 in Seoul).")}
        widgets = {
            # The admin's narrow integer input cut the default (20000) at 800 px; as wide as the token limit's.
            "run_reservation_tokens": AdminBigIntegerFieldWidget,
            "max_cost": forms.TextInput(attrs={"inputmode": "decimal", "class": "vBigIntegerField"}),
        }
        error_messages = {
            "max_cost": {"invalid": _("Enter a number in US dollars with a dot for cents: 1.5, not 1,5.")}
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        key = self.fields.get("api_key")
        if isinstance(key, forms.ModelChoiceField):
            key.widget.choices = _UnrevokedKeyChoices(key)

    def clean_api_key(self) -> ApiKey | None:
        key = self.cleaned_data.get("api_key")
        if key is not None and key.revoked_at is not None:
            raise ValidationError(
                _("API key %(key)s is revoked: a budget on it would limit nothing. Choose a key in use.")
                % {"key": key},
                code="revoked",
            )
        return key

    def add_error(self, field: str | None, error: Any) -> None:
        if (
            field is None
            and isinstance(error, ValidationError)
            and hasattr(error, "error_dict")
            and any(self.has_error(name) for name in self.LIMITS)
        ):
            told = [e for e in error.error_dict.get(NON_FIELD_ERRORS, []) if e.code != "no_limit"]
            rest = {k: v for k, v in error.error_dict.items() if k != NON_FIELD_ERRORS}
            error = ValidationError({**rest, **({NON_FIELD_ERRORS: told} if told else {})})
            if not error.error_dict:
                return
        super().add_error(field, error)


class UtcPeriodFilter(admin.ChoicesFieldListFilter):
    """A budget's period, titled as what it is: a UTC day or month (a Korean admin's day resets at 09:00)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.title = _("period (UTC)")


@admin.register(Budget)
class BudgetAdmin(ServiceAdminMixin, admin.ModelAdmin):
    form = BudgetForm
    list_display = ["__str__", "period_utc", "max_tokens", "max_cost", "run_reservation_tokens", "enabled", "used_now"]
    list_select_related = ["agent", "api_key"]  # named by each row (``Budget.__str__``)
    list_filter = [("period", UtcPeriodFilter), "enabled"]
    fields = ["api_key", "agent", "period", "max_tokens", "max_cost", "run_reservation_tokens", "enabled"]

    def get_readonly_fields(self, request: HttpRequest, obj: Budget | None = None) -> Any:
        # A stored budget's owner is shown, not offered: its spend is theirs (``budget_update`` refuses the change).
        fields = list(super().get_readonly_fields(request, obj))
        return fields if obj is None else [*fields, *BUDGET_OWNER_FIELDS]

    def get_fieldsets(self, request: HttpRequest, obj: Budget | None = None) -> Any:
        fieldsets = super().get_fieldsets(request, obj)
        if obj is None:
            return fieldsets
        # Said where the fields are shown: the form offers no way to change them, and why is not obvious.
        told = _(
            "The API key or agent a budget belongs to cannot be changed (its spend and runs in flight are theirs): "
            "create a new budget for another."
        )
        return [(name, {**options, "description": told}) for name, options in fieldsets]

    def formfield_for_dbfield(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        formfield = super().formfield_for_dbfield(db_field, request, **kwargs)
        if db_field.name == "api_key" and formfield is not None and hasattr(formfield.widget, "can_add_related"):
            # A key is issued on its own page, which shows it once: not in a pop-up that would close over it.
            formfield.widget.can_add_related = False
        return formfield

    def get_queryset(self, request: HttpRequest) -> QuerySet[Budget]:
        # Each row's use this period, read for the whole page in one query. A period that ends between this read
        # and a row's cell shows that row as unused: the new period's use is (nearly) none.
        return budgets_with_current_usage(super().get_queryset(request), now=timezone.now())

    @admin.display(description=_("period (UTC)"), ordering="period")
    def period_utc(self, obj: Budget) -> str:
        return obj.get_period_display()

    @admin.display(description=_("used this period"))
    def used_now(self, obj: Budget) -> str:
        if not obj.enabled:
            # Its counters stopped when it was switched off (no admission reserves on it): its runs tell the spend.
            tokens, cost = budget_runs_spend(obj, now=timezone.now())
            return _("%(tokens)s tokens, $%(cost)s (spent by its runs; not enforced while switched off)") % {
                "tokens": tokens,
                "cost": usd_text(cost),
            }
        state = budget_state(obj, now=timezone.now(), usages=getattr(obj, "current_usage", None))
        return _("%(tokens)s tokens, $%(cost)s (reserved: %(reserved)s tokens)") % {
            "tokens": state["used_tokens"],
            "cost": usd_text(round(state["used_cost_usd"] * MICROS_PER_USD)),
            "reserved": state["reserved_tokens"],
        }

    def service_save(self, *, obj: Budget, actor: Any, m2m: dict[str, list[Any]], change: bool) -> None:
        if change:
            budget_update(budget=obj, actor=actor, via=ADMIN_VIA)
        else:
            saved = budget_create(actor=actor, via=ADMIN_VIA, data=form_data(obj))
            obj.pk = saved.pk
            obj._state.adding = False

    def service_delete(self, *, obj: Budget, actor: Any) -> None:
        budget_delete(budget=obj, actor=actor, via=ADMIN_VIA)
