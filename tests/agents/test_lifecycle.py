"""A run's lifecycle: the compare-and-swap claim with its lease, the heartbeat, a redelivery after a worker died,
time limits, retries, dispatching, and the reconciler. Races are patched in (rows updated between steps), never
waited for."""

from __future__ import annotations

import io
import itertools
import random
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings as django_settings
from django.core.management import call_command
from django.db import InterfaceError, OperationalError
from django.utils import timezone
from kombu.exceptions import OperationalError as BrokerError

from agent_platform.celery import WorkerTimer, _reconcile
from agents import checks, engine, execution
from agents.approvals import approval_decide
from agents.dispatch import run_dispatch
from agents.execution import run_claim, run_execute, worker_identity
from agents.models import Agent, Approval, Run, RunEvent
from agents.reconciler import runs_next_lease_due_in_s, runs_reconcile
from agents.run_state import RunEventWriter, run_resume
from agents.services import run_cancel
from agents.tasks import run_agent
from audit.models import AuditEvent
from mcpregistry.models import McpServer, ToolContract
from mcpregistry.pool import get_default_pool
from tests.conftest import discover_as_admin, make_agent

pytestmark = pytest.mark.django_db

QUESTION = "김하늘 님은 어느 팀 소속인가요?"


def submit(agent: Agent, query: str = QUESTION) -> Run:
    return Run.objects.create(agent=agent, query=query)


def fresh(run: Run) -> Run:
    run.refresh_from_db()
    return run


def held_by(run: Run, worker: str, *, delivery: int = 1, lease_s: float = 60.0) -> None:
    """The run as a worker that claimed it left it: running, its lease ending ``lease_s`` from now (negative:
    expired, the worker is gone)."""
    now = timezone.now()
    Run.objects.filter(pk=run.pk).update(
        status=Run.Status.RUNNING,
        worker=worker,
        delivery_count=delivery,
        heartbeat_at=now,
        started_at=now,
        lease_expires_at=now + timedelta(seconds=lease_s),
    )


def status_events(run: Run) -> list[dict[str, Any]]:
    return list(RunEvent.objects.filter(run=run, kind="status").order_by("seq").values_list("data", flat=True))


def on_event(monkeypatch: pytest.MonkeyPatch, kind: str, action: Callable[[dict[str, Any]], None]) -> None:
    """Run ``action`` right after the worker writes its first event of ``kind``: the interleaving point."""
    original, original_many = RunEventWriter.emit, RunEventWriter.emit_many
    fired: list[bool] = []

    def emit(self: RunEventWriter, event_kind: str, data: dict[str, Any]) -> None:
        original(self, event_kind, data)
        if event_kind == kind and not fired:
            fired.append(True)
            action(data)

    def emit_many(self: RunEventWriter, events: list[tuple[str, dict[str, Any]]]) -> None:
        original_many(self, events)
        for event_kind, data in events:
            if event_kind == kind and not fired:
                fired.append(True)
                action(data)

    monkeypatch.setattr(RunEventWriter, "emit", emit)
    monkeypatch.setattr(RunEventWriter, "emit_many", emit_many)


