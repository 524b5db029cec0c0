"""The structured rule editor: a deterministic rule's conditions and params template as form fields, the rule's
JSON (the ``rules[]`` entry of ``import_config``/``export_config``) kept as the advanced view.

As in the contract editor (``mcpregistry.contract_form``), ``when`` and ``params`` keep their names and their
model validation; their widgets render inputs and read them back into the same JSON, and a post that carries
the JSON itself is taken as it is. Saving a rule unchanged saves it as it is: a value the fields cannot carry
back exactly (a keyword with a comma, a text with spaces around it or a line break, an empty text) is shown as
JSON, and a field posted as it was shown keeps the stored value it showed. The page's script
(``agents/static/agents/rule_editor.js``) narrows the tool choice and tool_available's to the chosen server,
rebuilds the params rows for the chosen tool, checks the regex as it is typed and offers the placeholders the
conditions make available.
"""

from __future__ import annotations

import json
import re
from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.utils.datastructures import MultiValueDict
from django.utils.text import capfirst
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext
from pydantic import ValidationError as PydanticValidationError

from agent_platform.json import loads as json_loads
from agents.agent_settings_form import agent_tool_names, rule_forcing_problems, tools_outside_filters
from agents.configuration import RULE_DOCUMENT_FIELDS, RuleSpec, document_problems, rule_entry
from agents.deterministic import PLACEHOLDER, WhenSpec
from agents.models import Agent, DeterministicRule, rule_context_secret_keys, rule_params_secret_arguments
from mcpregistry.contract_form import EditorWidget, OpenChoiceField
from mcpregistry.contracts import argument_constraints, spec_problems
from mcpregistry.list_fields import (
    key_fits,
    key_value_lines,
    one_line,
    reads_back,
    texts_problem,
    typed_value,
    value_text,
)
from mcpregistry.models import McpServer, McpTool

# What separates the words of a list typed in one line: a comma, also as a full-width input method types it
# (``，`` U+FF0C, ``、`` U+3001). A word holding one is shown as a JSON list.
_LIST_COMMA = re.compile("[,，、]")


def key_value_pairs(text: str, where: str, *, syntax: str | None = None) -> dict[str, Any]:
    """``KEY=value`` lines (blank lines skipped), each value typed as the rule editor types it (``3`` a number,
    ``true`` a boolean), read as every line editor reads them (``list_fields.key_value_lines``); a line without
    ``=`` or a key given twice is refused, naming ``where`` and the line. ``syntax``, where given, is what a line
    without ``=`` is told to be written as (the rule editor's context takes ``KEY=value``, its data
    ``PATH=value``, both a JSON object too)."""
    lines = text.splitlines()
    for number, line in enumerate(lines, start=1):
        key, sep, _value = line.strip().partition("=")
        if syntax is not None and line.strip() and (not sep or not key.strip()):
            raise ValidationError(f"{where}, {syntax % {'n': number}}", code="invalid")
    try:
        return key_value_lines(lines)
    except ValueError as exc:
        raise ValidationError(_("%(where)s, %(problem)s.") % {"where": where, "problem": exc}, code="invalid") from None


# The parts of ``when`` the editor has a field for, in the order of the page.
WHEN_PARTS = ("all_keywords", "any_keywords", "regex", "context", "data", "tool_available")

# Each part as its errors name it: the start of its label on the page (``rule_when.html``), not its JSON key.
WHEN_LABELS = {
    "all_keywords": _("all of these keywords"),
    "any_keywords": _("any of these keywords"),
    "regex": _("regex"),
    "context": _("context equals"),
    "data": _("A2A data"),
    "tool_available": _("only when this tool is available"),
}

# How a context or data line is written, said of a line that is not (``%(n)d``: its number).
MATCHER_SYNTAX = {
    "context": _("line %(n)d: write KEY=value lines, or a JSON object."),
    "data": _("line %(n)d: write PATH=value lines (PATH=* for present), or a JSON object."),
}
# Said of a context or data text that starts as a JSON object but is none.
MATCHER_NO_OBJECT = {
    "context": _("%(where)s: write KEY=value lines, or a JSON object."),
    "data": _("%(where)s: write PATH=value lines, or a JSON object."),
}


