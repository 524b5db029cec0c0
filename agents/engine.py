"""The run engine: input guardrail → deterministic stage → LangGraph ReAct loop → output guardrail.

``execute(plan)`` takes everything a run needs as plain values (the bound servers are passed through to the
gate, which writes the audit) and returns a ``RunOutcome``; it never raises for a tool's or a model's
failure. Every tool call, deterministic or the model's, goes through ``mcpregistry.gate``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import re
import time
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from django.conf import settings as django_settings
from django.core.exceptions import ValidationError as DjangoValidationError
from django.utils.translation import gettext as _
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    messages_from_dict,
    messages_to_dict,
)
from langchain_core.messages.ai import UsageMetadata
from langgraph.errors import GraphRecursionError
from pydantic import ValidationError

from agents.answers import (
    all_calls_failed_text,
    compose_offline_answer,
    no_rule_matched_text,
    system_message_text,
    text_of,
)
from agents.config_cache import tools_served
from agents.deterministic import ParamsRenderError, RuleSpec, render_params
from agents.deterministic_stage import StageInput, deterministic_stage
from agents.errors import MUST_PROPAGATE, RunCancelled
from agents.flow_runner import FlowCallIds, FlowParked, FlowResult, FlowSettings, FlowTooManyCalls, flow_run
from agents.graph import (
    MaxIterationsReached,
    build_react_graph,
    history_answer,
    is_history_answer,
    model_turn_count,
    turn_calls,
    unanswered_tool_calls,
)
from agents.llm import build_chat_model
from agents.mcp_context import (
    READ_RESOURCE_TOOL,
    McpContextSettings,
    context_block,
    mcp_context_settings,
    read_resource_spec,
)
from agents.model_texts import attempts_text, empty_turn_text, model_failure_text, unfinished_turn_text
from agents.model_tracing import ModelCallTracer
from agents.models import Run
from agents.parallel_calls import ParallelCalls, call_batch
from agents.providers import (
    UNFINISHED_TURN_CODES,
    ModelCallFailed,
    answered_without_choice,
    guardrail_intervention,
    model_error_kind,
    stop_reason,
    stored_model_params,
    supports_tool_choice,
)
from agents.run_state import counts_as_failed
from agents.selectors import tool_name_conflicts
from agents.tool_offer import ToolOffer, tool_doc
from agents.tool_selection import (
    EmbeddingRanker,
    LexicalRanker,
    Ranker,
    Selection,
    ToolSelectionSettings,
    tool_selection_settings,
)
from agents.tools import ToolFailure
from audit.masking import mask_text, mask_value, register_secrets
from audit.visible import invisible_characters, readable_text, visible_text
from mcpregistry import gate
from mcpregistry.contracts import frozen_out_of_date, gate_filled_argument, schema_with_contract
from mcpregistry.gate_records import contract_of
from mcpregistry.models import McpServer, McpTool

logger = logging.getLogger(__name__)


PREFIX_TRACE_TYPES = frozenset(
    {
        "rule",
        "deterministic_call",
        "approval",
        "tool_selection",
        "resource",
        "prompt",
        "tool_withdrawn",
        "history_left_out",
    }
)


@dataclass
class RunPlan:
    run_id: Any
    query: str
    context: dict[str, Any]
    a2a_data: list[dict[str, Any]]
    a2a_files: list[dict[str, Any]]
    system_prompt: str
    deterministic_instruction: str
    answer_template: str
    provider: str
    model_id: str
    model_params: dict[str, Any]
    max_iterations: int
    servers: list[McpServer]
    rules: list[RuleSpec]
    actor: str = ""
    answer_from_deterministic: bool = False
    # The agent's language (for texts an end user reads) and its answer when no rule matched (offline provider).
    language: str = ""
    no_match_answer: str = ""
    mode: str = "react"
    flow_graph: str = ""
    approvals: gate.ApprovalPort | None = None
    check_cancelled: Callable[[], None] = lambda: None
    # Seconds left before the run's time limit (None: no limit): a flow's coroutine is cancelled then, not left
    # running in its thread.
    time_left: Callable[[], float | None] = lambda: None
    # Progress as it happens (rule decisions, deterministic results, model turns, tool calls): the run's events.
    emit: Callable[[str, dict[str, Any]], None] = lambda kind, data: None
    # Several events at once (one insert), e.g. the deterministic stage's rule decisions in a row.
    emit_many: Callable[[list[tuple[str, dict[str, Any]]]], None] | None = None
    # Resuming a parked run: what the earlier pass left.
    conversation: list[dict[str, Any]] = field(default_factory=list)
    previous_results: list[dict[str, Any]] = field(default_factory=list)
    previous_trace: list[dict[str, Any]] = field(default_factory=list)
    # Why the run exists (agents.Run.Purpose): an eval or shadow run's calls are audited under its purpose and its
    # writes are blocked except on the sandbox servers.
    purpose: str = "live"
    write_sandbox: frozenset[str] = frozenset()
    # The agent's top-K tool selection and forced first call (``agents.tool_selection.ToolSelectionSettings``).
    tool_selection: dict[str, Any] = field(default_factory=dict)
    # Independent read calls of one model turn run concurrently, at most this many at once (1: one by one),
    # and at most ``parallel_per_server`` on one server.
    parallel_per_run: int = 4
    parallel_per_server: int = 2
    # MCP resources read as context, an MCP prompt as the system prompt (``agents.mcp_context``).
    mcp_context: dict[str, Any] = field(default_factory=dict)
    # The agent's model API key (decrypted on the worker; masked wherever it could show).
    model_api_key: str | None = None
    # The tokens the run may use (its smallest budget reservation): the run stops once its model calls reach it.
    token_ceiling: int | None = None
    # The tokens the run's model calls spent before this pass (every earlier pass and delivery, a lost worker's
    # included: ``agents.budgets.run_spent_usage``): the ceiling counts from there. The stored conversation's turns
    # are among them; the larger of the two counts, never their sum.
    spent_before: int = 0
    # A run of a published agent version: the tool contracts frozen with it (``mcpregistry.gate.GateCall``).
    frozen_contracts: dict[str, Any] | None = None
    # The conversation so far (A2A ``contextId``): the earlier turns' questions and answers, oldest first, given to
    # the model before this run's question (``agents.execution.conversation_history``).
    history: list[dict[str, str]] = field(default_factory=list)


@dataclass
class RunOutcome:
    status: Literal["succeeded", "failed", "awaiting_approval", "cancelled"]
    answer: str = ""
    parked_on: str | None = None
    conversation: list[dict[str, Any]] = field(default_factory=list)
    error_code: str = ""
    error_message: str = ""
    deterministic_results: list[dict[str, Any]] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    token_usage: dict[str, int] = field(default_factory=dict)
    # Tool calls (deterministic and the model's) that failed; the answer may rest on fewer results than asked.
    tool_failures: int = 0


class _Clock:
    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.tools_ms = 0.0

    def ms_since(self, t0: float) -> float:
        return round((time.perf_counter() - t0) * 1000, 2)


def _secrets(plan: RunPlan) -> list[str]:
    found = [s for server in plan.servers for s in server.secret_values()]
    return [*found, plan.model_api_key] if plan.model_api_key else found


def _offline_answer(plan: RunPlan, results: list[dict[str, Any]]) -> str:
    return compose_offline_answer(
        query=plan.query,
        results=results,
        answer_template=plan.answer_template,
        no_match_text=no_rule_matched_text(agent_text=plan.no_match_answer, language=plan.language),
        language=plan.language,
    )


# The tool names both providers take: Converse's ToolName and Chat Completions' function name.
MODEL_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def model_tool_names(exposed_names: Sequence[str]) -> dict[str, str]:
    """Each tool's exposed name (``McpTool.exposed_name``) → the name the model is given. A name the providers take
    (``MODEL_TOOL_NAME``) is given as it is; another (MCP allows ``projects.list``, ``직원 검색`` or 100 characters,
    which Converse and Chat Completions refuse, failing every call of the run) is given an alias: its runs of other
    characters as ``_``, or, where that is empty, too long, or another tool's name (or the platform's
    ``read_resource``), the same cut to 55 characters with ``_`` and 8 hex digits of a digest (``_digest_alias``).
    No two tools get one alias, and the same names give the same aliases whatever their order, on every pass of a
    run (a parked run resumes with the names its conversation holds)."""
    valid = [name for name in exposed_names if MODEL_TOOL_NAME.fullmatch(name)]
    names = {name: name for name in valid}
    taken = {*valid, READ_RESOURCE_TOOL}
    for name in sorted(set(exposed_names) - set(valid)):  # sorted: the aliases do not depend on the order given
        alias = re.sub(r"[^A-Za-z0-9_-]+", "_", name).strip("_")
        if not alias or len(alias) > 64 or alias in taken:
            alias = _digest_alias(name, stem=(alias or "tool")[:55], taken=taken)
        taken.add(alias)
        names[name] = alias
    return names


def _digest_alias(name: str, *, stem: str, taken: set[str]) -> str:
    """``stem``, ``_`` and 8 hex digits of a digest, an alias no name in ``taken`` has: the digest of the name's NFC
    form (the alias the name has always had), or, where that is taken, of that form with a count, the first that is
    free. A digest alias can be another tool's valid name (``a_b_2e7336dc`` beside ``a.b``), and two names that
    differ only in their Unicode form (``직원검색`` composed, and decomposed as text written on macOS arrives) have
    one NFC digest: given one alias, one of the two tools would vanish from the run and its calls reach the other."""
    normal = unicodedata.normalize("NFC", name)
    count = 0
    while True:
        seed = normal if count == 0 else f"{normal}\n{count}"
        alias = f"{stem}_{hashlib.sha256(seed.encode()).hexdigest()[:8]}"
        if alias not in taken:
            return alias
        count += 1


def _tool_index(
    plan: RunPlan, left_out: list[tuple[McpServer, McpTool]] | None = None
) -> dict[str, tuple[McpServer, McpTool]]:
    """The tools the run may call (``tools_served``, less ``left_out``: ``tools_left_out``, found here where the
    caller has not), by the name the model sees (``model_tool_names``): the model's calls are resolved here to their
    server and tool, whose own name the gate, the audit and the events carry."""
    if left_out is None:
        left_out = tools_left_out(plan)
    left = {(server.mcp_id, mcp_tool.name) for server, mcp_tool in left_out}
    served = [
        (server, mcp_tool)
        for server, mcp_tool in tools_served(plan.servers, plan.frozen_contracts)
        if (server.mcp_id, mcp_tool.name) not in left
    ]
    names = model_tool_names([mcp_tool.exposed_name for _server, mcp_tool in served])
    return {names[mcp_tool.exposed_name]: (server, mcp_tool) for server, mcp_tool in served}


def tools_left_out(plan: RunPlan) -> list[tuple[McpServer, McpTool]]:
    """A published version's tools (``tools_served``) whose frozen contract no longer fits the tool's input schema
    as discovered now (``contract_out_of_date``: the server changed its arguments after the publish). The gate
    applies the version's contract, never the draft's fitted one, so the model would be offered both lists of
    arguments and every call refused: the tool is not offered until the agent is published again. None for a run
    of an agent never published (the registry's contracts, fitted when a schema's review is approved)."""
    frozen = plan.frozen_contracts
    if frozen is None:
        return []
    return [
        (server, mcp_tool)
        for server, mcp_tool in tools_served(plan.servers, frozen)
        if frozen_out_of_date(frozen, server.mcp_id, mcp_tool)
    ]


def _tools_left_out_told(plan: RunPlan, left_out: list[tuple[McpServer, McpTool]], trace: list[dict[str, Any]]) -> None:
    """Each of ``left_out`` (``tools_left_out``) in the run's trace, in words, and in the worker's log: live traffic
    lost the tool until the agent is published again, and an admin must learn why (the version's page says so too)."""
    if not left_out:
        return
    version = _version_label(plan.run_id)
    for server, mcp_tool in left_out:
        logger.warning(
            "run %s: tool %s of server %s is not offered: the contract %s froze does not fit its arguments now; "
            "publish the agent again",
            plan.run_id,
            mcp_tool.name,
            server.mcp_id,
            version,
        )
        message = _(
            "Tool %(tool)s of server %(server)s is left out: the contract %(version)s froze for it does not fit "
            "the arguments its server lists now. Fit the tool's contract and publish the agent again."
        ) % {"tool": mcp_tool.exposed_name, "server": server.mcp_id, "version": version}
        trace.append(
            {
                "type": "tool_left_out",
                "mcp_id": server.mcp_id,
                "tool": mcp_tool.exposed_name,
                "version": version,
                "message": message,
            }
        )


def _failed_call(message: ToolMessage) -> bool:
    """Whether a tool message answers a call that failed: with its failure, or with its fallback's answer."""
    return message.status == "error" or (
        isinstance(message.artifact, dict) and bool(message.artifact.get("fallback_for"))
    )


def _version_label(run_id: Any) -> str:
    """The version the run runs as the admin names it (``v3``), for the words of a note; ``v?`` for a run that is
    not stored (a plan made by a test)."""
    try:
        number = Run.objects.filter(pk=run_id).values_list("version__number", flat=True).first()
    except (ValueError, DjangoValidationError):  # not a run's id at all
        number = None
    return f"v{number}" if number is not None else "v?"


def names_the_model_knows(index: Mapping[str, tuple[McpServer, McpTool]]) -> dict[Any, dict[str, str]]:
    """Per server (its pk), each of its tools' own and exposed names → the name the model is offered it by, where
    they differ (a server's tool prefix, an alias): the gate's messages name a server's tools by their own names
    (``'search' failed; use the fallback tool 'search_backup'``), which the model cannot call as such. A tool's
    own name wins over another's exposed one."""
    known: dict[Any, dict[str, str]] = {}
    for offered, (server, mcp_tool) in index.items():
        names = known.setdefault(server.pk, {})
        if mcp_tool.exposed_name != offered:
            names.setdefault(mcp_tool.exposed_name, offered)
    for offered, (server, mcp_tool) in index.items():
        if mcp_tool.name != offered:
            known[server.pk][mcp_tool.name] = offered
    return known


def results_as_offered(
    results: Sequence[Mapping[str, Any]],
    index: Mapping[str, tuple[McpServer, McpTool]],
    known_as: Mapping[Any, Mapping[str, str]],
) -> list[dict[str, Any]]:
    """The deterministic results as the model's system message gives them: each tool by the name the model is
    offered it by (``names_the_model_knows``: a server's tool prefix, an alias), and a failed call's advice
    rewritten the way ``ToolResult.for_model`` rewrites the model's own tool replies (``use the fallback tool
    'get_asset_status_backup'`` named a tool the model could not call by that name). The results stored with the
    run, its events and the offline answer keep the tools' own names."""
    by_mcp_id = {server.mcp_id: known_as.get(server.pk, {}) for server, _tool in index.values()}
    shown = []
    for result in results:
        names = by_mcp_id.get(result.get("mcp_id") or "", {})
        entry = dict(result)
        if isinstance(tool := result.get("tool"), str):
            entry["tool"] = names.get(tool, tool)
        if not result.get("ok") and (message := result.get("message")):
            entry["message"] = gate.ToolResult(ok=False, message=str(message)).for_model(names)
        shown.append(entry)
    return shown


def tool_specs(
    index: dict[str, tuple[McpServer, McpTool]], frozen_contracts: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """The tools as the model is told of them: name, description, and the input schema as discovered with the
    argument constraints of the contract the gate will apply written in (``schema_with_contract``; a published
    version's run: the contract it froze)."""

    def contract(server: McpServer, mcp_tool: McpTool) -> Any:
        if frozen_contracts is not None:
            return frozen_contracts.get(f"{server.mcp_id}/{mcp_tool.name}")
        return contract_of(mcp_tool)

    def parameters(server: McpServer, mcp_tool: McpTool) -> dict[str, Any]:
        applied = contract(server, mcp_tool)
        # A write's idempotency argument is the gate's to fill in: not offered to the model (``gate_filled_argument``).
        return schema_with_contract(
            mcp_tool.input_schema, getattr(applied, "args", None), idempotency_arg=gate_filled_argument(applied)
        )

    return [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": mcp_tool.description or mcp_tool.name,
                "parameters": parameters(server, mcp_tool),
            },
        }
        for name, (server, mcp_tool) in index.items()
    ]