@pytest.fixture
def dispatched(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Every publish of a run's task (args and options), instead of sending it."""
    sent: list[dict[str, Any]] = []

    def apply_async(args: list[Any] | None = None, **options: Any) -> None:
        sent.append({"run_id": (args or [None])[0], **options})

    monkeypatch.setattr(run_agent, "apply_async", apply_async)
    return sent


class StepClock:
    """``execution.clock`` for tests: time moves only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# --- the claim ----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_claim_takes_a_queued_run_in_this_workers_name_with_a_lease(demo_agent, settings) -> None:
    settings.PLATFORM_RUN_LEASE_S = 60
    run = submit(demo_agent)
    before = timezone.now()
    claim = run_claim(run_id=str(run.id))
    assert claim is not None and claim.delivery == 1 and claim.worker == worker_identity()
    run = fresh(run)
    assert (run.status, run.worker, run.delivery_count) == (Run.Status.RUNNING, worker_identity(), 1)
    assert run.heartbeat_at >= before and run.started_at >= before
    assert timedelta(seconds=59) < run.lease_expires_at - before < timedelta(seconds=61)


@pytest.mark.slow
def test_a_claim_whose_read_went_stale_takes_nothing_and_keeps_the_first_start(demo_agent, monkeypatch) -> None:
    """The claim computes the run's new delivery count and first start from the row it read; its compare-and-swap
    pins what it read, so a run that was claimed, parked and queued again meanwhile (its first start set) is not
    taken by the stale claim, and its first start is not moved."""
    run = submit(demo_agent)
    stale = execution._claim_view(run.id)
    first_start = timezone.now() - timedelta(seconds=30)
    Run.objects.filter(pk=run.pk).update(started_at=first_start)  # still queued, delivery count still 0
    monkeypatch.setattr(execution, "_claim_view", lambda run_id: stale)

    assert run_claim(run_id=str(run.id)) is None
    run = fresh(run)
    assert (run.status, run.delivery_count, run.started_at) == (Run.Status.QUEUED, 0, first_start)
    monkeypatch.undo()
    assert run_claim(run_id=str(run.id)) is not None
    assert fresh(run).started_at == first_start  # a run that started before keeps its first start


def test_a_delivery_of_a_run_held_under_a_live_lease_does_nothing(demo_agent) -> None:
    run = submit(demo_agent)
    held_by(run, "other-host:7", lease_s=60)
    run_execute(run_id=str(run.id))
    run = fresh(run)
    assert (run.status, run.worker, run.delivery_count) == (Run.Status.RUNNING, "other-host:7", 1)
    assert not AuditEvent.objects.filter(run_id=run.id).exists()


def test_a_run_whose_worker_died_is_claimed_again_and_completes(demo_agent) -> None:
    run = submit(demo_agent)
    held_by(run, "dead-host:42", lease_s=-1)
    run_execute(run_id=str(run.id))
    run = fresh(run)
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert "클라우드운영팀" in run.answer
    assert (run.worker, run.delivery_count, run.lease_expires_at) == (worker_identity(), 2, None)
    assert AuditEvent.objects.filter(run_id=run.id, action="tool.call", ok=True).count() == 1
    assert [e["status"] for e in status_events(run)] == ["running", "succeeded"]


def test_a_lease_is_taken_over_only_from_the_worker_that_lost_it(demo_agent, monkeypatch) -> None:
    run = submit(demo_agent)
    held_by(run, "dead-host:42", lease_s=-1)
    real_identity = execution.worker_identity

    def another_worker_gets_there_first() -> str:
        # Between this worker's read and its compare-and-swap, another worker re-claims the run.
        held_by(run, "quick-host:9", delivery=2, lease_s=60)
        return real_identity()

    monkeypatch.setattr(execution, "worker_identity", another_worker_gets_there_first)
    assert run_claim(run_id=str(run.id)) is None
    run = fresh(run)
    assert (run.status, run.worker, run.delivery_count) == (Run.Status.RUNNING, "quick-host:9", 2)


def test_a_run_lost_too_often_fails_with_worker_lost_when_delivered_again(demo_agent, settings) -> None:
    settings.PLATFORM_RUN_MAX_DELIVERIES = 2
    run = submit(demo_agent)
    held_by(run, "dead-host:42", delivery=2, lease_s=-1)
    run_execute(run_id=str(run.id))
    run = fresh(run)
    assert (run.status, run.error_code, run.lease_expires_at) == (Run.Status.FAILED, "worker_lost", None)
    assert run.finished_at is not None
    assert status_events(run)[-1] == {"status": "failed", "answer": "", "error": "worker_lost"}
    assert not AuditEvent.objects.filter(run_id=run.id).exists()


# --- the heartbeat and the final store ------------------------------------------------------------------------


def test_the_heartbeat_extends_its_own_lease_and_notices_when_it_lost_the_run(demo_agent, settings) -> None:
    settings.PLATFORM_RUN_LEASE_S = 30
    run = submit(demo_agent)
    claim = run_claim(run_id=str(run.id))
    assert claim is not None
    Run.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() + timedelta(seconds=1))
    assert claim.heartbeat() is True
    assert fresh(run).lease_expires_at > timezone.now() + timedelta(seconds=25)
    # Its lease lapsed and another worker took the run over: the heartbeat changes nothing and says so.
    held_by(run, "other-host:7", delivery=2, lease_s=60)
    lease_of_the_other = fresh(run).lease_expires_at
    assert claim.heartbeat() is False and claim.lost.is_set()
    assert fresh(run).lease_expires_at == lease_of_the_other


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_heartbeat_thread_renews_the_lease_until_it_is_stopped(demo_agent, settings, monkeypatch) -> None:
    settings.PLATFORM_RUN_LEASE_S = 0.6
    run = submit(demo_agent)
    claim = run_claim(run_id=str(run.id))
    assert claim is not None
    first = fresh(run).lease_expires_at
    beats: list[float] = []
    beat = type(claim).heartbeat
    monkeypatch.setattr(type(claim), "heartbeat", lambda self: beats.append(time.monotonic()) or beat(self))
    claim.start_heartbeat()
    try:
        assert wait_for(lambda: fresh(run).lease_expires_at != first)
        assert fresh(run).lease_expires_at > first
        time.sleep(1)
        # Every third of the lease (0.2 s): about five beats in that second, never a burst.
        assert 3 <= len(beats) <= 10, beats
        assert min(b - a for a, b in itertools.pairwise(beats)) > 0.1
    finally:
        claim.stop_heartbeat()
    # Stopped: beaten no more (a beat every 0.2 s; one in progress when it stopped may still land).
    time.sleep(0.3)
    last = fresh(run).lease_expires_at
    time.sleep(0.6)
    assert fresh(run).lease_expires_at == last


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_one_thread_beats_every_claim_of_the_process_and_drops_a_lost_one(demo_agent, settings, caplog) -> None:
    settings.PLATFORM_RUN_LEASE_S = 0.6
    first, second = submit(demo_agent), submit(demo_agent)
    claims = [run_claim(run_id=str(first.id)), run_claim(run_id=str(second.id))]
    assert None not in claims
    before = {run.pk: fresh(run).lease_expires_at for run in (first, second)}
    threads = {t.ident for t in threading.enumerate()}
    for claim in claims:
        claim.start_heartbeat()  # type: ignore[union-attr]
    try:
        assert wait_for(lambda: all(fresh(r).lease_expires_at != before[r.pk] for r in (first, second)))
        # Another worker takes the first run over: its claim is found lost, dropped and logged; the second's
        # lease is still renewed, by the same thread.
        held_by(first, "other-host:7", delivery=2, lease_s=60)
        assert wait_for(lambda: claims[0].lost.is_set())  # type: ignore[union-attr]
        now = fresh(second).lease_expires_at
        assert wait_for(lambda: fresh(second).lease_expires_at != now)
        assert fresh(first).worker == "other-host:7"
        time.sleep(0.5)  # two more rounds of beats: the lost claim is not beaten (nor logged) again
        assert caplog.text.count("lost its claim") == 1
        started = [t for t in threading.enumerate() if t.ident not in threads]
        assert len([t for t in started if t.name == "run-heartbeats"]) <= 1  # at most the process's one thread
    finally:
        for claim in claims:
            claim.stop_heartbeat()  # type: ignore[union-attr]


@pytest.mark.django_db(transaction=True)
def test_a_claim_whose_heartbeat_fails_unexpectedly_does_not_stop_the_others(demo_agent, settings, caplog) -> None:
    settings.PLATFORM_RUN_LEASE_S = 0.6
    first, second = submit(demo_agent), submit(demo_agent)
    broken, healthy = run_claim(run_id=str(first.id)), run_claim(run_id=str(second.id))
    assert broken is not None and healthy is not None

    def fails() -> bool:
        raise RuntimeError("a bug in one beat")

    broken.heartbeat = fails  # type: ignore[method-assign]
    broken.start_heartbeat()
    healthy.start_heartbeat()
    try:
        for _ in range(3):  # beaten again and again, after the other's failures
            lease = fresh(second).lease_expires_at
            assert wait_for(lambda lease=lease: fresh(second).lease_expires_at != lease)
        assert "heartbeat failed" in caplog.text and "a bug in one beat" in caplog.text
    finally:
        broken.stop_heartbeat()
        healthy.stop_heartbeat()


def wait_for(condition, timeout_s: float = 10):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    return None


def test_a_worker_that_lost_its_run_stops_at_the_next_step_and_stores_nothing(demo_agent, monkeypatch) -> None:
    run = submit(demo_agent)
    # After the deterministic call, this worker's lease lapses and another worker re-claims the run.
    on_event(monkeypatch, "deterministic_result", lambda _data: held_by(run, "other-host:7", delivery=2))
    run_execute(run_id=str(run.id))
    run = fresh(run)
    assert (run.status, run.worker, run.delivery_count) == (Run.Status.RUNNING, "other-host:7", 2)
    assert run.answer == "" and run.finished_at is None
    assert [e["status"] for e in status_events(run)] == ["running"]


def test_a_run_cancelled_while_it_runs_stays_cancelled_and_its_worker_appends_the_event(
    demo_agent, monkeypatch
) -> None:
    run = submit(demo_agent)
    on_event(
        monkeypatch, "deterministic_result", lambda _data: run_cancel(run=Run.objects.get(pk=run.pk), actor="test")
    )
    run_execute(run_id=str(run.id))
    run = fresh(run)
    assert (run.status, run.error_code) == (Run.Status.CANCELLED, "cancelled")
    assert status_events(run)[-1] == {"status": "cancelled", "answer": "", "error": "cancelled"}


# --- time limits ----------------------------------------------------------------------------------------------


def test_a_run_past_its_time_limit_stops_between_steps_and_fails(demo_server, monkeypatch) -> None:
    agent = make_agent(
        slug="slowpoke",
        servers=[demo_server],
        provider="scripted",
        with_demo_rules=False,
        script=[
            {"tool_calls": [{"name": "list_projects", "args": {"team": "물류플랫폼팀"}}]},
            {"content": "never said: {last_tool_result}"},
        ],
    )
    Agent.objects.filter(pk=agent.pk).update(time_limit_s=20)
    stepper = StepClock()
    monkeypatch.setattr(execution, "clock", stepper)

    def twenty_seconds_pass(_data: dict[str, Any]) -> None:
        stepper.now += 20

    on_event(monkeypatch, "tool_call", twenty_seconds_pass)
    run = submit(agent, "물류플랫폼팀 프로젝트 알려줘")
    run_execute(run_id=str(run.id))
    run = fresh(run)
    assert (run.status, run.error_code) == (Run.Status.FAILED, "time_limit")
    assert RunEvent.objects.filter(run=run, kind="model_turn").count() == 1  # the second turn never happened
    assert status_events(run)[-1]["error"] == "time_limit"


def test_a_run_stopped_by_its_time_limit_counts_the_tokens_its_model_turns_spent(demo_server, monkeypatch) -> None:
    """The turns were dropped with the stop: the run recorded 0 tokens and no model call under its model turn."""
    usage = {"input_tokens": 1000, "output_tokens": 500}
    agent = make_agent(
        slug="spender",
        servers=[demo_server],
        provider="scripted",
        with_demo_rules=False,
        script=[
            {"tool_calls": [{"name": "list_projects", "args": {"team": "물류플랫폼팀"}}], "usage": usage},
            {"content": "never said", "usage": usage},
        ],
    )
    Agent.objects.filter(pk=agent.pk).update(time_limit_s=20)
    stepper = StepClock()
    monkeypatch.setattr(execution, "clock", stepper)
    on_event(monkeypatch, "tool_call", lambda _data: setattr(stepper, "now", stepper.now + 20))
    run = submit(agent, "물류플랫폼팀 프로젝트 알려줘")
    run_execute(run_id=str(run.id))
    run = fresh(run)
    assert (run.status, run.error_code) == (Run.Status.FAILED, "time_limit")
    spent = run.token_usage
    assert (spent["output_tokens"], spent["model_calls"]) == (500, 1) and spent["input_tokens"] > 0
    assert run.tokens == spent["input_tokens"] + spent["output_tokens"]


def test_celerys_soft_time_limit_fails_the_run_with_time_limit(demo_agent, monkeypatch) -> None:
    def interrupted(plan: engine.RunPlan) -> engine.RunOutcome:
        raise SoftTimeLimitExceeded()

    monkeypatch.setattr(engine, "execute", interrupted)
    run = submit(demo_agent)
    run_execute(run_id=str(run.id))
    run = fresh(run)
    assert (run.status, run.error_code, run.lease_expires_at) == (Run.Status.FAILED, "time_limit", None)
    assert status_events(run)[-1] == {"status": "failed", "answer": "", "error": "time_limit"}


def test_a_soft_time_limit_the_engine_took_for_a_model_error_is_a_time_limit(demo_agent, monkeypatch) -> None:
    stepper = StepClock()
    monkeypatch.setattr(execution, "clock", stepper)

    def model_step_interrupted(plan: engine.RunPlan) -> engine.RunOutcome:
        stepper.now += demo_agent.time_limit_s
        return engine.RunOutcome(status="failed", error_code="model:error", error_message="SoftTimeLimitExceeded: ")

    monkeypatch.setattr(engine, "execute", model_step_interrupted)
    run = submit(demo_agent)
    run_execute(run_id=str(run.id))
    assert (fresh(run).status, fresh(run).error_code) == (Run.Status.FAILED, "time_limit")


# --- retries and dispatching ----------------------------------------------------------------------------------


def test_a_database_hiccup_gives_the_run_back_for_the_tasks_retry(demo_agent, monkeypatch) -> None:
    real_execute = engine.execute
    calls: list[int] = []

    def hiccup_once(plan: engine.RunPlan) -> engine.RunOutcome:
        calls.append(1)
        if len(calls) == 1:
            raise OperationalError("database is locked")
        return real_execute(plan)

    monkeypatch.setattr(engine, "execute", hiccup_once)
    run = submit(demo_agent)
    with pytest.raises(OperationalError):
        run_execute(run_id=str(run.id))
    run = fresh(run)
    assert (run.status, run.delivery_count) == (Run.Status.QUEUED, 1)
    run_execute(run_id=str(run.id))  # the task's retry
    run = fresh(run)
    assert (run.status, run.delivery_count) == (Run.Status.SUCCEEDED, 2)


def test_the_task_retries_database_and_broker_hiccups_with_backoff_and_jitter() -> None:
    assert {OperationalError, InterfaceError, BrokerError} <= set(run_agent.autoretry_for)
    assert (run_agent.retry_backoff, run_agent.retry_jitter, run_agent.max_retries) == (2, True, 5)
    assert run_agent.acks_late and run_agent.reject_on_worker_lost


def test_a_run_is_published_with_its_time_limits_and_a_retry_policy(dispatched, settings) -> None:
    settings.PLATFORM_RUN_MAX_TIME_LIMIT_S = 1800
    settings.PLATFORM_RUN_TIME_LIMIT_GRACE_S = 30
    assert run_dispatch(run_id="r1", time_limit_s=120) is True
    assert run_dispatch(run_id="r2", time_limit_s=100_000) is True
    first, capped = dispatched
    assert (first["run_id"], first["soft_time_limit"], first["time_limit"]) == ("r1", 120, 150)
    assert first["retry"] is True and first["retry_policy"]["max_retries"] >= 1
    assert (capped["soft_time_limit"], capped["time_limit"]) == (1800, 1830)


def test_a_broker_that_stays_down_leaves_the_run_queued_for_the_reconciler(monkeypatch) -> None:
    def broker_down(*args: Any, **options: Any) -> None:
        raise BrokerError("Error 111 connecting to redis:6379. Connection refused.")

    monkeypatch.setattr(run_agent, "apply_async", broker_down)
    assert run_dispatch(run_id="r1", time_limit_s=60) is False


def test_a_resumed_run_counts_its_deliveries_afresh_and_is_dispatched_with_its_time_limits(
    demo_agent, dispatched, django_capture_on_commit_callbacks
) -> None:
    Agent.objects.filter(pk=demo_agent.pk).update(time_limit_s=90)
    run = submit(demo_agent)
    Run.objects.filter(pk=run.pk).update(status=Run.Status.AWAITING_APPROVAL, delivery_count=3)
    with django_capture_on_commit_callbacks(execute=True):
        run_resume(run_id=str(run.id))
    run = fresh(run)
    assert (run.status, run.delivery_count) == (Run.Status.QUEUED, 0)
    assert run.lease_expires_at > timezone.now()
    assert [(d["run_id"], d["soft_time_limit"]) for d in dispatched] == [(str(run.id), 90)]


# --- a write call is never made twice -------------------------------------------------------------------------


class WorkerKilled(BaseException):
    """Stands for SIGKILL: nothing after it runs, nothing catches it."""


@pytest.fixture
def note_writer(tmp_path: Path) -> Iterator[tuple[Run, Path]]:
    notes = tmp_path / "notes.txt"
    server = McpServer.objects.create(
        mcp_id="notes",
        name="notes",
        command=sys.executable,
        args=["-m", "tests.mcp_fixtures.probe_server"],
        cwd=str(django_settings.BASE_DIR),
        env={"NOTES_FILE": str(notes)},
        session_scope="shared",
    )
    assert discover_as_admin(server=server).ok
    ToolContract.objects.filter(tool__server=server, tool__name="append_note").update(idempotency_arg="idempotency_key")
    agent = make_agent(
        slug="notes",
        servers=[server],
        provider="scripted",
        with_demo_rules=False,
        script=[
            {"tool_calls": [{"name": "append_note", "args": {"text": "회의록 저장"}, "id": "call_note"}]},
            {"content": "결과: {last_tool_result}"},
        ],
    )
    yield Run.objects.create(agent=agent, query="회의록을 저장해줘"), notes
    get_default_pool().close("notes")


@pytest.mark.slow
def test_an_approved_write_made_before_the_worker_died_is_not_made_again_on_redelivery(
    note_writer, monkeypatch
) -> None:
    run, notes = note_writer
    run_execute(run_id=str(run.id))
    approval = Approval.objects.get(run=run)
    approval_decide(run=fresh(run), approval_id=str(approval.pk), decision="approve", actor="boss")

    def killed(_data: dict[str, Any]) -> None:
        raise WorkerKilled()

    # The write is made and its outcome recorded on the approval; then the worker dies before storing the run.
    on_event(monkeypatch, "tool_call", killed)
    with pytest.raises(WorkerKilled):
        run_execute(run_id=str(run.id))
    monkeypatch.undo()
    assert len(notes.read_text(encoding="utf-8").splitlines()) == 1
    assert (fresh(run).status, Approval.objects.get(pk=approval.pk).status) == (Run.Status.RUNNING, "executed")

    # Its lease lapses; the message is delivered again: the recorded outcome is used, the call is not made.
    Run.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    run_execute(run_id=str(run.id))
    run = fresh(run)
    assert (run.status, run.delivery_count) == (Run.Status.SUCCEEDED, 2), run.error_message
    assert "notes: 1" in run.answer
    assert notes.read_text(encoding="utf-8").splitlines() == [f"회의록 저장\t{run.id}:{approval.pk}"]
    calls = AuditEvent.objects.filter(run_id=run.id, action="tool.call", tool="append_note")
    assert [(c.ok, c.attempt) for c in calls] == [(True, 1)]


# --- the reconciler -------------------------------------------------------------------------------------------


def queued_for(run: Run, seconds: float) -> None:
    Run.objects.filter(pk=run.pk).update(created_at=timezone.now() - timedelta(seconds=seconds))


def test_the_reconciler_dispatches_again_runs_left_queued_too_long_a_batch_at_a_time(
    demo_agent, dispatched, settings
) -> None:
    settings.PLATFORM_RUN_QUEUED_STALE_S = 60
    settings.PLATFORM_RECONCILE_BATCH = 2
    stale = [submit(demo_agent) for _ in range(3)]
    for age, run in zip((300, 200, 100), stale, strict=True):
        queued_for(run, age)
    submit(demo_agent)  # just queued: its message is on its way
    assert runs_reconcile().redispatched == 2
    assert [d["run_id"] for d in dispatched] == [str(stale[0].id), str(stale[1].id)]
    assert runs_reconcile().redispatched == 1  # the two are not sent again before their new deadline
    assert dispatched[-1]["run_id"] == str(stale[2].id)
    assert runs_reconcile().redispatched == 0
    assert all(fresh(r).status == Run.Status.QUEUED for r in stale)


def test_the_reconciler_queues_again_a_run_whose_worker_died_and_it_completes(
    demo_agent, dispatched, django_capture_on_commit_callbacks
) -> None:
    run = submit(demo_agent)
    held_by(run, "dead-host:42", lease_s=-1)
    with django_capture_on_commit_callbacks(execute=True):
        report = runs_reconcile()
    assert (report.requeued, report.worker_lost) == (1, 0)
    assert fresh(run).status == Run.Status.QUEUED
    assert [d["run_id"] for d in dispatched] == [str(run.id)]
    assert status_events(run)[-1]["status"] == "queued"
    assert "worker_lost" in status_events(run)[-1]["reason"]
    run_execute(run_id=str(run.id))  # the new message
    run = fresh(run)
    assert (run.status, run.delivery_count) == (Run.Status.SUCCEEDED, 2)


def test_the_reconciler_fails_a_run_after_its_last_delivery(demo_agent, dispatched, settings) -> None:
    settings.PLATFORM_RUN_MAX_DELIVERIES = 3
    run = submit(demo_agent)
    held_by(run, "dead-host:42", delivery=3, lease_s=-1)
    report = runs_reconcile()
    assert (report.requeued, report.worker_lost) == (0, 1)
    run = fresh(run)
    assert (run.status, run.error_code) == (Run.Status.FAILED, "worker_lost")
    assert dispatched == []


def of_purpose(run: Run, purpose: str) -> Run:
    Run.objects.filter(pk=run.pk).update(purpose=purpose)
    return fresh(run)


def test_a_shadow_run_dispatched_again_goes_to_the_shadow_queue_and_live_and_eval_runs_to_the_default_one(
    demo_agent, dispatched, settings
) -> None:
    settings.PLATFORM_SHADOW_QUEUE = "shadow"
    settings.PLATFORM_RUN_QUEUED_STALE_S = 60
    runs = {purpose: of_purpose(submit(demo_agent), purpose) for purpose in ("live", "eval", "shadow")}
    for run in runs.values():
        queued_for(run, 300)
    assert runs_reconcile().redispatched == 3
    queues = {d["run_id"]: d.get("queue") for d in dispatched}
    assert queues == {str(runs["live"].id): None, str(runs["eval"].id): None, str(runs["shadow"].id): "shadow"}


def test_a_shadow_run_whose_worker_died_is_queued_again_on_the_shadow_queue(
    demo_agent, dispatched, settings, django_capture_on_commit_callbacks
) -> None:
    settings.PLATFORM_SHADOW_QUEUE = "shadow"
    shadow, live = of_purpose(submit(demo_agent), "shadow"), submit(demo_agent)
    held_by(shadow, "dead-host:42", lease_s=-1)
    held_by(live, "dead-host:42", lease_s=-1)
    with django_capture_on_commit_callbacks(execute=True):
        assert runs_reconcile().requeued == 2
    assert {d["run_id"]: d.get("queue") for d in dispatched} == {str(shadow.id): "shadow", str(live.id): None}


def test_a_resumed_shadow_run_goes_back_to_the_shadow_queue(
    demo_agent, dispatched, settings, django_capture_on_commit_callbacks
) -> None:
    settings.PLATFORM_SHADOW_QUEUE = "shadow"
    run = of_purpose(submit(demo_agent), "shadow")
    Run.objects.filter(pk=run.pk).update(status=Run.Status.AWAITING_APPROVAL)
    with django_capture_on_commit_callbacks(execute=True):
        run_resume(run_id=str(run.id))
    assert [(d["run_id"], d.get("queue")) for d in dispatched] == [(str(run.id), "shadow")]


def test_without_a_shadow_queue_shadow_runs_share_the_default_queue(demo_agent, dispatched, settings) -> None:
    settings.PLATFORM_SHADOW_QUEUE = ""
    settings.PLATFORM_RUN_QUEUED_STALE_S = 60
    run = of_purpose(submit(demo_agent), "shadow")
    queued_for(run, 300)
    assert runs_reconcile().redispatched == 1
    assert "queue" not in dispatched[0]


def test_the_reconciler_leaves_a_run_with_a_live_lease_alone(demo_agent, dispatched) -> None:
    run = submit(demo_agent)
    held_by(run, "busy-host:3", lease_s=30)
    assert not runs_reconcile().changed
    assert fresh(run).status == Run.Status.RUNNING


def test_the_reconciler_fails_a_run_past_its_time_limit_counted_from_its_last_pass(
    demo_agent, dispatched, settings
) -> None:
    settings.PLATFORM_RUN_TIME_LIMIT_GRACE_S = 30
    Agent.objects.filter(pk=demo_agent.pk).update(time_limit_s=60)
    overdue, resumed = submit(demo_agent), submit(demo_agent)
    long_ago = timezone.now() - timedelta(seconds=91)
    for run in (overdue, resumed):
        held_by(run, "stuck-host:5", lease_s=30)  # its heartbeat still runs: only the time limit can stop it
        RunEvent.objects.create(run=run, seq=1, kind="status", data={"status": "running", "delivery": 1})
        Run.objects.filter(pk=run.pk).update(started_at=long_ago)
    RunEvent.objects.filter(run=overdue).update(created_at=long_ago)
    # ``resumed`` started long ago, but its current pass (after an approval) began just now.
    assert runs_reconcile().timed_out == 1
    assert (fresh(overdue).status, fresh(overdue).error_code) == (Run.Status.FAILED, "time_limit")
    assert fresh(resumed).status == Run.Status.RUNNING


def test_the_reconciler_expires_due_approvals(demo_agent, dispatched, django_capture_on_commit_callbacks) -> None:
    run = submit(demo_agent)
    Run.objects.filter(pk=run.pk).update(status=Run.Status.AWAITING_APPROVAL)
    Approval.objects.create(
        run=run, mcp_id="notes", tool="append_note", call_hash="x", expires_at=timezone.now() - timedelta(seconds=1)
    )
    with django_capture_on_commit_callbacks(execute=True):
        assert runs_reconcile().approvals_expired == 1
    assert fresh(run).status == Run.Status.QUEUED
    assert [d["run_id"] for d in dispatched] == [str(run.id)]


def test_the_reconciler_ends_the_approvals_of_the_runs_that_finished_first(demo_agent, dispatched, settings) -> None:
    # One run finished an hour ago, its approval left claimed; another just now, with several. A batch of one is
    # the old run's (one row per run, oldest first): it used to be the newest approval's, every pass.
    settings.PLATFORM_RECONCILE_BATCH = 1
    old, recent = submit(demo_agent), submit(demo_agent)
    now = timezone.now()
    Run.objects.filter(pk=old.pk).update(status=Run.Status.CANCELLED, finished_at=now - timedelta(hours=1))
    Run.objects.filter(pk=recent.pk).update(status=Run.Status.CANCELLED, finished_at=now)
    for run, count in ((old, 1), (recent, 2)):
        for n in range(count):
            Approval.objects.create(
                run=run,
                mcp_id="notes",
                tool="append_note",
                call_hash=f"{run.pk}-{n}",
                status=Approval.Status.EXECUTING,
                expires_at=now + timedelta(hours=1),
            )
    assert runs_reconcile().approvals_ended == 1
    assert Approval.objects.get(run=old).status == Approval.Status.OUTCOME_UNKNOWN
    assert set(Approval.objects.filter(run=recent).values_list("status", flat=True)) == {Approval.Status.EXECUTING}


def test_reconcile_runs_prints_what_it_changed(demo_agent, dispatched) -> None:
    run = submit(demo_agent)
    held_by(run, "dead-host:42", lease_s=-1)
    out = io.StringIO()
    call_command("reconcile_runs", stdout=out)
    assert out.getvalue().splitlines() == [
        "timed_out: 0",
        "requeued: 1",
        "worker_lost: 0",
        "approvals_interrupted: 0",
        "redispatched: 0",
        "approvals_expired: 0",
        "parked_resumed: 0",
        "approvals_ended: 0",
        "cancellations_recorded: 0",
    ]


# --- settings checks ------------------------------------------------------------------------------------------


def test_the_brokers_visibility_timeout_must_outlast_every_hard_time_limit(settings) -> None:
    settings.CELERY_BROKER_URL = "redis://redis:6379/0"
    settings.PLATFORM_RUN_MAX_TIME_LIMIT_S = 1800
    settings.PLATFORM_RUN_TIME_LIMIT_GRACE_S = 30
    settings.CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 1800}
    assert [m.id for m in checks.check_run_lifecycle()] == ["agents.E001"]
    settings.CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600}
    assert checks.check_run_lifecycle() == []
    settings.CELERY_BROKER_URL = "filesystem://"
    settings.CELERY_BROKER_TRANSPORT_OPTIONS = {}
    assert checks.check_run_lifecycle() == []


def test_impossible_lifecycle_settings_are_refused(settings) -> None:
    settings.CELERY_BROKER_URL = "filesystem://"
    settings.PLATFORM_RUN_MAX_DELIVERIES = 0
    settings.PLATFORM_RUN_LEASE_S = 0
    assert [m.id for m in checks.check_run_lifecycle()] == ["agents.E002", "agents.E003"]


# --- recovery time ------------------------------------------------------------------------------------------


def test_the_next_lease_due_is_the_earliest_lease_of_a_running_run(demo_agent) -> None:
    assert runs_next_lease_due_in_s() is None
    held_by(submit(demo_agent), "host:1", lease_s=40)
    held_by(submit(demo_agent), "host:2", lease_s=12)
    queued = submit(demo_agent)
    Run.objects.filter(pk=queued.pk).update(lease_expires_at=timezone.now() + timedelta(seconds=1))
    assert 11 < runs_next_lease_due_in_s() <= 12


@pytest.mark.django_db(transaction=True)
def test_at_the_default_settings_a_run_whose_worker_died_is_taken_over_within_thirty_seconds(
    dispatched: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worst case, on a simulated clock: the worker claims the run just after a pass of its reconciler timer
    and dies at once (its lease is never renewed), and every wait of the timer is its longest (+10 %)."""
    began = timezone.now()
    elapsed = [0.0]
    monkeypatch.setattr(timezone, "now", lambda: began + timedelta(seconds=elapsed[0]))
    monkeypatch.setattr(random, "uniform", lambda low, high: high)
    run = submit(Agent.objects.create(slug="dead-worker", name="dead-worker"))
    reconciler = WorkerTimer("run-reconciler", django_settings.PLATFORM_RECONCILE_INTERVAL_S, _reconcile)
    taken_over_at: list[float] = []

    class SimulatedStop:
        """The timer's ``stop``: each wait moves the clock on at once, and it stops once the run is queued again."""

        def is_set(self) -> bool:
            return bool(taken_over_at) or elapsed[0] > 120

        def wait(self, seconds: float) -> bool:
            stored = fresh(run)
            if stored.delivery_count == 0:
                assert run_claim(run_id=str(run.id)) is not None  # ... and its worker dies
            elif stored.status == Run.Status.QUEUED:
                taken_over_at.append(elapsed[0])
                return True
            elapsed[0] += seconds
            return False

    monkeypatch.setattr(reconciler, "stop", SimulatedStop())
    reconciler._loop()
    assert taken_over_at, f"still {fresh(run).status} after {elapsed[0]:g} s"
    assert django_settings.PLATFORM_RUN_LEASE_S <= taken_over_at[0] <= 30  # not while its lease was live
    assert [d["run_id"] for d in dispatched] == [str(run.id)]
    claim = run_claim(run_id=str(run.id))  # the new message
    assert claim is not None and claim.delivery == 2


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_workers_reconciler_wakes_when_a_lease_is_due_not_a_whole_interval_later(dispatched) -> None:
    agent = Agent.objects.create(slug="lease-due", name="lease-due")
    run = submit(agent)
    reconciler = WorkerTimer("run-reconciler", 60, _reconcile)
    # Its first pass runs at once and finds the lease live; the next would be a minute later.
    held_by(run, "dead-host:42", lease_s=1.5)
    started = time.monotonic()
    reconciler.thread.start()  # not start(): the fork hooks are for a worker's main process
    try:
        deadline = started + 10
        while fresh(run).status != Run.Status.QUEUED and time.monotonic() < deadline:
            time.sleep(0.1)
        assert fresh(run).status == Run.Status.QUEUED
        assert time.monotonic() - started < 5
        assert [d["run_id"] for d in dispatched] == [str(run.id)]
    finally:
        reconciler.stop.set()
        reconciler.thread.join(timeout=10)
