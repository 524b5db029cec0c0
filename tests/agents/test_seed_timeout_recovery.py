"""Seed 001's ``timeout`` scenario with the demo server as shipped (its backend stalls 5 s, past the contract's
2 s), and the seed's rendering of an asset with no owner.

Defects held here:

- The stalled call, cancelled by the client at the contract's timeout, went on in a thread; when it finished, the
  MCP SDK failed on a request already answered and the server's session hung: the backup call timed out, the
  breaker opened, and the next run failed ``circuit:open`` even with the failure switched off.
- The seed's asset A-1004 has no owner (``None``): the offline answer read ``사용자: null``, the backup tool
  ``사용자: None``.
"""

from __future__ import annotations

import pytest

from agents.deterministic import placeholder_problems, render_answer, render_params
from agents.execution import run_execute
from agents.models import Agent, Run
from audit.models import AuditEvent
from mcpregistry import gate
from mcpregistry.models import McpServer
from mcpregistry.services import mcp_server_update
from tests.conftest import bind_demo_server, make_agent

QUESTION = "A-1001 자산의 현재 상태를 알려주세요."


def submit(agent: Agent, query: str) -> Run:
    run = Run.objects.create(agent=agent, query=query)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    return run


def tool_calls(run: Run) -> list[tuple[str, str, bool, str]]:
    events = AuditEvent.objects.filter(run_id=run.id, action__startswith="tool.").order_by("id")
    return list(events.values_list("action", "tool", "ok", "reason"))


# Marked slow: three real 2 s timeouts.
@pytest.mark.slow
@pytest.mark.django_db
def test_a_backend_stalled_past_the_contracts_timeout_is_answered_by_the_backup_and_the_server_recovers() -> None:
    server = bind_demo_server(mcp_id="assets-stalled", failure_mode="timeout", shipped_delay=True)
    agent = make_agent(slug="offline-stalled", servers=[server])

    run = submit(agent, QUESTION)

    assert (run.status, run.error_code) == (Run.Status.SUCCEEDED, ""), run.error_message
    assert run.answer.startswith("A-1001: 사용중") and "백업 스냅샷 기준" in run.answer
    assert tool_calls(run) == [
        *[("tool.call", "get_asset_status", False, "timeout")] * 3,
        ("tool.fallback", "get_asset_status", False, "timeout"),
        ("tool.call", "get_asset_status_backup", True, ""),
    ]

    # The failure switched off through the service, as an admin does: the next run is served, not refused.
    mcp_server_update(server=server, actor="test", via="tests", data={"env": {**server.env, "FAILURE_MODE": "none"}})
    again = submit(agent, QUESTION)

    assert (again.status, again.error_code) == (Run.Status.SUCCEEDED, ""), again.error_message
    assert again.answer == "A-1001: 사용중 (사용자: 김하늘)"
    assert tool_calls(again) == [("tool.call", "get_asset_status", True, "")]
    assert McpServer.objects.get(pk=server.pk).breaker_state == McpServer.BreakerState.CLOSED


@pytest.mark.django_db
def test_an_asset_with_no_owner_reads_without_null_in_the_offline_answer(demo_agent: Agent) -> None:
    run = submit(demo_agent, "A-1004 자산의 현재 상태를 알려주세요.")

    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert run.answer == "A-1004: 재고 (사용자: 없음)"  # the demo's template: {result.owner|없음}


@pytest.mark.django_db
def test_the_backup_tool_says_an_asset_has_no_owner_rather_than_none(demo_server: McpServer) -> None:
    def backup(asset_id: str) -> gate.ToolResult:
        who = gate.GateCall(source="admin")
        return gate.call(server=demo_server, tool_name="get_asset_status_backup", args={"asset_id": asset_id}, who=who)

    assert backup("A-1004").value == "A-1004: 재고 (사용자 없음, 백업 스냅샷 기준, 갱신 주기 1시간)"
    assert backup("A-1001").value == "A-1001: 사용중 (사용자: 김하늘, 백업 스냅샷 기준, 갱신 주기 1시간)"


def test_no_value_reads_as_nothing_in_a_template_and_is_left_out_of_a_list() -> None:
    assets = {"assets": [{"asset_id": "A-1001", "owner": "김하늘"}, {"asset_id": "A-1004", "owner": None}]}

    def render(template: str) -> str:
        return render_answer(template, query="q", match={}, params={}, value=assets)

    assert render("{result.assets.1.asset_id} (사용자: {result.assets.1.owner})") == "A-1004 (사용자: )"
    assert render("사용자: {result.assets.*.owner}") == "사용자: 김하늘"
    # A placeholder's own words for no value: written where the value is null, empty or missing, else the value.
    assert render("{result.assets.1.asset_id} (사용자: {result.assets.1.owner|없음})") == "A-1004 (사용자: 없음)"
    assert render("(사용자: {result.assets.0.owner|없음})") == "(사용자: 김하늘)"
    assert render("{result.assets.1.team|미정} / {result.assets.1.asset_id}") == "미정 / A-1004"
    # A whole result that is null has no value either; a template that reads as nothing is no answer: the tool's
    # own text is.
    assert render_answer("{result|없음}", query="q", match={}, params={}, value=None) == "없음"
    assert render("{result.assets.1.owner}") == render_answer("{result}", query="q", match={}, params={}, value=assets)
    # Without words of its own, a missing key still gives the tool's own text as the answer.
    assert render("{result.assets.1.team}") == render_answer("{result}", query="q", match={}, params={}, value=assets)
    params = render_params({"note": "담당 {data.owner}"}, query="q", context={}, a2a_data=[{"owner": None}], match={})
    assert params == {"note": "담당 "}


def test_words_for_no_value_that_hold_a_bar_are_refused_saying_so() -> None:
    problems = placeholder_problems({}, {}, "{result.owner|a|b}")
    assert problems == {"answer_template": ["{result.owner|a|b}: the words after | cannot hold |, { or }"]}
    assert placeholder_problems({}, {}, "(사용자: {result.owner|사용자 없음})") == {}