def message_to_trace(message: BaseMessage, secrets: list[str]) -> dict[str, Any]:
    entry: dict[str, Any] = {"type": message.type, "content": mask_value(message.content, secrets=secrets)}
    if isinstance(message, AIMessage) and (calls := turn_calls(message)):
        # A call whose arguments did not parse is shown with them as the model wrote them (a text).
        entry["tool_calls"] = [
            {"id": c.get("id"), "name": c["name"], "args": mask_value(c["args"], secrets=secrets)} for c in calls
        ]
    if isinstance(message, AIMessage) and (intervention := guardrail_intervention(message.response_metadata or {})):
        entry["guardrail"] = mask_value(intervention, secrets=secrets)
    if isinstance(message, AIMessage) and is_history_answer(message):
        entry["history"] = True  # an earlier turn's answer (A2A contextId), given to the model: no turn of this run
    if isinstance(message, AIMessage) and usage_was_estimated(message):
        entry["usage_estimated"] = True  # its provider reported no usage: charged an upper bound of it
    if isinstance(message, ToolMessage):
        entry["tool_call_id"] = message.tool_call_id
        entry["name"] = message.name
        entry["status"] = message.status
        if isinstance(message.artifact, dict) and message.artifact.get("error"):
            entry["error"] = message.artifact["error"]
    return entry


def stored_conversation(messages: list[BaseMessage], secrets: list[str]) -> list[dict[str, Any]]:
    """The conversation as a parked run stores it to resume from: ``messages_to_dict`` masked, except each model
    turn's ``usage_metadata``, kept as it is where it holds only numbers. It is LangChain's own structure, validated
    when the run resumes (``messages_from_dict``): a count masked as text (a secret made of digits that equals one)
    would fail every resumed pass, and token counts are no secret."""
    stored: list[dict[str, Any]] = mask_value(messages_to_dict(messages), secrets=secrets)
    for message, entry in zip(messages, stored, strict=True):
        usage = getattr(message, "usage_metadata", None)
        if usage and _only_numbers(usage):
            entry["data"]["usage_metadata"] = copy.deepcopy(dict(usage))
    return stored


