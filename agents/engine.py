"""The run engine: input guardrail → deterministic stage → LangGraph ReAct loop → output guardrail.

``execute(plan)`` takes everything a run needs as plain values (the bound servers are passed through to the
gate, which writes the audit) and returns a ``RunOutcome``; it never raises for a tool's or a model's
failure. Every tool call, deterministic or the model's, goes through ``mcpregistry.gate``.
"""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from asgiref.sync import async_to_sync, sync_to_async
from celery.exceptions import SoftTimeLimitExceeded
from django.db import DatabaseError
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    messages_from_dict,
    messages_to_dict,
)
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.errors import GraphRecursionError

from agents.deterministic import RuleDecision, RuleSpec, decide, render_answer
from agents.graph import MaxIterationsReached, RunCancelled, build_react_graph
from agents.llm import build_chat_model
from agents.selectors import tool_name_conflicts
from agents.tools import CodeRuleError, DeterministicContext, load_code_rule
from audit.masking import mask_text, mask_value
from audit.services import audit_event_record
from mcpregistry import gate
from mcpregistry.models import McpServer, McpTool

logger = logging.getLogger(__name__)

# Seed 000's error texts, in its own words.
DETERMINISTIC_STAGE_FAILED = "확정 호출된 MCP 단계에서 오류가 발생했습니다"
MCP_NOT_LOADED = "MCP '{mcp_id}'의 tool이 로드되지 않음"
NO_RULE_MATCHED = (
    "확정 호출 규칙에 해당하는 질문이 아니어서 오프라인 모델로는 답할 수 없습니다. "
    "직원, 팀 인원, 자산, 프로젝트에 대해 물어보세요."
)


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


class _Clock:
    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.tools_ms = 0.0

    def ms_since(self, t0: float) -> float:
        return round((time.perf_counter() - t0) * 1000, 2)


def _secrets(plan: RunPlan) -> list[str]:
    return [s for server in plan.servers for s in server.secret_values()]


def _stage_failure(code: str, message: str) -> RunOutcome:
    return RunOutcome(status="failed", error_code=code, error_message=message)


def _rule_tools(plan: RunPlan, server: McpServer, who: Callable[[str, str], gate.GateCall]) -> list[BaseTool]:
    """``DeterministicContext.mcp_tools``: the server's callable tools as LangChain tools (name, description,
    input schema); calling one goes through the gate like everything else."""

    def make(tool_name: str) -> Callable[..., str]:
        def run(**kwargs: Any) -> str:
            return gate.call(server=server, tool_name=tool_name, args=kwargs, who=who("deterministic", "")).for_model()

        return run

    return [
        StructuredTool(
            name=t.name,
            description=t.description or t.name,
            args_schema=t.input_schema or {"type": "object", "properties": {}},
            func=make(t.name),
        )
        for t in server.tools.all()
        if t.callable
    ]


def _decide_code_rule(
    plan: RunPlan, rule: RuleSpec, servers: dict[str, McpServer], who: Callable[[str, str], gate.GateCall]
) -> tuple[str, RuleDecision | None, RunOutcome | None]:
    """Run a ``@deterministic_tool`` function. Returns (mcp_id, decision, failure)."""
    try:
        fn, mcp_id = load_code_rule(rule.code)
    except CodeRuleError as exc:
        logger.warning("deterministic rule %s cannot be loaded: %s", rule.name, exc)
        return "", None, _stage_failure("deterministic:rule_error", f"{DETERMINISTIC_STAGE_FAILED}: {exc}")
    server = servers.get(mcp_id)
    if server is None or not server.enabled:
        return mcp_id, None, _stage_failure(f"mcp:not_loaded:{mcp_id}", MCP_NOT_LOADED.format(mcp_id=mcp_id))
    ctx = DeterministicContext(
        query=plan.query,
        context=dict(plan.context),
        a2a_data=list(plan.a2a_data) or None,
        a2a_files=list(plan.a2a_files) or None,
        mcp_tools=_rule_tools(plan, server, who),
    )
    try:
        returned = fn(ctx)
    except Exception as exc:
        logger.exception("deterministic rule %s raised", rule.name)
        return (
            mcp_id,
            None,
            _stage_failure(
                "deterministic:rule_error", f"{DETERMINISTIC_STAGE_FAILED}: {rule.name} ({type(exc).__name__})"
            ),
        )
    if returned is None:
        return mcp_id, RuleDecision(rule.rule_id, rule.name, False, "returned None"), None
    if not isinstance(returned, dict) or not isinstance(returned.get("tool_name"), str):
        return (
            mcp_id,
            None,
            _stage_failure(
                "deterministic:rule_error",
                f"{DETERMINISTIC_STAGE_FAILED}: {rule.name} returned {type(returned).__name__}, "
                'not {"tool_name": ..., "params": {...}} or None',
            ),
        )
    params = returned.get("params") or {}
    return (
        mcp_id,
        RuleDecision(rule.rule_id, rule.name, True, "matched", params=params, tool_name=returned["tool_name"]),
        None,
    )