def when_part_problem(problem: str) -> tuple[str | None, str]:
    """The part of ``when`` a problem worded with its JSON key is about (``regex: …``, ``context.day: …``, as the
    model's and import_config's checks word them), and the problem worded with that part's label; ``None`` and
    the problem as it is for one about no part (``(root): …``)."""
    for part in WHEN_PARTS:
        for mark in (": ", "."):
            if problem.startswith(part + mark):
                rest = problem[len(part) + len(mark) :]
                return part, f"{WHEN_LABELS[part]}: {rest}"
    return None, problem


def changed_texts_problems(value: Any, stored: Any) -> list[str]:
    """``KEY: problem`` for each entry of an object (``when``'s parts, ``params``' arguments) whose texts hold what
    :func:`texts_problem` refuses; an entry as stored is left alone (saving a rule unchanged saves it as it is)."""
    if not isinstance(value, dict):
        return []
    stored = stored if isinstance(stored, dict) else {}
    problems = []
    for key, part in value.items():
        if key in stored and _same_json(part, stored[key]):
            continue
        if problem := texts_problem(part):
            problems.append(f"{key}: {problem}")
    return problems


def keywords_text(words: Any) -> str:
    """Keywords as their field shows them: comma-separated where that reads back as exactly these words, else as
    a JSON list (a word with a comma, ``1,000원`` or a full-width one, or with spaces around it would come back as
    other words)."""
    if not words:
        return ""
    carried = (
        isinstance(words, list)
        and all(
            isinstance(w, str) and w and w == w.strip() and not _LIST_COMMA.search(w) and one_line(w) for w in words
        )
        and not words[0].startswith("[")
    )
    return ", ".join(words) if carried else json.dumps(words, ensure_ascii=False)


def matcher_text(matcher: Any) -> str:
    """A context or data matcher as its field shows it: ``KEY=value`` lines where each line reads back as its key
    and value, else a JSON object (a key with ``=``, a value with a line break or spaces around it). A text is a
    matcher that did not read, shown again as typed."""
    if not matcher:
        return ""
    if isinstance(matcher, str):
        return matcher
    if isinstance(matcher, dict) and all(key_fits(k) and reads_back(v) for k, v in matcher.items()):
        return "\n".join(f"{key}={value_text(value)}" for key, value in matcher.items())
    return json.dumps(matcher, ensure_ascii=False)


def when_texts(when: dict[str, Any]) -> dict[str, str]:
    """Each part of ``when`` as its field shows it."""
    return {
        "all_keywords": keywords_text(when.get("all_keywords")),
        "any_keywords": keywords_text(when.get("any_keywords")),
        "regex": str(when.get("regex") or ""),
        "context": matcher_text(when.get("context")),
        "data": matcher_text(when.get("data")),
        "tool_available": str(when.get("tool_available") or ""),
    }


def same_text(posted: str, shown: str) -> bool:
    """Whether a field came back as it was shown: a browser sends a text area's line breaks as CRLF."""

    def lines(text: str) -> str:
        return text.replace("\r\n", "\n").replace("\r", "\n")

    return lines(posted) == lines(shown)


def _read_keywords(text: str) -> Any:
    """Comma-separated words, or a JSON list; a text that starts with ``[`` but is no JSON list is kept as the
    text (refused by ``clean_when``)."""
    if text.strip().startswith("["):
        try:
            words = json_loads(text)
        except ValueError:
            return text
        return words if isinstance(words, list) else text
    return [w.strip() for w in _LIST_COMMA.split(text) if w.strip()] or None


def _read_matcher(text: str, where: str) -> Any:
    """``KEY=value`` lines, or a JSON object; what does not read is kept as the text (refused by ``clean_when``,
    naming the line, and shown again as typed)."""
    if not text.strip():
        return None
    if text.strip().startswith("{"):
        try:
            matcher = json_loads(text)
        except ValueError:
            return text
        return matcher if isinstance(matcher, dict) else text
    try:
        return key_value_pairs(text, where) or None
    except ValidationError:
        return text


