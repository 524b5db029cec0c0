"""The worker's review (fix_worker):

1. a tool call cut short by the run's soft time limit left no audit event: the server ran it, and neither the
   audit nor the run's ``tool_calls`` named it;
2. the delivery count mixed the passes given back on a database hiccup with lost workers (two hiccups and one
   lost worker failed the run ``worker_lost`` "lost 3 times"), and a pass that met the same retryable error
   every time was retried for ever.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings as dj_settings
from django.db import OperationalError
from django.utils import timezone

from agents import engine, execution, reconciler
from agents.execution import run_execute
from agents.models import Approval, DeterministicRule, Run, RunEvent
from agents.reconciler import runs_reconcile
from agents.run_state import RunEventWriter
from agents.tasks import run_agent
from audit.models import AuditEvent
from mcpregistry import gate
from mcpregistry.models import McpServer
from mcpregistry.pool import get_default_pool
from tests.conftest import discover_as_admin, make_agent
from tests.mcpregistry.test_soft_time_limit import parked_write

pytestmark = pytest.mark.django_db


# ---- 1. a call cut short by the soft time limit -----------------------------------------------------------------


@contextmanager
def soft_time_limit_once(received: Callable[[], bool]) -> Iterator[None]:
    """Celery's soft time limit, raised in this (the main) thread by a signal handler as its worker raises it, once
    ``received()`` says the server has the call: the limit falls while the call is out, whatever the machine's
    speed (a limit on a clock could fall while the session opens, before anything is sent)."""

    def soft_limit(signum: int, frame: Any) -> None:
        raise SoftTimeLimitExceeded()

    old = signal.signal(signal.SIGALRM, soft_limit)
    main = threading.main_thread().ident
    assert main == threading.get_ident() and main is not None  # a signal's handler runs in the main thread
    done = threading.Event()

    def fire_once_received() -> None:
        while not done.is_set() and not received():
            done.wait(0.02)
        if not done.is_set():
            signal.pthread_kill(main, signal.SIGALRM)

    watcher = threading.Thread(target=fire_once_received, daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()
        signal.signal(signal.SIGALRM, old)


@pytest.fixture
def hanging_server(tmp_path: Path) -> Iterator[tuple[McpServer, Path]]:
    """A real stdio server that records each call it receives, then never answers (``SIDE_EFFECT_MODE=hang``)."""
    side_effects = tmp_path / "side_effects.txt"
    server = McpServer.objects.create(
        mcp_id="hangs",
        name="hangs",
        command=sys.executable,
        args=["-m", "tests.mcp_fixtures.side_effect_server"],
        cwd=str(dj_settings.BASE_DIR),
        env={"SIDE_EFFECT_FILE": str(side_effects), "SIDE_EFFECT_MODE": "hang"},  # type: ignore[misc]
        session_scope="shared",
        timeout_s=60,
    )
    assert discover_as_admin(server=server).ok
    try:
        yield server, side_effects
    finally:
        get_default_pool().close("hangs")


def has_line(path: Path, line: str) -> Callable[[], bool]:
    return lambda: path.exists() and line in path.read_text(encoding="utf-8").splitlines()


@pytest.mark.slow
def test_a_models_read_cut_short_by_the_soft_time_limit_is_audited_and_listed_in_the_runs_tool_calls(
    hanging_server: tuple[McpServer, Path], api_caller: Any, api_client: Any
) -> None:
    server, side_effects = hanging_server
    agent = make_agent(
        slug="slow-reader",
        servers=[server],
        provider="scripted",
        with_demo_rules=False,
        script=[{"tool_calls": [{"name": "record_read", "args": {"key": "사번-1"}, "id": "c1"}]}, {"content": "done"}],
    )
    run = Run.objects.create(agent=agent, api_key=api_caller.key, query="사번-1 조회해줘")
    with soft_time_limit_once(has_line(side_effects, "read:사번-1")):
        run_execute(run_id=str(run.id))

    run.refresh_from_db()
    assert (run.status, run.error_code) == (Run.Status.FAILED, "time_limit")
    event = AuditEvent.objects.get(run_id=run.id, action="tool.call", tool="record_read")
    assert (event.ok, event.reason, event.attempt) == (False, "time_limit", 1)
    assert event.result == {"interrupted": "time_limit", "answered": False}
    [call] = api_client.get(f"/api/v1/runs/{run.id}").json()["tool_calls"]
    assert (call["name"], call["args"], call["ok"], call["reason"]) == (
        "record_read",
        {"key": "사번-1"},
        False,
        "time_limit",
    )


@pytest.mark.slow
def test_a_rules_read_cut_short_by_the_soft_time_limit_is_audited_through_the_stages_record(
    hanging_server: tuple[McpServer, Path],
) -> None:
    server, side_effects = hanging_server
    agent = make_agent(slug="slow-rule", servers=[server], with_demo_rules=False)
    DeterministicRule.objects.create(
        agent=agent,
        server=server,
        name="사번 조회",
        order=10,
        tool_name="record_read",
        when={"regex": r"(?P<key>사번-\d+)"},
        params={"key": "{match.key}"},
        answer_template="{result}",
    )
    run = Run.objects.create(agent=agent, query="사번-2 조회해줘")
    with soft_time_limit_once(has_line(side_effects, "read:사번-2")):
        run_execute(run_id=str(run.id))

    run.refresh_from_db()
    assert (run.status, run.error_code) == (Run.Status.FAILED, "time_limit")
    event = AuditEvent.objects.get(run_id=run.id, action="tool.call", tool="record_read")
    assert (event.ok, event.reason) == (False, "time_limit")


@pytest.mark.slow
def test_an_approved_write_cut_short_by_the_soft_time_limit_is_audited_with_its_outcome_unknown(
    hanging_server: tuple[McpServer, Path], api_caller: Any
) -> None:
    server, side_effects = hanging_server
    run, approval = parked_write(server, "append_line", {"text": "송금 100원"}, api_caller.key)
    with soft_time_limit_once(has_line(side_effects, "송금 100원\t")):
        run_execute(run_id=str(run.id))

    run.refresh_from_db()
    approval.refresh_from_db()
    assert (run.status, run.error_code) == (Run.Status.FAILED, "time_limit")
    assert approval.status == Approval.Status.OUTCOME_UNKNOWN  # as before: the run's failure ends it
    sent = AuditEvent.objects.get(run_id=run.id, action="tool.call", tool="append_line")
    assert (sent.ok, sent.reason) == (False, "time_limit")
    assert sent.result == {"interrupted": "time_limit", "answered": False, "outcome_unknown": True}
    assert AuditEvent.objects.filter(run_id=run.id, action="approval.outcome_unknown").count() == 1


class _InterruptedRunner:
    """A runner whose call the soft time limit interrupts (or whose database fails) while the call is out."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def call_tool(self, *args: Any, **kwargs: Any) -> Any:
        raise self.error


