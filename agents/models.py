"""Agents, their deterministic rules, runs and the API keys that submit them."""

from __future__ import annotations

import math
import re
import uuid
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import QuerySet
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from agent_platform.json import UnicodeJSONEncoder
from agent_platform.slugs import validate_ascii_slug
from agents.flows import FLOW_TEMPLATES, registered_flow_graphs
from audit.change_guard import AuditedModel, ChangeAudit, NotConfiguration, stored_value
from audit.models import AuditEvent
from audit.services import audit_chain_catch_up
from mcpregistry.crypto import EncryptedJSONField
from mcpregistry.models import INT32_MAX, McpServer, secret_entry_value

# The most model turns a run may take: an agent's field, an agent entry of a configuration document and a
# version's frozen content are held to it (a version stored with more ran unbounded; an agent saved here with
# more was a configuration that export_config wrote and import_config refused).
MAX_ITERATIONS_LIMIT = 100
# The longest time limit a run may have: a day (the configuration document's bound too).
TIME_LIMIT_MAX_S = 86_400

DEFAULT_DETERMINISTIC_INSTRUCTION = (
    '제공된 "확정 호출 결과"가 있으면 그 내용을 우선 사용하여 답변하고, 추가 도구 호출은 필요한 경우에만 하세요.'
)

# Keys a model parameter may not be: a key is a secret (the model secrets' api_key).
SECRET_PARAM_KEYS = ("api_key", "openai_api_key", "key")


def scripted_model_allowed() -> bool:
    """Whether the ``scripted`` model provider may be chosen and run here (tests, ``DEBUG``, or the setting)."""
    return bool(getattr(settings, "PLATFORM_ALLOW_SCRIPTED_MODEL", False))


def tool_choice_name(choice: Any) -> str | None:
    """``agents.providers.tool_choice_name``: what ``model_params.tool_choice`` asks of the model, as a word. Named
    here too for the admin's form, which reads it beside the models (importing the providers imports langchain)."""
    from agents.providers import tool_choice_name as provider_tool_choice_name

    return provider_tool_choice_name(choice)


# A model API key as HTTP sends it in ``Authorization: Bearer <key>``: visible ASCII, no space.
_SENDABLE_KEY = re.compile(r"[\x21-\x7e]+")


def _unsendable_key(entry: Any) -> bool:
    """Whether a model key given as a value (not read from the environment) cannot be sent as a header."""
    if isinstance(entry, dict) and "from_env" in entry:
        return False
    value = secret_entry_value(entry)
    return value is not None and value != "" and not _SENDABLE_KEY.fullmatch(value)


def named_tool_refused(*, setting: str, model_id: str) -> str:
    """Why a setting forcing one named tool is refused for a model that can only be made to call some tool
    (``agents.providers.supports_tool_choice``, kind ``"tool"``)."""
    return str(
        _('%(setting)s: the model %(model)s cannot be made to call one named tool; "any" (some tool) works with it.')
        % {"setting": setting, "model": model_id}
    )


def rule_context_secret_keys(when: Any) -> list[str]:
    """The keys of a rule's ``context`` conditions whose value holds a secret (the audit hides it), each judged as
    the audit records it; every key where only the whole holds one."""
    from mcpregistry.binding_policy import setting_secret_problem

    context = when.get("context") if isinstance(when, dict) else None
    if not isinstance(context, dict) or not setting_secret_problem("context", context, ""):
        return []
    keys = [str(key) for key, value in context.items() if setting_secret_problem("context", {key: value}, "")]
    return keys or [str(key) for key in context]


def rule_context_secret_problems(when: Any) -> list[str]:
    """Why a rule's conditions (``when``) may not be stored, one problem per key: a value its ``context`` compares
    the caller's context with that holds a secret (the audit hides it) is stored, shown and exported in clear, as
    a secret in its ``params`` is (``rule_params_secret_problems``)."""
    return [
        str(
            _(
                "context: this holds a secret under its key '%(key)s' (the audit record hides it), but a rule's "
                "conditions are stored, shown and exported in clear: compare the caller's context with a value "
                "that is no secret."
            )
            % {"key": key}
        )
        for key in rule_context_secret_keys(when)
    ]


def rule_context_secret_problem(when: Any) -> str | None:
    """``rule_context_secret_problems`` as one text, or None."""
    return " ".join(rule_context_secret_problems(when)) or None


