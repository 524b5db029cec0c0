"""An eval case's and an eval set's JSON fields as an admin writes them, with nothing to guess: the tools a run
must call a line each (the arguments its call must contain on the indented lines below, ``KEY=value``), the
checks on the answer in three inputs named for what they check, the A2A context and data as ``KEY=value`` lines,
the thresholds as one number input per score.

Each widget writes the same JSON the field always held (the model's validation, the import/export and the API
see no difference); a post that carries the JSON itself under the field's name (a script, an older page) is
taken as it is. A stored value the lines cannot show (a tool list of another shape, nested data) is shown and
edited as JSON, so nothing is ever lost by opening a case. Text that does not read is shown again as typed, with
what is wrong on which line.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from django.utils.datastructures import MultiValueDict
from django.utils.text import format_lazy
from django.utils.translation import gettext, gettext_lazy

from agent_platform.json import loads as json_loads
from evals.scoring import answer_regex_refusal
from mcpregistry.contract_form import EditorWidget
from mcpregistry.gate_records import contract_of
from mcpregistry.list_fields import (
    KeyValueLinesWidget,
    LinesWidget,
    Unreadable,
    data_parts_from_text,
    data_parts_text,
    key_fits,
    key_value_line,
    line_problem,
    loads_value,
    one_line,
    reads_back,
    value_text,
)
from mcpregistry.models import McpTool

NO_TOOL = "*"
CHECK_KINDS = ("contains", "regex", "dont_know")


def name_fits(name: Any) -> bool:
    """Whether ``name`` is a tool name a line shows and reads back: text without spaces, ``=`` or line breaks."""
    return isinstance(name, str) and bool(name) and not any(c.isspace() for c in name) and "=" not in name


def text_arguments(tool_name: str) -> frozenset[str]:
    """The arguments that every registered tool named ``tool_name`` takes as text (``"str"`` in the contract the
    gate checks its calls against, read off its input schema where no contract was saved); empty where no server
    has a tool of that name. Tools of one name on two servers must agree: where they do not, the argument is typed
    as any other value is."""
    typed = [_text_arguments_of(tool) for tool in McpTool.objects.filter(name=tool_name).select_related("contract")]
    return frozenset(set.intersection(*typed)) if typed else frozenset()


def _text_arguments_of(tool: McpTool) -> set[str]:
    constraints = contract_of(tool).args
    if not isinstance(constraints, dict):
        return set()
    return {arg for arg, spec in constraints.items() if isinstance(spec, dict) and spec.get("type") == "str"}


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class ToolLinesWidget(LinesWidget):
    """``expected_tools``: a tool per line; the arguments its call must contain below it, indented, KEY=value.

    A value reads as the rule editor reads it (``3`` a number, ``true`` a boolean, ``"3"`` in quotes text), except
    a bare number given to an argument the tool takes as text (``text_arguments``): ``sku=1001`` is the text
    ``"1001"`` a right call sends, not the number 1001 no call of that tool could send (the gate refuses a number
    there). So a stored number under such an argument is shown as JSON: as a line, it would read back as text."""

    rows = 4
    placeholder = "search_employee\n  name=김하늘"

    def as_lines(self, value: Any) -> str | None:
        if not isinstance(value, list):
            return None
        lines: list[str] = []
        for item in value:
            if isinstance(item, str) and name_fits(item):
                lines.append(item)
            elif isinstance(item, dict) and set(item) <= {"name", "args"} and name_fits(item.get("name")):
                args = item.get("args", {})
                if not isinstance(args, dict) or not all(key_fits(k) and reads_back(v) for k, v in args.items()):
                    return None
                if "args" in item and not args:
                    return None  # {"args": {}} would read back without it
                if _numbers_read_as_text(item["name"], args):
                    return None
                lines.append(item["name"])
                lines += [f"  {key}={value_text(arg)}" for key, arg in args.items()]
            else:
                return None
        return "\n".join(lines)

    def from_lines(self, text: str) -> Any:
        """``[{"name": …, "args"?: {…}}]``, the shape the model documents and every reader of it takes."""
        tools: list[dict[str, Any]] = []
        typed: list[dict[str, str]] = []  # per tool, the text of each argument as typed
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            if line[0].isspace():
                if not tools:
                    raise line_problem(number, gettext("an argument before any tool"))
                key, value = key_value_line(line, number)
                if key in tools[-1].setdefault("args", {}):
                    raise line_problem(number, gettext("%(key)s is given twice") % {"key": key})
                tools[-1]["args"][key] = value
                typed[-1][key] = line.strip().partition("=")[2].strip()
                continue
            name = line.strip()
            if not name_fits(name):
                raise line_problem(
                    number, gettext("one tool name (indent the arguments its call must contain below it)")
                )
            tools.append({"name": name})
            typed.append({})
        for tool, texts in zip(tools, typed, strict=True):
            for key in _numbers_read_as_text(tool["name"], tool.get("args", {})):
                tool["args"][key] = texts[key]
        return tools


def _numbers_read_as_text(tool_name: str, args: dict[str, Any]) -> list[str]:
    """The arguments of ``args`` that hold a number where the tool takes text (``text_arguments``; looked up only
    where a number is given)."""
    numbers = [key for key, value in args.items() if _is_number(value)]
    if not numbers:
        return []
    as_text = text_arguments(tool_name)
    return [key for key in numbers if key in as_text]


class NameListWidget(LinesWidget):
    """``forbidden_tools``: tool names, a line each (``*``: no tool at all, as the checkbox says)."""

    template_name = "admin/evals/widgets/forbidden.html"
    rows = 2
    placeholder = "get_asset"

    def get_context(self, name: str, value: Any, attrs: dict[str, Any] | None) -> dict[str, Any]:
        context = super().get_context(name, value, attrs)
        parsed = loads_value(value)
        context["widget"]["none"] = isinstance(parsed, list) and NO_TOOL in parsed
        if context["widget"]["lines"] is not None and context["widget"]["none"]:
            context["widget"]["lines"] = "\n".join(n for n in parsed if n != NO_TOOL)
        return context

    def as_lines(self, value: Any) -> str | None:
        if not isinstance(value, list) or not all(name_fits(n) or n == NO_TOOL for n in value):
            return None
        if len(set(value)) != len(value):
            return None  # a name twice would read back once
        return "\n".join(value)

    def from_lines(self, text: str) -> Any:
        return [line.strip() for line in text.splitlines() if line.strip()]

    def value_from_editor(self, data: MultiValueDict[str, Any], name: str) -> Any:
        value = super().value_from_editor(data, name)
        if data.get(f"{name}__none") and not isinstance(value, Unreadable):
            names = json_loads(value)
            return json.dumps([NO_TOOL, *[n for n in names if n != NO_TOOL]], ensure_ascii=False)
        return value


class AnswerChecksWidget(EditorWidget):
    """``answer_checks``: the texts the answer must contain and the regexes it must match, a line each, and
    whether it must say it does not know.

    A regex the scoring would refuse is refused here, by the box it was typed in (``value_from_editor``): the
    admin's form row marks every input of a field in error, so the box itself is marked and named, and the other
    box, in which nothing is wrong, is not (the page comes back with both as typed)."""

    template_name = "admin/evals/widgets/answer_checks.html"

    @staticmethod
    def as_inputs(value: Any) -> dict[str, Any] | None:
        if value in (None, ""):
            return {"contains": "", "regex": "", "dont_know": False}
        if not isinstance(value, list):
            return None
        found: dict[str, list[str]] = {"contains": [], "regex": []}
        dont_know = False
        for check in value:
            if not isinstance(check, dict) or len(check) != 1 or next(iter(check)) not in CHECK_KINDS:
                return None
            kind, wanted = next(iter(check.items()))
            if kind == "dont_know":
                if wanted is not True or dont_know:
                    return None
                dont_know = True
            elif not isinstance(wanted, str) or not wanted or not one_line(wanted) or wanted != wanted.strip():
                return None
            else:
                found[kind].append(wanted)
        return {"contains": "\n".join(found["contains"]), "regex": "\n".join(found["regex"]), "dont_know": dont_know}

    def get_context(self, name: str, value: Any, attrs: dict[str, Any] | None) -> dict[str, Any]:
        context = super().get_context(name, value, attrs)
        raw = None
        if isinstance(value, Unreadable):  # refused: the boxes again, as typed, the one in error marked
            inputs: dict[str, Any] | None = json.loads(value)
        else:
            parsed = loads_value(value)
            inputs = self.as_inputs(parsed)
            if inputs is None:
                raw = parsed if isinstance(parsed, str) else json.dumps(parsed, ensure_ascii=False, indent=2)
        context["widget"].update({"inputs": inputs, "raw": raw})
        return context

    def value_from_editor(self, data: MultiValueDict[str, Any], name: str) -> Any:
        checks: list[dict[str, Any]] = []
        typed = {kind: str(data.get(f"{name}__{kind}", "")) for kind in ("contains", "regex")}
        for kind, text in typed.items():
            for line in text.splitlines():
                if line.strip():
                    checks.append({kind: line.strip()})
        dont_know = bool(data.get(f"{name}__dont_know"))
        if dont_know:
            checks.append({"dont_know": True})
        # A regex is named by itself, as the model's check names it: the box skips blank lines, so a count is no
        # line number. The texts a box holds are never wrong (any text that is not blank), so only this box is.
        refused = [
            gettext("%(regex)s: %(problem)s")
            % {
                "regex": check["regex"],
                "problem": gettext("not a valid regular expression: %(error)s") % {"error": why},
            }
            for check in checks
            if "regex" in check and (why := answer_regex_refusal(check["regex"])) is not None
        ]
        if refused:
            shown = {**typed, "dont_know": dont_know, "invalid": ["regex"]}
            problem = gettext("“%(input)s”: %(problems)s") % {
                "input": gettext("the answer matches (a regular expression per line)"),
                "problems": "; ".join(refused),
            }
            return Unreadable(json.dumps(shown, ensure_ascii=False), problem)
        return json.dumps(checks, ensure_ascii=False)


class AlternativesWidget(LinesWidget):
    """``alternatives``: another sequence of tools that also passes, a line each: the tools comma-separated (in the
    order the case's own ``ordered`` asks), or separated by ``>`` when they must be called in that order
    (``"ordered": true``, the seed's backup path); a note after ``#``. What no line says (``"ordered": false``, one
    tool in this order, a key the import does not know) is shown as JSON, with the keys named."""

    template_name = "admin/evals/widgets/alternatives.html"
    rows = 2
    placeholder = "get_asset_status_backup  # 백업 서버"

    def as_lines(self, value: Any) -> str | None:
        if not isinstance(value, list):
            return None
        lines = []
        for alternative in value:
            if not isinstance(alternative, dict) or not set(alternative) <= {"tools", "note", "ordered"}:
                return None
            tools, note = alternative.get("tools"), alternative.get("note")
            if not isinstance(tools, list) or not tools:
                return None  # no tool at all: a line cannot say so
            if "note" in alternative and (
                not isinstance(note, str) or not note or note != note.strip() or not one_line(note)
            ):
                return None
            ordered = "ordered" in alternative
            if ordered and (alternative["ordered"] is not True or len(tools) < 2):
                return None  # only ">" between two tools or more says "in this order"
            names = [t if isinstance(t, str) else None for t in tools]  # {"name": …} reads back as the name
            if not all(name_fits(n) and not any(c in str(n) for c in ",#>") for n in names):
                return None
            separator = " > " if ordered else ", "
            lines.append(separator.join(str(n) for n in names) + (f"  # {note}" if note else ""))
        return "\n".join(lines)

    def from_lines(self, text: str) -> Any:
        alternatives: list[dict[str, Any]] = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            tools_text, sep, note = line.partition("#")
            ordered = ">" in tools_text
            if ordered and "," in tools_text:
                raise line_problem(number, gettext("tools separated by commas or by >, not both"))
            names = [n.strip() for n in tools_text.split(">" if ordered else ",")]
            if not all(name_fits(n) for n in names):
                raise line_problem(
                    number,
                    gettext(
                        "tool names, comma-separated, or separated by > in the order they must be called (a note after #)"
                    ),
                )
            alternative: dict[str, Any] = {"tools": names}
            if ordered:
                alternative["ordered"] = True
            if sep and note.strip():
                alternative["note"] = note.strip()
            alternatives.append(alternative)
        return alternatives


class DataLinesWidget(LinesWidget):
    """``data``: the A2A data parts, a ``PATH=value`` line per value as the rule editor writes data conditions
    (``order.id=7`` for ``{"order": {"id": 7}}``), a blank line between parts."""

    rows = 3
    placeholder = "asset_id=A-1001\norder.id=7"

    def as_lines(self, value: Any) -> str | None:
        return data_parts_text(value)

    def from_lines(self, text: str) -> Any:
        return data_parts_from_text(text)


class ThresholdsWidget(EditorWidget):
    """An eval set's ``thresholds``: one number input per score, minimums and maximums apart, each named in
    words with its code; empty means no threshold."""

    template_name = "admin/evals/widgets/thresholds.html"

    def __init__(
        self,
        *args: Any,
        minimums: tuple[str, ...] = (),
        maximums: tuple[str, ...] = (),
        labels: Callable[[str], str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.minimums, self.maximums = minimums, maximums
        self.labels = labels or (lambda name: name)

    def get_context(self, name: str, value: Any, attrs: dict[str, Any] | None) -> dict[str, Any]:
        context = super().get_context(name, value, attrs)
        if isinstance(value, Unreadable):  # refused: the inputs again, as typed, with what is wrong
            parsed, fits = json.loads(value), True
        else:
            parsed = loads_value(value)
            known = set(self.minimums) | set(self.maximums)
            fits = parsed in (None, "") or (
                isinstance(parsed, dict)
                and set(parsed) <= known
                and all(isinstance(v, int | float) and not isinstance(v, bool) for v in parsed.values())
            )
        stored = parsed if isinstance(parsed, dict) else {}

        def rows(names: tuple[str, ...]) -> list[dict[str, Any]]:
            return [{"code": n, "label": self.labels(n), "value": stored.get(n, "")} for n in names]

        context["widget"].update(
            {
                "fits": fits,
                "minimums": rows(self.minimums),
                "maximums": rows(self.maximums),
                "raw": None
                if fits
                else (parsed if isinstance(parsed, str) else json.dumps(parsed, ensure_ascii=False, indent=2)),
            }
        )
        return context

    def value_from_editor(self, data: MultiValueDict[str, Any], name: str) -> Any:
        thresholds: dict[str, Any] = {}
        typed: dict[str, str] = {}
        problems = []
        for score in (*self.minimums, *self.maximums):
            text = str(data.get(f"{name}__{score}", "")).strip()
            if not text:
                continue
            typed[score] = text
            number = _number(text)
            if number is None:
                problems.append(gettext("%(name)s: a number") % {"name": self.labels(score)})
            else:
                thresholds[score] = number
        if problems:
            return Unreadable(json.dumps(typed, ensure_ascii=False), "; ".join(problems))
        return json.dumps(thresholds, ensure_ascii=False)


def _number(text: str) -> int | float | None:
    """A whole number as itself (however large), else a finite decimal; None for anything else (NaN, inf)."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        number = float(text)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def _tool(item: Any) -> Any:
    if isinstance(item, str):
        return {"name": item}
    if isinstance(item, dict) and set(item) <= {"name", "args"} and not item.get("args"):
        return {"name": item.get("name")}
    return item


def case_tool_names(value: Any) -> list[str]:
    """The tool names a case's tool list holds (names, or ``{"name": ...}`` objects), in order."""
    if not isinstance(value, list):
        return []
    names = [item if isinstance(item, str) else item.get("name") if isinstance(item, dict) else None for item in value]
    return [n for n in names if isinstance(n, str) and n]


def alternative_tool_names(value: Any) -> list[str]:
    """The tool names of a case's alternatives, in order."""
    alternatives = value if isinstance(value, list) else []
    return [n for a in alternatives if isinstance(a, dict) for n in case_tool_names(a.get("tools"))]


def normalized_tools(value: Any) -> Any:
    """A tool list compared by meaning: a name, ``{"name": name}`` and ``{"name": name, "args": {}}`` are one."""
    return [_tool(t) for t in value] if isinstance(value, list) else value


def normalized_checks(value: Any) -> Any:
    """Answer checks compared as a set (the editor groups them by kind)."""
    if not isinstance(value, list):
        return value
    try:
        return sorted(json.dumps(c, sort_keys=True, ensure_ascii=False) for c in value)
    except TypeError:
        return value


def normalized_alternatives(value: Any) -> Any:
    if not isinstance(value, list):
        return value
    return [{**a, "tools": normalized_tools(a.get("tools"))} if isinstance(a, dict) else a for a in value]


HELP_TEXTS = {
    "expected_tools": format_lazy(
        "{} {}",
        gettext_lazy(
            "A tool per line. The arguments its call must contain go on the lines below it, indented, KEY=value."
        ),
        gettext_lazy(
            'Values: 3 is a number, true a boolean, "3" in quotes text, anything else text; a bare number given '
            'to an argument the tool takes as text stays text (sku=1001 is "1001").'
        ),
    ),
    "forbidden_tools": format_lazy(
        "{} {}",
        gettext_lazy("A tool per line that the run must not call."),
        gettext_lazy("A case of type “no tool needed” (no_tool) that lists none may call no tool at all."),
    ),
    "alternatives": gettext_lazy(
        "Another sequence of tools that also passes, a line each: the tools comma-separated (in order only when the "
        "case's “in this order” is ticked), or separated by > when they must be called in that order; a note after "
        '#. As JSON: a list of {"tools": [tool names], "note": "text", "ordered": true or false}, only "tools" '
        "required."
    ),
    "context": gettext_lazy("KEY=value, a line each (3 is a number, true a boolean)."),
    "data": gettext_lazy(
        'Each A2A data part as PATH=value lines, as in the rule editor (order.id=7 is {"order": {"id": 7}}); '
        "a blank line between parts."
    ),
}


class ContextLinesWidget(KeyValueLinesWidget):
    """``context``: KEY=value, a line each."""
