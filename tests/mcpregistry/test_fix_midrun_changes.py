"""An admin's change to a tool reaches a run already in progress: the run loads its servers, tools and contracts
once, at its start (``agents.config_cache``), and the gate reads the tool's state again at each call. A tool or a
server disabled mid-run is refused from the next call on, and a tool marked ``write`` mid-run asks for approval
(an eval's or a shadow's call is refused). Only the model is scripted: the demo server runs over stdio, the admin's
change goes through the real services, made right after the run's first call returns."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from agents.execution import run_execute
from agents.models import Agent, Approval, Run
from audit.models import AuditEvent
from mcpregistry import gate
from mcpregistry.models import McpServer, McpTool, ToolContract
from mcpregistry.services import mcp_server_update, mcp_tool_update, tool_contract_update
from tests import local_tool_fixtures as fixtures
from tests.conftest import discover_as_admin, make_agent

QUESTION = "A-1001 자산 상태"
PING_THEN_ASSET = [
    {"tool_calls": [{"id": "c-1", "name": "ping", "args": {}}]},
    {"tool_calls": [{"id": "c-2", "name": "get_asset_status", "args": {"asset_id": "A-1001"}}]},
    {"content": "done"},
]


def disable_tool(server: McpServer) -> None:
    tool = McpTool.objects.get(server=server, name="get_asset_status")
    tool.enabled = False
    mcp_tool_update(tool=tool, actor="admin", via="tests")


def disable_server(server: McpServer) -> None:
    stored = McpServer.objects.get(pk=server.pk)
    stored.enabled = False
    mcp_server_update(server=stored, actor="admin", via="tests")


def mark_write(server: McpServer, name: str = "get_asset_status") -> None:
    contract = ToolContract.objects.get(tool__server=server, tool__name=name)
    tool_contract_update(contract=contract, actor="admin", via="tests", data={"risk": "write"})


def change_after_first_call(monkeypatch: pytest.MonkeyPatch, change: Callable[[], None]) -> None:
    """Makes ``change`` once the run's first tool call has returned, before its next one."""
    real_call = gate.call
    changed: list[bool] = []

    def call_then_change(**kwargs: Any) -> gate.ToolResult:
        result = real_call(**kwargs)
        if not changed:
            changed.append(True)
            change()
        return result

    monkeypatch.setattr(gate, "call", call_then_change)


def run_of(agent: Agent, purpose: str = Run.Purpose.LIVE) -> Run:
    run = Run.objects.create(agent=agent, query=QUESTION, purpose=purpose)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    return run


def asset_calls(run: Run) -> list[tuple[str, bool, str, int]]:
    """The audit rows of the run's ``get_asset_status`` call: (action, ok, reason, attempt)."""
    events = AuditEvent.objects.filter(run_id=run.id, tool="get_asset_status").order_by("id")
    return list(events.values_list("action", "ok", "reason", "attempt"))


def scripted_agent(server: McpServer) -> Agent:
    return make_agent(
        slug="midrun", servers=[server], provider="scripted", script=PING_THEN_ASSET, with_demo_rules=False
    )


@pytest.mark.django_db
def test_an_unchanged_tool_is_called_as_the_run_loaded_it(demo_server: McpServer) -> None:
    run = run_of(scripted_agent(demo_server))

    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert asset_calls(run) == [("tool.call", True, "", 1)]