def _only_numbers(value: Any) -> bool:
    if isinstance(value, Mapping):
        return all(_only_numbers(item) for item in value.values())
    return type(value) in (int, float)


def readable_resources(servers: Sequence[McpServer]) -> dict[str, tuple[McpServer, str]]:
    """The resources the ``read_resource`` tool offers, by the name the model reads each by → its server and the URI
    that server listed. A URI one server lists is its own name; one that more than one lists (``docs://handbook`` on
    two document servers) is offered once per server as ``docs://handbook (hr-docs)``: offered once, every read went
    to one of them, and the other's document could never be read, without the model knowing. (A URI holds no
    space, RFC 3986, so the qualified name is no other resource's.)"""
    listed_by: dict[str, dict[str, McpServer]] = {}
    for server in servers:
        for resource in server.resources or []:
            if isinstance(resource, dict):
                listed_by.setdefault(str(resource.get("uri")), {})[server.mcp_id] = server
    readable: dict[str, tuple[McpServer, str]] = {}
    for uri, owners in listed_by.items():
        for mcp_id, server in owners.items():
            readable[uri if len(owners) == 1 else f"{uri} ({mcp_id})"] = (server, uri)
    return readable


def execute(plan: RunPlan) -> RunOutcome:
    """Run one query end to end, or resume a parked one. Returns a RunOutcome; a tool's or a model's failure
    never escapes, and a write call waiting for approval parks the run (status ``awaiting_approval``)."""
    clock = _Clock()
    secrets = _secrets(plan)
    if plan.model_api_key:
        # The model's key reaches the provider's HTTP client: whatever it logs (at DEBUG) is masked too.
        register_secrets([plan.model_api_key])
    memo: dict[str, gate.ToolResult] = {}
    # Rule decisions and deterministic calls of an earlier (parked) pass are kept; messages are rebuilt.
    trace: list[dict[str, Any]] = [e for e in plan.previous_trace if e.get("type") in PREFIX_TRACE_TYPES]
    outcome = RunOutcome(status="succeeded")

    def who(source: str, call_id: str) -> gate.GateCall:
        live = plan.purpose == "live"
        return gate.GateCall(
            source=(source if live else plan.purpose),  # type: ignore[arg-type]
            run_id=plan.run_id,
            actor=plan.actor,
            call_id=call_id,
            memo=memo,
            approvals=plan.approvals,
            writes_blocked=not live,
            write_sandbox=plan.write_sandbox,
            contracts=plan.frozen_contracts,
            # No model reads the deterministic stage's suggestions in an offline run; a flow's code reads its
            # failures itself (``ToolFailure``) and decides.
            follow_fallback=plan.provider == "offline" and source == "deterministic",
        )

    t0 = time.perf_counter()
    failed: RunOutcome | None = None
    if plan.conversation:
        results = [dict(r) for r in plan.previous_results]
    elif plan.mode == "flow":
        # Seed 000: a flow calls its tools in its own nodes (MCPHandle), never through deterministic rules; the stage's
        # results would reach no node, and its calls would only repeat the flow's (or fail it for a rule's sake).
        results = []
    else:
        stage_input = StageInput(
            query=plan.query,
            context=plan.context,
            a2a_data=plan.a2a_data,
            a2a_files=plan.a2a_files,
            servers=plan.servers,
            rules=plan.rules,
            run_id=plan.run_id,
            actor=plan.actor,
            trace=trace,
            emit=plan.emit,
            emit_many=plan.emit_many,
            previous_results=plan.previous_results,
            contracts=plan.frozen_contracts,
            # Before each of the stage's calls, as the ReAct loop checks before each step: a run cancelled, out of
            # time or taken over sends nothing more, an approved write included.
            check=plan.check_cancelled,
        )
        try:
            stage = deterministic_stage(stage_input, mode="execute", who=lambda call_id: who("deterministic", call_id))
        except RunCancelled:
            # Stopped before one of its calls: the run ends as the ReAct loop ends one stopped between its steps
            # (the task tells a lost claim or a time limit apart by ``RunStopped``'s reason). The results are the
            # earlier passes'; this pass's calls are in the trace, the events and the audit.
            results = [dict(r) for r in plan.previous_results if r.get("error") != "approval:pending"]
            failed = RunOutcome(status="cancelled", error_code="cancelled", error_message="the run was cancelled")
        else:
            results = stage.results
            if stage.failure is None and stage.parked_on is None:
                # Seed 000's wording: an operator checks the server log for this line.
                logger.info("Deterministic pre-step 완료: %d건", len(results))
            if stage.failure is not None:
                failed = RunOutcome(status="failed", error_code=stage.failure.code, error_message=stage.failure.message)
            elif stage.parked_on is not None:
                failed = RunOutcome(status="awaiting_approval", parked_on=stage.parked_on)
    deterministic_ms = clock.ms_since(t0)
    public_results = [{k: v for k, v in r.items() if k != "answer_template"} for r in results]
    outcome.deterministic_results = results
    outcome.tool_failures = sum(1 for r in results if counts_as_failed(r))
    if failed is not None:
        failed.deterministic_results = results
        failed.tool_failures = outcome.tool_failures
        failed.messages = trace
        failed.timings = {"deterministic_ms": deterministic_ms, "total_ms": clock.ms_since(clock.started)}
        return failed

    if plan.provider == "offline" and plan.mode != "flow" and results and not any(r.get("ok") for r in results):
        # The answer would rest on calls that all failed and no model can recover: the run fails, saying so (with
        # what a read tool's own error said: seed 001's "등록된 자산: …" is what the user needs to ask again).
        codes = [r.get("error") or "" for r in results]
        trace.append({"type": "outcome", "reason": "deterministic:tool_failed", "tool_errors": codes})
        return RunOutcome(
            status="failed",
            error_code="deterministic:tool_failed",
            error_message=all_calls_failed_text(language=plan.language, results=results),
            deterministic_results=results,
            tool_failures=outcome.tool_failures,
            messages=trace,
            timings={"deterministic_ms": deterministic_ms, "total_ms": clock.ms_since(clock.started)},
        )

    conflicts = tool_name_conflicts(plan.servers)
    if conflicts:
        names = ", ".join(sorted(conflicts))
        return RunOutcome(
            status="failed",
            error_code="config:tool_name_conflict",
            error_message=f"the agent's servers expose the same tool name(s): {names}; set a tool name prefix",
            deterministic_results=results,
            messages=trace,
        )

    if plan.mode == "flow":
        return _execute_flow(plan, outcome, trace, who, secrets, clock, deterministic_ms)

    if plan.answer_from_deterministic and results and all(r["ok"] for r in results) and not plan.conversation:
        # Every matched call succeeded: the answer is composed from them, no model round trip.
        outcome.answer = mask_text(_offline_answer(plan, results), secrets=secrets)
        trace.append({"type": "answer", "content": outcome.answer, "composed_from": "deterministic_results"})
        outcome.messages = trace
        outcome.token_usage = {
            "input_tokens": 0,
            "output_tokens": 0,
            "total_tokens": 0,
            "model_calls": 0,
            "model_calls_saved": 1,
        }
        outcome.timings = {
            "deterministic_ms": deterministic_ms,
            "model_ms": 0.0,
            "tools_ms": 0.0,
            "total_ms": clock.ms_since(clock.started),
        }
        return outcome

    # The model is made before the tool offer: its own forcing choice (``model_params.tool_choice``) is the offer's.
    try:
        model = build_chat_model(
            provider=plan.provider,
            model_id=plan.model_id,
            params=plan.model_params,
            offline_answer=_offline_answer(plan, results),
            api_key=plan.model_api_key,
            # A budgeted run's call that timed out or was cut after its request reached the provider is not sent
            # again: the provider may have finished (and billed) it without the answer reaching us, its tokens are
            # never reported, and a second send could spend past the reservation that bounds each call once (README,
            # Budgets). Only a call that could not connect (a connect timeout among them) is sent again.
            retry_sent_requests=plan.token_ceiling is None,
            check_cancelled=plan.check_cancelled,  # a cancelled run's failed call is not sent again
            # Each call sent but unanswered is charged an estimate (``charge_unanswered``, made below).
            on_unanswered_call=lambda kind: charge_unanswered(kind),
        )
    except MUST_PROPAGATE:
        raise
    except Exception as exc:  # noqa: BLE001 - no model to be had: the run fails as a value, never a crash
        # A ValueError says why (an unknown or disallowed provider, parameters it cannot use, no AWS region);
        # anything else the SDK raised while making its client is classified as a call's failure would be.
        kind = "unavailable" if isinstance(exc, ValueError) else model_error_kind(exc)
        detail = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
        return RunOutcome(
            status="failed",
            error_code=f"model:{'unavailable' if kind == 'error' else kind}",
            error_message=_with_detail(_("The agent's model could not be set up for this run."), detail, secrets),
            deterministic_results=results,
            messages=trace,
        )

    left_out = tools_left_out(plan)  # a published version's tools its frozen contracts no longer fit
    index = _tool_index(plan, left_out)
    _tools_left_out_told(plan, left_out, trace)
    known_as = names_the_model_knows(index)
    specs = tool_specs(index, plan.frozen_contracts)  # once per run: the offer and the graph share them
    try:
        offer = _tool_offer(
            plan,
            index,
            specs,
            results,
            trace,
            who("agent", ""),
            model_choice=getattr(model, "first_turn_tool_choice", None),
        )
        context_settings = mcp_context_settings(plan.mcp_context)
    except ValueError as exc:  # a stored setting that no longer validates: the run fails as a value
        return RunOutcome(
            status="failed",
            error_code="config:agent",
            error_message=str(exc),
            deterministic_results=results,
            messages=trace,
        )
    enabled_servers = {s.mcp_id: s for s in plan.servers if s.enabled}
    resources = readable_resources(list(enabled_servers.values()))
    if context_settings.read_resource_tool and resources:
        if READ_RESOURCE_TOOL in index:
            # A bound server's own tool has the name: the model's calls to it go to that tool, and the platform's
            # is not offered beside it (two tools of one name; a call could not say which it meant).
            owner, _clash = index[READ_RESOURCE_TOOL]
            trace.append(
                {
                    "type": "resource_tool",
                    "offered": False,
                    "error": "config:tool_name_conflict",
                    "mcp_id": owner.mcp_id,
                    "message": _(
                        "The read_resource tool is not offered: the server %(mcp_id)s has a tool of that name. "
                        "Set a tool name prefix on that server."
                    )
                    % {"mcp_id": owner.mcp_id},
                }
            )
        else:
            offer.extra_specs[READ_RESOURCE_TOOL] = read_resource_spec(list(resources))

    def call_tool(tool_call: dict[str, Any], sent: gate.ToolResult | None = None) -> tuple[ToolMessage, str | None]:
        """One call: refused here (unknown, not offered, withdrawn) or sent through the gate; ``sent`` is the
        gate's answer when the call already ran in a parallel batch. Raises ``RunCancelled`` (nothing sent,
        nothing audited) where the run must stop: a model turn's later calls are not sent once the run is
        cancelled, out of time or taken over after its earlier ones, as a flow's and a rule's are not."""
        if sent is None:
            plan.check_cancelled()
        name, call_id = tool_call["name"], tool_call.get("id") or ""
        found = index.get(name)
        args = tool_call.get("args")
        withdrawn_now = False
        if sent is not None:
            result = sent
            withdrawn_now = offer.record(name, result.error)
        elif found is None and name == READ_RESOURCE_TOOL and READ_RESOURCE_TOOL in offer.extra_specs:
            uri = str((args or {}).get("uri", "")) if isinstance(args, dict) else ""
            resource = resources.get(uri)
            if resource is None:
                result = gate.refuse_call(
                    tool_name=name,
                    args=args,
                    who=who("agent", call_id),
                    reason="resource:unknown",
                    message=_("Resource '%(uri)s' is not available. Use one of: %(uris)s.")
                    % {"uri": uri, "uris": ", ".join(sorted(resources))},
                )
            else:
                owner, listed_uri = resource
                result = gate.read_resource(server=owner, uri=listed_uri, who=who("agent", call_id))
        elif found is None:
            result = gate.refuse_unknown(
                tool_name=name, args=args, who=who("agent", call_id), offered=list(offer.offered)
            )
        else:
            server, mcp_tool = found
            verdict = offer.check(name)
            # Audited by the tool's own (exposed) name, not the alias the model may know it by.
            if verdict == "withdrawn":
                result = gate.refuse_withdrawn(
                    tool_name=mcp_tool.exposed_name,
                    args=args,
                    who=who("agent", call_id),
                    mcp_id=server.mcp_id,
                    corrections=offer.corrections.get(name, 0),
                )
            elif verdict == "not_offered":
                result = gate.refuse_not_offered(
                    tool_name=mcp_tool.exposed_name,
                    args=args,
                    who=who("agent", call_id),
                    offered=offer.offered,
                    mcp_id=server.mcp_id,
                    offered_later=offer.offered_later(name),
                )
            else:
                result = gate.call(server=server, tool_name=mcp_tool.name, args=args, who=who("agent", call_id))
                withdrawn_now = offer.record(name, result.error)
        tool_name = found[1].exposed_name if found is not None else name  # the tool's own, for the trace
        if withdrawn_now:
            result.message = f"{result.message} " + _(
                "Tool '%(tool)s' is now withdrawn for the rest of this run after %(count)d calls with invalid "
                "arguments; do not call it again."
            ) % {"tool": name, "count": offer.corrections[name]}
            trace.append({"type": "tool_withdrawn", "tool": tool_name, "corrections": offer.corrections[name]})
        clock.tools_ms += result.latency_ms
        plan.emit("tool_call", {"source": "agent", "call_id": call_id, **result.as_dict()})
        if result.error == "approval:pending":
            trace.append(
                {"type": "approval", "approval_id": result.approval_id, "tool": tool_name, "args": result.args}
            )
            return ToolMessage(content="", tool_call_id=call_id), result.approval_id
        status = "success" if result.ok else "error"
        names = known_as.get(found[0].pk, {}) if found is not None else {}
        message = ToolMessage(content=result.for_model(names), tool_call_id=call_id, name=name, status=status)
        if result.error:
            # Kept with the conversation (never sent to the model): a resumed run recounts its argument errors.
            message.artifact = {"error": result.error}
        elif result.fallback_for:
            message.artifact = {"fallback_for": result.fallback_for}  # a failed call, answered by its fallback
        return message, None

    calls_per_turn = max_tool_calls_per_turn()
    # Each call's result by its call id, as the graph gets it: a run that stops inside the graph (a failed model
    # call, its iterations used up) keeps them with the turns that asked for them (``_conversation_so_far``).
    answered: dict[str, ToolMessage] = {}

    def call_tool_recorded(
        tool_call: dict[str, Any], sent: gate.ToolResult | None = None
    ) -> tuple[ToolMessage, str | None]:
        message, parked_on = call_tool(tool_call, sent)
        if parked_on is None:
            answered[message.tool_call_id] = message
        return message, parked_on

    def refuse_over_cap(tool_call: dict[str, Any]) -> ToolMessage:
        """A call of a model turn past the turn's cap (``PLATFORM_MAX_TOOL_CALLS_PER_TURN``): refused and
        audited, never sent; the model is told to ask for fewer at once."""
        name, call_id = tool_call["name"], tool_call.get("id") or ""
        found = index.get(name)
        refusal = gate.refuse_call(
            tool_name=found[1].exposed_name if found is not None else name,
            args=tool_call.get("args"),
            who=who("agent", call_id),
            reason=TOO_MANY_CALLS,
            message=_(
                "Not called: a model turn may ask for at most %(limit)d tool calls, and this call came after them. "
                "Ask for fewer calls at once; call it again in a later turn if you still need it."
            )
            % {"limit": calls_per_turn},
            mcp_id=found[0].mcp_id if found is not None else None,
        )
        message, _parked = call_tool_recorded(tool_call, refusal)
        return message

    parallel = ParallelCalls(
        index=index,
        offer=offer,
        who=who,
        per_run=plan.parallel_per_run,
        per_server=plan.parallel_per_server,
        trace=trace,
        emit=plan.emit,
        check_cancelled=plan.check_cancelled,
    )

    if plan.conversation:
        messages: list[BaseMessage] = list(messages_from_dict(plan.conversation))
        # A parked run resumes with the argument errors it had counted: a withdrawn tool stays withdrawn.
        offer.restore_corrections(messages)
    else:
        system_prompt, attachment = _mcp_context(plan, context_settings, enabled_servers, who, trace)
        text = system_message_text(
            system_prompt=system_prompt,
            deterministic_instruction=plan.deterministic_instruction,
            results=results_as_offered(results, index, known_as),
        )
        earlier: list[BaseMessage] = []
        for turn in plan.history:
            # Marked: an earlier turn's answer is no model turn of this run (its iterations, its forced first turn).
            earlier += [HumanMessage(turn["query"]), history_answer(turn["answer"])]
        system_text = "\n\n".join(part for part in (text, attachment) if part)
        messages = [SystemMessage(system_text), HumanMessage(plan.query)]
        if earlier and plan.token_ceiling is not None and plan.provider != "offline":
            fitted = _history_within_reservation(earlier, messages, [*specs, *offer.extra_specs.values()], plan)
            if len(fitted) < len(earlier):
                # Said in the trace: a reader of the run sees why the model did not know what was said before.
                dropped, given = (len(earlier) - len(fitted)) // 2, len(fitted) // 2
                trace.append(
                    {"type": "history_left_out", "turns": dropped, "kept": given, "token_ceiling": plan.token_ceiling}
                )
            earlier = fitted
        messages = [messages[0], *earlier, messages[1]]
    # What the run spent before this pass: its stored conversation's turns, or (a run taken over from a lost
    # worker, whose turns were never stored) what its model_turn events say, whichever is more.
    spent_tokens = [max(_tokens_of(messages), plan.spent_before)]
    new_turns: list[AIMessage] = []
    unread_turns: list[AIMessage] = []  # replies that arrived but could not be read (``ModelCallFailed.usage``)
    # The call under way: its input bound and the ``max_tokens`` it was given (``before_model_call``), which a
    # turn whose provider reports no usage is charged (``usage_estimate``); whether the run has warned of one.
    call_bounds: list[tuple[int, int | None]] = [(0, None)]
    estimated: list[bool] = [False]

    def on_model_turn(message: AIMessage) -> None:
        if plan.provider != "offline" and not _usage_reported(message):
            # Charged nothing, such a turn made the run free and its later calls' caps as large as the whole
            # reservation: the ceiling and the budget held nothing.
            input_bound, max_tokens = call_bounds[0]
            usage_estimate(message, input_bound=input_bound, max_tokens=max_tokens)
            if not estimated[0]:
                estimated[0] = True
                logger.warning(
                    "run %s: the model (%s %s) reported no token usage; each such turn is charged an upper bound",
                    plan.run_id,
                    plan.provider,
                    plan.model_id,
                )
        # The turn's tokens travel with its event: a run that ends without storing an outcome (cancelled, timed
        # out, its worker lost) is charged from these (``agents.budgets.run_spent_usage``).
        plan.emit("model_turn", {**message_to_trace(message, secrets), "usage": _token_usage([message])})
        spent_tokens[0] += _tokens_of([message])
        new_turns.append(message)
        # A turn that calls tools needs another call, which nothing is left for; a final answer that fit its call's
        # cap is the run's answer (a turn charged its cap in full, as an estimate may be, spends the reservation
        # exactly: the call was allowed, and its answer is kept).
        ceiling = plan.token_ceiling
        if ceiling is not None and (spent_tokens[0] > ceiling or (spent_tokens[0] == ceiling and turn_calls(message))):
            raise TokenCeilingReached(
                f"the run used {spent_tokens[0]} tokens, its budget reservation is {plan.token_ceiling}"
            )
        stopped = stop_reason(message.response_metadata or {})
        if stopped in UNFINISHED_TURN_CODES and turn_calls(message):
            # A call cut off is half written (its arguments end mid-way), and a filtered or malformed one is no call
            # to trust: it must never run, and asked again under the same limit (the same filter) the model would
            # be stopped again on every iteration.
            raise ToolCallsCutShort(stopped)

    def charge_unanswered(kind: str) -> None:
        # A call that timed out or was cut after its request was (or may have been) sent: the provider may have read
        # its prompt and written up to its ``max_tokens``, and billed them, with no usage told. Charged that bound,
        # as a turn is (its event), marked estimated; kept out of the conversation, as an unread reply is. Each
        # such attempt, those sent again (a run without a budget) included.
        input_bound, max_tokens = call_bounds[0]
        unanswered = unanswered_call_estimate(input_bound=input_bound, max_tokens=max_tokens)
        unread_turns.append(unanswered)
        spent_tokens[0] += _tokens_of([unanswered])
        plan.emit(
            "model_turn",
            {**message_to_trace(unanswered, secrets), "usage": _token_usage([unanswered]), "unanswered": kind},
        )

    configured_max_tokens = _configured_max_tokens(plan.model_params)
    previous_specs: list[str | None] = [None]

    def before_model_call(messages: Sequence[BaseMessage], specs: list[dict[str, Any]]) -> dict[str, Any]:
        # The call may spend at most what is left of the reservation: its input bound must fit, and its output is
        # capped to the rest (see ``input_token_bound`` and the README's Budgets). The offline model reads nothing
        # and spends no token: its turn is no call to bound (a small reservation failed every offline run). A run
        # without a budget bounds its calls too: a turn whose provider reports no usage is charged the bound.
        if plan.provider == "offline":
            return {}
        specs_json = json.dumps(specs, ensure_ascii=False, sort_keys=True, default=str)
        input_bound = input_token_bound(messages, specs_json=specs_json, previous_specs_json=previous_specs[0])
        previous_specs[0] = specs_json
        if plan.token_ceiling is None:
            call_bounds[0] = (input_bound, configured_max_tokens)
            return {}
        left = plan.token_ceiling - spent_tokens[0]
        if input_bound >= left:
            raise TokenCeilingReached(
                f"the run used {spent_tokens[0]} tokens and its next model call may read {input_bound}; its budget "
                f"reservation is {plan.token_ceiling}"
            )
        max_tokens = left - input_bound
        if configured_max_tokens is not None:
            max_tokens = min(max_tokens, configured_max_tokens)
        call_bounds[0] = (input_bound, max_tokens)
        return {"max_tokens": max_tokens}

    graph = build_react_graph(
        model=model,
        tool_specs=specs,
        call_tool=call_tool_recorded,
        max_iterations=max(plan.max_iterations, 1),
        check_cancelled=plan.check_cancelled,
        on_model_turn=on_model_turn,
        turn_tools=offer.turn_tools,
        call_batch=lambda calls: call_batch(calls, call_tool=call_tool_recorded, parallel=parallel),
        before_model_call=before_model_call,
        max_calls_per_turn=calls_per_turn,
        refuse_over_cap=refuse_over_cap,
    )
    t1 = time.perf_counter()
    final_messages: list[BaseMessage] = messages
    previous_turns = model_turn_count(messages)  # this run's, from an earlier pass (a parked run resumed)
    try:
        state = graph.invoke(
            {
                "messages": messages,
                "metadata": {"deterministic_results": public_results},
                "model_turns": previous_turns,
            },
            config={
                "recursion_limit": 4 * max(plan.max_iterations, 1) + 10,
                "callbacks": [ModelCallTracer(provider=plan.provider, model=plan.model_id)],
            },
        )
        final_messages = list(state["messages"])
        if state.get("parked_on"):
            outcome.status = "awaiting_approval"
            outcome.parked_on = state["parked_on"]
        else:
            last = final_messages[-1] if final_messages else None
            answer = text_of(last.content) if isinstance(last, AIMessage) else ""
            metadata = (last.response_metadata or {}) if isinstance(last, AIMessage) else {}
            stopped = stop_reason(metadata)
            failure = UNFINISHED_TURN_CODES.get(stopped or "", "")
            if failure:
                # A text cut short (or filtered) reads as a whole answer: the run fails rather than pass it off.
                outcome.error_message = unfinished_turn_text(failure)
            elif not answer.strip():
                failure = "model:empty"
                outcome.error_message = empty_turn_text(no_choice=answered_without_choice(metadata))
            if failure:
                logger.warning("model failure in run %s: %s", plan.run_id, failure)
                outcome.status, outcome.error_code = "failed", failure
                trace.append({"type": "outcome", "reason": failure, **({"stop_reason": stopped} if stopped else {})})
            else:
                outcome.answer = mask_text(answer, secrets=secrets)
    except TokenCeilingReached as exc:
        # The graph's state ends before the turn that crossed the ceiling: its turns are counted from here.
        final_messages = _conversation_so_far(messages, new_turns, answered)
        outcome.status = "failed"
        outcome.error_code = "budget:run_ceiling"
        outcome.error_message = str(exc)
    except ToolCallsCutShort as exc:
        # The cut turn is kept (its tokens were spent and are charged); none of its calls was sent.
        logger.warning("model failure in run %s: %s (a tool call stopped short)", plan.run_id, exc.code)
        final_messages = _conversation_so_far(messages, new_turns, answered)
        outcome.status, outcome.error_code = "failed", exc.code
        outcome.error_message = unfinished_turn_text(exc.code)
        trace.append({"type": "outcome", "reason": exc.code, "stop_reason": exc.stop_reason})
    except (MaxIterationsReached, GraphRecursionError):
        final_messages = _conversation_so_far(messages, new_turns, answered)  # the turns it made, kept
        outcome.status = "failed"
        outcome.error_code = "max_iterations"
        # Stored in English, as the workers' own texts are: the admin's run page reads it back in its reader's
        # language (``agents.admin_runs._KNOWN_MESSAGES``, which matches the English text).
        outcome.error_message = f"the agent did not finish within {plan.max_iterations} iterations"
    except RunCancelled:
        # Cancelled, out of time or taken over between its steps: the turns it made are kept, their tokens were
        # spent (a run stopped by its time limit recorded 0 tokens and no model call under its model turns).
        final_messages = _conversation_so_far(messages, new_turns, answered)
        outcome.status = "cancelled"
        outcome.error_code = "cancelled"
        outcome.error_message = "the run was cancelled"
    except MUST_PROPAGATE:
        raise  # the task's time limit or a database hiccup: handled (and retried) by the task, not a model error
    except ModelCallFailed as exc:  # the provider's failure, after the retries its kind allows
        logger.warning("model failure in run %s: %s", plan.run_id, exc.code)
        final_messages = _conversation_so_far(messages, new_turns, answered)
        outcome.status = "failed"
        outcome.error_code = exc.code
        outcome.error_message = model_failure_message(exc, secrets)
        trace.append({"type": "model_error", "reason": exc.code, "attempts": exc.attempts})
        if exc.usage:
            # A reply that arrived but could not be read: its tokens were spent. Charged as a model call (its event
            # carries them, as a turn's does), kept out of the conversation (there is no turn to send back).
            unread = AIMessage("", usage_metadata=exc.usage)
            unread_turns.append(unread)
            plan.emit("model_turn", {**message_to_trace(unread, secrets), "usage": _token_usage([unread])})
    except Exception as exc:  # the run ends as a value, not a crash
        # Not the model's failure (a provider's comes as ModelCallFailed, its refusal of the tools too): a fault of
        # the platform's own, past or between the model calls. The turns made are kept: their tokens were spent.
        logger.exception("internal failure in run %s", plan.run_id)
        final_messages = _conversation_so_far(messages, new_turns, answered)
        outcome.status = "failed"
        outcome.error_code = "internal"
        outcome.error_message = mask_text(f"{type(exc).__name__}: {exc}", secrets=secrets)[:2000]
        trace.append({"type": "outcome", "reason": "internal"})
    loop_ms = clock.ms_since(t1)
    trace.extend(message_to_trace(m, secrets) for m in final_messages)
    outcome.messages = trace
    outcome.conversation = stored_conversation(final_messages, secrets)
    outcome.token_usage = _token_usage([*final_messages, *unread_turns])
    outcome.tool_failures += sum(1 for m in final_messages if isinstance(m, ToolMessage) and _failed_call(m))
    outcome.timings = {
        "deterministic_ms": deterministic_ms,
        "model_ms": round(max(loop_ms - clock.tools_ms, 0.0), 2),
        "tools_ms": round(clock.tools_ms, 2),
        "total_ms": clock.ms_since(clock.started),
    }
    return outcome