def _placeholders_masked(value: Any) -> Any:
    """A params value as the secret check reads it: a text with a placeholder is filled in from the query at run
    time, so it is judged without its placeholders, and where that holds no secret, as the mask."""
    from agents.deterministic import PLACEHOLDER
    from audit.masking import MASK, holds_secret

    if isinstance(value, str) and PLACEHOLDER.search(value):
        rest = PLACEHOLDER.sub(" ", value)
        return rest if holds_secret(rest) else MASK
    if isinstance(value, dict):
        return {key: _placeholders_masked(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_placeholders_masked(item) for item in value]
    return value


def rule_params_secret_arguments(params: Any) -> list[str]:
    """The arguments of a rule's ``params`` whose value holds a secret (``rule_params_secret_problems``), each
    judged as the audit records it; every argument where only the whole holds one."""
    from mcpregistry.binding_policy import setting_secret_problem

    if not params or not setting_secret_problem("params", _placeholders_masked(params), ""):
        return []
    if not isinstance(params, dict):
        return [""]
    found = [
        str(name)
        for name, value in params.items()
        if setting_secret_problem("params", _placeholders_masked({name: value}), "")
    ]
    return found or [str(name) for name in params]


def rule_params_secret_problems(params: Any) -> list[str]:
    """Why a rule's ``params`` may not be stored, one problem per argument: a secret in them is stored, shown and
    exported in clear while the audit hides it (a rule's, and a version's frozen rule's:
    ``agents.services.version_content_problems``). A text with a placeholder is filled in from the query at run
    time: judged without its placeholders, and where that holds no secret, as the mask (``{"token": "Bearer
    {context.token}"}`` is fine)."""
    from mcpregistry.binding_policy import setting_secret_problem

    where = str(_("a secret header or environment value of the rule's server"))
    problems = []
    for name in rule_params_secret_arguments(params):
        if not name:  # not an object: said of the whole
            problems.append(str(setting_secret_problem("params", _placeholders_masked(params), where)))
            continue
        problems.append(
            str(
                _(
                    "This holds a secret under its argument '%(name)s' (the audit record hides it), but the "
                    "parameters template is stored, shown and exported in clear: give the secret as %(where)s "
                    "instead, which is encrypted at rest and never shown."
                )
                % {"name": name, "where": where}
            )
        )
    return problems


def rule_params_secret_problem(params: Any) -> str | None:
    """``rule_params_secret_problems`` as one text, or None."""
    return " ".join(rule_params_secret_problems(params)) or None


def empty_keyword_problems(when: dict[str, Any]) -> list[str]:
    """An empty keyword of a rule's (valid) conditions is in every query: the rule would match all of them."""
    return [
        str(_("%(field)s: an empty keyword matches every query; remove it.") % {"field": name})
        for name in ("all_keywords", "any_keywords")
        if any(not str(k).strip() for k in when.get(name) or [])
    ]


class Agent(AuditedModel):
    """An agent: a system prompt, a model, the MCP servers whose tools it may call, and its rules."""

    class Provider(models.TextChoices):
        OFFLINE = "offline", _("offline (answers from deterministic results, no network)")
        BEDROCK = "bedrock", _("Amazon Bedrock (ChatBedrockConverse)")
        SCRIPTED = "scripted", _("scripted (replays model turns from model parameters; for tests and demos)")
        OPENAI_COMPATIBLE = "openai_compatible", _("OpenAI-compatible API (vLLM, Ollama, LiteLLM, OpenAI)")

    class Mode(models.TextChoices):
        REACT = "react", _("ReAct loop")
        FLOW = "flow", _("Flow graph")

    slug = models.CharField(
        _("slug"),
        max_length=64,
        unique=True,
        validators=[validate_ascii_slug],
        help_text=_(
            "ASCII letters (a–z, A–Z), digits, _ and - only, e.g. company-assistant: the slug names the agent in API "
            "calls, in its A2A URL and in configuration documents."
        ),
    )
    name = models.CharField(_("name"), max_length=200)
    enabled = models.BooleanField(_("enabled"), default=True)
    system_prompt = models.TextField(_("system prompt"), blank=True)
    deterministic_instruction = models.TextField(
        _("instruction for deterministic results"),
        default=DEFAULT_DETERMINISTIC_INSTRUCTION,
        help_text=_("Added to the system message together with the deterministic results."),
    )
    answer_template = models.TextField(
        _("offline answer template"),
        blank=True,
        help_text=_(
            "Used by the offline provider. Placeholders: {query}, {results} (each deterministic result, one per "
            "line). Empty: the rules' own answer templates, else a plain list of results."
        ),
    )
    model_provider = models.CharField(
        _("model provider"), max_length=20, choices=Provider.choices, default=Provider.OFFLINE
    )
    model_id = models.CharField(_("model id"), max_length=200, blank=True)
    model_params = models.JSONField(
        encoder=UnicodeJSONEncoder, verbose_name=_("model parameters"), default=dict, blank=True
    )
    model_secrets = EncryptedJSONField(
        _("model secrets"),
        default=dict,
        blank=True,
        help_text=_(
            'The model API key, encrypted at rest and never shown back: {"api_key": "..."} or {"api_key": '
            '{"from_env": "NAME"}} (read on the worker; NAME must be in PLATFORM_MCP_ENV_PASSTHROUGH).'
        ),
    )
    servers = models.ManyToManyField(McpServer, blank=True, related_name="agents", verbose_name=_("MCP servers"))
    max_iterations = models.PositiveIntegerField(
        _("max iterations"), default=6, validators=[MaxValueValidator(MAX_ITERATIONS_LIMIT)]
    )
    time_limit_s = models.PositiveIntegerField(
        _("time limit (seconds)"),
        default=300,
        help_text=_("A run still going after this long is stopped and fails."),
        validators=[MaxValueValidator(TIME_LIMIT_MAX_S)],
    )
    answer_from_deterministic = models.BooleanField(
        _("answer from deterministic results"),
        default=False,
        help_text=_(
            "When every matched deterministic call succeeded, compose the answer from them (the answer templates) "
            "without a model round trip."
        ),
    )
    caller_approves_model_writes = models.BooleanField(
        _("the API caller may approve the model's write calls"),
        default=False,
        help_text=_(
            "Off: a write call the model asked for waits for an admin or a member of the reviewer group, because "
            "text a tool returned may have steered the model. A write made by a deterministic rule or a flow (an "
            "admin configured it) may always be approved by the caller."
        ),
    )
    language = models.CharField(
        _("language"),
        max_length=10,
        default="ko",
        help_text=_(
            "Language of the texts a run writes: the end user's short texts (a failed call, no rule matched) and the "
            "guidance the model reads after a failed or refused tool call."
        ),
    )
    no_match_answer = models.TextField(
        _("answer when no rule matched"),
        blank=True,
        help_text=_(
            "Offline provider: the answer when no deterministic rule matched (say what this agent can answer). "
            "Empty: a generic text in the agent's language."
        ),
    )
    tool_selection = models.JSONField(
        encoder=UnicodeJSONEncoder,
        verbose_name=_("tool selection"),
        default=dict,
        blank=True,
        help_text=_(
            'Top-K tool selection: {"enabled": true, "top_k": 5, "ranker": "lexical" or "embedding", '
            '"pinned": [...], "servers": [...], "tags": [...], "force_first_tool": "" or "any" or a tool}.'
        ),
    )
    mcp_context = models.JSONField(
        encoder=UnicodeJSONEncoder,
        verbose_name=_("MCP resources and prompt"),
        default=dict,
        blank=True,
        help_text=_(
            '{"resources": [{"mcp_id": ..., "uri": ...}] read at run start as context, "prompt": '
            '{"mcp_id": ..., "name": ..., "arguments": {"city": "{context.city}"}} as the system prompt, '
            '"read_resource_tool": true to let the model read the bound servers\' resources}.'
        ),
    )
    mode = models.CharField(_("mode"), max_length=10, choices=Mode.choices, default=Mode.REACT)
    flow_graph = models.CharField(
        _("flow graph"),
        max_length=300,
        blank=True,
        help_text=_("Flow mode: dotted path of the function that builds the LangGraph graph."),
    )
    # Versions (agents.versions): live traffic runs ``live_version``'s frozen content; edits are a draft until
    # published (or published at once when ``publish_on_save``). An agent never published runs its draft.
    live_version = models.ForeignKey(
        "AgentVersion",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name=_("live version"),
        help_text=_(
            "The published version live traffic runs. Empty only until the agent is first published (it runs as "
            "edited); once published it cannot be emptied, only pointed at another version."
        ),
    )
    publish_on_save = models.BooleanField(
        _("publish on save"),
        default=False,
        help_text=_("Publish a new version whenever the agent or one of its rules is saved (no draft stage)."),
    )
    shadow_version = models.ForeignKey(
        "AgentVersion",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name=_("shadow candidate version"),
        help_text=_("Sampled live runs also run this version in the background (its writes blocked) for comparison."),
    )
    shadow_sample_rate = models.FloatField(
        _("shadow sample rate"), default=0.0, help_text=_("Share of live runs shadowed, from 0 to 1.")
    )
    created_at = models.DateTimeField(_("created"), auto_now_add=True)
    updated_at = models.DateTimeField(_("updated"), auto_now=True)

    change_audit = ChangeAudit(entity="agent", operational_fields=frozenset({"updated_at"}))
    # Set on a probe that checks a version's frozen settings (``agents.services.version_content_problems``): what
    # its runs read as they read stored settings is not refused as a new value would be.
    checked_as_frozen = False
    # The MCP ids the agent binds once this save is done, where its validation cannot read them from the row
    # (``_flow_callable_servers``): a version's probe has its content's ``servers``, which its runs bind; a change
    # that binds servers has those it binds (``agents.services.agent_create`` / ``agent_update``, the admin's
    # form), since the many-to-many is set after the row is validated. None: the stored binding.
    servers_given: list[str] | None = None

    class Meta:
        verbose_name = _("agent")
        verbose_name_plural = _("agents")
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug

    def model_api_key(self) -> str | None:
        """The decrypted model API key (a stored value, or the worker's variable it names), or None."""
        from mcpregistry.models import secret_entry_value

        return secret_entry_value((self.model_secrets or {}).get("api_key"))

    def secret_values(self) -> list[str]:
        """The agent's own secrets, for masking (the model API key)."""
        key = self.model_api_key()
        return [key] if key else []

    def clean(self) -> None:
        """The scripted provider replays canned model turns: offered only where ``PLATFORM_ALLOW_SCRIPTED_MODEL``
        (tests, ``DEBUG``) allows it, never to admins in production."""
        from collections.abc import Callable

        from django.core.exceptions import ValidationError

        from agents.flow_runner import load_flow_builder
        from agents.mcp_context import mcp_context_settings
        from agents.tools import CodeRuleError

        # Every problem is told at once, each at its field (the first one alone hid the others until it was fixed).
        errors: dict[str, Any] = {}

        def check(validate: Callable[[], None]) -> None:
            try:
                validate()
            except ValidationError as exc:
                exc.update_error_dict(errors)

        if self.mode == self.Mode.FLOW and not self.flow_graph:
            errors["flow_graph"] = [
                _("Flow mode needs a flow graph; the registered ones are: %(graphs)s")
                % {"graphs": ", ".join(registered_flow_graphs())}
            ]
        check(self._clean_flow_graph_registered)
        # A graph left unregistered (stored so, unchanged) is not imported: its module's code is no longer trusted.
        if self.mode == self.Mode.FLOW and self.flow_graph in registered_flow_graphs() and "flow_graph" not in errors:
            try:
                load_flow_builder(self.flow_graph)
            except CodeRuleError as exc:
                errors["flow_graph"] = [str(exc)]
        check(self._clean_tool_selection)
        try:
            mcp_context_settings(self.mcp_context)
        except ValueError as exc:
            errors.setdefault("mcp_context", []).append(str(exc))
        check(self._clean_model)
        if self.language not in dict(settings.LANGUAGES):
            errors.setdefault("language", []).append(
                _("Choose one of the platform's languages: %(codes)s.")
                % {"codes": ", ".join(code for code, _name in settings.LANGUAGES)}
            )
        unknown = sorted(set(re.findall(r"\{([^{}]*)\}", self.answer_template or "")) - {"query", "results"})
        leftover = re.sub(r"\{(?:query|results)\}", "", self.answer_template or "")
        if (unknown or "{" in leftover or "}" in leftover) and (
            self.pk is None or self.answer_template != stored_value(self, "answer_template")
        ):
            # An end user would read the placeholder as written ("{bogus} 김하늘…"), or a brace left open.
            errors.setdefault("answer_template", []).append(
                _("Use only the placeholders {query} and {results}, each written whole%(found)s.")
                % {
                    "found": _(" (found: %(names)s)") % {"names": ", ".join(f"{{{n}}}" for n in unknown)}
                    if unknown
                    else ""
                }
            )
        if self.max_iterations is not None and self.max_iterations < 1:
            errors.setdefault("max_iterations", []).append(_("At least 1: the model needs one turn to answer."))
        if self.time_limit_s is not None and self.time_limit_s < 1:
            errors.setdefault("time_limit_s", []).append(_("At least 1 second."))
        if not 0.0 <= float(self.shadow_sample_rate) <= 1.0:
            errors.setdefault("shadow_sample_rate", []).append(_("Enter a share from 0 to 1."))
        for name in ("live_version", "shadow_version"):
            version = getattr(self, name)
            if version is not None and self.pk is not None and version.agent_id != self.pk:
                errors.setdefault(name, []).append(_("Choose a version of this agent."))
        if self.model_provider == self.Provider.SCRIPTED and not scripted_model_allowed():
            errors.setdefault("model_provider", []).append(
                _(
                    "The scripted provider is for tests and demos; set PLATFORM_ALLOW_SCRIPTED_MODEL=1 (or "
                    "DEBUG) to use it."
                )
            )
        if errors:
            raise ValidationError(errors)

    def _clean_tool_selection(self) -> None:
        """The ``tool_selection`` JSON has the shape ``agents.tool_selection`` reads, and a forced first tool
        is refused for a provider that cannot force one, and a named one for a model that can only be made to call
        some tool (``agents.providers.supports_tool_choice``)."""
        from django.core.exceptions import ValidationError

        from agents.providers import supports_tool_choice
        from agents.tool_selection import tool_selection_settings

        try:
            selection = tool_selection_settings(self.tool_selection)
        except ValueError as exc:
            raise ValidationError({"tool_selection": str(exc)}) from None
        forced = selection.force_first_tool
        if forced and not supports_tool_choice(provider=self.model_provider, model_id=self.model_id):
            raise ValidationError(
                {
                    "tool_selection": _(
                        "The %(provider)s provider cannot force the first tool call (tool_choice); leave "
                        "force_first_tool empty or choose a provider that supports it."
                    )
                    % {"provider": self.model_provider}
                }
            )
        if (
            forced
            and forced != "any"
            and not supports_tool_choice(provider=self.model_provider, model_id=self.model_id, kind="tool")
        ):
            raise ValidationError(
                {"tool_selection": named_tool_refused(setting="force_first_tool", model_id=self.model_id)}
            )

    def _clean_flow_graph_registered(self) -> None:
        """A flow graph must be a registered one (``registered_flow_graphs``), whatever the path that saves it
        (the admin's form, ``import_config``, a version's frozen content): the workers import and run the function
        it names, so any importable callable would otherwise run there. Checked before anything is imported, in any
        mode (a react agent's graph runs once its mode is switched). Like the model's other later checks, it applies
        where the value changes (a new agent, another graph, the mode switched to flow): an agent stored with a graph
        registered then and not now still saves as it is, its graph unchanged."""
        from django.core.exceptions import ValidationError

        if not self.flow_graph or self.flow_graph in registered_flow_graphs():
            return
        if self.pk is not None:
            stored = type(self)._base_manager.filter(pk=self.pk).values("flow_graph", "mode").first() or {}
            switched_to_flow = self.mode == self.Mode.FLOW and stored.get("mode") != self.Mode.FLOW
            if stored and stored.get("flow_graph") == self.flow_graph and not switched_to_flow:
                return
        raise ValidationError(
            {
                "flow_graph": _("flow graph '%(path)s' is not registered; the registered ones are: %(graphs)s")
                % {"path": self.flow_graph, "graphs": ", ".join(registered_flow_graphs())}
            }
        )

    def _clean_model(self) -> None:
        """The parameters must parse (``agents.providers.ModelParams``, whatever the provider), with no key but
        theirs and the other modes' (``OTHER_MODE_PARAMS``; an unknown one is named with the valid ones); an OpenAI-compatible
        base URL obeys the same address policy as an MCP server's URL (``PLATFORM_MODEL_ALLOW_PRIVATE_URLS``) and,
        like it, holds no secret (a password, an API key in its query); a key is never a plain model parameter, and
        a ``from_env`` key names an allowed variable."""
        from django.core.exceptions import ValidationError
        from pydantic import ValidationError as PydanticValidationError

        from agents.providers import (
            OTHER_MODE_PARAMS,
            STORED,
            ModelParams,
            provider_param_problems,
            saved_model_params,
            supports_tool_choice,
            tool_choice_forms,
        )
        from mcpregistry.binding_policy import (
            from_env_problem,
            masked_secret_given,
            setting_secret_problem,
            url_credentials_problem,
            url_problem,
        )
        from mcpregistry.contracts import spec_problems, unknown_key_problem
        from mcpregistry.models import secret_entry_value

        errors: dict[str, list[str]] = {}
        params = self.model_params if isinstance(self.model_params, dict) else {}
        # The checks added since agents were first stored apply where their value changes: an agent stored before
        # still saves as it is (``audit.change_guard.stored_value``).
        stored_params = stored_value(self, "model_params") if self.pk is not None else None
        stored = stored_params if isinstance(stored_params, dict) else {}

        def changed(key: str) -> bool:
            return self.pk is None or params.get(key) != stored.get(key)

        if not isinstance(self.model_params, dict | None):
            errors["model_params"] = [str(_("Enter a JSON object: parameter name → its value."))]
        valid = [*ModelParams.model_fields, *OTHER_MODE_PARAMS]
        for key in params:
            if key not in valid and key not in SECRET_PARAM_KEYS:  # a key gets its own message below
                errors.setdefault("model_params", []).append(unknown_key_problem(str(key), valid))
        # Checked whatever the provider: a value kept for another provider is refused now, not when the agent
        # switches to it.
        try:
            # A max_tokens stored before a text or a bool was refused for it is read as a run reads it (STORED), and
            # so is a version's frozen one (``checked_as_frozen``: a roll back to it, its import).
            context = STORED if self.checked_as_frozen or not changed("max_tokens") else None
            parsed = ModelParams.model_validate(params, context=context)
        except PydanticValidationError as exc:
            # Each names where and, for a nested key (retry.attempts), the keys that level has.
            errors.setdefault("model_params", []).extend(spec_problems(exc, ModelParams))
        else:
            if changed("temperature") or self.pk is None or self.model_provider != stored_value(self, "model_provider"):
                # Above what the provider's API takes (Bedrock: 1), every run would fail model:validation.
                for problem in provider_param_problems(provider=self.model_provider, parsed=parsed):
                    errors.setdefault("model_params", []).append(problem)
            if isinstance(self.model_params, dict):
                self.model_params = saved_model_params(self.model_params)  # max_tokens=1024.0 stored as 1024
            if self.model_provider == self.Provider.OPENAI_COMPATIBLE:
                if not parsed.base_url:
                    errors.setdefault("model_params", []).append(
                        str(_('Give the server\'s "base_url", e.g. http://127.0.0.1:11434/v1.'))
                    )
                elif problem := url_problem(
                    parsed.base_url, settings.PLATFORM_MODEL_ALLOW_PRIVATE_URLS, target="model"
                ) or (
                    # A user and password, or what the audit hides as a secret (an api_key in the query), would be
                    # stored, shown and exported in clear: refused where the URL changes (a stored one still saves).
                    changed("base_url")
                    and (
                        url_credentials_problem(parsed.base_url, str(_("the model API key")))
                        or setting_secret_problem("base_url", parsed.base_url, str(_("the model API key")))
                    )
                ):
                    errors.setdefault("model_params", []).append(str(problem))
                if not self.model_id:
                    errors["model_id"] = [str(_("Name the model the server serves."))]
            try:
                forced = tool_choice_name(parsed.tool_choice)
            except ValueError:
                forced = None
                errors.setdefault("model_params", []).append(tool_choice_forms())
            arn = self.model_provider == self.Provider.BEDROCK and str(self.model_id or "").startswith("arn:")

            def model_changed() -> bool:  # a model switched under a choice it cannot take
                return self.pk is None or any(
                    getattr(self, name) != stored_value(self, name) for name in ("model_provider", "model_id")
                )

            if (
                forced not in (None, "auto", "none")
                and not arn  # refused at the model id: whether it could be forced is not known
                and (changed("tool_choice") or model_changed())
            ):
                # Every run would fail when the model is asked to choose so (the provider refuses it).
                if not supports_tool_choice(provider=self.model_provider, model_id=self.model_id):
                    errors.setdefault("model_params", []).append(
                        str(
                            _(
                                "tool_choice: the %(provider)s provider (or this model) cannot be made to call a "
                                "tool; leave it out or use auto."
                            )
                            % {"provider": self.model_provider}
                        )
                    )
                elif forced != "any" and not supports_tool_choice(
                    provider=self.model_provider, model_id=self.model_id, kind="tool"
                ):
                    errors.setdefault("model_params", []).append(
                        named_tool_refused(setting="tool_choice", model_id=self.model_id)
                    )
        if (
            self.model_provider == self.Provider.BEDROCK
            and str(self.model_id or "").startswith("arn:")
            and (self.pk is None or self.model_id != stored_value(self, "model_id"))
        ):
            # langchain-aws looks an ARN's model up in AWS when the model is made, for every run.
            errors["model_id"] = [
                str(
                    _(
                        "Give a Bedrock model id (anthropic.claude-…) or an inference profile id (us.anthropic."
                        "claude-…), not an ARN."
                    )
                )
            ]
        if (
            self.model_provider == self.Provider.SCRIPTED
            and not (isinstance(params.get("script"), list) and params["script"])
            and (changed("script") or self.model_provider != stored_value(self, "model_provider"))
        ):
            # The scripted model replays these turns; without them every run failed model:empty.
            errors.setdefault("model_params", []).append(
                str(
                    _(
                        'The scripted provider replays the model turns of "script": give them as a list, e.g. '
                        '{"script": [{"content": "…"}, {"tool_calls": [{"name": "…", "args": {}}]}]}.'
                    )
                )
            )
        if flow_problems := self._flow_options_problems(params.get("flow"), stored.get("flow")):
            errors.setdefault("model_params", []).extend(flow_problems)
        if any(k in params for k in SECRET_PARAM_KEYS):
            errors.setdefault("model_params", []).append(
                str(_("A key is a secret: put it in the model secrets (api_key), not in the model parameters."))
            )
        secrets = self.model_secrets if isinstance(self.model_secrets, dict) else {}
        if set(secrets) - {"api_key"}:
            errors["model_secrets"] = [str(_('The model secrets hold one entry: "api_key".'))]
        elif problem := from_env_problem(secrets.values(), settings.PLATFORM_MCP_ENV_PASSTHROUGH):
            errors["model_secrets"] = [problem]
        elif _unsendable_key(secrets.get("api_key")) and (
            self.pk is None or secrets != stored_value(self, "model_secrets")
        ):
            # Sent as ``Authorization: Bearer <key>``: a Korean character or a pasted zero-width space failed every
            # run with UnicodeEncodeError, a line break as "the model server could not be reached", no request sent.
            errors["model_secrets"] = [
                str(
                    _(
                        "The model API key can be sent only as visible ASCII text on one line (no Korean, no space, "
                        "no line break, no hidden character): check what was pasted."
                    )
                )
            ]
        elif masked_secret_given(secret_entry_value(secrets.get("api_key")) if "api_key" in secrets else None) and (
            self.pk is None or secrets != stored_value(self, "model_secrets")
        ):
            # The audit's mask typed (or pasted from an export) as the key: stored, it replaced the real key, and
            # the audit record of that change read "***" as before.
            errors["model_secrets"] = [
                str(
                    _(
                        '"***" is how the audit and an export show a secret, not its value: leave the key empty to '
                        "keep the stored one, or give the key itself."
                    )
                )
            ]
        if errors:
            raise ValidationError(errors)

    def _flow_options_problems(self, options: Any, stored: Any) -> list[str]:
        """What is wrong with ``model_params["flow"]``, the options a flow's ``settings.option()`` reads: an
        object whose keys are the flow's (``agents.flow_runner.flow_option_keys``: ``mcp_id`` and those its module
        names), an unknown one named with the valid ones; in flow mode the server the flow calls is one the agent
        can call (``_flow_callable_servers``): its ``mcp_id``, or where it names none and the graph is a shipped
        template, the templates' default (``agents.flows.common.default_mcp_id``). A value that is no object failed
        every run as ``internal``; a typo or another server, every run as ``mcp:not_loaded`` or with the default
        server. The server is checked where the options, the mode, the graph or the servers bound change (a server
        unbound by another change, a deleted one, does not make every other save of the agent fail; a save that
        unbinds the very server the flow calls is refused).

        A graph no longer registered (stored so, unchanged) is not imported for its module's keys: the stored
        options' keys, accepted when it was, are kept beside ``FLOW_OPTIONS``."""
        from agents.flow_runner import flow_option_keys
        from agents.flows.common import default_mcp_id
        from mcpregistry.contracts import unknown_key_problem

        keys = flow_option_keys(self.flow_graph or "")
        if self.flow_graph not in registered_flow_graphs() and isinstance(stored, dict):
            keys.extend(str(key) for key in stored if str(key) not in keys)
        if options is not None and not isinstance(options, dict):
            return [
                "flow: "
                + str(
                    _("the flow's options are an object, a key each (flow.mcp_id=…); the valid keys are: %(keys)s")
                    % {"keys": ", ".join(keys)}
                )
            ]
        given = options or {}
        problems = [f"flow.{key}: {unknown_key_problem(str(key), keys)}" for key in given if key not in keys]
        mcp_id = given.get("mcp_id")
        if mcp_id is not None and (not isinstance(mcp_id, str) or not mcp_id):
            return [*problems, "flow.mcp_id: " + str(_("Enter the MCP id of a server (a text)."))]
        if self.mode != self.Mode.FLOW:
            return problems
        flow_changed = (
            self.pk is None
            or options != stored
            or any(getattr(self, name) != stored_value(self, name) for name in ("mode", "flow_graph"))
            or self._binding_changes()
        )
        if not flow_changed:
            return problems
        if mcp_id is not None:
            callable_ids = self._flow_callable_servers()
            if mcp_id not in callable_ids:
                problems.append(
                    "flow.mcp_id: "
                    + str(
                        _("'%(mcp_id)s' is not a server this agent can call; choose one of: %(servers)s")
                        % {
                            "mcp_id": mcp_id,
                            "servers": ", ".join(callable_ids) or _("none: bind a server to this agent first"),
                        }
                    )
                )
        elif self.flow_graph in FLOW_TEMPLATES:
            # Every shipped template calls the default server when the options name none: an agent that cannot
            # call it failed every run ("MCP '…'의 tool이 로드되지 않음").
            callable_ids = self._flow_callable_servers()
            if default_mcp_id() not in callable_ids:
                problems.append(
                    "flow.mcp_id: "
                    + str(
                        _(
                            "the flow calls the default server '%(mcp_id)s' (PLATFORM_FLOW_DEFAULT_MCP_ID), which "
                            "is not a server this agent can call; choose one of: %(servers)s"
                        )
                        % {
                            "mcp_id": default_mcp_id(),
                            "servers": ", ".join(callable_ids) or _("none: bind a server to this agent first"),
                        }
                    )
                )
        return problems

    def _flow_callable_servers(self) -> list[str]:
        """The MCP ids a flow of this agent can call: those the save binds where it is told them (``servers_given``:
        a version's content, a change that binds servers; exactly, as its runs bind those), else those it binds
        once stored with servers, else every registered one (a save made without the services, whose binding is
        not known here)."""
        if self.servers_given is not None:
            return sorted(self.servers_given)
        bound = sorted(self.servers.values_list("mcp_id", flat=True)) if self.pk is not None else []
        return bound or sorted(McpServer.objects.values_list("mcp_id", flat=True))

    def _binding_changes(self) -> bool:
        """Whether this save of a stored agent binds other servers than it binds now (``servers_given``)."""
        if self.pk is None or self.servers_given is None:
            return False
        return set(self.servers_given) != set(self.servers.values_list("mcp_id", flat=True))


class DeterministicRule(AuditedModel):
    """A routing rule evaluated before the model: when its conditions hold, its tool is called.

    ``when`` holds the conditions (all must hold): ``all_keywords`` and ``any_keywords`` (lists of strings)
    and ``regex`` (named groups usable in ``params`` as ``{match.NAME}``). ``params`` is a JSON object whose
    string values may use ``{query}``, ``{context.KEY}``, ``{data.PATH}`` and ``{match.NAME}``.
    """

    # Said of a rule that names no tool and no code (a form that refused the tool it was given takes it back).
    UNNAMED_TOOL = _("Name the tool to call (or give a code rule).")

    agent = models.ForeignKey(
        Agent,
        on_delete=models.CASCADE,
        related_name="rules",
        null=True,
        blank=True,
        verbose_name=_("agent"),
        help_text=_("Empty: the rule applies to every agent bound to its server."),
    )
    name = models.CharField(_("name"), max_length=200)
    # 32 bits, as import_config reads it (the database would store 64: a rule saved past them did not round-trip).
    order = models.IntegerField(
        _("order"), default=100, validators=[MinValueValidator(-INT32_MAX - 1), MaxValueValidator(INT32_MAX)]
    )
    enabled = models.BooleanField(_("enabled"), default=True)
    server = models.ForeignKey(
        McpServer,
        on_delete=models.PROTECT,
        related_name="rules",
        verbose_name=_("server"),
        null=True,
        blank=True,
        help_text=_("Empty for a code rule: its decorator names the server."),
    )
    tool_name = models.CharField(_("tool"), max_length=200, blank=True)
    code = models.CharField(
        _("code rule"),
        max_length=300,
        blank=True,
        help_text=_("Dotted path of a @deterministic_tool function; then conditions and parameters are its own."),
    )
    when = models.JSONField(encoder=UnicodeJSONEncoder, verbose_name=_("conditions"), default=dict, blank=True)
    force_first_tool = models.CharField(
        _("force the model's first tool"),
        max_length=200,
        blank=True,
        help_text=_(
            'When this rule matches, the model\'s first call must be this tool ("any": some tool); for providers '
            "that support tool_choice."
        ),
    )
    params = models.JSONField(
        encoder=UnicodeJSONEncoder, verbose_name=_("parameters template"), default=dict, blank=True
    )
    answer_template = models.TextField(
        _("offline answer template"),
        blank=True,
        help_text=_(
            "How the offline provider phrases this rule's result: {query}, {match.NAME}, {params.NAME}, "
            "{result} (the tool's text), {result.KEY} (a key of a JSON result) and {result.LIST.*.KEY} (that key "
            "of every item of a list, read as a, b, c; {result.*.KEY} when the result is the list). "
            "{result.KEY|words} writes the words where the value is missing, null or empty."
        ),
    )
    created_at = models.DateTimeField(_("created"), auto_now_add=True)
    updated_at = models.DateTimeField(_("updated"), auto_now=True)

    change_audit = ChangeAudit(entity="deterministic_rule", operational_fields=frozenset({"updated_at"}))

    class Meta:
        verbose_name = _("deterministic rule")
        verbose_name_plural = _("deterministic rules")
        ordering = ["order", "id"]

    def __str__(self) -> str:
        return self.name

    def audit_target(self) -> tuple[str, str]:
        return (self.server.mcp_id if self.server_id else ""), self.tool_name

    def _switched_on(self) -> bool:
        """Whether this save turns a stored, disabled rule on. Checks that came after rules were stored skip what a
        stored rule keeps unchanged, so that it saves as it is; a disabled rule runs nowhere, and its agent may
        drop the server it calls meanwhile (``agent_update`` keeps only those of enabled rules). Switched on, it
        starts to run: the checks that keep a rule that cannot work out of live traffic judge it as a new one."""
        return self.pk is not None and self.enabled and stored_value(self, "enabled") is False

    def clean(self) -> None:
        """A code rule must be importable, decorated, name a server bound to its agent, and take none of the settings
        its code decides (``UNUSED_BY_CODE``, where they are new to it); an admin rule needs a
        known tool on its server, valid conditions, and a params template that fits the tool's contract. A stored
        rule skips the checks that came after rules were stored where what they read is unchanged, unless it is
        being switched on (``_switched_on``); a secret in its params is judged where they change only (that is
        about storing them, which switching on does not change)."""
        from django.core.exceptions import ValidationError
        from pydantic import ValidationError as PydanticValidationError

        from agent_platform.text import nfc_value
        from agents.deterministic import WhenSpec, placeholder_problems
        from agents.providers import supports_tool_choice
        from agents.tools import CodeRuleError, load_code_rule
        from mcpregistry.contracts import spec_problems

        # Its literals composed, as a query and its placeholders are (and as import_config stores them): a name typed
        # decomposed (macOS) was sent so, and the tool found no such employee.
        if isinstance(self.params, dict):
            self.params = nfc_value(self.params)
        errors: dict[str, list[str]] = {}
        switched_on = self._switched_on()
        if self.force_first_tool and self.agent_id:
            provider, model_id = self.agent.model_provider, self.agent.model_id
            if not supports_tool_choice(provider=provider, model_id=model_id):
                errors["force_first_tool"] = [
                    str(
                        _(
                            "The %(provider)s provider cannot force the first tool call (tool_choice); leave "
                            "force_first_tool empty or choose a provider that supports it."
                        )
                        % {"provider": provider}
                    )
                ]
            elif self.force_first_tool != "any" and not supports_tool_choice(
                provider=provider, model_id=model_id, kind="tool"
            ):
                errors["force_first_tool"] = [named_tool_refused(setting="force_first_tool", model_id=model_id)]
            elif self.agent is not None and (
                switched_on
                or (stored_value(self, "force_first_tool"), stored_value(self, "agent_id"))
                != (self.force_first_tool, self.agent_id)
            ):
                # Where the forced tool or the agent changes (a stored rule saves as it is; its runs' traces say
                # that the forcing was dropped): a tool outside the agent's tool selection is never offered.
                from agents.agent_settings_form import rule_forcing_problems  # the form's check; forms load later

                servers = [server for server in self.agent.servers.all() if server.enabled]
                outside = rule_forcing_problems(
                    self.force_first_tool, tool_selection=self.agent.tool_selection, servers=servers
                )
                if outside:
                    errors["force_first_tool"] = outside
        if (
            self.params
            and (self.pk is None or self.params != stored_value(self, "params"))
            and (found := rule_params_secret_problems(self.params))
        ):
            errors["params"] = found
        if (
            self.when
            and (self.pk is None or self.when != stored_value(self, "when"))
            and (found := rule_context_secret_problems(self.when))
        ):
            errors.setdefault("when", []).extend(found)
        if self.code:
            try:
                _fn, mcp_id = load_code_rule(self.code)
            except CodeRuleError as exc:
                raise ValidationError({"code": [str(exc)]}) from None
            if self.agent_id and not self.agent.servers.filter(mcp_id=mcp_id).exists():
                errors["code"] = [
                    str(_("The rule is for MCP '%(id)s', which this agent does not bind.") % {"id": mcp_id})
                ]
            if unused := self._unused_by_code():
                errors.setdefault("code", []).append(
                    str(
                        _(
                            "A code rule decides its own conditions, tool and parameters in its code (its decorator "
                            "names the server), and no run applies them here: clear %(fields)s."
                        )
                        % {"fields": ", ".join(unused)}
                    )
                )
        else:
            if self.server_id is None:
                errors["server"] = [str(_("Choose the server (or give a code rule)."))]
            elif self.agent_id and not self.agent.servers.filter(pk=self.server_id).exists():
                # Where the target changes or the rule is switched on (a rule stored before the check still saves
                # as it is): a rule for a server its agent does not bind fails every run it matches
                # (``mcp:not_loaded``).
                stored = type(self)._base_manager.filter(pk=self.pk).values_list("agent_id", "server_id").first()
                if switched_on or stored != (self.agent_id, self.server_id):
                    errors["server"] = [
                        str(
                            _("The rule is for MCP '%(id)s', which this agent does not bind.")
                            % {"id": self.server.mcp_id}
                        )
                    ]
            if not self.tool_name:
                errors["tool_name"] = [str(self.UNNAMED_TOOL)]
            try:
                WhenSpec.model_validate(self.when or {})
            except PydanticValidationError as exc:
                errors["when"] = spec_problems(exc, WhenSpec)
            else:
                empty = empty_keyword_problems(self.when or {})
                if empty and (self.pk is None or switched_on or self.when != stored_value(self, "when")):
                    errors["when"] = empty
            # Checks that came after rules were stored read only what changed: a stored rule saves as it is (its
            # literal braces, which its tool may read itself; a template naming a parameter it never sent; text
            # where its tool takes another type), unless it is switched on.
            stored_as_is = self.pk is not None and not switched_on
            params_kept = stored_as_is and self.params == stored_value(self, "params")
            template_kept = stored_as_is and self.answer_template == stored_value(self, "answer_template")
            problems = placeholder_problems(
                self.when,
                self.params,
                self.answer_template,
                attempts=not params_kept,
                named_params=not (params_kept and template_kept),
            )
            for field_name, found in problems.items():
                errors.setdefault(field_name, []).extend(found)
            available = (self.when or {}).get("tool_available") if isinstance(self.when, dict) else None
            if isinstance(available, str) and available and self.server_id:
                names = sorted(self.server.tools.values_list("name", flat=True))
                if names and available not in names:  # a server not discovered yet has no list to check against
                    errors.setdefault("when", []).append(
                        str(
                            _("tool_available: '%(tool)s' is not a tool of this server; its tools are: %(names)s")
                            % {"tool": available, "names": ", ".join(names)}
                        )
                    )
            if self.server_id and self.tool_name:
                tool = self.server.tools.filter(name=self.tool_name).select_related("contract").first()
                if tool is None and self.server.tools.filter(discovered_at__isnull=False).exists():
                    names = sorted(self.server.tools.filter(available=True).values_list("name", flat=True))
                    errors["tool_name"] = [
                        str(
                            _("'%(tool)s' is not a tool of this server; its tools are: %(names)s")
                            % {"tool": self.tool_name, "names": ", ".join(names) or "—"}
                        )
                    ]
                elif tool is not None:
                    call_kept = params_kept and (
                        type(self)._base_manager.filter(pk=self.pk).values_list("server_id", "tool_name").first()
                        == (self.server_id, self.tool_name)
                    )
                    if problems := self.call_problems(tool, text_into_typed=not call_kept):
                        errors.setdefault("params", []).extend(self._unknown_arguments_worded(tool, problems))
        if errors:
            raise ValidationError(errors)

    # What a code rule decides in its code (seed 000), which no run reads of it; its answer template and the model's
    # first tool are applied to its matches as to an admin rule's.
    UNUSED_BY_CODE = ("when", "server", "tool_name", "params")

    def _unused_by_code(self) -> list[str]:
        """The labels of the settings a code rule has that no run applies (``UNUSED_BY_CODE``), where they are new
        to it: a code rule stored with them before the check (or with a code of its own since) saves as it is,
        so that it can still be switched off, moved or renamed."""
        if not self.code:
            return []
        kept = self.pk is not None and stored_value(self, "code") == self.code
        unused = []
        for name in self.UNUSED_BY_CODE:
            field = self._meta.get_field(name)
            value = getattr(self, field.attname)
            if value not in (None, "", {}) and not (kept and value == stored_value(self, field.attname)):
                unused.append(str(field.verbose_name))
        return unused

    def _unknown_arguments_worded(self, tool: Any, problems: list[str]) -> list[str]:
        """``call_problems`` as the rule's page says them: an argument the tool does not have, without the gate's
        reason code, with the arguments it has."""
        from mcpregistry.contracts import argument_constraints, argument_names

        contract = getattr(tool, "contract", None)
        constraints = contract.args if contract is not None else argument_constraints(tool.input_schema)
        names = sorted(argument_names(constraints or {}, tool.input_schema) or [])
        params = self.params if isinstance(self.params, dict) else {}
        unknown = {f"args:unknown:{name}: ": name for name in params if name not in names}
        worded = []
        for problem in problems:
            name = next((n for prefix, n in unknown.items() if problem.startswith(prefix)), None)
            if name is None:
                worded.append(problem)
            elif names:
                worded.append(
                    str(
                        _("The tool has no argument '%(name)s'; its arguments are: %(names)s.")
                        % {"name": name, "names": ", ".join(names)}
                    )
                )
            else:
                worded.append(str(_("The tool has no argument '%(name)s'; it takes none.") % {"name": name}))
        return worded

    def call_problems(self, tool: Any, *, text_into_typed: bool = True) -> list[str]:
        """What ``tool``'s stored contract (without one, its input schema) refuses of this rule's parameters
        (``template_problems``): each names a call the gate would refuse before sending it. The rule's save refuses
        them; a contract's save names the stored rules it leaves refused (``agents.selectors``)."""
        from agents.deterministic import template_problems
        from mcpregistry.contracts import argument_constraints

        contract = getattr(tool, "contract", None)
        constraints = contract.args if contract is not None else argument_constraints(tool.input_schema)
        return template_problems(
            constraints or {},
            self.params or {},
            refuse_unknown=contract is None or contract.unknown_args == "refuse",
            input_schema=tool.input_schema,
            text_into_typed=text_into_typed,
        )


class AgentVersion(AuditedModel):
    """A published, immutable snapshot of an agent: prompt, model and parameters, mode, its rules (conditions and
    params) and the contracts of its tools as they were when it was published (``agents.versions.VersionContent``).
    Versions are only ever created (publishing, rolling back); a run records the one it ran."""

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="versions", verbose_name=_("agent"))
    number = models.PositiveIntegerField(_("number"))
    content = models.JSONField(encoder=UnicodeJSONEncoder, verbose_name=_("frozen content"), default=dict)
    digest = models.CharField(_("content digest"), max_length=64)
    note = models.CharField(_("note"), max_length=500, blank=True)
    published_by = models.CharField(_("published by"), max_length=200, blank=True)
    created_at = models.DateTimeField(_("published"), auto_now_add=True)

    change_audit = ChangeAudit(entity="agent_version")

    class Meta:
        verbose_name = _("agent version")
        verbose_name_plural = _("agent versions")
        ordering = ["agent", "-number"]
        constraints = [models.UniqueConstraint(fields=["agent", "number"], name="agentversion_unique_number")]

    def __str__(self) -> str:
        return f"{self.agent.slug} v{self.number}"


