"""The run engine: input guardrail → deterministic stage → LangGraph ReAct loop → output guardrail.

``execute(plan)`` takes everything a run needs as plain values (the bound servers are passed through to the
gate, which writes the audit) and returns a ``RunOutcome``; it never raises for a tool's or a model's
failure. Every tool call, deterministic or the model's, goes through ``mcpregistry.gate``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    messages_from_dict,
    messages_to_dict,
)
from langgraph.errors import GraphRecursionError

from agents.answers import (
    all_calls_failed_text,
    compose_offline_answer,
    no_rule_matched_text,
    system_message_text,
    text_of,
)
from agents.deterministic import RuleSpec
from agents.deterministic_stage import StageInput, deterministic_stage
from agents.errors import MUST_PROPAGATE, RunCancelled
from agents.flow_runner import FlowResult, FlowSettings, flow_run
from agents.graph import MaxIterationsReached, build_react_graph
from agents.llm import build_chat_model
from agents.selectors import tool_name_conflicts
from audit.masking import mask_text, mask_value
from mcpregistry import gate
from mcpregistry.models import McpServer, McpTool

logger = logging.getLogger(__name__)


PREFIX_TRACE_TYPES = frozenset({"rule", "deterministic_call", "approval"})


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
    # Progress as it happens (rule decisions, deterministic results, model turns, tool calls): the run's events.
    emit: Callable[[str, dict[str, Any]], None] = lambda kind, data: None
    # Resuming a parked run: what the earlier pass left.
    conversation: list[dict[str, Any]] = field(default_factory=list)
    previous_results: list[dict[str, Any]] = field(default_factory=list)
    previous_trace: list[dict[str, Any]] = field(default_factory=list)


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
    return [s for server in plan.servers for s in server.secret_values()]


def _offline_answer(plan: RunPlan, results: list[dict[str, Any]]) -> str:
    return compose_offline_answer(
        query=plan.query,
        results=results,
        answer_template=plan.answer_template,
        no_match_text=no_rule_matched_text(agent_text=plan.no_match_answer, language=plan.language),
        language=plan.language,
    )


def _tool_index(plan: RunPlan) -> dict[str, tuple[McpServer, McpTool]]:
    """Every callable tool of the bound servers, by the name the model sees."""
    index: dict[str, tuple[McpServer, McpTool]] = {}
    for server in plan.servers:
        if server.enabled:
            for mcp_tool in server.tools.all():
                if mcp_tool.callable:
                    index[mcp_tool.exposed_name] = (server, mcp_tool)
    return index


def tool_specs(index: dict[str, tuple[McpServer, McpTool]]) -> list[dict[str, Any]]:
    """The tools as the model is told of them: name, description, input schema (as discovered)."""
    return [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": mcp_tool.description or mcp_tool.name,
                "parameters": mcp_tool.input_schema or {"type": "object", "properties": {}},
            },
        }
        for name, (_server, mcp_tool) in index.items()
    ]


def message_to_trace(message: BaseMessage, secrets: list[str]) -> dict[str, Any]:
    entry: dict[str, Any] = {"type": message.type, "content": mask_value(message.content, secrets=secrets)}
    if isinstance(message, AIMessage) and message.tool_calls:
        entry["tool_calls"] = [
            {"id": c.get("id"), "name": c["name"], "args": mask_value(c["args"], secrets=secrets)}
            for c in message.tool_calls
        ]
    if isinstance(message, ToolMessage):
        entry["tool_call_id"] = message.tool_call_id
        entry["name"] = message.name
        entry["status"] = message.status
    return entry


def execute(plan: RunPlan) -> RunOutcome:
    """Run one query end to end, or resume a parked one. Returns a RunOutcome; a tool's or a model's failure
    never escapes, and a write call waiting for approval parks the run (status ``awaiting_approval``)."""
    clock = _Clock()
    secrets = _secrets(plan)
    memo: dict[str, gate.ToolResult] = {}
    # Rule decisions and deterministic calls of an earlier (parked) pass are kept; messages are rebuilt.
    trace: list[dict[str, Any]] = [e for e in plan.previous_trace if e.get("type") in PREFIX_TRACE_TYPES]
    outcome = RunOutcome(status="succeeded")

    def who(source: str, call_id: str) -> gate.GateCall:
        return gate.GateCall(
            source=source,  # type: ignore[arg-type]
            run_id=plan.run_id,
            actor=plan.actor,
            call_id=call_id,
            memo=memo,
            approvals=plan.approvals,
        )

    t0 = time.perf_counter()
    failed: RunOutcome | None = None
    if plan.conversation:
        results = [dict(r) for r in plan.previous_results]
    else:
        stage = deterministic_stage(
            StageInput(
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
                previous_results=plan.previous_results,
            ),
            mode="execute",
            who=lambda call_id: who("deterministic", call_id),
        )
        results = stage.results
        if stage.failure is None and stage.parked_on is None:
            logger.info("Deterministic pre-step done: %d", len(results))
        if stage.failure is not None:
            failed = RunOutcome(status="failed", error_code=stage.failure.code, error_message=stage.failure.message)
        elif stage.parked_on is not None:
            failed = RunOutcome(status="awaiting_approval", parked_on=stage.parked_on)
    deterministic_ms = clock.ms_since(t0)
    public_results = [{k: v for k, v in r.items() if k != "answer_template"} for r in results]
    outcome.deterministic_results = results
    outcome.tool_failures = sum(1 for r in results if not r.get("ok"))
    if failed is not None:
        failed.deterministic_results = results
        failed.tool_failures = outcome.tool_failures
        failed.messages = trace
        failed.timings = {"deterministic_ms": deterministic_ms, "total_ms": clock.ms_since(clock.started)}
        return failed

    if plan.provider == "offline" and plan.mode != "flow" and results and not any(r.get("ok") for r in results):
        # The answer would rest on calls that all failed and no model can recover: the run fails, saying so.
        codes = [r.get("error") or "" for r in results]
        trace.append({"type": "outcome", "reason": "deterministic:tool_failed", "tool_errors": codes})
        return RunOutcome(
            status="failed",
            error_code="deterministic:tool_failed",
            error_message=all_calls_failed_text(language=plan.language),
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

    index = _tool_index(plan)

    def call_tool(tool_call: dict[str, Any]) -> tuple[ToolMessage, str | None]:
        name, call_id = tool_call["name"], tool_call.get("id") or ""
        found = index.get(name)
        if found is None:
            result = gate.refuse_unknown(
                tool_name=name, args=tool_call.get("args"), who=who("agent", call_id), offered=sorted(index)
            )
        else:
            server, mcp_tool = found
            result = gate.call(
                server=server, tool_name=mcp_tool.name, args=tool_call.get("args"), who=who("agent", call_id)
            )
        clock.tools_ms += result.latency_ms
        plan.emit("tool_call", {"source": "agent", "call_id": call_id, **result.as_dict()})
        if result.error == "approval:pending":
            trace.append({"type": "approval", "approval_id": result.approval_id, "tool": name, "args": result.args})
            return ToolMessage(content="", tool_call_id=call_id), result.approval_id
        status = "success" if result.ok else "error"
        return ToolMessage(content=result.for_model(), tool_call_id=call_id, name=name, status=status), None

    if plan.conversation:
        messages: list[BaseMessage] = list(messages_from_dict(plan.conversation))
    else:
        text = system_message_text(
            system_prompt=plan.system_prompt,
            deterministic_instruction=plan.deterministic_instruction,
            results=results,
        )
        messages = [SystemMessage(text), HumanMessage(plan.query)]
    try:
        model = build_chat_model(
            provider=plan.provider,
            model_id=plan.model_id,
            params=plan.model_params,
            offline_answer=_offline_answer(plan, results),
        )
    except ValueError as exc:  # an unknown or disallowed provider: the run fails as a value, never a crash
        return RunOutcome(
            status="failed",
            error_code="model:unavailable",
            error_message=str(exc),
            deterministic_results=results,
            messages=trace,
        )
    graph = build_react_graph(
        model=model,
        tool_specs=tool_specs(index),
        call_tool=call_tool,
        max_iterations=max(plan.max_iterations, 1),
        check_cancelled=plan.check_cancelled,
        on_model_turn=lambda message: plan.emit("model_turn", message_to_trace(message, secrets)),
    )
    t1 = time.perf_counter()
    final_messages: list[BaseMessage] = messages
    previous_turns = sum(1 for m in messages if isinstance(m, AIMessage))
    try:
        state = graph.invoke(
            {
                "messages": messages,
                "metadata": {"deterministic_results": public_results},
                "model_turns": previous_turns,
            },
            config={"recursion_limit": 4 * max(plan.max_iterations, 1) + 10},
        )
        final_messages = list(state["messages"])
        if state.get("parked_on"):
            outcome.status = "awaiting_approval"
            outcome.parked_on = state["parked_on"]
        else:
            last = final_messages[-1] if final_messages else None
            outcome.answer = mask_text(text_of(last.content), secrets=secrets) if isinstance(last, AIMessage) else ""
    except (MaxIterationsReached, GraphRecursionError):
        outcome.status = "failed"
        outcome.error_code = "max_iterations"
        outcome.error_message = f"the agent did not finish within {plan.max_iterations} iterations"
    except RunCancelled:
        outcome.status = "cancelled"
        outcome.error_code = "cancelled"
        outcome.error_message = "the run was cancelled"
    except MUST_PROPAGATE:
        raise  # the task's time limit or a database hiccup: handled (and retried) by the task, not a model error
    except Exception as exc:  # noqa: BLE001 - a model failure ends the run as a value, not a crash
        logger.warning("model failure in run %s: %s", plan.run_id, type(exc).__name__)
        outcome.status = "failed"
        outcome.error_code = "model:error"
        outcome.error_message = mask_text(f"{type(exc).__name__}: {exc}", secrets=secrets)[:2000]
    loop_ms = clock.ms_since(t1)
    trace.extend(message_to_trace(m, secrets) for m in final_messages)
    outcome.messages = trace
    outcome.conversation = mask_value(messages_to_dict(final_messages), secrets=secrets)
    outcome.token_usage = _token_usage(final_messages)
    outcome.tool_failures += sum(1 for m in final_messages if isinstance(m, ToolMessage) and m.status == "error")
    outcome.timings = {
        "deterministic_ms": deterministic_ms,
        "model_ms": round(max(loop_ms - clock.tools_ms, 0.0), 2),
        "tools_ms": round(clock.tools_ms, 2),
        "total_ms": clock.ms_since(clock.started),
    }
    return outcome


def _execute_flow(
    plan: RunPlan,
    outcome: RunOutcome,
    trace: list[dict[str, Any]],
    who: Callable[[str, str], gate.GateCall],
    secrets: list[str],
    clock: _Clock,
    deterministic_ms: float,
) -> RunOutcome:
    """Flow mode (``agents.flow_runner``): the flow's tool calls go through the gate (source ``flow``)."""
    servers = {s.mcp_id: s for s in plan.servers if s.enabled}
    node_calls = iter(range(1, 1_000_000))

    def call_tool(mcp_id: str, tool_name: str, params: dict[str, Any]) -> Any:
        result = gate.call(
            server=servers[mcp_id], tool_name=tool_name, args=params, who=who("flow", f"flow:{next(node_calls)}")
        )
        clock.tools_ms += result.latency_ms
        plan.emit("tool_call", {"source": "flow", **result.as_dict()})
        trace.append({"type": "flow_call", **result.as_dict()})
        if result.ok:
            return result.value
        return {"ok": False, "error": result.error, "message": result.message}

    settings = FlowSettings(
        run_id=plan.run_id,
        query=plan.query,
        context=dict(plan.context),
        a2a_data=list(plan.a2a_data),
        a2a_files=list(plan.a2a_files),
        bound_mcp_ids=list(servers),
        options=dict(plan.model_params.get("flow") or {}),
        call_tool=call_tool,
    )
    t1 = time.perf_counter()
    try:
        flow = flow_run(flow_graph=plan.flow_graph, settings=settings, trace=trace, emit=plan.emit)
    except RunCancelled:
        flow = FlowResult(error_code="cancelled", error_message="the run was cancelled")
        outcome.status = "cancelled"
    if flow.error_code == "cancelled":
        outcome.error_code, outcome.error_message = flow.error_code, flow.error_message
    elif flow.error_code:
        outcome.status, outcome.error_code = "failed", flow.error_code
        outcome.error_message = mask_text(flow.error_message, secrets=secrets)[:2000]
    else:
        outcome.answer = mask_text(flow.answer, secrets=secrets)
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


def _token_usage(messages: list[BaseMessage]) -> dict[str, int]:
    totals = {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0, "model_calls": 0}
    for m in messages:
        if isinstance(m, AIMessage):
            totals["model_calls"] += 1
            usage: dict[str, Any] = dict(m.usage_metadata or {})
            for key in ("input_tokens", "output_tokens", "total_tokens"):
                totals[key] += int(usage.get(key, 0) or 0)
    return totals
