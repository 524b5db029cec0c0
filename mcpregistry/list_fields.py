"""Lists and maps of texts as an admin writes them, never as JSON to type.

- :class:`TextListField`: comma-separated words (keywords, tags) or a line each (questions, a command's
  arguments). A JSON list is still read (a text starting with ``[``), and a stored list the separator cannot
  carry (a word with a comma, an argument with a line break, a first item that starts with ``[``) is shown as
  JSON, so opening and saving a page never changes what is stored. An item with a NUL character (PostgreSQL's
  JSON refuses it: the page was a 500) or another control character but tab and line breaks is refused at the
  field (:func:`control_character_problem`); so is a text anywhere in a JSON value an admin changed
  (:func:`changed_texts_problems`: a tool contract's arguments, result and retry policy).
- :class:`EditorWidget`: the base of every structured editor of a JSON field (the contract, rule, agent settings
  and eval case editors): inputs read back into the JSON, or the JSON itself where a post carries it.
- :class:`LinesWidget` and its ``KEY=value`` form :class:`KeyValueLinesWidget` (a JSON field edited as lines;
  values typed as the rule editor types them: ``3`` a number, ``true`` a boolean, ``{...}`` an object), with
  :class:`EditedJSONField`, which refuses lines that do not read, naming the line, and shows them again as typed.
  A value the lines cannot show is shown and edited as JSON; a post carrying the JSON itself is taken as it is.
"""

from __future__ import annotations

import json
import math
import unicodedata
from typing import Any

from django import forms
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import ProhibitNullCharactersValidator
from django.utils.datastructures import MultiValueDict
from django.utils.translation import gettext

from agent_platform.json import BoundedJSONField
from agent_platform.json import loads as json_loads
from audit.visible import visible_text


class EditorWidget(forms.Widget):
    """A structured editor of a JSON field: its inputs are named ``<name>__…`` beside a ``<name>__editor`` marker.
    A post that carries the JSON itself under ``<name>`` (the advanced view, a script) wins; a post with neither
    leaves the field out. Subclasses read their inputs in :meth:`value_from_editor`."""

    def value_omitted_from_data(self, data: Any, files: Any, name: str) -> bool:
        return name not in data and f"{name}__editor" not in data

    def value_from_datadict(self, data: MultiValueDict[str, Any], files: Any, name: str) -> Any:
        if name in data:
            return data[name]
        if f"{name}__editor" not in data:
            return None
        return self.value_from_editor(data, name)

    def value_from_editor(self, data: MultiValueDict[str, Any], name: str) -> Any:
        raise NotImplementedError


class TextListField(forms.CharField):
    """``["프린터", "노트북"]`` ⇄ ``프린터, 노트북`` (``separator=","``) or a line each (``separator="\\n"``)."""

    def __init__(
        self,
        *,
        separator: str = ",",
        unique: bool = False,
        encoder: Any = None,
        decoder: Any = None,
        **kwargs: Any,
    ) -> None:
        self.separator, self.unique = separator, unique
        if "widget" not in kwargs:
            kwargs["widget"] = (
                forms.TextInput(attrs={"size": 80})
                if separator == ","
                else forms.Textarea(attrs={"rows": 4, "cols": 80})
            )
        kwargs.pop("max_length", None)
        super().__init__(strip=False, **kwargs)

    def _carries(self, items: list[str]) -> bool:
        """Whether the separated text reads back as exactly these items."""
        if any(not one_line(item) or (self.separator == "," and "," in item) for item in items):
            return False
        if items and items[0].lstrip().startswith("["):
            return False
        if self.unique and len(set(items)) != len(items):
            return False
        return all(item and item == item.strip() for item in items)

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, str) or value is None:
            return value or ""
        if isinstance(value, list) and all(isinstance(item, str) for item in value) and self._carries(value):
            return (", " if self.separator == "," else "\n").join(value)
        return json.dumps(value, ensure_ascii=False)

    def to_python(self, value: Any) -> list[str]:
        if isinstance(value, list):
            return value
        text = str(value or "")
        if text.strip().startswith("["):
            try:
                parsed = json_loads(text)
            except ValueError:
                parsed = None
            if not isinstance(parsed, list) or not all(isinstance(item, str) for item in parsed):
                raise forms.ValidationError(self.refusal(), code="invalid")
            return parsed
        items = [item.strip() for item in text.split(self.separator)]
        items = [item for item in items if item]
        return list(dict.fromkeys(items)) if self.unique else items

    def refusal(self) -> str:
        if self.separator == ",":
            return gettext("Write the words separated by commas (or as a JSON list of texts).")
        return gettext("Write one per line (or a JSON list of texts).")

    def validate(self, value: Any) -> None:
        if self.required and not value:
            raise forms.ValidationError(self.error_messages["required"], code="required")
        # Each item on its own: Django's NUL check on the field (CharField's validators) reads the list's repr,
        # where a NUL is the four characters "\x00".
        for item in value:
            if isinstance(item, str) and (problem := control_character_problem(item)):
                raise forms.ValidationError(problem, code="control_characters")

    def has_changed(self, initial: Any, data: Any) -> bool:
        try:
            return self.to_python(data) != (initial or [])
        except forms.ValidationError:
            return True