class AgentArm(AuditedModel):
    """One arm of an agent's A/B split: live traffic is divided between the arms by weight, sticky per caller."""

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="arms", verbose_name=_("agent"))
    name = models.CharField(
        _("arm"),
        max_length=32,
        db_index=True,
        validators=[validate_ascii_slug],
        help_text=_(
            "ASCII letters (a–z, A–Z), digits, _ and - only, e.g. a or control: the name is recorded on each run "
            "and shown in the A/B results."
        ),
    )
    version = models.ForeignKey(AgentVersion, on_delete=models.CASCADE, related_name="arms", verbose_name=_("version"))
    weight = models.PositiveIntegerField(
        _("weight"),
        default=1,
        validators=[MaxValueValidator(INT32_MAX)],
        help_text=_("Share of traffic, relative to the other arms; 0 pauses the arm."),
    )
    created_at = models.DateTimeField(_("created"), auto_now_add=True)

    change_audit = ChangeAudit(entity="agent_arm")

    class Meta:
        verbose_name = _("A/B arm")
        verbose_name_plural = _("A/B arms")
        ordering = ["agent", "name"]
        constraints = [models.UniqueConstraint(fields=["agent", "name"], name="agentarm_unique_name")]

    def __str__(self) -> str:
        return f"{self.agent.slug}:{self.name}"

    def clean(self) -> None:
        from django.core.exceptions import ValidationError

        if self.version_id is not None and self.agent_id is not None and self.version.agent_id != self.agent_id:
            raise ValidationError({"version": _("Choose a version of this agent.")})