class WhenWidget(EditorWidget):
    """``when`` as fields: keywords (all / any), a regex with a live check, context and data matchers."""

    template_name = "admin/agents/widgets/rule_when.html"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Per server id, the names of its tools (``DeterministicRuleForm`` sets them), and the rule's server:
        # tool_available's choices are that server's tools (all servers' until one is chosen).
        self.server_tools: dict[str, list[str]] = {}
        self.server = ""
        # The stored conditions: a part whose field comes back as it was shown keeps its stored value.
        self.stored: dict[str, Any] = {}
        # The parts with a problem (``DeterministicRuleForm.clean_when``): only their inputs are outlined.
        self.invalid: set[str] = set()
        # The context keys refused for holding a secret: a refused page does not send their values back.
        self.withheld: set[str] = set()

    def get_context(self, name: str, value: Any, attrs: dict[str, Any] | None) -> dict[str, Any]:
        context = super().get_context(name, value, attrs)
        try:
            when = json_loads(value) if isinstance(value, str) and value.strip() else (value or {})
        except ValueError:
            when = {}
        when = when if isinstance(when, dict) else {}
        if self.withheld and isinstance(when.get("context"), dict):
            when = {**when, "context": {k: v for k, v in when["context"].items() if k not in self.withheld}}
        texts = when_texts(when)
        context["widget"].update(
            {
                "all_keywords": texts["all_keywords"],
                "any_keywords": texts["any_keywords"],
                "regex": texts["regex"],
                "regex_lines": not one_line(texts["regex"]),  # a text box would drop its line breaks
                "context_lines": texts["context"],
                "data_lines": texts["data"],
                "tool_available": texts["tool_available"],
                "tool_groups": self.tool_groups(texts["tool_available"]),
                "server_tools": json.dumps(self.server_tools, ensure_ascii=False),
                "invalid": sorted(self.invalid),
            }
        )
        return context

    def tool_groups(self, stored: str) -> list[tuple[str, list[str]]]:
        """The tool_available choices: the tools of the rule's server (of every server until one is chosen), a
        tool of another server being refused on save; a stored name not among them is kept, in its own group."""
        groups = [
            (mcp_id, names)
            for mcp_id, names in self.server_tools.items()
            if names and (not self.server or mcp_id == self.server)
        ]
        if stored and not any(stored in names for _id, names in groups):
            groups.append(("—", [stored]))
        return groups

    def value_from_editor(self, data: MultiValueDict[str, Any], name: str) -> Any:
        stored = self.stored if isinstance(self.stored, dict) else {}
        shown = when_texts(stored)
        when: dict[str, Any] = {}
        for key in WHEN_PARTS:
            text = str(data.get(f"{name}__{key}", ""))
            if key in stored and same_text(text, shown[key]):
                when[key] = stored[key]  # as stored: the field may not carry it back exactly (spaces, commas)
                continue
            if key in ("all_keywords", "any_keywords"):
                value = _read_keywords(text)
            elif key in ("context", "data"):
                value = _read_matcher(text, key)
            else:
                value = text.replace("\r\n", "\n").strip()  # a regex of several lines comes in a text area
            if value:
                when[key] = value
        return json.dumps(when, ensure_ascii=False)


class ParamsWidget(EditorWidget):
    """``params`` as one field per argument of the rule's tool, with the placeholders offered."""

    template_name = "admin/agents/widgets/rule_params.html"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.arguments: dict[str, dict[str, Any]] = {}
        # The stored params: an argument whose field comes back as it was shown keeps its stored value.
        self.stored: dict[str, Any] = {}
        # The arguments refused for holding a secret: a refused page shows their fields blank.
        self.withheld: set[str] = set()

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
                    "value": param_text(params[arg], spec.get("type"))
                    if arg in params and arg not in self.withheld
                    else "",
                    "type": spec.get("type", ""),
                    "required": bool(spec.get("required")),
                    "allowed": ", ".join(map(str, spec.get("allowed") or [])),
                    "known": arg in self.arguments,
                }
            )
        context["widget"]["rows"] = rows
        return context

    def value_from_editor(self, data: MultiValueDict[str, Any], name: str) -> Any:
        stored = self.stored if isinstance(self.stored, dict) else {}
        params: dict[str, Any] = {}
        for arg in data.getlist(f"{name}__names"):
            text = str(data.get(f"{name}__value__{arg}", ""))
            arg_type = self.arguments.get(arg, {}).get("type")
            if arg in stored and same_text(text, param_text(stored[arg], arg_type)):
                params[arg] = stored[arg]
            elif text.strip():
                params[arg] = param_value(text.strip(), arg_type)
        return json.dumps(params, ensure_ascii=False)