def _gated_echo(demo_server: McpServer, monkeypatch: pytest.MonkeyPatch, error: BaseException) -> None:
    monkeypatch.setattr(gate, "get_default_pool", lambda: _InterruptedRunner(error))
    gate.call(
        server=McpServer.objects.get(pk=demo_server.pk),
        tool_name="search_employee",
        args={"name": "김하늘"},
        who=gate.GateCall(source="agent", run_id="7f1d0c52-3c1e-4a8e-9a57-4f0f5e8f9a10", call_id="c1"),
    )


def test_an_interruption_whose_audit_cannot_be_written_is_still_raised(
    demo_server: McpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    def database_down(**event: Any) -> None:
        raise OperationalError("the database is gone")

    monkeypatch.setattr(gate, "audit_event_record", database_down)
    with pytest.raises(SoftTimeLimitExceeded):
        _gated_echo(demo_server, monkeypatch, SoftTimeLimitExceeded())


def test_a_database_error_while_a_call_is_out_is_raised_with_nothing_written(
    demo_server: McpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    written: list[dict[str, Any]] = []
    monkeypatch.setattr(gate, "audit_event_record", lambda **event: written.append(event))
    with pytest.raises(OperationalError):
        _gated_echo(demo_server, monkeypatch, OperationalError("server closed the connection"))
    assert written == []


# ---- 2. retries are not lost workers, and they end ---------------------------------------------------------------


class Killed(BaseException):
    """The worker's process dies mid-pass (SIGKILL): nothing of the pass runs after it."""


def passes_that(monkeypatch: pytest.MonkeyPatch, *failures: BaseException | None) -> None:
    """The engine's passes, in order: each raises its failure (None: runs the real engine)."""
    real = engine.execute
    left = list(failures)

    def scripted(plan: engine.RunPlan) -> engine.RunOutcome:
        failure = left.pop(0) if left else None
        if failure is not None:
            raise failure
        return real(plan)

    monkeypatch.setattr(engine, "execute", scripted)


def hiccup() -> OperationalError:
    return OperationalError("database is locked")


def lapse(run: Run) -> None:
    Run.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))


