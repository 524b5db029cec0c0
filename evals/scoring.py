"""Scoring an eval case from what its run did, and an eval run from its cases. No Django models here.

What a run called is read from its audit record (the gate writes one event per attempt): one ``ToolCall`` per
call, refusals included (a write blocked in an eval, ``eval:write_blocked``, still counts as the call the run
attempted). Retries of one call are one call, shown as its final attempt ended. A call the gate refused before
sending it, for its arguments (``args:*``) or because the run could not call that tool then (``tool:unknown``,
``tool:not_offered``, ``tool:withdrawn``, ``tool:out_of_date``), was tried but never made: it meets no expected tool
and no expected argument, and still counts against precision, the sequence and the forbidden tools, as any call the
run tried does.

The arguments were recorded masked (``audit.masking``): an expected argument the record masks (``session_id``,
a token, a password) could never match, so a case is refused one (``case_problems``), and one stored before is
compared as the record shows it (``_subset``).
"""

from __future__ import annotations

import functools
import json
import math
import statistics
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import regex  # type: ignore[import-untyped]
from django.utils.translation import gettext as _

from agent_platform.text import bounded_regex, nfc, nfc_value, regex_error_text
from agents.conversations import context_id_problem
from audit.masking import mask_value
from evals.documents import case_input_problems
from evals.notation import NO_TOOL, not_a_tool_name

RATE_METRICS = ("pass_rate", "precision", "recall", "sequence_match", "argument_match", "answer_checks")
MAX_METRICS = ("forbidden_violations", "latency_p95_ms")
NOT_SUBMITTED = "eval:not_submitted:"  # a case that could not become a run, + the refusal's code
REGEX_REFUSED = "regex_refused:"  # an answer check whose regex ``answer_regex`` refuses, + the pattern
# What an answer that says it does not know contains (compared in NFC, lowercased, with every space taken out of both:
# "찾을수 없습니다" is "찾을 수 없습니다"). Phrases, not words: a bare "없습니다" ("there is none") ends many a
# confident answer ("문제 없습니다"), and "정보가 없" begins "별도 정보가 없으면 연차는 15일입니다", so a phrase is
# followed by no condition (``CONDITIONAL_ENDINGS``) and no clause it is the reason of (``CLAUSE_LINKS``). "드릴 수
# 없" is any "X해 드릴 수 없" ("답변(을) 드릴 수 없", "알려드릴 수 없", "안내해 드릴 수 없"). "정보가 없습니다" and
# the like are ``NOUN_LACKING``'s.
DONT_KNOW_PHRASES = (
    "모르겠",
    "모릅니다",
    "알 수 없",
    "알지 못",
    "찾을 수 없",
    "찾지 못",
    "확인하지 못",
    "확인할 수 없",
    "답변할 수 없",
    "답변을 할 수 없",
    "드릴 수 없",
    "답할 수 없",
    "드리기 어렵",
    "답변하기 어렵",
    "답하기 어렵",
    "확인이 어렵",
    "확인하기 어렵",
    "가져오지 못",
    "가져올 수 없",
    "i don't know",
    "i do not know",
    "cannot find",
    "can't find",
    "could not find",
    "couldn't find",
    "no information",
    "not sure",
)
# "정보/내용/자료/문서/규정/근거" with its particle, and a few words on (``NOUN_LACKING_SPAN`` characters, spaces taken
# out, within one sentence) what says it is not there (``LACKING``): "정보는 제공된 문서에 없습니다", "내용이
# 없습니다", "정보가 없네요", "해당 내용은 규정 문서에 포함되어 있지 않습니다", "문서에는 육아휴직 규정이 없습니다".
# Not "자료에 따르면 ... 없이": the noun must carry a subject or topic particle; nor "내용은 문제없이 처리되었습니다",
# "자료는 빠짐없이 확인했습니다": "없이" is an adverb's ending. Alone, without such a noun, "포함되지 않습니다" and
# "확인되지 않았습니다" state facts ("수습기간은 포함되지 않습니다", "이상 징후는 확인되지 않았습니다"). A noun
# qualified as more of it (``MORE_OF``: "그 밖의 정보는 없습니다", "그 외 정보는 없습니다", "자세한 내용은 나와 있지
# 않습니다") says only that nothing more is known: no answer that does not know.
NOUN_LACKING = regex.compile(r"(?:정보|내용|자료|문서|규정|근거)(?:가|이|는|은|도|에는|에도)")
NOUN_LACKING_SPAN = 12
LACKING = ("없", "포함되어있지않", "포함되지않", "나와있지않", "확인되지않")
MORE_OF = (
    "다른",
    "그밖",
    "그밖의",
    "그밖에",
    "그외",
    "그외의",
    "이외",
    "이외의",
    "추가",
    "추가적인",
    "자세한",
    "상세한",
    "더이상",
    "더이상의",
    "기타",
)
# Where it looked, and not found there, ending its sentence: "관련 문서에서 확인되지 않습니다" (not "이상 징후는
# 확인되지 않습니다", which states a finding).
NOT_FOUND_IN = regex.compile(r"(?:에서|에서는|으로는|로는)확인되지않습니다(?=[.!?。\n]|$)")
SENTENCE_ENDS = ".!?。,，\n"
FULL_STOPS = ".!?。\n"  # what ends a sentence for ``_stated`` (a comma goes on with it)
# What turns a phrase that follows into a condition, not an answer: "알 수 없으면" ("if it cannot be known"),
# "찾을 수 없다면", "정보가 없어도" ("even without the information"), "확인할 수 없는 경우", "찾지 못할 때" (spaces
# taken out, as the answer is read).
CONDITIONAL_ENDINGS = ("으면", "다면", "도", "어도", "는경우", "을경우", "할경우", "할때", "을때")
# What, within ``CLAUSE_LINK_SPAN`` characters after a phrase, makes it the reason of (or a concession to) what its
# sentence goes on to say: "정보가 없으므로 일반 기준으로 답했습니다", "없어서", "못해서", "없으니", "없지만",
# "없기 때문에". It says it does not know only where the rest of the sentence is an apology or sends the asker on
# (``LINKED_REFUSAL``: "확인할 수 없어서 죄송합니다", "정보가 없으니 인사팀에 문의하세요"), or is itself a refusal
# ("정보가 없어서 답변을 드릴 수 없습니다": that phrase counts on its own).
CLAUSE_LINKS = ("므로", "어서", "해서", "하여", "으니", "지만", "때문에")
CLAUSE_LINK_SPAN = 5
LINKED_REFUSAL = ("죄송", "미안", "양해", "문의", "연락", "확인해주", "확인하시")
# A phrase followed by "는"/"은" and a noun describes the noun ("알 수 없는 오류가 발생했지만 연차는 15일입니다"): no
# statement of not knowing. Except these, which go on with the statement ("없는데요", "없는지", "없는 것 같습니다").
STATEMENT_AFTER_ADNOMINAL = ("데", "지", "것", "듯", "거", "걸")
# How a sentence that states something ends ("1년입니다", "쓸 수 있습니다", "가능합니다", "1년이에요"), and what
# makes one a courtesy instead ("죄송합니다", "감사합니다"), one that sends the asker on ("인사팀에 문의해 주세요",
# "도와드릴 수 있습니다"), or one that says where it looked ("검색 결과 3건을 확인했습니다"): ``_states_fact``.
CLAIM_ENDINGS = ("입니다", "있습니다", "없습니다", "됩니다", "가능합니다", "이에요", "예요", "있어요", "없어요", "돼요")
COURTESIES = ("죄송", "미안", "감사", "안녕", "양해")
REDIRECTS = ("문의", "연락", "확인해주", "확인하시", "도와드", "안내해드")
SEARCHED = ("검색했", "확인했", "찾아보았", "찾아봤", "살펴보았", "살펴봤", "조회했")
# What ends a sentence or clause for ``_fact_around``: a full stop, or a comma that a claim ends before ("연차는
# 15일입니다, 그 외 정보는 없습니다"); any other comma goes on with its sentence ("정보가 없어, 답할 수 없습니다").
CLAUSE_ENDS = regex.compile(r"[.!?。\n]|(?<=(?:" + "|".join(CLAIM_ENDINGS) + r")[)\"'」』]*)[,，]")
# Typographic apostrophes (U+2018, U+2019), which word processors and models write in "I don’t know", read as the
# ASCII one the phrases and an admin's contains checks are typed with.
APOSTROPHES = str.maketrans({"\u2018": "'", "\u2019": "'"})


