"""Top-K tool selection (README "Many tools, the right few"): widenings counted across an approval's park, the
real names in the trace and on the run page, the reasons and fallback codes in words, the tools offered when every
allowed one fits, and the refusal of a tool no later step offers. Real demo and probe servers over stdio; only the
model is scripted."""

from __future__ import annotations

import html
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from agent_platform.celery import app as celery_app
from agents.engine import model_tool_names
from agents.execution import run_execute
from agents.models import Agent, Run
from agents.services import api_key_create
from audit.models import AuditEvent
from mcpregistry.models import McpServer, McpTool, ToolContract
from mcpregistry.pool import get_default_pool
from tests.conftest import bind_demo_server, discover_as_admin, make_agent

pytestmark = pytest.mark.django_db

HR_TOOLS = [
    ("직원.검색", "이름으로 직원을 찾는다"),
    ("자산.조회", "자산 상태를 조회한다"),
    ("휴가.신청", "휴가를 신청한다"),
]
ALIASES = model_tool_names([name for name, _ in HR_TOOLS])
NOT_AVAILABLE = "is not available to this agent here; do not call it again"
MAY_OFFER_MORE = "the next step may offer more tools"


@pytest.fixture
def eager_tasks() -> Iterator[None]:
    celery_app.conf.task_always_eager = True
    yield
    celery_app.conf.task_always_eager = False


def selections(run: Run) -> list[dict[str, Any]]:
    return [m for m in run.messages if m.get("type") == "tool_selection"]


def why(entry: dict[str, Any]) -> dict[str, str]:
    return {o["name"]: o["why"] for o in entry["offered"]}


def tool_messages(run: Run) -> list[str]:
    return [m["data"]["content"] for m in run.conversation if m["type"] == "tool"]


def run_query(agent: Agent, query: str) -> Run:
    run = Run.objects.create(agent=agent, query=query)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    return run


def scripted(servers: list[McpServer], script: list[dict[str, Any]], selection: dict[str, Any]) -> Agent:
    agent = make_agent(slug="picker", servers=servers, provider="scripted", script=script, with_demo_rules=False)
    agent.tool_selection = selection
    agent.language = "en"  # what the gate tells the model, in the English these tests read
    agent.save()
    return agent


def page_text(client: Client, run: Run) -> str:
    page = client.get(f"/admin/agents/run/{run.pk}/change/", HTTP_ACCEPT_LANGUAGE="en").content.decode()
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html.unescape(page)))


def listed_server(mcp_id: str, tools: list[tuple[str, str]]) -> McpServer:
    """A server whose tools are listed (as discovery stores them) and never called: every call to them here is
    refused before it is sent."""
    server = McpServer.objects.create(mcp_id=mcp_id, name=mcp_id, command=sys.executable, args=[])
    for name, description in tools:
        McpTool.objects.create(
            server=server,
            name=name,
            description=description,
            input_schema={"type": "object", "properties": {}},
            discovered_at=timezone.now(),
        )
    return server