class ApiKey(AuditedModel):
    """A key an API caller presents as ``Authorization: Bearer <key>``. Only its SHA-256 digest is stored."""

    name = models.CharField(_("name"), max_length=200)
    prefix = models.CharField(_("prefix"), max_length=16, db_index=True, editable=False)
    digest = models.CharField(_("digest"), max_length=64, unique=True, editable=False)
    agents = models.ManyToManyField(
        Agent, blank=True, related_name="api_keys", verbose_name=_("agents"), help_text=_("Empty: every agent.")
    )
    rate = models.CharField(
        _("rate limit"),
        max_length=20,
        blank=True,
        help_text=_("Requests per period for this key, e.g. 60/min or 1000/hour. Empty: the platform default."),
    )
    admin = models.BooleanField(
        _("admin key"),
        default=False,
        help_text=_("May use the admin API (eval sets and eval runs under /api/v1/evals/). Off for callers' keys."),
    )
    created_at = models.DateTimeField(_("created"), auto_now_add=True)
    last_used_at = models.DateTimeField(_("last used"), null=True, blank=True)
    revoked_at = models.DateTimeField(_("revoked"), null=True, blank=True)
    # The admin's add form that issued it (a random token of the form, not a secret): the same form sent again, or
    # twice at once, issues nothing more (agents.admin.ApiKeyAdmin).
    issue_token = models.CharField(
        _("add form token"), max_length=64, null=True, blank=True, unique=True, editable=False
    )

    change_audit = ChangeAudit(
        entity="api_key",
        operational_fields=frozenset({"last_used_at"}),
        unrecorded_fields=frozenset({"digest", "issue_token"}),
    )

    class Meta:
        verbose_name = _("API key")
        verbose_name_plural = _("API keys")
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    def audit_actor_label(self) -> str:
        return f"api_key:{self.prefix}"

    # DRF asks these of request.user.
    @property
    def is_authenticated(self) -> bool:
        return self.revoked_at is None


