"""A tool's own error returned as a value (seed 002 §8: ``{"error": ..., "fallback": "retry"}``), s43.

- A read's was its answer (ok): a rule's template phrased "the classifier is down" as a domain group, the metrics
  and the citation rate counted it a success. It is now a failed call of its own reason, ``tool:error_value``: the
  model is shown the value as data and told to act on it; it is not retried, not counted by the breaker, never
  remembered nor handed to a fallback.
- A write's report that its backend timed out ended ``tool:error`` (the user told it failed, though the work may
  be done); raised, the same words end ``outcome_unknown``. Now both do.
- A write refused with ``"fallback": "retry"`` (a ledger locked) was told "Do not retry it now".
- A sandboxed write's idempotency key was the model's call id: a pass made again that names another write
  ``call_0`` sent it under the earlier write's key, and an idempotent server answered "already done" for a write
  it never carried out. The key is now the approval's.

The servers are real (stdio): ``tests/mcp_fixtures/error_value_ledger_server.py``, the side-effect server, and a
write server written here, whose file says what it really did."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from django.utils import translation

from agents.approvals import RunApprovals, approval_decide
from agents.execution import run_execute
from agents.models import Approval, Run
from agents.services import api_key_create
from audit.models import AuditEvent
from audit.visible import tool_data_block
from mcpregistry import gate
from mcpregistry.models import McpServer, ToolContract
from mcpregistry.pool import get_default_pool
from tests.conftest import discover_as_admin, make_agent
from tests.mcp_fixtures.scripts import script_file
from tests.mcpregistry.test_at_most_once import lines, side_effect_server
from tests.mcpregistry.test_gate_error_value_and_key import (  # noqa: F401 (fixtures)
    ledger,
    received,
    server,
    set_contract,
)

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

CLASSIFIER_DOWN = {"error": "classifier_unavailable", "fallback": "retry"}

# A write server whose tools report their own errors as values: ``transfer`` does its work, then reports that its
# backend timed out (as a value, or raised, by ``WRITE_MODE``); ``book`` does nothing and reports its ledger locked.
WRITE_SERVER = textwrap.dedent(
    """
    import os
    from fastmcp import FastMCP
    from fastmcp.exceptions import ToolError

    mcp = FastMCP("value-writes")
    TIMED_OUT = "the ledger backend timed out after 30s"

    def record(line):
        with open(os.environ["WRITES_FILE"], "a", encoding="utf-8") as f:
            f.write(line + "\\n")

    @mcp.tool(annotations={"readOnlyHint": False, "destructiveHint": True})
    def transfer(text: str) -> dict:
        record(text)
        if os.environ["WRITE_MODE"] == "raise":
            raise ToolError(TIMED_OUT)
        return {"error": TIMED_OUT, "fallback": "retry"}

    @mcp.tool(annotations={"readOnlyHint": False, "destructiveHint": True})
    def book(seat: str) -> dict:
        return {"error": "ledger_locked", "fallback": "retry"}

    mcp.run(transport="stdio", show_banner=False)
    """
)


def write_server(mcp_id: str, file: Path, mode: str = "value") -> McpServer:
    bound = McpServer.objects.create(
        mcp_id=mcp_id,
        name=mcp_id,
        command=sys.executable,
        args=[script_file(WRITE_SERVER)],
        env={"WRITES_FILE": str(file), "WRITE_MODE": mode},
        public_env=["WRITES_FILE", "WRITE_MODE"],
        session_scope="shared",
        timeout_s=10,
    )
    assert discover_as_admin(server=bound).ok
    assert set(ToolContract.objects.filter(tool__server=bound).values_list("risk", flat=True)) == {"write"}
    return McpServer.objects.prefetch_related("tools__contract").get(pk=bound.pk)


def test_a_read_tools_error_value_fails_the_call_with_its_own_reason(
    server: McpServer,  # noqa: F811 - the fixture
    ledger: Path,  # noqa: F811 - the fixture
) -> None:
    # A fallback the policy would call, and a memo that would keep an answer.
    server = set_contract(
        server,
        "classify_term",
        returns={"type": "dict", "required": ["group", "confidence"]},
        fallback_tool="classify_backup",
        fallback_policy="call",
        memo=True,
    )
    who = gate.GateCall(source="agent", memo={})

    first = gate.call(server=server, tool_name="classify_term", args={"term": "환자식별번호"}, who=who)

    assert (first.ok, first.error, first.fallback_for, first.attempts) == (False, "tool:error_value", None, 1)
    assert first.tool_error_text == "classifier_unavailable"  # its words, for a person (not its JSON)
    # The model is told to act on the report, which follows as data, as the tool wrote it.
    assert first.message.startswith("Tool 'classify_term' answered with its own error report [tool:error_value]")
    assert "Do not retry" not in first.message
    assert first.message.endswith(tool_data_block('{"error": "classifier_unavailable", "fallback": "retry"}'))
    # Neither handed to the fallback, nor retried; audited as a failure (the metrics count it).
    assert received(ledger, "classify_backup") == [] and len(received(ledger, "classify_term")) == 1
    events = AuditEvent.objects.filter(tool="classify_term", action="tool.call")
    assert [(e.ok, e.reason, e.result) for e in events] == [(False, "tool:error_value", CLASSIFIER_DOWN)]
    # The server answered: its breaker counts no failure.
    assert McpServer.objects.get(pk=server.pk).breaker_failures == 0
    # Not remembered: the retry it asks for reaches the tool.
    again = gate.call(server=server, tool_name="classify_term", args={"term": "환자식별번호"}, who=who)
    assert (again.ok, again.memo_hit, again.value) == (True, False, {"group": "환자정보", "confidence": 0.87})
    assert len(received(ledger, "classify_term")) == 2


def approved(bound: McpServer, tool: str, args: dict[str, Any]) -> tuple[Run, Approval]:
    """A run whose scripted model asks for ``tool``, parked; a person approves it; the run goes on."""
    key, _raw = api_key_create(actor="test", via="tests", name=f"caller-{bound.mcp_id}")
    script = [{"tool_calls": [{"name": tool, "args": args, "id": "call_w"}]}, {"content": "결과: {last_tool_result}"}]
    agent = make_agent(
        slug=f"w-{bound.mcp_id}", servers=[bound], provider="scripted", script=script, with_demo_rules=False
    )
    run = Run.objects.create(agent=agent, api_key=key, query="송금해줘")
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert run.status == Run.Status.AWAITING_APPROVAL
    approval = run.approvals.get()
    approval_decide(run=run, approval_id=str(approval.pk), decision="approve", actor="test")
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    approval.refresh_from_db()
    return run, approval


@pytest.mark.parametrize("mode", ["value", "raise"])
def test_a_writes_report_that_its_backend_timed_out_leaves_its_outcome_unknown(tmp_path: Path, mode: str) -> None:
    file = tmp_path / "writes.txt"
    writes = write_server(f"vw-{mode}", file, mode)
    try:
        run, approval = approved(writes, "transfer", {"text": "송금 1건"})
        run_execute(run_id=str(run.id))  # delivered again: nothing is sent again
    finally:
        get_default_pool().close(writes.mcp_id)

    # The work may be done: never said to have failed, never sent again, as when the tool raises the same words.
    assert approval.status == Approval.Status.OUTCOME_UNKNOWN, approval.result
    assert approval.result["reason"] == "timeout"
    assert lines(file) == ["송금 1건"]
    audited = AuditEvent.objects.filter(run_id=run.id, tool="transfer").order_by("id")
    assert [(e.action, e.reason) for e in audited if e.action != "approval.requested"][-2:] == [
        ("tool.call", "timeout"),
        ("approval.outcome_unknown", "approval:outcome_unknown"),
    ]
    [tool_message] = [m["content"] for m in run.messages if m["type"] == "tool"]
    with translation.override("ko"):  # the agent's language
        assert tool_message == gate._outcome_unknown_message("transfer")


def test_a_refused_write_whose_report_says_retry_is_told_not_done_and_askable_again(tmp_path: Path) -> None:
    writes = write_server("vw-locked", tmp_path / "writes.txt")
    # An evaluation's sandboxed write: no person to ask.
    who = gate.GateCall(source="eval", call_id="c1", writes_blocked=True, write_sandbox=frozenset({"vw-locked"}))
    try:
        result = gate.call(server=writes, tool_name="book", args={"seat": "12A"}, who=who)
    finally:
        get_default_pool().close("vw-locked")

    assert (result.ok, result.error, result.attempts) == (False, "tool:error", 1)
    assert "Do not retry" not in result.message
    assert result.message.startswith(
        "Tool 'book' did not carry out the write: it answered with its own error report [tool:error], which says "
        "it may be tried again. Tell the user it was not done; if they still want it, call the tool again (it will "
        "need a new approval)."
    )
    assert result.message.endswith(tool_data_block('{"error": "ledger_locked", "fallback": "retry"}'))


def test_a_sandboxed_write_made_again_under_an_earlier_call_id_has_a_key_of_its_own(tmp_path: Path) -> None:
    file = tmp_path / "lines.txt"
    bound = side_effect_server("s43-key", file, mode="ok")
    ToolContract.objects.filter(tool__server=bound, tool__name="append_line").update(idempotency_arg="idempotency_key")
    agent = make_agent(slug="s43-key", servers=[bound], provider="scripted", script=[], with_demo_rules=False)
    run = Run.objects.create(agent=agent, query="평가", purpose="eval", write_sandbox=["s43-key"])
    bound = McpServer.objects.prefetch_related("tools__contract").get(pk=bound.pk)

    def one_pass(text: str) -> gate.ToolResult:
        # Each pass is a new one (a takeover asks the model anew); a model that numbers per turn says call_0.
        who = gate.GateCall(
            source="eval",
            run_id=run.id,
            call_id="call_0",
            writes_blocked=True,
            write_sandbox=frozenset({"s43-key"}),
            approvals=RunApprovals(run_id=run.id, actor="eval", secrets=[]),
        )
        return gate.call(server=bound, tool_name="append_line", args={"text": text}, who=who)

    try:
        first, second, first_again = one_pass("A"), one_pass("B"), one_pass("A")
    finally:
        get_default_pool().close("s43-key")

    a, b = (run.approvals.get(args={"text": text}) for text in ("A", "B"))
    # Two writes, two keys, both carried out; the same write made again is the same approval (not sent again).
    assert lines(file) == [f"A\t{run.id}:{a.pk}", f"B\t{run.id}:{b.pk}"]
    assert first.ok and first.args["idempotency_key"] == f"{run.id}:{a.pk}"
    assert second.ok and second.args["idempotency_key"] == f"{run.id}:{b.pk}"
    assert first_again.ok and first_again.approval_id == first.approval_id == str(a.pk)