@pytest.mark.slow
@pytest.mark.django_db(transaction=False)
def test_a_resumed_run_keeps_its_widenings_and_the_tools_they_added(
    tmp_path: Path, eager_tasks: None, django_capture_on_commit_callbacks: Any
) -> None:
    demo = bind_demo_server()
    notes = McpServer.objects.create(
        mcp_id="notes",
        name="notes",
        command=sys.executable,
        args=["-m", "tests.mcp_fixtures.probe_server"],
        cwd=str(settings.BASE_DIR),
        env={"NOTES_FILE": str(tmp_path / "notes.txt")},
        session_scope="shared",
    )
    assert discover_as_admin(server=notes).ok
    ToolContract.objects.filter(tool__server=notes, tool__name="append_note").update(idempotency_arg="idempotency_key")
    key, raw = api_key_create(actor="test", via="tests", name="caller")
    agent = make_agent(
        slug="notes",
        servers=[notes, demo],
        provider="scripted",
        with_demo_rules=False,
        script=[
            {"tool_calls": [{"name": "ping", "args": {}}]},
            {"tool_calls": [{"name": "append_note", "args": {"text": "회의록 저장"}}]},
            {"tool_calls": [{"name": "search_employee", "args": {"name": "박도윤"}}]},
            {"tool_calls": [{"name": "search_employee", "args": {"name": "박도윤"}}]},
            {"content": "끝"},
        ],
    )
    Agent.objects.filter(pk=agent.pk).update(
        caller_approves_model_writes=True,
        language="en",
        tool_selection={"enabled": True, "top_k": 1, "pinned": ["append_note"], "max_widenings": 1, "widen_step": 1},
    )
    try:
        run = Run.objects.create(agent=agent, api_key=key, query="회의록을 저장해줘")
        run_execute(run_id=str(run.id))
        run.refresh_from_db()
        assert run.status == Run.Status.AWAITING_APPROVAL, (run.status, run.error_message)
        approval = run.approvals.get()
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
        with django_capture_on_commit_callbacks(execute=True):
            answer = client.post(
                f"/api/v1/runs/{run.id}/approvals/{approval.id}", {"decision": "approve"}, format="json"
            )
        assert answer.status_code == 200
        run.refresh_from_db()
    finally:
        get_default_pool().close("notes")

    assert run.status == Run.Status.SUCCEEDED, run.error_message
    turns = selections(run)
    assert len(turns) == 5
    # One widening in the whole run (max_widenings 1): ping, before the park, stays offered after the resume.
    assert all(why(entry).get("ping") == "widened" for entry in turns[1:])
    assert not any("search_employee" in why(entry) for entry in turns)
    refused = AuditEvent.objects.filter(run_id=run.id, tool="search_employee")
    assert [e.reason for e in refused] == ["tool:not_offered", "tool:not_offered"]
    told = tool_messages(run)
    assert MAY_OFFER_MORE in told[0] and NOT_AVAILABLE not in told[0]  # ping: widened
    assert all(NOT_AVAILABLE in text and MAY_OFFER_MORE not in text for text in told[-2:])  # no widening left


def test_the_trace_and_the_run_page_name_each_offered_tool_by_its_own_name(admin_client: Client) -> None:
    listed_server("hr", HR_TOOLS)
    agent = scripted(
        [McpServer.objects.get(mcp_id="hr")],
        [{"tool_calls": [{"name": ALIASES["직원.검색"], "args": {}}]}, {"content": "끝"}],
        {"enabled": True, "top_k": 1, "max_widenings": 1},
    )
    run = run_query(agent, "자산 상태 조회")

    first, second = selections(run)
    assert first["offered"] == [
        {
            "name": ALIASES["자산.조회"],
            "tool": "자산.조회",
            "mcp_id": "hr",
            "score": pytest.approx(24.3013),
            "why": "ranked",
        }
    ]
    assert {o["tool"] for o in second["offered"]} == {name for name, _ in HR_TOOLS}
    page = page_text(admin_client, run)
    assert f"tools offered for turn 1: hr.자산.조회 as {ALIASES['자산.조회']} (ranked 24.3013)" in page
    assert f"hr.직원.검색 as {ALIASES['직원.검색']} (asked for by the model)" in page


def test_where_every_allowed_tool_fits_none_is_said_to_be_ranked(admin_client: Client) -> None:
    listed_server("hr", HR_TOOLS)
    agent = scripted(
        [McpServer.objects.get(mcp_id="hr")],
        [{"tool_calls": [{"name": ALIASES["직원.검색"], "args": {}}]}, {"content": "끝"}],
        {"enabled": True, "top_k": 1, "max_widenings": 1},
    )
    run = run_query(agent, "자산 상태 조회")

    second = selections(run)[1]
    assert second["ranker"] == "none"  # the widening (step 3) makes every tool fit
    assert why(second) == {ALIASES["직원.검색"]: "widened", ALIASES["자산.조회"]: "all", ALIASES["휴가.신청"]: "all"}
    assert not [o for o in second["offered"] if "score" in o]
    page = page_text(admin_client, run)
    assert f"hr.휴가.신청 as {ALIASES['휴가.신청']} (allowed)" in page
    assert "ranked 0" not in page


