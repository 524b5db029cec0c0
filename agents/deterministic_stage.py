"""The deterministic stage (seed 000), once: the rules in order, each decided without a model, each match called
through the gate (``execute``) or only checked against the tool's contract (``dry_run``).

A run (``agents.engine``) and the admin's rule tester (``agents.rule_tester``) both call ``deterministic_stage``;
they differ only in the mode, so a rule that fails a run fails the tester the same way, with the same reason
code: a code rule that cannot be loaded, raises, or returns anything but ``{"tool_name": ..., "params": {...}}``
or ``None`` (``deterministic:rule_error``); a rule whose server is not bound or is disabled
(``mcp:not_loaded:<mcp_id>``); a match on a tool its server lacks (``deterministic:tool_unknown``). The first such
failure ends the stage (a run ends ``failed`` there, before any model call). A code rule's ``params`` must be an
object that reads as JSON (a date, a set or NaN is the rule's error: no tool could be sent it).

A run's stage stops where its run stops, as the ReAct loop does between its steps: ``StageInput.check`` runs
before each call the stage makes (a matched rule's, and a code rule's own ``ctx.mcp_tools`` calls), and what it
raises (``RunCancelled``: the run was cancelled, its time is up, or this worker no longer holds it) ends the stage
before the call is sent, an approved write included; the records made so far are still written.

A dry run calls nothing, so a code rule that reads its own tool's answer (``ctx.mcp_tools``) reads a stand-in:
whatever it then does (raise, return None, or route with parameters taken from the stand-in), the dry run cannot
say what a run does, and the rule is reported as not decidable (``NOT_DECIDABLE_IN_DRY_RUN``), not as a failure,
a miss or a call a run would make.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from django.db import transaction
from django.utils.translation import gettext
from langchain_core.tools import BaseTool, StructuredTool

import agent_platform.telemetry as telemetry
from agents.deterministic import RuleDecision, RuleSpec, decide
from agents.errors import (
    DETERMINISTIC_STAGE_FAILED,
    MCP_NOT_LOADED,
    MUST_PROPAGATE,
    RunCancelled,
    worker_interruption,
)
from agents.tools import CodeRuleError, DeterministicContext, load_code_rule
from audit.masking import mask_text, mask_value
from audit.services import audit_events_record
from mcpregistry import gate
from mcpregistry.contracts import argument_constraints, call_out_of_date, check_args, gate_filled_argument
from mcpregistry.models import McpServer, ToolContract

logger = logging.getLogger(__name__)

StageMode = Literal["dry_run", "execute"]

NOT_DECIDABLE_IN_DRY_RUN = "not decidable in a dry run"
"""The decision's reason for a code rule that called its own tools in a dry run (stable English,
as every stored reason; the rule tester says it in the reader's language)."""


@dataclass(frozen=True)
class StageFailure:
    """Why the stage stopped: ``code`` is the run's ``error_code``, ``message`` its ``error_message``."""

    code: str
    message: str


@dataclass
class RuleStep:
    """One rule's turn: its decision (``None`` when it could not be decided), the contract's verdict on the
    rendered parameters (dry run), the gate's result (execute), or the failure that ended the stage."""

    rule: RuleSpec
    mcp_id: str
    tool: str
    decision: RuleDecision | None = None
    verdict: str = ""
    result: gate.ToolResult | None = None
    failure: StageFailure | None = None
    notes: list[str] = field(default_factory=list)
    # A write of the code rule's own (``ctx.mcp_tools``) waiting for a person: the run parks on it, and the rule is
    # decided again once it is decided (its calls numbered the same way, the approved one found by its number).
    parked_on: gate.ToolResult | None = None
    # The decision's parameters as the trace and the rule tester show them: masked as its audit event masks them
    # (``params_masked``). The tool is sent ``decision.params``.
    params_shown: dict[str, Any] | None = None


@dataclass
class StageOutcome:
    """``results`` are the calls made (execute mode; each with its rule and answer template); ``failure`` or
    ``parked_on`` (an approval the run waits for) say why the stage stopped early."""

    steps: list[RuleStep] = field(default_factory=list)
    results: list[dict[str, Any]] = field(default_factory=list)
    failure: StageFailure | None = None
    parked_on: str | None = None


