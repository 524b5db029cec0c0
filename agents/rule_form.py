"""The structured rule editor: a deterministic rule's conditions and params template as form fields, the rule's
JSON (the ``rules[]`` entry of ``import_config``/``export_config``) kept as the advanced view.

As in the contract editor (``mcpregistry.contract_form``), ``when`` and ``params`` keep their names and their
model validation; their widgets render inputs and read them back into the same JSON, and a post that carries
the JSON itself is taken as it is. The page's script (``agents/static/agents/rule_editor.js``) narrows the tool
choice to the chosen server, rebuilds the params rows for the chosen tool, checks the regex as it is typed and
offers the placeholders the conditions make available.
"""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.utils.datastructures import MultiValueDict
from django.utils.translation import gettext_lazy as _
from pydantic import ValidationError as PydanticValidationError

from agent_platform.json import loads as json_loads
from agents.agent_settings_form import agent_tool_names
from agents.configuration import RuleSpec, rule_entry
from agents.deterministic import PLACEHOLDER
from agents.models import Agent, DeterministicRule
from mcpregistry.contract_form import EditorWidget, OpenChoiceField
from mcpregistry.contracts import argument_constraints, spec_problems
from mcpregistry.list_fields import key_value_lines, reads_back, typed_value, value_text
from mcpregistry.models import McpServer, McpTool


def _lines(mapping: dict[str, Any]) -> str:
    return "\n".join(f"{key}={value_text(value)}" for key, value in mapping.items())


def _lines_or_text(value: Any) -> str:
    if isinstance(value, dict):
        return _lines(value)
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False) if value else ""


def key_value_pairs(text: str, where: str) -> dict[str, Any]:
    """``KEY=value`` lines (blank lines skipped), each value typed as the rule editor types it (``3`` a number,
    ``true`` a boolean), read as every line editor reads them (``list_fields.key_value_lines``); a line without
    ``=`` or a key given twice is refused, naming ``where`` and the line."""
    try:
        return key_value_lines(text.splitlines())
    except ValueError as exc:
        raise ValidationError(_("%(where)s, %(problem)s.") % {"where": where, "problem": exc}, code="invalid") from None


class WhenWidget(EditorWidget):
    """``when`` as fields: keywords (all / any), a regex with a live check, context and data matchers."""

    template_name = "admin/agents/widgets/rule_when.html"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Per server id, the names of its tools (``DeterministicRuleForm`` sets them): tool_available's choices.
        self.server_tools: dict[str, list[str]] = {}

    def get_context(self, name: str, value: Any, attrs: dict[str, Any] | None) -> dict[str, Any]:
        context = super().get_context(name, value, attrs)
        try:
            when = json_loads(value) if isinstance(value, str) and value.strip() else (value or {})
        except ValueError:
            when = {}
        when = when if isinstance(when, dict) else {}
        context["widget"].update(
            {
                "all_keywords": ", ".join(map(str, when.get("all_keywords") or [])),
                "any_keywords": ", ".join(map(str, when.get("any_keywords") or [])),
                "regex": when.get("regex") or "",
                # A matcher that did not read as KEY=value lines comes back as the text typed, shown again as it
                # was with its error beside it.
                "context_lines": _lines_or_text(when.get("context")),
                "data_lines": _lines_or_text(when.get("data")),
                "tool_available": when.get("tool_available") or "",
                "tool_groups": self.tool_groups(str(when.get("tool_available") or "")),
            }
        )
        return context

    def tool_groups(self, stored: str) -> list[tuple[str, list[str]]]:
        """The tool_available choices grouped by server; a stored name no server has is kept, in its own group."""
        groups = [(mcp_id, names) for mcp_id, names in self.server_tools.items() if names]
        if stored and not any(stored in names for _id, names in groups):
            groups.append(("—", [stored]))
        return groups

    def value_from_editor(self, data: MultiValueDict[str, Any], name: str) -> Any:

        def field(key: str) -> str:
            return str(data.get(f"{name}__{key}", "")).strip()

        when: dict[str, Any] = {}
        for key in ("all_keywords", "any_keywords"):
            words = [w.strip() for w in field(key).split(",") if w.strip()]
            if words:
                when[key] = words
        if field("regex"):
            when["regex"] = field("regex")
        for key in ("context", "data"):
            try:
                pairs = key_value_pairs(str(data.get(f"{name}__{key}", "")), key)
            except ValidationError:
                return json.dumps({**when, key: str(data.get(f"{name}__{key}", ""))}, ensure_ascii=False)
            if pairs:
                when[key] = pairs
        if field("tool_available"):
            when["tool_available"] = field("tool_available")
        return json.dumps(when, ensure_ascii=False)