def _conversation_so_far(
    messages: list[BaseMessage], new_turns: list[AIMessage], answered: Mapping[str, ToolMessage]
) -> list[BaseMessage]:
    """The conversation of a run that stopped inside the graph, whose state is lost with it: the messages it
    started from, then each model turn it made, each followed by the results of the calls it asked for (a resumed
    run's first results answer the last turn it started from). A call not answered (never sent, cut off, waiting)
    has no result here."""

    def results_of(calls: list[dict[str, Any]]) -> list[BaseMessage]:
        return [answered[call["id"]] for call in calls if call.get("id") in answered]

    so_far: list[BaseMessage] = [*messages, *results_of(unanswered_tool_calls(messages))]
    for turn in new_turns:
        if turn not in messages:
            so_far += [turn, *results_of(turn_calls(turn))]
    return so_far


# What a run's error message holds at most (the provider's detail is cut to fit, after it is masked).
ERROR_MESSAGE_CHARS = 2000


def _with_detail(sentence: str, detail: str, secrets: list[str], *, after: str = "") -> str:
    """``sentence`` (the platform's, in the run's language), then the provider's ``detail`` masked with the run's
    secrets and only then cut to fit, then ``after``."""
    room = max(ERROR_MESSAGE_CHARS - len(sentence) - len(after) - 2, 0)
    return " ".join(part for part in (sentence, mask_text(detail, secrets=secrets)[:room], after) if part)