@dataclass
class StageInput:
    """What the rules decide on, and what the stage reports to (a run's trace, events and audit)."""

    query: str
    context: dict[str, Any]
    a2a_data: list[dict[str, Any]]
    a2a_files: list[dict[str, Any]]
    servers: list[McpServer]
    rules: list[RuleSpec]
    run_id: Any = None
    actor: str = ""
    trace: list[dict[str, Any]] = field(default_factory=list)
    emit: Callable[[str, dict[str, Any]], None] = lambda kind, data: None
    # Several events in one write (a run's ``RunEventWriter.emit_many``); else ``emit`` one by one.
    emit_many: Callable[[list[tuple[str, dict[str, Any]]]], None] | None = None
    previous_results: list[dict[str, Any]] = field(default_factory=list)
    # A published version's frozen contracts (``mcp_id/tool`` → contract): its run calls only those tools, with
    # those contracts; None: the tools and contracts as they are now.
    contracts: Mapping[str, ToolContract] | None = None
    # Before each call the stage makes: raises (``RunCancelled``) where the run must stop (cancelled, out of time,
    # taken over by another worker). A run's ``RunPlan.check_cancelled``; the rule tester has nothing to stop.
    check: Callable[[], None] = lambda: None


def deterministic_stage(
    stage: StageInput,
    *,
    mode: StageMode,
    who: Callable[[str], gate.GateCall],
    check_contracts: bool = False,
    sends_writes: bool = True,
) -> StageOutcome:
    """Evaluate ``stage.rules`` in order. In ``execute`` mode every match calls its tool through the gate, one
    after another (also across servers), and the results accumulate; a call waiting for approval parks the stage
    (``parked_on``). In ``dry_run`` mode nothing is called: each match's parameters are checked against the tool's
    contract (``RuleStep.verdict``), as ``check_contracts`` also asks in execute mode. ``sends_writes`` False (the
    rule tester, whose caller cannot ask a person): a match on a write is not sent in execute mode either, where a
    run would wait for a person's approval; it is checked as a dry run checks it, and the rules after it decided.

    ``who(call_id)`` names the caller for the gate. Each decision goes to ``stage.trace`` and ``stage.emit``, and,
    for a run (``run_id`` set, execute mode), to the audit, the failure that ends the stage included (with its
    code as the reason); the trace, the events and ``RuleStep.params_shown`` hold its parameters masked as the
    audit holds them, and only the tool is sent the real ones. Never raises for a rule's failure (it is the
    outcome's ``failure``); the errors of ``agents.errors.MUST_PROPAGATE`` propagate, ``stage.check``'s
    ``RunCancelled`` among them (raised before a call, which is then not sent; the decisions so far are written).
    """
    decisions = _DecisionLog(stage)
    if mode == "execute":
        given_who = who

        def who(call_id: str) -> gate.GateCall:
            # The audit events of the stage's read calls go out with its next records (see _DecisionLog).
            return replace(given_who(call_id), audit_sink=decisions)

    try:
        return _stage_rules(
            stage, decisions, mode=mode, who=who, check_contracts=check_contracts, sends_writes=sends_writes
        )
    finally:
        decisions.flush()


class _DecisionLog:
    """The rule decisions not yet written (and the result of the tool call before them, with the call's audit
    events): their events and audit events go out together, in one transaction (one commit), before the next
    tool call and when the stage ends, so the order of the record is the order of what happened.

    It is the gate's ``AuditSink`` for the stage's calls: a read call's audit events (its attempts, a memo hit)
    are written with the call's result event and the decisions after it, a transaction and a turn on the chain
    head fewer per call; the decisions before a call are written before it is sent, and whatever the gate writes
    itself (a write call's approval and audit events) is written after what was collected, as the gate flushes
    first. A decision's read call's audit event thus lands when the stage next writes (the rules after it are
    decided without a model or a call; a worker that dies in between loses it with the call's result event, and
    the run, redelivered, makes the call again). A code rule's own calls are written as each returns: its code
    may run on for long after a read (another call, its own work)."""

    def __init__(self, stage: StageInput) -> None:
        self.stage = stage
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.audits: list[dict[str, Any]] = []

    def add_decision(self, record: dict[str, Any], audit: dict[str, Any] | None) -> None:
        self.events.append(("rule", record))
        if audit is not None:
            self.audits.append(audit)

    def add(self, event: dict[str, Any]) -> None:
        """``gate.AuditSink``: a gated read call's audit event (``audit_event_record``'s arguments)."""
        self.audits.append(event)

    def add_event(self, kind: str, record: dict[str, Any]) -> None:
        """An event of the stage that goes out with the decisions after it (a tool call's result)."""
        self.events.append((kind, record))

    def flush(self) -> None:
        if not self.events and not self.audits:
            return
        events, audits = self.events, self.audits
        self.events, self.audits = [], []
        with transaction.atomic():
            if self.stage.emit_many is not None:
                self.stage.emit_many(events)
            else:
                for kind, record in events:
                    self.stage.emit(kind, record)
            audit_events_record(audits)  # one turn on the chain's head for all of them