class Run(models.Model):
    """One query to one agent, executed by a worker: its input, trace, outcome and timings."""

    class Purpose(models.TextChoices):
        LIVE = "live", _("live")
        EVAL = "eval", _("eval")
        SHADOW = "shadow", _("shadow")

    class Status(models.TextChoices):
        QUEUED = "queued", _("queued")
        RUNNING = "running", _("running")
        SUCCEEDED = "succeeded", _("succeeded")
        FAILED = "failed", _("failed")
        AWAITING_APPROVAL = "awaiting_approval", _("awaiting approval")
        CANCELLED = "cancelled", _("cancelled")

    id = models.UUIDField(_("ID"), primary_key=True, default=uuid.uuid4, editable=False)
    agent = models.ForeignKey(Agent, on_delete=models.PROTECT, related_name="runs", verbose_name=_("agent"))
    api_key = models.ForeignKey(
        ApiKey,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="runs",
        verbose_name=_("API key"),
        db_index=False,  # the indexes in Meta lead with it
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="runs",
        verbose_name=_("started by (admin user)"),
    )
    query = models.TextField(_("query"))
    context = models.JSONField(encoder=UnicodeJSONEncoder, verbose_name=_("context"), default=dict, blank=True)
    a2a_data = models.JSONField(encoder=UnicodeJSONEncoder, verbose_name=_("A2A data"), default=list, blank=True)
    a2a_files = models.JSONField(encoder=UnicodeJSONEncoder, verbose_name=_("A2A files"), default=list, blank=True)
    status = models.CharField(_("status"), max_length=20, choices=Status.choices, default=Status.QUEUED, db_index=True)
    answer = models.TextField(_("answer"), blank=True)
    error_code = models.CharField(_("error code"), max_length=100, blank=True)
    error_message = models.TextField(_("error message"), blank=True)
    deterministic_results = models.JSONField(
        encoder=UnicodeJSONEncoder, verbose_name=_("deterministic results"), default=list, blank=True
    )
    messages = models.JSONField(encoder=UnicodeJSONEncoder, verbose_name=_("trace"), default=list, blank=True)
    timings = models.JSONField(encoder=UnicodeJSONEncoder, verbose_name=_("timings (ms)"), default=dict, blank=True)
    conversation = models.JSONField(
        encoder=UnicodeJSONEncoder,
        verbose_name=_("conversation (masked, for resuming)"),
        default=list,
        blank=True,
        editable=False,
    )
    token_usage = models.JSONField(encoder=UnicodeJSONEncoder, verbose_name=_("token usage"), default=dict, blank=True)
    tokens = models.PositiveBigIntegerField(_("tokens"), default=0, help_text=_("Input and output tokens, all calls."))
    cost_micros = models.PositiveBigIntegerField(
        _("cost (millionths of a US dollar)"), default=0, help_text=_("From the price table when the run finished.")
    )
    tool_failures = models.PositiveIntegerField(
        _("tool failures"), default=0, help_text=_("Tool calls of the run that failed (deterministic and the model's).")
    )
    idempotency_key = models.CharField(_("idempotency key"), max_length=200, blank=True)
    request_digest = models.CharField(_("request digest"), max_length=64, blank=True, editable=False)
    delivery_count = models.PositiveIntegerField(_("deliveries"), default=0, editable=False)
    worker = models.CharField(_("worker"), max_length=200, blank=True, editable=False)
    heartbeat_at = models.DateTimeField(_("last heartbeat"), null=True, blank=True, editable=False)
    lease_expires_at = models.DateTimeField(_("lease expires"), null=True, blank=True, editable=False)
    # The W3C ``traceparent`` of the span that created the run (the ``POST /api/v1/runs`` request's), where that
    # process records traces: each later pass's task span links to it (``agent_platform.telemetry``). Ids only.
    traceparent = models.CharField(_("trace context"), max_length=55, blank=True, editable=False)
    created_at = models.DateTimeField(_("created"), auto_now_add=True, db_index=True)
    started_at = models.DateTimeField(_("started"), null=True, blank=True)
    # When the current pass was claimed (a resumed run's pass starts again): the reconciler counts the time limit
    # from it. Set by the claim's own compare-and-swap, so no moment exists where a claimed pass looks old.
    pass_started_at = models.DateTimeField(_("current pass started"), null=True, blank=True, editable=False)
    finished_at = models.DateTimeField(_("finished"), null=True, blank=True)
    # Why the run exists: a caller's (live), an eval case's, or a shadow of a live run. Eval and shadow runs never
    # execute a write tool (the gate answers ``eval:write_blocked``) except on the servers named in
    # ``write_sandbox``, and their tool calls are audited under their purpose, apart from production metrics.
    purpose = models.CharField(
        _("purpose"), max_length=10, choices=Purpose.choices, default=Purpose.LIVE, db_index=True, editable=False
    )
    write_sandbox = models.JSONField(
        encoder=UnicodeJSONEncoder,
        verbose_name=_("write sandbox servers"),
        default=list,
        blank=True,
        editable=False,
        help_text=_("MCP server ids whose write tools an eval or shadow run may execute (sandbox servers)."),
    )

    version = models.ForeignKey(
        AgentVersion,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="runs",
        verbose_name=_("version"),
        help_text=_("The published version the run ran. Empty: the agent's draft (never published)."),
    )
    arm = models.CharField(_("A/B arm"), max_length=32, blank=True, db_index=True)
    shadow_of = models.ForeignKey(
        "self",
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="shadows",
        verbose_name=_("shadow of"),
        help_text=_("A shadow run: the live run whose query it repeated on the candidate version."),
    )
    feedback_score = models.FloatField(_("feedback score"), null=True, blank=True)
    feedback_scale = models.CharField(_("feedback scale"), max_length=10, blank=True)
    feedback_comment = models.TextField(_("feedback comment"), blank=True)
    feedback_at = models.DateTimeField(_("feedback given"), null=True, blank=True)

    change_audit = NotConfiguration(
        "a run is a caller's request and its outcome; its tool calls are audited as they happen"
    )

    class Meta:
        verbose_name = _("run")
        verbose_name_plural = _("runs")
        ordering = ["-created_at"]
        indexes = [
            # A key's runs are read in two ways, each from its own index rather than by walking and sorting every
            # run of the key (a cost per request that grew with the key's history): ``run_submit``'s lookup of an
            # Idempotency-Key, on every POST that sends one, and ``GET /runs`` (newest first, a page at a time)
            # with ``GET /usage`` (the key's runs since a date).
            models.Index(fields=["api_key", "idempotency_key", "created_at"], name="run_key_idempotency_idx"),
            models.Index(fields=["api_key", "created_at", "id"], name="run_key_created_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.agent.slug} {self.id}"

    @property
    def audit_events(self) -> QuerySet[AuditEvent]:
        """The run's audit events (they refer to it by id, and outlive it under retention); those committed but
        not chained yet (deferred chaining, ``audit.services``) are chained first, so a run's trace read just
        after the run has every one."""
        audit_chain_catch_up()
        return AuditEvent.objects.filter(run_id=self.pk)

    @property
    def is_finished(self) -> bool:
        return self.status in {self.Status.SUCCEEDED, self.Status.FAILED, self.Status.CANCELLED}

    @property
    def language(self) -> str:
        """The language the run speaks in: its version's (frozen when published; an A/B arm's, a shadow's), else
        its agent's as stored, as the engine runs it; a draft's later edit is not the run's."""
        if self.version_id is not None:
            frozen = (self.version.content or {}).get("agent") or {}
            if "language" in frozen:
                return str(frozen["language"] or "")
        return str(self.agent.language or "")


class Approval(models.Model):
    """A person's decision on one write call: bound to a hash of the exact tool and arguments, single-use,
    expiring. Its life: pending → approved | rejected | expired; approved → executing → executed |
    outcome_unknown. ``outcome_unknown``: the call was sent and no answer came (a timeout, a dropped session, a
    worker that died mid-call); it may or may not have taken effect, and it is never sent again."""

    class Status(models.TextChoices):
        PENDING = "pending", _("pending")
        APPROVED = "approved", _("approved")
        REJECTED = "rejected", _("rejected")
        EXPIRED = "expired", _("expired")
        EXECUTING = "executing", _("executing")
        EXECUTED = "executed", _("executed")
        OUTCOME_UNKNOWN = "outcome_unknown", _("outcome unknown")

    id = models.UUIDField(_("ID"), primary_key=True, default=uuid.uuid4, editable=False)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="approvals", verbose_name=_("run"))
    mcp_id = models.CharField(_("server"), max_length=64)
    tool = models.CharField(_("tool"), max_length=200)
    args = models.JSONField(encoder=UnicodeJSONEncoder, verbose_name=_("arguments (masked)"), default=dict)
    # The exact arguments, encrypted: what an approved call is executed with (the stored conversation is masked).
    exact_args = EncryptedJSONField(_("exact arguments (encrypted)"), default=dict, blank=True, editable=False)
    call_hash = models.CharField(_("call hash"), max_length=64, db_index=True)
    call_id = models.CharField(_("call id"), max_length=100, blank=True)
    status = models.CharField(_("status"), max_length=20, choices=Status.choices, default=Status.PENDING, db_index=True)
    requested_by = models.CharField(_("requested by"), max_length=200, blank=True)
    decided_by = models.CharField(_("decided by"), max_length=200, blank=True)
    decided_at = models.DateTimeField(_("decided"), null=True, blank=True)
    reason = models.TextField(_("reason"), blank=True)
    expires_at = models.DateTimeField(_("expires"))
    result = models.JSONField(encoder=UnicodeJSONEncoder, verbose_name=_("result (masked)"), null=True, blank=True)
    created_at = models.DateTimeField(_("requested"), auto_now_add=True)

    change_audit = NotConfiguration(
        "decisions are audited by the approval services (requested, approved/rejected, executed)"
    )

    class Meta:
        verbose_name = _("approval")
        verbose_name_plural = _("approvals")
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.mcp_id}.{self.tool} ({self.get_status_display()})"


