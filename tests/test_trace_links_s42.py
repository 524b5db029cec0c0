"""A run's later passes are linked to the trace that created it: the run keeps the ``traceparent`` of the request
that submitted it (``Run.traceparent``), and the task span of a pass resumed after an approval (whose parent is
the approver's request) or queued again by the reconciler (a trace of its own) carries a link to it. The messages
go through the test settings' broker and are handed to the task with their headers, as a worker does; the model
is scripted, the MCP servers are real. A run created where traces are off keeps ``""``."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.utils import timezone
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from rest_framework.test import APIClient

from agent_platform.celery import app as celery_app
from agents.models import Agent, Run
from agents.reconciler import runs_reconcile
from agents.services import api_key_create, run_create
from agents.tasks import run_agent
from mcpregistry.models import McpServer, ToolContract
from mcpregistry.pool import get_default_pool
from tests.conftest import ApiCaller, discover_as_admin, make_agent

pytestmark = pytest.mark.django_db(transaction=True)

QUESTION = "김하늘 님은 어느 팀 소속인가요?"
WRITES_A_NOTE = [
    {"tool_calls": [{"name": "append_note", "args": {"text": "회의록 저장"}}]},
    {"content": "결과: {last_tool_result}"},
]
SUBMITTER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
APPROVER_TRACE = "0af7651916cd43dd8448eb211c80319c"


def traceparent(trace_id: str) -> str:
    return f"00-{trace_id}-00f067aa0ba902b7-01"


@pytest.fixture
def broker_queue() -> Iterator[Any]:
    """The run tasks' queue on the configured broker, emptied first (what earlier tests left there)."""
    with celery_app.connection_for_read() as connection:
        queue = connection.SimpleQueue("celery")
        queue.clear()
        yield queue
        queue.close()


def delivered(queue: Any, run_id: Any) -> None:
    """Take the run's next message from the broker and run its task with the message's headers, as a worker does."""
    while True:
        message = queue.get(timeout=5)
        message.ack()
        if message.headers.get("task") == "agents.run_agent" and message.payload[0] == [str(run_id)]:
            break
    run_agent.apply(args=[str(run_id)], headers=message.headers)


def submitted(client: APIClient, agent: str, query: str) -> Run:
    response = client.post(
        "/api/v1/runs",
        {"agent": agent, "query": query},
        format="json",
        HTTP_TRACEPARENT=traceparent(SUBMITTER_TRACE),
    )
    assert response.status_code == 202, response.content
    return Run.objects.get(pk=response.json()["id"])


def request_span(spans: Any, name: str) -> Any:
    (found,) = [s for s in spans.get_finished_spans() if s.name == name]
    return found


def task_spans(spans: Any) -> list[Any]:
    return [s for s in spans.get_finished_spans() if s.name == "celery.task agents.run_agent"]


def assert_linked_to_submission(later: Any, submission: Any) -> None:
    assert [(link.context.trace_id, link.context.span_id) for link in later.links] == [
        (submission.context.trace_id, submission.context.span_id)
    ]


@pytest.fixture
def writer(db: Any, tmp_path: Path) -> Iterator[tuple[Agent, APIClient]]:
    """An agent whose model writes a note (a call a person approves), and a client of a key that may decide it."""
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
    agent = make_agent(slug="notes", servers=[server], provider="scripted", script=WRITES_A_NOTE, with_demo_rules=False)
    Agent.objects.filter(pk=agent.pk).update(caller_approves_model_writes=True)
    _key, raw = api_key_create(actor="test", via="tests", name="caller")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    yield agent, client
    get_default_pool().close("notes")


