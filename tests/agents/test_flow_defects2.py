"""A flow's end, its calls' count and its calls' ids:

1. A flow whose final state has no ``output`` (or None), or that called LangGraph's ``interrupt()``, succeeded
   with the answer "null" (the interrupt as a node ``__interrupt__``): now a ``flow:error`` saying why.
2. An output JSON cannot write (keys that are tuples, a cycle, a value whose ``__str__`` raises) made ``flow_run``
   raise (the run failed as ``internal``): now a ``flow:error``.
3. A flow's calls had no cap: one looping on a fast read wrote an audit event, a run event and a trace entry each
   until the run's time limit. Past ``PLATFORM_FLOW_MAX_CALLS`` the run fails as ``flow:too_many_calls``, also
   when the flow catches the exception.
4. A flow's calls were numbered in the order they arrived: two branches that run side by side swapped numbers
   between passes, so after an approval a branch's write met the other's approval (``approval:mismatch``), was
   asked again, and one write was lost. Each branch now numbers its own (``flow:<node>@<step>:<n>``); a step's
   only task keeps the run's order (``flow:1``, ``flow:2``), as before. A subgraph's calls belonged to no task:
   beside a plain branch that waited for its approval they were refused (and the other way round), and an approved
   write was lost; two ``Send``s to one subgraph shared its name's counter and swapped numbers between passes.
   Its calls now count as its parent task's, and are numbered under its parents' names, step and ``Send`` index
   (``flow:work#1@2/inner@1:1``); a call whose parent task cannot be named is refused (``flow:error``).
5. The HTTP pipeline template failed with an untranslated ``ValueError`` for a path ``urlsplit`` refuses: now a
   400 answer, as its other HTTP answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import operator
import sys
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from django.conf import settings as django_settings
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send, interrupt

from agents.approvals import approval_decide
from agents.execution import run_execute
from agents.flow_runner import FlowTaskStarts, flow_run
from agents.flows.common import FlowState
from agents.models import Agent, Approval, Run
from agents.services import api_key_create
from agents.tools import MCPHandle
from audit.models import AuditEvent
from mcpregistry.models import McpServer
from mcpregistry.pool import get_default_pool
from tests.agents.test_flow_defects import flow_agent, in_process, one_node, run, settings_for_nothing
from tests.conftest import discover_as_admin, make_agent, module_flow_graphs


@pytest.fixture(autouse=True)
def _this_module_s_flows_registered(settings: Any) -> None:
    """A worker runs only registered flow graphs: this module's ``build_*`` are (a test may register others)."""
    settings.PLATFORM_FLOW_GRAPHS = module_flow_graphs(__name__)


mcp = MCPHandle()


def flow(build: str) -> Any:
    return flow_run(flow_graph=f"{__name__}.{build}", settings=settings_for_nothing(), trace=[], emit=lambda k, d: None)


# ---- 1. A flow that ends without an output, or stops for input ---------------------------------------------------


async def answers_nothing(state: FlowState) -> dict[str, Any]:
    return {"team": "클라우드운영팀"}


async def answers_none(state: FlowState) -> dict[str, Any]:
    return {"output": None}


async def asks_a_person(state: FlowState) -> dict[str, Any]:
    name = interrupt("이름을 알려 주세요")
    return {"output": f"안녕하세요 {name}"}


build_answers_nothing = one_node(answers_nothing)
build_answers_none = one_node(answers_none)
build_asks_a_person = one_node(asks_a_person)


@pytest.mark.parametrize("build", ["build_answers_nothing", "build_answers_none"])
def test_a_flow_that_ends_without_an_output_is_a_flow_error_not_the_answer_null(build: str) -> None:
    result = flow(build)
    assert (result.error_code, result.error_message, result.answer) == (
        "flow:error",
        "The flow ended without an output.",
        "",
    )


def test_a_flow_that_stops_for_input_is_a_flow_error_that_says_to_use_an_approval() -> None:
    trace: list[dict[str, Any]] = []
    result = flow_run(
        flow_graph=f"{__name__}.build_asks_a_person",
        settings=settings_for_nothing(),
        trace=trace,
        emit=lambda k, d: None,
    )
    assert result.error_code == "flow:error", result
    assert "cannot pause for a person's input" in result.error_message and "approval" in result.error_message
    assert all(entry.get("node") != "__interrupt__" for entry in trace), trace


