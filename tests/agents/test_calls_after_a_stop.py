"""No call goes out that nobody will wait for. Confirmed with the real stdio server
(``tests/mcp_fixtures/side_effect_server.py``), whose file counts what it really did:

1. A ReAct model turn asking for several calls sent all of them after the run was cancelled (or ran out of time)
   following the first: the loop checked once per tools step, the engine's ``call_tool`` and the parallel batch
   never. Now each call is checked before it is sent, as a flow's and a rule's are.
2. With fallback policy "call" the gate handed a failed read over to a fallback that writes: a live run asked for
   an approval it never parked on, a sandboxed eval carried the write out unasked. Now the gate calls only a read
   fallback and leaves a write one to the model; the contract (admin page, configuration import) refuses it.
3. A flow node that caught the ``FlowParked`` of a write went on calling tools while its run was parked (and, the
   flow starting again on resume, sent those reads twice). Now nothing more goes out, as for a rule.
"""

from __future__ import annotations

import contextlib
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.test import Client
from django.utils import timezone
from langgraph.graph import END, START, StateGraph

from agent_platform.errors import ApplicationError
from agents import execution
from agents.configuration import config_export, config_import
from agents.execution import run_execute
from agents.flows.common import FlowState
from agents.models import Agent, Approval, Run, RunEvent
from agents.services import run_cancel
from agents.tools import MCPHandle
from audit.models import AuditEvent
from mcpregistry import gate
from mcpregistry.models import McpServer, McpTool, ToolContract
from mcpregistry.pool import get_default_pool
from tests.conftest import discover_as_admin, make_agent
from tests.mcpregistry.test_contract_editor import errors, post

SERVERS = ("stop-seq", "stop-par", "flow-parked", "fallback-gate", "fallback-run")


@pytest.fixture(autouse=True)
def _close() -> Iterator[None]:
    yield
    for mcp_id in SERVERS:
        get_default_pool().close(mcp_id)


def side_effect_server(mcp_id: str, file: Path, *, mode: str = "ok", reads: tuple[str, ...] = ()) -> McpServer:
    """The server, discovered (every tool a write until marked read), with ``reads`` marked read."""
    server = McpServer.objects.create(
        mcp_id=mcp_id,
        name=mcp_id,
        command=sys.executable,
        args=["-m", "tests.mcp_fixtures.side_effect_server"],
        cwd=str(django_settings.BASE_DIR),
        env={"SIDE_EFFECT_FILE": str(file), "SIDE_EFFECT_MODE": mode},  # type: ignore[misc]  # an encrypted JSON field
        public_env=["SIDE_EFFECT_FILE", "SIDE_EFFECT_MODE"],
        session_scope="shared",
        timeout_s=10,
    )
    assert discover_as_admin(server=server).ok
    ToolContract.objects.filter(tool__server=server, tool__name__in=reads).update(risk="read")
    return server


def lines(file: Path) -> list[str]:
    return file.read_text(encoding="utf-8").splitlines() if file.exists() else []


THREE_READS: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "record_read", "args": {"key": key}, "id": f"call_{key}"} for key in ("a", "b", "c")]},
    {"content": "읽었습니다"},
]


def stop_after_the_first_call(monkeypatch: pytest.MonkeyPatch, run: Run, how: str) -> None:
    """The run stops (``how``: cancelled by its caller, or its time is up) once its first call has returned."""
    real_call = gate.call
    out_of_time = [False]

    def call(**kwargs: Any) -> gate.ToolResult:
        result = real_call(**kwargs)
        if how == "cancelled":
            with contextlib.suppress(ApplicationError):  # already cancelled: a later call of the same turn
                run_cancel(run=Run.objects.get(pk=run.pk), actor="caller", source="api")
        out_of_time[0] = True
        return result

    monkeypatch.setattr(gate, "call", call)
    if how == "time_limit":
        monkeypatch.setattr(execution.RunClaim, "time_is_up", lambda self: out_of_time[0])


