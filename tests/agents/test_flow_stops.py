"""A flow stops where its run stops, as the ReAct loop does between its steps: a run cancelled while its flow
runs sends no further call, an approved write included (it used to go out after the cancellation), also when the
flow catches the exception; a flow that never ends is cancelled before its run's time limit, instead of running
on in the worker's event loop thread after Celery's soft limit stopped the run.

The server is real (``tests/mcp_fixtures/side_effect_server.py``); its file counts what it really did."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings as django_settings
from langgraph.graph import END, START, StateGraph

from agents.approvals import approval_decide
from agents.execution import run_execute
from agents.flow_runner import FlowSettings, flow_run
from agents.flows.common import FlowState
from agents.models import Agent, Approval, Run
from agents.services import api_key_create, run_cancel
from agents.tools import MCPHandle
from mcpregistry.models import McpServer
from mcpregistry.pool import get_default_pool
from tests.conftest import discover_as_admin, make_agent

MCP_ID = "flow-stops"
mcp = MCPHandle()
RUN: dict[str, Any] = {}
PASSES: list[int] = []


def cancel_now() -> None:
    run_cancel(run=Run.objects.get(pk=RUN["id"]), actor="caller", source="api")


async def read_cancel_read(state: FlowState) -> dict[str, Any]:
    await mcp.call("record_read", params={"key": "before"})
    await sync_to_async(cancel_now)()
    for i in range(3):
        with contextlib.suppress(Exception):  # a flow that goes on whatever happens
            await mcp.call("record_read", params={"key": f"after-{i}"})
    return {"output": "done"}


async def read_then_write(state: FlowState) -> dict[str, Any]:
    PASSES.append(1)
    await mcp.call("record_read", params={"key": "k"})
    if len(PASSES) == 2:  # the pass resumed after the approval: the caller cancels while the flow reads
        await sync_to_async(cancel_now)()
    written = await mcp.call("append_line", params={"text": "쓰기"})
    return {"output": str(written)}


FOREVER_ENDED = threading.Event()


async def forever(state: FlowState) -> dict[str, Any]:
    try:
        while True:
            await asyncio.sleep(0.05)
    finally:  # cancelled: it does not run on in the event loop's thread
        FOREVER_ENDED.set()


def graph_of(node: Any) -> Any:
    async def build(settings: Any) -> Any:
        await mcp.bind_registry(settings, mcp_ids=[MCP_ID], mcp_id=MCP_ID)
        graph = StateGraph(FlowState)
        graph.add_node("n", node)
        graph.add_edge(START, "n")
        graph.add_edge("n", END)
        return graph.compile()

    return build


build_read_cancel_read = graph_of(read_cancel_read)
build_read_then_write = graph_of(read_then_write)


async def build_forever(settings: Any) -> Any:
    graph = StateGraph(FlowState)
    graph.add_node("forever", forever)
    graph.add_edge(START, "forever")
    graph.add_edge("forever", END)
    return graph.compile()


@pytest.fixture
def flow_agent(tmp_path: Path, settings: Any, db: Any) -> Any:
    file = tmp_path / "side-effects.txt"
    settings.PLATFORM_FLOW_GRAPHS = [f"{__name__}.build_read_cancel_read", f"{__name__}.build_read_then_write"]
    server = McpServer.objects.create(
        mcp_id=MCP_ID,
        name=MCP_ID,
        command=sys.executable,
        args=["-m", "tests.mcp_fixtures.side_effect_server"],
        cwd=str(django_settings.BASE_DIR),
        env={"SIDE_EFFECT_FILE": str(file), "SIDE_EFFECT_MODE": "ok"},
        public_env=["SIDE_EFFECT_FILE", "SIDE_EFFECT_MODE"],
        session_scope="shared",
    )
    assert discover_as_admin(server=server).ok
    agent = make_agent(slug="flow-stops", servers=[server], provider="offline", with_demo_rules=False)

    def start(graph: str) -> tuple[Run, Path]:
        Agent.objects.filter(pk=agent.pk).update(mode="flow", flow_graph=f"{__name__}.{graph}")
        key, _raw = api_key_create(actor="test", via="tests", name=f"caller-{graph}")
        run = Run.objects.create(agent=agent, api_key=key, query="흐름")
        RUN["id"] = run.pk
        return run, file

    yield start
    get_default_pool().close(MCP_ID)


def lines(file: Path) -> list[str]:
    return file.read_text(encoding="utf-8").splitlines() if file.exists() else []


@pytest.mark.slow
def test_a_cancelled_flow_calls_nothing_more_even_if_it_catches_the_stop(flow_agent: Any) -> None:
    run, file = flow_agent("build_read_cancel_read")

    run_execute(run_id=str(run.id))

    run.refresh_from_db()
    assert run.status == Run.Status.CANCELLED
    assert lines(file) == ["read:before"]


@pytest.mark.slow
def test_an_approved_flow_write_is_not_sent_once_the_run_is_cancelled(flow_agent: Any) -> None:
    PASSES.clear()
    run, file = flow_agent("build_read_then_write")
    run_execute(run_id=str(run.id))
    approval = Approval.objects.get(run=run)
    approval_decide(run=run, approval_id=str(approval.pk), decision="approve", actor="reviewer")

    run_execute(run_id=str(run.id))

    run.refresh_from_db()
    approval.refresh_from_db()
    assert run.status == Run.Status.CANCELLED
    assert lines(file) == ["read:k", "read:k"]  # the write never went out
    assert approval.status == Approval.Status.EXPIRED  # and reads so


def test_a_flow_that_never_ends_is_cancelled_before_its_time_limit(settings: Any) -> None:
    settings.PLATFORM_FLOW_GRAPHS = [f"{__name__}.build_forever"]
    flow_settings = FlowSettings(
        run_id="r",
        query="q",
        context={},
        a2a_data=[],
        a2a_files=[],
        bound_mcp_ids=[],
        options={},
        call_tool=lambda *a: None,
    )
    deadline = time.monotonic() + 1.5
    FOREVER_ENDED.clear()

    result = flow_run(
        flow_graph=f"{__name__}.build_forever",
        settings=flow_settings,
        trace=[],
        emit=lambda *a: None,
        time_left=lambda: deadline - time.monotonic(),
    )

    assert (result.error_code, result.error_message) == (
        "time_limit",
        "the run did not finish within its time limit",
    )
    assert time.monotonic() < deadline  # before Celery's soft limit would interrupt the worker
    assert FOREVER_ENDED.wait(2)


shared = MCPHandle()


async def build_two_calls(settings: Any) -> Any:
    await shared.bind_registry(settings, mcp_ids=["s"], mcp_id="s")

    async def node(state: FlowState) -> dict[str, Any]:
        first = await shared.call("t", params={})
        await asyncio.sleep(0.2)  # the other run binds the same handle meanwhile
        second = await shared.call("t", params={})
        return {"output": f"{first},{second}"}

    graph = StateGraph(FlowState)
    graph.add_node("n", node)
    graph.add_edge(START, "n")
    graph.add_edge("n", END)
    return graph.compile()


def test_two_runs_of_one_flow_at_once_each_call_through_their_own_gate(settings: Any) -> None:
    """A flow's handle is declared once per module: its binding was the last run's, so under a threaded pool one
    run's calls went through the other run's gate (its run id, approvals, memo and audit)."""
    from concurrent.futures import ThreadPoolExecutor

    settings.PLATFORM_FLOW_GRAPHS = [f"{__name__}.build_two_calls"]

    def run(name: str) -> str:
        flow_settings = FlowSettings(
            run_id=name,
            query="q",
            context={},
            a2a_data=[],
            a2a_files=[],
            bound_mcp_ids=["s"],
            options={},
            call_tool=lambda mcp_id, tool, params: name,
        )
        result = flow_run(
            flow_graph=f"{__name__}.build_two_calls", settings=flow_settings, trace=[], emit=lambda *a: None
        )
        return result.answer

    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(run, ["run-a", "run-b"]))
    assert answers == ["run-a,run-a", "run-b,run-b"]


async def times_out_itself(state: FlowState) -> dict[str, Any]:
    raise TimeoutError("the HR API read timed out")


async def build_times_out_itself(settings: Any) -> Any:
    graph = StateGraph(FlowState)
    graph.add_node("n", times_out_itself)
    graph.add_edge(START, "n")
    graph.add_edge("n", END)
    return graph.compile()


def test_a_flows_own_timeout_is_its_error_not_the_runs_time_limit(settings: Any) -> None:
    settings.PLATFORM_FLOW_GRAPHS = [f"{__name__}.build_times_out_itself"]
    flow_settings = FlowSettings(
        run_id="r", query="q", context={}, a2a_data=[], a2a_files=[], bound_mcp_ids=[], options={}, call_tool=print
    )
    result = flow_run(
        flow_graph=f"{__name__}.build_times_out_itself",
        settings=flow_settings,
        trace=[],
        emit=lambda *a: None,
        time_left=lambda: 60.0,
    )
    assert (result.error_code, result.error_message) == ("flow:error", "TimeoutError: the HR API read timed out")
