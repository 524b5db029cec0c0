"""The ReAct loop as a small LangGraph graph: ``agent`` (the model) ⇄ ``tools`` (every call through the gate).

Built here rather than with ``create_react_agent`` so that no tool call can go around the gate: a tool the model
invents, a malformed call and a call that needs approval all reach ``call_tool`` (the engine's gate adapter),
and a call waiting for approval parks the graph instead of running. Nodes are small functions returning partial
updates; they never touch the ORM (the gate writes the audit).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Annotated, Any, TypedDict, cast

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import set_config_context
from langgraph.errors import GraphRecursionError
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.graph.state import CompiledStateGraph

from agents.errors import MUST_PROPAGATE, RunCancelled

__all__ = [
    "HISTORY_MARK",
    "AgentState",
    "MaxIterationsReached",
    "ReactGraph",
    "RunCancelled",
    "build_react_graph",
    "history_answer",
    "is_history_answer",
    "model_turn_count",
    "unanswered_tool_calls",
]


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
# Given the conversation and the run's model-turn count, the tool specs to bind for this turn and the
# ``tool_choice`` to force (None: the model chooses).
# All the unanswered calls of a model turn at once: their ToolMessages in the order asked, and the approval id
# if one of them must wait (the messages then stop before it).
BatchCaller = Callable[[list[dict[str, Any]]], tuple[list[ToolMessage], str | None]]
TurnTools = Callable[[list[AnyMessage], int], tuple[list[dict[str, Any]], str | None]]
# Given the conversation and the tool specs about to be bound, the keyword arguments of this model call (the
# engine caps ``max_tokens`` to what is left of the run's budget reservation); it raises to refuse the call.
BeforeModelCall = Callable[[list[AnyMessage], list[dict[str, Any]]], dict[str, Any]]
# A model turn's call past its cap (``max_calls_per_turn``): its refusal, never sent (the engine audits it).
OverCapRefuser = Callable[[dict[str, Any]], ToolMessage]


# An answer of an earlier turn of the conversation (A2A ``contextId``), given to the model before the run's question:
# marked in its ``response_metadata`` (never sent to a provider; kept with a stored conversation), so that it is not
# taken for one of this run's model turns (``max_iterations``, the first turn a tool is forced on, ``model_calls``,
# the scripted model's place in its script).
HISTORY_MARK = "platform_history"


def history_answer(text: str) -> AIMessage:
    """An earlier turn's answer as the model reads it: an AI message marked as no model turn of this run."""
    return AIMessage(text, response_metadata={HISTORY_MARK: True})


def is_history_answer(message: Any) -> bool:
    """Whether ``message`` (a message, or its ``messages_to_dict`` form) is an earlier turn's answer."""
    if isinstance(message, dict):
        data = message.get("data")
        metadata = data.get("response_metadata") if isinstance(data, dict) else None
        return message.get("type") == "ai" and isinstance(metadata, dict) and bool(metadata.get(HISTORY_MARK))
    return isinstance(message, AIMessage) and bool((message.response_metadata or {}).get(HISTORY_MARK))


def model_turn_count(messages: Any) -> int:
    """How many of ``messages`` (messages, or their ``messages_to_dict`` forms) are model turns of this run: its
    AI messages, less the earlier turns' answers of the conversation."""
    count = 0
    for message in messages:
        ai = message.get("type") == "ai" if isinstance(message, dict) else isinstance(message, AIMessage)
        if ai and not is_history_answer(message):
            count += 1
    return count


