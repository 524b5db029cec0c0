"""The ReAct loop as a small LangGraph graph: ``agent`` (the model) ⇄ ``tools`` (every call through the gate).

Built here rather than with ``create_react_agent`` so that no tool call can go around the gate: a tool the model
invents, a malformed call and a call that needs approval all reach ``call_tool`` (the engine's gate adapter),
and a call waiting for approval parks the graph instead of running. Nodes are small functions returning partial
updates; they never touch the ORM (the gate writes the audit).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypedDict

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AnyMessage, ToolMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.graph.state import CompiledStateGraph

from agents.errors import RunCancelled

__all__ = ["AgentState", "MaxIterationsReached", "RunCancelled", "build_react_graph", "unanswered_tool_calls"]


class AgentState(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    # Seed 000: the deterministic stage's results live in state["metadata"]["deterministic_results"].
    metadata: dict[str, Any]
    model_turns: int
    # Set when a tool call waits for a person's approval: the graph stops there and the run is parked.
    parked_on: str | None


class MaxIterationsReached(Exception):
    """The model wanted another turn after ``max_iterations``."""


ToolCaller = Callable[[dict[str, Any]], tuple[ToolMessage, str | None]]


def unanswered_tool_calls(messages: list[AnyMessage]) -> list[dict[str, Any]]:
    """The tool calls of the last model turn that have no result yet (what a resumed run must run first)."""
    last_ai = next((i for i in range(len(messages) - 1, -1, -1) if isinstance(messages[i], AIMessage)), None)
    if last_ai is None:
        return []
    answered = {m.tool_call_id for m in messages[last_ai + 1 :] if isinstance(m, ToolMessage)}
    ai = messages[last_ai]
    assert isinstance(ai, AIMessage)
    return [c for c in ai.tool_calls if c.get("id") not in answered]


def build_react_graph(
    *,
    model: BaseChatModel,
    tool_specs: list[dict[str, Any]],
    call_tool: ToolCaller,
    max_iterations: int,
    check_cancelled: Callable[[], None] = lambda: None,
    on_model_turn: Callable[[AIMessage], None] = lambda message: None,
) -> CompiledStateGraph:
    """``call_tool(tool_call)`` returns the ToolMessage for the model and, if the call must wait for approval,
    the approval id (the graph then stops with ``parked_on`` set)."""
    bound = model.bind_tools(tool_specs) if tool_specs else model

    def agent(state: AgentState) -> dict[str, Any]:
        check_cancelled()
        turns = state.get("model_turns", 0)
        if turns >= max_iterations:
            raise MaxIterationsReached(max_iterations)
        response = bound.invoke(state["messages"])
        if isinstance(response, AIMessage):
            on_model_turn(response)
        return {"messages": [response], "model_turns": turns + 1}

    def tools(state: AgentState) -> dict[str, Any]:
        check_cancelled()
        results: list[ToolMessage] = []
        for tool_call in unanswered_tool_calls(state["messages"]):
            message, parked_on = call_tool(tool_call)
            if parked_on is not None:
                return {"messages": results, "parked_on": parked_on}
            results.append(message)
        return {"messages": results, "parked_on": None}

    def after_agent(state: AgentState) -> str:
        return "tools" if unanswered_tool_calls(state["messages"]) else END

    def after_tools(state: AgentState) -> str:
        return END if state.get("parked_on") else "agent"

    def entry(state: AgentState) -> str:
        # A resumed run first runs the calls its last model turn left unanswered.
        return "tools" if unanswered_tool_calls(state["messages"]) else "agent"

    graph = StateGraph(AgentState)
    graph.add_node("agent", agent)
    graph.add_node("tools", tools)
    graph.add_conditional_edges(START, entry, {"tools": "tools", "agent": "agent"})
    graph.add_conditional_edges("agent", after_agent, {"tools": "tools", END: END})
    graph.add_conditional_edges("tools", after_tools, {"agent": "agent", END: END})
    return graph.compile()