# The statuses of a run that has not ended: it may still be cancelled, may still spend, and settles its budgets when
# it ends.
RUN_IN_FLIGHT_STATUSES = (Run.Status.QUEUED, Run.Status.AWAITING_APPROVAL, Run.Status.RUNNING)


class RunEvent(models.Model):
    """What a run did, as it happened, in order: what ``GET /api/v1/runs/{id}/events`` streams."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events", verbose_name=_("run"))
    seq = models.PositiveIntegerField(_("sequence"))
    kind = models.CharField(_("kind"), max_length=40)
    data = models.JSONField(encoder=UnicodeJSONEncoder, verbose_name=_("data (masked)"), default=dict)
    created_at = models.DateTimeField(_("time"), auto_now_add=True)

    change_audit = NotConfiguration("a run's progress stream, derived from the run")

    class Meta:
        verbose_name = _("run event")
        verbose_name_plural = _("run events")
        ordering = ["run", "seq"]
        constraints = [models.UniqueConstraint(fields=["run", "seq"], name="runevent_unique_run_seq")]

    def __str__(self) -> str:
        return f"{self.run_id}#{self.seq} {self.kind}"


class WorkerHeartbeat(models.Model):
    """A Celery worker's last sign of life (its timer writes it; ``/readyz`` asks for a recent one of a worker that
    takes live runs), with the queues it consumes and the broker it consumes them from. Both blank: unknown (a row
    written before the worker wrote them)."""

    worker = models.CharField(_("worker"), max_length=200, primary_key=True)
    seen_at = models.DateTimeField(_("last seen"), db_index=True)
    # The queues' names, comma-separated and sorted (``agents.heartbeats.QUEUE_SEPARATOR``).
    queues = models.CharField(_("queues"), max_length=1000, blank=True, default="")
    # scheme://host:port/db, never a password (``agents.heartbeats.broker_identity``).
    broker = models.CharField(_("broker"), max_length=500, blank=True, default="")

    change_audit = NotConfiguration("a worker's liveness signal, written by the worker itself")

    class Meta:
        verbose_name = _("worker heartbeat")
        verbose_name_plural = _("worker heartbeats")

    def __str__(self) -> str:
        return f"{self.worker} @ {self.seen_at:%Y-%m-%d %H:%M:%S}"


class ModelPrice(AuditedModel):
    """What a model costs, in US dollars per million tokens (input, output, and prompt-cache reads and writes;
    empty cache prices: the input price). A run's cost is its tokens at the price of its agent's model."""

    provider = models.CharField(_("model provider"), max_length=20, choices=Agent.Provider.choices)
    model_id = models.CharField(_("model id"), max_length=200, blank=True)
    input_per_mtok = models.DecimalField(_("input, USD per 1M tokens"), max_digits=12, decimal_places=4)
    output_per_mtok = models.DecimalField(_("output, USD per 1M tokens"), max_digits=12, decimal_places=4)
    cache_read_per_mtok = models.DecimalField(
        _("cache read, USD per 1M tokens"), max_digits=12, decimal_places=4, null=True, blank=True
    )
    cache_write_per_mtok = models.DecimalField(
        _("cache write, USD per 1M tokens"), max_digits=12, decimal_places=4, null=True, blank=True
    )
    updated_at = models.DateTimeField(_("updated"), auto_now=True)

    change_audit = ChangeAudit(entity="model_price", operational_fields=frozenset({"updated_at"}))

    class Meta:
        verbose_name = _("model price")
        verbose_name_plural = _("model prices")
        ordering = ["provider", "model_id"]
        constraints = [models.UniqueConstraint(fields=["provider", "model_id"], name="model_price_unique_model")]

    def __str__(self) -> str:
        return f"{self.provider}:{self.model_id or '*'}"

    def clean(self) -> None:
        from django.core.exceptions import ValidationError

        for name in ("input_per_mtok", "output_per_mtok", "cache_read_per_mtok", "cache_write_per_mtok"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValidationError({name: _("A price cannot be negative.")})


# --- money, shared by a budget's clean and ``agents.budgets`` (which imports this module, not the reverse) ---

MICROS_PER_USD = 1_000_000


def usd_text(micros: int | float | None) -> str:
    """Dollars as people read them: two decimals at least, down to the micro-dollar a run's cost is counted in
    and no further (``0.00``, ``0.0123``, ``0.000015``, ``1,234.50``); never a float's ``1.5e-05`` or ``0.0``."""
    value = round(micros or 0)  # micro-dollars; a float of them rounded, never cut
    whole, micro = divmod(abs(value), MICROS_PER_USD)
    fraction = f"{micro:06d}".rstrip("0").ljust(2, "0")
    return f"{'-' if value < 0 else ''}{whole:,}.{fraction}"