def unanswered_tool_calls(messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
    """The tool calls of the last model turn that have no result yet (what a resumed run must run first)."""
    last_ai = next((i for i in range(len(messages) - 1, -1, -1) if isinstance(messages[i], AIMessage)), None)
    if last_ai is None:
        return []
    answered = {m.tool_call_id for m in messages[last_ai + 1 :] if isinstance(m, ToolMessage)}
    ai = messages[last_ai]
    assert isinstance(ai, AIMessage)
    return [c for c in turn_calls(ai) if c.get("id") not in answered]


def turn_calls(ai: AIMessage) -> list[dict[str, Any]]:
    """The calls a model turn asked for, in order: its tool calls, then those whose arguments did not parse
    (langchain's ``invalid_tool_calls``: arguments that are no JSON, cut short or malformed). Those go to the gate
    like any other, with their arguments as the text the model wrote, and come back refused (``args:json``) with
    what to do next: the model sees why its call did not run instead of the run ending on a turn that seems to
    have asked for nothing. A turn cut off at its token limit is the exception: asked again under the same limit,
    the model would be cut again, so the engine fails the run (``model:max_tokens``) and sends none of its calls;
    so it does for a turn its provider filtered or found malformed (``providers.UNFINISHED_TURN_CODES``)."""
    calls: list[dict[str, Any]] = list(ai.tool_calls)  # type: ignore[arg-type]
    for invalid in ai.invalid_tool_calls:
        calls.append(
            {
                "name": invalid.get("name") or "",
                "args": invalid.get("args"),
                "id": invalid.get("id"),
                "type": "tool_call",
            }
        )
    return calls


_CALL_BLOCK_TYPES = frozenset({"tool_use", "tool_call", "function_call"})


RESERVED_CALL_ID_PREFIXES = ("rule:", "flow:")


def with_unique_call_ids(response: AIMessage, earlier: list[AnyMessage]) -> AIMessage:
    """``response`` with every tool call under an id no other call of the run has (``<id>_r2``, ``_r3``, ...; a call
    without one: ``call_rN``), in its tool calls and in the provider's own forms of them (content blocks,
    ``additional_kwargs``), in order. Some models number their calls per turn (``call_0`` every turn) or repeat
    an id within one: the platform keys a call's approval, its result and its place in the trace by its id, so a
    second call under an id already used would be taken for the first (its approval's recorded outcome returned,
    the call itself never sent). Ids are made unique as the turn is received, before anything is recorded; the
    conversation keeps them, so a resumed run sees the same ones."""
    if not response.tool_calls and not response.invalid_tool_calls:
        return response
    taken: set[str] = set()
    for message in earlier:
        if isinstance(message, AIMessage):
            taken.update(str(c.get("id") or "") for c in turn_calls(message))
        elif isinstance(message, ToolMessage):
            taken.add(str(message.tool_call_id))
    taken.discard("")
    renamed: dict[str, list[str]] = {}  # an id as the model gave it -> the ids its calls get, in order

    def unique_id(call: Any) -> str:
        given = str(call.get("id") or "")
        unique = given
        # The platform's own call ids (a deterministic rule's ``rule:…``, a flow's ``flow:…``) name calls an admin
        # configured, which the run's caller may approve: a model (or its server) giving one would pass its own
        # write off as the admin's. Such an id is renamed as a repeated one is.
        reserved = given.startswith(RESERVED_CALL_ID_PREFIXES)
        if not given or given in taken or reserved:
            # ``_r2``, ``_r3``...: letters, digits and ``_`` only, at most 64 characters (Bedrock's ToolUseId is
            # [a-zA-Z0-9_.:-]+ of 64 at most; some OpenAI-compatible servers are stricter still).
            base, number = (("model_" + given.replace(":", "_")) if reserved else (given or "call"))[:56], 2
            while f"{base}_r{number}" in taken:
                number += 1
            unique = f"{base}_r{number}"
        taken.add(unique)
        renamed.setdefault(given, []).append(unique)
        return unique

    calls = [{**call, "id": unique_id(call)} for call in response.tool_calls]
    invalid = [{**call, "id": unique_id(call)} for call in response.invalid_tool_calls]
    if all(ids == [given] for given, ids in renamed.items()):
        return response
    queues = {given: list(ids) for given, ids in renamed.items()}

    def next_id(given: Any) -> Any:
        queue = queues.get(str(given or ""))
        return queue.pop(0) if queue else given

    content: Any = response.content
    if isinstance(content, list):
        content = [
            {**block, "id": next_id(block.get("id"))}
            if isinstance(block, dict) and block.get("type") in _CALL_BLOCK_TYPES
            else block
            for block in content
        ]
    queues = {given: list(ids) for given, ids in renamed.items()}
    additional = dict(response.additional_kwargs)
    if isinstance(additional.get("tool_calls"), list):
        additional["tool_calls"] = [
            {**raw, "id": next_id(raw.get("id"))} if isinstance(raw, dict) else raw for raw in additional["tool_calls"]
        ]
    return response.model_copy(
        update={"tool_calls": calls, "invalid_tool_calls": invalid, "content": content, "additional_kwargs": additional}
    )


# A UTF-16 surrogate code point, which no UTF-8 encoder writes: half of a pair, as a JSON "\ud83d" without its other
# half decodes.
_SURROGATE = re.compile("[\ud800-\udfff]")


def _holds_surrogate(value: Any) -> bool:
    if isinstance(value, str):
        return not value.isascii() and _SURROGATE.search(value) is not None
    if isinstance(value, dict):
        return any(_holds_surrogate(k) or _holds_surrogate(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_holds_surrogate(item) for item in value)
    return False


def _valid_unicode(value: Any) -> Any:
    """``value`` with each text in it (its names too) valid Unicode: a lone surrogate becomes U+FFFD, and the two
    halves of a pair that arrived apart are joined again."""
    if isinstance(value, str):
        return value.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    if isinstance(value, dict):
        return {_valid_unicode(k): _valid_unicode(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_valid_unicode(item) for item in value)
    return value


_TURN_PARTS = ("content", "tool_calls", "invalid_tool_calls", "additional_kwargs", "response_metadata")


def with_valid_unicode(response: AIMessage) -> AIMessage:
    """``response`` with a lone surrogate (``"\\ud83d"``, valid JSON in a provider's reply) replaced by U+FFFD
    wherever the turn holds text: its content, its tool calls' names and arguments (parsed or as written), the
    provider's own forms of them. Made as the turn is received, before anything reads it: no UTF-8 encoder writes
    a lone surrogate, so the MCP request carrying such an argument failed to encode (taken for the server's
    transport failure, retried and counted by its circuit breaker), and so did every later model request, which
    sends the turn back. Returns ``response`` itself where it holds none."""
    changed = {part: getattr(response, part) for part in _TURN_PARTS}
    changed = {part: _valid_unicode(value) for part, value in changed.items() if _holds_surrogate(value)}
    return response.model_copy(update=changed) if changed else response


@dataclass(frozen=True)
class ReactParts:
    """What one run brings to the ReAct graph: its model, tools and callbacks. The graph itself is compiled once
    per process (``_compiled``); its nodes find the run's parts in the invocation's config."""

    model: BaseChatModel
    bound: Any
    call_tool: ToolCaller
    max_iterations: int
    check_cancelled: Callable[[], None]
    on_model_turn: Callable[[AIMessage], None]
    turn_tools: TurnTools | None
    call_batch: BatchCaller | None
    tool_specs: list[dict[str, Any]]
    before_model_call: BeforeModelCall
    max_calls_per_turn: int | None = None
    refuse_over_cap: OverCapRefuser | None = None


class ReactGraph:
    """A run's handle on the shared compiled graph: ``invoke`` hands the run's parts to the nodes."""

    def __init__(self, parts: ReactParts) -> None:
        self.parts = parts

    def invoke(self, state: dict[str, Any], config: RunnableConfig | None = None) -> dict[str, Any]:
        """The graph's run of ``state``. Where it would start with a model turn, that turn is taken here by the
        graph's own ``agent`` node, as the graph would take it: the invocation's config (its callbacks) is the
        model's, and the reply is merged by the graph's reducer (``add_messages``: ids for every message). The
        graph then runs only if the model asked for tools, starting with them, with one step fewer to go. A run
        answered in one turn (the deterministic stage found what was asked) thus never enters LangGraph's step
        loop, which cost more than the offline model's turn itself (1.1 ms of 1.75 ms, timed in a run)."""
        run_config: dict[str, Any] = dict(config or {})
        run_config["configurable"] = {**(run_config.get("configurable") or {}), _PARTS: self.parts}
        if _entry(cast(AgentState, state)) == "agent":
            with set_config_context(cast(RunnableConfig, run_config)) as context:
                update = context.run(_agent, cast(AgentState, state), cast(RunnableConfig, run_config))
            messages = add_messages(add_messages([], state.get("messages") or []), update["messages"])
            state = {**state, "messages": messages, "model_turns": update["model_turns"]}
            if _after_agent(cast(AgentState, state)) == END:
                return state
            if "recursion_limit" in run_config:  # the turn taken here was the graph's first step
                run_config["recursion_limit"] = int(run_config["recursion_limit"]) - 1
                if run_config["recursion_limit"] < 1:
                    raise GraphRecursionError(f"Recursion limit of {run_config['recursion_limit'] + 1} reached")
        return dict(_compiled().invoke(state, config=cast(RunnableConfig, run_config)))


def build_react_graph(
    *,
    model: BaseChatModel,
    tool_specs: list[dict[str, Any]],
    call_tool: ToolCaller,
    max_iterations: int,
    check_cancelled: Callable[[], None] = lambda: None,
    on_model_turn: Callable[[AIMessage], None] = lambda message: None,
    turn_tools: TurnTools | None = None,
    call_batch: BatchCaller | None = None,
    before_model_call: BeforeModelCall = lambda messages, specs: {},
    max_calls_per_turn: int | None = None,
    refuse_over_cap: OverCapRefuser | None = None,
) -> ReactGraph:
    """``call_tool(tool_call)`` returns the ToolMessage for the model and, if the call must wait for approval,
    the approval id (the graph then stops with ``parked_on`` set). With ``turn_tools``, each model turn binds
    the tools it returns (top-K selection, a forced first call) instead of ``tool_specs``, and the choice it
    returns is the only one forced (the model's ``first_turn_tool_choice`` is then ``turn_tools``' to apply).
    ``before_model_call``
    runs before every model call and gives the call's keyword arguments, or raises to refuse it. With
    ``max_calls_per_turn``, a turn's calls after that many (by their place in the turn) are never sent: each is
    answered with ``refuse_over_cap(tool_call)``."""
    return ReactGraph(
        ReactParts(
            model=model,
            # With ``turn_tools`` each turn binds its own (a provider's refusal is then the turn's model failure).
            bound=model.bind_tools(tool_specs) if tool_specs and turn_tools is None else model,
            call_tool=call_tool,
            max_iterations=max_iterations,
            check_cancelled=check_cancelled,
            on_model_turn=on_model_turn,
            turn_tools=turn_tools,
            call_batch=call_batch,
            tool_specs=tool_specs,
            before_model_call=before_model_call,
            max_calls_per_turn=max_calls_per_turn,
            refuse_over_cap=refuse_over_cap,
        )
    )


_PARTS = "react_parts"


def _parts(config: RunnableConfig) -> ReactParts:
    parts = (config.get("configurable") or {}).get(_PARTS)
    assert isinstance(parts, ReactParts), "the ReAct graph is invoked through build_react_graph(...).invoke"
    return parts


def _agent(state: AgentState, config: RunnableConfig) -> dict[str, Any]:
    parts = _parts(config)
    parts.check_cancelled()
    turns = state.get("model_turns", 0)  # this run's turns (an earlier turn of the conversation is none)
    if turns >= parts.max_iterations:
        raise MaxIterationsReached(parts.max_iterations)
    runnable = parts.bound
    specs = parts.tool_specs
    tool_choice: Any = None
    if parts.turn_tools is not None:
        # The offer forces the first tool, the model's own forcing choice included (the engine gives it as the
        # offer's ``force_first_tool`` where the agent names none): a forced tool is then offered, and a tool no
        # longer offered (withdrawn, outside the hard filters) is not forced. Forcing it here besides would name
        # a tool the turn was not given, which every provider refuses.
        specs, tool_choice = parts.turn_tools(state["messages"], turns)
    elif turns == 0:
        # The model's own forced choice (``model_params.tool_choice`` "any" or a tool's name) holds for the run's
        # first turn only, as ``force_first_tool`` does: forced on every turn, the model could never answer.
        tool_choice = getattr(parts.model, "first_turn_tool_choice", None)
    if parts.turn_tools is not None or (specs and tool_choice):
        runnable = _bound(parts.model, specs, tool_choice)
    response = runnable.invoke(state["messages"], **parts.before_model_call(state["messages"], specs))
    if isinstance(response, AIMessage):
        response = with_unique_call_ids(with_valid_unicode(response), state["messages"])
        parts.on_model_turn(response)
    return {"messages": [response], "model_turns": turns + 1}


def _bound(model: BaseChatModel, specs: list[dict[str, Any]], tool_choice: Any) -> Any:
    """The model with this turn's tools bound. Binding is the model's (its provider's) work: a refusal there (a
    tool choice the model does not take) is a model failure (``model:validation``), not the platform's."""
    if not specs:
        return model
    from agents.providers import ModelCallFailed

    try:
        return model.bind_tools(specs, tool_choice=tool_choice) if tool_choice else model.bind_tools(specs)
    except MUST_PROPAGATE:
        raise
    except Exception as exc:  # the provider refused the tools or the choice: a value, not a crash
        # Whole: the engine masks the detail before it cuts it (a secret cut first would no longer be found).
        raise ModelCallFailed(kind="validation", detail=f"{type(exc).__name__}: {exc}", attempts=0) from exc


def _over_cap(messages: Sequence[BaseMessage], limit: int | None) -> set[str]:
    """The ids of the last model turn's calls past its first ``limit`` (none without a limit). By their place in
    the turn, not among the calls still unanswered: a run resumed after an approval sends no more of the turn's
    calls than one that never stopped."""
    last_ai = next((m for m in reversed(messages) if isinstance(m, AIMessage)), None)
    if limit is None or last_ai is None:
        return set()
    return {str(c.get("id")) for c in turn_calls(last_ai)[limit:]}


def _tools(state: AgentState, config: RunnableConfig) -> dict[str, Any]:
    parts = _parts(config)
    calls = unanswered_tool_calls(state["messages"])
    over = _over_cap(state["messages"], parts.max_calls_per_turn) if parts.refuse_over_cap is not None else set()
    sent = [c for c in calls if str(c.get("id")) not in over]
    refused = [c for c in calls if str(c.get("id")) in over]
    if parts.call_batch is not None:
        # The batch caller checks before each call it sends (the engine's ``call_tool``, ``ParallelCalls.run``).
        answered, parked = parts.call_batch(sent)
        return {"messages": [*answered, *_refused_over_cap(parts, refused)], "parked_on": parked}
    results: list[ToolMessage] = []
    for tool_call in sent:
        # Before each call, not once per turn: a run stopped after a turn's first call sends none of the rest.
        parts.check_cancelled()
        message, parked_on = parts.call_tool(tool_call)
        if parked_on is not None:
            return {"messages": [*results, *_refused_over_cap(parts, refused)], "parked_on": parked_on}
        results.append(message)
    return {"messages": [*results, *_refused_over_cap(parts, refused)], "parked_on": None}


def _refused_over_cap(parts: ReactParts, calls: list[dict[str, Any]]) -> list[ToolMessage]:
    """The refusals of a turn's calls past its cap, in the turn's order (none sent)."""
    if not calls or parts.refuse_over_cap is None:
        return []
    return [parts.refuse_over_cap(call) for call in calls]


def _after_agent(state: AgentState) -> str:
    return "tools" if unanswered_tool_calls(state["messages"]) else END


def _after_tools(state: AgentState) -> str:
    return END if state.get("parked_on") else "agent"


def _entry(state: AgentState) -> str:
    # A resumed run first runs the calls its last model turn left unanswered.
    return "tools" if unanswered_tool_calls(state["messages"]) else "agent"


@lru_cache(maxsize=1)
def _compiled() -> CompiledStateGraph:
    """The graph, compiled once per process (compiling costs more than a tool call; it holds no run's state)."""
    graph = StateGraph(AgentState)
    graph.add_node("agent", _agent)
    graph.add_node("tools", _tools)
    graph.add_conditional_edges(START, _entry, {"tools": "tools", "agent": "agent"})
    graph.add_conditional_edges("agent", _after_agent, {"tools": "tools", END: END})
    graph.add_conditional_edges("tools", _after_tools, {"agent": "agent", END: END})
    return graph.compile()