def run_deterministic_stage(
    plan: RunPlan, trace: list[dict[str, Any]], who: Callable[[str, str], gate.GateCall]
) -> tuple[list[dict[str, Any]], RunOutcome | None]:
    """Seed 000's deterministic stage: evaluate the rules in order; every match calls its tool through the
    gate, one after another (also across servers), and the results accumulate.

    Returns the results, or an outcome that ends the run before any model call: a rule that raises or returns
    a tool its server lacks (``확정 호출된 MCP 단계에서 오류가 발생했습니다``), a rule whose ``mcp_id`` is not
    bound (``MCP '<id>'의 tool이 로드되지 않음``), or a call waiting for approval (the run parks). Each rule's
    decision — matched with which parameters, or skipped and why — goes to the trace and the audit.
    """
    servers = {s.mcp_id: s for s in plan.servers}
    results: list[dict[str, Any]] = []
    # A stage parked on an approval is run again on resume: finished calls are reused, not repeated.
    earlier = {r["rule_id"]: r for r in plan.previous_results if r.get("error") != "approval:pending"}
    for rule in plan.rules:
        if rule.rule_id in earlier:
            results.append(earlier[rule.rule_id])
            continue
        if rule.code:
            mcp_id, decision, failure = _decide_code_rule(plan, rule, servers, who)
            if failure is not None:
                trace.append({"type": "rule", "rule": rule.name, "matched": False, "reason": failure.error_code})
                return results, failure
            assert decision is not None
            tool_name = decision.tool_name
        else:
            mcp_id, tool_name = rule.mcp_id, rule.tool_name
            server = servers.get(mcp_id)
            if server is None or not server.enabled:
                trace.append(
                    {"type": "rule", "rule": rule.name, "matched": False, "reason": f"mcp:not_loaded:{mcp_id}"}
                )
                return results, _stage_failure(f"mcp:not_loaded:{mcp_id}", MCP_NOT_LOADED.format(mcp_id=mcp_id))
            decision = decide(
                rule,
                query=plan.query,
                context=plan.context,
                a2a_data=plan.a2a_data,
                available_tools={t.name for t in server.tools.all() if t.callable},
            )
        server = servers[mcp_id]
        record = {**decision.as_dict(), "mcp_id": mcp_id, "tool": tool_name}
        trace.append({"type": "rule", **record})
        plan.emit("rule", record)
        audit_event_record(
            source="deterministic",
            action="rule.decision",
            run_id=plan.run_id,
            mcp_id=mcp_id,
            tool=tool_name,
            call_id=f"rule:{rule.rule_id}",
            args=decision.params or {},
            result={"rule": rule.name, "matched": decision.matched, "reason": decision.reason},
            reason="rule:matched" if decision.matched else "rule:skipped",
            attempt=0,
            actor=plan.actor,
            secrets=server.secret_values(),
        )
        if not decision.matched:
            continue
        known = any(t.name == tool_name and t.callable for t in server.tools.all())
        result = gate.call(
            server=server,
            tool_name=tool_name,
            args=decision.params or {},
            who=who("deterministic", f"rule:{rule.rule_id}"),
            known_tool=known,
        )
        if result.error == "approval:pending":
            trace.append(
                {"type": "approval", "approval_id": result.approval_id, "tool": tool_name, "args": result.args}
            )
            return results, RunOutcome(status="awaiting_approval", parked_on=result.approval_id)
        entry = {
            "rule": rule.name,
            "rule_id": rule.rule_id,
            **result.as_dict(),
            "match": decision.match,
            "answer_template": rule.answer_template,
        }
        results.append(entry)
        public = {k: v for k, v in entry.items() if k != "answer_template"}
        trace.append({"type": "deterministic_call", **public})
        plan.emit("deterministic_result", public)
        if not known:
            return results, _stage_failure(
                "deterministic:tool_unknown",
                f"{DETERMINISTIC_STAGE_FAILED}: '{tool_name}' tool이 MCP '{mcp_id}'에 없습니다.",
            )
    logger.info("Deterministic pre-step done: %d", len(results))
    return results, None