class ParamsWidget(EditorWidget):
    """``params`` as one field per argument of the rule's tool, with the placeholders offered."""

    template_name = "admin/agents/widgets/rule_params.html"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.arguments: dict[str, dict[str, Any]] = {}

    def get_context(self, name: str, value: Any, attrs: dict[str, Any] | None) -> dict[str, Any]:
        context = super().get_context(name, value, attrs)
        try:
            params = json_loads(value) if isinstance(value, str) and value.strip() else (value or {})
        except ValueError:
            params = {}
        params = params if isinstance(params, dict) else {}
        rows = []
        for arg in dict.fromkeys([*self.arguments, *params]):
            spec = self.arguments.get(arg, {})
            rows.append(
                {
                    "name": arg,
                    "value": param_text(params[arg], spec.get("type")) if arg in params else "",
                    "type": spec.get("type", ""),
                    "required": bool(spec.get("required")),
                    "allowed": ", ".join(map(str, spec.get("allowed") or [])),
                    "known": arg in self.arguments,
                }
            )
        context["widget"]["rows"] = rows
        return context

    def value_from_editor(self, data: MultiValueDict[str, Any], name: str) -> Any:
        params: dict[str, Any] = {}
        for arg in data.getlist(f"{name}__names"):
            text = str(data.get(f"{name}__value__{arg}", ""))
            if text.strip() == "":
                continue
            params[arg] = param_value(text.strip(), self.arguments.get(arg, {}).get("type"))
        return json.dumps(params, ensure_ascii=False)


def param_text(value: Any, arg_type: str | None) -> str:
    """A parameter as its field shows it: a list argument's plain items comma-separated (``3F, 4F``), anything
    else as the rule editor types it (``value_text``)."""
    if arg_type == "list" and isinstance(value, list) and value and all(_plain_item(item) for item in value):
        text = ", ".join(value_text(item) for item in value)
        if not text.startswith("[") and not PLACEHOLDER.fullmatch(text):  # would read back as JSON or one value
            return text
    return value_text(value)


def param_value(text: str, arg_type: str | None) -> Any:
    """The inverse of :func:`param_text`: for a list argument, comma-separated items (each typed as a value is:
    ``1`` a number) unless the text is a JSON list or exactly one placeholder (which keeps its value's type)."""
    if arg_type == "list" and not text.startswith("[") and not PLACEHOLDER.fullmatch(text):
        return [typed_value(item.strip()) for item in text.split(",") if item.strip()]
    return typed_value(text)


def _plain_item(item: Any) -> bool:
    """Whether a list item reads back as itself between commas."""
    if isinstance(item, bool) or item is None:
        return False
    if isinstance(item, int | float):
        return True
    return isinstance(item, str) and reads_back(item) and "," not in item and item == item.strip() and bool(item)