def _stage_rules(
    stage: StageInput,
    decisions: _DecisionLog,
    *,
    mode: StageMode,
    who: Callable[[str], gate.GateCall],
    check_contracts: bool,
    sends_writes: bool,
) -> StageOutcome:
    servers = {s.mcp_id: s for s in stage.servers}
    outcome = StageOutcome()
    # A stage parked on an approval is run again on resume: finished calls are reused, not repeated.
    earlier = {r["rule_id"]: r for r in stage.previous_results if r.get("error") != "approval:pending"}
    # The decisions' audit source, as the gate's caller names it: "deterministic", or an eval/shadow purpose; a run's
    # decisions only are audited (a dry run's, and the rule tester's, are shown where they are asked for).
    audit_source = who("").source if mode == "execute" and stage.run_id is not None else ""
    for rule in telemetry.spans_per_item(stage.rules, "deterministic_rule", _rule_span_attributes):
        if rule.rule_id in earlier:
            outcome.results.append(earlier[rule.rule_id])
            continue
        step = _decide(stage, rule, servers, mode=mode, who=who, flush=decisions.flush)
        outcome.steps.append(step)
        if step.parked_on is not None:
            waiting = step.parked_on
            stage.trace.append(
                {"type": "approval", "approval_id": waiting.approval_id, "tool": waiting.tool, "args": waiting.args}
            )
            outcome.parked_on = waiting.approval_id
            return outcome
        server = servers.get(step.mcp_id)  # None: an admin rule for a server not bound here, which did not match
        secrets = server.secret_values() if server is not None else []  # what its audit event is masked with
        if step.failure is not None:
            _failure_recorded(stage, decisions, step, source=audit_source, secrets=secrets)
            outcome.failure = step.failure
            return outcome
        decision = step.decision
        assert decision is not None
        step.params_shown = params_masked(decision.params, secrets=secrets)
        record = {**decision.as_dict(), "params": step.params_shown, "mcp_id": step.mcp_id, "tool": step.tool}
        # A stable code (``rule:keyword``, ``rule:regex``…), as everywhere else; the sentence beside it.
        telemetry.set_attributes(
            {
                "platform.rule.matched": decision.matched,
                "platform.reason_code": decision.code or ("rule:matched" if decision.matched else "rule:skipped"),
                "platform.rule.reason": decision.reason,
            }
        )
        stage.trace.append({"type": "rule", **record})
        audit = None
        if audit_source:
            audit = _decision_audit(
                stage,
                step,
                source=audit_source,
                args=decision.params or {},
                result={"rule": rule.name, "matched": decision.matched, "reason": decision.reason},
                reason="rule:matched" if decision.matched else "rule:skipped",
                secrets=secrets,
            )
        decisions.add_decision(record, audit)
        if not decision.matched or server is None:
            continue
        # As the gate reads it: callable now and, in a published version's run, frozen in the version (a tool
        # discovered since is unknown to it, and the stage fails as seed 000 says, not as a failed call). A dry
        # run asks the gate for nothing: it reads the tools as they are.
        caller = who(f"rule:{rule.rule_id}") if mode != "dry_run" else None
        known = any(t.name == step.tool and _offered(caller, server, t, stage.contracts) for t in server.tools.all())
        unknown = StageFailure(
            "deterministic:tool_unknown",
            f"{DETERMINISTIC_STAGE_FAILED}: '{step.tool}' tool이 MCP '{step.mcp_id}'에 없습니다.",
        )
        if mode == "dry_run" or check_contracts:
            # Its objection quotes the value (``got '…'``): masked as the gate masks its refusal's message.
            verdict = contract_verdict(server, step.tool, decision.params, contracts=stage.contracts)
            step.verdict = mask_text(verdict, secrets=secrets)
        if mode == "dry_run":
            if not known:
                step.failure = outcome.failure = unknown
                return outcome
            continue
        assert caller is not None  # only a dry run has none, and it stopped above
        if not sends_writes and known and _write(caller, server, step.tool):
            continue  # not sent: a run waits here for a person's approval (the tester tells it by its risk)
        decisions.flush()
        stage.check()  # a run cancelled (or out of time, or taken over) sends nothing more
        result = gate.call(
            server=server,
            tool_name=step.tool,
            args=decision.params or {},
            who=caller,
            known_tool=known,
        )
        step.result = result
        if result.error == "approval:pending":
            stage.trace.append(
                {"type": "approval", "approval_id": result.approval_id, "tool": step.tool, "args": result.args}
            )
            outcome.parked_on = result.approval_id
            return outcome
        entry = {
            "rule": rule.name,
            "rule_id": rule.rule_id,
            **result.as_dict(),
            "match": decision.match,
            "answer_template": rule.answer_template,
        }
        outcome.results.append(entry)
        public = {k: v for k, v in entry.items() if k != "answer_template"}
        stage.trace.append({"type": "deterministic_call", **public})
        decisions.add_event("deterministic_result", public)  # written with the next decisions, in order
        if not known:
            step.failure = outcome.failure = unknown
            return outcome
    return outcome