@pytest.mark.django_db
def test_a_tool_disabled_mid_run_is_refused_at_its_next_call(
    demo_server: McpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    change_after_first_call(monkeypatch, lambda: disable_tool(demo_server))
    run = run_of(scripted_agent(demo_server))

    assert asset_calls(run) == [("tool.call", False, "tool:unknown", 0)]  # refused, never sent
    refusal = AuditEvent.objects.get(run_id=run.id, tool="get_asset_status")
    # The message ends with the tools the run may still call: not the one disabled.
    listed = refusal.result.rsplit(": ", 1)[1].rstrip(".").split(", ")
    assert "ping" in listed
    assert "get_asset_status" not in listed


@pytest.mark.django_db
def test_a_server_disabled_mid_run_is_refused_at_its_next_call(
    demo_server: McpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    change_after_first_call(monkeypatch, lambda: disable_server(demo_server))
    run = run_of(scripted_agent(demo_server))

    assert asset_calls(run) == [("tool.call", False, "mcp:not_loaded:sds-company-data", 0)]


@pytest.mark.django_db
def test_a_tool_marked_write_mid_run_asks_for_approval_before_it_is_sent(
    demo_server: McpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    change_after_first_call(monkeypatch, lambda: mark_write(demo_server))
    run = run_of(scripted_agent(demo_server))

    assert run.status == Run.Status.AWAITING_APPROVAL, run.error_message
    assert asset_calls(run) == [("approval.request", False, "approval:pending", 0)]
    approval = Approval.objects.get(run=run)
    assert (approval.tool, approval.status, approval.args) == (
        "get_asset_status",
        Approval.Status.PENDING,
        {"asset_id": "A-1001"},
    )


@pytest.mark.django_db
@pytest.mark.parametrize("purpose", [Run.Purpose.EVAL, Run.Purpose.SHADOW])
def test_an_eval_or_shadow_run_refuses_a_tool_marked_write_mid_run(
    demo_server: McpServer, monkeypatch: pytest.MonkeyPatch, purpose: str
) -> None:
    change_after_first_call(monkeypatch, lambda: mark_write(demo_server))
    run = run_of(scripted_agent(demo_server), purpose=purpose)

    assert asset_calls(run) == [("tool.call", False, "eval:write_blocked", 0)]
    assert not Approval.objects.filter(run=run).exists()


# ---- several calls in one turn (agents.parallel_calls) --------------------------------------------------------------
# The batch's calls run on their own database connections, as in production: these tests commit their data.

LOCAL_MODULE = "tests.local_tool_fixtures"
TURN_WITH_A_NOTICE = [
    {"tool_calls": [{"id": "r-1", "name": "lookup_stock", "args": {"sku": "A"}}]},
    {
        "tool_calls": [
            {"id": "w-1", "name": "send_notice", "args": {"team": "ops", "text": "hi"}},
            {"id": "r-2", "name": "lookup_stock", "args": {"sku": "B"}},
        ]
    },
    {"content": "done"},
]


@pytest.fixture
def local_server(settings: Any) -> McpServer:
    """Real Python tools bound as a server, every one ``read`` (``send_notice`` too, until the admin corrects it)."""
    settings.PLATFORM_LOCAL_TOOL_MODULES = ["mcpregistry.builtin_tools", LOCAL_MODULE]
    settings.PLATFORM_PARALLEL_TOOL_CALLS = 4
    fixtures.EXECUTED.clear()
    server = McpServer(
        mcp_id="local-midrun", name="local-midrun", transport=McpServer.Transport.LOCAL, args=[LOCAL_MODULE]
    )
    server.full_clean()
    server.save()
    report = discover_as_admin(server=server)
    assert report.ok, report.error
    ToolContract.objects.filter(tool__server=server).update(risk="read")
    return server


def run_turn_with_a_notice(server: McpServer) -> Run:
    agent = make_agent(
        slug="midrun-batch", servers=[server], provider="scripted", script=TURN_WITH_A_NOTICE, with_demo_rules=False
    )
    return run_of(agent)


def assert_parked_on_the_notice(run: Run) -> None:
    assert run.status == Run.Status.AWAITING_APPROVAL, run.error_message
    approval = Approval.objects.get(run=run)
    assert (approval.tool, approval.status) == ("send_notice", Approval.Status.PENDING)
    assert fixtures.EXECUTED["send_notice"] == []


@pytest.mark.django_db(transaction=True)
def test_a_tool_marked_write_mid_run_is_kept_out_of_a_concurrent_batch(
    local_server: McpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    change_after_first_call(monkeypatch, lambda: mark_write(local_server, "send_notice"))
    run = run_turn_with_a_notice(local_server)

    assert_parked_on_the_notice(run)
    # Sent one by one, in the order asked: the run parks at the notice, and the read after it waits for the resume.
    assert [m for m in run.messages if m.get("type") == "parallel_calls"] == []
    assert [a["sku"] for a in fixtures.EXECUTED["lookup_stock"]] == ["A"]


@pytest.mark.django_db(transaction=True)
def test_a_tool_marked_write_after_its_batch_formed_asks_for_approval_in_the_batch(
    local_server: McpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The change lands between the batch's read of the risks (which still finds the tool a read) and the gate's.
    monkeypatch.setattr(gate, "tools_now_write", lambda tools: set())
    change_after_first_call(monkeypatch, lambda: mark_write(local_server, "send_notice"))
    run = run_turn_with_a_notice(local_server)

    (batch,) = [m for m in run.messages if m.get("type") == "parallel_calls"]
    assert [c["call_id"] for c in batch["calls"]] == ["w-1", "r-2"]
    assert_parked_on_the_notice(run)


@pytest.mark.django_db
def test_a_fallback_marked_write_since_the_run_loaded_it_is_not_called_by_the_gate_itself(
    demo_server: McpServer,
) -> None:
    """The gate calls a read tool's fallback itself (policy "call", or no model to read the suggestion) only while
    the fallback only reads: one marked write since the run loaded it would be a write nobody asked for."""
    loaded = McpServer.objects.prefetch_related("tools__contract").get(pk=demo_server.pk)  # as a run loads it
    who = gate.GateCall(source="deterministic", follow_fallback=True)
    assert gate._reads(who, loaded, "get_asset_status_backup")
    mark_write(demo_server, "get_asset_status_backup")
    assert not gate._reads(who, loaded, "get_asset_status_backup")
