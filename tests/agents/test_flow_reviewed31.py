"""A flow that parked, a branch's bug beside the park, and a flow's own loop bound. Confirmed with the real stdio
server (``tests/mcp_fixtures/side_effect_server.py``), whose file counts what it really did:

1. A branch's bug was thrown away when another branch of its step parked on a write: the run waited for the
   approval with no error recorded, the person approved, and the next pass sent the write and failed anyway. A
   branch beside the parked one cannot depend on its call: its error is the flow's, and fails the run in that
   pass (``flow:error``); the approval ends unused, the write is never put to a person.
2. After a node caught the ``FlowParked`` of its write, the next node's calls went out (a read sent on each pass,
   a second approval asked for): a task of a later step counted as "beside" the parked one. Only the tasks of the
   parked task's own step call on; nothing of a later step goes out until the run resumes.
3. A flow past its own loop bound (LangGraph's ``recursion_limit``) failed as ``flow:error`` with LangGraph's
   English developer message (a troubleshooting link) and a logged traceback: now ``flow:too_many_steps`` with a
   translated message, logged without a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import operator
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import pytest
from django.conf import settings as django_settings
from langgraph.graph import END, START, StateGraph

from agents.approvals import approval_decide
from agents.execution import run_execute
from agents.flow_runner import FlowCallIds, FlowSettings, flow_run
from agents.flows.common import FlowState
from agents.models import Agent, Approval, Run
from agents.tools import MCPHandle
from audit.models import AuditEvent
from mcpregistry.models import McpServer, ToolContract
from mcpregistry.pool import get_default_pool
from tests.conftest import discover_as_admin, make_agent, module_flow_graphs


@pytest.fixture(autouse=True)
def _this_module_s_flows_registered(settings: Any) -> None:
    """A worker runs only registered flow graphs: this module's ``build_*`` are (a test may register others)."""
    settings.PLATFORM_FLOW_GRAPHS = module_flow_graphs(__name__)


MCP_ID = "flow-reviewed31"
mcp = MCPHandle()


class BranchState(FlowState, total=False):
    got: Annotated[list[str], operator.add]
    turns: int


# ---- flows ---------------------------------------------------------------------------------------------------------


async def build_park_beside_bug(settings: Any) -> Any:
    """Branch ``writer`` asks for a write's approval; branch ``boom`` reads, waits until the write has parked,
    then fails (the order the reviewer saw, patched in rather than slept for)."""
    await mcp.bind_registry(settings, mcp_ids=[MCP_ID], mcp_id=MCP_ID)
    write_asked = asyncio.Event()

    async def writer(state: BranchState) -> dict[str, Any]:
        try:
            written = await mcp.call("append_line", params={"text": "병렬 기록"})
        finally:
            write_asked.set()
        return {"got": [f"writer={written}"]}

    async def boom(state: BranchState) -> dict[str, Any]:
        await mcp.call("record_read", params={"key": "before-boom"})
        await write_asked.wait()
        raise ValueError("branch 실패")

    async def join(state: BranchState) -> dict[str, Any]:
        return {"output": " | ".join(state.get("got", []))}

    graph = StateGraph(BranchState)
    graph.add_node("writer", writer)
    graph.add_node("boom", boom)
    graph.add_node("join", join)
    graph.add_edge(START, "writer")
    graph.add_edge(START, "boom")
    graph.add_edge(["writer", "boom"], "join")
    graph.add_edge("join", END)
    return graph.compile()


async def build_park_beside_bug_in_a_subgraph(settings: Any) -> Any:
    """``build_park_beside_bug`` inside one subgraph node: its inner ``boom`` fails beside its inner ``writer``'s
    park (the flow's task stream names only the subgraph node, the parked call's parent)."""
    await mcp.bind_registry(settings, mcp_ids=[MCP_ID], mcp_id=MCP_ID)
    write_asked = asyncio.Event()

    async def writer(state: BranchState) -> dict[str, Any]:
        try:
            await mcp.call("append_line", params={"text": "서브 기록"})
        finally:
            write_asked.set()
        return {"got": ["writer"]}

    async def boom(state: BranchState) -> dict[str, Any]:
        await mcp.call("record_read", params={"key": "sub-read"})
        await write_asked.wait()
        raise ValueError("서브 실패")

    inner = StateGraph(BranchState)
    inner.add_node("writer", writer)
    inner.add_node("boom", boom)
    inner.add_edge(START, "writer")
    inner.add_edge(START, "boom")
    inner.add_edge("writer", END)
    inner.add_edge("boom", END)

    async def done(state: BranchState) -> dict[str, Any]:
        return {"output": "done"}

    graph = StateGraph(BranchState)
    graph.add_node("sub", inner.compile())
    graph.add_node("done", done)
    graph.add_edge(START, "sub")
    graph.add_edge("sub", "done")
    graph.add_edge("done", END)
    return graph.compile()


async def write_or_raise(state: BranchState) -> dict[str, Any]:
    try:
        written = await mcp.call("append_line", params={"text": "기록"})
    except Exception as exc:  # a node that turns every failure into its own error, its park included
        raise RuntimeError("쓰기 실패") from exc
    return {"output": str(written)}


