"""A tool's own error returned as a value (seed 002 §8: ``{"error": ..., "fallback": ...}``) is the tool's error,
not an answer of the wrong shape: a read's reaches the model as the tool wrote it (never remembered, never handed
to a fallback), and a write's is never said to be carried out. What the audit records of a keyed write is what
was sent: the idempotency key the gate added, not the model's.

The server is real (``tests/mcp_fixtures/error_value_ledger_server.py``): its ledger file says what it received
and what it really wrote."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from agents.approvals import approval_decide
from agents.execution import run_execute
from agents.models import Approval, Run
from agents.services import api_key_create
from audit.models import AuditEvent
from audit.visible import tool_data_block
from mcpregistry import gate
from mcpregistry.models import McpServer, ToolContract
from mcpregistry.pool import get_default_pool
from mcpregistry.services import mcp_server_create, tool_contract_update
from tests.conftest import discover_as_admin, make_agent

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

MCP_ID = "error-value-ledger"
SECRET = "tok-ledger-5fe1c0a9"
REQUIRED_ANSWER = {"type": "dict", "required": ["transfer_id", "status"]}


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    return tmp_path / "ledger.txt"


@pytest.fixture
def server(ledger: Path) -> Any:
    bound = mcp_server_create(
        actor="test-admin",
        via="tests",
        data={
            "mcp_id": MCP_ID,
            "name": MCP_ID,
            "transport": "stdio",
            "command": sys.executable,
            "args": ["-m", "tests.mcp_fixtures.error_value_ledger_server"],
            "cwd": str(settings.BASE_DIR),
            "env": {"LEDGER_FILE": str(ledger), "LEDGER_TOKEN": SECRET},
            "public_env": ["LEDGER_FILE"],
            "session_scope": "shared",
            "timeout_s": 10,
        },
    )
    assert discover_as_admin(server=bound).ok
    yield reloaded(bound)
    get_default_pool().close(MCP_ID)


def reloaded(server: McpServer) -> McpServer:
    return McpServer.objects.prefetch_related("tools__contract").get(pk=server.pk)


def set_contract(server: McpServer, tool: str, **data: Any) -> McpServer:
    contract = ToolContract.objects.select_related("tool__server").get(tool__server=server, tool__name=tool)
    tool_contract_update(contract=contract, actor="test-admin", via="tests", data=data)
    return reloaded(server)


def received(ledger: Path, tool: str) -> list[dict[str, Any]]:
    """The arguments of each call of ``tool`` the server received, in order."""
    lines = ledger.read_text(encoding="utf-8").splitlines() if ledger.exists() else []
    return [json.loads(line.split(" ", 2)[2]) for line in lines if line.startswith(f"call {tool} ")]


def written(ledger: Path) -> list[str]:
    lines = ledger.read_text(encoding="utf-8").splitlines() if ledger.exists() else []
    return [line for line in lines if line.startswith("wrote ")]


def tool_calls(run_id: Any, tool: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(run_id=run_id, tool=tool, action="tool.call").order_by("id"))


def approved_run(server: McpServer, script: list[dict[str, Any]]) -> tuple[Run, Approval]:
    """A run whose scripted model asks for the transfer, parked; a person approves it; the run goes on."""
    key, _raw = api_key_create(actor="test", via="tests", name="caller")
    agent = make_agent(slug="pays", servers=[server], provider="scripted", script=script, with_demo_rules=False)
    run = Run.objects.create(agent=agent, api_key=key, query="김에게 송금해줘")
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert run.status == Run.Status.AWAITING_APPROVAL
    approval = run.approvals.get()
    approval_decide(run=run, approval_id=str(approval.pk), decision="approve", actor="test")
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    approval.refresh_from_db()
    return run, approval


def transfers(args: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"tool_calls": [{"name": "transfer", "args": args, "id": "call_t"}]},
        {"content": "결과: {last_tool_result}"},
    ]


def test_a_read_tools_error_value_reaches_the_model_as_written_and_its_retry_reaches_the_tool(
    server: McpServer, ledger: Path
) -> None:
    # The contract's answer has keys the tool's error lacks, and a fallback the gate would call for a bad answer.
    server = set_contract(
        server,
        "classify_term",
        returns={"type": "dict", "required": ["group", "confidence"]},
        fallback_tool="classify_backup",
        fallback_policy="call",
    )
    who = gate.GateCall(source="agent", memo={})

    first = gate.call(server=server, tool_name="classify_term", args={"term": "환자식별번호"}, who=who)

    # A failed call of its own reason (s43), the value shown to the model as the tool wrote it, as data.
    assert (first.ok, first.error, first.fallback_for) == (False, "tool:error_value", None), first.as_dict()
    assert first.for_model().endswith(tool_data_block('{"error": "classifier_unavailable", "fallback": "retry"}'))
    assert received(ledger, "classify_backup") == []  # the tool's own verdict, not one for its fallback
    # The retry it asks for reaches the tool (an error is never remembered).
    again = gate.call(server=server, tool_name="classify_term", args={"term": "환자식별번호"}, who=who)
    assert (again.ok, again.memo_hit, again.value) == (True, False, {"group": "환자정보", "confidence": 0.87})
    assert len(received(ledger, "classify_term")) == 2


def test_an_answer_of_another_shape_that_is_no_error_still_fails_its_contract(server: McpServer, ledger: Path) -> None:
    server = set_contract(
        server,
        "classify_term",
        returns={"type": "dict", "required": ["group", "confidence"]},
        fallback_tool="classify_backup",
        fallback_policy="call",
    )
    who = gate.GateCall(source="agent", memo={})

    drifted = gate.call(server=server, tool_name="classify_term", args={"term": "drift"}, who=who)

    # As before: result:shape, handed to the fallback the policy names.
    assert (drifted.ok, drifted.fallback_for, drifted.tool) == (True, "classify_term", "classify_backup")
    assert [(e.ok, e.reason) for e in AuditEvent.objects.filter(tool="classify_term", action="tool.call")] == [
        (False, "result:shape")
    ]
    assert len(received(ledger, "classify_backup")) == 1


def test_an_approved_write_whose_tool_answers_with_its_own_error_is_never_said_to_be_done(
    server: McpServer, ledger: Path
) -> None:
    server = set_contract(server, "transfer", returns=REQUIRED_ANSWER)

    run, approval = approved_run(server, transfers({"amount": 5000, "to": "kim"}))

    assert run.status == Run.Status.SUCCEEDED
    # The model was told the tool's own error, as data, never that the write was carried out.
    [tool_message] = [m["content"] for m in run.messages if m["type"] == "tool"]
    assert "[tool:error]" in tool_message and "insufficient_funds" in tool_message
    assert "[result:shape]" not in tool_message
    assert gate._write_answer_unreadable_message("transfer", "result:shape", "", [])[:40] not in run.answer
    assert "insufficient_funds" in run.answer
    # The approval and the audit say what happened: the call went out once and the tool refused it.
    assert approval.status == Approval.Status.EXECUTED
    assert approval.result == {
        "ok": False,
        "reason": "tool:error",
        "value": {"error": "insufficient_funds", "fallback": "skip"},
    }
    assert [(e.attempt, e.ok, e.reason) for e in tool_calls(run.id, "transfer")] == [(1, False, "tool:error")]
    assert written(ledger) == [] and len(received(ledger, "transfer")) == 1

    # The task delivered again changes nothing: the write is not sent a second time.
    run_execute(run_id=str(run.id))
    assert written(ledger) == [] and len(received(ledger, "transfer")) == 1


def test_the_audit_records_the_idempotency_key_that_was_sent(server: McpServer, ledger: Path) -> None:
    server = set_contract(server, "transfer", idempotency_arg="idempotency_key")
    # The model writes a key of its own (and a secret of the server's): the gate's key replaces it.
    script = transfers({"amount": 5, "to": SECRET, "idempotency_key": "model-made"})

    run, approval = approved_run(server, script)

    key = f"{run.id}:{approval.pk}"  # the approval's key, not the model's call id
    assert approval.status == Approval.Status.EXECUTED and approval.result["ok"] is True
    assert received(ledger, "transfer") == [{"amount": 5, "to": SECRET, "idempotency_key": key}]
    [event] = tool_calls(run.id, "transfer")
    # What was sent, masked as every recorded argument is.
    assert event.args == {"amount": 5, "to": "***", "idempotency_key": key}
    assert written(ledger) == [f"wrote {SECRET}:5 {key}"]


def test_a_gate_result_carries_the_key_it_sent(server: McpServer, ledger: Path) -> None:
    server = set_contract(server, "transfer", idempotency_arg="idempotency_key")
    # An evaluation's sandboxed write (no person to ask): sent with the gate's key.
    run_id = uuid.uuid4()
    who = gate.GateCall(
        source="eval", run_id=run_id, call_id="c1", writes_blocked=True, write_sandbox=frozenset({MCP_ID})
    )

    result = gate.call(server=server, tool_name="transfer", args={"amount": 7, "to": "lee"}, who=who)

    assert result.ok, result.as_dict()
    assert result.args == {"amount": 7, "to": "lee", "idempotency_key": f"{run_id}:c1"}
    assert [e.args for e in AuditEvent.objects.filter(tool="transfer", action="tool.call")] == [result.args]
    assert received(ledger, "transfer") == [result.args]