@dataclass
class ToolCall:
    """One call a run made. ``ok`` and ``reason``: how its final attempt ended (a call that timed out and
    succeeded on its retry succeeded); ``attempts``: how many were sent (0: none, a refusal or a memo hit)."""

    name: str
    args: dict[str, Any]
    ok: bool
    reason: str = ""
    attempts: int = 1


@dataclass
class CaseSpec:
    expected_tools: list[dict[str, Any]]
    ordered: bool = False
    forbidden_tools: list[str] = field(default_factory=list)
    answer_checks: list[dict[str, Any]] = field(default_factory=list)
    alternatives: list[dict[str, Any]] = field(default_factory=list)
    case_type: str = ""

    def forbidden(self) -> set[str]:
        """The tools the run must not call: a ``no_tool`` case that names none forbids every tool (``"*"``), as
        its type says (``no_tool_forbids_every_tool``)."""
        if not self.forbidden_tools and not self.expected_tools and no_tool_forbids_every_tool(self.case_type):
            return {NO_TOOL}
        return set(self.forbidden_tools)


def no_tool_forbids_every_tool(case_type: str) -> bool:
    """Whether a case of ``case_type`` with no forbidden tools given is scored as forbidding every tool: a
    ``no_tool`` case ("no tool needed") fails when its run calls any."""
    return case_type == "no_tool"


@dataclass
class CaseScore:
    passed: bool
    precision: float
    recall: float
    sequence_match: bool
    forbidden_violations: int
    argument_match: float | None
    answer_checks: bool | None
    run_succeeded: bool
    matched: str  # "expected", or the note of the alternative that scored best
    latency_ms: float | None = None
    tokens: int = 0
    model_calls: int = 0
    model_calls_saved: int = 0
    failed_checks: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# The case types whose tools are the point of the case: one with no expected tools would pass whatever its run
# called (nothing expected, no call is a mistake: ``score_case``).
TOOL_CASE_TYPES = ("single_tool", "multi_tool")


def tool_case_problem(case_type: Any, expected_tools: Any) -> str | None:
    """Why a case of ``case_type`` may not expect ``expected_tools``: a ``single_tool`` or ``multi_tool`` case
    that expects none; None when it may."""
    if case_type in TOOL_CASE_TYPES and isinstance(expected_tools, list) and not expected_tools:
        return _("a %(type)s case needs the names of its tools") % {"type": case_type}
    return None