async def build_write_or_raise(settings: Any) -> Any:
    await mcp.bind_registry(settings, mcp_ids=[MCP_ID], mcp_id=MCP_ID)
    graph = StateGraph(BranchState)
    graph.add_node("writer", write_or_raise)
    graph.add_edge(START, "writer")
    graph.add_edge("writer", END)
    return graph.compile()


async def writer_catches(state: BranchState) -> dict[str, Any]:
    with contextlib.suppress(Exception):  # a node that goes on whatever happens
        await mcp.call("append_line", params={"text": "먼저"})
    return {"got": ["writer"]}


async def after(state: BranchState) -> dict[str, Any]:
    seen = await mcp.call("record_read", params={"key": "after-park"})
    written = await mcp.call("append_line", params={"text": "나중에"})
    return {"output": f"{seen} / {written}"}


async def build_caught_then_next(settings: Any) -> Any:
    await mcp.bind_registry(settings, mcp_ids=[MCP_ID], mcp_id=MCP_ID)
    graph = StateGraph(BranchState)
    graph.add_node("writer", writer_catches)
    graph.add_node("after", after)
    graph.add_edge(START, "writer")
    graph.add_edge("writer", "after")
    graph.add_edge("after", END)
    return graph.compile()


async def spin(state: BranchState) -> dict[str, Any]:
    return {"turns": state.get("turns", 0) + 1}


def spin_again(state: BranchState) -> str:
    return "spin" if state["turns"] < 30 else "done"


async def done(state: BranchState) -> dict[str, Any]:
    return {"output": "끝"}


async def build_bounded_loop(settings: Any) -> Any:
    graph = StateGraph(BranchState)
    graph.add_node("spin", spin)
    graph.add_node("done", done)
    graph.add_edge(START, "spin")
    graph.add_conditional_edges("spin", spin_again, ["spin", "done"])
    graph.add_edge("done", END)
    return graph.compile().with_config(recursion_limit=5)


# ---- fixtures ------------------------------------------------------------------------------------------------------


@pytest.fixture
def side_effects(tmp_path: Path, settings: Any, db: Any) -> Iterator[tuple[McpServer, Path]]:
    """The real side-effect server, ``record_read`` a read and ``append_line`` a write that waits for approval."""
    settings.PLATFORM_FLOW_GRAPHS = [
        f"{__name__}.build_park_beside_bug",
        f"{__name__}.build_caught_then_next",
        f"{__name__}.build_bounded_loop",
        f"{__name__}.build_write_or_raise",
        f"{__name__}.build_park_beside_bug_in_a_subgraph",
    ]
    file = tmp_path / "side-effects.txt"
    server = McpServer.objects.create(
        mcp_id=MCP_ID,
        name=MCP_ID,
        command=sys.executable,
        args=["-m", "tests.mcp_fixtures.side_effect_server"],
        cwd=str(django_settings.BASE_DIR),
        env={"SIDE_EFFECT_FILE": str(file), "SIDE_EFFECT_MODE": "ok"},  # type: ignore[misc]  # an encrypted JSON field
        public_env=["SIDE_EFFECT_FILE", "SIDE_EFFECT_MODE"],
        session_scope="shared",
        timeout_s=10,
    )
    assert discover_as_admin(server=server).ok
    ToolContract.objects.filter(tool__server=server, tool__name="record_read").update(risk="read")
    yield server, file
    get_default_pool().close(MCP_ID)


def flow_run_of(server: McpServer, build: str) -> Run:
    agent = make_agent(slug="flow-reviewed31", servers=[server], provider="offline", with_demo_rules=False)
    Agent.objects.filter(pk=agent.pk).update(mode="flow", flow_graph=f"{__name__}.{build}")
    return Run.objects.create(agent=agent, query="기록해줘")


def execute(run: Run) -> Run:
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    return run


def lines(file: Path) -> list[str]:
    return file.read_text(encoding="utf-8").splitlines() if file.exists() else []


# ---- 1. a branch's bug beside a park ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_branchs_bug_beside_a_parked_write_fails_the_run_and_never_asks_for_the_write(
    side_effects: tuple[McpServer, Path],
) -> None:
    server, file = side_effects
    run = execute(flow_run_of(server, "build_park_beside_bug"))

    assert (run.status, run.error_code) == (Run.Status.FAILED, "flow:error"), run.error_message
    assert run.error_message == "ValueError: branch 실패"
    approval = Approval.objects.get(run=run)
    assert (approval.status, approval.tool) == (Approval.Status.EXPIRED, "append_line")  # ended unused
    assert AuditEvent.objects.filter(run_id=run.id, action="approval.unused").count() == 1
    assert lines(file) == ["read:before-boom"]  # the write never went out


@pytest.mark.slow
def test_a_bug_beside_a_parked_write_inside_a_subgraph_fails_the_run_too(side_effects: tuple[McpServer, Path]) -> None:
    """The failure is known only as its subgraph node's, a parent of the parked call: it may be a sibling's (as
    here) or the parked call's own, which cannot be told apart; the write is not put to a person either way."""
    server, file = side_effects
    run = execute(flow_run_of(server, "build_park_beside_bug_in_a_subgraph"))

    assert (run.status, run.error_code) == (Run.Status.FAILED, "flow:error"), run.error_message
    assert Approval.objects.get(run=run).status == Approval.Status.EXPIRED
    assert lines(file) == ["read:sub-read"]


