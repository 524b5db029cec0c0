"""A flow's write call waits for a person's approval as the ReAct loop's does: the run is ``awaiting_approval``
(never ``succeeded`` past a pending approval); once approved, the flow runs again from its start and the write
is carried out once; rejected, the flow is told so and finishes."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from langgraph.graph import END, START, StateGraph

from agents.approvals import approval_decide
from agents.execution import run_execute
from agents.flows.common import FlowState
from agents.models import Agent, Approval, Run
from agents.services import api_key_create
from agents.tools import MCPHandle
from mcpregistry.models import McpServer
from mcpregistry.pool import get_default_pool
from tests.conftest import discover_as_admin, make_agent

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

mcp = MCPHandle()


async def read_then_write(state: FlowState) -> dict[str, Any]:
    seen = await mcp.call("record_read", params={"key": "k"})
    written = await mcp.call("append_line", params={"text": "흐름 기록"})
    return {"output": f"{seen} / {written}"}


passes = iter(range(1, 1000))


async def write_what_changed(state: FlowState) -> dict[str, Any]:
    written = await mcp.call("append_line", params={"text": f"흐름 기록 {next(passes)}"})  # other each pass
    return {"output": str(written)}


first_writes = iter(range(1, 1000))


async def first_write_changes_later(state: FlowState) -> dict[str, Any]:
    first = "A" if next(first_writes) < 3 else "X"  # from its third pass on, the flow's first write is another
    one = await mcp.call("append_line", params={"text": first})
    two = await mcp.call("append_line", params={"text": "B"})
    return {"output": f"{first}={one} / B={two}"}


async def one_node_graph(settings: Any, node: Any) -> Any:
    """A flow of the one ``node`` over the test's server."""
    await mcp.bind_registry(settings, mcp_ids=["flow-writes"], mcp_id="flow-writes")
    graph = StateGraph(FlowState)
    graph.add_node(node.__name__, node)
    graph.add_edge(START, node.__name__)
    graph.add_edge(node.__name__, END)
    return graph.compile()


async def build_changing_graph(settings: Any) -> Any:
    return await one_node_graph(settings, write_what_changed)


async def build_first_changes_graph(settings: Any) -> Any:
    return await one_node_graph(settings, first_write_changes_later)


async def build_graph(settings: Any) -> Any:
    return await one_node_graph(settings, read_then_write)


@pytest.fixture
def flow_run(tmp_path: Path, settings: Any) -> Any:
    settings.PLATFORM_FLOW_GRAPHS = [
        f"{__name__}.build_graph",
        f"{__name__}.build_changing_graph",
        f"{__name__}.build_first_changes_graph",
    ]
    file = tmp_path / "side-effects.txt"
    server = McpServer.objects.create(
        mcp_id="flow-writes",
        name="flow-writes",
        command=sys.executable,
        args=["-m", "tests.mcp_fixtures.side_effect_server"],
        cwd=str(django_settings.BASE_DIR),
        env={"SIDE_EFFECT_FILE": str(file), "SIDE_EFFECT_MODE": "ok"},
        public_env=["SIDE_EFFECT_FILE", "SIDE_EFFECT_MODE"],
        session_scope="shared",
    )
    assert discover_as_admin(server=server).ok
    key, _raw = api_key_create(actor="test", via="tests", name="flow-caller")
    agent = make_agent(slug="flow-writes", servers=[server], provider="offline", with_demo_rules=False)
    Agent.objects.filter(pk=agent.pk).update(mode="flow", flow_graph=f"{__name__}.build_graph")
    run = Run.objects.create(agent=agent, api_key=key, query="기록해줘")
    yield run, file
    get_default_pool().close("flow-writes")


def lines(file: Path) -> list[str]:
    return file.read_text(encoding="utf-8").splitlines() if file.exists() else []


