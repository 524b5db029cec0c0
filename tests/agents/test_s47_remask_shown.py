"""A value bound as a secret after a run recorded it is masked wherever the run is shown: its page (the question,
the timeline's arguments, results, model turns and answer, the raw fields), the run list, the approval's pages
and list, and the run's event stream (the API's and the admin's).

The run is real: a scripted model (the only scripted part) calls the probe server's ``echo`` with the token a user
typed, then its ``append_note`` (a write: parked for approval), and answers quoting it. Only then is the token
bound as another server's secret, in a fresh web process (nothing registered): every record of the run holds it
in clear, masked with the secrets known when it was written.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from agents.config_cache import shown_secrets
from agents.models import Agent, Approval, Run, RunEvent
from agents.services import api_key_create
from audit.masking import MASK, clear_registered_secrets, registered_secrets
from audit.models import AuditEvent
from mcpregistry.models import McpServer, ToolContract
from mcpregistry.pool import get_default_pool
from mcpregistry.services import mcp_server_create
from tests.agents.test_approvals import decide, eager_tasks, park  # noqa: F401
from tests.conftest import discover_as_admin, make_agent

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

TOKEN = "Vx8qL2nRt5KpW9zJm3"

SCRIPT = [
    {"tool_calls": [{"name": "echo", "args": {"text": f"토큰 {TOKEN}"}}]},
    {"tool_calls": [{"name": "append_note", "args": {"text": f"메모 {TOKEN}"}}]},
    {"content": f"저장했습니다 ({TOKEN}): {{last_tool_result}}"},
]


@pytest.fixture
def parked(db: Any, tmp_path: Any) -> Any:
    """A run of a user who typed the token: its echo called and answered, its note waiting for approval."""
    server = McpServer.objects.create(
        mcp_id="notes",
        name="notes",
        command=sys.executable,
        args=["-m", "tests.mcp_fixtures.probe_server"],
        cwd=str(settings.BASE_DIR),
        env={"NOTES_FILE": str(tmp_path / "notes.txt")},
        session_scope="shared",
    )
    assert discover_as_admin(server=server).ok
    ToolContract.objects.filter(tool__server=server, tool__name="append_note").update(idempotency_arg="idempotency_key")
    key, raw = api_key_create(actor="test", via="tests", name="caller")
    agent = make_agent(slug="notes", servers=[server], provider="scripted", script=SCRIPT, with_demo_rules=False)
    Agent.objects.filter(pk=agent.pk).update(caller_approves_model_writes=True)
    run = Run.objects.create(agent=agent, api_key=key, query=f"토큰 {TOKEN} 로 메모 남겨줘")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    approval = park(run)
    yield run, approval, client, raw
    get_default_pool().close("notes")


def bind_later() -> None:
    """The token bound as another server's secret, through the service an admin's page calls; then a fresh web
    process, which has registered nothing."""
    mcp_server_create(
        actor="admin",
        via="tests",
        data={"mcp_id": "vault", "name": "vault", "command": sys.executable, "args": ["-V"], "env": {"T": TOKEN}},
    )
    clear_registered_secrets()
    assert TOKEN not in registered_secrets()


@pytest.fixture
def parked_then_bound(parked: Any) -> Any:
    run, approval, _client, _raw = parked
    assert TOKEN in str(approval.args) and TOKEN in run.query  # recorded in clear: nothing masked it then
    assert any(TOKEN in str(e.result) for e in AuditEvent.objects.filter(run_id=run.pk, tool="echo"))
    bind_later()
    return run, approval


@pytest.fixture
def finished_then_bound(parked: Any, django_capture_on_commit_callbacks: Any) -> Any:
    run, approval, client, raw = parked
    with django_capture_on_commit_callbacks(execute=True):
        assert decide(client, run, approval, "approve").status_code == 200
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, (run.error_code, run.error_message)
    assert TOKEN in run.answer
    assert any(TOKEN in str(data) for data in RunEvent.objects.filter(run=run).values_list("data", flat=True))
    bind_later()
    return run, raw


def page(client: Client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, url
    return response.content.decode()


def test_a_parked_runs_pages_mask_a_token_bound_after_it_was_recorded(parked_then_bound: Any, admin_client) -> None:
    run, approval = parked_then_bound
    for url in (
        f"/admin/agents/run/{run.pk}/change/",
        f"/admin/agents/run/{run.pk}/timeline/",
        "/admin/agents/run/",
        f"/admin/agents/approval/{approval.pk}/change/",
        f"/admin/agents/approval/{approval.pk}/decide/approve/",
        "/admin/agents/approval/",
    ):
        text = page(admin_client, url)
        assert TOKEN not in text, url
    # What was masked is still there, masked: the note's argument and the question, in Korean.
    assert f"메모 {MASK}" in page(admin_client, f"/admin/agents/approval/{approval.pk}/change/")
    assert f"토큰 {MASK} 로 메모 남겨줘" in page(admin_client, f"/admin/agents/run/{run.pk}/change/")


def test_a_finished_runs_page_masks_it_in_every_step_and_field(finished_then_bound: Any, admin_client) -> None:
    run, _raw = finished_then_bound
    text = page(admin_client, f"/admin/agents/run/{run.pk}/change/")
    assert TOKEN not in text
    assert f"저장했습니다 ({MASK})" in text  # the answer, masked, not left out
    approval = Approval.objects.get(run=run)
    assert TOKEN not in page(admin_client, f"/admin/agents/approval/{approval.pk}/change/")
    assert TOKEN not in page(admin_client, f"/admin/agents/approval/{approval.pk}/history/")


def test_the_run_event_stream_masks_it(finished_then_bound: Any, admin_client) -> None:
    run, raw = finished_then_bound
    response = Client(HTTP_AUTHORIZATION=f"Bearer {raw}").get(f"/api/v1/runs/{run.pk}/events")
    assert response.status_code == 200
    text = b"".join(response.streaming_content).decode()  # type: ignore[attr-defined]
    assert "event: end" in text and "토큰" in text  # the whole stream, its Korean intact
    assert TOKEN not in text
    assert f"메모 {MASK}" in text
    admin_stream = admin_client.get(f"/admin/agents/run/{run.pk}/events/")
    assert admin_stream.status_code == 200
    admin_text = b"".join(admin_stream.streaming_content).decode()  # type: ignore[attr-defined]
    assert "event: end" in admin_text and TOKEN not in admin_text


def test_the_secrets_are_read_once_per_page_not_per_row(parked_then_bound: Any, admin_client) -> None:
    """A list of more approvals, runs or steps reads the configuration's secrets no more often."""
    run, approval = parked_then_bound
    shown_secrets()  # held by the process once read, until the configuration changes: warmed, as after a first page
    counts = {}
    for rows in (1, 4):
        for _ in range(rows - Approval.objects.count()):
            copy = Approval.objects.get(pk=approval.pk)
            copy.pk = None
            copy.call_hash = f"{copy.call_hash[:-1]}{rows}"
            copy.save()
            Run.objects.create(agent=run.agent, query=f"또 {TOKEN}")
        for url in ("/admin/agents/approval/", "/admin/agents/run/"):
            with CaptureQueriesContext(connection) as queries:
                assert TOKEN not in page(admin_client, url)
            counts[(url, rows)] = len(queries)
    for url in ("/admin/agents/approval/", "/admin/agents/run/"):
        assert counts[(url, 4)] == counts[(url, 1)], counts