def written_tool_case_problem(
    case_type: Any, expected_tools: Any, *, stored_type: Any = None, stored_tools: Any = None
) -> str | None:
    """``tool_case_problem`` of a case as written (an API's or a document's entry, the admin's row), unless it is
    the stored case's type and tools as they are (``stored_type``/``stored_tools``; None for a new case): a case
    stored so before the check is sent back (an exported set imported again, a row saved unchanged)."""
    if stored_type is not None and stored_type == case_type and same_json(stored_tools, expected_tools):
        return None
    return tool_case_problem(case_type, expected_tools)


def tool_name_problems(*, expected_tools: Any, forbidden_tools: Any, alternatives: Any) -> list[str]:
    """The tool names of a case that no tool has (``not_a_tool_name``), each named where it is: a document's
    ``"get asset"``, a name with a zero-width space (the admin's lines refuse them as they read them)."""
    named: list[tuple[str, Any]] = [(f"expected_tools[{i}]", t) for i, t in enumerate(_listed(expected_tools))]
    named += [(f"forbidden_tools[{i}]", t) for i, t in enumerate(_listed(forbidden_tools))]
    for i, alternative in enumerate(_listed(alternatives)):
        tools = alternative.get("tools") if isinstance(alternative, dict) else None
        named += [(f"alternatives[{i}].tools[{j}]", t) for j, t in enumerate(_listed(tools))]
    problems = []
    for where, tool in named:
        name = tool.get("name") if isinstance(tool, dict) else tool
        if isinstance(name, str) and not_a_tool_name(name):
            problems.append(
                _("%(where)s: %(name)s is not a tool name (it holds a space or an invisible character)")
                % {"where": where, "name": repr(name)}
            )
    return problems


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _tool_list_problems(value: Any, where: str) -> list[str]:
    if not isinstance(value, list):
        return [_('%(where)s: a list of {"name": ..., "args": {...}} objects') % {"where": where}]
    problems = []
    for i, item in enumerate(value):
        if isinstance(item, str):
            continue
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
            problems.append(_("%(where)s[%(i)s]: needs a tool name") % {"where": where, "i": i})
        elif not isinstance(item.get("args", {}), dict):
            problems.append(
                _("%(where)s[%(i)s].args: an object (the arguments the call must contain)") % {"where": where, "i": i}
            )
        elif set(item) - {"name", "args"}:
            unknown = ", ".join(sorted(set(item) - {"name", "args"}))
            problems.append(
                _("%(where)s[%(i)s]: unknown keys %(keys)s (the keys are name, args)")
                % {"where": where, "i": i, "keys": unknown}
            )
        else:
            problems += _masked_argument_problems(item.get("args", {}), f"{where}[{i}]")
    return problems


def _masked_argument_problems(args: dict[str, Any], where: str) -> list[str]:
    """The expected arguments the audit record would not show as given: a case is scored on a run's recorded
    calls, whose arguments are masked (``audit.masking``: a ``session_id``, a token, a password, a value that reads
    as a credential), so such an argument's value could never match, and the case would fail on every run."""
    return [
        _(
            "%(where)s.args.%(name)s: the audit record, which the score is read from, masks this argument's value "
            "(***), so no call could match it; leave the argument out (the tool is still expected)"
        )
        % {"where": where, "name": name}
        for name, value in args.items()
        if not not_finite(value) and mask_value({name: value}) != {name: value}
    ]


def not_finite(value: Any) -> bool:
    """Whether a JSON value holds a number that is no JSON number (NaN, an infinity): no JSON column stores one.
    Walks without recursion (a value's depth is bounded where it was parsed, not here)."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return True
        if isinstance(item, dict):
            pending.extend(item.values())
        elif isinstance(item, list | tuple):
            pending.extend(item)
    return False


# What compiling a stored regex may raise: ``regex``'s own error (``bounded_regex``'s refusal of counted repeats
# that would unroll past its bound included), and what the module lets through for patterns it cannot hold.
REGEX_REFUSALS = (regex.error, ValueError, OverflowError, RecursionError, MemoryError)


def answer_regex(pattern: str) -> Any:
    """An answer check's regex compiled as the scoring searches with it: composed (NFC), by the ``regex`` module
    (\\p{Hangul}, variable-length lookbehind), under ``bounded_regex``'s bound. Raises one of ``REGEX_REFUSALS``
    for a pattern it refuses."""
    return bounded_regex(nfc(pattern))


def answer_regex_refusal(pattern: str) -> str | None:
    """Why ``answer_regex`` refuses ``pattern``, in the reader's language; None when it compiles. The editor and
    the import refuse such a pattern with this reason, and a failed check written at scoring time
    (``REGEX_REFUSED``) is told with it."""
    try:
        answer_regex(pattern)
    except REGEX_REFUSALS as exc:
        return regex_error_text(exc)
    return None


def _answer_check_problem(check: Any, i: int) -> str | None:
    """What is wrong with the ``i``-th answer check (counted from 0, as JSON lists are), or None. A regex that does
    not compile is named by itself, with why in the reader's language."""
    if not isinstance(check, dict) or len(check) != 1 or next(iter(check)) not in {"contains", "regex", "dont_know"}:
        return _("[%(i)s]: one of contains, regex, dont_know") % {"i": i}
    kind, wanted = next(iter(check.items()))
    if kind == "dont_know":
        return None if wanted is True else _("[%(i)s]: dont_know takes true (or leave the check out)") % {"i": i}
    if kind == "contains" and isinstance(wanted, int | float) and not isinstance(wanted, bool):
        return None  # a number the answer must contain as written ({"contains": 1001}), as sets held before
    if not isinstance(wanted, str) or not wanted.strip():
        return _("[%(i)s]: %(kind)s takes a text that is not empty") % {"i": i, "kind": kind}
    if kind == "regex" and (refusal := answer_regex_refusal(wanted)) is not None:
        # Named by itself: the admin's box skips its blank lines, so a count of regexes is no line number.
        return _("%(regex)s: %(problem)s") % {
            "regex": wanted,
            "problem": _("not a valid regular expression: %(error)s") % {"error": refusal},
        }
    return None