def test_a_flow_write_waits_for_its_approval_then_is_carried_out_once(flow_run: Any) -> None:
    run, file = flow_run

    run_execute(run_id=str(run.id))

    run.refresh_from_db()
    assert run.status == Run.Status.AWAITING_APPROVAL
    approval = run.approvals.get()
    assert (approval.status, approval.call_id, approval.tool) == (Approval.Status.PENDING, "flow:2", "append_line")
    assert lines(file) == ["read:k"]  # the write was not sent

    approval_decide(run=run, approval_id=str(approval.pk), decision="approve", actor="reviewer")
    run_execute(run_id=str(run.id))

    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, (run.error_code, run.error_message)
    assert lines(file) == ["read:k", "read:k", "흐름 기록\t"]  # the flow ran again; its write went out once
    approval.refresh_from_db()
    assert approval.status == Approval.Status.EXECUTED
    assert "lines: 3" in run.answer


def test_a_flow_write_rejected_is_told_to_the_flow_which_finishes(flow_run: Any) -> None:
    run, file = flow_run
    run_execute(run_id=str(run.id))
    approval = Run.objects.get(pk=run.pk).approvals.get()

    approval_decide(run=run, approval_id=str(approval.pk), decision="reject", actor="reviewer", reason="아니요")
    run_execute(run_id=str(run.id))

    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED
    assert "approval:rejected" in run.answer
    assert lines(file) == ["read:k", "read:k"]


def test_a_flow_whose_write_changed_when_it_ran_again_is_refused_not_given_the_approval(flow_run: Any) -> None:
    run, file = flow_run
    Agent.objects.filter(pk=run.agent_id).update(flow_graph=f"{__name__}.build_changing_graph")
    run_execute(run_id=str(run.id))
    approval = Run.objects.get(pk=run.pk).approvals.get()
    assert approval.args["text"].startswith("흐름 기록 ")

    approval_decide(run=run, approval_id=str(approval.pk), decision="approve", actor="reviewer")
    run_execute(run_id=str(run.id))

    run.refresh_from_db()
    assert "approval:mismatch" in run.answer
    assert lines(file) == []  # neither the approved text nor the new one was written


def test_a_flow_write_that_changed_after_its_number_was_carried_out_is_refused_not_told_it_was_done(
    flow_run: Any,
) -> None:
    """The flow's first write (A) was approved and carried out; when the flow runs again its first write is X: the
    executed approval under that number is A's. X must be refused, not given A's recorded outcome (which told the
    flow X was written when it never was)."""
    run, file = flow_run
    Agent.objects.filter(pk=run.agent_id).update(flow_graph=f"{__name__}.build_first_changes_graph")
    for _pass in range(2):  # A waits, is approved, carried out; then B waits and is approved
        run_execute(run_id=str(run.id))
        run.refresh_from_db()
        assert run.status == Run.Status.AWAITING_APPROVAL
        pending = run.approvals.get(status=Approval.Status.PENDING)
        approval_decide(run=run, approval_id=str(pending.pk), decision="approve", actor="reviewer")

    run_execute(run_id=str(run.id))  # the third pass: its first write is X

    run.refresh_from_db()
    assert lines(file) == ["A\t", "B\t"]  # X never went out
    assert "X=" in run.answer and "approval:mismatch" in run.answer.split(" / ")[0]


def test_a_flow_writes_step_on_the_run_page_shows_its_approval_and_then_its_attempt(flow_run: Any) -> None:
    """Found by its number (``flow:2``), as a model's call is by its id: pending, then carried out."""
    from agents.admin_runs import run_timeline

    run, _file = flow_run
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    approval = run.approvals.get()
    write = [s for s in run_timeline(run) if s.label == "flow call" and s.title.endswith(".append_line")]
    assert [(s.status, s.attempts) for s in write] == [("pending", [])]
    assert approval.get_status_display() in write[0].note

    approval_decide(run=run, approval_id=str(approval.pk), decision="approve", actor="reviewer")
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    approval.refresh_from_db()
    write = [s for s in run_timeline(run) if s.label == "flow call" and s.title.endswith(".append_line")]
    # The first pass's waiting call, then the call the approval let through (both passes, as the live page).
    assert [(s.status, [a.ok for a in s.attempts]) for s in write] == [("pending", []), ("ok", [True])]
    assert approval.get_status_display() in write[-1].note and "reviewer" in write[-1].note