@pytest.mark.slow
def test_the_pass_resumed_by_an_approval_in_another_request_is_linked_to_the_runs_first_trace(
    spans: Any, writer: tuple[Agent, APIClient], broker_queue: Any
) -> None:
    agent, client = writer
    run = submitted(client, agent.slug, "회의록을 저장해줘")
    submission = request_span(spans, "POST /api/v1/runs")
    assert run.traceparent == f"00-{SUBMITTER_TRACE}-{submission.context.span_id:016x}-01"
    delivered(broker_queue, run.id)
    run.refresh_from_db()
    assert run.status == Run.Status.AWAITING_APPROVAL, run.error_message

    approval = run.approvals.get()
    decided = client.post(
        f"/api/v1/runs/{run.id}/approvals/{approval.id}",
        {"decision": "approve"},
        format="json",
        HTTP_TRACEPARENT=traceparent(APPROVER_TRACE),
    )
    assert decided.status_code == 200, decided.content
    delivered(broker_queue, run.id)
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error_message

    first, second = task_spans(spans)
    assert first.context.trace_id == submission.context.trace_id and not first.links  # its parent is the request
    decision = request_span(spans, "POST /api/v1/runs/<str:run_id>/approvals/<str:approval_id>")
    assert second.parent.span_id == decision.context.span_id  # the publisher's, as before
    assert format(second.context.trace_id, "032x") == APPROVER_TRACE
    assert_linked_to_submission(second, submission)


@pytest.mark.parametrize("lost", ["worker", "message"])
def test_a_run_the_reconciler_queues_again_is_linked_to_its_first_trace(
    spans: Any, demo_agent: Agent, api_client: APIClient, broker_queue: Any, lost: str
) -> None:
    run = submitted(api_client, demo_agent.slug, QUESTION)
    submission = request_span(spans, "POST /api/v1/runs")
    broker_queue.get(timeout=5).ack()  # the first message: lost, or taken by a worker that died
    now = timezone.now()
    if lost == "worker":
        Run.objects.filter(pk=run.pk).update(
            status=Run.Status.RUNNING,
            worker="dead-host:42",
            delivery_count=1,
            heartbeat_at=now,
            started_at=now,
            lease_expires_at=now - timedelta(seconds=1),
        )
    else:
        Run.objects.filter(pk=run.pk).update(lease_expires_at=now - timedelta(seconds=1))

    report = runs_reconcile()  # the worker's timer: no trace of its own
    assert (report.requeued, report.redispatched) == ((1, 0) if lost == "worker" else (0, 1))
    delivered(broker_queue, run.id)
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error_message

    (again,) = task_spans(spans)
    assert again.context.trace_id != submission.context.trace_id  # a trace of its own, as before
    assert_linked_to_submission(again, submission)


def test_a_run_created_where_nothing_is_traced_keeps_no_trace_context(
    spans: Any, demo_agent: Agent, api_caller: ApiCaller
) -> None:
    assert run_create(agent_slug=demo_agent.slug, query=QUESTION, api_key=api_caller.key).traceparent == ""
    # Where traces are off, the request's span is OpenTelemetry's no-op one, carrying the caller's context as it
    # came: nothing this process records.
    caller = SpanContext(int(SUBMITTER_TRACE, 16), 0x00F067AA0BA902B7, is_remote=True, trace_flags=TraceFlags(1))
    with trace.use_span(NonRecordingSpan(caller)):
        run = run_create(agent_slug=demo_agent.slug, query=QUESTION, api_key=api_caller.key)
    assert Run.objects.get(pk=run.pk).traceparent == ""


@pytest.mark.slow
def test_a_process_that_does_not_trace_stores_no_callers_traceparent(tmp_path: Path) -> None:
    script = (
        "from django.http import HttpResponse\n"
        "from django.test import RequestFactory\n"
        "from agent_platform.telemetry import TracingMiddleware, traceparent_current\n"
        "seen = TracingMiddleware(lambda request: HttpResponse(repr(traceparent_current())))(\n"
        f"    RequestFactory().post('/api/v1/runs', HTTP_TRACEPARENT={traceparent(SUBMITTER_TRACE)!r}))\n"
        "print(seen.content.decode())\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", script],
        cwd=settings.BASE_DIR,
        env={**env, "PLATFORM_VAR_DIR": str(tmp_path), "DJANGO_SETTINGS_MODULE": "agent_platform.settings"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "''"