# ---- 1. a model turn's later calls after a stop --------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db
@pytest.mark.parametrize(
    ("how", "status", "code"), [("cancelled", "cancelled", ""), ("time_limit", "failed", "time_limit")]
)
def test_a_model_turns_later_calls_are_not_sent_once_the_run_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str, status: str, code: str
) -> None:
    file = tmp_path / "side-effects.txt"
    server = side_effect_server("stop-seq", file, reads=("record_read",))
    agent = make_agent(
        slug="stop-seq", servers=[server], provider="scripted", script=THREE_READS, with_demo_rules=False
    )
    run = Run.objects.create(agent=agent, query="세 개 읽어줘")
    stop_after_the_first_call(monkeypatch, run, how)

    run_execute(run_id=str(run.id))

    run.refresh_from_db()
    assert run.status == status, (run.status, run.error_code, run.error_message)
    if code:
        assert run.error_code == code
    assert lines(file) == ["read:a"]
    calls = AuditEvent.objects.filter(run_id=run.id, action="tool.call")
    assert list(calls.values_list("call_id", flat=True)) == ["call_a"]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_parallel_batch_sends_no_call_that_had_not_started_when_the_run_was_cancelled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    # One call at a time on the server: the batch's calls start one after the other, on the pool's threads.
    settings.PLATFORM_PARALLEL_TOOL_CALLS = 4
    settings.PLATFORM_PARALLEL_TOOL_CALLS_PER_SERVER = 1
    file = tmp_path / "side-effects.txt"
    server = side_effect_server("stop-par", file, reads=("record_read",))
    agent = make_agent(
        slug="stop-par", servers=[server], provider="scripted", script=THREE_READS, with_demo_rules=False
    )
    run = Run.objects.create(agent=agent, query="세 개 읽어줘")
    stop_after_the_first_call(monkeypatch, run, "cancelled")

    run_execute(run_id=str(run.id))

    run.refresh_from_db()
    assert run.status == Run.Status.CANCELLED
    assert len(lines(file)) == 1, lines(file)
    assert AuditEvent.objects.filter(run_id=run.id, action="tool.call").count() == 1
    # The call that was sent is in the run's record as a sequential one would be (it was only in the audit),
    # and the batch's trace lists it alone.
    events = list(RunEvent.objects.filter(run_id=run.id).order_by("seq").values_list("kind", "data"))
    assert [payload.get("call_id") for kind, payload in events if kind == "tool_call"] == ["call_a"]
    [batch] = [payload for kind, payload in events if kind == "parallel_calls"]
    assert [c["call_id"] for c in batch["calls"]] == ["call_a"]


# ---- 2. a read tool's write fallback under the "call" policy -------------------------------------------------------


def read_with_a_write_fallback(mcp_id: str, file: Path) -> McpServer:
    """``append_line_backup`` marked read (it fails: its backend "timed out"), its fallback ``append_line`` a write,
    the policy "call": a row stored before the contract check refused it."""
    server = side_effect_server(mcp_id, file, mode="report-timeout", reads=("append_line_backup",))
    ToolContract.objects.filter(tool__server=server, tool__name="append_line_backup").update(
        fallback_tool="append_line", fallback_policy="call", retry={"max_attempts": 1}
    )
    return McpServer.objects.prefetch_related("tools__contract").get(pk=server.pk)


@pytest.mark.slow
@pytest.mark.django_db
def test_the_gate_never_calls_a_write_fallback_for_a_failed_read_in_a_sandboxed_eval(tmp_path: Path) -> None:
    file = tmp_path / "side-effects.txt"
    server = read_with_a_write_fallback("fallback-gate", file)
    who = gate.GateCall(
        source="eval",  # type: ignore[arg-type]  # an eval run's purpose, as the engine's ``who`` gives it
        run_id=uuid.uuid4(),
        call_id="c1",
        writes_blocked=True,
        write_sandbox=frozenset({server.mcp_id}),
    )

    result = gate.call(server=server, tool_name="append_line_backup", args={"text": "송금"}, who=who)

    assert lines(file) == ["backup:송금\t"]  # the write fallback was not carried out
    assert not result.ok
    assert "'append_line'" in result.message  # left to the model, as a suggestion
    assert not AuditEvent.objects.filter(action="tool.fallback").exists()
    assert not AuditEvent.objects.filter(tool="append_line", action="tool.call").exists()


@pytest.mark.slow
@pytest.mark.django_db
def test_a_run_is_told_of_a_write_fallback_instead_of_an_approval_it_never_waits_on(tmp_path: Path) -> None:
    file = tmp_path / "side-effects.txt"
    server = read_with_a_write_fallback("fallback-run", file)
    script: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "append_line_backup", "args": {"text": "송금"}, "id": "call_read"}]},
        {"content": "결과: {last_tool_result}"},
    ]
    agent = make_agent(slug="fallback-run", servers=[server], provider="scripted", script=script, with_demo_rules=False)
    run = Run.objects.create(agent=agent, query="읽어줘")

    run_execute(run_id=str(run.id))

    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, (run.status, run.error_message)
    assert not Approval.objects.filter(run=run).exists()
    [tool_message] = [m for m in run.conversation if m["type"] == "tool"]
    assert "approval:pending" not in tool_message["data"]["content"]
    assert "'append_line'" in tool_message["data"]["content"]
    assert lines(file) == ["backup:송금\t"]