def case_problems(
    *,
    expected_tools: Any,
    forbidden_tools: Any,
    answer_checks: Any,
    alternatives: Any,
    context: Any = None,
    data: Any = None,
) -> dict[str, list[str]]:
    """What is wrong with a case's JSON fields, by field (empty when nothing is). ``context`` and ``data`` (None:
    not given) are refused as the import refuses them (``evals.documents.case_input_problems``, in its words): a
    case stored past that rule would stop its set's export from importing again."""
    problems: dict[str, list[str]] = case_input_problems(
        context={} if context is None else context, data=[] if data is None else data
    )
    if p := _tool_list_problems(expected_tools, "expected_tools"):
        problems["expected_tools"] = p
    if not isinstance(forbidden_tools, list) or not all(isinstance(n, str) and n for n in forbidden_tools):
        problems["forbidden_tools"] = [_('a list of tool names ("*": no tool at all)')]
    check_problems = []
    if not isinstance(answer_checks, list):
        check_problems.append(_('a list like [{"contains": "..."}, {"regex": "..."}, {"dont_know": true}]'))
    else:
        for i, check in enumerate(answer_checks):
            if problem := _answer_check_problem(check, i):
                check_problems.append(problem)
    if check_problems:
        problems["answer_checks"] = check_problems
    alt_problems = []
    if not isinstance(alternatives, list):
        alt_problems.append(_('a list like [{"tools": [...], "note": "..."}]'))
    else:
        for i, alternative in enumerate(alternatives):
            if not isinstance(alternative, dict) or "tools" not in alternative:
                alt_problems.append(_("[%(i)s]: needs tools") % {"i": i})
            else:
                alt_problems += _tool_list_problems(alternative["tools"], f"[{i}].tools")
    if alt_problems:
        problems["alternatives"] = alt_problems
    # Its contextId names the conversation its cases share, as a run's does: text (or null: none). A number was
    # stored as it came: the eval ordered such cases as one conversation, and each was scored without the turns
    # before it (the history compares the JSON number 7 with "7").
    if isinstance(context, dict) and (problem := context_id_problem(context, field="context.contextId")):
        problems.setdefault("context", []).append(problem)
    given = {
        "expected_tools": expected_tools,
        "forbidden_tools": forbidden_tools,
        "answer_checks": answer_checks,
        "alternatives": alternatives,
        "context": context,
        "data": data,
    }
    for name, value in given.items():
        if not_finite(value):
            problems.setdefault(name, []).append(_("NaN and Infinity are not numbers JSON holds: write a finite one"))
    return problems


def threshold_problems(thresholds: Any) -> list[str]:
    if not isinstance(thresholds, dict):
        return [_("an object of score → limit")]
    problems = []
    for name, limit in thresholds.items():
        if name not in RATE_METRICS + MAX_METRICS:
            problems.append(
                _("%(name)s: not a score; the scores are %(scores)s")
                % {"name": name, "scores": ", ".join(RATE_METRICS + MAX_METRICS)}
            )
        elif isinstance(limit, bool) or not isinstance(limit, int | float) or not math.isfinite(limit):
            problems.append(_("%(name)s: a number") % {"name": name})
        elif name in RATE_METRICS and not 0 <= limit <= 1:
            problems.append(_("%(name)s: between 0 and 1") % {"name": name})
        elif name in MAX_METRICS and limit < 0:
            problems.append(_("%(name)s: 0 or more") % {"name": name})
    return problems


def _tools(items: list[Any]) -> list[dict[str, Any]]:
    """A tool list's entries as ``{"name": ..., "args"?: ...}``, each name composed (NFC, as ``score_case`` compares
    the calls' names)."""
    entries = [{"name": i} if isinstance(i, str) else i for i in items]
    return [{**e, "name": nfc(e["name"])} if isinstance(e.get("name"), str) else e for e in entries]


def json_equal(one: Any, other: Any) -> bool:
    """Equal as JSON values, types compared strictly: a boolean is no number (``true`` is not ``1``, which Python's
    ``==`` takes it for), a numeric text no number; ``1`` and ``1.0`` are one JSON number."""
    if isinstance(one, bool) or isinstance(other, bool):
        return isinstance(one, bool) and isinstance(other, bool) and one == other
    if isinstance(one, int | float) or isinstance(other, int | float):
        return isinstance(one, int | float) and isinstance(other, int | float) and one == other
    if isinstance(one, dict) and isinstance(other, dict):
        return one.keys() == other.keys() and all(json_equal(v, other[k]) for k, v in one.items())
    if isinstance(one, list | tuple) and isinstance(other, list | tuple):
        return len(one) == len(other) and all(json_equal(a, b) for a, b in zip(one, other, strict=True))
    return type(one) is type(other) and bool(one == other)


def same_json(one: Any, other: Any) -> bool:
    """Whether two values are one JSON text, keys sorted: key order does not count, type does (``true`` is not
    ``1``, nor ``1.0`` ``1``, which Python's ``==`` calls equal, and the audit records as a change)."""
    return _json_text(one) == _json_text(other)