def model_failure_message(exc: ModelCallFailed, secrets: list[str]) -> str:
    """A failed model call as the run's error message says it: what its kind means, in the run's language, then
    the provider's words (masked) and how many times the call was sent."""
    after = attempts_text(exc.attempts) if exc.attempts else ""
    # An overflow refused by the provider is said as the same overflow told as a stop reason is.
    sentence = unfinished_turn_text(exc.code) if exc.kind == "context_window" else model_failure_text(exc.kind)
    return _with_detail(sentence, exc.detail, secrets, after=after)


def _configured_max_tokens(params: dict[str, Any]) -> int | None:
    """The agent's own ``max_tokens`` as its model is given it (``stored_model_params``: a stored ``"100"`` or
    ``100.0`` is 100), which caps a budgeted call's output below what the reservation leaves. None where it is not
    set, or where the parameters do not validate (a network model is then not made; the scripted one ignores
    them)."""
    try:
        return stored_model_params(params).max_tokens
    except ValidationError:
        return None


def _mcp_context(
    plan: RunPlan,
    settings: McpContextSettings,
    servers: dict[str, McpServer],
    who: Callable[[str, str], gate.GateCall],
    trace: list[dict[str, Any]],
) -> tuple[str, str]:
    """The system prompt (the agent's MCP prompt rendered through the gate, else its own text) and the block of
    data to attach (``agents.mcp_context.context_block``: the resources read through the gate, and the rendered
    prompt when its arguments take the run caller's text: that text never becomes system instructions). A prompt
    or resource that cannot be had is a trace entry, not a failed run: the agent's own prompt stands in, the
    resource is left out."""
    system_prompt = plan.system_prompt
    prompt_data: dict[str, Any] | None = None
    if settings.prompt is not None:
        prompt = settings.prompt
        entry: dict[str, Any] = {"type": "prompt", "mcp_id": prompt.mcp_id, "name": prompt.name}
        server = servers.get(prompt.mcp_id)
        try:
            arguments = {
                k: str(v)
                for k, v in render_params(
                    prompt.arguments, query=plan.query, context=plan.context, a2a_data=plan.a2a_data, match={}
                ).items()
            }
        except ParamsRenderError as exc:
            entry.update(ok=False, error="prompt:arguments", message=str(exc))
        else:
            if server is None:
                entry.update(ok=False, error=f"mcp:not_loaded:{prompt.mcp_id}")
            else:
                result = gate.get_prompt(
                    server=server, name=prompt.name, arguments=arguments, who=who("agent", "prompt")
                )
                entry.update(ok=result.ok, error=result.error or "", arguments=result.args)
                if result.ok:
                    texts = [m["text"] for m in (result.value or {}).get("messages", []) if m.get("text")]
                    if texts and prompt.takes_run_input():
                        entry["delivered"] = "data"
                        prompt_data = {"mcp_id": prompt.mcp_id, "name": prompt.name, "text": "\n\n".join(texts)}
                    elif texts and (hidden := invisible_characters("".join(texts))):
                        # Text that does not show itself (tag characters a model reads as ASCII, direction
                        # overrides) would be instructions no admin could read on the server's prompt page: the
                        # agent's own prompt stands in, as for a prompt that cannot be had.
                        entry.update(
                            ok=False,
                            error="prompt:invisible",
                            message=_("the prompt holds characters that do not show themselves: %(characters)s")
                            % {"characters": visible_text("".join(hidden))},
                        )
                    elif texts:
                        entry["delivered"] = "system"
                        system_prompt = "\n\n".join(texts)
        trace.append(entry)
    resources: list[dict[str, Any]] = []
    for index, ref in enumerate(settings.resources):
        server = servers.get(ref.mcp_id)
        if server is None:
            trace.append(
                {
                    "type": "resource",
                    "mcp_id": ref.mcp_id,
                    "uri": ref.uri,
                    "ok": False,
                    "error": f"mcp:not_loaded:{ref.mcp_id}",
                }
            )
            continue
        result = gate.read_resource(server=server, uri=ref.uri, who=who("agent", f"resource:{index + 1}"))
        text = result.value if isinstance(result.value, str) else ""
        trace.append(
            {
                "type": "resource",
                "mcp_id": ref.mcp_id,
                "uri": ref.uri,
                "ok": result.ok,
                "error": result.error or "",
                "chars": len(text),
            }
        )
        if result.ok:
            resources.append({"mcp_id": ref.mcp_id, "uri": ref.uri, "text": text})
    return system_prompt, context_block(resources=resources, prompt=prompt_data)