@pytest.fixture
def ledger(db: Any) -> McpTool:
    """The contract editor's tool (``tests/mcpregistry/test_contract_editor.py``), its fallback a write."""
    server = McpServer.objects.create(mcp_id="Ledger-Data", name="ledger", command=sys.executable, args=[])
    now = timezone.now()
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "limit": {"type": "integer"}},
        "required": ["name"],
    }
    tool = McpTool.objects.create(server=server, name="lookup", input_schema=schema, discovered_at=now)
    ToolContract.objects.create(tool=tool, args={"name": {"type": "str", "required": True}, "limit": {"type": "int"}})
    backup = McpTool.objects.create(
        server=server, name="lookup_backup", input_schema={"type": "object", "required": ["name"]}, discovered_at=now
    )
    ToolContract.objects.create(tool=backup, args={"name": {"type": "str", "required": True}}, risk="write")
    return tool


def test_a_contract_refuses_to_have_the_gate_call_a_write_fallback(ledger: McpTool) -> None:
    contract = ToolContract(tool=ledger, fallback_tool="lookup_backup", fallback_policy="call")
    with pytest.raises(Exception) as refused:
        contract.clean()
    message = refused.value.message_dict["fallback_policy"][0]  # type: ignore[attr-defined]
    assert "'lookup_backup' writes" in message and "never calls a write that nobody asked for" in message
    ToolContract(tool=ledger, fallback_tool="lookup_backup", fallback_policy="suggest").clean()
    ToolContract.objects.filter(tool__name="lookup_backup").update(risk="read")
    contract.clean()  # a read fallback the gate may call


def test_the_admin_page_shows_the_refusal_at_the_fallback_policy(admin_client: Client, ledger: McpTool) -> None:
    status, page = post(
        admin_client,
        ledger,
        **{"contract-0-fallback_tool": "lookup_backup", "contract-0-fallback_policy": "call"},
    )
    assert status == 200
    assert "errors field-fallback_policy" in page
    assert any("never calls a write that nobody asked for" in e for e in errors(page))
    assert ToolContract.objects.get(tool=ledger).fallback_policy == "suggest"


def test_the_configuration_import_refuses_a_call_policy_to_a_write_fallback(ledger: McpTool) -> None:
    document = config_export()
    [entry] = [c for c in document["contracts"] if c["tool"] == "lookup"]
    entry.update(fallback="lookup_backup", fallback_policy="call")
    with pytest.raises(ApplicationError) as refused:
        config_import(actor="t", document=document)
    assert "fallback_policy" in refused.value.message
    assert "never calls a write that nobody asked for" in refused.value.message
    assert ToolContract.objects.get(tool=ledger).fallback_policy == "suggest"


# ---- 3. a flow that caught its park ---------------------------------------------------------------------------------

FLOW_MCP_ID = "flow-parked"
flow_mcp = MCPHandle()


async def write_caught_then_read(state: FlowState) -> dict[str, Any]:
    with contextlib.suppress(Exception):  # a node that goes on whatever happens
        await flow_mcp.call("append_line", params={"text": "쓰기"})
    await flow_mcp.call("record_read", params={"key": "after-park"})
    return {"output": "done"}


async def build_write_caught_then_read(settings: Any) -> Any:
    await flow_mcp.bind_registry(settings, mcp_ids=[FLOW_MCP_ID], mcp_id=FLOW_MCP_ID)
    graph = StateGraph(FlowState)
    graph.add_node("n", write_caught_then_read)
    graph.add_edge(START, "n")
    graph.add_edge("n", END)
    return graph.compile()


@pytest.mark.django_db
@pytest.mark.slow
def test_a_flow_that_catches_its_park_calls_nothing_more(tmp_path: Path, settings: Any) -> None:
    graph = f"{__name__}.build_write_caught_then_read"
    settings.PLATFORM_FLOW_GRAPHS = [graph]
    file = tmp_path / "side-effects.txt"
    server = side_effect_server(FLOW_MCP_ID, file, reads=("record_read",))
    agent = make_agent(slug="flow-parked", servers=[server], provider="offline", with_demo_rules=False)
    Agent.objects.filter(pk=agent.pk).update(mode="flow", flow_graph=graph)
    run = Run.objects.create(agent=agent, query="흐름")

    run_execute(run_id=str(run.id))

    run.refresh_from_db()
    assert run.status == Run.Status.AWAITING_APPROVAL
    assert lines(file) == []  # the read after the park was not sent
    assert not AuditEvent.objects.filter(run_id=run.id, tool="record_read").exists()
    assert Approval.objects.get(run=run).tool == "append_line"