@pytest.fixture
def no_broker(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    sent: list[Any] = []
    monkeypatch.setattr(run_agent, "apply_async", lambda args=None, **options: sent.append(args))
    return sent


def test_two_hiccups_then_one_lost_worker_is_taken_over_by_the_reconciler(
    demo_agent: Any, monkeypatch: pytest.MonkeyPatch, settings: Any, no_broker: list[Any]
) -> None:
    settings.PLATFORM_RUN_MAX_DELIVERIES = 3
    passes_that(monkeypatch, hiccup(), hiccup(), Killed())
    run = Run.objects.create(agent=demo_agent, query="김하늘 님은 어느 팀 소속인가요?")
    for _ in range(2):
        with pytest.raises(OperationalError):
            run_execute(run_id=str(run.id))
    with pytest.raises(Killed):
        run_execute(run_id=str(run.id))
    lapse(run)

    report = runs_reconcile()
    run.refresh_from_db()
    assert (report.requeued, report.worker_lost) == (1, 0)
    assert run.status == Run.Status.QUEUED
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error_message


def test_two_hiccups_then_one_lost_worker_is_taken_over_by_the_next_delivery(
    demo_agent: Any, monkeypatch: pytest.MonkeyPatch, settings: Any, no_broker: list[Any]
) -> None:
    settings.PLATFORM_RUN_MAX_DELIVERIES = 3
    passes_that(monkeypatch, hiccup(), hiccup(), Killed())
    run = Run.objects.create(agent=demo_agent, query="김하늘 님은 어느 팀 소속인가요?")
    for _ in range(2):
        with pytest.raises(OperationalError):
            run_execute(run_id=str(run.id))
    with pytest.raises(Killed):
        run_execute(run_id=str(run.id))
    lapse(run)

    run_execute(run_id=str(run.id))  # the lost pass's message, delivered again
    run.refresh_from_db()
    assert (run.status, run.delivery_count) == (Run.Status.SUCCEEDED, 4), run.error_message


def test_a_run_whose_worker_is_lost_as_often_as_allowed_still_fails_counting_losses_alone(
    demo_agent: Any, monkeypatch: pytest.MonkeyPatch, settings: Any, no_broker: list[Any]
) -> None:
    settings.PLATFORM_RUN_MAX_DELIVERIES = 2
    passes_that(monkeypatch, hiccup(), Killed(), Killed())
    run = Run.objects.create(agent=demo_agent, query="김하늘 님은 어느 팀 소속인가요?")
    with pytest.raises(OperationalError):
        run_execute(run_id=str(run.id))
    for _ in range(2):
        with pytest.raises(Killed):
            run_execute(run_id=str(run.id))
        lapse(run)
        runs_reconcile()

    run.refresh_from_db()
    assert (run.status, run.error_code, run.error_message) == (
        Run.Status.FAILED,
        "worker_lost",
        "the worker running it was lost 2 times",
    )


# The passes a run may end on an error a retry can fix: the task's deliveries, its first and its 5 retries.
RETRIED_PASSES = 6


def test_a_pass_that_meets_the_same_retryable_error_every_time_ends_the_run_failed(
    demo_agent: Any, monkeypatch: pytest.MonkeyPatch, no_broker: list[Any]
) -> None:
    always = [OperationalError("too many SQL variables: 김하늘") for _ in range(RETRIED_PASSES + 1)]
    passes_that(monkeypatch, *always)
    run = Run.objects.create(agent=demo_agent, query="김하늘 님은 어느 팀 소속인가요?")
    for _ in range(RETRIED_PASSES - 1):
        with pytest.raises(OperationalError):
            run_execute(run_id=str(run.id))
    run_execute(run_id=str(run.id))  # the last pass: the run ends, nothing is raised for a retry

    run.refresh_from_db()
    assert (run.status, run.error_code, run.delivery_count) == (
        Run.Status.FAILED,
        "retries_exhausted",
        RETRIED_PASSES,
    )
    assert run.error_message == (
        f"{RETRIED_PASSES} passes met an error a retry can fix (the last: OperationalError); not retried again"
    )
    # Its message is gone for good: the reconciler finds nothing to send again, however late.
    assert runs_reconcile(now=timezone.now() + timedelta(days=1)).redispatched == 0
    last = RunEvent.objects.filter(run=run, kind="status").order_by("-seq").first()
    assert last is not None and last.data["status"] == "failed"


def test_the_tasks_retries_end_with_the_passes_a_run_may_retry() -> None:
    assert run_agent.max_retries + 1 == execution.RETRIED_PASSES_MAX == RETRIED_PASSES


def test_a_resumed_run_counts_its_retried_passes_afresh(demo_agent: Any) -> None:
    run = Run.objects.create(agent=demo_agent, query="김하늘 님은 어느 팀 소속인가요?")
    writer = RunEventWriter(run_id=run.id, secrets=[])
    for status in ({"status": "queued", "reason": "retryable"}, {"status": "awaiting_approval"}, {"status": "queued"}):
        writer.emit("status", status)
    assert reconciler.run_retried_passes(run_id=run.id) == 0
    writer.emit("status", {"status": "queued", "reason": "retryable"})
    assert reconciler.run_retried_passes(run_id=run.id) == 1
    assert reconciler.run_worker_losses(run_id=run.id, delivery_count=3) == 2
