"""Services: every write to the evals models goes through here.

Eval sets and cases are configuration: created, changed and deleted through ``audited_save``/``audited_delete``
(one audit event per change, in the same transaction). An eval run submits each case as an ordinary run
(``agents.services.run_create`` with ``purpose="eval"``: Celery, the gate, the audit under source ``eval``) and
scores each case once its run has finished (``eval_run_refresh``; every worker calls it in the background,
``eval_runs_refresh_open``, so an eval started from the admin or the API is scored and finished even if nobody
looks at it, and a case whose run never finishes is timed out).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from typing import Annotated, Any

from django.conf import settings
from django.core.exceptions import NON_FIELD_ERRORS
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone
from django.utils.translation import gettext as _
from pydantic import Field, ValidatorFunctionWrapHandler, WrapValidator
from pydantic import ValidationError as PydanticValidationError

from agent_platform.errors import ApplicationError
from agent_platform.text import nfc, nfc_value
from agents.budgets import budget_refused_for_runs_in_flight
from agents.dispatch import repaired_alone
from agents.models import Agent, AgentVersion, Approval, Run, RunEvent
from agents.services import (
    CANCELLABLE,
    agent_version_publish,
    run_cancel,
    run_create,
    run_submission_parts,
    secrets_readable_or_refused,
)
from agents.versions import content_digest, version_content
from audit.change_guard import config_write_lock
from audit.changes import audited_delete, audited_save
from audit.models import AuditEvent, AuditPendingEvent
from audit.services import audit_chain_catch_up, audit_event_record
from evals.case_editor import alternative_tool_names, case_tool_names
from evals.documents import CaseInputs, StrictDocument, pydantic_problem_list, pydantic_problems
from evals.models import CASE_ORDER_MAX, CASE_ORDER_MIN, EvalCase, EvalCaseResult, EvalRun, EvalSet, case_snapshot
from evals.notation import NO_TOOL, ExpectedSource, parse_expected_source
from evals.scoring import (
    NOT_SUBMITTED,
    CaseSpec,
    ToolCall,
    in_call_order,
    json_equal,
    same_json,
    score_case,
    summarize,
    threshold_failures,
    tool_case_problem,
    tool_name_problems,
    written_tool_case_problem,
)
from mcpregistry.models import McpServer, McpTool

# ---- eval sets and cases (configuration) -------------------------------------------------------------------


def eval_set_create(*, actor: Any, via: str, data: Mapping[str, Any]) -> EvalSet:
    return audited_save(EvalSet(), actor=actor, via=via, data=data)


def eval_set_update(*, eval_set: EvalSet, actor: Any, via: str, data: Mapping[str, Any] | None = None) -> EvalSet:
    return audited_save(eval_set, actor=actor, via=via, data=data)


def eval_set_delete(*, eval_set: EvalSet, actor: Any, via: str) -> None:
    """Delete a set with its cases (refused while eval runs of it exist: they are the record of what was measured)."""
    audited_delete(eval_set, actor=actor, via=via)


# A case's fields that hold text: stored composed (NFC), as a run's query, context and data are.
CASE_TEXT_FIELDS = (
    "key",
    "case_type",
    "query",
    "context",
    "data",
    "expected_tools",
    "forbidden_tools",
    "answer_checks",
    "alternatives",
    "note",
)


def _composed(case: EvalCase, data: Mapping[str, Any] | None) -> dict[str, Any]:
    """``data`` with every text of the case's text fields composed (NFC), and so the fields ``case`` already
    carries (an admin form's instance): Korean typed decomposed (NFD, macOS) would never match a run's query or
    arguments, which are stored composed."""
    values = dict(data or {})
    for name in CASE_TEXT_FIELDS:
        if name in values:
            values[name] = nfc_value(values[name])
        else:
            setattr(case, name, nfc_value(getattr(case, name)))
    return values


def eval_case_create(*, actor: Any, via: str, data: Mapping[str, Any]) -> EvalCase:
    case = EvalCase()
    return audited_save(case, actor=actor, via=via, data=_composed(case, data))


def eval_case_update(*, case: EvalCase, actor: Any, via: str, data: Mapping[str, Any] | None = None) -> EvalCase:
    return audited_save(case, actor=actor, via=via, data=_composed(case, data))


def eval_case_delete(*, case: EvalCase, actor: Any, via: str) -> None:
    audited_delete(case, actor=actor, via=via)


# ---- the document form of a set (import_config's "eval_sets", the API's POST) --------------------------------


class AlternativeSpec(StrictDocument):
    """One of a case's alternatives: the one definition of its keys and their types, for a document and for the
    admin's alternatives box alike (``alternatives_problems``). ``ordered`` absent: as the case's own."""

    tools: list[str | dict[str, Any]]
    note: str = ""
    ordered: bool | None = None


class CaseAlternatives(StrictDocument):
    """A case's ``alternatives`` alone, under the key a document gives them (its problems are named as a document's
    are: ``alternatives.0.ordered``)."""

    alternatives: list[AlternativeSpec]


def alternatives_problems(value: Any) -> list[str]:
    """What ``eval_set_apply`` refuses in a case's ``alternatives`` (a key it does not know, ``"ordered": "false"``),
    each as it names it (``alternatives.0.ordered: must be true or false``), in the active language; empty when
    nothing. The admin's alternatives box is checked with this, so it stores nothing an import would refuse. A key
    it does not know is named with the keys it does (``alternatives.0.orderd: not a known field (the keys are tools,
    note, ordered)``), as an expected tool's is."""
    try:
        CaseAlternatives.model_validate({"alternatives": value})
    except PydanticValidationError as exc:
        keys = ", ".join(AlternativeSpec.model_fields)
        return [
            _("%(problem)s (the keys are %(keys)s)") % {"problem": problem, "keys": keys}
            if error["type"] == "extra_forbidden" and len(error["loc"]) == 3
            else problem
            for error, problem in zip(exc.errors(), pydantic_problem_list(exc), strict=True)
        ]
    return []


class CaseDocument(CaseInputs):
    """A case as a document gives it: either ``expected_source`` in any of the seed's four notations, or the
    explicit ``expected_tools`` / ``forbidden_tools`` / ``answer_checks``. Its ``context`` and ``data`` are
    ``CaseInputs``', the rule a case is checked by wherever it is written (``evals.scoring.case_problems``)."""

    key: str | None = None
    order: int | None = Field(default=None, ge=CASE_ORDER_MIN, le=CASE_ORDER_MAX)  # absent: after the case before it
    query: str = Field(min_length=1)
    type: str = "single_tool"
    expected_source: Any = None
    expected_tools: list[str | dict[str, Any]] | None = None
    ordered: bool = False
    forbidden_tools: list[str] | None = None
    answer_checks: list[dict[str, Any]] | None = None
    alternatives: list[AlternativeSpec] = Field(default_factory=list)
    note: str = ""


