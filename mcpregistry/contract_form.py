"""The structured contract editor: a tool contract's JSON fields as form fields, the JSON kept as the advanced view.

Each JSON field (``args``, ``returns``, ``retry``) keeps its name and its model validation; only its widget
changes. A widget renders the field as inputs (one row per argument, checkboxes for the retry reasons, ...)
and reads them back into the same JSON. A post that carries the field's JSON itself (a script, the JSON view)
is taken as it is. Values an admin left as they were keep their stored form (a key absent stays absent; a list
is shown comma-separated only where that reads back as the same list, else as JSON; an argument the contract does
not list stays out of it), so saving an unchanged page records no change. The whole contract is also offered as
the JSON entry that ``export_config`` writes and ``import_config`` reads; when an admin edits that text, it wins.
Whichever way a contract comes in, a text in it with a NUL or another control character is refused at the field it
came in by, as tags and keywords are (``list_fields.changed_texts_problems``).
"""

from __future__ import annotations

import json
import math
from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.utils.datastructures import MultiValueDict
from django.utils.translation import gettext_lazy as _
from pydantic import ValidationError as PydanticValidationError

from agent_platform.json import json_error_text
from agent_platform.json import loads as json_loads
from mcpregistry import discovery_view
from mcpregistry.contract_document import ContractSpec, contract_entry, contract_fields
from mcpregistry.contracts import DEFAULT_RETRY, JSON_TYPES, RETRYABLE, spec_problems
from mcpregistry.gate_records import CONTRACT_FIELDS

# The base of every structured editor, named here as well, where it was first (the rule, agent settings and eval
# case editors import it from here).
from mcpregistry.list_fields import EditorWidget as EditorWidget
from mcpregistry.list_fields import changed_texts_problems, control_character_problem
from mcpregistry.models import (
    McpTool,
    ToolContract,
    idempotency_choices,
    tool_argument_names,
    tool_required_arguments,
)

TYPE_LABELS = {
    "str": _("text (str)"),
    "int": _("whole number (int)"),
    "float": _("number (float)"),
    "bool": _("true or false (bool)"),
    "list": _("list (list)"),
    "dict": _("object (dict)"),
}
TYPE_CHOICES = [("", _("any"))] + [(t, TYPE_LABELS.get(t, t)) for t in JSON_TYPES.values()]
ARG_NUMBER_KEYS = ("min", "max")


