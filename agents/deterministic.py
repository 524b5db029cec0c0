"""Deterministic rules: decide, without a model, which MCP tool calls a query must trigger.

Pure functions over plain values (no ORM): an admin rule's ``when`` conditions are evaluated against the
query, the A2A context and the A2A data, and its ``params`` template is rendered from them. The engine then
calls each matched tool through the gate, in rule order.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import re
import time
import unicodedata
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import regex  # type: ignore[import-untyped]
from django.utils.translation import gettext
from pydantic import BaseModel, ConfigDict, Field, field_validator

from agent_platform.text import bounded_regex, nfc, nfc_value, regex_error_text, strings_mapped
from audit.visible import readable_text

logger = logging.getLogger(__name__)

# A regex group's name is any identifier (``(?P<팀>…)`` as ``{match.팀}``), as the answer template reads it.
PLACEHOLDER = re.compile(r"\{(query|context\.[^{}\s]+|data\.[^{}\s]+|match\.[^\W\d]\w*)\}")
_MISSING = object()
# Spaces, tabs, no-break and ideographic spaces, line breaks: one space where a keyword is looked for.
_WHITESPACE_RUN = re.compile(r"\s+")

REGEX_TIMEOUT_S = 0.1
"""How long a rule's regex may search one query. A pattern that backtracks catastrophically (``(a|aa)+$``) on a
query made for it gives up then, and the rule does not match (its reason says why): a caller's query cannot hold
a worker, or the rule tester's page, for longer. Rule regexes run on the ``regex`` module, which has this bound
(``re`` has none); for the patterns rules are written in, the two read the same."""


@dataclass(frozen=True)
class RuleSpec:
    """A rule as the engine sees it."""

    rule_id: int | None
    name: str
    mcp_id: str
    tool_name: str
    when: dict[str, Any] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    answer_template: str = ""
    code: str = ""
    # When the rule matches, the model's first call is forced to this tool ("any": some tool).
    force_first_tool: str = ""


@dataclass
class RuleDecision:
    """Why a rule fired or not: recorded in the run's trace so an auditor can follow the routing."""

    rule_id: int | None
    name: str
    matched: bool
    reason: str
    params: dict[str, Any] | None = None
    match: dict[str, str] = field(default_factory=dict)
    tool_name: str = ""
    # ``reason`` as a stable code (``rule:matched``, ``rule:keyword``, ``rule:regex``…: ``match_conditions_coded``),
    # for a trace span's ``platform.reason_code``; ``reason`` stays the sentence the run's trace records.
    code: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "rule_id": self.rule_id,
            "rule": self.name,
            "matched": self.matched,
            "reason": self.reason,
            "params": self.params,
        }


def lookup_path(root: Any, path: str) -> Any:
    """Follow a dotted path (``a.b.0.c``) through dicts and lists. Returns ``_MISSING`` when absent, never raises:
    a list's index is a decimal number (``int`` reads it), not every digit (``①``, ``²``: ``isdigit`` holds and
    ``int`` raised, and a rule's condition or template naming one ended its run ``internal``)."""
    node = root
    for part in path.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdecimal() and int(part) < len(node):
            node = node[int(part)]
        else:
            return _MISSING
    return node


def lookup_context(context: dict[str, Any], path: str) -> Any:
    """Find ``path`` in the A2A context: a key written with its dots first (``{"user.tier": "gold"}``, as a
    context condition has always read it), else the dotted path through nested objects (``{"user": {"tier":
    "gold"}}``, as a data condition reads a data part). Conditions and ``{context.…}`` placeholders read it the
    same way, so a rule whose condition holds can fill its params. Returns ``_MISSING`` when absent."""
    if path in context:
        return context[path]
    return lookup_path(context, path)


def lookup_data(a2a_data: list[dict[str, Any]] | None, path: str) -> Any:
    """Find ``path`` in the first A2A data part that has it."""
    for part in a2a_data or []:
        value = lookup_path(part, path)
        if value is not _MISSING:
            return value
    return _MISSING


@functools.lru_cache(maxsize=8192)
def _compiled(pattern: str) -> regex.Pattern[str]:
    return bounded_regex(nfc(pattern))


