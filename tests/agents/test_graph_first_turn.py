"""The ReAct graph's first model turn is taken outside LangGraph's step loop (``ReactGraph.invoke``): what a run
gets must be what the graph alone gives, turn for turn, with the same callbacks, errors and step limit."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langgraph.errors import GraphRecursionError

from agents import graph as react
from agents.llm import ScriptedChatModel

SPECS = [
    {
        "type": "function",
        "function": {"name": "lookup", "description": "look up", "parameters": {"type": "object", "properties": {}}},
    }
]


class Recorder(BaseCallbackHandler):
    """What the callbacks see: chain starts (LangGraph's step loop announces itself and each node) and model
    starts."""

    def __init__(self) -> None:
        self.chains: list[str] = []
        self.models = 0

    def on_chain_start(self, serialized: Any, inputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self.chains.append(str(kwargs.get("name") or (serialized or {}).get("name")))

    def on_chat_model_start(self, serialized: Any, messages: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self.models += 1


def make(script: list[dict[str, Any]], *, max_iterations: int = 5) -> tuple[react.ReactGraph, list[dict[str, Any]]]:
    calls: list[dict[str, Any]] = []

    def call_tool(tool_call: dict[str, Any]) -> tuple[ToolMessage, str | None]:
        calls.append(tool_call)
        if tool_call["args"].get("park"):
            return ToolMessage(content="", tool_call_id=tool_call["id"]), "approval-1"
        return ToolMessage(content=f"result {len(calls)}", tool_call_id=tool_call["id"], name="lookup"), None

    graph = react.build_react_graph(
        model=ScriptedChatModel(script=script),
        tool_specs=SPECS,
        call_tool=call_tool,
        max_iterations=max_iterations,
    )
    return graph, calls


def start(turns: int = 0, messages: list[BaseMessage] | None = None) -> dict[str, Any]:
    return {
        "messages": messages or [SystemMessage("system"), HumanMessage("김하늘 님은 어느 팀 소속인가요?")],
        "metadata": {"deterministic_results": []},
        "model_turns": turns,
    }


def graph_alone(graph: react.ReactGraph, state: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """The graph as it ran every turn before: LangGraph's compiled graph from the first step."""
    config = {**config, "configurable": {react._PARTS: graph.parts}}
    return dict(react._compiled().invoke(state, config=config))  # type: ignore[arg-type]


def shape(state: dict[str, Any]) -> dict[str, Any]:
    """The state without the random message ids (each must be set, as the graph's reducer sets them)."""
    messages = state["messages"]
    assert all(m.id for m in messages), "every message gets an id, as LangGraph's reducer gives"
    assert len({m.id for m in messages}) == len(messages)
    return {
        **{k: v for k, v in state.items() if k != "messages"},
        "messages": [
            (
                type(m).__name__,
                m.content,
                [(c["name"], c["args"], c["id"]) for c in m.tool_calls] if isinstance(m, AIMessage) else None,
                m.tool_call_id if isinstance(m, ToolMessage) else None,
            )
            for m in messages
        ],
    }


ANSWERS = [{"content": "클라우드운영팀 소속입니다."}]
USES_A_TOOL = [
    {"tool_calls": [{"name": "lookup", "args": {"q": "김하늘"}, "id": "call_1"}]},
    {"content": "답: {last_tool_result}"},
]
PARKS = [{"tool_calls": [{"name": "lookup", "args": {"park": True}, "id": "call_p"}]}]


@pytest.mark.parametrize("script", [ANSWERS, USES_A_TOOL, PARKS], ids=["one turn", "a tool, then the answer", "parks"])
def test_the_run_gets_what_the_graph_alone_gives(script: list[dict[str, Any]]) -> None:
    fast, fast_calls = make(script)
    alone, alone_calls = make(script)
    got = fast.invoke(start(), config={"recursion_limit": 30})
    expected = graph_alone(alone, start(), {"recursion_limit": 30})
    assert shape(got) == shape(expected)
    assert fast_calls == alone_calls
    assert got["model_turns"] == (1 if script is not USES_A_TOOL else 2)


def test_a_one_turn_answer_never_enters_the_step_loop_and_its_model_call_reaches_the_callbacks() -> None:
    recorder = Recorder()
    graph, _ = make(ANSWERS)
    state = graph.invoke(start(), config={"callbacks": [recorder], "recursion_limit": 30})
    assert recorder.models == 1
    assert recorder.chains == []  # LangGraph announces the graph and each node as a chain: none ran
    assert state["messages"][-1].content == "클라우드운영팀 소속입니다."

    recorder = Recorder()
    graph, _ = make(USES_A_TOOL)
    graph.invoke(start(), config={"callbacks": [recorder], "recursion_limit": 30})
    assert recorder.models == 2
    assert "tools" in recorder.chains and recorder.chains.count("agent") == 1  # the second turn, in the graph


def test_a_conversation_that_already_holds_messages_keeps_their_ids() -> None:
    graph, _ = make(ANSWERS)
    earlier = [SystemMessage("system", id="s"), HumanMessage("앞 질문", id="h"), AIMessage("앞 답", id="a")]
    state = graph.invoke(start(turns=1, messages=[*earlier, HumanMessage("다음 질문")]), config={})
    assert [m.id for m in state["messages"][:3]] == ["s", "h", "a"]
    assert state["model_turns"] == 2


@pytest.mark.parametrize("limit", [1, 2, 3, 4, 5, 6])
def test_the_step_limit_counts_the_first_turn(limit: int) -> None:
    """A model that always asks for a tool: the graph alone and the run stop at the same step, with the same
    error, after the same tool calls."""
    always = [{"tool_calls": [{"name": "lookup", "args": {}, "id": f"call_{i}"}]} for i in range(20)]
    fast, fast_calls = make(always, max_iterations=50)
    alone, alone_calls = make(always, max_iterations=50)
    with pytest.raises(GraphRecursionError):
        graph_alone(alone, start(), {"recursion_limit": limit})
    with pytest.raises(GraphRecursionError):
        fast.invoke(start(), config={"recursion_limit": limit})
    assert [c["id"] for c in fast_calls] == [c["id"] for c in alone_calls]


def test_a_first_turn_over_the_iterations_raises_as_the_graph_does() -> None:
    fast, _ = make(ANSWERS, max_iterations=1)
    alone, _ = make(ANSWERS, max_iterations=1)
    with pytest.raises(react.MaxIterationsReached):
        graph_alone(alone, start(turns=1), {})
    with pytest.raises(react.MaxIterationsReached):
        fast.invoke(start(turns=1), config={})


def test_a_resumed_run_with_unanswered_calls_starts_with_the_tools() -> None:
    """The first step is then the tools node: the graph runs from the start, as before."""
    asked = AIMessage("", tool_calls=[{"name": "lookup", "args": {}, "id": "call_r", "type": "tool_call"}])
    fast, fast_calls = make([{"tool_calls": []}, {"content": "끝"}])
    state = fast.invoke(start(turns=1, messages=[HumanMessage("질문"), asked]), config={"recursion_limit": 30})
    assert [c["id"] for c in fast_calls] == ["call_r"]
    assert isinstance(state["messages"][2], ToolMessage) and state["model_turns"] == 2