@pytest.mark.slow
@pytest.mark.django_db
def test_a_flow_run_without_an_output_fails(demo_server: McpServer) -> None:
    result = run(flow_agent(demo_server, "flow-no-output", f"{__name__}.build_answers_nothing"), "q")
    assert (result.status, result.error_code, result.answer) == (Run.Status.FAILED, "flow:error", "")


# ---- 2. An output JSON cannot write ---------------------------------------------------------------------------


class Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no text")


def cycle() -> list[Any]:
    looped: list[Any] = []
    looped.append(looped)
    return looped


def answers(output: Any) -> Any:
    async def node(state: FlowState) -> dict[str, Any]:
        return {"output": output()}

    return one_node(node)


build_tuple_keys = answers(lambda: {("김하늘", "팀장"): 1})
build_a_cycle = answers(cycle)
build_unprintable = answers(lambda: {"value": Unprintable()})
build_printable = answers(lambda: {"팀": "클라우드운영팀", "at": Path("/tmp")})


@pytest.mark.parametrize("build", ["build_tuple_keys", "build_a_cycle", "build_unprintable"])
def test_an_output_json_cannot_write_is_a_flow_error(build: str) -> None:
    result = flow(build)
    assert result.error_code == "flow:error", result
    assert result.error_message.startswith("The flow's output cannot be written as JSON: "), result.error_message


def test_an_output_of_odd_values_is_still_written_with_their_text() -> None:
    result = flow("build_printable")
    assert (result.error_code, json.loads(result.answer)) == ("", {"팀": "클라우드운영팀", "at": "/tmp"})


# ---- 3. The cap on a flow's calls -----------------------------------------------------------------------------


async def reads_on_and_on(state: FlowState) -> dict[str, Any]:
    for _i in range(50):
        with contextlib.suppress(Exception):  # a flow that goes on whatever happens
            await mcp.call("search_employee", params={"name": "김하늘"})
    return {"output": "done"}


async def build_reads_on_and_on(settings: Any) -> Any:
    await mcp.bind_registry(settings, mcp_ids=["sds-company-data"], mcp_id="sds-company-data")
    return await one_node(reads_on_and_on)(settings)


@pytest.mark.slow
@pytest.mark.django_db
def test_a_flow_that_calls_past_the_cap_fails_its_run_even_if_it_catches_the_stop(
    demo_server: McpServer, settings: Any
) -> None:
    settings.PLATFORM_FLOW_MAX_CALLS = 3
    result = run(flow_agent(demo_server, "flow-calls-on", f"{__name__}.build_reads_on_and_on"), "q")
    assert (result.status, result.error_code) == (Run.Status.FAILED, "flow:too_many_calls"), result.error_message
    assert "(3, PLATFORM_FLOW_MAX_CALLS)" in result.error_message
    assert result.answer == ""
    assert AuditEvent.objects.filter(run_id=result.id, action="tool.call").count() == 3
    assert len([e for e in result.messages if e.get("type") == "flow_call"]) == 3


# ---- 4. The ids of calls made side by side ----------------------------------------------------------------------


class TwoWritesState(FlowState, total=False):
    written: Annotated[list[str], operator.add]


PASSES: list[int] = []
FIRST_DONE: dict[int, asyncio.Event] = {}


async def start(state: TwoWritesState) -> dict[str, Any]:
    PASSES.append(len(PASSES) + 1)
    FIRST_DONE[len(PASSES)] = asyncio.Event()
    return {}


async def write_in_turn(me: str) -> Any:
    # The branches call in turn, in one order on odd passes and in the other on even ones (as their servers' speed
    # might have it): A first, then B first.
    this_pass = len(PASSES)
    first = "A" if this_pass % 2 else "B"
    if me != first:
        await FIRST_DONE[this_pass].wait()
    try:
        return await mcp.call("append_line", params={"text": me})
    finally:
        if me == first:
            FIRST_DONE[this_pass].set()


def writer(me: str) -> Any:
    async def write(state: TwoWritesState) -> dict[str, Any]:
        return {"written": [f"{me}={await write_in_turn(me)}"]}

    write.__name__ = f"write_{me.lower()}"
    return write