# The platform's own model that calls no service (it answers from the deterministic results): its runs cost nothing,
# priced or not, so a cost limit is not void for it as it is for a model with no price
# (``Budget._reservation_cost_check``). The scripted model stands in for a paid one (tests and demos price it).
UNPAID_PROVIDERS = frozenset({Agent.Provider.OFFLINE})


def model_price_for(*, provider: str, model_id: str) -> ModelPrice | None:
    """The price of this exact model, else the provider's catch-all row (empty model id), else None (free)."""
    prices = {p.model_id: p for p in ModelPrice.objects.filter(provider=provider, model_id__in=[model_id, ""])}
    return prices.get(model_id) or prices.get("")


def version_model(version: AgentVersion | None, agent: Agent) -> tuple[str, str]:
    """The provider and model the runs of ``version`` call: its own, frozen when published, else (no version, or
    one frozen without a model) ``agent``'s as stored. A run is priced by it, never by the agent's draft."""
    frozen = ((version.content or {}).get("agent") or {}) if version is not None else {}
    if frozen.get("model_provider"):
        return str(frozen["model_provider"]), str(frozen.get("model_id") or "")
    return agent.model_provider, agent.model_id


def reservation_cost_micros(*, price: ModelPrice | None, tokens: int) -> int:
    """The most ``tokens`` can cost at this price, in millionths of a dollar (every one at the dearest rate, a
    cache read's or write's included: either may be priced above input and output)."""
    if price is None:
        return 0
    rates = [
        price.input_per_mtok,
        price.output_per_mtok,
        price.cache_read_per_mtok or Decimal(0),
        price.cache_write_per_mtok or Decimal(0),
    ]
    return math.ceil(Decimal(tokens) * max(rates))