def system_message_text(plan: RunPlan, results: list[dict[str, Any]]) -> str:
    """The system prompt, with the deterministic results injected as reference material (seed 000)."""
    parts = [plan.system_prompt.strip()] if plan.system_prompt.strip() else []
    if results:
        shown = [
            {k: r[k] for k in ("tool", "args", "ok", "value", "error", "message") if r.get(k) not in (None, "")}
            for r in results
        ]
        parts.append(
            f"{plan.deterministic_instruction.strip()}\n\n[확정 호출 결과]\n"
            + json.dumps(shown, ensure_ascii=False, indent=2)
        )
    return "\n\n".join(parts)


def compose_offline_answer(plan: RunPlan, results: list[dict[str, Any]]) -> str:
    """The offline provider's answer: each result phrased by its rule's template (or listed plainly), then
    wrapped by the agent's template."""
    if not results:
        return NO_RULE_MATCHED
    lines = []
    for r in results:
        if r["ok"] and r.get("answer_template"):
            lines.append(
                render_answer(
                    r["answer_template"],
                    query=plan.query,
                    match=r.get("match") or {},
                    params=r["args"],
                    value=r["value"],
                )
            )
        elif r["ok"]:
            value = r["value"] if isinstance(r["value"], str) else json.dumps(r["value"], ensure_ascii=False)
            lines.append(f"{r['tool']}: {value}")
        else:
            lines.append(f"{r['tool']}: {r['message']}")
    body = "\n".join(lines)
    if plan.answer_template.strip():
        return plan.answer_template.replace("{results}", body).replace("{query}", plan.query)
    return body


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
    if plan.conversation:
        results = [dict(r) for r in plan.previous_results]
        failed = None
    else:
        results, failed = run_deterministic_stage(plan, trace, who)
    deterministic_ms = clock.ms_since(t0)
    public_results = [{k: v for k, v in r.items() if k != "answer_template"} for r in results]
    outcome.deterministic_results = results
    if failed is not None:
        failed.deterministic_results = results
        failed.messages = trace
        failed.timings = {"deterministic_ms": deterministic_ms, "total_ms": clock.ms_since(clock.started)}
        return failed

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
        outcome.answer = mask_text(compose_offline_answer(plan, results), secrets=secrets)
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
        messages = [SystemMessage(system_message_text(plan, results)), HumanMessage(plan.query)]
    model = build_chat_model(
        provider=plan.provider,
        model_id=plan.model_id,
        params=plan.model_params,
        offline_answer=compose_offline_answer(plan, results),
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
            outcome.answer = mask_text(_text_of(last), secrets=secrets) if isinstance(last, AIMessage) else ""
    except (MaxIterationsReached, GraphRecursionError):
        outcome.status = "failed"
        outcome.error_code = "max_iterations"
        outcome.error_message = f"the agent did not finish within {plan.max_iterations} iterations"
    except (SoftTimeLimitExceeded, DatabaseError):
        raise  # the task's time limit or a database hiccup: handled (and retried) by the task, not a model error
    except RunCancelled:
        outcome.status = "cancelled"
        outcome.error_code = "cancelled"
        outcome.error_message = "the run was cancelled"
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
    outcome.timings = {
        "deterministic_ms": deterministic_ms,
        "model_ms": round(max(loop_ms - clock.tools_ms, 0.0), 2),
        "tools_ms": round(clock.tools_ms, 2),
        "total_ms": clock.ms_since(clock.started),
    }
    return outcome


@dataclass
class FlowSettings:
    """What a flow's ``build_graph(settings)`` receives: the run's input, the servers it may bind, and the
    agent's options (``model_params["flow"]``). ``call_tool`` is the gate, used through ``MCPHandle``."""

    run_id: Any
    query: str
    context: dict[str, Any]
    a2a_data: list[dict[str, Any]]
    a2a_files: list[dict[str, Any]]
    bound_mcp_ids: list[str]
    options: dict[str, Any]
    call_tool: Callable[[str, str, dict[str, Any]], Any]

    def option(self, name: str, default: Any = None) -> Any:
        return self.options.get(name, default)


def load_flow_builder(path: str) -> Callable[[FlowSettings], Any]:
    module_name, _, attribute = path.rpartition(".")
    try:
        builder = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError, ValueError) as exc:
        raise CodeRuleError(f"flow graph '{path}' cannot be loaded: {exc}") from exc
    if not callable(builder):
        raise CodeRuleError(f"flow graph '{path}' is not a function")
    return builder  # type: ignore[no-any-return]