async def join(state: TwoWritesState) -> dict[str, Any]:
    return {"output": " / ".join(sorted(state.get("written") or []))}


async def build_two_writes(settings: Any) -> Any:
    await mcp.bind_registry(settings, mcp_ids=["two-writes"], mcp_id="two-writes")
    graph = StateGraph(TwoWritesState)
    graph.add_node("start", start)
    graph.add_node("write_a", writer("A"))
    graph.add_node("write_b", writer("B"))
    graph.add_node("join", join)
    graph.add_edge(START, "start")
    graph.add_edge("start", "write_a")
    graph.add_edge("start", "write_b")
    graph.add_edge(["write_a", "write_b"], "join")
    graph.add_edge("join", END)
    return graph.compile()


class OneWriteState(TypedDict, total=False):
    me: str
    written: Annotated[list[str], operator.add]


async def write_me(state: OneWriteState) -> dict[str, Any]:
    return {"written": [f"{state['me']}={await write_in_turn(state['me'])}"]}


def one_write(node: str, write: Any) -> Any:
    """A compiled subgraph whose only node ``node`` writes."""
    subgraph = StateGraph(OneWriteState)
    subgraph.add_node(node, write)
    subgraph.add_edge(START, node)
    subgraph.add_edge(node, END)
    return subgraph.compile()


async def build_a_write_beside_a_subgraph(settings: Any) -> Any:
    """``build_two_writes`` with B's branch a subgraph."""
    await mcp.bind_registry(settings, mcp_ids=["two-writes"], mcp_id="two-writes")
    graph = StateGraph(TwoWritesState)
    graph.add_node("start", start)
    graph.add_node("write_a", writer("A"))
    graph.add_node("write_b", one_write("inner_b", writer("B")))
    graph.add_node("join", join)
    graph.add_edge(START, "start")
    graph.add_edge("start", "write_a")
    graph.add_edge("start", "write_b")
    graph.add_edge(["write_a", "write_b"], "join")
    graph.add_edge("join", END)
    return graph.compile()


async def build_sends_to_a_subgraph(settings: Any) -> Any:
    """Two ``Send``s to one subgraph, A's first: each instance writes its own."""
    await mcp.bind_registry(settings, mcp_ids=["two-writes"], mcp_id="two-writes")
    graph = StateGraph(TwoWritesState)
    graph.add_node("start", start)
    graph.add_node("work", one_write("inner", write_me))
    graph.add_node("join", join)
    graph.add_edge(START, "start")
    graph.add_conditional_edges("start", lambda state: [Send("work", {"me": "A"}), Send("work", {"me": "B"})])
    graph.add_edge("work", "join")
    graph.add_edge("join", END)
    return graph.compile()


@pytest.fixture
def two_writes(request: Any, tmp_path: Path, settings: Any) -> Any:
    """A run of the flow ``build_two_writes``, or of the one named by the test's (indirect) parameter."""
    build = f"{__name__}.{getattr(request, 'param', 'build_two_writes')}"
    settings.PLATFORM_FLOW_GRAPHS = [build]
    file = tmp_path / "side-effects.txt"
    server = McpServer.objects.create(
        mcp_id="two-writes",
        name="two-writes",
        command=sys.executable,
        args=["-m", "tests.mcp_fixtures.side_effect_server"],
        cwd=str(django_settings.BASE_DIR),
        env={"SIDE_EFFECT_FILE": str(file), "SIDE_EFFECT_MODE": "ok"},  # type: ignore[misc]
        public_env=["SIDE_EFFECT_FILE", "SIDE_EFFECT_MODE"],
        session_scope="shared",
    )
    assert discover_as_admin(server=server).ok
    key, _raw = api_key_create(actor="test", via="tests", name="two-writes-caller")
    agent = make_agent(slug="two-writes", servers=[server], provider="offline", with_demo_rules=False)
    Agent.objects.filter(pk=agent.pk).update(mode="flow", flow_graph=build)
    PASSES.clear()
    yield Run.objects.create(agent=agent, api_key=key, query="기록해줘"), file
    get_default_pool().close("two-writes")