def _tool_offer(
    plan: RunPlan,
    index: dict[str, tuple[McpServer, McpTool]],
    specs: list[dict[str, Any]],
    results: list[dict[str, Any]],
    trace: list[Any],
    who: gate.GateCall,
    *,
    model_choice: str | None = None,
) -> ToolOffer:
    """The run's tool offer: selection settings, the tools a matched rule named (always offered), the fallbacks
    the gate advised for the rules' failed calls (offered from the first turn), each tool's correction cap from
    the contract the gate applies for ``who`` (a published version's frozen one), and the trace entry of each
    turn's selection. Raises ValueError for settings that do not validate.

    The first tool forced is a matched rule's, else the agent's ``force_first_tool``, else ``model_choice`` (the
    model's own ``model_params.tool_choice`` "any" or a tool's name): one rule for all three, the offer's, so a
    forced tool is always among those offered and is not forced once it is not (withdrawn, filtered out)."""
    settings = tool_selection_settings(plan.tool_selection)
    if model_choice and not settings.force_first_tool:
        settings = settings.model_copy(update={"force_first_tool": model_choice})
    by_tool = {(server.mcp_id, mcp_tool.name): name for name, (server, mcp_tool) in index.items()}
    # Settings and rules name a tool as the admin knows it (its exposed name); the offer, as the model does.
    as_offered = {mcp_tool.exposed_name: name for name, (_server, mcp_tool) in index.items()}
    rule_named = [by_tool[key] for r in results if (key := (r.get("mcp_id"), r.get("tool"))) in by_tool]
    previous_turns = model_turn_count(plan.conversation)  # an earlier turn of the conversation is none of the run's

    def on_selection(selection: Selection, turn: int) -> None:
        entry = selection.as_trace(turn + 1)
        trace.append(entry)
        plan.emit("tool_selection", entry)

    # A matched rule that forces the model's first tool overrides the agent's setting (the first such rule).
    forcing = {r.rule_id: r.force_first_tool for r in plan.rules if r.force_first_tool}
    matched = [e.get("rule_id") for e in trace if e.get("type") == "rule" and e.get("matched")]
    by_rule = next((forcing[rule_id] for rule_id in matched if rule_id in forcing), "")
    kind: Literal["any", "tool"] = "any" if by_rule == "any" else "tool"
    if by_rule and supports_tool_choice(provider=plan.provider, model_id=plan.model_id, kind=kind):
        settings = settings.model_copy(update={"force_first_tool": by_rule})
    settings = settings.model_copy(
        update={
            "force_first_tool": as_offered.get(settings.force_first_tool, settings.force_first_tool),
            "pinned": [as_offered.get(name, name) for name in settings.pinned],
        }
    )
    ranker, fallback, note = selection_rankers(settings=settings, index=index)
    contracts = {
        name: gate.contract_applied(who=who, server=server, tool=mcp_tool) for name, (server, mcp_tool) in index.items()
    }
    fallback_tools: dict[str, tuple[str, bool]] = {}
    for name, (server, _tool) in index.items():
        contract = contracts[name]
        backup = by_tool.get((server.mcp_id, contract.fallback_tool or ""))
        if not backup or backup == name:
            continue
        # With the "call" policy the gate calls a read tool's read fallback itself (the model is never told to)
        # and a write tool's never; a read tool's write fallback it leaves to the model, told of it (``gate.call``).
        told = contract.fallback_policy != contract.FallbackPolicy.CALL or (
            contract.risk == contract.Risk.READ and contracts[backup].risk != contract.Risk.READ
        )
        if told:
            fallback_tools[name] = (backup, contract.risk == contract.Risk.WRITE)
    offer = ToolOffer(
        index=index,
        specs={spec["function"]["name"]: spec for spec in specs},
        settings=settings,
        query=plan.query,
        rule_named=list(dict.fromkeys(rule_named)),
        ranker=ranker,
        fallback_ranker=fallback,
        correction_caps={name: contract.correction_cap for name, contract in contracts.items()},
        on_selection=on_selection,
        first_turn_of_run=previous_turns == 0,
        fallback_tools=fallback_tools,
        ranker_note=note,
    )
    # A rule's failed call reaches the model in its system message with the gate's advice (use the fallback tool):
    # that fallback is offered from the first turn, or following the advice would be refused (tool:not_offered).
    for result in results:
        if not result.get("ok") and (key := (result.get("mcp_id"), result.get("tool"))) in by_tool:
            offer.suggest_fallback(by_tool[key], result.get("error"))
    return offer