def _json_text(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


def _subset(expected: dict[str, Any], actual: dict[str, Any]) -> bool:
    """Whether ``actual`` (a call's arguments as the audit recorded them) holds every argument of ``expected``, as
    JSON values (``json_equal``), Korean text compared composed (NFC) on both sides: a case typed decomposed (NFD)
    matches a run's composed arguments.

    ``expected`` is compared masked, as the record's arguments were: an argument the record masks (a case stored
    before such arguments were refused, ``_masked_argument_problems``) is met by a call that gave it a value, of
    which the record keeps only that it was there. Compared unmasked, it failed every run as a wrong value."""
    actual = nfc_value(actual)
    shown = nfc_value(mask_value(expected))
    return all(k in actual and json_equal(v, actual[k]) for k, v in shown.items())


def _score_against(
    expected: list[dict[str, Any]], ordered: bool, calls: list[ToolCall], *, calls_free: bool = False
) -> dict[str, Any]:
    """The tool scores of ``calls`` against one expected list. ``calls_free``: nothing is expected and no call is a
    mistake (see ``score_case``), so calls cost neither precision nor the sequence.

    A call refused before it was sent (``refused_unsent``: for its arguments, or a tool not offered) was tried, not
    made: it meets no expected tool and no expected argument (the tool never ran with them), and still counts as
    tried, against precision and the sequence."""
    made = [c for c in calls if not refused_unsent(c)]
    tried_names, made_names = [c.name for c in calls], [c.name for c in made]
    want = [e["name"] for e in expected]
    tried_set, want_set = set(tried_names), set(want)
    if calls_free and not want_set:
        return {"precision": 1.0, "recall": 1.0, "sequence_match": True, "argument_match": None}
    hit = set(made_names) & want_set
    precision = len(hit) / len(tried_set) if tried_set else 1.0
    recall = len(hit) / len(want_set) if want_set else 1.0
    sequence = _in_sequence(tried_names, want, ordered) and _in_sequence(made_names, want, ordered)
    argument_match, arguments_in_order = _argument_match(expected, made, ordered)
    return {
        "precision": precision,
        "recall": recall,
        "sequence_match": sequence and arguments_in_order,
        "argument_match": argument_match,
    }


def _argument_match(expected: list[dict[str, Any]], made: list[ToolCall], ordered: bool) -> tuple[float | None, bool]:
    """The share of the expected entries with arguments that the calls met (None: no entry has any), and whether
    they were met in order.

    Unordered: an entry is met by any call of its tool with its arguments. Ordered: the k-th entry of a tool by the
    k-th call of that tool, so ``transfer{step: 1}`` then ``transfer{step: 2}`` is not met by the two calls made
    the other way round. When only another order would meet every entry (each by a call of its own), the
    arguments were all given and the order is what failed: the share is 1 and the calls are out of order
    (``tools:order``, never ``tools:args``)."""
    with_args = [i for i, e in enumerate(expected) if e.get("args")]
    if not with_args:
        return None, True
    if not ordered:
        met = [
            any(c.name == expected[i]["name"] and _subset(expected[i]["args"], c.args) for c in made) for i in with_args
        ]
        return sum(met) / len(with_args), True
    in_place = _met_in_place(expected, made)
    if all(in_place[i] for i in with_args):
        return 1.0, True
    if _met_one_to_one(expected, made):
        return 1.0, False
    return sum(1 for i in with_args if in_place[i]) / len(with_args), True


def _meets(entry: dict[str, Any], call: ToolCall) -> bool:
    return call.name == entry["name"] and _subset(entry.get("args") or {}, call.args)


def _met_in_place(expected: list[dict[str, Any]], made: list[ToolCall]) -> list[bool]:
    """For each expected entry, whether the call in its place meets it: the k-th entry of a tool is compared with
    the k-th call of that tool (calls of other tools are precision's and the sequence's to count)."""
    calls_of: dict[str, list[ToolCall]] = {}
    for call in made:
        calls_of.setdefault(call.name, []).append(call)
    seen: dict[str, int] = {}
    placed = []
    for entry in expected:
        k = seen.get(entry["name"], 0)
        seen[entry["name"]] = k + 1
        calls = calls_of.get(entry["name"], [])
        placed.append(k < len(calls) and _meets(entry, calls[k]))
    return placed


def _met_one_to_one(expected: list[dict[str, Any]], made: list[ToolCall]) -> bool:
    """Whether every expected entry can be given a call of its own that meets it, in whatever order (a bipartite
    matching, by augmenting paths: the lists are a case's few calls)."""
    meets = [[j for j, call in enumerate(made) if _meets(entry, call)] for entry in expected]
    owner: dict[int, int] = {}  # call → the entry it is given to

    def give(i: int, tried: set[int]) -> bool:
        for j in meets[i]:
            if j in tried:
                continue
            tried.add(j)
            if j not in owner or give(owner[j], tried):
                owner[j] = i
                return True
        return False

    return all(give(i, set()) for i in range(len(expected)))


# The gate's refusals of a tool the run could not call at that turn: a name no bound server has, a tool top-K
# selection did not offer, one withdrawn from the offer, one whose frozen contract no longer fits the tool's schema
# (``tool:out_of_date``: "nothing was sent"). Like an argument refusal, the tool never ran.
NOT_CALLABLE_REASONS = frozenset(
    {"tool:unknown", "tool:not_offered", "tool:withdrawn", "tool:too_many_calls", "tool:out_of_date"}
)


def refused_unsent(call: ToolCall) -> bool:
    """Whether the gate refused ``call`` before sending it, for its arguments (``args:type:warehouse``,
    ``args:json``) or because the tool was not one the run could call then (``NOT_CALLABLE_REASONS``): the tool
    never ran, with those arguments or any. (A write an eval blocked, ``eval:write_blocked``, passed every check
    of the call: it is the call the run attempted.)"""
    return not call.ok and (call.reason.startswith("args:") or call.reason in NOT_CALLABLE_REASONS)


def _in_sequence(called: list[str], want: list[str], ordered: bool) -> bool:
    """Whether ``called`` (tool names, in the order the run made the calls) is the expected sequence. Unordered:
    which tools, not how often. A tool called twice (a memo hit, a rule's call and the model's again) is not a wrong
    run; ordered cases compare the exact sequence, repeats included (and their arguments in order:
    ``_argument_match``)."""
    return called == want if ordered else set(called) == set(want)


def answer_check_failures(checks: list[dict[str, Any]], answer: str) -> list[str]:
    """The checks the answer fails, each named as it was given. Text is compared composed (NFC) on both sides, and
    for ``contains`` and ``dont_know`` with typographic apostrophes read as ``'`` (``APOSTROPHES``); ``contains``
    with a space the check puts between two Hangul syllables optional (``_contains_pattern``: "클라우드 운영팀"
    is met by "클라우드운영팀"), ``dont_know`` with every space ignored (``says_it_does_not_know``); a regex sees the answer
    as written.

    A regex check whose pattern ``answer_regex`` refuses (stored before the editor bounded patterns, or written
    around it: a data migration, a direct save) fails as ``REGEX_REFUSED`` + the pattern, never compiled
    unbounded: compiling one such pattern took gigabytes, and one that does not compile raised out of the
    scoring, so its eval run never ended."""
    failed = []
    answer = nfc(answer)
    lowered = answer.lower().translate(APOSTROPHES)
    for check in checks:
        if "contains" in check:
            wanted = nfc(str(check["contains"])).lower().translate(APOSTROPHES)
            if _contains_pattern(wanted).search(lowered) is None:
                failed.append(f"contains:{check['contains']}")
        elif "regex" in check:
            try:
                pattern = answer_regex(str(check["regex"]))
            except REGEX_REFUSALS:
                failed.append(f"{REGEX_REFUSED}{check['regex']}")
                continue
            if not _answer_matches(pattern, answer):
                failed.append(f"regex:{check['regex']}")
        elif check.get("dont_know") and not says_it_does_not_know(lowered):
            failed.append("dont_know")
    return failed


def _syllable(character: str) -> bool:
    """A Hangul syllable (가–힣): between two, Korean spacing varies ("클라우드 운영팀", "클라우드운영팀")."""
    return "\uac00" <= character <= "\ud7a3"


@functools.lru_cache(maxsize=256)
def _contains_pattern(wanted: str) -> regex.Pattern[str]:
    """A ``contains`` check's text as a pattern: as written, but a space it puts between two Hangul syllables is
    optional in the answer ("클라우드 운영팀" is met by "클라우드운영팀"), and any run of spaces is any other.
    Never a space the check does not have: "정상" is not met by "일정 상세" (it was, the answer's spaces taken out)."""
    wanted = wanted.strip()
    parts: list[str] = []
    at = 0
    for gap in regex.finditer(r"\s+", wanted):
        parts.append(regex.escape(wanted[at : gap.start()]))
        between = _syllable(wanted[gap.start() - 1]) and _syllable(wanted[gap.end()])
        parts.append(r"\s*" if between else r"\s+")
        at = gap.end()
    parts.append(regex.escape(wanted[at:]))
    return regex.compile("".join(parts))


def _stated(compact: str, end: int) -> bool:
    """Whether a phrase that ends at ``end`` of ``compact`` states that the answer is not known: no condition
    follows it (``CONDITIONAL_ENDINGS``: "정보가 없으면", "정보가 없어도"), nor a noun it describes
    (``STATEMENT_AFTER_ADNOMINAL``: "알 수 없는 오류"), nor a clause it is the reason of (``CLAUSE_LINKS``: "정보가
    없으므로 일반 기준으로 답했습니다") unless that clause apologises or sends the asker on (``LINKED_REFUSAL``)."""
    rest = compact[end:]
    if rest.startswith(CONDITIONAL_ENDINGS):
        return False
    if rest[:1] in {"는", "은"} and len(rest) > 1 and _syllable(rest[1]) and rest[1] not in STATEMENT_AFTER_ADNOMINAL:
        return False
    sentence = rest[: min((rest.find(mark) for mark in FULL_STOPS if mark in rest), default=len(rest))]
    if any(link in sentence[:CLAUSE_LINK_SPAN] for link in CLAUSE_LINKS):
        return any(word in sentence for word in LINKED_REFUSAL)
    return True


def _refusals(compact: str, *, more_of: bool = False) -> list[int]:
    """Where in ``compact`` a statement that the answer is not known begins (``says_it_does_not_know``); with
    ``more_of``, one that says only that nothing more is known ("그 밖의 정보는 없습니다") as well."""
    found = []
    for phrase in DONT_KNOW_PHRASES:
        wanted = "".join(phrase.split())
        start = compact.find(wanted)
        while start != -1:
            if _stated(compact, start + len(wanted)):
                found.append(start)
            start = compact.find(wanted, start + 1)
    found += [m.start() for m in NOT_FOUND_IN.finditer(compact)]
    for noun in NOUN_LACKING.finditer(compact):
        if not more_of and compact[: noun.start()].endswith(MORE_OF):
            continue
        span = compact[noun.end() : noun.end() + NOUN_LACKING_SPAN + 1]
        cut = min((span.find(mark) for mark in SENTENCE_ENDS if mark in span), default=len(span))
        for at in range(cut):
            for lacking in LACKING:
                end = noun.end() + at + len(lacking)
                fits = span.startswith(lacking, at) and at + len(lacking) <= cut
                if fits and compact[end : end + 1] != "이" and _stated(compact, end):
                    found.append(noun.start())
    return found


def _states_fact(sentence: str) -> bool:
    """Whether a sentence (or a clause a claim ends before a comma) states a fact: it ends as a statement does
    (``CLAIM_ENDINGS``: "1년입니다", "쓸 수 있습니다", "가능합니다"; a digit alone is none: "2024년 개정판을
    검색했습니다"), and is neither a courtesy (``COURTESIES``: "죄송합니다"), nor sends the asker on (``REDIRECTS``: "인사팀에
    문의하시면 확인 가능합니다"), nor says where it looked (``SEARCHED``: "검색 결과 3건을 확인했습니다"), nor itself
    says it does not know or knows no more ("다른 정보도 없습니다")."""
    if not sentence or any(word in sentence for word in COURTESIES + REDIRECTS + SEARCHED):
        return False
    if _refusals(sentence, more_of=True):
        return False
    return sentence.rstrip(")\"'」』").endswith(CLAIM_ENDINGS)


def _fact_around(compact: str, start: int) -> bool:
    """Whether a sentence of ``compact`` before or after the one in which ``start`` stands states a fact
    (``_states_fact``); a comma a claim ends before ends a sentence here (``CLAUSE_ENDS``)."""
    ends = [m.start() for m in CLAUSE_ENDS.finditer(compact)]
    begins = max((at for at in ends if at < start), default=-1)
    stops = min((at for at in ends if at >= start), default=len(compact))
    others = (compact[: max(begins, 0)], compact[stops + 1 :])
    return any(_states_fact(sentence) for part in others for sentence in CLAUSE_ENDS.split(part))


def says_it_does_not_know(lowered: str) -> bool:
    """Whether an answer (NFC, lowercased, apostrophes as ``'``) says it does not know, every space taken out
    (Korean spacing varies: "찾을수 없습니다"; a line break ends a sentence): a ``DONT_KNOW_PHRASES`` phrase in it, a
    ``NOUN_LACKING`` noun a few words before "없" ("정보는 제공된 문서에 없습니다"; not one of more of it, ``MORE_OF``:
    "그 밖의 정보는 없습니다", "그 외 정보는 없습니다"), or where it looked and did not find it (``NOT_FOUND_IN``:
    "관련 문서에서 확인되지 않습니다"), that states it (``_stated``: "별도 정보가 없으면 연차는 15일입니다", "알 수
    없는 오류가 발생했지만 ...", "정보가 없으므로 일반 기준으로 답했습니다" are confident answers).

    And no other sentence, before or after the one that says so, states a fact (``_fact_around``, ``_states_fact``):
    one that ends as a claim does ("1년입니다", "사용할 수 있습니다"), a comma after such an ending ending it too.
    "육아휴직은 최대 1년까지 쓸 수 있습니다. 다른 규정은 없습니다", "정보가 없습니다. 하지만 연차는 15일입니다"
    and "연차는 15일입니다, 그 외 정보는 없습니다" answer, and what they say they do not know is only the rest (seed
    001's ``no_answer`` asks that nothing is made up). A digit alone states nothing, nor does a sentence that says
    where it looked ("사내 규정집 2024년 개정판을 검색했습니다. 해당 내용은 문서에 없습니다" does not know), a
    courtesy ("죄송합니다") or one that sends the asker on ("인사팀에 문의해 주세요")."""
    compact = "\n".join("".join(line.split()) for line in lowered.splitlines())
    return any(not _fact_around(compact, start) for start in _refusals(compact))


def score_case(spec: CaseSpec, *, calls: list[ToolCall], answer: str, run_succeeded: bool) -> CaseScore:
    """Score one case. The expected tools and each alternative are tried; the best of them counts (an
    alternative that fits fully makes the case pass as well as the expected list would).

    No tool expected is not no tool allowed (seed 001's ``expected_source``): a case with no expected tools (a
    document path, a RAG question; ``null``, an answer that must say it does not know) is not failed for looking
    something up, and its calls score precision and recall 1. Only ``forbidden_tools`` fails a call: ``"*"``
    (``"none"``) every call, and such a case's calls still count against its precision; a ``no_tool`` case that
    names no forbidden tool forbids every tool (``CaseSpec.forbidden``). An alternative with no tools means
    "calling nothing is also right", so it fits a run that called nothing only.

    Tool names are compared composed (NFC), as their arguments are: a server may list ``직원검색`` decomposed (NFD,
    written on macOS), which its calls are recorded under, while a case stores the name composed."""
    calls = [replace(c, name=nfc(c.name)) for c in calls]
    forbidden = {nfc(name) for name in spec.forbidden()}
    violations = len(calls) if NO_TOOL in forbidden else sum(1 for c in calls if c.name in forbidden)
    candidates = [("expected", _tools(spec.expected_tools), spec.ordered, NO_TOOL not in forbidden)] + [
        (
            str(alt.get("note") or f"alternative {i + 1}"),
            _tools(alt["tools"]),
            bool(alt.get("ordered", spec.ordered)),
            False,
        )
        for i, alt in enumerate(spec.alternatives)
    ]
    best: tuple[tuple[float, ...], str, dict[str, Any]] | None = None
    for note, expected, ordered, calls_free in candidates:
        s = _score_against(expected, ordered, calls, calls_free=calls_free)
        rank = (
            float(s["sequence_match"]),
            s["precision"] + s["recall"],
            s["argument_match"] if s["argument_match"] is not None else 1.0,
        )
        if best is None or rank > best[0]:
            best = (rank, note, s)
    assert best is not None
    _rank, matched, s = best
    failed = answer_check_failures(spec.answer_checks, answer)
    answer_ok = None if not spec.answer_checks else not failed
    failed_checks = list(failed)
    if not run_succeeded:
        failed_checks.append("run:failed")
    if violations:
        failed_checks.append("tools:forbidden")
    if s["precision"] < 1 or s["recall"] < 1:
        failed_checks.append("tools:mismatch")
    elif not s["sequence_match"]:
        failed_checks.append("tools:order")
    if s["argument_match"] is not None and s["argument_match"] < 1:
        failed_checks.append("tools:args")
    return CaseScore(
        passed=not failed_checks,
        precision=round(s["precision"], 4),
        recall=round(s["recall"], 4),
        sequence_match=bool(s["sequence_match"]),
        forbidden_violations=violations,
        argument_match=None if s["argument_match"] is None else round(s["argument_match"], 4),
        answer_checks=answer_ok,
        run_succeeded=run_succeeded,
        matched=matched,
        failed_checks=failed_checks,
    )


def in_call_order(call_ids: list[str], turns: list[list[str]]) -> list[int]:
    """The positions of a run's audited calls (``call_ids``, in the order their audit events were written) put in
    the order the run made them. The events of a parallel batch are written as its calls finish, so a slow first
    call's comes after a quick second one's; ``turns`` (each model turn's call ids, in the order the model asked
    them, turn after turn) puts them back: a stretch of events of one turn's calls is ordered by their place in the
    turn. The events of one call (its memo hit or refusal, a fallback the gate called for it) keep the order they
    were written in; an event of no model turn (a rule's call, a flow's) keeps its place and ends the stretch.
    Turns are matched in order, so a call id a model uses again in a later turn is placed in that turn."""
    order: list[int] = []
    stretch: list[tuple[int, int]] = []  # (place in its turn, position in call_ids)
    stretch_turn: int | None = None
    earliest = 0  # the turn of the last stretch: a later call is never of an earlier turn

    def close() -> None:
        order.extend(position for _place, position in sorted(stretch, key=lambda item: item[0]))  # stable
        stretch.clear()

    for position, call_id in enumerate(call_ids):
        turn = next((t for t in range(earliest, len(turns)) if call_id and call_id in turns[t]), None)
        if turn is None:
            close()
            stretch_turn = None
            order.append(position)
            continue
        if turn != stretch_turn:
            close()
            stretch_turn = earliest = turn
        stretch.append((turns[turn].index(call_id), position))
    close()
    return order


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..1); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def summarize(scores: list[dict[str, Any]]) -> dict[str, Any]:
    """The set's scores from its cases' (``CaseScore.as_dict()``): rates are means over the cases they apply to."""
    n = len(scores)
    if not n:
        return {"cases": 0}

    def mean(values: list[float]) -> float | None:
        return round(statistics.fmean(values), 4) if values else None

    latencies = [s["latency_ms"] for s in scores if s.get("latency_ms") is not None]
    args = [s["argument_match"] for s in scores if s.get("argument_match") is not None]
    answers = [1.0 if s["answer_checks"] else 0.0 for s in scores if s.get("answer_checks") is not None]
    return {
        "cases": n,
        "passed": sum(1 for s in scores if s["passed"]),
        "pass_rate": mean([1.0 if s["passed"] else 0.0 for s in scores]),
        "precision": mean([s["precision"] for s in scores]),
        "recall": mean([s["recall"] for s in scores]),
        "sequence_match": mean([1.0 if s["sequence_match"] else 0.0 for s in scores]),
        "forbidden_violations": sum(s["forbidden_violations"] for s in scores),
        "argument_match": mean(args),
        "answer_checks": mean(answers),
        "latency_p50_ms": percentile(latencies, 0.50),
        "latency_p95_ms": percentile(latencies, 0.95),
        "tokens": sum(s.get("tokens", 0) for s in scores),
        "model_calls": sum(s.get("model_calls", 0) for s in scores),
        "model_calls_saved": sum(s.get("model_calls_saved", 0) for s in scores),
    }