class RegexTooSlow(Exception):
    """A rule's regex did not finish searching the query within ``REGEX_TIMEOUT_S``."""


# Full-width ASCII (U+FF01-U+FF5E) and the ideographic space as their half-width forms: what a Korean input
# method's full-width mode types. Not the rest of compatibility composition (NFKC), which makes "10²" read "102",
# "①②③④" read "1234" and "Ⅳ" read "IV": a rule matching those would send a value the caller never meant.
_WIDTH_FOLD = {0x3000: " ", **{code: chr(code - 0xFEE0) for code in range(0xFF01, 0xFF5F)}}


def width_folded(text: str) -> str:
    """``text`` with full-width ASCII and the ideographic space written half-width (``_WIDTH_FOLD``)."""
    return text.translate(_WIDTH_FOLD)


def regex_search(pattern: str, text: str) -> regex.Match[str] | None:
    """Search ``text`` with a rule's ``pattern``: composed (``nfc``) as written first, then, where it reads
    otherwise, width-folded (``width_folded``): ``Ａ-１００４`` typed in a Korean input method's full-width mode
    meets ``A-\\d{4}`` (a pattern written for a full-width character still meets it as typed). Both searches together
    take at most ``REGEX_TIMEOUT_S``. Raises RegexTooSlow past it."""
    composed = nfc(text)
    deadline = time.monotonic() + REGEX_TIMEOUT_S
    try:
        for searched in dict.fromkeys((composed, width_folded(composed))):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            found = _compiled(pattern).search(searched, timeout=left)
            if found is not None:
                return found
        return None
    except TimeoutError:
        logger.warning("a rule's regex %r gave up on a query of %d characters", pattern[:200], len(text))
        raise RegexTooSlow from None


def match_conditions(
    when: dict[str, Any],
    *,
    query: str,
    context: dict[str, Any],
    a2a_data: list[dict[str, Any]] | None,
    available_tools: set[str],
) -> tuple[bool, str, dict[str, str]]:
    """Evaluate every condition of ``when`` (all must hold). Returns (matched, reason, regex named groups), as
    ``match_conditions_coded`` finds them."""
    matched, _code, reason, groups = match_conditions_coded(
        when, query=query, context=context, a2a_data=a2a_data, available_tools=available_tools
    )
    return matched, reason, groups


def match_conditions_coded(
    when: dict[str, Any],
    *,
    query: str,
    context: dict[str, Any],
    a2a_data: list[dict[str, Any]] | None,
    available_tools: set[str],
) -> tuple[bool, str, str, dict[str, str]]:
    """Evaluate every condition of ``when`` (all must hold). Returns (matched, code, reason, regex named groups):
    the code names the condition that failed (``rule:keyword``, ``rule:no_keyword``, ``rule:regex``,
    ``rule:regex_timeout``, ``rule:context``, ``rule:data``, ``rule:tool_unavailable``; ``rule:matched``), the
    reason says it in a sentence. Text is
    compared composed (``nfc``) on both sides: a keyword typed on one keyboard meets a query typed on another;
    keywords are looked for as :func:`keyword_text` reads both sides (full-width letters, no-break spaces), and a
    regex, a context or a data value that does not meet as composed is tried width-folded (``width_folded``), so
    text typed in a full-width input mode meets a rule written half-width, in the rule tester as in a run."""
    searched = keyword_text(query)
    all_keywords = [nfc(str(k)) for k in when.get("all_keywords") or []]
    missing = [k for k in all_keywords if not _keyword_found(k, searched)]
    if missing:
        return False, "rule:keyword", f"keyword missing: {missing[0]}", {}
    any_keywords = [nfc(str(k)) for k in when.get("any_keywords") or []]
    if any_keywords and not any(_keyword_found(k, searched) for k in any_keywords):
        return False, "rule:no_keyword", "none of the keywords present", {}
    groups: dict[str, str] = {}
    pattern = when.get("regex")
    if pattern:
        try:
            found = regex_search(str(pattern), query)
        except RegexTooSlow:
            return False, "rule:regex_timeout", f"regex gave up after {REGEX_TIMEOUT_S:g} s on this query", {}
        if found is None:
            return False, "rule:regex", "regex did not match", {}
        # Width-folded: "A-１００４" typed in full-width mode matches ``A-\d{4}`` and is sent as the A-1004 the tool
        # knows (it was sent as typed, and not found); so is a group found in the query as written (a pattern that
        # names a full-width character). Only the width: a "①" or "²" a group holds is sent as typed.
        groups = {nfc(k): width_folded(v) for k, v in found.groupdict().items() if v is not None}
    # The input is stored composed (``run_input_guarded``): only the values compared are composed again here.
    # Values are compared by kind too (``same_value``): a condition's true is not a 1 (seed 004's trap).
    for key, expected in (when.get("context") or {}).items():
        found = lookup_context(context, nfc(str(key)))
        value = nfc_value(None if found is _MISSING else found)  # absent reads as null, as it always has
        if not _condition_text_matches(value, nfc_value(expected)):
            return False, "rule:context", f"context.{key} is not {expected!r}", groups
    for path, expected in (when.get("data") or {}).items():
        value = lookup_data(a2a_data, nfc(str(path)))
        if value is _MISSING:
            return False, "rule:data", f"data.{path} absent", groups
        if expected != "*" and not _condition_text_matches(nfc_value(value), nfc_value(expected)):
            return False, "rule:data", f"data.{path} is not {expected!r}", groups
    tool = when.get("tool_available")
    if tool and tool not in available_tools:
        return False, "rule:tool_unavailable", f"tool {tool} not available", groups
    return True, "rule:matched", "matched", groups