def test_the_approval_lists_filters_do_not_offer_a_server_id_bound_since(parked_then_bound: Any, admin_client) -> None:
    """An approval of a call to a server whose id is the token (bound since): its row shows it masked, and the
    server filter does not offer it (its words and its link would carry it in clear)."""
    _run, approval = parked_then_bound
    named = Approval.objects.get(pk=approval.pk)
    named.pk, named.mcp_id, named.call_hash = None, TOKEN, "0" * 64
    named.save()

    text = page(admin_client, "/admin/agents/approval/")

    assert TOKEN not in text
    assert f"{MASK}.append_note" in text
    assert "?mcp_id=notes" in text  # the other server's choice is offered as before


def test_the_runs_api_answer_masks_it(finished_then_bound: Any) -> None:
    """``GET /api/v1/runs/{id}`` (and the run list) serve the run's question, answer, tool calls and approvals
    masked again with the credentials bound now, its Korean intact."""
    run, raw = finished_then_bound
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    detail = client.get(f"/api/v1/runs/{run.pk}")
    assert detail.status_code == 200, detail.content
    body = detail.json()
    assert TOKEN not in detail.content.decode()
    assert body["query"] == f"토큰 {MASK} 로 메모 남겨줘"
    assert body["answer"].startswith(f"저장했습니다 ({MASK})")
    assert [call["name"] for call in body["tool_calls"]] == ["echo", "append_note"]
    assert body["tool_calls"][0]["args"] == {"text": f"토큰 {MASK}"}
    listed = client.get("/api/v1/runs")
    assert listed.status_code == 200, listed.content
    assert TOKEN not in listed.content.decode()
    assert f"토큰 {MASK}" in listed.content.decode()


def test_the_a2a_task_and_the_mcp_calls_result_mask_it(finished_then_bound: Any) -> None:
    """A2A ``GetTask`` (its history's question, its answer artifact) and an MCP ``tools/call``'s result stream
    serve the run masked again with the credentials bound now."""
    from agents.api.mcp_server import CallFeed

    run, raw = finished_then_bound
    body = {"jsonrpc": "2.0", "id": "g1", "method": "GetTask", "params": {"id": str(run.pk), "historyLength": 5}}
    response = Client(HTTP_AUTHORIZATION=f"Bearer {raw}").post(
        f"/a2a/{run.agent.slug}/", json.dumps(body), content_type="application/json"
    )
    assert response.status_code == 200, response.content
    text = response.content.decode()
    assert "result" in response.json(), text
    assert TOKEN not in text
    assert f"저장했습니다 ({MASK})" in text
    chunks, state = CallFeed(run=run, rpc_id="c1", progress_token="p1").poll()
    assert state == "done"
    streamed = "".join(chunks)
    assert TOKEN not in streamed
    assert "저장했습니다" in json.loads(streamed.rsplit("data: ", 1)[1])["result"]["content"][0]["text"]