def param_text(value: Any, arg_type: str | None) -> str:
    """A parameter as its field shows it: a list argument's plain items comma-separated (``3F, 4F``), anything
    else as the rule editor types it (``value_text``), or as JSON where that would not read back as the value
    (an empty text, spaces around it, a line break: ``""``, ``" x "``)."""
    if arg_type == "list" and isinstance(value, list) and value and all(_plain_item(item) for item in value):
        text = ", ".join(value_text(item) for item in value)
        if not text.startswith("[") and not PLACEHOLDER.fullmatch(text):  # would read back as JSON or one value
            return text
    text = value_text(value)
    if text.strip() and one_line(text) and _same_json(param_value(text.strip(), arg_type), value):  # empty: not sent
        return text
    return json.dumps(value, ensure_ascii=False)


def _same_json(one: Any, other: Any) -> bool:
    """Equal as JSON values: ``1``, ``1.0`` and ``true`` are three values."""
    return json.dumps(one, sort_keys=True) == json.dumps(other, sort_keys=True)


def param_value(text: str, arg_type: str | None) -> Any:
    """The inverse of :func:`param_text`: for a list argument, comma-separated items (each typed as a value is:
    ``1`` a number) unless the text is a JSON list or exactly one placeholder (which keeps its value's type)."""
    if arg_type == "list" and not text.startswith("[") and not PLACEHOLDER.fullmatch(text):
        return [typed_value(item.strip()) for item in _LIST_COMMA.split(text) if item.strip()]
    return typed_value(text)


def _plain_item(item: Any) -> bool:
    """Whether a list item reads back as itself between commas."""
    if isinstance(item, bool) or item is None:
        return False
    if isinstance(item, int | float):
        return True
    return (
        isinstance(item, str)
        and reads_back(item)
        and not _LIST_COMMA.search(item)
        and item == item.strip()
        and bool(item)
    )


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


def _regex_problems(when: dict[str, Any]) -> list[str]:
    """What the rule's check says of ``when``'s regular expression alone (``WhenSpec``), for a form whose other
    parts of ``when`` could not be read."""
    if not isinstance(when.get("regex"), str) or not when["regex"]:
        return []
    try:
        WhenSpec.model_validate({"regex": when["regex"]})
    except PydanticValidationError as exc:
        return spec_problems(exc, WhenSpec)
    return []


def saved_elsewhere_text(changed: list[str]) -> str:
    """Why a save of a rule changed since its page was loaded was refused, naming the ``changed`` settings: the
    rule editor's and the agent page's rules table's alike."""
    return _(
        "This rule was saved elsewhere after this page was loaded (changed: %(settings)s); nothing was saved here. "
        "Reload the page to see the rule as it is now, then make your change again."
    ) % {"settings": ", ".join(changed)}