def _condition_text_matches(found: Any, expected: Any) -> bool:
    """``condition_value_matches`` on the composed values, else on their width-folded texts, as regexes read the
    query: a context's ``ＶＩＰ`` or ``１２３４`` typed in full-width mode meets a condition's ``VIP`` or ``1234``
    (a ``①`` does not meet ``1``)."""
    return condition_value_matches(found, expected) or condition_value_matches(
        _width_folded_value(found), _width_folded_value(expected)
    )


def _width_folded_value(value: Any) -> Any:
    """Every string of a JSON value (keys too) width-folded."""
    return strings_mapped(value, width_folded)


_HANGUL_SPACE = re.compile(r"(?<=[가-힣]) (?=[가-힣])")


@functools.lru_cache(maxsize=4096)
def _keyword_pattern(keyword: str) -> re.Pattern[str]:
    # A space the keyword puts between two Hangul syllables may be left out in the query ("몇 명" meets "몇명"):
    # Korean spacing varies. Never the other way round: "사원" must not meet "회사 원격", nor "급여" "지급 여부".
    # Other spaces stay (" VPN " is a word of its own; "V P N" is not "VPN").
    return re.compile(" ?".join(re.escape(part) for part in _HANGUL_SPACE.split(keyword_text(keyword))))


def _keyword_found(keyword: str, searched: str) -> bool:
    """Whether ``keyword`` is in ``searched`` (a query as ``keyword_text`` reads it)."""
    return _keyword_pattern(keyword).search(searched) is not None


_NUMBER_TEXT = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?")


def condition_value_matches(found: Any, expected: Any) -> bool:
    """Whether a context or data value meets a condition's: equal as JSON (``same_value``), or a number and the
    same number written as text (``1234`` and ``"1234"``: the rule editor reads ``chatbotId=1234`` as a number,
    and callers send ids as JSON text; it never matched, and the tester said it did). A boolean still meets only a
    boolean (seed 004's trap)."""
    if same_value(found, expected):
        return True
    for number, text in ((found, expected), (expected, found)):
        if isinstance(number, int | float) and not isinstance(number, bool) and isinstance(text, str):
            written = text.strip()
            # Exactly, as decimals: through float, 9007199254740993 met 9007199254740992.
            return _NUMBER_TEXT.fullmatch(written) is not None and Decimal(written) == Decimal(repr(number))
    return False