def selection_rankers(
    *, settings: ToolSelectionSettings, index: dict[str, tuple[McpServer, McpTool]]
) -> tuple[Ranker | None, Ranker | None, str]:
    """The ranker the settings name, the one that takes over if it fails, and why the named one is not used
    (``"embedding:not_configured"``, ``"embedding:<error>"`` when its vectors could not be had: the run ranks
    lexically and its first selection says so). (None, None, ""): the offer builds the lexical one itself
    when selection is active. Never raises for the embedding service."""
    if not settings.enabled or settings.ranker == "lexical" or len(index) <= settings.top_k:
        return None, None, ""
    from mcpregistry.embeddings import embedding_ranker_setup

    lexical = LexicalRanker([tool_doc(name, server, tool) for name, (server, tool) in index.items()])
    inputs = embedding_ranker_setup({name: tool for name, (_server, tool) in index.items()})
    if inputs.embed_query is None:
        return lexical, None, f"embedding:{inputs.unavailable}"
    return EmbeddingRanker(inputs.vectors, inputs.embed_query), lexical, ""


def _execute_flow(
    plan: RunPlan,
    outcome: RunOutcome,
    trace: list[dict[str, Any]],
    who: Callable[[str, str], gate.GateCall],
    secrets: list[str],
    clock: _Clock,
    deterministic_ms: float,
) -> RunOutcome:
    """Flow mode (``agents.flow_runner``): the flow's tool calls go through the gate (source ``flow``).

    A run's flow makes at most ``PLATFORM_FLOW_MAX_CALLS`` calls (each pass, when it runs again after an
    approval): a flow that loops on its calls (a memo's answer is fast) would otherwise write an audit event, a run
    event and a trace entry for each until its time limit. The call past it is not made and fails the run
    (``flow:too_many_calls``), also when the flow catches the exception.

    A server the agent binds is the flow's to bind whether or not it is enabled: a call to a disabled one is the
    gate's to refuse (``mcp:not_loaded:<id>``, audited), as one disabled while the run goes on, and the flow tells
    it as a failed call (``ToolFailure``) rather than failing to build."""
    servers = {s.mcp_id: s for s in plan.servers}
    call_ids = FlowCallIds()
    max_calls = int(django_settings.PLATFORM_FLOW_MAX_CALLS)
    calls_made = 0
    over_cap: list[FlowTooManyCalls] = []
    parked: list[str] = []
    # The tasks whose calls parked (``FlowCallIds.calling_task``). Only a task beside each of them calls on: the
    # tasks of their steps finish (``FlowParked``), subgraphs included, their calls made (an approved write carried
    # out, another asked for): none of them can depend on a parked call.
    parked_tasks: list[tuple[str, ...]] = []
    failures: list[str] = []  # the calls that failed (a write waiting for its approval has not)

    def call_tool(mcp_id: str, tool_name: str, params: dict[str, Any]) -> Any:
        nonlocal calls_made
        # Between the flow's steps, as the ReAct loop checks between its own: a run cancelled (or out of time, or
        # taken over) sends nothing more, also when the flow caught the exception of an earlier call.
        task = call_ids.calling_task()
        if parked and not all(call_ids.beside(task, other) for other in parked_tasks):
            raise FlowParked(parked[0])  # the flow caught the wait and called on: nothing goes out until it resumes
        if over_cap:  # the flow caught the stop and called on
            raise over_cap[0]
        plan.check_cancelled()
        if calls_made >= max_calls:
            over_cap.append(FlowTooManyCalls(max_calls))
            raise over_cap[0]
        # The call's id in the flow (``FlowCallIds``: the same on every pass): its audit events and its approval
        # carry it, and so do its event and trace entry (the run page finds the call's attempts and approval by it).
        call_id = call_ids.next_call_id()
        calls_made += 1
        result = gate.call(server=servers[mcp_id], tool_name=tool_name, args=params, who=who("flow", call_id))
        clock.tools_ms += result.latency_ms
        plan.emit("tool_call", {"source": "flow", "call_id": call_id, **result.as_dict()})
        trace.append({"type": "flow_call", "call_id": call_id, **result.as_dict()})
        if counts_as_failed(result.as_dict()) and result.error != "approval:pending":
            failures.append(call_id)  # counted into the run's tool_failures, as the deterministic stage's are
        if result.error == "approval:pending" and result.approval_id:
            # A write waiting for a person: the flow stops, the run waits, and once the approval is decided the
            # flow runs again from its start (its calls numbered the same way: the approved one is found by its
            # id, its arguments checked against the approved ones). Recorded before raising, so a flow that
            # catches the exception cannot finish the run past a pending approval.
            trace.append(
                {"type": "approval", "approval_id": result.approval_id, "tool": tool_name, "args": result.args}
            )
            parked_tasks.append(task)
            parked.append(result.approval_id)
            raise FlowParked(result.approval_id)
        if result.ok:
            return result.value
        # A read tool's own words (``tool_error_text``, kept by the gate for a caller with no model), with the tool
        # that said them: what the templates show a person (``agents.flows.common.unavailable``), as the rule path
        # quotes them. Only where the gate kept them: other failures stay ``{"ok", "error", "message"}``.
        said = {"tool": result.tool or tool_name, "tool_error_text": result.tool_error_text}
        return ToolFailure(
            ok=False, error=result.error, message=result.message, **(said if result.tool_error_text else {})
        )

    options = plan.model_params.get("flow") or {}
    settings = FlowSettings(
        run_id=plan.run_id,
        query=plan.query,
        context=dict(plan.context),
        a2a_data=list(plan.a2a_data),
        a2a_files=list(plan.a2a_files),
        bound_mcp_ids=list(servers),
        options=dict(options) if isinstance(options, dict) else {},
        call_tool=call_tool,
    )
    t1 = time.perf_counter()
    try:
        if not isinstance(options, dict):
            # Refused when the agent is saved (Agent.clean); one stored before that check fails as the flow's error.
            flow = FlowResult(
                error_code="flow:error",
                error_message=_(
                    "The flow options (model parameter flow) must be an object: flow.mcp_id=…, a key each."
                ),
            )
        else:
            flow = flow_run(
                flow_graph=plan.flow_graph,
                settings=settings,
                trace=trace,
                emit=plan.emit,
                check=plan.check_cancelled,
                time_left=plan.time_left,
                call_ids=call_ids,
            )
    except RunCancelled:
        flow = FlowResult(error_code="cancelled", error_message="the run was cancelled")
        outcome.status = "cancelled"
    outcome.tool_failures += len(failures)
    # A branch that failed beside every parked call cannot depend on them: the flow's error is known in this pass,
    # which fails rather than put a write to a person for a run that fails anyway (its approvals end unused).
    failed_beside = call_ids.failed_beside(parked_tasks) if parked else None
    if over_cap and outcome.status != "cancelled":  # whatever the flow made of the exception
        flow = FlowResult(error_code="flow:too_many_calls", error_message=over_cap[0].message)
    elif failed_beside is not None and outcome.status != "cancelled":
        flow = FlowResult(error_code="flow:error", error_message=f"{type(failed_beside).__name__}: {failed_beside}")
    if parked and failed_beside is None and outcome.status != "cancelled":
        outcome.status, outcome.parked_on = "awaiting_approval", parked[0]
    elif flow.error_code == "cancelled":
        outcome.error_code, outcome.error_message = flow.error_code, flow.error_message
    elif flow.error_code:
        outcome.status, outcome.error_code = "failed", flow.error_code
        outcome.error_message = mask_text(flow.error_message, secrets=secrets)[:2000]
    else:
        # The flow's output is made of its tools' values: what does not show itself written out, as for a model.
        outcome.answer = readable_text(mask_text(flow.answer, secrets=secrets))
        trace.append({"type": "answer", "content": outcome.answer})
    outcome.messages = trace
    outcome.token_usage = {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0, "model_calls": 0}
    outcome.timings = {
        "deterministic_ms": deterministic_ms,
        "model_ms": 0.0,
        "tools_ms": round(clock.tools_ms, 2),
        "flow_ms": clock.ms_since(t1),
        "total_ms": clock.ms_since(clock.started),
    }
    return outcome