def tool_catalogue(servers: list[McpServer]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per server id, its enabled tools and their arguments (name → type, required, allowed), for the page."""
    catalogue: dict[str, dict[str, dict[str, Any]]] = {}
    tools = McpTool.objects.filter(server__in=servers, enabled=True, available=True).select_related(
        "contract",
        "server",  # read for each tool: one query for the page, not one per tool
    )
    for tool in tools.order_by("server__mcp_id", "name"):
        contract = getattr(tool, "contract", None)
        constraints = (contract.args if contract is not None else None) or argument_constraints(tool.input_schema)
        catalogue.setdefault(tool.server.mcp_id, {})[tool.name] = {
            arg: {k: spec.get(k) for k in ("type", "required", "allowed") if spec.get(k) is not None}
            for arg, spec in constraints.items()
            if isinstance(spec, dict)
        }
    return catalogue


class DeterministicRuleForm(forms.ModelForm):
    tool_name = OpenChoiceField(label=_("tool"), required=False)
    force_first_tool = OpenChoiceField(
        label=_("force the model's first tool"),
        required=False,
        help_text=_(
            "When this rule matches, the model's first call must be this tool (or any tool); for providers that "
            "support tool_choice. The tools listed are those the model sees of the agent's servers."
        ),
    )
    rule_json = forms.CharField(
        label=_("rule as JSON"),
        required=False,
        widget=forms.Textarea(attrs={"rows": 10, "cols": 100, "class": "rule-json", "spellcheck": "false"}),
        help_text=_(
            "The same rule as import_config reads it and export_config writes it. When this text changes, it is "
            "what is saved."
        ),
    )

    class Meta:
        model = DeterministicRule
        fields = [
            "agent",
            "name",
            "order",
            "enabled",
            "server",
            "tool_name",
            "code",
            "when",
            "params",
            "answer_template",
            "force_first_tool",
        ]
        widgets = {"when": WhenWidget, "params": ParamsWidget}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        rule: DeterministicRule = self.instance
        agent = self._chosen(Agent, "agent") or (rule.agent if rule.agent_id else None)
        servers = list(agent.servers.filter(enabled=True)) if agent else list(McpServer.objects.filter(enabled=True))
        self.catalogue = tool_catalogue(servers)
        server = self._chosen(McpServer, "server") or (rule.server if rule.server_id else None)
        tool = self.data.get(self.add_prefix("tool_name")) if self.is_bound else rule.tool_name
        self.fields["tool_name"].choices = [
            ("", "—"),
            *((mcp_id, [(name, name) for name in tools]) for mcp_id, tools in self.catalogue.items()),
        ]
        if rule.tool_name and not any(rule.tool_name in tools for tools in self.catalogue.values()):
            self.fields["tool_name"].choices = [*self.fields["tool_name"].choices, (rule.tool_name, rule.tool_name)]
        tools = McpTool.objects.filter(server__in=servers).order_by("server__mcp_id", "name")
        server_tools: dict[str, list[str]] = {}
        for mcp_id, name in tools.values_list("server__mcp_id", "name"):
            server_tools.setdefault(mcp_id, []).append(name)
        self.fields["when"].widget.server_tools = server_tools
        self.fields["params"].widget.arguments = (self.catalogue.get(server.mcp_id, {}) if server else {}).get(
            tool or "", {}
        )
        self.model_tools = agent_tool_names(servers)
        forced = [("", str(_("— none —"))), ("any", str(_("any tool"))), *((n, n) for n in self.model_tools)]
        if rule.force_first_tool and rule.force_first_tool not in dict(forced):
            forced.append((rule.force_first_tool, rule.force_first_tool))  # shown as stored, refused on save
        self.fields["force_first_tool"].choices = forced
        if rule.pk:
            self.initial["rule_json"] = json.dumps(rule_entry(rule), ensure_ascii=False, indent=2)

    def _chosen(self, model: type[Any], field: str) -> Any:
        if not self.is_bound:
            return None
        value = self.data.get(self.add_prefix(field))
        return model.objects.filter(pk=value).first() if value and str(value).isdigit() else None

    def clean_when(self) -> Any:
        """A context or data matcher the editor could not read as KEY=value lines comes back as its text: the
        error names the line."""
        when = self.cleaned_data.get("when")
        if isinstance(when, dict):
            for key in ("context", "data"):
                if isinstance(when.get(key), str):
                    key_value_pairs(when[key], key)  # raises, naming the line
        return when

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        raw = (self.data.get(self.add_prefix("rule_json")) or "").strip()
        if raw and _json(raw) != _json(self.initial.get("rule_json") or ""):
            self._apply_document(raw, cleaned)
        self._check_target(cleaned)
        forced = cleaned.get("force_first_tool") or ""
        if forced not in ("", "any") and forced not in self.model_tools:
            self.add_error(
                "force_first_tool",
                _("'%(tool)s' is no tool the model sees; choose any, or one of: %(names)s")
                % {"tool": forced, "names": ", ".join(self.model_tools) or "—"},
            )
        return cleaned

    def _check_target(self, cleaned: dict[str, Any]) -> None:
        agent, server, tool = cleaned.get("agent"), cleaned.get("server"), cleaned.get("tool_name")
        if cleaned.get("code") or server is None:
            return
        if agent is not None and not agent.servers.filter(pk=server.pk).exists():
            names = ", ".join(agent.servers.values_list("mcp_id", flat=True)) or "—"
            self.add_error(
                "server",
                _("%(agent)s does not bind %(id)s; its servers are: %(names)s")
                % {"agent": agent.slug, "id": server.mcp_id, "names": names},
            )
            return
        tools = self.catalogue.get(server.mcp_id, {})
        if tool and tools and tool not in tools:
            self.add_error(
                "tool_name",
                _("'%(tool)s' is not an enabled tool of %(id)s; its enabled tools are: %(names)s")
                % {"tool": tool, "id": server.mcp_id, "names": ", ".join(tools)},
            )

    def _apply_document(self, raw: str, cleaned: dict[str, Any]) -> None:
        document = _json(raw)
        if not isinstance(document, dict):
            raise ValidationError({"rule_json": _("Enter a JSON object (the rule entry of export_config).")})
        try:
            spec = RuleSpec.model_validate(document)
        except PydanticValidationError as exc:
            raise ValidationError({"rule_json": spec_problems(exc, RuleSpec)}) from None
        agent = Agent.objects.filter(slug=spec.agent).first() if spec.agent else None
        server = McpServer.objects.filter(mcp_id=spec.mcp_id).first() if spec.mcp_id else None
        if spec.agent and agent is None:
            raise ValidationError({"rule_json": _("agent: no agent '%(slug)s'.") % {"slug": spec.agent}})
        if spec.mcp_id and server is None:
            raise ValidationError({"rule_json": _("mcp_id: no server '%(id)s'.") % {"id": spec.mcp_id}})
        cleaned.update(
            agent=agent,
            name=spec.name,
            order=spec.order,
            enabled=spec.enabled,
            server=server,
            tool_name=spec.tool,
            code=spec.code,
            when=spec.when,
            params=spec.params,
            answer_template=spec.answer_template,
            force_first_tool=spec.force_first_tool,
        )


def _json(text: str) -> Any:
    try:
        return json_loads(text) if text.strip() else None
    except ValueError:
        return text