def keyword_text(text: str) -> str:
    """``text`` as a keyword condition reads it, the keyword and the query alike: compatibility-composed (NFKC:
    full-width ``ＶＰＮ`` is ``VPN``, a no-break or ideographic space is a space), case-folded, and each run of
    whitespace one space. A query pasted from a web page or typed with a full-width input method says the same
    words as the keyword written in the rule. A rule's regex reads the query composed (``nfc``) and, where that
    finds nothing, width-folded (``regex_search``), never case-folded: its author says in the pattern
    whether case matters."""
    # Normalised again after the case fold, which can undo a composition (``ǰ`` folds to ``j`` and a combining caron).
    folded = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())
    return _WHITESPACE_RUN.sub(" ", folded)


def same_value(a: Any, b: Any) -> bool:
    """Whether two JSON values are equal as JSON reads them: a boolean equals only a boolean (Python's
    ``True == 1`` holds; a condition's ``true`` must not meet a ``1``), a number any equal number (``3`` and
    ``3.0``) but no boolean, lists item by item and objects key by key the same way."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return bool(a == b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, list | dict) or isinstance(b, list | dict):
        return False
    return bool(a == b)


class ParamsRenderError(ValueError):
    """A placeholder of the params template has no value for this query."""


def render_params(
    template: Any,
    *,
    query: str,
    context: dict[str, Any],
    a2a_data: list[dict[str, Any]] | None,
    match: dict[str, str],
) -> Any:
    """Render a params template. A string that is exactly one placeholder takes the value with its own type
    (so ``"{data.count}"`` can yield an int); placeholders inside longer strings are substituted as text (a value
    that is no string as the answer template writes it: nothing for null, ``a, b`` for a list of plain values,
    else JSON)."""

    def value_of(name: str) -> Any:
        if name == "query":
            return query
        # The path as the conditions read it (composed): a template written decomposed finds what they found.
        head, _, rest = name.partition(".")
        rest = nfc(rest)
        if head == "context":
            value = lookup_context(context, rest)
        elif head == "data":
            value = lookup_data(a2a_data, rest)
        else:
            value = match.get(rest, _MISSING)
        if value is _MISSING:
            raise ParamsRenderError(f"no value for {{{name}}}")
        return value

    if isinstance(template, dict):
        return {
            k: render_params(v, query=query, context=context, a2a_data=a2a_data, match=match)
            for k, v in template.items()
        }
    if isinstance(template, list):
        return [render_params(v, query=query, context=context, a2a_data=a2a_data, match=match) for v in template]
    if isinstance(template, str):
        whole = PLACEHOLDER.fullmatch(template)
        if whole:
            return value_of(whole.group(1))
        return PLACEHOLDER.sub(lambda m: _readable(value_of(m.group(1))), template)
    return template


def decide(
    rule: RuleSpec,
    *,
    query: str,
    context: dict[str, Any],
    a2a_data: list[dict[str, Any]] | None,
    available_tools: set[str],
) -> RuleDecision:
    """Evaluate one admin rule against a query: matched with rendered params, or skipped with a reason."""
    matched, code, reason, groups = match_conditions_coded(
        rule.when, query=query, context=context, a2a_data=a2a_data, available_tools=available_tools
    )
    if not matched:
        return RuleDecision(rule.rule_id, rule.name, False, reason, code=code)
    try:
        params = render_params(rule.params, query=query, context=context, a2a_data=a2a_data, match=groups)
    except ParamsRenderError as exc:
        return RuleDecision(rule.rule_id, rule.name, False, str(exc), match=groups, code="rule:params")
    return RuleDecision(rule.rule_id, rule.name, True, "matched", params=params, match=groups, code=code)


def render_answer(template: str, *, query: str, match: dict[str, str], params: dict[str, Any], value: Any) -> str:
    """Phrase one deterministic result with a rule's answer template ({result}, {result.KEY}, {match.X},
    {params.X}, {query}). A ``*`` step takes a key from every item of a list (``{result.assets.*.model}``, or
    ``{result.*.name}`` for a result that is a list); a list of plain values reads as ``a, b, c``. When a
    placeholder has no value (say the tool answered "not found" in plain text where the template expects JSON
    keys), the tool's own text is the answer, unless the placeholder gives its own words for that
    (``{result.owner|없음}``: written where the value is missing, null or empty).

    What a placeholder stands for (the tool's value, the query) has the characters that do not show themselves
    written out (``⟦U+E0049⟧``, ``audit.visible.readable_text``: a line's ``\\r\\n`` and an emoji's joiner kept), as
    the model's copy has: the answer reaches people and the A2A or MCP caller (often another agent, whose model reads
    a tag character as text). The template's own words are the agent's, kept as written."""
    plain = readable_text(value if isinstance(value, str) else _compact(value))

    def sub(m: re.Match[str]) -> str:
        name, default = m.group(1), m.group(2)
        if name == "query":
            return readable_text(query) or (default or "")
        if name == "result":
            return ("" if value is None else plain) or (default or "")
        head, _, rest = name.partition(".")
        source: Any = {"match": match, "params": params, "result": value}.get(head)
        found = _lookup_each(source, rest) if source is not None else _MISSING
        if found is _MISSING and source is not None and nfc(rest) != rest:
            found = _lookup_each(source, nfc(rest))  # a regex group's name is composed (``match_conditions``)
        text = "" if found is _MISSING else readable_text(_readable(found))
        if default is not None and not text:
            return default
        if found is _MISSING:
            raise ParamsRenderError(name)
        return text

    try:
        answer = _ANSWER_PLACEHOLDER.sub(sub, template)
    except ParamsRenderError:
        return plain
    # A template that reads as nothing (``{result.owner}`` of an asset with no owner) is no answer: the tool's own.
    return answer if answer.strip() else plain


def _lookup_each(root: Any, path: str) -> Any:
    """``lookup_path``, where a ``*`` step maps the rest of the path over a list's items (the items without it
    are left out; none with it: missing)."""
    head, star, tail = path.partition("*")
    if not star:
        return lookup_path(root, path)
    node = lookup_path(root, head.rstrip(".")) if head.rstrip(".") else root
    if not isinstance(node, list):
        return _MISSING
    rest = tail.lstrip(".")
    found = [item for item in (_lookup_each(i, rest) if rest else i for i in node) if item is not _MISSING]
    return found if found or not node else _MISSING


def _readable(value: Any) -> str:
    """A placeholder's value as answer text: a string as it is, no value (JSON's null: an asset with no owner) as
    nothing, a list of plain values as ``a, b, c`` (its nulls left out), anything else as compact JSON. ``null``
    or ``None`` is no word for an end user reading an answer in Korean."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(
        v is None or (isinstance(v, str | int | float) and not isinstance(v, bool)) for v in value
    ):
        return ", ".join(str(v) for v in value if v is not None)
    return _compact(value)


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