@pytest.mark.slow
def test_a_node_that_turns_its_park_into_its_own_error_still_waits_for_the_approval(
    side_effects: tuple[McpServer, Path],
) -> None:
    """Its error follows from the park (the task that parked raised it): not a failure beside the park."""
    server, file = side_effects
    run = execute(flow_run_of(server, "build_write_or_raise"))

    assert run.status == Run.Status.AWAITING_APPROVAL, (run.error_code, run.error_message)
    approval = Approval.objects.get(run=run)
    approval_decide(run=run, approval_id=str(approval.pk), decision="approve", actor="reviewer")
    run = execute(run)

    assert run.status == Run.Status.SUCCEEDED, (run.error_code, run.error_message)
    assert lines(file) == ["기록\t"]


# ---- 2. the next node after a caught park ----------------------------------------------------------------------------


@pytest.mark.slow
def test_a_node_after_one_that_caught_its_park_calls_nothing_until_the_run_resumes(
    side_effects: tuple[McpServer, Path],
) -> None:
    server, file = side_effects
    run = execute(flow_run_of(server, "build_caught_then_next"))

    assert run.status == Run.Status.AWAITING_APPROVAL
    assert lines(file) == []  # the next node's read was not sent
    assert not AuditEvent.objects.filter(run_id=run.id, tool="record_read").exists()
    approval = Approval.objects.get(run=run)  # the next node's write was not asked for
    assert (approval.tool, approval.args) == ("append_line", {"text": "먼저"})

    approval_decide(run=run, approval_id=str(approval.pk), decision="approve", actor="reviewer")
    run = execute(run)

    assert run.status == Run.Status.AWAITING_APPROVAL  # now on the next node's own write
    assert lines(file) == ["먼저\t", "read:after-park"]  # the read went out once, after the first write
    waiting = Approval.objects.get(run=run, status=Approval.Status.PENDING)
    assert waiting.args == {"text": "나중에"}


def test_branches_of_one_step_beside_a_park_still_call_on_but_not_the_next_step() -> None:
    """Where a parked task and a calling one part: both tasks of one step (beside), or of two steps (not)."""
    call_ids = FlowCallIds()
    call_ids.task_seen({"langgraph_checkpoint_ns": "writer:t1", "langgraph_node": "writer", "langgraph_step": 1})
    call_ids.task_seen({"langgraph_checkpoint_ns": "boom:t2", "langgraph_node": "boom", "langgraph_step": 1})
    call_ids.task_seen({"langgraph_checkpoint_ns": "after:t3", "langgraph_node": "after", "langgraph_step": 2})
    call_ids.task_seen({"langgraph_checkpoint_ns": "boom:t2|inner:t4", "langgraph_node": "inner", "langgraph_step": 1})

    assert call_ids.beside(("boom:t2",), ("writer:t1",))
    assert call_ids.beside(("boom:t2", "inner:t4"), ("writer:t1",))  # a subgraph of a branch beside it
    assert not call_ids.beside(("after:t3",), ("writer:t1",))  # the next step
    assert not call_ids.beside(("writer:t1",), ("writer:t1",))  # the parked task itself
    assert not call_ids.beside(("unseen:t9",), ("writer:t1",))  # a task whose step is unknown


# ---- 3. a flow's own loop bound --------------------------------------------------------------------------------------


def nothing_to_call(mcp_id: str, tool: str, params: dict[str, Any]) -> Any:
    raise AssertionError("the flow calls no tool")


def test_a_flow_past_its_own_loop_bound_is_told_in_words_of_its_own_without_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = FlowSettings(
        run_id="r",
        query="q",
        context={},
        a2a_data=[],
        a2a_files=[],
        bound_mcp_ids=[],
        options={},
        call_tool=nothing_to_call,
    )
    with caplog.at_level(logging.INFO, logger="agents.flow_runner"):
        result = flow_run(
            flow_graph=f"{__name__}.build_bounded_loop",
            settings=settings,
            trace=[],
            emit=lambda kind, data: None,
            call_ids=FlowCallIds(),
        )

    assert result.error_code == "flow:too_many_steps", result
    assert result.error_message == (
        "The flow was stopped: it ran more steps than its graph allows (recursion_limit 5) without reaching its end."
    )
    assert [record.exc_info for record in caplog.records] == [None]  # told once, no traceback


@pytest.mark.slow
def test_a_flow_run_past_its_own_loop_bound_fails_as_too_many_steps(side_effects: tuple[McpServer, Path]) -> None:
    server, _file = side_effects
    run = execute(flow_run_of(server, "build_bounded_loop"))

    assert (run.status, run.error_code) == (Run.Status.FAILED, "flow:too_many_steps")
    assert "docs.langchain.com" not in run.error_message and "recursion_limit 5" in run.error_message