class Budget(AuditedModel):
    """A ceiling on the tokens or the cost (or both) of one API key's or one agent's runs per day or month (UTC).

    A run is admitted only if its reservation (``run_reservation_tokens``, and their cost at the agent's price)
    still fits beside what the period used and what the runs in flight reserved; it is settled with its real
    usage when it ends, and a run that reaches its reservation stops (``budget:run_ceiling``). See
    ``agents.budgets``."""

    class Period(models.TextChoices):
        DAY = "day", _("day")
        MONTH = "month", _("month")

    api_key = models.ForeignKey(
        ApiKey, on_delete=models.CASCADE, null=True, blank=True, related_name="budgets", verbose_name=_("API key")
    )
    agent = models.ForeignKey(
        Agent, on_delete=models.CASCADE, null=True, blank=True, related_name="budgets", verbose_name=_("agent")
    )
    period = models.CharField(_("period"), max_length=10, choices=Period.choices, default=Period.DAY)
    max_tokens = models.PositiveBigIntegerField(_("token limit"), null=True, blank=True)
    max_cost = models.DecimalField(_("cost limit (USD)"), max_digits=14, decimal_places=4, null=True, blank=True)
    run_reservation_tokens = models.PositiveIntegerField(
        _("tokens reserved per run"),
        default=20000,
        # Also what keeps a reservation's cost at the dearest price (12 digits, agents.ModelPrice) countable in
        # the 64-bit cost counters (agents.budgets).
        validators=[MaxValueValidator(INT32_MAX)],
        help_text=_(
            "Set aside when a run is admitted and settled with its real usage when it ends; every model call is "
            "capped to what is left of them, and a run whose next call might not fit stops."
        ),
    )
    enabled = models.BooleanField(_("enabled"), default=True)
    updated_at = models.DateTimeField(_("updated"), auto_now=True)

    change_audit = ChangeAudit(entity="budget", operational_fields=frozenset({"updated_at"}))

    class Meta:
        verbose_name = _("budget")
        verbose_name_plural = _("budgets")
        ordering = ["id"]

    def __str__(self) -> str:
        # In the reader's words on the admin's pages; the audit records it in none (``audit.changes.recorded_name``).
        owner = (
            gettext("API key %(key)s") % {"key": self.api_key}
            if self.api_key_id
            else gettext("agent %(agent)s") % {"agent": self.agent}
        )
        return f"{owner} / {self.get_period_display()}"

    def clean(self) -> None:
        from django.core.exceptions import ValidationError

        if bool(self.api_key_id) == bool(self.agent_id):
            raise ValidationError(_("A budget belongs to one API key or one agent."))
        if self.max_tokens is None and self.max_cost is None:
            # The code lets the admin's form leave it out where a limit was given but refused at its field.
            raise ValidationError(_("Give a token limit, a cost limit, or both."), code="no_limit")
        if self.max_cost is not None and self.max_cost < 0:
            raise ValidationError({"max_cost": _("A limit cannot be negative.")})
        if self.run_reservation_tokens < 1:
            raise ValidationError({"run_reservation_tokens": _("Reserve at least one token per run.")})
        if self.max_tokens is not None and self.run_reservation_tokens > self.max_tokens:
            raise ValidationError(
                {
                    "run_reservation_tokens": _(
                        "A run reserves %(reserved)s tokens, more than the limit of %(limit)s: no run would be "
                        "admitted. Reserve at most the limit."
                    )
                    % {"reserved": f"{self.run_reservation_tokens:,}", "limit": f"{self.max_tokens:,}"}
                }
            )
        self._reservation_cost_check()

    def _reservation_cost_check(self) -> None:
        """An agent's budget whose cost limit is below what one run's reservation costs at its model's price would
        admit no run: every submission would be told the budget is used up; one whose model has no price would
        limit nothing (its runs cost nothing). An API key's budget is checked at each submission instead
        (``agents.budgets.budget_reserve``): the key's runs may call any model. Judged only where this save sets
        the figures it reads or switches the budget on (``_reservation_cost_judged``)."""
        from django.core.exceptions import ValidationError

        if self.max_cost is None or self.agent is None or not self._reservation_cost_judged():
            return
        provider, model_id = self._priced_model()
        price = model_price_for(provider=provider, model_id=model_id)
        if price is None and provider not in UNPAID_PROVIDERS:
            raise ValidationError(
                {
                    "max_cost": _(
                        "Model %(model)s has no price: its runs would cost nothing and the cost limit would limit "
                        "nothing. Set its price under Model prices first, or give a token limit only."
                    )
                    % {"model": model_id or provider}
                }
            )
        cost = reservation_cost_micros(price=price, tokens=self.run_reservation_tokens)
        limit = int(self.max_cost * MICROS_PER_USD)
        if cost <= limit:
            return
        raise ValidationError(
            {
                "max_cost": _(
                    "A run reserves %(reserved)s tokens, which cost up to US$%(cost)s at the price of model "
                    "%(model)s, more than the cost limit of US$%(limit)s: no run would be admitted. Raise the limit "
                    "or reserve fewer tokens per run."
                )
                % {
                    "reserved": f"{self.run_reservation_tokens:,}",
                    "cost": usd_text(cost),
                    "model": model_id or provider,
                    "limit": usd_text(limit),
                }
            }
        )

    def _reservation_cost_judged(self) -> bool:
        """Whether the reservation's cost is judged at this save: the budget is on, and new, switched on, or given
        another cost limit, reservation or agent. Any other save of a stored budget keeps it as it is, as the other
        checks added after rows were stored do: a model's price raised since must not stop an admin switching the
        budget off (a disabled one limits nothing; it is judged when switched on) or editing the rest."""
        if not self.enabled:
            return False
        if not self.pk:
            return True
        stored = (
            type(self)
            ._base_manager.filter(pk=self.pk)
            .values_list("enabled", "max_cost", "run_reservation_tokens", "agent_id")
            .first()
        )
        return stored != (True, self.max_cost, self.run_reservation_tokens, self.agent_id)

    def _priced_model(self) -> tuple[str, str]:
        """The provider and model the agent's new live runs call and are charged at (as ``agents.budgets.run_model``
        reads a run's): its live version's, frozen when published, else the agent's as stored (an agent never
        published runs as edited). A draft's model runs nowhere until it is published."""
        agent = self.agent
        assert agent is not None
        return version_model(agent.live_version if agent.live_version_id is not None else None, agent)


class BudgetUsage(models.Model):
    """One budget's counters for one period: settled usage and what the runs in flight reserved. Changed only by
    conditional atomic updates (``agents.budgets``)."""

    budget = models.ForeignKey(Budget, on_delete=models.CASCADE, related_name="usage")
    period_start = models.DateTimeField()
    used_tokens = models.BigIntegerField(default=0)
    used_cost_micros = models.BigIntegerField(default=0)
    reserved_tokens = models.BigIntegerField(default=0)
    reserved_cost_micros = models.BigIntegerField(default=0)

    change_audit = NotConfiguration("a budget's running counters, written as runs are admitted and settled")

    class Meta:
        verbose_name = _("budget usage")
        verbose_name_plural = _("budget usages")
        constraints = [models.UniqueConstraint(fields=["budget", "period_start"], name="budget_usage_one_per_period")]

    def __str__(self) -> str:
        return f"{self.budget_id}@{self.period_start:%Y-%m-%d}"


class BudgetReservation(models.Model):
    """What one run set aside in one budget's period, until it is settled (once) when the run ends."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="budget_reservations")
    usage = models.ForeignKey(BudgetUsage, on_delete=models.CASCADE, related_name="reservations")
    tokens = models.BigIntegerField()
    cost_micros = models.BigIntegerField()
    settled_at = models.DateTimeField(null=True, blank=True)
    # The model's price when the run was admitted, at which the run is charged (``agents.budgets.run_price``): a
    # price raised while the run is in flight cannot take its cost past what was reserved. Zeros: the model had
    # no price then. No input price: a reservation taken before the price was kept here (priced at the finish).
    input_per_mtok = models.DecimalField(max_digits=12, decimal_places=4, null=True, blank=True)
    output_per_mtok = models.DecimalField(max_digits=12, decimal_places=4, null=True, blank=True)
    cache_read_per_mtok = models.DecimalField(max_digits=12, decimal_places=4, null=True, blank=True)
    cache_write_per_mtok = models.DecimalField(max_digits=12, decimal_places=4, null=True, blank=True)
    # The model that price is of (``run_model`` at admission): a run of an agent never published runs the model
    # its agent names when the run is claimed, which an admin may have changed since; the admission price is the
    # run's price only while the model is the same one. Empty: kept before the model was.
    provider = models.CharField(max_length=20, blank=True, default="")
    model_id = models.CharField(max_length=200, blank=True, default="")

    change_audit = NotConfiguration("a run's reservation against a budget")

    class Meta:
        verbose_name = _("budget reservation")
        verbose_name_plural = _("budget reservations")
        # The open ones, which the reconciler looks through every pass (``agents.reconciler``, step 8): a few,
        # however many a budget has settled.
        indexes = [
            models.Index(fields=["run"], condition=models.Q(settled_at__isnull=True), name="budgetreservation_open")
        ]

    def __str__(self) -> str:
        return f"{self.run_id}: {self.tokens}"

    def admission_price(self) -> ModelPrice | None:
        """The price the run was admitted at, as an unsaved ``ModelPrice``; None where it was not kept."""
        if self.input_per_mtok is None or self.output_per_mtok is None:
            return None
        return ModelPrice(
            input_per_mtok=self.input_per_mtok,
            output_per_mtok=self.output_per_mtok,
            cache_read_per_mtok=self.cache_read_per_mtok,
            cache_write_per_mtok=self.cache_write_per_mtok,
        )


class ShadowComparison(models.Model):
    """A live run and its shadow on the candidate version, compared once both have finished."""

    live_run = models.OneToOneField(
        Run, on_delete=models.CASCADE, related_name="shadow_comparison", verbose_name=_("live run")
    )
    shadow_run = models.OneToOneField(Run, on_delete=models.CASCADE, related_name="+", verbose_name=_("shadow run"))
    agent = models.ForeignKey(
        Agent, on_delete=models.CASCADE, related_name="shadow_comparisons", verbose_name=_("agent")
    )
    candidate = models.ForeignKey(AgentVersion, on_delete=models.PROTECT, related_name="+", verbose_name=_("candidate"))
    agrees = models.BooleanField(_("agrees"), db_index=True)
    same_status = models.BooleanField(_("same outcome"))
    same_tools = models.BooleanField(_("same tools"))
    same_args = models.BooleanField(_("same arguments"))
    answer_similarity = models.FloatField(_("answer similarity"))
    live_tools = models.JSONField(encoder=UnicodeJSONEncoder, verbose_name=_("live tools"), default=list)
    shadow_tools = models.JSONField(encoder=UnicodeJSONEncoder, verbose_name=_("shadow tools"), default=list)
    latency_delta_ms = models.FloatField(_("latency difference (ms)"), null=True)
    tokens_delta = models.IntegerField(_("token difference"), null=True)
    created_at = models.DateTimeField(_("compared"), auto_now_add=True)

    change_audit = NotConfiguration("derived from two runs")

    class Meta:
        verbose_name = _("shadow comparison")
        verbose_name_plural = _("shadow comparisons")
        ordering = ["agrees", "answer_similarity", "-created_at"]

    def __str__(self) -> str:
        return f"{self.live_run_id} vs {self.shadow_run_id}"