# The control characters that are text: tab and line breaks (an argument or a question of several lines; a word
# with one, which a JSON list carries, reads back as itself: see the module docstring).
_TEXT_CONTROLS = frozenset("\t\n\r")


def control_character_problem(text: str) -> str:
    """Why ``text`` cannot be an admin's value, or "": a NUL character (no PostgreSQL text or JSON stores one), said
    as Django says it for every text field; another control character but tab and line breaks, which no one
    types."""
    if "\x00" in text:
        return str(ProhibitNullCharactersValidator.message)
    if any(unicodedata.category(c) == "Cc" and c not in _TEXT_CONTROLS for c in text):
        return gettext("Control characters other than tab and line breaks are not allowed.")
    return ""


def texts_problem(value: Any) -> str:
    """The first :func:`control_character_problem` among the texts of a JSON value (an object's keys too), or ""."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend([*item.keys(), *item.values()])
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str) and (problem := control_character_problem(item)):
            return problem
    return ""


def changed_texts_problems(value: Any, stored: Any) -> list[str]:
    """``KEY: problem`` for each entry of an object whose key or texts hold what :func:`texts_problem` refuses; an
    entry as stored is left alone (saving a page unchanged saves what an import stored as it is). The key is
    written visibly (a NUL in it would be written into the page)."""
    if not isinstance(value, dict):
        return []
    stored = stored if isinstance(stored, dict) else {}
    problems = []
    for key, part in value.items():
        if key in stored and part == stored[key]:
            continue
        if problem := texts_problem({key: part}):
            problems.append(f"{visible_text(str(key))}: {problem}")
    return problems


def one_line(text: str) -> bool:
    """Whether ``text`` stays one line of a text box (no line break of any kind ``splitlines`` knows: ``\r``,
    ``\u2028``…), so that it reads back as itself."""
    return text == "" or text.splitlines() == [text]


def _refuse_constant(name: str) -> Any:
    raise ValueError(name)  # NaN and Infinity are no JSON a database stores: such text stays text


class _TooLarge(ValueError):
    """A number written in the text that overflows a float (``1e400``): no JSON a database stores."""


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _TooLarge(text)
    return value


def _json(text: str) -> Any:
    return json_loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)


def value_text(value: Any) -> str:
    """A condition's or parameter's value as typed: text as itself, unless it would read back as another JSON
    value (``123``, ``true``) or as a number too large to store (``1e400``), which is then quoted; any other
    value as JSON."""
    if isinstance(value, str):
        try:
            _json(value)
        except _TooLarge:
            return json.dumps(value, ensure_ascii=False)
        except ValueError:
            return value
        return json.dumps(value, ensure_ascii=False)
    return json.dumps(value, ensure_ascii=False)


def argument_rows(args: Any) -> list[tuple[str, str]] | None:
    """A call's arguments as (name, value) rows for a reviewer, each value as the rule editor writes it (text as
    itself, ``"5"`` quoted where it would read as a number, anything else as JSON); None when they are no
    object (shown as JSON)."""
    if not isinstance(args, dict):
        return None
    # Shown, not read back: characters that change how a value reads without showing themselves (a direction
    # override turning "fdp.exe" into "exe.pdf") are written out (``audit.visible``).
    return [(visible_text(str(name)), visible_text(value_text(value))) for name, value in args.items()]


def typed_value(text: str) -> Any:
    """The inverse of :func:`value_text`: a JSON value when the text is one (``NaN``, ``Infinity`` and a number too
    large for a float, ``1e400``, are not: they stay text), else the text."""
    try:
        return _json(text)
    except ValueError:
        return text


def reads_back(value: Any) -> bool:
    """Whether ``value``, written by :func:`value_text` on one line, reads back as exactly itself."""
    text = value_text(value)
    if not one_line(text):
        return False
    again = typed_value(text.strip())
    return bool(again == value and type(again) is type(value))


def key_fits(key: Any) -> bool:
    """Whether ``key`` can start a ``KEY=value`` line and read back as itself."""
    return isinstance(key, str) and bool(key) and key == key.strip() and "=" not in key and one_line(key)


class Unreadable(str):
    """Lines that did not read: the text as typed (shown again) and what is wrong with it."""

    problem: str

    def __new__(cls, text: str, problem: str) -> Unreadable:
        made = super().__new__(cls, text)
        made.problem = problem
        return made


class TypedLines(str):
    """Lines that read: the JSON they read as, and the text as typed (shown again as typed when the page comes
    back refused, not redrawn from the value: ``retry.on=throttled, tiemout`` stays so, not a JSON list)."""

    lines: str

    def __new__(cls, value: str, lines: str) -> TypedLines:
        made = super().__new__(cls, value)
        made.lines = lines
        return made


class EditedJSONField(BoundedJSONField):
    """A JSON field whose widget may hand it lines that did not read: refused with the reason, shown again; lines
    that read are shown again as typed when the page comes back."""

    def to_python(self, value: Any) -> Any:
        if isinstance(value, Unreadable):
            raise ValidationError(value.problem, code="invalid")
        return super().to_python(value)

    def bound_data(self, data: Any, initial: Any) -> Any:
        if isinstance(data, Unreadable | TypedLines) and not self.disabled:
            return data
        return super().bound_data(data, initial)

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, Unreadable | TypedLines):
            return value
        return super().prepare_value(value)


def loads_value(value: Any) -> Any:
    """A JSON field's value as the widget gets it (text when bound, the stored value otherwise), parsed."""
    if isinstance(value, Unreadable):
        return value
    if isinstance(value, str):
        try:
            return json_loads(value) if value.strip() else None
        except ValueError:
            return value  # JSON that did not parse: shown as typed, in the JSON box
    return value