# A threshold whose score the eval run did not measure (``answer_checks`` of cases with no answer check,
# ``latency_p95_ms`` of cases none of which ran): ``"answer_checks not_judged 0.9"``.
NOT_JUDGED = "not_judged"


def threshold_failures(summary: dict[str, Any], thresholds: dict[str, Any]) -> list[str]:
    """The thresholds the summary does not meet, as ``"recall 0.5 < 0.9"``. A threshold whose score is None (not
    measured: no case it applies to) is not judged and so not met, as ``"answer_checks not_judged 0.9"``
    (``NOT_JUDGED``): passed over, a gate on a score nothing measured passed every run."""
    failed = []
    for name, limit in thresholds.items():
        value = summary.get(name)
        if value is None:
            failed.append(f"{name} {NOT_JUDGED} {limit}")
            continue
        if name in MAX_METRICS and value > limit:
            failed.append(f"{name} {value} > {limit}")
        elif name in RATE_METRICS and value < limit:
            failed.append(f"{name} {value} < {limit}")
    return failed


ANSWER_REGEX_TIMEOUT_S = 0.5


def _answer_matches(pattern: Any, answer: str) -> bool:
    """Whether the compiled ``pattern`` (``answer_regex``) finds something in ``answer``, searched for at most
    ``ANSWER_REGEX_TIMEOUT_S`` (as a rule's regex is searched, ``agents.deterministic.regex_search``): a pattern
    that backtracks catastrophically on a long answer fails its check instead of holding the eval's scoring."""
    try:
        return pattern.search(answer, timeout=ANSWER_REGEX_TIMEOUT_S) is not None
    except TimeoutError:
        return False