def test_a_tool_outside_the_filters_is_refused_as_not_available_and_widens_nothing() -> None:
    listed_server("hr", HR_TOOLS)
    listed_server("ops", [("restart_host", "호스트를 재시작한다")])
    agent = scripted(
        list(McpServer.objects.filter(mcp_id__in=["hr", "ops"])),
        [
            {"tool_calls": [{"name": "restart_host", "args": {}}]},
            {"tool_calls": [{"name": ALIASES["직원.검색"], "args": {}}]},
            {"content": "끝"},
        ],
        {"enabled": True, "top_k": 1, "servers": ["hr"], "max_widenings": 1},
    )
    run = run_query(agent, "자산 상태 조회")

    refused = AuditEvent.objects.filter(run_id=run.id, action="tool.call").order_by("id")
    assert [(e.tool, e.reason) for e in refused] == [
        ("restart_host", "tool:not_offered"),
        ("직원.검색", "tool:not_offered"),
    ]
    outside, widened = tool_messages(run)
    assert NOT_AVAILABLE in outside and MAY_OFFER_MORE not in outside
    assert MAY_OFFER_MORE in widened  # the filtered tool used no widening: this one still had one
    assert why(selections(run)[2])[ALIASES["직원.검색"]] == "widened"


@pytest.mark.slow
def test_forced_fallback_and_the_embedding_fallback_read_in_words(admin_client: Client, settings: Any) -> None:
    settings.PLATFORM_EMBEDDINGS_URL = ""
    server = bind_demo_server(failure_mode="bad_schema")
    agent = scripted(
        [server],
        [
            {"tool_calls": [{"name": "get_asset_status", "args": {"asset_id": "A-1001"}}]},
            {"tool_calls": [{"name": "get_asset_status_backup", "args": {"asset_id": "A-1001"}}]},
            {"content": "끝"},
        ],
        {
            "enabled": True,
            "top_k": 1,
            "max_widenings": 0,
            "ranker": "embedding",
            "force_first_tool": "get_asset_status",
        },
    )
    run = run_query(agent, "A-1001 자산 상태")

    first, second = selections(run)[:2]
    assert (why(first)["get_asset_status"], why(second)["get_asset_status_backup"]) == ("forced", "fallback")
    assert first["fallback"] == "embedding:not_configured"
    page = page_text(admin_client, run)
    assert "sds-company-data.get_asset_status (forced first call)" in page
    assert "sds-company-data.get_asset_status_backup (fallback of a failed tool)" in page
    assert "fell back: no embedding service is configured; tools ranked by keywords (embedding:not_configured)" in page
    assert "(forced)" not in page and "(fallback)" not in page


def test_a_tool_call_step_is_titled_by_its_servers_own_name_with_the_alias_beside_it(admin_client: Client) -> None:
    """The model-facing alias (``tool_1bf4f48b`` for ``직원.검색``) alone named nothing an admin knows."""
    listed_server("hr", HR_TOOLS)
    agent = scripted(
        [McpServer.objects.get(mcp_id="hr")],
        [{"tool_calls": [{"name": ALIASES["직원.검색"], "args": {}}]}, {"content": "끝"}],
        {"enabled": True, "top_k": 1, "max_widenings": 1},
    )
    page = page_text(admin_client, run_query(agent, "자산 상태 조회"))
    assert f"tool call hr.직원.검색 as {ALIASES['직원.검색']}" in page, page