class LinesWidget(EditorWidget):
    """Shared by the line editors: shows the lines when the value fits them, the JSON box when it does not."""

    template_name = "admin/mcpregistry/widgets/lines.html"
    rows = 3
    placeholder = ""

    def as_lines(self, value: Any) -> str | None:
        """The stored value (never empty) as lines, or None when the lines cannot show it."""
        raise NotImplementedError

    def from_lines(self, text: str) -> Any:
        """The lines as the field's JSON value; raises ValueError naming the line that did not read."""
        raise NotImplementedError

    def get_context(self, name: str, value: Any, attrs: dict[str, Any] | None) -> dict[str, Any]:
        context = super().get_context(name, value, attrs)
        parsed = loads_value(value)
        if isinstance(value, TypedLines):
            lines: str | None = value.lines  # a bound page shown again: the lines as typed
        elif isinstance(parsed, Unreadable):
            lines = str(parsed)
        else:
            lines = "" if parsed in (None, "") else self.as_lines(parsed)  # nothing stored: empty lines
        raw = None
        if lines is None:
            raw = parsed if isinstance(parsed, str) else json.dumps(parsed, ensure_ascii=False, indent=2)
        context["widget"].update({"lines": lines, "raw": raw, "rows": self.rows, "placeholder": self.placeholder})
        return context

    def value_from_editor(self, data: MultiValueDict[str, Any], name: str) -> Any:
        text = str(data.get(f"{name}__lines", ""))
        try:
            return TypedLines(json.dumps(self.from_lines(text), ensure_ascii=False), text)
        except ValueError as exc:
            return Unreadable(text, str(exc))


def line_problem(number: int, message: str) -> ValueError:
    """What is wrong with line ``number`` of a lines editor, naming the line."""
    return ValueError(gettext("line %(n)d: %(problem)s") % {"n": number, "problem": message})


def key_value_line(line: str, number: int) -> tuple[str, Any]:
    """``KEY=value`` → (key, typed value); refused naming the line without an ``=``, or with a number too large to
    store (``1e400``: a float's infinity, which no JSON column stores; quoted, it is text)."""
    key, sep, value = line.strip().partition("=")
    if not sep or not key.strip():
        raise line_problem(number, gettext("write KEY=value"))
    try:
        _json(value.strip())
    except _TooLarge:
        raise line_problem(
            number,
            gettext("%(key)s: a number is too large to store; write it in quotes to keep it as text")
            % {"key": key.strip()},
        ) from None
    except ValueError:
        pass
    return key.strip(), typed_value(value.strip())


class KeyValueLinesWidget(LinesWidget):
    """A JSON object as ``KEY=value`` lines (``tier=3`` a number, ``vip=true`` a boolean, ``retry={"max_attempts":
    3}`` an object), as the rule editor types them. An object a line cannot show (a key with ``=``, a text with a
    line break or spaces around it) is edited as JSON; a key given twice is refused, naming the line."""

    rows = 2
    placeholder = "userId=E-001"

    def as_lines(self, value: Any) -> str | None:
        if not isinstance(value, dict) or not all(key_fits(k) and reads_back(v) for k, v in value.items()):
            return None
        return "\n".join(f"{key}={value_text(item)}" for key, item in value.items())

    def from_lines(self, text: str) -> Any:
        return key_value_lines(text.splitlines())