# The reason a model turn's calls past ``PLATFORM_MAX_TOOL_CALLS_PER_TURN`` are refused with (never sent).
TOO_MANY_CALLS = "tool:too_many_calls"


def max_tool_calls_per_turn() -> int:
    """How many tool calls one model turn may make (``PLATFORM_MAX_TOOL_CALLS_PER_TURN``, default 20): the
    turn's later calls are refused (``tool:too_many_calls``), as a flow's calls are capped
    (``PLATFORM_FLOW_MAX_CALLS``)."""
    return int(django_settings.PLATFORM_MAX_TOOL_CALLS_PER_TURN)


class TokenCeilingReached(Exception):
    """The run's model calls used the tokens its budget reservation allows, or the next call might exceed them."""


class ToolCallsCutShort(Exception):
    """A model turn its provider said was unfinished (``UNFINISHED_TURN_CODES``: cut off at its token limit or its
    context window, filtered, malformed) that asks for tools: the run fails with ``code`` (``model:max_tokens``...)
    and none of its calls is sent."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.stop_reason = reason
        self.code = UNFINISHED_TURN_CODES[reason]


# What a provider may add per message around its text (role markers, a tool call's framing).
MESSAGE_OVERHEAD_TOKENS = 8


def _utf8_size(message: BaseMessage) -> int:
    content = message.content if isinstance(message.content, str) else json.dumps(message.content, default=str)
    size = len(content.encode())
    if isinstance(message, AIMessage) and (calls := turn_calls(message)):
        size += len(json.dumps(calls, ensure_ascii=False, default=str).encode())
    return size + MESSAGE_OVERHEAD_TOKENS


def _history_within_reservation(
    earlier: list[BaseMessage], messages: list[BaseMessage], specs: list[dict[str, Any]], plan: RunPlan
) -> list[BaseMessage]:
    """The conversation's earlier turns (question and answer pairs, oldest first) that the run's first model call
    can read within its budget reservation: the newest, as many as take at most half of what the reservation
    leaves past the call's own ``messages`` (system text, question) and every tool spec, by ``input_token_bound``;
    the other half is for the call's answer. Their whole would fail every later turn of the conversation
    (``budget:run_ceiling``), and a failed run never joins it: the conversation stuck for good."""
    assert plan.token_ceiling is not None
    specs_json = json.dumps(specs, ensure_ascii=False, sort_keys=True, default=str)
    own = input_token_bound(messages, specs_json=specs_json, previous_specs_json=None)
    room = (plan.token_ceiling - plan.spent_before - own) // 2
    kept = len(earlier)
    while kept and sum(_utf8_size(m) for m in earlier[len(earlier) - kept :]) > room:
        kept -= 2
    return earlier[len(earlier) - kept :]


def input_token_bound(messages: Sequence[BaseMessage], *, specs_json: str, previous_specs_json: str | None) -> int:
    """An upper bound on the input tokens of a model call over ``messages`` with these tool specs.

    From the last model turn that reported its usage (or was charged an estimate of it, ``usage_estimate``): that
    call's input and output tokens (what it read and what it wrote are the prefix of this call) plus, for every
    message after it, one token per UTF-8 byte and ``MESSAGE_OVERHEAD_TOKENS``; a conversation with no reported
    turn counts every message so. The tool specs count one token per byte unless they are the previous call's
    (then they are in its input already, or in the estimate it was charged). No
    byte-level tokenizer (GPT, Claude, Llama, byte-fallback SentencePiece) makes more tokens of a text than it
    has bytes, so the bound holds but for a provider's own per-request preamble beyond the overheads counted."""
    start, bound = 0, 0
    for i in range(len(messages) - 1, -1, -1):
        message = messages[i]
        if isinstance(message, AIMessage) and message.usage_metadata:
            usage = message.usage_metadata
            bound = int(usage.get("input_tokens") or 0) + int(usage.get("output_tokens") or 0)
            bound += MESSAGE_OVERHEAD_TOKENS
            start = i + 1
            break
    bound += sum(_utf8_size(m) for m in messages[start:])
    if specs_json != previous_specs_json:
        bound += len(specs_json.encode())
    return bound


# Set in a model turn's ``response_metadata`` where its usage is the platform's estimate (``usage_estimate``).
USAGE_ESTIMATED = "usage_estimated"


def _usage_reported(message: AIMessage) -> bool:
    """Whether the provider reported the turn's tokens: a call reads at least its prompt, so a report of no input
    (a server that sends zeros where it counts nothing; Ollama's ``prompt_tokens: 0`` for a cached prompt, with
    its output counted) is no report of what the call read."""
    usage = message.usage_metadata
    return usage is not None and int(usage.get("input_tokens") or 0) > 0


def usage_was_estimated(message: AIMessage) -> bool:
    return bool((message.response_metadata or {}).get(USAGE_ESTIMATED))


def usage_estimate(message: AIMessage, *, input_bound: int, max_tokens: int | None) -> None:
    """Give a model turn whose provider reported no usage (or only its output) an upper bound of it, as its own
    ``usage_metadata`` (marked ``usage_estimated`` in its ``response_metadata``): its call's input bound
    (``input_token_bound``, the tool specs included where the previous call's input did not hold them) and its
    output as reported, or else counted as that bound counts a message (one token per UTF-8 byte and
    ``MESSAGE_OVERHEAD_TOKENS``), never more than the ``max_tokens`` it was given. The run's spend, its ceiling,
    the next calls' input bounds and its budgets then count the turn as a reported one, and its stored
    conversation keeps the estimate for a resumed pass."""
    # An output the provider did count (where it sent no count of the prompt) is kept.
    reported = message.usage_metadata
    output = int(reported.get("output_tokens") or 0) if reported is not None else 0
    if output <= 0:
        output = _utf8_size(message) if max_tokens is None else min(_utf8_size(message), max_tokens)
    message.usage_metadata = UsageMetadata(
        input_tokens=input_bound, output_tokens=output, total_tokens=input_bound + output
    )
    message.response_metadata = {**(message.response_metadata or {}), USAGE_ESTIMATED: True}


def unanswered_call_estimate(*, input_bound: int, max_tokens: int | None) -> AIMessage:
    """The turn a model call that got no answer after its request was (or may have been) sent is charged as
    (``agents.providers.unanswered_after_sending``): its input bound (``input_token_bound``) and the ``max_tokens``
    it was given (none where it was given none: its output cannot be bounded), marked ``usage_estimated``."""
    output = max_tokens or 0
    return AIMessage(
        "",
        usage_metadata=UsageMetadata(input_tokens=input_bound, output_tokens=output, total_tokens=input_bound + output),
        response_metadata={USAGE_ESTIMATED: True},
    )


def _tokens_of(messages: list[BaseMessage]) -> int:
    usage = _token_usage(messages)
    return usage["input_tokens"] + usage["output_tokens"]


# The input token details that count prompt-cache writes (``UsageMetadata``'s ``InputTokenDetails``).
_CACHE_WRITE_DETAILS = ("cache_creation", "ephemeral_5m_input_tokens", "ephemeral_1h_input_tokens")


def _token_usage(messages: list[BaseMessage]) -> dict[str, int]:
    """The run's tokens over every model turn of its conversation (a resumed run's earlier turns included, the
    earlier turns of its A2A conversation not): input, output, total, the prompt-cache reads and writes where
    the provider reports them, and ``model_calls_estimated`` where it reported none for some (``usage_estimate``:
    their tokens are upper bounds)."""
    totals = {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0, "model_calls": 0}
    for m in messages:
        if isinstance(m, AIMessage) and not is_history_answer(m):
            totals["model_calls"] += 1
            if usage_was_estimated(m):
                totals["model_calls_estimated"] = totals.get("model_calls_estimated", 0) + 1
            usage: dict[str, Any] = dict(m.usage_metadata or {})
            for key in ("input_tokens", "output_tokens", "total_tokens"):
                totals[key] += int(usage.get(key, 0) or 0)
            details = usage.get("input_token_details") or {}
            if details.get("cache_read"):
                totals["cache_read_tokens"] = totals.get("cache_read_tokens", 0) + int(details["cache_read"])
            # A write may be told by its cache's lifetime instead (langchain-aws from Bedrock's ``cacheDetails``,
            # langchain-anthropic: ``cache_creation`` is then 0). One write price covers both lifetimes.
            written = sum(int(details.get(detail) or 0) for detail in _CACHE_WRITE_DETAILS)
            if written:
                totals["cache_creation_tokens"] = totals.get("cache_creation_tokens", 0) + written
    return totals