def approve_pass_by_pass(flow_run_: Run, decided: int | None) -> None:
    """Runs the flow pass after pass, approving after each the pending writes (all, or the first ``decided``)."""
    for _pass in range(4):
        run_execute(run_id=str(flow_run_.id))
        flow_run_.refresh_from_db()
        if flow_run_.status != Run.Status.AWAITING_APPROVAL:
            return
        for pending in flow_run_.approvals.filter(status=Approval.Status.PENDING).order_by("created_at")[:decided]:
            approval_decide(run=flow_run_, approval_id=str(pending.pk), decision="approve", actor="reviewer")


@pytest.mark.django_db
@pytest.mark.slow
@pytest.mark.parametrize("decided", [None, 1], ids=["all-at-once", "one-at-a-time"])
def test_writes_of_branches_side_by_side_are_each_approved_once_and_carried_out_once(
    two_writes: Any, decided: int | None
) -> None:
    """Both branches ask in the first pass (the one that parks first does not cancel the other). Decided one at a
    time, the next pass runs its branches in the other order: the approved write goes out beside the one that
    waits (before, it was cancelled, its approval ended unused as the run parked, and it was never written)."""
    flow_run_, file = two_writes
    approve_pass_by_pass(flow_run_, decided)

    assert flow_run_.status == Run.Status.SUCCEEDED, (flow_run_.error_code, flow_run_.error_message)
    assert len(PASSES) == (2 if decided is None else 3)
    assert "approval:" not in flow_run_.answer, flow_run_.answer
    assert sorted(line.split("\t")[0] for line in file.read_text(encoding="utf-8").splitlines()) == ["A", "B"]
    approvals = {a.args["text"]: (a.call_id, a.status) for a in flow_run_.approvals.all()}
    assert approvals == {
        "A": ("flow:write_a@2:1", Approval.Status.EXECUTED),
        "B": ("flow:write_b@2:1", Approval.Status.EXECUTED),
    }


@pytest.mark.django_db
@pytest.mark.slow
@pytest.mark.parametrize("two_writes", ["build_a_write_beside_a_subgraph"], indirect=True)
@pytest.mark.parametrize("decided", [None, 1], ids=["all-at-once", "one-at-a-time"])
def test_a_write_beside_a_subgraph_that_waits_for_its_approval_is_carried_out(
    two_writes: Any, decided: int | None
) -> None:
    """A subgraph's calls belong to its parent task: its branch runs beside the plain one. Before, once one of the
    two waited the other's calls were refused, an approved write ended unused as the run parked and was lost."""
    flow_run_, file = two_writes
    approve_pass_by_pass(flow_run_, decided)

    assert flow_run_.status == Run.Status.SUCCEEDED, (flow_run_.error_code, flow_run_.error_message)
    assert len(PASSES) == (2 if decided is None else 3)
    assert "approval:" not in flow_run_.answer, flow_run_.answer
    assert sorted(line.split("\t")[0] for line in file.read_text(encoding="utf-8").splitlines()) == ["A", "B"]
    approvals = {a.args["text"]: (a.call_id, a.status) for a in flow_run_.approvals.all()}
    assert approvals == {
        "A": ("flow:write_a@2:1", Approval.Status.EXECUTED),
        "B": ("flow:write_b@2/inner_b@1:1", Approval.Status.EXECUTED),
    }


@pytest.mark.django_db
@pytest.mark.slow
@pytest.mark.parametrize("two_writes", ["build_sends_to_a_subgraph"], indirect=True)
@pytest.mark.parametrize("decided", [None, 1], ids=["all-at-once", "one-at-a-time"])
def test_the_writes_of_sends_to_one_subgraph_keep_their_ids_whatever_their_order(
    two_writes: Any, decided: int | None
) -> None:
    """Each ``Send`` to a subgraph numbers its calls under its own index and step (``work#1@2/inner@1``). Before,
    both numbered under the node's name in the order they called: the next pass, in the other order, B's write met
    A's approval (``approval:mismatch``), A was asked again and B never written."""
    flow_run_, file = two_writes
    approve_pass_by_pass(flow_run_, decided)

    assert flow_run_.status == Run.Status.SUCCEEDED, (flow_run_.error_code, flow_run_.error_message)
    assert "approval:" not in flow_run_.answer, flow_run_.answer
    assert sorted(line.split("\t")[0] for line in file.read_text(encoding="utf-8").splitlines()) == ["A", "B"]
    approvals = sorted((a.args["text"], a.call_id, a.status) for a in flow_run_.approvals.all())
    assert approvals == [
        ("A", "flow:work#0@2/inner@1:1", Approval.Status.EXECUTED),
        ("B", "flow:work#1@2/inner@1:1", Approval.Status.EXECUTED),
    ]