# An opening brace followed by a name: a placeholder, or an attempt at one (a literal brace before JSON's quote or
# a digit is text).
_PLACEHOLDER_ATTEMPT = re.compile(r"\{[A-Za-z_][^{}\s]*\}?")
# ``{name}``, or ``{name|words}``: the words written where the value is missing or empty (an asset with no owner).
# A placeholder whose words for no value hold another ``|`` (``{result.owner|a|b}``): not one ``_ANSWER_PLACEHOLDER``
# reads. Its first words hold no ``|``: each try is linear, where ``[^{}]*\|[^{}]*`` tried every split of a run of
# bars (``{a|||…`` with no closing brace took seconds), with the same matches.
_WORDS_WITH_BAR = re.compile(r"\{[A-Za-z_][\w.*]*\|[^{}|]*\|[^{}]*\}")
_ANSWER_PLACEHOLDER = re.compile(r"\{([A-Za-z_][\w.]*(?:\*[\w.]*)*)(?:\|([^{}|]*))?\}")


def placeholder_problems(
    when: Any, params: Any, answer_template: str, *, attempts: bool = True, named_params: bool = True
) -> dict[str, list[str]]:
    """What a rule's placeholders name that no run could give (a rule that could never fill them would be
    skipped every time, or answer with its braces): ``{match.X}`` without a named group ``X`` in the regex, in
    the params (every text in them, also a list's items and an object's members, each problem named by where it
    is: ``floors[1]``, ``filter.floor``) or the answer template; in the answer template, a placeholder of no
    known source (``query``, ``result``, ``result.KEY``, ``match.X``, ``params.X``), ``{params.X}`` of no
    parameter the rule sends (``named_params``), or a brace left open. Per field.

    Two checks came after rules were stored, so a caller that saves a stored rule turns them off where what they
    read is unchanged, and such a rule still saves and imports as it is: ``attempts`` (what reads as a placeholder
    in the params and is none), False where the params are unchanged; ``named_params`` (``{params.X}`` of no
    parameter), False where neither the params nor the answer template changed."""
    pattern = when.get("regex") if isinstance(when, dict) else None
    try:
        groups: set[str] | None = set(_compiled(pattern).groupindex) if isinstance(pattern, str) and pattern else set()
    except (regex.error, OverflowError, RecursionError, MemoryError):
        groups = None  # the regex's own error is reported on the conditions: its groups are not known
    if when is None:
        groups = None  # conditions that could not be read (their own error is said): their groups are not known
    problems: dict[str, list[str]] = {}

    def unmatched(name: str) -> str | None:
        head, _sep, rest = name.partition(".")
        if head == "match" and groups is not None and nfc(rest) not in groups:
            have = ", ".join(sorted(groups)) or gettext("none")
            return gettext("%(placeholder)s: the regex has no named group '%(group)s' (its groups: %(groups)s)") % {
                "placeholder": f"{{{name}}}",
                "group": rest,
                "groups": have,
            }
        return None

    def unknown_param(name: str) -> str | None:
        # ``{params.NAME}`` (or ``{params.NAME.KEY}``) of no argument the rule sends: it never has a value, and
        # every answer would be the tool's own text.
        first = re.split(r"[.*]", name.partition(".")[2], maxsplit=1)[0]
        if not named_params or not isinstance(params, dict) or first in params or nfc(first) in params:
            return None
        return gettext("%(placeholder)s: the rule sends no parameter '%(name)s' (its parameters: %(names)s)") % {
            "placeholder": f"{{{name}}}",
            "name": first,
            "names": ", ".join(sorted(map(str, params))) or gettext("none"),
        }

    for where, text in _template_texts(params if isinstance(params, dict) else {}):
        for found in PLACEHOLDER.finditer(text):
            if (problem := unmatched(found.group(1))) is not None:
                problems.setdefault("params", []).append(f"{where}: {problem}")
        # What is left that reads as a placeholder ("{match.name" with its brace left open, "{bogus.x}") would be
        # sent to the tool as it is written (``attempts``: checked where the params change, so a rule stored
        # before the check, whose literal braces its tool may read itself, still saves and imports as it is).
        for found in _PLACEHOLDER_ATTEMPT.finditer(PLACEHOLDER.sub("", text)) if attempts else ():
            problems.setdefault("params", []).append(
                f"{where}: "
                + gettext("%(text)s: use {query}, {context.KEY}, {data.KEY} or {match.NAME}, each written whole")
                % {"text": found.group(0)}
            )
    template = answer_template or ""
    for found in _ANSWER_PLACEHOLDER.finditer(template):
        name = found.group(1)
        head, _, rest = name.partition(".")
        if head not in {"query", "result", "match", "params"} or (head in {"match", "params"} and not rest):
            problems.setdefault("answer_template", []).append(
                gettext(
                    "%(placeholder)s: use {query}, {result}, {result.KEY}, {result.LIST.*.KEY}, {match.NAME} or "
                    "{params.NAME}"
                )
                % {"placeholder": f"{{{name}}}"}
            )
        elif (problem := unknown_param(name) if head == "params" else unmatched(name)) is not None:
            problems.setdefault("answer_template", []).append(problem)
    leftover = _ANSWER_PLACEHOLDER.sub("", template)
    if (barred := _WORDS_WITH_BAR.search(leftover)) is not None:
        problems.setdefault("answer_template", []).append(
            gettext("%(text)s: the words after | cannot hold |, { or }") % {"text": barred.group(0)}
        )
    elif "{" in leftover or "}" in leftover:
        problems.setdefault("answer_template", []).append(
            gettext("a brace that opens or closes no placeholder: write {result.KEY} whole")
        )
    return problems


