"""POST /runs/{id}/cancel: a queued run never starts, a parked run's approvals expire, a running run stops at its
next step; a finished run is a 409."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection
from rest_framework.test import APIClient

from agents.approvals import approval_decide
from agents.execution import run_execute
from agents.models import Agent, ApiKey, Approval, Run, RunEvent
from audit.models import AuditEvent
from mcpregistry.models import McpServer
from mcpregistry.pool import get_default_pool
from tests.conftest import discover_as_admin, make_agent

URL = "/api/v1/runs"


def cancel(client: APIClient, run: Run):  # type: ignore[no-untyped-def]
    return client.post(f"{URL}/{run.id}/cancel")


def probe_server(mcp_id: str, **env: str) -> McpServer:
    server = McpServer.objects.create(
        mcp_id=mcp_id,
        name=mcp_id,
        command=sys.executable,
        args=["-m", "tests.mcp_fixtures.probe_server"],
        cwd=str(settings.BASE_DIR),
        env=env,
        session_scope="shared",
        timeout_s=20,
    )
    assert discover_as_admin(server=server).ok
    return server


@pytest.fixture
def probe(db) -> Iterator[McpServer]:  # type: ignore[no-untyped-def]
    server = probe_server("probe", NOTES_FILE="/dev/null")
    yield server
    get_default_pool().close("probe")


@pytest.fixture
def caller_key(api_caller) -> ApiKey:  # type: ignore[no-untyped-def]
    return api_caller[0]


def scripted(slug: str, server: McpServer, script: list[dict]) -> Agent:
    return make_agent(slug=slug, servers=[server], provider="scripted", script=script, with_demo_rules=False)


@pytest.mark.django_db
def test_a_queued_run_is_cancelled_and_never_executed(api_client, caller_key, demo_agent) -> None:
    run = Run.objects.create(agent=demo_agent, api_key=caller_key, query="김하늘 님은 어느 팀 소속인가요?")
    response = cancel(api_client, run)
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "cancelled"
    assert body["error"]["code"] == "cancelled"
    assert body["finished_at"] is not None
    run_execute(run_id=str(run.id))  # the worker's message arrives after all
    run.refresh_from_db()
    assert (run.status, run.started_at, run.answer) == (Run.Status.CANCELLED, None, "")
    assert not AuditEvent.objects.filter(run_id=run.id, action="tool.call").exists()
    assert [(e.kind, e.data["status"]) for e in RunEvent.objects.filter(run=run)] == [("status", "cancelled")]


@pytest.mark.django_db
def test_the_cancellation_is_audited(api_client, api_caller, demo_agent) -> None:
    key, _raw = api_caller
    run = Run.objects.create(agent=demo_agent, api_key=key, query="q")
    cancel(api_client, run)
    event = AuditEvent.objects.get(run_id=run.id, action="run.cancel")
    assert (event.actor, event.source) == (f"api_key:{key.prefix}", "api")
    assert event.args["from_status"] == "queued"


@pytest.mark.django_db
@pytest.mark.parametrize("status", ["succeeded", "failed", "cancelled"])
def test_a_finished_run_is_a_409(api_client, caller_key, demo_agent, status) -> None:
    run = Run.objects.create(agent=demo_agent, api_key=caller_key, query="q", status=status)
    response = cancel(api_client, run)
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "run_finished"
    run.refresh_from_db()
    assert run.status == status


@pytest.mark.django_db
def test_cancelling_twice_is_a_409_the_second_time(api_client, caller_key, demo_agent) -> None:
    run = Run.objects.create(agent=demo_agent, api_key=caller_key, query="q")
    assert cancel(api_client, run).status_code == 200
    assert cancel(api_client, run).status_code == 409


@pytest.mark.django_db
def test_another_callers_run_cannot_be_cancelled(api_client, demo_agent, other_caller) -> None:
    run = Run.objects.create(agent=demo_agent, api_key=other_caller.key, query="q")
    assert cancel(api_client, run).status_code == 404
    run.refresh_from_db()
    assert run.status == Run.Status.QUEUED


@pytest.mark.django_db
def test_cancel_needs_a_key(demo_agent) -> None:
    run = Run.objects.create(agent=demo_agent, query="q")
    assert APIClient().post(f"{URL}/{run.id}/cancel").status_code == 401


@pytest.fixture
def parked_note(caller_key, tmp_path: Path) -> Iterator[tuple[Run, Path]]:
    """A run whose model asked to write a note, waiting for the approval; the notes file counts what was written."""
    notes = tmp_path / "notes.txt"
    server = probe_server("notes", NOTES_FILE=str(notes))
    try:
        agent = scripted(
            "notes", server, [{"tool_calls": [{"name": "append_note", "args": {"text": "x"}}]}, {"content": "done"}]
        )
        run = Run.objects.create(agent=agent, api_key=caller_key, query="메모 남겨줘")
        run_execute(run_id=str(run.id))
        run.refresh_from_db()
        assert run.status == Run.Status.AWAITING_APPROVAL
        yield run, notes
    finally:
        get_default_pool().close("notes")


@pytest.mark.slow
@pytest.mark.django_db
def test_a_run_awaiting_approval_is_cancelled_and_its_approvals_expire(
    api_client, parked_note, django_capture_on_commit_callbacks
) -> None:
    run, notes = parked_note
    approval = run.approvals.get()
    with django_capture_on_commit_callbacks(execute=False) as dispatched:
        response = cancel(api_client, run)
    assert response.status_code == 200
    assert response.json()["approvals"][0]["status"] == "expired"
    assert dispatched == []  # not resumed
    approval.refresh_from_db()
    assert approval.status == Approval.Status.EXPIRED
    decided = api_client.post(f"{URL}/{run.id}/approvals/{approval.id}", {"decision": "approve"}, format="json")
    assert decided.status_code == 409
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert run.status == Run.Status.CANCELLED
    assert not notes.exists()


@pytest.mark.slow
def test_a_run_approved_then_cancelled_before_it_resumed_leaves_no_approval_approved(
    api_client, parked_note, django_capture_on_commit_callbacks
) -> None:
    """Approve and cancel at once: the approval won, the run (queued to resume) was cancelled and never ran again,
    and its approval read "approved" for good."""
    run, notes = parked_note
    approval = run.approvals.get()
    with django_capture_on_commit_callbacks(execute=False):  # a reviewer approves in the admin
        approval_decide(run=run, approval_id=str(approval.pk), decision="approve", actor="reviewer")
    assert Run.objects.get(pk=run.pk).status == Run.Status.QUEUED  # to resume; its task not delivered yet
    response = cancel(api_client, run)
    assert response.status_code == 200 and response.json()["approvals"][0]["status"] == "expired"
    run_execute(run_id=str(run.id))  # the resume's task arrives after the cancellation
    approval.refresh_from_db()
    assert (approval.status, approval.reason) == (Approval.Status.EXPIRED, "the run was cancelled")
    assert not notes.exists()


def sleeper_started(probe: McpServer, caller_key: ApiKey) -> tuple[Run, threading.Thread]:
    """A run whose model asks for a slow tool (1.5 s), then another, then answers; executing in a thread."""
    agent = scripted(
        "sleeper",
        probe,
        [
            {"tool_calls": [{"name": "sleep", "args": {"seconds": 1.5}}]},
            {"tool_calls": [{"name": "echo", "args": {"text": "second step"}}]},
            {"content": "finished"},
        ],
    )
    run = Run.objects.create(agent=agent, api_key=caller_key, query="천천히 해줘")

    def work() -> None:
        try:
            run_execute(run_id=str(run.id))
        finally:
            connection.close()

    worker = threading.Thread(target=work)
    worker.start()
    return run, worker


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_running_run_stops_at_its_next_step(api_client, caller_key, probe) -> None:
    run, worker = sleeper_started(probe, caller_key)
    try:
        deadline = time.monotonic() + 30
        # The model asked for the slow tool: the run is now inside its tool step.
        while not RunEvent.objects.filter(run=run, kind="model_turn").exists():
            assert time.monotonic() < deadline, "the run never reached its first model turn"
            time.sleep(0.05)
        assert Run.objects.get(pk=run.pk).status == Run.Status.RUNNING
        response = cancel(api_client, run)
        assert response.status_code == 200
        assert response.json()["status"] == "cancelled"
    finally:
        worker.join(timeout=60)
    assert not worker.is_alive()
    run.refresh_from_db()
    assert run.status == Run.Status.CANCELLED
    assert run.answer == ""
    # The tool call under way finished; the next step (the echo) never ran.
    assert list(AuditEvent.objects.filter(run_id=run.id, action="tool.call").values_list("tool", flat=True)) == [
        "sleep"
    ]
    kinds = list(RunEvent.objects.filter(run=run).values_list("kind", "data"))
    assert [k for k, _ in kinds].count("model_turn") == 1
    assert kinds[-1] == ("status", {"status": "cancelled", "answer": "", "error": "cancelled"})
    assert AuditEvent.objects.get(run_id=run.id, action="run.cancel").args["from_status"] == "running"


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_stream_and_a_wait_on_a_run_cancelled_while_running_carry_its_last_events(
    api_client, caller_key, probe
) -> None:
    """The run reads cancelled at once; its worker finishes the call under way and records it and the run's end
    later. A stream that ended at "cancelled" missed the call (perhaps a write) and the end; so did ?wait."""
    from agents.api.events import RunEventFeed
    from agents.selectors import run_tool_calls, run_wait
    from tests.api.test_events_stream import parse_stream

    run, worker = sleeper_started(probe, caller_key)
    sent: list[str] = []
    try:
        deadline = time.monotonic() + 30
        while not RunEvent.objects.filter(run=run, kind="model_turn").exists():
            assert time.monotonic() < deadline, "the run never reached its first model turn"
            time.sleep(0.05)
        assert cancel(api_client, run).status_code == 200
        waited = run_wait(run=Run.objects.get(pk=run.pk), timeout_s=20)  # POST /runs?wait's wait
        assert [call["name"] for call in run_tool_calls(run=waited)] == ["sleep"]
        feed = RunEventFeed(run_id=run.pk, after=0, poll_s=0.05, keepalive_s=100, max_s=100)
        while True:
            chunks, state = feed.poll()
            sent.extend(chunks)
            if state == "done":
                break
            time.sleep(0.05)
    finally:
        worker.join(timeout=60)
    events, _comments = parse_stream("".join(sent))
    stored = list(RunEvent.objects.filter(run=run).order_by("seq").values_list("kind", flat=True))
    assert [event.event for event in events] == [*stored, "end"]
    assert stored[-2:] == ["tool_call", "status"]


@pytest.mark.django_db
def test_a_cancelled_runs_end_is_awaited_no_longer_than_its_workers_time_limit(caller_key) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from agents.selectors import run_end_recorded

    agent = make_agent(slug="cut-short", servers=[], with_demo_rules=False)
    run = Run.objects.create(agent=agent, api_key=caller_key, query="q", status=Run.Status.CANCELLED)
    Run.objects.filter(pk=run.pk).update(pass_started_at=timezone.now(), finished_at=timezone.now())
    assert run_end_recorded(run_id=run.pk) is False  # its worker may still record the call it was making
    Run.objects.filter(pk=run.pk).update(pass_started_at=timezone.now() - timedelta(seconds=agent.time_limit_s + 3600))
    assert run_end_recorded(run_id=run.pk) is True  # past the hard limit: the worker is gone
    Run.objects.filter(pk=run.pk).update(pass_started_at=timezone.now())
    RunEvent.objects.create(run=run, seq=1, kind="status", data={"status": "cancelled"})
    assert run_end_recorded(run_id=run.pk) is True