def _execute_flow(
    plan: RunPlan,
    outcome: RunOutcome,
    trace: list[dict[str, Any]],
    who: Callable[[str, str], gate.GateCall],
    secrets: list[str],
    clock: _Clock,
    deterministic_ms: float,
) -> RunOutcome:
    """Flow mode (seed 000): the agent's graph, built by the function its ``flow_graph`` names; its nodes call
    tools through ``MCPHandle``, i.e. through the gate (source ``flow``). The answer is the state's ``output``."""
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

    async def run_flow() -> dict[str, Any]:
        builder = load_flow_builder(plan.flow_graph)
        graph = builder(settings)
        if inspect.isawaitable(graph):
            graph = await graph
        final: dict[str, Any] = {}
        inputs = {"query": plan.query, "context": dict(plan.context), "a2a_data": list(plan.a2a_data), "messages": []}
        async for mode, chunk in graph.astream(inputs, stream_mode=["updates", "values"]):
            if mode == "values":
                final = chunk
                continue
            for node, update in (chunk or {}).items():
                keys = sorted((update or {}).keys()) if isinstance(update, dict) else []
                trace.append({"type": "flow_node", "node": node, "updated": keys})
                await sync_to_async(plan.emit, thread_sensitive=True)("flow_node", {"node": node, "updated": keys})
        return final

    try:
        state = async_to_sync(run_flow)()
        output = state.get("output")
        text = output if isinstance(output, str) else json.dumps(output, ensure_ascii=False, default=str)
        outcome.answer = mask_text(text or "", secrets=secrets)
        trace.append({"type": "answer", "content": outcome.answer})
    except CodeRuleError as exc:
        outcome.status, outcome.error_code, outcome.error_message = "failed", "flow:error", str(exc)
    except Exception as exc:
        logger.exception("flow %s failed in run %s", plan.flow_graph, plan.run_id)
        outcome.status, outcome.error_code = "failed", "flow:error"
        outcome.error_message = mask_text(f"{type(exc).__name__}: {exc}", secrets=secrets)[:2000]
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


def _text_of(message: BaseMessage | None) -> str:
    if message is None:
        return ""
    if isinstance(message.content, str):
        return message.content
    return "".join(b.get("text", "") if isinstance(b, dict) else str(b) for b in message.content)


def _token_usage(messages: list[BaseMessage]) -> dict[str, int]:
    totals = {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0, "model_calls": 0}
    for m in messages:
        if isinstance(m, AIMessage):
            totals["model_calls"] += 1
            usage = m.usage_metadata or {}
            for key in ("input_tokens", "output_tokens", "total_tokens"):
                totals[key] += int(usage.get(key, 0) or 0)
    return totals