def _template_texts(template: Any, where: str = "") -> list[tuple[str, str]]:
    """Every text of a params template with where it is (``floors[1]``, ``filter.floor``): a placeholder in a
    list's item or an object's member is rendered as one at the top is (``render_params``), so it is checked as
    one."""
    if isinstance(template, str):
        return [(where, template)]
    if isinstance(template, dict):
        return [
            found
            for key, value in template.items()
            for found in _template_texts(value, f"{where}.{key}" if where else str(key))
        ]
    if isinstance(template, list):
        return [found for index, value in enumerate(template) for found in _template_texts(value, f"{where}[{index}]")]
    return []


class WhenSpec(BaseModel):
    """The conditions of an admin rule (all that are given must hold)."""

    model_config = ConfigDict(extra="forbid")

    all_keywords: list[str] = Field(default_factory=list)
    any_keywords: list[str] = Field(default_factory=list)
    regex: str | None = None
    context: dict[str, Any] = Field(default_factory=dict)
    data: dict[str, Any] = Field(default_factory=dict)
    tool_available: str | None = None

    @field_validator("regex")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value:
            try:
                with contextlib.suppress(OverflowError):  # a repeat count too big: ``regex`` says so, and where
                    re.compile(value)  # its errors say where a construct begins (``regex`` points past its end)
                _compiled(value)  # as the rules run it
            except (re.error, regex.error, OverflowError, RecursionError, MemoryError) as exc:
                raise ValueError(
                    gettext("not a valid regular expression: %(why)s") % {"why": regex_error_text(exc)}
                ) from exc
        return value


