"""The seed's ``expected_source`` column, read into expected and forbidden tools.

Seed 001's eval set mixes four notations in one column, and which one a row uses depends on its ``type``:

- a document path (``"docs/leave_policy.md"``): a RAG case; the platform scores tools, so the path is kept as
  the case's expected source in its note and no tool is expected;
- ``null``: nothing may be cited (``no_answer``): no tool expected, and the answer must say it does not know;
- the string ``"none"``: no tool may be called (``no_tool``): every tool is forbidden (``"*"``);
- tool names, one or several, comma-separated with or without spaces (``"classify_request, calculate"``,
  ``"search_employee,list_projects"``; a full-width ``，`` or an ideographic ``、``, as a Korean keyboard types
  them, is a comma too): those tools are expected.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass, field
from typing import Any

from django.utils.translation import gettext as _

NO_TOOL = "*"
# Commas a Korean keyboard or IME types between names (full-width, ideographic), read as ",".
COMMAS = str.maketrans({"\uff0c": ",", "\u3001": ","})


def not_a_tool_name(name: str) -> bool:
    """Whether ``name`` holds a space (an ideographic one included) or an invisible format character (a zero-width
    space, a joiner): no tool is named so, and the case would fail on every run."""
    return any(c.isspace() or unicodedata.category(c) == "Cf" for c in name)


@dataclass
class ExpectedSource:
    expected_tools: list[dict[str, Any]] = field(default_factory=list)
    forbidden_tools: list[str] = field(default_factory=list)
    answer_checks: list[dict[str, Any]] = field(default_factory=list)
    document: str = ""


def _is_path(text: str) -> bool:
    return "/" in text or text.endswith((".md", ".txt", ".pdf", ".html"))


def parse_expected_source(value: Any, *, case_type: str = "") -> ExpectedSource:
    """Read one ``expected_source`` cell. Raises ValueError for a cell of no known notation (a number, a list of
    non-strings, an empty string where a ``single_tool``/``multi_tool`` case needs names)."""
    if value is None:
        return ExpectedSource(forbidden_tools=[], answer_checks=[{"dont_know": True}])
    if isinstance(value, list):
        if not all(isinstance(v, str) for v in value):
            raise ValueError(_("expected_source as a list must hold tool names"))
        value = ",".join(value)
    if not isinstance(value, str):
        raise ValueError(
            _('expected_source must be a path, null, "none" or tool names, not %(value)s') % {"value": repr(value)}
        )
    text = value.translate(COMMAS).strip()
    if text.lower() in {"none", ""}:
        if not text and case_type in {"single_tool", "multi_tool"}:
            raise ValueError(_("a %(type)s case needs the names of its tools") % {"type": case_type})
        return ExpectedSource(forbidden_tools=[NO_TOOL])
    if _is_path(text) and "," not in text:
        return ExpectedSource(document=text)
    names = [part.strip() for part in text.split(",")]
    if any(not name for name in names):
        raise ValueError(_("empty tool name in %(value)s") % {"value": repr(value)})
    bad = [n for n in names if _is_path(n) or not_a_tool_name(n)]
    if bad:
        raise ValueError(_("not a tool name: %(names)s") % {"names": ", ".join(repr(n) for n in bad)})
    return ExpectedSource(expected_tools=[{"name": n} for n in names])