class DeterministicRuleForm(forms.ModelForm):
    # Capitalised as the model's fields are labelled (``formfield`` writes their verbose names so).
    tool_name = OpenChoiceField(label=capfirst(_("tool")), required=False)
    force_first_tool = OpenChoiceField(
        label=capfirst(_("force the model's first tool")),
        required=False,
        help_text=_(
            "When this rule matches, the model's first call must be this tool (or any tool); for providers that "
            "support tool_choice. The tools listed are those the model sees of the agent's servers."
        ),
    )
    rule_json = forms.CharField(
        label=capfirst(_("rule as JSON")),
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
        # tool_available: any tool of the rule's server, a disabled one too (the rule waits until it is available).
        tools = McpTool.objects.filter(server__in=[*servers, *([server] if server else [])])
        server_tools: dict[str, list[str]] = {}
        for mcp_id, name in tools.order_by("server__mcp_id", "name").values_list("server__mcp_id", "name"):
            server_tools.setdefault(mcp_id, []).append(name)
        # On a page its reader may only view, the form has neither field: their editors are set up all the same
        # (a clean reads ``self.when_widget``), shown nowhere.
        when_widget = self.fields["when"].widget if "when" in self.fields else WhenWidget()
        params_widget = self.fields["params"].widget if "params" in self.fields else ParamsWidget()
        when_widget.server_tools, when_widget.server = server_tools, server.mcp_id if server else ""
        params_widget.arguments = (self.catalogue.get(server.mcp_id, {}) if server else {}).get(tool or "", {})
        # A field posted as it was shown keeps the stored value it showed: saving a rule unchanged saves it as it is.
        when_widget.stored = rule.when if rule.pk and isinstance(rule.when, dict) else {}
        when_widget.invalid = set()  # the widget is a shallow copy of the class's: its own set per form
        when_widget.withheld, params_widget.withheld = set(), set()
        self.when_widget, self.params_widget = when_widget, params_widget
        params_widget.stored = rule.params if rule.pk and isinstance(rule.params, dict) else {}
        self.model_tools = agent_tool_names(servers)
        # Offered: the tools the agent's tool selection keeps (one outside its servers and tags is refused on save).
        hidden = set(tools_outside_filters(agent.tool_selection, servers)) if agent else set()
        forcible = [n for n in self.model_tools if n not in hidden]
        forced = [("", str(_("— none —"))), ("any", str(_("any tool"))), *((n, n) for n in forcible)]
        if rule.force_first_tool and rule.force_first_tool not in dict(forced):
            forced.append((rule.force_first_tool, rule.force_first_tool))  # shown as stored, refused on save
        self.fields["force_first_tool"].choices = forced
        # The JSON view is posted back as the page showed it (``initial-rule_json``): a JSON view left as it was
        # never overrides the fields' edits (it was compared with the rule as stored when the post came, so a page
        # loaded before another save wrote its old JSON over both), and a page loaded before another save of the
        # rule is refused rather than saved over it (``_changed_elsewhere``).
        self.fields["rule_json"].show_hidden_initial = True
        self.stored_entry = rule_entry(rule) if rule.pk else None
        if self.stored_entry is not None:
            self.initial["rule_json"] = json.dumps(self.stored_entry, ensure_ascii=False, indent=2)

    def _chosen(self, model: type[Any], field: str) -> Any:
        if not self.is_bound:
            return None
        value = self.data.get(self.add_prefix(field))
        return model.objects.filter(pk=value).first() if value and str(value).isdigit() else None

    def clean_when(self) -> Any:
        """Keywords or a context or data matcher the editor could not read come back as their text: the error
        names the part by its label on the page (and, for KEY=value or PATH=value lines, the line), and only that
        part's input is outlined. Every part's problem is said at once, a regular expression's too (the model's
        check of it does not run once this field has an error): one at a time, an admin fixed the context, saved,
        and only then learned the data and the pattern were wrong as well."""
        when = self.cleaned_data.get("when")
        problems: list[str] = []
        if isinstance(when, dict):
            for key in ("all_keywords", "any_keywords"):
                if isinstance(when.get(key), str):
                    self.when_widget.invalid.add(key)
                    problems.append(
                        _("%(where)s: write the words separated by commas, or a JSON list of texts.")
                        % {"where": WHEN_LABELS[key]}
                    )
            for key in ("context", "data"):
                if isinstance(when.get(key), str):
                    self.when_widget.invalid.add(key)
                    if when[key].strip().startswith("{"):
                        problems.append(MATCHER_NO_OBJECT[key] % {"where": WHEN_LABELS[key]})
                        continue
                    try:
                        key_value_pairs(when[key], str(WHEN_LABELS[key]), syntax=str(MATCHER_SYNTAX[key]))
                    except ValidationError as exc:
                        problems += exc.messages
            if problems:
                problems += _regex_problems(when)
        stored = self.instance.when if self.instance.pk else {}
        if problems:
            raise ValidationError([self._when_problem(problem) for problem in problems], code="invalid")
        if texts := changed_texts_problems(when, stored):
            raise ValidationError([self._when_problem(text) for text in texts], code="control_characters")
        return when

    def _when_problem(self, problem: str) -> str:
        """``problem`` worded with the label of the part of ``when`` it is about, that part's input outlined."""
        part, worded = when_part_problem(str(problem))
        if part is not None:
            self.when_widget.invalid.add(part)
        return worded

    def _update_errors(self, errors: ValidationError) -> None:
        # The model's checks of the conditions word a part by its JSON key (``regex: …``): here, by its label.
        if hasattr(errors, "error_dict") and "when" in errors.error_dict:
            when = [self._when_problem(problem) for problem in ValidationError(errors.error_dict["when"]).messages]
            errors = ValidationError({**errors.error_dict, "when": when})
        super()._update_errors(errors)

    def clean_params(self) -> Any:
        """A parameter's text with a NUL or another control character (not tab or a line break) is refused, naming
        the argument."""
        params = self.cleaned_data.get("params")
        stored = self.instance.params if self.instance.pk else {}
        if problems := changed_texts_problems(params, stored):
            raise ValidationError(problems, code="control_characters")
        return params

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        if changed := self._changed_elsewhere():
            self.add_error(None, saved_elsewhere_text(changed))
            return cleaned
        raw = (self.data.get(self.add_prefix("rule_json")) or "").strip()
        if raw and _json(raw) != _json(self._shown_json()):
            self._apply_document(raw, cleaned)
            # The document gives every setting: what the fields said of them (an empty name "required") is moot.
            for name in DOCUMENT_FIELDS.values():
                self._errors.pop(name, None)
            self.when_widget.invalid.clear()
        self._check_target(cleaned)
        if self.has_error("when"):
            # Its conditions unread: the model's checks of ``{match.X}`` read no regex (a false "the regex has no
            # named group" beside the conditions' own error). ``None`` leaves the groups unknown, unchecked.
            self.instance.when = None
        forced = cleaned.get("force_first_tool") or ""
        agent = self.cleaned_data.get("agent")
        if forced not in ("", "any") and forced not in self.model_tools:
            self.add_error(
                "force_first_tool",
                _("'%(tool)s' is no tool the model sees; choose any, or one of: %(names)s")
                % {"tool": forced, "names": ", ".join(self.model_tools) or "—"},
            )
        elif agent is not None:
            # The agent's tool selection may keep the tool out of every turn: the run would drop the forcing.
            servers = list(agent.servers.filter(enabled=True))
            for problem in rule_forcing_problems(forced, tool_selection=agent.tool_selection, servers=servers):
                self.add_error("force_first_tool", problem)
        return cleaned

    def full_clean(self) -> None:
        super().full_clean()
        if self.is_bound and self._errors:
            self._not_sent_back()

    def _not_sent_back(self) -> None:
        """A refused page sends back no secret (as the MCP server's page): a context value or an argument that holds
        one, typed here or in the JSON view, is shown blank (its line left out), its error saying to type it again
        without the secret. A value as stored was shown already and is shown as it was."""
        stored_when = self._stored("when")
        stored_params = self._stored("params")
        stored_context = stored_when.get("context") if isinstance(stored_when.get("context"), dict) else {}
        document = _json(str(self.data.get(self.add_prefix("rule_json")) or ""))
        document = document if isinstance(document, dict) else {}
        keys: set[str] = set()
        arguments: set[str] = set()
        for when in (self._posted("when"), self.instance.when, document.get("when")):
            context = when.get("context") if isinstance(when, dict) else None
            if isinstance(context, dict):
                changed = {k: v for k, v in context.items() if k not in stored_context or stored_context[k] != v}
                keys.update(rule_context_secret_keys({"context": changed}))
        for params in (self._posted("params"), self.instance.params, document.get("params")):
            if isinstance(params, dict):
                changed = {k: v for k, v in params.items() if k not in stored_params or stored_params[k] != v}
                arguments.update(rule_params_secret_arguments(changed))
        if not keys and not arguments:
            return
        self.when_widget.withheld, self.params_widget.withheld = keys, arguments
        left = dict(document)
        if isinstance(left.get("when"), dict) and isinstance(left["when"].get("context"), dict):
            context = {k: v for k, v in left["when"]["context"].items() if k not in keys}
            left["when"] = {**left["when"], "context": context}
        if isinstance(left.get("params"), dict):
            left["params"] = {k: v for k, v in left["params"].items() if k not in arguments}
        shown = self.data.copy()
        if left != document:
            shown[self.add_prefix("rule_json")] = json.dumps(left, ensure_ascii=False, indent=2)
        for name in ("when", "params"):
            # Its hidden initial value (a field with a callable default has one) is shown as the page first
            # showed it, not as posted (where a post left it out, it would show what was typed).
            if name in self.fields and self.fields[name].show_hidden_initial:
                shown[self[name].html_initial_name] = self.fields[name].prepare_value(self[name].initial)
        self.data = shown
        for field, names in (("when", keys), ("params", arguments)):
            if names:
                said = ngettext(
                    "%(names)s: not sent back, as it holds a secret: type it again without the secret.",
                    "%(names)s: not sent back, as they hold secrets: type them again without the secrets.",
                    len(names),
                ) % {"names": ", ".join(sorted(names))}
                # A context key's, worded with the label of the conditions' context input (and that outlined).
                self.add_error(field, self._when_problem(f"context: {said}") if field == "when" else said)

    def _stored(self, field: str) -> dict[str, Any]:
        """``field`` of the rule as stored (empty for a new rule, or where it is no object)."""
        if self.instance.pk is None:
            return {}
        value = DeterministicRule.objects.filter(pk=self.instance.pk).values_list(field, flat=True).first()
        return value if isinstance(value, dict) else {}

    def _posted(self, field: str) -> Any:
        """``field`` as this page posted it (its editor's inputs, or its JSON), read as JSON; None where unread."""
        if field not in self.fields:
            return None
        value = self[field].data
        return _json(value) if isinstance(value, str) else value

    def _shown_json(self) -> str:
        """The JSON view as the page showed it, posted back beside it; for a post without it (a script), the
        rule as stored."""
        name = self["rule_json"].html_initial_name
        if name in self.data:
            return str(self.data.get(name) or "")
        return str(self.initial.get("rule_json") or "")

    def _changed_elsewhere(self) -> list[str]:
        """The settings (by their labels; the conditions' parts too) in which the stored rule differs from the rule
        as this page showed it: someone saved it after the page was loaded, and a save of this page would write the
        page's old values over theirs. Empty for a new rule and for a post without what was shown (a script)."""
        name = self["rule_json"].html_initial_name
        if self.stored_entry is None or name not in self.data:
            return []
        shown = _json(str(self.data.get(name) or ""))
        if not isinstance(shown, dict):
            return []
        changed = []
        for key, field in DOCUMENT_FIELDS.items():
            was, now = shown.get(key), self.stored_entry[key]
            if _same_json(was, now):
                continue
            label = str(self.fields[field].label)
            if key == "when" and isinstance(was, dict) and isinstance(now, dict):
                parts = [
                    str(WHEN_LABELS.get(part, part))
                    for part in dict.fromkeys([*WHEN_PARTS, *was, *now])
                    if not _same_json(was.get(part), now.get(part))
                ]
                label = f"{label} ({', '.join(parts)})"
            changed.append(label)
        return changed

    def _post_clean(self) -> None:
        refused_tool = self.has_error("tool_name")
        super()._post_clean()
        if refused_tool:
            # The model's "name the tool to call" read a tool name this form had refused (and so never set): said
            # beside the refusal, of a name that was given.
            unnamed = str(DeterministicRule.UNNAMED_TOOL)
            kept = [e for e in self.errors.get("tool_name", []) if str(e) != unnamed]
            self.errors["tool_name"] = self.error_class(kept, renderer=self.renderer)

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
        # What no database stores (a NUL written as \u0000, a lone surrogate), refused as import_config refuses it.
        if problems := document_problems(document):
            raise ValidationError({"rule_json": problems})
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


# The rule JSON's keys (``configuration.rule_entry``) and the form's fields that hold them.
DOCUMENT_FIELDS = RULE_DOCUMENT_FIELDS


def _json(text: str) -> Any:
    try:
        return json_loads(text) if text.strip() else None
    except ValueError:
        return text