def always_text(template: str) -> bool:
    """Whether a params text with placeholders renders as text whatever a run gives (``render_params``): the query
    and a regex group are text, and so is a placeholder written inside other text (``"{data.n}개"``,
    ``"{match.a}{match.b}"``). Only ``{context.…}`` or ``{data.…}`` written alone keeps its value's type. The gate
    takes no numeric text for a number (``check_args``), so no conversion is made here either: the rule tester and
    a run send what the template renders."""
    whole = PLACEHOLDER.fullmatch(template)
    return whole is None or whole.group(1) == "query" or whole.group(1).startswith("match.")


def template_problems(
    constraints: dict[str, dict[str, Any]],
    params: Any,
    *,
    refuse_unknown: bool = True,
    input_schema: Any = None,
    text_into_typed: bool = True,
) -> list[str]:
    """Check a params template against a tool's argument constraints before it is ever rendered: unknown
    arguments (``argument_names``: a tool without arguments takes none) and missing required ones, the
    type/allowed/range of every value that is not a placeholder, and (``text_into_typed``) a placeholder that
    always renders as text for an argument typed otherwise (``always_text``).

    ``text_into_typed`` came after rules were stored: a caller that saves a stored rule turns it off where its
    params and tool are unchanged, so such a rule still saves and imports as it is (its runs fail the call)."""
    from mcpregistry.contracts import argument_names, check_args

    if not isinstance(params, dict):
        return [gettext("the parameters must be a JSON object")]
    problems: list[str] = []
    names = argument_names(constraints, input_schema)
    if names is not None and refuse_unknown:
        problems += [
            f"args:unknown:{name}: " + gettext("the tool has no argument '%(name)s'") % {"name": name}
            for name in params
            if name not in names
        ]
    problems += [
        f"args:missing:{name}: " + gettext("the tool requires '%(name)s'") % {"name": name}
        for name, spec in constraints.items()
        if spec.get("required") and name not in params
    ]
    for name, value in params.items():
        if name not in constraints:
            continue
        if isinstance(value, str) and PLACEHOLDER.search(value):
            expected = constraints[name].get("type")
            if text_into_typed and expected not in (None, "str") and always_text(value):
                problems.append(
                    f"args:type:{name}: "
                    + gettext(
                        "%(value)s is always text and '%(name)s' must be of type %(expected)s: every call would "
                        "be refused. Give a fixed value, or {data.KEY} or {context.KEY} alone, which keep their "
                        "type."
                    )
                    % {"value": value, "name": name, "expected": expected}
                )
            continue
        _clean, verdict = check_args({name: {**constraints[name], "required": False}}, {name: value})
        if verdict is not None:
            problems.append(f"{verdict.reason}: {verdict.detail}")
    return problems
