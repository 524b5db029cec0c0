"""A matched rule's failed call reaches the model in its system message with the gate's advice ("use the fallback
tool …"). Defects: the advice named the tools by their own names where the model is offered them by others (a
server's tool prefix, an alias), and with top-K selection the fallback it advised was not offered on the first
turn, so the model following it was refused (``tool:not_offered``). Real demo server; only the model is scripted."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agents.answers import ADVICE_NOTICE, TOOL_DATA_NOTICE
from agents.engine import names_the_model_knows, results_as_offered
from agents.execution import run_execute
from agents.models import Agent, Run
from audit.models import AuditEvent
from audit.visible import TOOL_DATA_CLOSE, TOOL_DATA_OPEN
from mcpregistry.models import McpServer, McpTool
from mcpregistry.services import mcp_server_update
from tests.conftest import bind_demo_server, make_agent

pytestmark = pytest.mark.django_db

QUERY = "A-1001 상태 알려줘"  # the demo rule for asset statuses matches it: get_asset_status(A-1001)


def run_query(agent: Agent) -> Run:
    run = Run.objects.create(agent=agent, query=QUERY)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    return run


def system_results(run: Run) -> list[dict[str, Any]]:
    """The deterministic results as the model read them: the data block of its system message, each with the
    gate's advice on it (``message``), which follows the block as the platform's words (``ADVICE_NOTICE``)."""
    text = run.conversation[0]["data"]["content"]
    start = text.index(TOOL_DATA_OPEN, text.index(TOOL_DATA_NOTICE) + len(TOOL_DATA_NOTICE)) + len(TOOL_DATA_OPEN)
    results = json.loads(text[start : text.index(TOOL_DATA_CLOSE, start)])
    advice = text[text.index(ADVICE_NOTICE) + len(ADVICE_NOTICE) :] if ADVICE_NOTICE in text else ""
    for result in results:
        said = [line for line in advice.split("\n- ") if line.lstrip("\n- ").startswith(f"{result['tool']}: ")]
        if said:
            result["message"] = said[0].lstrip("\n- ").removeprefix(f"{result['tool']}: ")
    return results


@pytest.mark.slow
def test_a_rules_failed_call_names_its_tool_and_the_fallback_as_the_model_is_offered_them() -> None:
    server = bind_demo_server(failure_mode="bad_schema")  # get_asset_status answers a shape its contract refuses
    mcp_server_update(server=server, actor="admin", via="tests", data={"tool_prefix": "hr_"})
    script = [
        {"tool_calls": [{"name": "hr_get_asset_status_backup", "args": {"asset_id": "A-1001"}}]},
        {"content": "{last_tool_result}"},
    ]
    agent = make_agent(slug="prefixed", servers=[server], provider="scripted", script=script)
    run = run_query(agent)

    (shown,) = system_results(run)
    assert (shown["tool"], shown["error"]) == ("hr_get_asset_status", "result:shape")
    advice = shown["message"]
    assert "'hr_get_asset_status_backup'" in advice and "'get_asset_status_backup'" not in advice, advice
    assert "'hr_get_asset_status'" in advice
    # What is stored, audited and shown to people keeps the tools' own names.
    assert [r["tool"] for r in run.deterministic_results] == ["get_asset_status"]
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert "백업 스냅샷 기준" in run.answer  # the model followed the advice to a tool it could call
    call = AuditEvent.objects.get(run_id=run.id, source="agent", action="tool.call")
    assert (call.tool, call.ok) == ("get_asset_status_backup", True)  # audited by the tool's own name


@pytest.mark.slow
def test_the_fallback_a_rules_failed_call_advises_is_offered_from_the_first_turn() -> None:
    server = bind_demo_server(failure_mode="bad_schema")
    script = [
        {"tool_calls": [{"name": "get_asset_status_backup", "args": {"asset_id": "A-1001"}}]},
        {"content": "{last_tool_result}"},
    ]
    agent = make_agent(slug="top-one", servers=[server], provider="scripted", script=script)
    agent.tool_selection = {"enabled": True, "top_k": 1, "max_widenings": 0}  # no widening to hide a refusal
    agent.save()
    run = run_query(agent)

    first = next(m for m in run.messages if m.get("type") == "tool_selection")
    assert {o["name"]: o["why"] for o in first["offered"]} == {
        "get_asset_status": "rule",
        "get_asset_status_backup": "fallback",
    }
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert "백업 스냅샷 기준" in run.answer
    call = AuditEvent.objects.get(run_id=run.id, source="agent", action="tool.call")
    assert (call.tool, call.ok, call.reason) == ("get_asset_status_backup", True, "")


def test_an_aliased_tool_and_its_fallback_are_named_by_their_aliases_and_a_success_is_left_as_it_is() -> None:
    server = McpServer(pk=1, mcp_id="dotted", name="dotted")
    index = {
        "crm_search": (server, McpTool(server=server, name="crm.search")),
        "crm_search_backup": (server, McpTool(server=server, name="crm.search.backup")),
    }
    failed = {
        "mcp_id": "dotted",
        "tool": "crm.search",
        "ok": False,
        "error": "timeout",
        "message": "Tool 'crm.search' timed out. Use the fallback tool 'crm.search.backup' with the same arguments.",
    }
    succeeded = {"mcp_id": "dotted", "tool": "crm.search", "ok": True, "value": "'crm.search' found 3"}

    shown = results_as_offered([failed, succeeded], index, names_the_model_knows(index))

    assert shown[0]["tool"] == "crm_search"
    assert shown[0]["message"] == (
        "Tool 'crm_search' timed out. Use the fallback tool 'crm_search_backup' with the same arguments."
    )
    assert shown[1] == {**succeeded, "tool": "crm_search"}  # a tool's data is never rewritten
    assert failed["tool"] == "crm.search"  # the run's own results are left as they are