@pytest.mark.slow
@pytest.mark.django_db
def test_a_step_s_only_task_numbers_in_the_runs_order_and_branches_their_own(demo_server: McpServer) -> None:
    result = run(flow_agent(demo_server, "flow-parallel-ids", "agents.flows.parallel.build_graph"), "김하늘 님 자산")
    assert result.status == Run.Status.SUCCEEDED, result.error_message
    calls = sorted(e["call_id"] for e in result.messages if e.get("type") == "flow_call")
    assert calls == ["flow:assets@1:1", "flow:employee@1:1"]
    audited = set(AuditEvent.objects.filter(run_id=result.id, action="tool.call").values_list("call_id", flat=True))
    assert audited == set(calls)


class LookUpState(FlowState, total=False):
    found: str


async def looks_up(state: LookUpState) -> dict[str, Any]:
    found = "없음"
    with contextlib.suppress(Exception):  # a flow that goes on whatever happens
        found = str(await mcp.call("search_employee", params={"name": "김하늘"}))
    return {"found": found}


async def build_a_call_from_a_subgraph(settings: Any) -> Any:
    await mcp.bind_registry(settings, mcp_ids=["sds-company-data"], mcp_id="sds-company-data")
    inner = StateGraph(LookUpState)
    inner.add_node("look_up", looks_up)
    inner.add_edge(START, "look_up")
    graph = StateGraph(LookUpState)
    graph.add_node("nested", inner.compile())
    graph.add_node("answer", answer_found)
    graph.add_edge(START, "nested")
    graph.add_edge("nested", "answer")
    return graph.compile()


async def answer_found(state: LookUpState) -> dict[str, Any]:
    return {"output": f"찾음: {state.get('found')}"}


@pytest.mark.slow
@pytest.mark.django_db
def test_a_subgraph_s_call_is_numbered_under_its_parent_task(demo_server: McpServer) -> None:
    result = run(flow_agent(demo_server, "flow-nested", f"{__name__}.build_a_call_from_a_subgraph"), "q")
    assert result.status == Run.Status.SUCCEEDED, result.error_message
    assert [e["call_id"] for e in result.messages if e.get("type") == "flow_call"] == ["flow:nested@1/look_up@1:1"]


@pytest.mark.slow
@pytest.mark.django_db
def test_a_subgraph_s_call_whose_parent_task_cannot_be_named_is_refused_and_fails_the_run(
    demo_server: McpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The subgraph's parent task not seen starting, its call's id could differ between passes (an approval given
    to another call): the call is not made, and the run fails although the flow caught the exception."""
    monkeypatch.setattr(FlowTaskStarts, "on_chain_start", lambda *args, **kwargs: None)
    result = run(flow_agent(demo_server, "flow-unnamed", f"{__name__}.build_a_call_from_a_subgraph"), "q")
    assert (result.status, result.error_code, result.answer) == (Run.Status.FAILED, "flow:error", "")
    # "The flow's call was not made: the subgraph task …", in the run's language (the agent's: Korean).
    assert result.error_message.startswith("플로우의 호출을 하지 않았습니다: 이 호출을 한 서브그래프 작업"), (
        result.error_message
    )
    assert not AuditEvent.objects.filter(run_id=result.id, action="tool.call").exists()
    assert [e for e in result.messages if e.get("type") == "flow_call"] == []


# ---- 5. A path the HTTP pipeline cannot read ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "a2a_data"),
    [("GET //[oops", None), ("", [{"request": {"method": "GET", "path": "//[x"}}])],
)
def test_the_http_pipeline_answers_400_for_a_path_it_cannot_read(query: str, a2a_data: Any) -> None:
    result, called = in_process("http_pipeline", query, {}, a2a_data=a2a_data)
    assert result.error_code == "", result
    assert json.loads(result.answer) == {"status": 400, "body": {"error": "malformed path"}}
    assert called == []