def _number_as_given(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """A JSON number as given: checked as a number (strict: no boolean, no numeric text), a whole number kept whole
    (read as a float, 5000 was stored as 5000.0 by every import, with no audit event: it compares equal)."""
    number = handler(value)
    return value if isinstance(value, int) else number


class EvalSetDocument(StrictDocument):
    name: str = Field(min_length=1, max_length=100)
    description: str = ""
    agent: str | None = None
    sandbox_servers: list[str] = Field(default_factory=list)
    thresholds: dict[str, Annotated[float, WrapValidator(_number_as_given)]] = Field(default_factory=dict)
    cases: list[dict[str, Any]] = Field(default_factory=list)


# The type of a case whose ``expected_source`` is a document path and that gives none (the seed types such rows
# ``fact`` or ``paraphrase``, by how the question is worded): a RAG case, which expects no tool.
SOURCE_CASE_TYPE = "rag"


def implied_case_type(expected_source: Any, source: ExpectedSource) -> str:
    """The type the seed's notation of ``expected_source`` (read as ``source``) implies, for an entry that gives
    none: ``null`` a ``no_answer`` case, ``"none"`` a ``no_tool`` one, a path a RAG case (``SOURCE_CASE_TYPE``),
    one tool name a ``single_tool`` case and several a ``multi_tool`` one. Stored as ``single_tool`` with no tool
    expected, such a case was exported so, and that export was refused where the case was not stored yet."""
    if expected_source is None:
        return "no_answer"
    if source.document:
        return SOURCE_CASE_TYPE
    if not source.expected_tools:
        return "no_tool"
    return "multi_tool" if len(source.expected_tools) > 1 else "single_tool"


def case_fields(entry: Mapping[str, Any], index: int, *, previous_order: int | None = None) -> dict[str, Any]:
    """A case's model fields from its document entry. The seed writes ``question``; ``query`` is accepted too.
    An entry with no ``order`` comes after the case before it (``previous_order``, that case's order; None: it is
    the first): 10 more, or the largest order a case takes. Raises ValueError naming what is wrong."""
    raw = dict(entry)
    if "question" in raw and "query" not in raw:
        raw["query"] = raw.pop("question")
    has_source = "expected_source" in raw
    typed = "type" in raw
    try:
        doc = CaseDocument.model_validate(raw)
    except PydanticValidationError as exc:
        raise ValueError(pydantic_problems(exc)) from None
    if not doc.query.strip():
        raise ValueError(_("query: must not be empty"))
    expected: list[dict[str, Any]] = []
    forbidden: list[str] = []
    checks: list[dict[str, Any]] = []
    note = doc.note
    case_type = doc.type
    if has_source:
        source = parse_expected_source(doc.expected_source, case_type=doc.type)
        expected, forbidden, checks = source.expected_tools, source.forbidden_tools, source.answer_checks
        if source.document:
            note = (note + "\n" if note else "") + f"expected_source: {source.document}"
        if not typed:
            case_type = implied_case_type(doc.expected_source, source)
    if doc.expected_tools is not None:
        expected = [{"name": t} if isinstance(t, str) else t for t in doc.expected_tools]
    if doc.forbidden_tools is not None:
        forbidden = doc.forbidden_tools
    if doc.answer_checks is not None:
        checks = doc.answer_checks
    alternatives = [a.model_dump() for a in doc.alternatives]
    if names := tool_name_problems(expected_tools=expected, forbidden_tools=forbidden, alternatives=alternatives):
        raise ValueError("; ".join(names))
    fields = {
        "key": doc.key or f"case-{index + 1:03d}",
        "order": doc.order if doc.order is not None else min((previous_order or 0) + 10, CASE_ORDER_MAX),
        "case_type": case_type,
        "query": doc.query,
        "context": doc.context,
        "data": doc.data,
        "expected_tools": expected,
        "ordered": doc.ordered,
        "forbidden_tools": forbidden,
        "answer_checks": checks,
        "alternatives": [
            {k: v for k, v in a.model_dump().items() if v is not None and v != ""} for a in doc.alternatives
        ],
        "note": note,
    }
    return {name: nfc_value(value) if name in CASE_TEXT_FIELDS else value for name, value in fields.items()}


@dataclass
class SetImport:
    eval_set: EvalSet
    created: bool
    changed: list[str] = field(default_factory=list)


def eval_set_apply(*, document: Mapping[str, Any], actor: Any, via: str, replace: bool = False) -> SetImport:
    """Create or update a set and its cases from a document (idempotent: cases by ``key``; cases no longer in the
    document are deleted). Raises ApplicationError (400) naming every offending entry; then nothing changed.

    A key left out of an existing set's document keeps what the set holds, as ``import_config``'s other sections
    do (``cases`` left out keeps every case, ``"cases": []`` removes them all; ``"thresholds": {}`` clears them):
    an entry giving only a name and cases cleared the set's agent, description and thresholds, so that
    ``run_eval`` no longer failed a deploy. With ``replace`` (the API's ``POST``, which creates or replaces the
    set) a key left out takes its default, as it does for a new set."""
    from django.core.exceptions import ValidationError

    try:
        doc = EvalSetDocument.model_validate(dict(document))
    except PydanticValidationError as exc:
        raise ApplicationError(
            _("The eval set is not valid: %(problems)s") % {"problems": pydantic_problems(exc)},
            code="invalid_eval_set",
        ) from None
    stored = EvalSet.objects.filter(name=doc.name).first()
    given = set(EvalSetDocument.model_fields) if stored is None or replace else doc.model_fields_set
    problems: list[str] = []
    cases: list[dict[str, Any]] = []
    previous_order: int | None = None
    # A case typed single_tool or multi_tool that expects no tool passed whatever its run called: refused as the
    # admin refuses it, unless it is stored so already (an export imported again). A case given no type is
    # single_tool by default, and one that expects no tool is taken as sets have always given it.
    stored_cases = {c.key: c for c in EvalCase.objects.filter(eval_set__name=doc.name)}
    for i, entry in enumerate(doc.cases):
        try:
            cases.append(case_fields(entry, i, previous_order=previous_order))
            previous_order = cases[-1]["order"]
        except ValueError as exc:
            problems.append(f"cases[{i}]: {exc}")
            continue
        stored_case, fields = stored_cases.get(cases[-1]["key"]), cases[-1]
        if "type" in entry and (
            problem := written_tool_case_problem(
                fields["case_type"],
                fields["expected_tools"],
                stored_type=stored_case.case_type if stored_case is not None else None,
                stored_tools=stored_case.expected_tools if stored_case is not None else None,
            )
        ):
            problems.append(f"cases[{i}].expected_tools: {problem}")
    keys = [c["key"] for c in cases]
    if len(set(keys)) != len(keys):
        problems.append(_("cases: two cases with the same key"))
    agent = None
    if doc.agent and "agent" in given:
        agent = Agent.objects.filter(slug=doc.agent).first()
        if agent is None:
            problems.append(_("agent: unknown agent '%(slug)s'") % {"slug": doc.agent})
    # A sandbox server must exist (as the admin's choices are the servers); one the set holds already stays.
    held = stored.sandbox_servers if stored is not None else []
    known = set(McpServer.objects.filter(mcp_id__in=doc.sandbox_servers).values_list("mcp_id", flat=True))
    if unknown := [s for s in doc.sandbox_servers if s not in known and s not in held]:
        problems.append(_("sandbox_servers: no MCP server %(ids)s") % {"ids": ", ".join(unknown)})
    listed_agent = agent if "agent" in given else (stored.agent if stored is not None else None)
    problems += unknown_tool_problems(cases=cases, stored_cases=stored_cases, agent=listed_agent)
    if problems:
        raise ApplicationError(
            _("The eval set is not valid: %(problems)s") % {"problems": "; ".join(problems)}, code="invalid_eval_set"
        )
    result: SetImport
    try:
        with transaction.atomic():
            eval_set = EvalSet.objects.filter(name=doc.name).first()
            created = eval_set is None
            values = {
                name: value
                for name, value in (
                    ("name", doc.name),
                    ("description", nfc(doc.description)),
                    ("agent", agent),
                    ("sandbox_servers", doc.sandbox_servers),
                    ("thresholds", doc.thresholds),
                )
                if name in given
            }
            set_changed = False
            if eval_set is None:
                eval_set = eval_set_create(actor=actor, via=via, data=values)
            else:
                # Compared as JSON values (a boolean is no number; 5000 and 5000.0 are one number) and composed (a
                # description stored decomposed is the document's composed one): a set that differs in nothing else
                # is not written (a value written anyway changed its JSON text with no audit event).
                before = {k: getattr(eval_set, k) for k in values}
                set_changed = not all(
                    json_equal(before[k], values[k]) or json_equal(nfc_value(before[k]), values[k]) for k in values
                )
                if set_changed:
                    eval_set_update(eval_set=eval_set, actor=actor, via=via, data=values)
            result = SetImport(eval_set=eval_set, created=created, changed=["(set)"] if set_changed else [])
            existing = {c.key: c for c in eval_set.cases.all()}
            refused: list[str] = []
            for i, fields in enumerate(cases):
                case = existing.pop(fields["key"], None)
                try:
                    with transaction.atomic():  # a refused case leaves the others to be checked too
                        if case is None:
                            eval_case_create(actor=actor, via=via, data={"eval_set": eval_set, **fields})
                            result.changed.append(fields["key"])
                        else:
                            # As JSON, keys sorted: {"n": 1} -> {"n": true} (or 1.0) is a change (the audit
                            # records it), which Python's == calls none.
                            before = {k: getattr(case, k) for k in fields}
                            eval_case_update(case=case, actor=actor, via=via, data=fields)
                            if not all(same_json(before[k], fields[k]) for k in fields):
                                result.changed.append(fields["key"])
                except ValidationError as exc:
                    refused.append(_case_refusal(i, exc))
            if refused:
                raise ApplicationError(
                    _("The eval set is not valid: %(problems)s") % {"problems": "; ".join(refused)},
                    code="invalid_eval_set",
                )
            # A case the document's ``cases`` leave out is deleted; ``cases`` left out keeps every case.
            for case in existing.values() if "cases" in given else []:
                if case.results.exists():
                    raise ApplicationError(
                        _("Case '%(key)s' has results in eval runs and cannot be removed from the set.")
                        % {"key": case.key},
                        code="invalid_eval_set",
                        status=409,
                    )
                eval_case_delete(case=case, actor=actor, via=via)
                result.changed.append(case.key)
    except ValidationError as exc:
        raise ApplicationError(
            _("The eval set is not valid: %(problems)s")
            % {"problems": "; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items())},
            code="invalid_eval_set",
        ) from None
    return result


def case_tool_names_by_field(*, expected_tools: Any, forbidden_tools: Any, alternatives: Any) -> dict[str, list[str]]:
    """The tool names a case names, by the field that names them (``"*"``, no tool at all, is no name)."""
    return {
        "expected_tools": case_tool_names(expected_tools),
        "forbidden_tools": [n for n in case_tool_names(forbidden_tools) if n != NO_TOOL],
        "alternatives": alternative_tool_names(alternatives),
    }


def _held_tool_names(case: EvalCase) -> set[str]:
    named = case_tool_names_by_field(
        expected_tools=case.expected_tools, forbidden_tools=case.forbidden_tools, alternatives=case.alternatives
    )
    return {name for names in named.values() for name in names}


def offered_tool_names(agent: Agent | None) -> list[str]:
    """The tool names a refusal of an unknown name lists: the agent's servers' tools, or with no agent every
    enabled tool of an enabled server (as the admin's pages list them)."""
    tools = (
        McpTool.objects.filter(server__agents=agent)
        if agent is not None
        else McpTool.objects.filter(enabled=True, server__enabled=True)
    )
    return sorted(set(tools.values_list("name", flat=True)))


def unknown_tool_problems(
    *, cases: list[dict[str, Any]], stored_cases: Mapping[str, EvalCase], agent: Agent | None
) -> list[str]:
    """The tool names of a document's cases that no server has, each case's named by its field, as the admin's case
    form refuses them: a typo (``search_employe``) expected a tool no run can call, and the case failed on every
    run. Compared composed (NFC), as the run's calls are. A name the stored case of that key already holds passes,
    so a tool removed since never makes a set's export unreadable: it imports again as it is.

    Before any server's tools were discovered there is no list to check against (a fresh installation importing
    its configuration before discovery; ``import_config`` takes a tool named before its server's discovery so too):
    the names are taken as given. A tool the same import registers is known."""
    if not McpTool.objects.filter(discovered_at__isnull=False).exists():
        return []
    known = {nfc(name) for name in McpTool.objects.values_list("name", flat=True)}
    problems: list[str] = []
    listed: list[str] | None = None
    for i, fields in enumerate(cases):
        stored = stored_cases.get(fields["key"])
        held = _held_tool_names(stored) if stored is not None else set()
        named = case_tool_names_by_field(
            expected_tools=fields["expected_tools"],
            forbidden_tools=fields["forbidden_tools"],
            alternatives=fields["alternatives"],
        )
        for name, names in named.items():
            unknown = [n for n in dict.fromkeys(names) if nfc(n) not in known and n not in held]
            if not unknown:
                continue
            listed = offered_tool_names(agent) if listed is None else listed
            problems.append(
                f"cases[{i}].{name}: "
                + _("%(names)s: no server has a tool of this name; the agent's tools: %(tools)s")
                % {"names": ", ".join(unknown), "tools": ", ".join(listed) or "—"}
            )
    return problems


# A case's model fields by the key its document gives them under (the others are the same).
CASE_DOCUMENT_KEYS = {"case_type": "type"}


def _case_refusal(index: int, exc: Any) -> str:
    """What the columns refused of the ``index``-th case of a document (Django's ValidationError), as
    ``cases[i].key: message`` parts named by the document's keys (``type``, not the model's ``case_type``)."""
    if not hasattr(exc, "error_dict"):
        return f"cases[{index}]: {' '.join(exc.messages)}"
    parts = []
    for name, messages in exc.message_dict.items():
        where = (
            f"cases[{index}]" if name == NON_FIELD_ERRORS else f"cases[{index}].{CASE_DOCUMENT_KEYS.get(name, name)}"
        )
        parts.append(f"{where}: {' '.join(messages)}")
    return "; ".join(parts)


# Keys an exported object leads with, where it has them (a tool's name before its arguments, an alternative's tools
# before its note); the rest follow sorted.
_LEADING_KEYS = {"name": 0, "tools": 0}


def _keys_sorted(value: Any) -> Any:
    """``value`` with every object's keys in one order (``_LEADING_KEYS``, then sorted), whatever order the
    database kept (PostgreSQL's jsonb keeps its own): an export from SQLite and one from PostgreSQL are the same
    text."""
    if isinstance(value, dict):
        return {key: _keys_sorted(value[key]) for key in sorted(value, key=lambda k: (_LEADING_KEYS.get(k, 1), k))}
    if isinstance(value, list):
        return [_keys_sorted(item) for item in value]
    return value


def _untyped_single_tool(case: EvalCase) -> bool:
    """Whether ``case`` is a ``single_tool`` case that expects no tool, which a document gives by leaving its type
    out (``eval_set_apply`` refuses it typed, unless stored so already)."""
    return case.case_type == "single_tool" and tool_case_problem(case.case_type, case.expected_tools) is not None


def eval_set_document(eval_set: EvalSet) -> dict[str, Any]:
    """A set as a document (what ``export_config`` writes and ``eval_set_apply`` reads back)."""
    return {
        "name": eval_set.name,
        "description": eval_set.description,
        "agent": eval_set.agent.slug if eval_set.agent else None,
        "sandbox_servers": list(eval_set.sandbox_servers),
        "thresholds": dict(sorted(eval_set.thresholds.items())),
        "cases": [
            {
                "key": c.key,
                "order": c.order,
                # A single_tool case that expects no tool (one stored before a case's notation gave its type, or
                # given neither) is written without its type, which it is by default: typed, its entry is refused
                # where the case is not stored yet (a fresh installation), as one written so by hand is.
                **({} if _untyped_single_tool(c) else {"type": c.case_type}),
                "query": c.query,
                # Objects with their keys in one order (PostgreSQL's jsonb keeps its own): the exported text is
                # the same after a round trip, and from either database.
                **({"context": _keys_sorted(c.context)} if c.context else {}),
                **({"data": _keys_sorted(c.data)} if c.data else {}),
                "expected_tools": _keys_sorted(c.expected_tools),
                **({"ordered": True} if c.ordered else {}),
                "forbidden_tools": _keys_sorted(c.forbidden_tools),
                "answer_checks": _keys_sorted(c.answer_checks),
                **({"alternatives": _keys_sorted(c.alternatives)} if c.alternatives else {}),
                **({"note": c.note} if c.note else {}),
            }
            for c in eval_set.cases.all()
        ],
    }


# ---- running an eval ---------------------------------------------------------------------------------------


def agent_version_check(*, agent: Agent, version: int | None) -> None:
    """``version`` (a published version's number) must be one of the agent's: ApplicationError 404 otherwise."""
    if version is None:
        return
    if not AgentVersion.objects.filter(agent=agent, number=version).exists():
        raise ApplicationError(
            _("Agent '%(slug)s' has no version %(number)s.") % {"slug": agent.slug, "number": version},
            code="version_not_found",
            status=404,
        )


def eval_window(window: int | None = None) -> int:
    """How many cases of an eval run may be in flight at once: ``window`` (``run_eval --workers``), else
    ``PLATFORM_EVAL_WINDOW``; at least 1."""
    return max(1, int(window if window is not None else settings.PLATFORM_EVAL_WINDOW))


# The note of the version an eval run freezes for an agent never published (``eval_version_pin``): stored data,
# as the notes of the other publishes the code makes ("published on save", "roll back to vN") are.
EVAL_FREEZE_NOTE = "frozen for an eval run: the agent was never published"


@transaction.atomic
def eval_version_pin(*, agent: Agent, actor: Any) -> int:
    """The number of the version an eval run started without one runs, every case of it, whatever is edited or
    published meanwhile: the agent's live version as stored now (the caller's copy of the agent may be older than
    a publish). An agent never published runs its draft, which has no number: the draft as stored now is frozen as
    a candidate version (``agent_version_publish`` with ``make_live=False``, audited as every publish is; live
    traffic goes on running the draft) and that is pinned. The agent's latest version of the very same content is
    pinned instead where there is one, so that evals of an unchanged draft run, and compare, one version.

    Where there is no live version, the agent's row is locked, as a publish locks it: a first publish cannot come
    between finding no live version and freezing the draft. The configuration's lock is taken before it (the one
    lock order of configuration writes, ``audit.change_guard.config_write_lock``: on PostgreSQL, locking the agent
    first and the configuration when the draft is frozen deadlocked with an edit of the agent's rules)."""
    live = Agent.objects.only("live_version").get(pk=agent.pk).live_version_id
    if live is not None:
        return int(AgentVersion.objects.values_list("number", flat=True).get(pk=live))
    config_write_lock()
    locked = Agent.objects.select_for_update().get(pk=agent.pk)
    if locked.live_version_id is not None:
        return int(AgentVersion.objects.values_list("number", flat=True).get(pk=locked.live_version_id))
    content = version_content(locked)
    frozen = AgentVersion.objects.filter(agent=locked, digest=content_digest(content)).order_by("-number").first()
    if frozen is None:
        # An admin's eval run is started as ``admin:<username>`` (as a run's cancellation from its page is); a publish
        # on the admin pages records the username, and so does this one: an auditor filtering by the user finds both.
        publisher = actor.removeprefix("admin:") if isinstance(actor, str) else actor
        frozen = agent_version_publish(
            agent=locked, actor=publisher, via="eval", note=EVAL_FREEZE_NOTE, content=content, make_live=False
        )
    return frozen.number


@transaction.atomic
def eval_run_start(
    *,
    eval_set: EvalSet,
    agent: Agent,
    actor: str,
    version: int | None = None,
    label: str = "",
    window: int | None = None,
    via: str | None = None,
) -> EvalRun:
    """Create the eval run with one pending result per case, each holding the case as it is now (its snapshot: what
    the case's run is asked and scored against, whatever edits come meanwhile), and submit the first ``window``
    cases (``PLATFORM_EVAL_WINDOW`` when None; stored, so every refresh keeps that many in flight).

    Without ``version`` the eval runs the version ``eval_version_pin`` names (the live one; an agent never
    published, its draft frozen as it is now), recorded as the eval run's version: a version published or a draft
    edited while the eval runs does not move its remaining cases. Raises ApplicationError: 400 for a set without
    cases or a label longer than its column, 404 for an unknown version, 409 for a disabled agent, 503
    ``config:secret_unreadable`` where a secret its runs read cannot be decrypted (``eval_secrets_check``).

    Audited in the same transaction as ``eval_run.start`` (an eval run makes its sandbox servers' writes, may freeze
    a version and spends the agent's budget): the set, the agent, the version, the sandbox servers and the window,
    the eval run named in ``result`` as ``eval_run.cancel`` names it; source ``api`` for ``via="api"``, else
    ``admin`` (``CANCEL_SOURCES``). ``via``: ``admin``, ``api`` or ``run_eval``; None: read from ``actor`` (an API
    key's ``api_key:<prefix>`` is ``api``, ``system:run_eval`` is ``run_eval``, anyone else ``admin``)."""
    agent_version_check(agent=agent, version=version)
    label_max = EvalRun._meta.get_field("label").max_length or 0
    if len(label) > label_max:
        raise ApplicationError(
            _("The label is longer than %(max)d characters.") % {"max": label_max}, code="invalid_label"
        )
    cases = list(eval_set.cases.all())
    if not cases:
        raise ApplicationError(_("The eval set has no cases."), code="eval_set_empty")
    if not agent.enabled:
        raise ApplicationError(
            _("Agent '%(slug)s' is disabled.") % {"slug": agent.slug}, code="agent_disabled", status=409
        )
    eval_secrets_check(agent=agent)
    if version is None:
        version = eval_version_pin(agent=agent, actor=actor)
    eval_run = EvalRun.objects.create(
        eval_set=eval_set,
        agent=agent,
        version=version,
        label=label,
        window=eval_window(window),
        total=len(cases),
        thresholds=dict(eval_set.thresholds),
        sandbox_servers=list(eval_set.sandbox_servers or []),
        started_by=str(actor),
    )
    # In the set's order: the results' ids are the order cases are submitted in (and paged in, ``evals.api``).
    EvalCaseResult.objects.bulk_create(
        [EvalCaseResult(eval_run=eval_run, case=case, case_snapshot=case_snapshot(case)) for case in cases]
    )
    via = via or _start_via(str(actor))
    audit_event_record(
        source=CANCEL_SOURCES.get(via, "admin"),
        action="eval_run.start",
        args={
            "eval_set": eval_set.name,
            "agent": agent.slug,
            "version": version,
            "sandbox_servers": eval_run.sandbox_servers,
            "window": eval_run.window,
            "cases": eval_run.total,
        },
        result={"model": EvalRun._meta.label_lower, "id": str(eval_run.pk), "name": str(eval_run), "via": via},
        actor=str(actor),
    )
    eval_run_submit(eval_run=eval_run, window=eval_run.window)
    return eval_run


def _start_via(actor: str) -> str:
    """The door an eval run was started through, as its actor names it (``eval_run_start`` without ``via``)."""
    if actor.startswith("api_key:"):
        return "api"
    return "run_eval" if actor == "system:run_eval" else "admin"


def eval_secrets_check(*, agent: Agent) -> None:
    """Raises ApplicationError 503 ``config:secret_unreadable`` (as ``POST /runs`` answers) where a secret the
    agent's runs read, its model key or a bound server's env or headers, cannot be decrypted with this process's
    ``SECRETS_ENCRYPTION_KEYS``: the eval is refused at its start, as a disabled agent's is, rather than started to
    score every case as not submitted. It reads what a submission reads (``run_submission_parts``)."""
    with secrets_readable_or_refused():
        run_submission_parts(agent_slug=agent.slug, api_key=None)


def _submit_case(eval_run: EvalRun, result: EvalCaseResult) -> bool:
    """Submit the case's run, or score the case failed where it cannot become one. Returns False where it was left
    pending: a budget's room is held by runs in flight (``budget_refused_for_runs_in_flight``), given back as they
    end, so a later refresh submits it; scored failed, it would fail for a moment's congestion."""
    case = result.case_as_run()
    try:
        # A secret that cannot be decrypted (a key lost after the eval started) is the submission's 503
        # ``config:secret_unreadable``, refused below as any other: the eval run still ends.
        with secrets_readable_or_refused():
            run = run_create(
                agent_slug=eval_run.agent.slug,
                query=case.query,
                api_key=None,
                context=case.context or {},
                a2a_data=case.data or [],
                version=eval_run.version,
                purpose=Run.Purpose.EVAL,
                # The servers the eval run started with: a set edited meanwhile never makes a later case's writes
                # real.
                write_sandbox=list(eval_run.sandbox_servers or []),
            )
    except ApplicationError as exc:
        if budget_refused_for_runs_in_flight(exc):
            return False
        # The case cannot become a run (a query longer than this installation takes, stored before the limit or
        # under a higher one; the agent disabled meanwhile; a secret it reads no longer decrypts): it fails, and its
        # eval run goes on and ends (it stayed "running", retrying the case at every refresh).
        score = score_case(_case_spec(case), calls=[], answer="", run_succeeded=False)
        score.passed = False
        score.failed_checks.append(f"{NOT_SUBMITTED}{exc.code}")
        EvalCaseResult.objects.filter(pk=result.pk, run__isnull=True, scored=False).update(
            scored=True, passed=False, scores=score.as_dict(), answer=exc.message
        )
        return True
    # Compare-and-swap: a case is submitted once, whoever else refreshes the eval run at the same time.
    claimed = EvalCaseResult.objects.filter(pk=result.pk, run__isnull=True).update(run=run)
    if claimed != 1:
        transaction.set_rollback(True)
    return True


def _conversation_id(result: EvalCaseResult) -> str | None:
    context = result.case_as_run().context
    context_id = context.get("contextId") if isinstance(context, dict) else None
    return str(context_id) if context_id else None


def eval_run_submit(*, eval_run: EvalRun, window: int | None = None) -> int:
    """Submit pending cases, in the set's order, so that at most ``window`` of them are in flight (all pending
    ones when None). Cases that share an A2A ``contextId`` are one conversation, in the set's order: a case waits
    until the cases before it in its conversation are scored, so that its run is given their turns as its history
    (``agents.execution.conversation_history``). Several refreshers at once take turns on the eval run's row, so
    together they never pass the window. A case refused because the runs in flight hold what is left of a budget
    stays pending, and so do the cases after it, for a later refresh (``_submit_case``). An eval run that is no
    longer running (cancelled, ``eval_run_cancel``, which holds the same row lock) gets none. Returns how many were
    submitted (or scored as not submitted)."""
    submitted = 0
    with transaction.atomic():
        status = EvalRun.objects.select_for_update().filter(pk=eval_run.pk).values_list("status", flat=True).first()
        if status != EvalRun.Status.RUNNING:  # cancelled (or finished) meanwhile: nothing more is submitted
            return 0
        unscored = list(
            EvalCaseResult.objects.filter(eval_run=eval_run, scored=False).select_related("case").order_by("pk")
        )
        in_flight = sum(1 for r in unscored if r.run_id is not None)
        room = None if window is None else max(0, window - in_flight)
        conversations_waiting: set[str] = set()  # conversations with an unscored case before the one at hand
        for result in unscored:
            conversation = _conversation_id(result)
            if conversation is not None and conversation in conversations_waiting:
                continue
            if conversation is not None:
                conversations_waiting.add(conversation)
            if result.run_id is not None:
                continue
            if room is not None and submitted >= room:
                break
            with transaction.atomic():
                taken = _submit_case(eval_run, result)
            if not taken:  # the budget's room is held by runs in flight: so it is for the cases after it
                break
            submitted += 1
    return submitted


def run_tool_calls_for_scoring(run_id: Any) -> list[ToolCall]:
    """The calls a run made, in the order it made them, from its audit record: one per call (its first attempt,
    or the refusal or memo hit that stood for it), shown as its final attempt ended with the attempts counted (a
    call that timed out and succeeded on its retry succeeded; ``_audited_calls``), and those of a delivery that
    did not finish left out: a worker that died mid-run, whose run was delivered again and made its reads again,
    did not make the run's calls twice. A delivery's calls lie between its ``status: running`` event and the next
    delivery's of the same pass (a pass resumed after an approval starts again at delivery 1), by their times: the
    workers' clocks are taken to agree (NTP), as the reconciler's leases take them to.

    A write is sent once: a delivery after the one that sent it finds its approval executed and takes the recorded
    outcome, writing no event, or finds its outcome unknown and is refused. A write sent by a delivery that did
    not finish counts once all the same: by its send's events, or by that refusal (``_with_writes_found_sent``).

    The events of a parallel batch, written as its calls finished, are put back in the order the model asked for
    them (its ``model_turn`` events; ``evals.scoring.in_call_order``). Each call's arguments are the record's,
    masked (``audit.masking``): the scoring compares an expected argument masked too (``evals.scoring._subset``),
    and a case is refused one the record masks (``evals.scoring.case_problems``).

    Events committed but not chained yet (PostgreSQL's deferred chain: a worker's chainer holds off while it
    executes a run) are chained first, so a run just finished is read whole (see ``eval_run_refresh``)."""
    audit_chain_catch_up()
    kept = _kept_deliveries(run_id)
    calls = _audited_calls(AuditEvent.objects.filter(run_id=run_id, action="tool.call").order_by("id"))
    found = [c for c in calls if kept(c.first.created_at)]
    found = _with_writes_found_sent(run_id, found, lost=[c for c in calls if not kept(c.first.created_at)], kept=kept)
    turns = [
        [str(c.get("id") or "") for c in (data or {}).get("tool_calls") or [] if isinstance(c, dict)]
        for at, data in RunEvent.objects.filter(run_id=run_id, kind="model_turn")
        .order_by("seq")
        .values_list("created_at", "data")
        if kept(at)
    ]
    found = [found[i] for i in in_call_order([c.first.call_id for c in found], turns)]
    return [c.as_tool_call() for c in found]


def _kept_deliveries(run_id: Any) -> Callable[[Any], bool]:
    """Whether a time lies outside every delivery of the run that did not finish (one followed by a delivery
    again of the same pass, ``delivery`` > 1)."""
    starts = list(
        RunEvent.objects.filter(run_id=run_id, kind="status", data__status="running")
        .order_by("seq")
        .values_list("created_at", "data")
    )
    lost = [
        (began, starts[i + 1][0])
        for i, (began, _data) in enumerate(starts[:-1])
        if int((starts[i + 1][1] or {}).get("delivery") or 1) > 1
    ]
    return lambda at: not any(began <= at < ended for began, ended in lost)


@dataclass
class _AuditedCall:
    """One call as its audit events tell it: the event that opened it (its first attempt, or the refusal or memo
    hit that stood for it) and its last attempt (the same event when it was not retried)."""

    first: AuditEvent
    last: AuditEvent

    @property
    def key(self) -> tuple[str, str, str]:
        return self.first.call_id, self.first.mcp_id, self.first.tool

    def as_tool_call(self) -> ToolCall:
        return ToolCall(
            name=self.first.tool,
            args=self.first.args or {},
            ok=self.last.ok,
            reason=self.last.reason,
            attempts=self.last.attempt,
        )


def _audited_calls(events: Iterable[AuditEvent]) -> list[_AuditedCall]:
    """The calls ``events`` (in the order they were written) tell, in the order they were opened. A retry
    (attempt 2, 3, ...) belongs to the last call opened with its call id, server and tool whose attempt before it
    is the one before; the events of a parallel batch's other calls may lie between them. A retry with no such call
    is no call of its own."""
    calls: list[_AuditedCall] = []
    last_opened: dict[tuple[str, str, str], _AuditedCall] = {}
    for event in events:
        key = (event.call_id, event.mcp_id, event.tool)
        if event.attempt > 1:
            retried = last_opened.get(key)
            if retried is not None and retried.last.attempt == event.attempt - 1:
                retried.last = event
            continue
        call = _AuditedCall(first=event, last=event)
        calls.append(call)
        last_opened[key] = call
    return calls


# An approval in these states was sent: a delivery that finds it so never sends it again.
SENT_APPROVALS = (Approval.Status.EXECUTED, Approval.Status.OUTCOME_UNKNOWN)
# What the gate audits for a write it finds sent with no outcome recorded: the refusal that stands for that send.
OUTCOME_UNKNOWN_REFUSAL = "approval:outcome_unknown"


def _with_writes_found_sent(
    run_id: Any, found: list[_AuditedCall], *, lost: list[_AuditedCall], kept: Callable[[Any], bool]
) -> list[_AuditedCall]:
    """``found`` (the kept deliveries' calls) with the writes the run's approvals record as sent by a delivery
    that did not finish. Each counts once, by its send's events:

    - executed: a later delivery that asks for the write again is handed the recorded outcome and the gate
      writes no event, so its send is the only record of it;
    - outcome unknown: a later delivery that asks again is refused, audited (``approval:outcome_unknown``); that
      refusal stands for the send, which is then not added too.

    A send added is placed where a kept delivery first reported the same write after it (a model's or a flow's
    ``tool_call``, a rule's ``deterministic_result``), else where it was sent. The same write is the same server,
    tool and recorded arguments: a redelivered model names its call anew, so the call id does not tell (the
    approvals find it by its tool and exact arguments too)."""
    placed_at = [c.first.created_at for c in found]
    refusals = [c for c in found if c.last.reason == OUTCOME_UNKNOWN_REFUSAL]
    sent = Approval.objects.filter(run_id=run_id, status__in=SENT_APPROVALS).exclude(call_id="").order_by("created_at")
    for call_id, mcp_id, tool, status in sent.values_list("call_id", "mcp_id", "tool", "status"):
        send = next((c for c in lost if c.key == (call_id, mcp_id, tool) and c.first.attempt >= 1), None)
        if send is None:
            continue  # sent by a kept delivery (counted), or never sent
        write = _write_of(send.first)
        if status == Approval.Status.OUTCOME_UNKNOWN:
            refusal = next((c for c in refusals if _write_of(c.first) == write), None)
            if refusal is not None:
                refusals.remove(refusal)
                continue
        at = _reported_at(run_id, write=write, after=send.first.created_at, kept=kept) or send.first.created_at
        place = next((i for i, t in enumerate(placed_at) if t > at), len(found))
        found.insert(place, send)
        placed_at.insert(place, at)
    return found


def _write_of(event: AuditEvent) -> tuple[str, str, Any]:
    return event.mcp_id, event.tool, event.args


def _reported_at(run_id: Any, *, write: tuple[str, str, Any], after: Any, kept: Callable[[Any], bool]) -> Any:
    """When a kept delivery first reported ``write`` (``_write_of``) after ``after``; None when none did."""
    reports = (
        RunEvent.objects.filter(run_id=run_id, kind__in=("tool_call", "deterministic_result"), created_at__gt=after)
        .order_by("seq")
        .values_list("created_at", "data")
    )
    for at, data in reports:
        report = data if isinstance(data, dict) else {}
        if kept(at) and (report.get("mcp_id"), report.get("tool"), report.get("args")) == write:
            return at
    return None


# How long a finished run's calls may still wait to be chained before its case is scored without them: the chain
# of the moment is given this long (a chainer that fails, or a pending row that does not verify, holds events
# back for good; ``verify_audit`` and the chain's lag name them), so an eval run always ends.
CALLS_PENDING_WAIT_S = 60.0


def _calls_pending(run: Run, now: Any) -> bool:
    """Whether the run's tool calls are still waiting to be chained (deferred chaining that could not catch up
    here: inside a transaction, or the chainer failing) and may yet be: its case is scored at a later refresh."""
    if not AuditPendingEvent.objects.filter(run_id=run.pk, action="tool.call").exists():
        return False
    ended = run.finished_at or run.started_at or run.created_at
    return bool(ended is not None and (now - ended).total_seconds() < CALLS_PENDING_WAIT_S)


def _scored_alternatives(alternatives: Any) -> Any:
    """A case's alternatives as the scoring reads them: an ``ordered`` that is no JSON boolean is taken as not given
    (the alternative follows the case's own ``ordered``). ``null`` means that wherever it is written (an import drops
    it); ``"false"`` or ``"네"`` only a row stored before the admin's box refused them holds, and ``bool()`` read
    ``"false"`` as in this order."""
    if not isinstance(alternatives, list):
        return alternatives
    return [
        {k: v for k, v in a.items() if k != "ordered" or isinstance(v, bool)} if isinstance(a, dict) else a
        for a in alternatives
    ]


def _case_spec(case: EvalCase) -> CaseSpec:
    return CaseSpec(
        expected_tools=case.expected_tools,
        ordered=case.ordered,
        forbidden_tools=case.forbidden_tools,
        answer_checks=case.answer_checks,
        alternatives=_scored_alternatives(case.alternatives),
        case_type=case.case_type,
    )


def _score(result: EvalCaseResult, run: Run, *, calls: list[ToolCall], timed_out: bool = False) -> None:
    score = score_case(
        _case_spec(result.case_as_run()),
        calls=calls,
        answer=run.answer,
        run_succeeded=run.status == Run.Status.SUCCEEDED,
    )
    if timed_out:  # cancelled by the eval's timeout: never a pass, whatever its calls so far
        score.passed = False
        score.failed_checks.append("eval:timeout")
    if run.started_at and run.finished_at:
        score.latency_ms = round((run.finished_at - run.started_at).total_seconds() * 1000, 2)
    usage = run.token_usage or {}
    score.tokens = int(usage.get("total_tokens") or 0)
    score.model_calls = int(usage.get("model_calls") or 0)
    score.model_calls_saved = int(usage.get("model_calls_saved") or 0)
    EvalCaseResult.objects.filter(pk=result.pk, scored=False).update(
        scored=True,
        passed=score.passed,
        scores={**score.as_dict(), **({"timed_out": True} if timed_out else {})},
        called_tools=[
            {"name": c.name, "args": c.args, "ok": c.ok, "reason": c.reason, "attempts": c.attempts} for c in calls
        ],
        answer=run.answer or run.error_message,
    )


SCORED_STATUSES = (Run.Status.SUCCEEDED, Run.Status.FAILED, Run.Status.CANCELLED, Run.Status.AWAITING_APPROVAL)


TIMED_OUT_ACTOR = "eval:timeout"


def _timed_out(run: Run, deadline: Any) -> bool:
    """Cancel the case's run if it was submitted before ``deadline`` and has not finished (True when it ended
    that way: cancelled by the timeout, now or by an earlier pass)."""
    if run.status == Run.Status.CANCELLED:
        return run.error_message == f"cancelled by {TIMED_OUT_ACTOR}"
    if deadline is None or run.status in SCORED_STATUSES or run.created_at > deadline:
        return False
    try:
        run_cancel(run=run, actor=TIMED_OUT_ACTOR, source="eval")
    except ApplicationError:  # it ended meanwhile (409): scored as it ended
        # Ended by another refresher's timeout (this copy was read before it cancelled the run) is still timed out.
        run.refresh_from_db()
        return run.status == Run.Status.CANCELLED and run.error_message == f"cancelled by {TIMED_OUT_ACTOR}"
    run.refresh_from_db()
    return run.status == Run.Status.CANCELLED


def eval_run_refresh(*, eval_run: EvalRun, window: int | None = None, now: Any = None) -> EvalRun:
    """Score the cases whose runs have finished (a run parked on an approval counts as finished: an eval never
    waits for a person), submit more cases up to ``window`` in flight (None: the eval run's own, ``EvalRun.window``;
    one at a time for an eval run stored before it had one), and finish the eval run once every case is scored:
    its summary and the thresholds it did not meet. Safe to call from several places at once.

    A case whose run is still unfinished ``PLATFORM_EVAL_CASE_TIMEOUT_S`` after it was submitted (0: never) is
    cancelled and scored as failed (``timed_out``), so that an eval run always ends. A case whose run's calls are
    still waiting to be chained (``run_tool_calls_for_scoring`` could not chain them here) is scored at a later
    refresh, for at most ``CALLS_PENDING_WAIT_S``: scored without them, it would have failed for good.

    An eval run cancelled (``eval_run_cancel``) is left alone: returned as stored, nothing scored, submitted or
    timed out; one cancelled while this refresh runs keeps its cancellation (every write here is a compare-and-swap
    on a case not settled, or on the eval run still running)."""
    if not EvalRun.objects.filter(pk=eval_run.pk, status=EvalRun.Status.RUNNING).exists():
        eval_run.refresh_from_db()
        return eval_run
    timeout_s = float(settings.PLATFORM_EVAL_CASE_TIMEOUT_S)
    now = now or timezone.now()
    deadline = now - timedelta(seconds=timeout_s) if timeout_s > 0 else None
    open_results = EvalCaseResult.objects.filter(eval_run=eval_run, scored=False, run__isnull=False).select_related(
        "case", "run"
    )
    for result in open_results:
        run = result.run
        assert run is not None
        timed_out = _timed_out(run, deadline)
        if run.status not in SCORED_STATUSES:
            continue
        calls = run_tool_calls_for_scoring(run.pk)
        if not _calls_pending(run, now):
            _score(result, run, calls=calls, timed_out=timed_out)
    eval_run_submit(eval_run=eval_run, window=window if window is not None else (eval_run.window or 1))
    done = EvalCaseResult.objects.filter(eval_run=eval_run, scored=True).count()
    EvalRun.objects.filter(pk=eval_run.pk, status=EvalRun.Status.RUNNING).update(done=done)
    if done >= eval_run.total:
        scores = list(EvalCaseResult.objects.filter(eval_run=eval_run).values_list("scores", flat=True))
        # Settled by a cancellation that came while this refresh ran (which the update below then leaves as it is):
        # no score to count.
        summary = summarize([s for s in scores if not (isinstance(s, dict) and s.get("cancelled") is True)])
        EvalRun.objects.filter(pk=eval_run.pk, status=EvalRun.Status.RUNNING).update(
            status=EvalRun.Status.FINISHED,
            summary=summary,
            failed_thresholds=threshold_failures(summary, eval_run.thresholds),
            finished_at=timezone.now(),
        )
    eval_run.refresh_from_db()
    return eval_run


def eval_runs_refresh_open(*, now: Any = None) -> int:
    """Refresh every unfinished eval run (what each worker does in the background, every
    ``PLATFORM_EVAL_REFRESH_S``): its finished cases are scored, its overdue ones timed out, and it finishes when
    the last case is scored, whether or not anyone looks at it. Its cases in flight are topped up to its window
    (``EvalRun.window``: ``run_eval --workers K`` or ``PLATFORM_EVAL_WINDOW``; an eval run stored before it had
    one, one case at a time), so an eval started from the admin or the API, or whose ``run_eval`` stopped, goes
    on and ends, and with the command alive the two together never pass that window. Returns how many eval runs
    it finished.

    Each eval run is refreshed on its own (``agents.dispatch.repaired_alone``): one that fails (a row that cannot
    be loaded) is logged with its id and left for a later pass, and the others are still scored and topped up;
    what a retry can fix (the database gone) is raised, as every other eval run would meet it too."""
    finished = 0
    for pk in EvalRun.objects.filter(status=EvalRun.Status.RUNNING).values_list("pk", flat=True):
        refresh = partial(_open_eval_run_refresh, pk=pk, now=now)
        finished += repaired_alone(f"refresh eval run {pk}", refresh, nothing=False)
    return finished


def _open_eval_run_refresh(*, pk: Any, now: Any) -> bool:
    """Refresh eval run ``pk`` if it is still running; whether it finished. Loaded here, not with the others: a row
    it reads that cannot be loaded fails this eval run's refresh alone."""
    eval_run = EvalRun.objects.select_related("eval_set", "agent").filter(pk=pk, status=EvalRun.Status.RUNNING).first()
    if eval_run is None:  # finished meanwhile (another worker's pass, its page)
        return False
    return eval_run_refresh(eval_run=eval_run, now=now).status == EvalRun.Status.FINISHED


# ---- cancelling an eval run --------------------------------------------------------------------------------

# A case ended unscored because its eval run was cancelled (as ``eval:not_submitted:<code>`` names a case that could
# not become a run, and ``eval:timeout`` one stopped at the case's time limit).
CANCELLED_CHECK = "eval:cancelled"
# ``via`` of an eval run's cancellation (and of its start, ``eval_run_start``), and the audit source it is recorded
# under (``api``: an API key's act, as a run's cancellation through the API; the admin and ``run_eval``: an
# administrator's).
CANCEL_SOURCES = {"admin": "admin", "api": "api", "run_eval": "admin"}


def eval_run_cancel(*, eval_run: EvalRun, actor: str, via: str) -> EvalRun:
    """Stop a running eval run, in one transaction with its row locked (``select_for_update``; SQLite serialises
    writers instead): it becomes ``cancelled``, ``finished_at`` set.

    - Every case of it whose run has not finished (queued, running, or parked on an approval, a case already
      scored included: an eval never waits for a person) has that run cancelled through ``agents.services.run_cancel``
      (source ``eval``): its pending approvals expire, and what it reserved of a budget is given back, as for any
      cancelled run (by its live worker as it stops, where one holds it).
    - Every case not yet scored, submitted or not, is settled unscored: ``cancelled``, failed check
      ``eval:cancelled`` (``CANCELLED_CHECK``), never submitted afterwards (``eval_run_submit`` and
      ``eval_run_refresh`` leave a cancelled eval run alone; the compare-and-swap on ``scored`` keeps a refresh
      that read it before from scoring it). A case whose run had just finished and was not yet scored is settled so
      too. Cases already scored keep their scores.
    - The summary holds the scores of the cases scored before, and ``cancelled``: how many cases were not. Its
      thresholds are not judged (``failed_thresholds`` empty) and it never passes (``EvalRun.passed`` is False).

    Audited in the same transaction as ``eval_run.cancel`` (source ``api`` for ``via="api"``, else ``admin``; the
    eval run named in ``result`` as a configuration change names its object), with how many runs and cases were
    cancelled; each run's own cancellation is its ``run.cancel`` event. ``via``: ``admin``, ``api`` or
    ``run_eval``. Returns the eval run, fresh. Raises ApplicationError 409 ``eval_run_finished`` for an eval run
    that has already finished or been cancelled, 409 ``run_busy`` (nothing changed: the transaction is undone) where
    a case's run kept changing state under ``run_cancel``, 404 for one that no longer exists."""
    with transaction.atomic():
        locked = EvalRun.objects.select_for_update().filter(pk=eval_run.pk).first()
        if locked is None:
            raise ApplicationError(_("%(what)s not found.") % {"what": _("Eval run")}, code="not_found", status=404)
        if locked.status != EvalRun.Status.RUNNING:
            raise ApplicationError(
                _("The eval run has already ended (%(status)s).") % {"status": EvalRun.Status(locked.status).label},
                code="eval_run_finished",
                status=409,
            )
        results = list(EvalCaseResult.objects.filter(eval_run=locked).select_related("run").order_by("pk"))
        cancelled_runs: list[str] = []
        for result in results:
            run = result.run
            if run is None or run.status not in CANCELLABLE:
                continue
            try:
                with transaction.atomic():
                    # The run's page says who stopped it and why: "cancelled by admin:kim (eval run cancelled)".
                    run_cancel(run=run, actor=f"{actor} (eval run cancelled)"[:200], source="eval")
            except ApplicationError as refused:
                if refused.code == "run_busy":  # still changing state: marking its case cancelled would not stop it
                    raise ApplicationError(
                        _("A run of this eval run is changing state; nothing was cancelled. Try again."),
                        code="run_busy",
                        status=409,
                    ) from refused
                continue  # it ended meanwhile (409): nothing of it left to stop
            cancelled_runs.append(str(run.pk))
        unscored = [r.pk for r in results if not r.scored]
        cancelled_cases = EvalCaseResult.objects.filter(pk__in=unscored, scored=False).update(
            scored=True,
            passed=False,
            scores={"cancelled": True, "failed_checks": [CANCELLED_CHECK]},
            called_tools=[],
            answer="",
        )
        settled = list(EvalCaseResult.objects.filter(eval_run=locked).order_by("pk").values_list("scores", flat=True))
        scores = [s for s in settled if not (isinstance(s, dict) and s.get("cancelled") is True)]
        summary = {**summarize(scores), "cancelled": len(settled) - len(scores)}
        EvalRun.objects.filter(pk=locked.pk, status=EvalRun.Status.RUNNING).update(
            status=EvalRun.Status.CANCELLED,
            done=len(scores),
            summary=summary,
            failed_thresholds=[],
            finished_at=timezone.now(),
        )
        audit_event_record(
            source=CANCEL_SOURCES.get(via, "admin"),
            action="eval_run.cancel",
            args={
                "runs_cancelled": len(cancelled_runs),
                "cases_cancelled": cancelled_cases,
                "cases_scored": len(scores),
                "run_ids": cancelled_runs,
            },
            result={"model": EvalRun._meta.label_lower, "id": str(locked.pk), "name": str(locked), "via": via},
            actor=actor,
        )
    eval_run.refresh_from_db()
    return eval_run


# ---- comparing two eval runs -------------------------------------------------------------------------------


@dataclass
class CaseComparison:
    case: EvalCase
    a: EvalCaseResult | None
    b: EvalCaseResult | None

    @property
    def pair(self) -> tuple[EvalCaseResult | None, EvalCaseResult | None]:
        return self.a, self.b

    @property
    def changed(self) -> bool:
        """The outcome changed: passed in one and not the other, or other tools called. A case not scored yet in
        one run or both (still running, or waiting to be submitted), or ended unscored by a cancellation, has no
        outcome to compare: not changed."""
        if self.a is None or self.b is None:
            return True
        if not (self.a.scored and self.b.scored) or self.a.cancelled or self.b.cancelled:
            return False
        tools_a = [c["name"] for c in self.a.called_tools]
        tools_b = [c["name"] for c in self.b.called_tools]
        return self.a.passed != self.b.passed or tools_a != tools_b


def eval_runs_comparable_check(*, a: EvalRun, b: EvalRun) -> None:
    """Raises ApplicationError (400 ``eval_runs_not_comparable``) unless ``a`` and ``b`` are eval runs of one set:
    the cases of two sets are other questions, whatever their keys (``case-001`` is in every set imported without
    keys)."""
    if a.eval_set_id != b.eval_set_id:
        raise ApplicationError(
            _("Only eval runs of the same eval set can be compared: '%(a)s' and '%(b)s' are two sets.")
            % {"a": a.eval_set.name, "b": b.eval_set.name},
            code="eval_runs_not_comparable",
        )


def eval_run_compare(*, a: EvalRun, b: EvalRun) -> list[CaseComparison]:
    """The cases of two eval runs of one set side by side (by case), the ones whose outcome changed first. Raises
    ApplicationError for eval runs of two sets (``eval_runs_comparable_check``). Rows pair the same case (its id),
    not the same key: a key can be renamed, or given to another case, between the two eval runs."""
    eval_runs_comparable_check(a=a, b=b)
    results_a = {r.case_id: r for r in a.results.select_related("case")}
    results_b = {r.case_id: r for r in b.results.select_related("case")}
    case_ids = list(dict.fromkeys([*results_a, *results_b]))
    rows = [
        CaseComparison(
            case=(results_a.get(c) or results_b[c]).case_as_run(),  # as the eval run asked it
            a=results_a.get(c),
            b=results_b.get(c),
        )
        for c in case_ids
    ]
    return sorted(rows, key=lambda row: (not row.changed, row.case.order, row.case.pk))


def eval_runs_for(
    *,
    eval_set: EvalSet | None = None,
    agent: Agent | None = None,
    agents: Iterable[Agent] | None = None,
    eval_sets: QuerySet[EvalSet] | None = None,
) -> QuerySet[EvalRun]:
    """Eval runs, newest first: of ``eval_set``, against ``agent``, against one of ``agents`` and of one of
    ``eval_sets`` (a key's scope: its agents, and the sets it may read; None: any)."""
    runs = EvalRun.objects.select_related("eval_set", "agent")
    if eval_set is not None:
        runs = runs.filter(eval_set=eval_set)
    if agent is not None:
        runs = runs.filter(agent=agent)
    if agents is not None:
        runs = runs.filter(agent__in=list(agents))
    if eval_sets is not None:
        runs = runs.filter(eval_set__in=eval_sets)
    return runs.order_by("-created_at")