def _loads(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json_loads(value) if value.strip() else {}
        except ValueError:
            return None
    return value


def _number(text: str) -> Any:
    """A number typed into a field: int when it is one, float otherwise; text that is no number, or no finite one
    (``nan``, ``inf``, ``1e400``), stays text as typed (the contract's validation then names the key)."""
    text = text.strip()
    for kind in (int, float):
        try:
            number = kind(text)
        except ValueError:
            continue
        return number if isinstance(number, int) or math.isfinite(number) else text
    return text


def _merge(stored: dict[str, Any], key: str, value: Any, *, default: Any = None) -> None:
    """Set ``key`` to what the form says, leaving a key the admin did not change as it was stored."""
    current = stored.get(key, default)
    if value == current:
        return
    if value is None or value == "":
        stored.pop(key, None)
    else:
        stored[key] = value


# A bool argument's allowed values typed as words (its JSON list, ``[true, false]``, reads as well).
BOOL_WORDS = {"true": True, "false": False}


def list_value(text: str, item_type: str = "") -> list[Any] | None:
    """A list as typed into a text box: a JSON list when the text is one, else comma-separated values (numbers
    where ``item_type`` is int or float, ``true``/``false`` where it is bool; ``[긴급], [일반]`` is two values, where
    it was kept as one); None for no text."""
    text = text.strip()
    if not text:
        return None
    if text.startswith("["):
        try:
            parsed = json_loads(text)
        except ValueError:
            pass  # no JSON: values that start with "[" typed comma-separated ("[긴급], [일반]"), read as such
        else:
            return parsed if isinstance(parsed, list) else [parsed]
    items = [item.strip() for item in text.split(",") if item.strip()]
    if item_type == "bool":
        return [BOOL_WORDS.get(item.lower(), item) for item in items]
    return [_number(item) for item in items] if item_type in {"int", "float"} else items


def list_text(values: list[Any], item_type: str = "") -> str:
    """``values`` as a text box shows them: comma-separated words where :func:`list_value` reads that back as
    exactly these values, else a JSON list, which always does. Tried rather than predicted, so that no case is
    missed: a value with a comma, a first one starting with ``[`` (``["[긴급]", "[일반]"]`` read back as one
    text), ``["[1]"]`` (read back as the number 1), ``"7"`` for an int argument, spaces around a value. A text box
    drops line breaks, so a value with one is shown as JSON (which writes it as ``\\n``)."""
    if all(isinstance(value, str) for value in values):
        text = ", ".join(values)
        if "\n" not in text and "\r" not in text and list_value(text, item_type) == values:
            return text
    return json.dumps(values, ensure_ascii=False)


def allowed_text(allowed: Any, arg_type: str = "") -> str:
    """An argument's allowed values as the editor shows them (:func:`list_text`); "" when it has none."""
    return list_text(allowed, arg_type) if isinstance(allowed, list) else ""


class ArgsTableWidget(EditorWidget):
    """``args`` as a table: one row per argument of the tool's input schema (and of the stored contract).

    A contract that lists arguments allows those only (the gate refuses or drops the others: ``unknown_args``);
    one that lists none allows those of the input schema. So a row the stored contract does not list is shown
    with an "allow" box, ticked where the contract allows it, and is written into the contract only when the box
    is ticked or its row filled in: saving the page unchanged never lists an argument the contract left out (it
    would be sent). An empty contract, all of whose rows come back ticked and blank, stays empty."""

    template_name = "admin/mcpregistry/widgets/contract_args.html"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.schema: dict[str, Any] = {}
        self.stored: dict[str, Any] = {}
        self.problem: str | None = None
        # The form's errors at this field (``arg.key: ...``), so that the cells they name are marked, not every one.
        self.errors: list[str] = []

    def schema_arguments(self) -> dict[str, Any]:
        properties = self.schema.get("properties")
        return properties if isinstance(properties, dict) else {}

    def get_context(self, name: str, value: Any, attrs: dict[str, Any] | None) -> dict[str, Any]:
        context = super().get_context(name, value, attrs)
        parsed = _loads(value)
        specs = parsed if isinstance(parsed, dict) else {}
        properties = self.schema_arguments()
        names = list(dict.fromkeys([*specs, *properties]))
        rows = []
        for index, arg in enumerate(names):
            spec = specs.get(arg) if isinstance(specs.get(arg), dict) else {}
            prop = properties.get(arg) if isinstance(properties.get(arg), dict) else {}
            rows.append(
                {
                    "index": index,
                    "name": arg,
                    "spec": spec,
                    "allowed": allowed_text(spec.get("allowed"), str(spec.get("type") or "")),
                    # In words, as the tool page's table above says it ("text", not "string").
                    "schema_type": discovery_view.type_text(prop) if prop else "",
                    "description": prop.get("description", ""),
                    "in_schema": arg in properties,
                    # Listed in the stored contract: always kept, no box. Otherwise allowed where the value shown
                    # lists it, or lists nothing (then the input schema's arguments are allowed).
                    "listed": arg in self.stored,
                    "in_contract": arg in specs or not specs,
                    # A URL's hosts: offered where the argument may be a text, and wherever some are set.
                    "hosts": allowed_text(spec.get("allowed_hosts")),
                    "hosts_shown": spec.get("type") in (None, "", "str") or "allowed_hosts" in spec,
                    "bad": self.error_keys(arg),
                }
            )
        context["widget"].update(
            {
                "rows": rows,
                "types": TYPE_CHOICES,
                "invalid_json": parsed is None,
                "unlisted": any(not row["listed"] for row in rows),
            }
        )
        return context

    def error_keys(self, arg: str) -> set[str]:
        """The keys of ``arg``'s row that an error names (``room.pattern: ...`` names ``pattern``); "" for an
        error about the argument as a whole (``room: ...``)."""
        keys = set()
        for error in self.errors:
            if error.startswith(f"{arg}."):
                keys.add(error[len(arg) + 1 :].partition(":")[0].partition(".")[0])
            elif error.startswith(f"{arg}:"):
                keys.add("")
        return keys

    def value_from_editor(self, data: MultiValueDict[str, Any], name: str) -> Any:
        result: dict[str, Any] = {}
        for index in data.getlist(f"{name}__rows"):
            arg = data.get(f"{name}__{index}__name", "")
            if not arg:
                continue
            spec = self._row_spec(data, f"{name}__{index}", dict(self.stored.get(arg) or {}))
            if arg in self.stored or spec or f"{name}__{index}__in_contract" in data:
                result[arg] = spec
        if not self.stored and data.getlist(f"{name}__rows"):
            if not result:
                # No contract arguments means the input schema's: an empty list cannot say "none".
                self.problem = str(
                    _(
                        "Allow at least one argument: a contract that lists none allows every argument of the "
                        "input schema."
                    )
                )
            elif set(result) == set(self.schema_arguments()) and not any(result.values()):
                result = {}  # every argument allowed, none constrained: the empty contract, as stored
        return json.dumps(result, ensure_ascii=False)

    @staticmethod
    def _row_spec(data: MultiValueDict[str, Any], prefix: str, spec: dict[str, Any]) -> dict[str, Any]:
        """One row's inputs merged into the argument's stored ``spec`` (a key left as it was stays as stored)."""

        def field(key: str) -> str:
            return str(data.get(f"{prefix}__{key}", "")).strip()

        arg_type = field("type")
        _merge(spec, "type", arg_type or None)
        required = f"{prefix}__required" in data
        if "required" in spec or required:
            spec["required"] = required
        allowed = list_value(field("allowed"), arg_type)
        if allowed != spec.get("allowed"):
            _merge(spec, "allowed", allowed)
        for key in ARG_NUMBER_KEYS:
            _merge(spec, key, _number(field(key)) if field(key) else None)
        for key in ("min_length", "max_length"):
            _merge(spec, key, _number(field(key)) if field(key) else None)
        _merge(spec, "pattern", field("pattern") or None)
        if f"{prefix}__allowed_hosts" in data:  # offered on this row (a text's): else kept as stored
            hosts = list_value(field("allowed_hosts"))
            if hosts != spec.get("allowed_hosts"):
                _merge(spec, "allowed_hosts", hosts)
        return spec


class RetryWidget(EditorWidget):
    """``retry`` as fields: attempts, the failure kinds retried (checkboxes), backoff base and cap."""

    template_name = "admin/mcpregistry/widgets/contract_retry.html"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stored: dict[str, Any] = {}

    def get_context(self, name: str, value: Any, attrs: dict[str, Any] | None) -> dict[str, Any]:
        context = super().get_context(name, value, attrs)
        parsed = _loads(value)
        retry = {**DEFAULT_RETRY, **(parsed if isinstance(parsed, dict) else {})}
        reasons = [(r, r in (retry.get("on") or []), RETRY_REASON_LABELS[r]) for r in sorted(RETRYABLE)]
        context["widget"].update({"retry": retry, "reasons": reasons})
        return context

    def value_from_editor(self, data: MultiValueDict[str, Any], name: str) -> Any:
        retry = dict(self.stored)
        for key in ("max_attempts", "backoff_base_s", "backoff_cap_s"):
            text = str(data.get(f"{name}__{key}", "")).strip()
            _merge(retry, key, _number(text) if text else None, default=DEFAULT_RETRY[key])
        reasons = [r for r in sorted(RETRYABLE) if r in data.getlist(f"{name}__on")]
        if sorted(retry.get("on", DEFAULT_RETRY["on"])) != reasons:
            retry["on"] = reasons
        honor = f"{name}__honor_retry_after" in data
        if honor != retry.get("honor_retry_after", DEFAULT_RETRY["honor_retry_after"]):
            retry["honor_retry_after"] = honor
        return json.dumps(retry, ensure_ascii=False)


RETRY_REASON_LABELS = {"rate_limit": _("rate limit"), "timeout": _("timeout"), "transport": _("transport error")}


# Blank rows the per-field table offers for new keys (a saved page offers as many again).
NEW_FIELD_ROWS = 2
FIELD_NUMBER_KEYS = ("max_items", "min", "max")


class ReturnsWidget(EditorWidget):
    """``returns`` as fields: type, required keys, non-empty, max items, max characters; per-field constraints
    as a table, one row per key of the result (type, not empty, max items, min, max) and blank rows for new
    keys. A key given on two rows is kept as ``problem`` for the form to refuse, naming it."""

    template_name = "admin/mcpregistry/widgets/contract_returns.html"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stored: dict[str, Any] = {}
        self.problem: str | None = None

    def get_context(self, name: str, value: Any, attrs: dict[str, Any] | None) -> dict[str, Any]:
        context = super().get_context(name, value, attrs)
        parsed = _loads(value)
        returns = parsed if isinstance(parsed, dict) else {}
        fields = returns.get("fields") if isinstance(returns.get("fields"), dict) else {}
        rows = [
            {"index": index, "key": key, "spec": spec if isinstance(spec, dict) else {}}
            for index, (key, spec) in enumerate(fields.items())
        ]
        rows += [{"index": len(rows) + n, "key": "", "spec": {}} for n in range(NEW_FIELD_ROWS)]
        required = returns.get("required")
        context["widget"].update(
            {
                "returns": returns,
                "types": TYPE_CHOICES,
                # As typed, where that reads back as these keys (a key with a comma does not): else JSON.
                "required_text": list_text(required) if isinstance(required, list) else "",
                "field_rows": rows,
            }
        )
        return context

    def value_from_editor(self, data: MultiValueDict[str, Any], name: str) -> Any:
        returns = dict(self.stored)

        def field(key: str) -> str:
            return str(data.get(f"{name}__{key}", "")).strip()

        _merge(returns, "type", field("type") or None)
        _merge(returns, "required", list_value(field("required")), default=[])
        if f"{name}__non_empty" in data:
            returns["non_empty"] = True
        else:
            returns.pop("non_empty", None)
        for key in ("max_items", "max_chars"):
            _merge(returns, key, _number(field(key)) if field(key) else None)
        if f"{name}__fields__rows" in data:
            fields = self._fields_from_rows(data, name)
            if fields:
                returns["fields"] = fields
            else:
                returns.pop("fields", None)
        return json.dumps(returns, ensure_ascii=False)

    def _fields_from_rows(self, data: MultiValueDict[str, Any], name: str) -> dict[str, Any]:
        """The table's rows as ``returns.fields``: a row without a key is skipped; what a row does not set is
        left as it was stored for that key (a field this page does not show survives a save)."""
        stored_fields = self.stored.get("fields") if isinstance(self.stored.get("fields"), dict) else {}
        fields: dict[str, Any] = {}
        for index in data.getlist(f"{name}__fields__rows"):

            def cell(key: str, index: str = index) -> str:
                return str(data.get(f"{name}__fields__{index}__{key}", "")).strip()

            key = cell("key")
            if not key:
                continue
            if key in fields:
                self.problem = str(_("Per-field constraints: %(key)s is on two rows; keep one.") % {"key": key})
                continue
            stored = stored_fields.get(key)
            spec = dict(stored) if isinstance(stored, dict) else {}
            _merge(spec, "type", cell("type") or None)
            if f"{name}__fields__{index}__non_empty" in data:
                spec["non_empty"] = True
            else:
                spec.pop("non_empty", None)
            for number_key in FIELD_NUMBER_KEYS:
                _merge(spec, number_key, _number(cell(number_key)) if cell(number_key) else None)
            fields[key] = spec
        return fields


class OpenChoiceField(forms.ChoiceField):
    """A choice whose value the model validates (so a refused value gets the model's message, which names the
    valid ones, not the generic "not one of the available choices"). A value not offered that holds a NUL or another
    control character is refused first (``list_fields.control_character_problem``): on PostgreSQL, the model's check
    that looks the name up was a 500."""

    def valid_value(self, value: Any) -> bool:
        return True

    def validate(self, value: Any) -> None:
        super().validate(value)
        offered = forms.ChoiceField.valid_value(self, value)  # a tool, an argument or the value stored: as it is
        if value and not offered and (problem := control_character_problem(str(value))):
            raise ValidationError(problem, code="control_characters")


def fallback_choices(tool: McpTool, contract_args: dict[str, Any] | None) -> list[tuple[str, str]]:
    """The same server's other tools whose required arguments this tool's arguments cover."""
    names = tool_argument_names(tool, contract_args)
    choices = [("", str(_("— none —")))]
    for other in tool.server.tools.filter(available=True).exclude(pk=tool.pk).order_by("name"):
        if tool_required_arguments(other) <= names:
            choices.append((other.name, other.name))
    return choices


class ToolContractForm(forms.ModelForm):
    contract_json = forms.CharField(
        label=_("contract as JSON"),
        required=False,
        widget=forms.Textarea(attrs={"rows": 12, "cols": 100, "class": "contract-json", "spellcheck": "false"}),
        help_text=_(
            "The same contract as import_config reads it and export_config writes it. Edit it here instead of the "
            "fields above: when this text changes, it is what is saved."
        ),
    )
    fallback_tool = OpenChoiceField(label=_("fallback tool"), required=False)
    idempotency_arg = OpenChoiceField(label=_("idempotency key argument"), required=False)

    class Meta:
        model = ToolContract
        # Every field the gate applies (so a new one is never missing from the page), the risk first.
        fields = ["risk", *(name for name in CONTRACT_FIELDS if name != "risk")]
        widgets = {"args": ArgsTableWidget, "returns": ReturnsWidget, "retry": RetryWidget}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        contract: ToolContract = self.instance
        tool = contract.tool if contract.tool_id else None
        for name in ("args", "returns", "retry"):
            self.fields[name].widget.stored = dict(getattr(contract, name) or {})
        if tool is not None:
            self.fields["args"].widget.schema = tool.input_schema if isinstance(tool.input_schema, dict) else {}
            choices = fallback_choices(tool, contract.args)
            if contract.fallback_tool and contract.fallback_tool not in dict(choices):
                choices.append((contract.fallback_tool, contract.fallback_tool))
            self.fields["fallback_tool"].choices = choices
            names = idempotency_choices(tool, contract.args if isinstance(contract.args, dict) else {})
            if contract.idempotency_arg and contract.idempotency_arg not in names:
                names.append(contract.idempotency_arg)  # shown as stored, refused on save
            self.fields["idempotency_arg"].choices = [("", str(_("— none —"))), *((n, n) for n in names)]
            self.fields["idempotency_arg"].help_text = _(
                "Write tools: the argument that carries each call's idempotency key (<run id>:<approval id>; a "
                "write with no approval: <run id>:<call id>), so that a call whose outcome is unknown may be sent "
                "again with the same key. None: sent at most once."
            )
            if contract.pk:
                self.initial["contract_json"] = json.dumps(contract_entry(contract), ensure_ascii=False, indent=2)
        self.fields["timeout_s"].help_text = _("More than 0 and at most the platform's cap. Empty: the server's.")
        self.fields["memo_ttl_s"].help_text = _(
            "Read tools only. Empty: off. Kept for later runs only where the server's session is shared (a run's "
            "own session may shape its answers) and while the binding stays as it is."
        )
        # A page that does not show the cap (an older form, a script posting the fields it knows) keeps it.
        self.fields["correction_cap"].required = False

    def full_clean(self) -> None:
        super().full_clean()
        if self._errors:  # the argument table marks the cells its errors name
            self.fields["args"].widget.errors = [str(error) for error in self._errors.get("args", [])]

    def clean_correction_cap(self) -> int:
        value = self.cleaned_data.get("correction_cap")
        return int(value) if value is not None else int(self.instance.correction_cap)

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        for name in ("args", "returns"):
            if problem := self.fields[name].widget.problem:
                self.add_error(name, problem)
        raw = (self.data.get(self.add_prefix("contract_json")) or "").strip()
        initial = _loads(self.initial.get("contract_json") or "")
        from_document = bool(raw) and _loads(raw) != initial
        if from_document:
            self._apply_document(raw, cleaned)
        self._refuse_no_object(cleaned)
        self._refuse_control_characters(cleaned, from_document=from_document)
        return cleaned

    def _refuse_no_object(self, cleaned: dict[str, Any]) -> None:
        """``returns`` or ``retry`` posted as its JSON ``null``, or empty (a script posting the field's JSON), is
        refused: the model's check reads no value as no constraints, but its column holds no NULL (the save was a
        500). A page that leaves the field out keeps it as stored; ``args`` is refused so by the model."""
        for name in ("returns", "retry"):
            posted = not self.fields[name].widget.value_omitted_from_data(self.data, self.files, self.add_prefix(name))
            if posted and name in cleaned and cleaned[name] is None:
                self.add_error(name, _("Enter a JSON object."))

    def _refuse_control_characters(self, cleaned: dict[str, Any], *, from_document: bool) -> None:
        """A NUL (PostgreSQL's jsonb refuses it: the save was a 500) or another control character but tab and line
        breaks, in a text of the arguments, the result or the retry policy, wherever it was typed (a pattern, an
        allowed value, a required key, a posted JSON), is refused as the tags and keywords refuse it
        (``list_fields.control_character_problem``), naming the entry; an entry as stored is left alone. Said
        at the JSON view when that is what the admin edited."""
        for name in ("args", "returns", "retry"):
            problems = changed_texts_problems(cleaned.get(name), getattr(self.instance, name))
            if not problems:
                continue
            if from_document:
                cleaned.pop(name)  # never handed to the model's checks, which may write the text into the page
                self.add_error("contract_json", [f"{name}.{problem}" for problem in problems])
            else:
                self.add_error(name, problems)

    def _apply_document(self, raw: str, cleaned: dict[str, Any]) -> None:
        try:
            document = json_loads(raw)
        except ValueError as exc:
            raise ValidationError(
                {"contract_json": _("Not valid JSON: %(error)s") % {"error": json_error_text(exc)}}
            ) from None
        if not isinstance(document, dict):
            raise ValidationError({"contract_json": _("Enter a JSON object (the contract entry of export_config).")})
        tool = self.instance.tool
        document = {"mcp_id": tool.server.mcp_id, "tool": tool.name, **document}
        try:
            spec = ContractSpec.model_validate(document)
        except PydanticValidationError as exc:
            raise ValidationError({"contract_json": spec_problems(exc, ContractSpec)}) from None
        if (spec.mcp_id, spec.tool) != (tool.server.mcp_id, tool.name):
            raise ValidationError(
                {
                    "contract_json": _("This page edits the contract of %(id)s.%(tool)s.")
                    % {"id": tool.server.mcp_id, "tool": tool.name}
                }
            )
        cleaned.update(contract_fields(spec))