def key_value_lines(lines: list[str], *, first: int = 1) -> dict[str, Any]:
    """``KEY=value`` lines (blank ones skipped; ``first``: the number of the first line) as an object; a line
    without ``=`` or a key given twice is refused, naming the line."""
    pairs: dict[str, Any] = {}
    for number, line in enumerate(lines, start=first):
        if not line.strip():
            continue
        key, value = key_value_line(line, number)
        if key in pairs:
            raise line_problem(number, gettext("%(key)s is given twice") % {"key": key})
        pairs[key] = value
    return pairs


# --- A2A data parts as PATH=value lines ---------------------------------------------------------------------------


def max_path_depth() -> int:
    """How many keys a ``PATH=value`` line may name: as deep as the API lets JSON nest
    (``PLATFORM_API_MAX_JSON_DEPTH``), an object per key. Deeper, the path that read was a ``RecursionError`` where
    its JSON was written (the page was a 500), and no reader of these values goes so deep."""
    return int(settings.PLATFORM_API_MAX_JSON_DEPTH)


def _paths(part: dict[str, Any], prefix: str = "", *, depth: int = 1) -> list[tuple[str, Any]] | None:
    """A data part's leaves as ``(a.b.c, value)``, or None when a line could not carry it back (a key with a
    dot, an empty object, a path longer than :func:`max_path_depth`)."""
    leaves: list[tuple[str, Any]] = []
    for key, value in part.items():
        if not key_fits(key) or "." in key:
            return None
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict):
            below = _paths(value, path, depth=depth + 1) if value and depth < max_path_depth() else None
            if below is None:
                return None
            leaves += below
        elif reads_back(value):
            leaves.append((path, value))
        else:
            return None
    return leaves


def data_parts_text(parts: Any) -> str | None:
    """A2A data parts as the rule editor writes data conditions: a ``PATH=value`` line per value
    (``order.id=7`` for ``{"order": {"id": 7}}``), a blank line between parts; None when lines cannot carry
    them back exactly."""
    if parts in (None, ""):
        return ""
    if not isinstance(parts, list):
        return None
    blocks = [path_lines(part) for part in parts]
    if any(block is None for block in blocks):
        return None
    return "\n\n".join(block for block in blocks if block is not None)


def line_blocks(text: str) -> list[list[tuple[int, str]]]:
    """The blocks of ``text``'s lines that blank lines separate (data parts, files), each line with its number
    (counted from 1, for an error that names it); no empty block."""
    blocks: list[list[tuple[int, str]]] = [[]]
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            blocks[-1].append((number, line))
        elif blocks[-1]:
            blocks.append([])
    return [block for block in blocks if block]


def data_parts_from_text(text: str) -> list[dict[str, Any]]:
    """The inverse of :func:`data_parts_text`; a line that does not read (no ``=``, a path given twice or both
    as a value and as an object) is refused, naming it."""
    parts: list[dict[str, Any]] = []
    for block in line_blocks(text):
        part: dict[str, Any] = {}
        for number, line in block:
            put_path(part, *key_value_line(line, number), number=number)
        parts.append(part)
    return parts


def put_path(target: dict[str, Any], path: str, value: Any, *, number: int) -> None:
    """Set ``a.b.c`` in ``target`` (the objects on the way made as needed); a path given twice, or both as a
    value and as an object, or of more keys than :func:`max_path_depth`, is refused naming line ``number``."""
    node = target
    *above, leaf = path.split(".")
    if len(above) >= max_path_depth():
        raise line_problem(number, gettext("a path may name at most %(limit)d keys") % {"limit": max_path_depth()})
    if not all(key.strip() for key in [*above, leaf]):
        raise line_problem(
            number,
            gettext("%(key)s: write KEY=value or KEY.SUBKEY=value, with no empty part between the dots")
            % {"key": path},
        )
    for key in above:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise line_problem(number, gettext("%(key)s is given twice") % {"key": path})
    if leaf in node:
        raise line_problem(number, gettext("%(key)s is given twice") % {"key": path})
    node[leaf] = value


def path_lines(value: Any) -> str | None:
    """An object as ``PATH=value`` lines, one per leaf (``retry.max_attempts=3`` for ``{"retry": {"max_attempts":
    3}}``); None when lines cannot carry it back exactly (see ``_paths``)."""
    leaves = _paths(value) if isinstance(value, dict) and value else None
    if leaves is None:
        return None
    return "\n".join(f"{path}={value_text(leaf)}" for path, leaf in leaves)


def object_from_path_lines(text: str) -> dict[str, Any]:
    """The inverse of :func:`path_lines` (blank lines skipped); a line that does not read is refused, naming it."""
    target: dict[str, Any] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            put_path(target, *key_value_line(line, number), number=number)
    return target
