"""The final diff review: a write a person rejected stays rejected once its tool is marked read, also where the
model's call carried the idempotency key the gate owns; an answer that merely holds an ``error`` field beside its
data is checked against the contract's ``returns`` (only the tool's own error report skips them)."""

from __future__ import annotations

from typing import Any

import pytest

from agents.approvals import approval_decide
from agents.execution import run_execute
from agents.models import Run
from agents.services import api_key_create
from mcpregistry import gate
from mcpregistry.models import McpServer, ToolContract
from mcpregistry.services import mcp_server_create, tool_contract_update
from tests import local_tool_job_fixtures
from tests.conftest import discover_as_admin, make_agent
from tests.mcpregistry.test_gate_error_value_and_key import (  # noqa: F401 - fixtures
    ledger,
    received,
    server,
    set_contract,
    transfers,
)

pytestmark = [pytest.mark.django_db, pytest.mark.slow]


@pytest.mark.parametrize("model_key", [None, "model-made"])
def test_a_rejected_write_is_not_sent_once_its_tool_is_marked_read(
    server: McpServer,  # noqa: F811 - the fixture
    ledger: Any,  # noqa: F811 - the fixture
    model_key: Any,
) -> None:
    server = set_contract(server, "transfer", idempotency_arg="idempotency_key")
    args: dict[str, Any] = {"amount": 5, "to": "kim"}
    if model_key:
        args["idempotency_key"] = model_key  # the model wrote the argument the gate owns
    key, _raw = api_key_create(actor="test", via="tests", name="caller")
    agent = make_agent(
        slug="pays", servers=[server], provider="scripted", script=transfers(args), with_demo_rules=False
    )
    run = Run.objects.create(agent=agent, api_key=key, query="송금해줘")
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert run.status == Run.Status.AWAITING_APPROVAL
    approval = run.approvals.get()
    approval_decide(run=run, approval_id=str(approval.pk), decision="reject", actor="test")
    server = set_contract(server, "transfer", risk="read")  # corrected while the run waits

    run_execute(run_id=str(run.id))

    assert received(ledger, "transfer") == []  # rejected: never sent


def test_an_answer_holding_an_error_field_beside_its_data_is_checked_against_returns(settings: Any) -> None:
    settings.PLATFORM_LOCAL_TOOL_MODULES = ["mcpregistry.builtin_tools", "tests.local_tool_job_fixtures"]
    jobs = mcp_server_create(
        actor="test",
        via="tests",
        data={"mcp_id": "jobs", "name": "jobs", "transport": "local", "args": ["tests.local_tool_job_fixtures"]},
    )
    assert discover_as_admin(server=jobs).ok
    contract = ToolContract.objects.select_related("tool__server").get(tool__server=jobs)
    returns = {"type": "dict", "fields": {"progress": {"type": "int", "min": 0, "max": 100}}}
    tool_contract_update(contract=contract, actor="test", via="tests", data={"risk": "read", "returns": returns})
    jobs = McpServer.objects.prefetch_related("tools__contract").get(pk=jobs.pk)

    result = gate.call(server=jobs, tool_name="job_status", args={"job": "j1"}, who=gate.GateCall(source="agent"))

    assert not result.ok and result.error == "result:range"
    assert local_tool_job_fixtures.CALLS == ["j1"]