def params_masked(params: dict[str, Any] | None, *, secrets: list[str]) -> dict[str, Any] | None:
    """A decision's parameters as the run's trace, its events and the rule tester show them: masked exactly as its
    audit event masks them (``audit.services`` masks ``args`` with ``mask_value``: the server's ``secrets``, every
    registered one, secret key names, value patterns). A code rule may put a bound secret, or a value under a
    secret key, into what it sends; a run's page, which auditors read too, must not show what the audit hides.
    The tool itself is sent the real parameters."""
    return None if params is None else mask_value(params, secrets=secrets)


def _failure_recorded(
    stage: StageInput, decisions: _DecisionLog, step: RuleStep, *, source: str, secrets: list[str]
) -> None:
    """A rule that ends the stage (seed 000's errors: it raised or could not be loaded, its server is not loaded)
    is a decision too: in the trace and the run's events and, for a run (``source`` set), in the audit, with the
    failure's code as its reason (recorded not ok: the run fails there), written with the decisions before it."""
    assert step.failure is not None
    rule, code = step.rule, step.failure.code
    record = {"rule_id": rule.rule_id, "rule": rule.name, "matched": False, "reason": code, "params": None}
    record |= {"mcp_id": step.mcp_id, "tool": step.tool}
    telemetry.set_attributes({"platform.rule.matched": False, "platform.reason_code": code})
    stage.trace.append({"type": "rule", **record})
    audit = None
    if source:
        audit = _decision_audit(
            stage,
            step,
            source=source,
            args={},
            result={"rule": rule.name, "matched": False, "reason": code, "message": step.failure.message},
            reason=code,
            secrets=secrets,
            ok=False,
        )
    decisions.add_decision(record, audit)


def _decision_audit(
    stage: StageInput,
    step: RuleStep,
    *,
    source: str,
    args: dict[str, Any],
    result: dict[str, Any],
    reason: str,
    secrets: list[str],
    ok: bool = True,
) -> dict[str, Any]:
    """A rule decision's audit event (``audit_event_record``'s arguments: masked as it is recorded)."""
    return {
        "source": source,
        "action": "rule.decision",
        "run_id": stage.run_id,
        "mcp_id": step.mcp_id,
        "tool": step.tool,
        "call_id": f"rule:{step.rule.rule_id}",
        "args": args,
        "result": result,
        "ok": ok,
        "reason": reason,
        "attempt": 0,
        "actor": stage.actor,
        "secrets": secrets,
    }


def _rule_span_attributes(rule: RuleSpec) -> dict[str, Any]:
    return {"platform.rule": rule.name, "platform.rule_id": rule.rule_id}


