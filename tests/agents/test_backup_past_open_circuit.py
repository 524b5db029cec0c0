"""Seed 001's backup answers while the failing tool's circuit is open.

Defect held here: the breaker counts rate limits and timeouts per server, and one model call in ``rate_limit``
mode makes three counted failures (the default threshold is 5), so a model that asked for ``get_asset_status``
twice (seed 001 warns that it may) opened the circuit of the whole ``sds-company-data`` server. For the cool-down
``get_asset_status_backup``, which the seed says always answers, was refused ``circuit:open`` too, and the model
was told not to retry instead of being pointed at the backup. A tool that a contract on the server names as its
fallback (the recovery path) now goes out past a circuit that other calls opened; the failing tool stays refused.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from agents.execution import run_execute
from agents.models import Run
from audit.models import AuditEvent
from mcpregistry import breaker, gate
from mcpregistry.models import McpServer
from tests.conftest import FakeClock, bind_demo_server, make_agent

pytestmark = pytest.mark.django_db

ASKS_TWICE_THEN_THE_BACKUP: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "get_asset_status", "args": {"asset_id": "A-1001"}}]},
    {"tool_calls": [{"name": "get_asset_status", "args": {"asset_id": "A-1001"}}]},
    {
        "if_last_tool_result_contains": "get_asset_status_backup",
        "tool_calls": [{"name": "get_asset_status_backup", "args": {"asset_id": "A-1001"}}],
    },
    {"content": "A-1001 상태: {last_tool_result}"},
]


def tool_calls(run: Run) -> list[tuple[str, bool, str]]:
    events = AuditEvent.objects.filter(run_id=run.id, action="tool.call").order_by("id")
    return list(events.values_list("tool", "ok", "reason"))


@pytest.mark.slow
def test_the_backup_answers_after_the_model_asked_twice_for_the_failing_tool(gate_clock: FakeClock) -> None:
    server = bind_demo_server(mcp_id="assets-asked-twice", failure_mode="rate_limit")
    agent = make_agent(
        slug="asks-twice",
        servers=[server],
        provider="scripted",
        script=ASKS_TWICE_THEN_THE_BACKUP,
        with_demo_rules=False,
    )
    run = Run.objects.create(agent=agent, query="A-1001 자산의 현재 상태를 알려주세요.")

    run_execute(run_id=str(run.id))

    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert tool_calls(run) == [
        *[("get_asset_status", False, "rate_limit")] * 3,
        ("get_asset_status", False, "rate_limit"),
        ("get_asset_status", False, "rate_limit"),
        ("get_asset_status", False, "circuit:open"),  # the fifth failure opened it
        ("get_asset_status_backup", True, ""),
    ]
    # The model was pointed at the backup by the circuit:open message, and the backup's answer is the run's.
    tool_messages = [m["content"] for m in run.messages if m["type"] == "tool"]
    assert "circuit:open" in tool_messages[1] and "get_asset_status_backup" in tool_messages[1]
    assert "Do not retry it now" not in tool_messages[1]
    assert "백업 스냅샷 기준" in run.answer
    # The backup's success did not close the circuit: the failing tool is still held off for the cool-down.
    server.refresh_from_db()
    assert server.breaker_state == McpServer.BreakerState.OPEN
    breaker._seen_closed.clear()
    assert not breaker.breaker_admit(server.pk)


def open_circuit(server: McpServer) -> None:
    """As another worker opened it a moment ago (this process has not seen it since)."""
    breaker._seen_closed.clear()
    breaker._failed_at.clear()
    McpServer.objects.filter(pk=server.pk).update(
        breaker_state="open", breaker_failures=5, breaker_opened_at=timezone.now(), breaker_cooldown_s=600
    )


def gated(server: McpServer, tool: str, args: dict[str, str], *, follow_fallback: bool = False) -> gate.ToolResult:
    server = McpServer.objects.prefetch_related("tools__contract").get(pk=server.pk)
    who = gate.GateCall(source="admin", follow_fallback=follow_fallback)
    return gate.call(server=server, tool_name=tool, args=args, who=who)


def test_only_a_fallback_tool_goes_out_past_the_open_circuit_and_its_answer_closes_nothing(
    demo_server: McpServer,
) -> None:
    open_circuit(demo_server)

    refused = gated(demo_server, "get_asset_status", {"asset_id": "A-1001"})
    backup = gated(demo_server, "get_asset_status_backup", {"asset_id": "A-1001"})
    other = gated(demo_server, "search_employee", {"name": "김하늘"})

    assert refused.error == "circuit:open"
    assert "Use the fallback tool 'get_asset_status_backup' with the same arguments." in refused.message
    assert (backup.ok, backup.value) == (True, "A-1001: 사용중 (사용자: 김하늘, 백업 스냅샷 기준, 갱신 주기 1시간)")
    assert other.error == "circuit:open"  # no contract names it as a fallback: the breaker still protects it
    assert "Do not retry it now" in other.message
    demo_server.refresh_from_db()
    assert (demo_server.breaker_state, demo_server.breaker_failures) == ("open", 5)


def test_with_no_model_to_read_the_suggestion_the_gate_calls_the_backup_of_a_tool_the_circuit_refused(
    demo_server: McpServer,
) -> None:
    open_circuit(demo_server)

    result = gated(demo_server, "get_asset_status", {"asset_id": "A-1001"}, follow_fallback=True)

    assert (result.ok, result.tool, result.fallback_for) == (True, "get_asset_status_backup", "get_asset_status")
    handed = AuditEvent.objects.get(action="tool.fallback")
    assert (handed.reason, handed.result) == (
        "circuit:open",
        {"fallback_tool": "get_asset_status_backup", "policy": "no_model"},
    )


def test_a_fallback_whose_own_failure_came_after_the_circuit_opened_is_held_off_until_the_next_trial(
    demo_server: McpServer,
) -> None:
    open_circuit(demo_server)
    backup = "get_asset_status_backup"
    assert breaker.breaker_admit(demo_server.pk, recovery_tool=backup)

    # Its failure counts as any other's, and it is held off with the rest.
    breaker.breaker_record(demo_server.pk, ok=False, reason="timeout", tool=backup, past_open=True)
    demo_server.refresh_from_db()
    assert demo_server.breaker_failures == 6
    assert not breaker.breaker_admit(demo_server.pk, recovery_tool=backup)
    result = gated(demo_server, backup, {"asset_id": "A-1001"})
    assert result.error == "circuit:open"

    # A new period (the circuit opened again after a failed trial): the recovery path is open again.
    McpServer.objects.filter(pk=demo_server.pk).update(breaker_opened_at=timezone.now())
    assert breaker.breaker_admit(demo_server.pk, recovery_tool=backup)