def contract_verdict(
    server: McpServer, tool_name: str, params: Any, *, contracts: Mapping[str, ToolContract] | None = None
) -> str:
    """``ok``, ``tool:unknown``, ``tool:out_of_date`` (as the gate refuses the call: ``call_out_of_date``), or the
    contract's first objection to ``params`` (``args:<reason>:<arg>: …``); ``contracts``: a published version's
    frozen ones (``StageInput.contracts``)."""
    tool = next((t for t in server.tools.all() if t.name == tool_name), None)
    if tool is None or not _offered(None, server, tool, contracts):
        return "tool:unknown"
    if contracts is not None:
        contract: ToolContract | None = contracts.get(f"{server.mcp_id}/{tool_name}")
    else:
        contract = ToolContract.objects.filter(tool=tool).first()
    if call_out_of_date(contracts, server.mcp_id, tool, params, filled=gate_filled_argument(contract)):
        # The gate's own check, before the arguments' (``gate.call``): the version's contract no longer fits the
        # tool's arguments, and the call sends what its server no longer takes. The gate refuses it unsent.
        return "tool:out_of_date"
    constraints = contract.args if contract else argument_constraints(tool.input_schema)
    unknown = contract.unknown_args if contract else "refuse"
    _clean, verdict = check_args(
        constraints or {},
        params,
        unknown=unknown,
        input_schema=tool.input_schema,
        idempotency_arg=gate_filled_argument(contract),
    )
    return f"{verdict.reason}: {verdict.detail}" if verdict else "ok"


def _not_loaded(mcp_id: str) -> StageFailure:
    return StageFailure(f"mcp:not_loaded:{mcp_id}", MCP_NOT_LOADED.format(mcp_id=mcp_id))


def _rule_error(detail: str) -> StageFailure:
    return StageFailure("deterministic:rule_error", f"{DETERMINISTIC_STAGE_FAILED}: {detail}")


def _decide(
    stage: StageInput,
    rule: RuleSpec,
    servers: dict[str, McpServer],
    *,
    mode: StageMode,
    who: Callable[[str], gate.GateCall],
    flush: Callable[[], None] = lambda: None,
) -> RuleStep:
    """Decide one rule: a step with a decision, or with the failure that ends the stage. An admin rule's
    conditions are read first: its server not loaded (not bound, or disabled) fails the stage only for a query
    the rule matches, so one rule left behind does not fail every run. A code rule names its server in its
    decorator (seed 000): it fails before it runs; ``flush`` writes what the stage collected around each call
    it makes itself."""
    if not rule.code:
        step = RuleStep(rule=rule, mcp_id=rule.mcp_id, tool=rule.tool_name)
        server = servers.get(rule.mcp_id)
        loaded = server is not None and server.enabled
        step.decision = decide(
            rule,
            query=stage.query,
            context=stage.context,
            a2a_data=stage.a2a_data,
            # As the gate offers them (``_offered``): a published version's run may call only the tools it froze,
            # as a code rule's ``ctx.mcp_tools`` lists them. A tool switched on since is no tool of the version's,
            # and a rule that waits for it skips, where it matched and failed the run ``deterministic:tool_unknown``.
            available_tools={t.name for t in server.tools.all() if _offered(None, server, t, stage.contracts)}
            if server is not None and loaded
            else set(),
        )
        if step.decision.matched and not loaded:
            step.decision = None
            step.failure = _not_loaded(rule.mcp_id)
        return step
    step = RuleStep(rule=rule, mcp_id="", tool="")
    parked: list[gate.ToolResult] = []
    stopped: list[RunCancelled] = []  # the run stopped at one of the rule's own calls (``stage.check``)
    not_called: list[str] = []  # a dry run's tool calls of the rule's own, answered with a stand-in
    try:
        fn, step.mcp_id = load_code_rule(rule.code)
    except CodeRuleError as exc:
        logger.warning("deterministic rule %s cannot be loaded: %s", rule.name, exc)
        step.failure = _rule_error(str(exc))
        return step
    server = servers.get(step.mcp_id)
    if server is None or not server.enabled:
        step.failure = _not_loaded(step.mcp_id)
        return step
    ctx = DeterministicContext(
        query=stage.query,
        # Its own copies, to the last member: what a rule changes in them (``part.pop(...)``) is neither what the
        # rules after it read nor what the run keeps (its input, read again after the stage).
        context=copy.deepcopy(stage.context),
        a2a_data=copy.deepcopy(stage.a2a_data) or None,
        a2a_files=copy.deepcopy(stage.a2a_files) or None,
        mcp_tools=_rule_tools(
            server,
            rule=rule,
            mode=mode,
            who=who,
            parked=parked,
            contracts=stage.contracts,
            not_called=not_called,
            check=stage.check,
            stopped=stopped,
            flush=flush,
        ),
    )
    try:
        returned = fn(ctx)
    except MUST_PROPAGATE:
        raise
    except BaseException as exc:  # a rule author's bug fails the stage as a value (``sys.exit()`` too)
        if not isinstance(exc, Exception) and worker_interruption(exc):
            raise  # the worker's own stop: the run is redelivered or ended by its task
        if stopped:  # the rule caught the stop (or failed after it): the run stops all the same
            raise stopped[0] from exc
        if parked:  # the rule stopped at a write waiting for a person (or caught that and failed after it)
            step.parked_on = parked[0]
            return step
        if not_called:
            logger.info("deterministic rule %s raised in a dry run after calling %s", rule.name, not_called)
            return _not_decidable(
                step,
                gettext(
                    "It called %(tools)s, which a dry run does not call, and then raised %(error)s: what it decides "
                    "depends on the answer. Test it with the option that calls the tools through the gate to see "
                    "what a run does."
                )
                % {"tools": ", ".join(dict.fromkeys(not_called)), "error": type(exc).__name__},
            )
        logger.exception("deterministic rule %s raised", rule.name)
        step.failure = _rule_error(f"{rule.name} raised {type(exc).__name__}")
        return step
    if stopped:  # recorded before the tool raised: a rule that catches it cannot go on past its run's stop
        raise stopped[0]
    if parked:  # recorded before the tool raised: a rule that catches it cannot go on past a pending approval
        step.parked_on = parked[0]
        return step
    if not_called:
        # Whatever it returned (None, or a tool with parameters taken from the answer) it made of a stand-in: the
        # tester said "no rule matched" of a rule whose run calls two tools, or showed parameters no run sends.
        return _not_decidable(
            step,
            gettext(
                "It called %(tools)s, which a dry run does not call: what it decides depends on the answer. Test it "
                "with the option that calls the tools through the gate to see what a run does."
            )
            % {"tools": ", ".join(dict.fromkeys(not_called))},
        )
    if returned is None:
        step.decision = RuleDecision(rule.rule_id, rule.name, False, "returned None", code="rule:returned_none")
        return step
    if not isinstance(returned, dict) or not isinstance(returned.get("tool_name"), str):
        step.failure = _rule_error(
            f'{rule.name} returned {type(returned).__name__}, not {{"tool_name": ..., "params": {{...}}}} or None'
        )
        return step
    params = returned.get("params")
    if params is None:
        params = {}
    elif not isinstance(params, dict):
        # Seed 000's shape, "params" an object: a list or a text is the rule's bug, not the tool's failure (and an
        # empty one must not become a call without arguments).
        step.failure = _rule_error(f'{rule.name} returned "params" as {type(params).__name__}, not an object')
        return step
    try:
        json.dumps(params, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        # A date, a set, NaN, lists nested past what JSON writes: no tool can be sent it (nor can the run record
        # it). The rule's bug, as a value (a RecursionError ended the run ``internal``).
        step.failure = _rule_error(f"{rule.name} returned params that are not JSON ({exc})")
        return step
    if not all(isinstance(name, str) for name in params):
        # json.dumps writes a key 1 or None as text: the arguments would name "1", which the rule never meant.
        step.failure = _rule_error(f"{rule.name} returned params that are not JSON (an argument's name is not text)")
        return step
    step.tool = returned["tool_name"]
    step.decision = RuleDecision(
        rule.rule_id, rule.name, True, "matched", params=params, tool_name=step.tool, code="rule:matched"
    )
    return step


def _not_decidable(step: RuleStep, note: str) -> RuleStep:
    """A dry run's step for a code rule that read a stand-in for its own tool's answer (``ctx.mcp_tools``): what it
    does with the real one only a run (or a trial through the gate) can say."""
    step.decision = RuleDecision(
        step.rule.rule_id, step.rule.name, False, NOT_DECIDABLE_IN_DRY_RUN, code="rule:not_decidable"
    )
    step.notes.append(note)
    return step


class RuleParked(Exception):
    """A code rule's write (``ctx.mcp_tools``) waits for a person's approval: the rule stops here, the run parks."""


def _rule_tools(
    server: McpServer,
    *,
    rule: RuleSpec,
    mode: StageMode,
    who: Callable[[str], gate.GateCall],
    parked: list[gate.ToolResult],
    contracts: Mapping[str, Any] | None = None,
    not_called: list[str] | None = None,
    check: Callable[[], None] = lambda: None,
    stopped: list[RunCancelled] | None = None,
    flush: Callable[[], None] = lambda: None,
) -> list[BaseTool]:
    """``DeterministicContext.mcp_tools``: the server's callable tools as LangChain tools (name, description,
    input schema). Calling one goes through the gate like everything else; in a dry run it calls nothing.

    Each call is numbered in the order the rule makes it (``rule:<id>:call:<n>``), as a flow's are: a rule decided
    again (its run redelivered, or resumed after an approval) finds each write it made under its number, executed
    (its recorded outcome, never a second send) or approved, its arguments checked against the recorded ones. A
    write waiting for a person raises :class:`RuleParked`; the stage parks the run on it. ``check`` runs before
    each call: the run's stop it raises is recorded in ``stopped`` (a rule that catches it is stopped after it
    returns) and sends nothing more. A dry run's calls are answered with a stand-in and listed in ``not_called``."""
    numbers = iter(range(1, 1_000_000))

    def make(tool_name: str) -> Callable[..., str]:
        def run(**kwargs: Any) -> str:
            if mode == "dry_run":
                if not_called is not None:
                    not_called.append(tool_name)
                return f"(dry run: {tool_name} not called)"
            if parked:  # the rule caught the wait and called on: nothing more goes out until the run resumes
                raise RuleParked(parked[0].message)
            if stopped:  # the rule caught its run's stop and called on: nothing more goes out
                raise stopped[0]
            # What the stage collected (the decisions before) is written before the call goes out, as before a
            # decision's call, and the call's own audit events once it returns: the rule's code may go on for long
            # (another call, its own work), and a worker that dies meanwhile must not take the record of a read
            # that returned data with it (as the model's loop, each read is audited at once).
            flush()
            try:
                check()
            except RunCancelled as stop:
                if stopped is not None:
                    stopped.append(stop)
                raise
            call_id = f"rule:{rule.rule_id}:call:{next(numbers)}"
            result = gate.call(server=server, tool_name=tool_name, args=kwargs, who=who(call_id))
            flush()
            if result.error == "approval:pending" and result.approval_id:
                parked.append(result)
                raise RuleParked(result.message)
            # Code reads it, no model: the value as its text (``for_code``), which the rule's code may parse.
            return result.for_code()

        return run

    caller = who("") if mode != "dry_run" else None
    return [
        StructuredTool(
            name=t.name,
            description=t.description or t.name,
            args_schema=t.input_schema or {"type": "object", "properties": {}},
            func=make(t.name),
        )
        for t in server.tools.all()
        if _offered(caller, server, t, contracts)
    ]


def _write(caller: gate.GateCall, server: McpServer, tool_name: str) -> bool:
    """Whether the gate applies a write's contract to ``caller``'s call of ``tool_name`` (a run asks a person first)."""
    tool = next(t for t in server.tools.all() if t.name == tool_name)
    return gate.contract_applied(who=caller, server=server, tool=tool).risk == ToolContract.Risk.WRITE


def _offered(
    caller: gate.GateCall | None, server: McpServer, tool: Any, contracts: Mapping[str, Any] | None = None
) -> bool:
    """Whether the stage may call ``tool``: as the gate reads it for ``caller`` (frozen in a published version's
    run), or where there is no caller (a dry run), callable now and frozen in ``contracts`` if given."""
    if caller is not None:
        return gate.offered(caller, server, tool)
    return bool(tool.callable) and (contracts is None or f"{server.mcp_id}/{tool.name}" in contracts)
