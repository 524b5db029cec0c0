"""Runs that meet what they cannot read: a secret stored with a key this process lacks (a Fernet token made with
another key, written by SQL as a restored dump or a dropped key leaves it), or any other fault outside the engine.

1. A pass whose setup or store fails ends its run ``failed`` on its first delivery, with a reason of its own
   (``config:secret_unreadable``, ``internal``) and its ``status`` event: never left ``running`` to be delivered
   again and failed as ``worker_lost``. Database hiccups are still given back for the task's retry; a cancellation
   or a takeover that came first keeps its ending.
2. One run the reconciler cannot repair is logged and skipped or failed bare, and the pass goes on: other lost runs
   are queued again, approvals expire, parked runs resume.
3. ``POST /api/v1/runs`` answers such a configuration with a 503 ``config:secret_unreadable``, not a 500.
4. A worker that lost its run while it was paused appends no event after the run's end; its call's audit row stays.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from cryptography.fernet import Fernet
from django.db import OperationalError, connection
from django.utils import timezone
from rest_framework.test import APIClient

from agents import execution
from agents.approvals import approvals_expire_due
from agents.config_cache import run_configuration_forget
from agents.execution import run_execute
from agents.models import Agent, Approval, Run, RunEvent
from agents.reconciler import runs_reconcile
from agents.run_state import RunEventWriter
from agents.services import run_cancel
from agents.tasks import run_agent
from audit.models import AuditEvent
from mcpregistry.models import McpServer
from tests.conftest import make_agent

pytestmark = pytest.mark.django_db

QUESTION = "김하늘 님은 어느 팀 소속인가요?"
UNREADABLE = "config:secret_unreadable"


def foreign_token(value: Any) -> str:
    """A secret as another installation (another ``SECRETS_ENCRYPTION_KEYS``) encrypted it."""
    return "fernet:" + Fernet(Fernet.generate_key()).encrypt(json.dumps(value).encode()).decode()


def store_foreign(model: type[Any], column: str, pk: Any, value: Any) -> str:
    """Write ``column`` of one row as a foreign token, by SQL (as a restored dump would); this process forgets the
    configuration it holds, as it would after a change. Returns the token."""
    token = foreign_token(value)
    table, pk_column = model._meta.db_table, model._meta.pk.column
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET {column} = %s WHERE {pk_column} = %s",
            [token, model._meta.pk.get_db_prep_value(pk, connection)],
        )
    run_configuration_forget()
    return token


def store_corrupt(model: type[Any], column: str, pk: Any) -> None:
    """Write ``column`` of one row as no stored secret is ever written: JSON in clear, not a token (a row written
    by hand). Unlike a foreign token, which loads and fails only where its values are used
    (``mcpregistry.crypto.UnreadableSecrets``), such a row cannot be loaded at all."""
    table, pk_column = model._meta.db_table, model._meta.pk.column
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET {column} = %s WHERE {pk_column} = %s",
            ['{"text": "메모"}', model._meta.pk.get_db_prep_value(pk, connection)],
        )
    run_configuration_forget()


def poison_agent(agent: Agent) -> str:
    return store_foreign(Agent, "model_secrets", agent.pk, {"api_key": {"value": "sk-foreign-000000000000"}})


def submit(agent: Agent) -> Run:
    return Run.objects.create(agent=agent, query=QUESTION)


def fresh(run: Run) -> Run:
    run.refresh_from_db()
    return run


def status_events(run: Run) -> list[dict[str, Any]]:
    return list(RunEvent.objects.filter(run=run, kind="status").order_by("seq").values_list("data", flat=True))


def held_by(run: Run, worker: str, *, delivery: int = 1, lease_s: float = 60.0) -> None:
    now = timezone.now()
    Run.objects.filter(pk=run.pk).update(
        status=Run.Status.RUNNING,
        worker=worker,
        delivery_count=delivery,
        heartbeat_at=now,
        started_at=now,
        pass_started_at=now,
        lease_expires_at=now + timedelta(seconds=lease_s),
    )


def approval_of(run: Run, *, status: str, expires_in_s: float = 600) -> Approval:
    return Approval.objects.create(
        run=run,
        mcp_id="sds-company-data",
        tool="write_note",
        args={"text": "메모"},
        exact_args={"text": "메모"},
        call_hash="0" * 64,
        call_id="call_w",
        status=status,
        expires_at=timezone.now() + timedelta(seconds=expires_in_s),
    )


@pytest.fixture
def dispatched(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The run ids whose task was published, instead of sending them."""
    sent: list[str] = []
    monkeypatch.setattr(run_agent, "apply_async", lambda args=None, **_options: sent.append((args or [None])[0]))
    return sent


# --- 1. a pass that fails outside the engine -------------------------------------------------------------------


def test_a_run_whose_agents_secret_cannot_be_decrypted_fails_on_its_first_delivery(demo_agent, dispatched) -> None:
    run = submit(demo_agent)
    token = poison_agent(demo_agent)

    run_execute(run_id=str(run.id))  # returns: the task ends, its message is acknowledged, never delivered again

    run = fresh(run)
    assert (run.status, run.error_code, run.delivery_count, run.lease_expires_at) == (
        Run.Status.FAILED,
        UNREADABLE,
        1,
        None,
    )
    assert "SECRETS_ENCRYPTION_KEYS" in run.error_message
    assert token[10:40] not in run.error_message and "sk-foreign" not in run.error_message
    assert status_events(run)[-1] == {"status": "failed", "answer": "", "error": UNREADABLE}
    # Nothing left for the reconciler: no worker_lost, nothing queued again.
    report = runs_reconcile()
    assert (report.requeued, report.worker_lost) == (0, 0)
    assert (fresh(run).status, fresh(run).error_code) == (Run.Status.FAILED, UNREADABLE)
    assert dispatched == []


def test_a_run_whose_bound_servers_secret_cannot_be_decrypted_fails_with_the_same_reason(
    demo_agent, demo_server: McpServer
) -> None:
    run = submit(demo_agent)
    store_foreign(McpServer, "env", demo_server.pk, {"INTERNAL_API_KEY": "foreign-000000000000"})
    run_execute(run_id=str(run.id))
    run = fresh(run)
    assert (run.status, run.error_code, run.delivery_count) == (Run.Status.FAILED, UNREADABLE, 1)


def test_an_unexpected_error_setting_up_a_pass_fails_the_run_as_internal_without_its_text(
    demo_agent, monkeypatch
) -> None:
    def broken(_run: Run) -> list[dict[str, str]]:
        raise KeyError("sk-live-0123456789abcdef0123")

    monkeypatch.setattr(execution, "conversation_history", broken)
    run = submit(demo_agent)
    run_execute(run_id=str(run.id))
    run = fresh(run)
    assert (run.status, run.error_code, run.error_message, run.delivery_count) == (
        Run.Status.FAILED,
        "internal",
        "KeyError",
        1,
    )
    assert [e["status"] for e in status_events(run)] == ["running", "failed"]


def test_an_unexpected_error_storing_a_pass_fails_the_run_rather_than_leave_it_running(demo_agent, monkeypatch) -> None:
    def broken(_run: Run, _timings: dict[str, float]) -> dict[str, float]:
        raise ValueError("the timings could not be merged")

    monkeypatch.setattr(execution, "_merged_timings", broken)
    run = submit(demo_agent)
    run_execute(run_id=str(run.id))
    run = fresh(run)
    assert (run.status, run.error_code, run.error_message) == (Run.Status.FAILED, "internal", "ValueError")
    assert [e["status"] for e in status_events(run)] == ["running", "failed"]  # the outcome's was rolled back


def test_a_database_hiccup_setting_up_a_pass_still_gives_the_run_back_for_the_tasks_retry(
    demo_agent, monkeypatch
) -> None:
    real_run_parts = execution.run_parts
    calls: list[int] = []

    def hiccup_once(**kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise OperationalError("database is locked")
        return real_run_parts(**kwargs)

    monkeypatch.setattr(execution, "run_parts", hiccup_once)
    run = submit(demo_agent)
    with pytest.raises(OperationalError):
        run_execute(run_id=str(run.id))
    assert (fresh(run).status, fresh(run).delivery_count) == (Run.Status.QUEUED, 1)
    run_execute(run_id=str(run.id))  # the task's retry
    assert (fresh(run).status, fresh(run).delivery_count) == (Run.Status.SUCCEEDED, 2)


def fault_after(monkeypatch: pytest.MonkeyPatch, change: Callable[[Run], None]) -> None:
    """The pass's setup fails right after ``change`` (what happened to the run meanwhile)."""

    def history(run: Run) -> list[dict[str, str]]:
        change(run)
        raise RuntimeError("setup failed")

    monkeypatch.setattr(execution, "conversation_history", history)


def test_a_fault_after_the_run_was_cancelled_keeps_the_cancellation_and_records_its_end(
    demo_agent, monkeypatch
) -> None:
    fault_after(monkeypatch, lambda run: run_cancel(run=run, actor="admin:kim"))
    run = submit(demo_agent)
    run_execute(run_id=str(run.id))
    run = fresh(run)
    assert (run.status, run.error_code) == (Run.Status.CANCELLED, "cancelled")
    assert status_events(run)[-1]["status"] == "cancelled"


def test_a_fault_after_another_worker_took_the_run_over_changes_nothing_of_it(demo_agent, monkeypatch) -> None:
    fault_after(monkeypatch, lambda run: held_by(run, "quick-host:9", delivery=2))
    run = submit(demo_agent)
    run_execute(run_id=str(run.id))
    run = fresh(run)
    assert (run.status, run.worker, run.delivery_count, run.error_code) == (
        Run.Status.RUNNING,
        "quick-host:9",
        2,
        "",
    )
    assert [e["status"] for e in status_events(run)] == ["running"]


# --- 2. the reconciler goes on past a run it cannot repair ------------------------------------------------------


def test_a_lost_run_whose_agent_cannot_be_read_is_failed_and_the_pass_goes_on(
    demo_server, dispatched, settings, django_capture_on_commit_callbacks
) -> None:
    settings.PLATFORM_RUN_MAX_DELIVERIES = 3
    imported = make_agent(slug="imported", servers=[demo_server])
    healthy = make_agent(slug="healthy", servers=[demo_server])
    poisoned_lost, poisoned_overdue = submit(imported), submit(imported)
    held_by(poisoned_lost, "dead-host:1", delivery=3, lease_s=-5)  # its last delivery lost: it fails
    held_by(poisoned_overdue, "live-host:2", lease_s=60)
    Run.objects.filter(pk=poisoned_overdue.pk).update(pass_started_at=timezone.now() - timedelta(days=1))
    other = submit(healthy)
    held_by(other, "dead-host:3", delivery=1, lease_s=-1)  # lost after the poisoned one: queued again
    parked = submit(healthy)
    Run.objects.filter(pk=parked.pk).update(status=Run.Status.AWAITING_APPROVAL)
    approval_of(parked, status=Approval.Status.PENDING, expires_in_s=-1)
    poison_agent(imported)

    with django_capture_on_commit_callbacks(execute=True):
        report = runs_reconcile()

    assert (report.timed_out, report.requeued, report.worker_lost, report.approvals_expired) == (1, 1, 1, 1)
    assert (fresh(poisoned_lost).status, fresh(poisoned_lost).error_code) == (Run.Status.FAILED, "worker_lost")
    assert (fresh(poisoned_overdue).status, fresh(poisoned_overdue).error_code) == (Run.Status.FAILED, "time_limit")
    assert status_events(poisoned_lost)[-1] == {"status": "failed", "answer": "", "error": "worker_lost"}
    assert fresh(other).status == Run.Status.QUEUED
    assert fresh(parked).status == Run.Status.QUEUED  # its approval expired, the run resumed
    assert sorted(dispatched) == sorted([str(other.id), str(parked.id)])


def test_a_lost_run_that_cannot_be_queued_again_is_failed_bare_and_the_others_are_repaired(
    demo_agent, dispatched, caplog, django_capture_on_commit_callbacks
) -> None:
    stuck = submit(demo_agent)
    held_by(stuck, "dead-host:1", lease_s=-5)
    # An approved call its dead worker had claimed, whose stored arguments cannot be loaded: ending it (outcome
    # unknown) reads it, and so does queueing the run again or failing it whole.
    claimed = approval_of(stuck, status=Approval.Status.EXECUTING)
    store_corrupt(Approval, "exact_args", claimed.pk)
    other = submit(demo_agent)
    held_by(other, "dead-host:2", lease_s=-1)

    with caplog.at_level(logging.ERROR), django_capture_on_commit_callbacks(execute=True):
        report = runs_reconcile()

    assert (report.requeued, report.worker_lost) == (1, 1)
    assert (fresh(stuck).status, fresh(stuck).error_code) == (Run.Status.FAILED, "worker_lost")
    assert status_events(stuck)[-1] == {"status": "failed", "answer": "", "error": "worker_lost"}
    assert fresh(other).status == Run.Status.QUEUED
    assert dispatched == [str(other.id)]
    assert any(str(stuck.id) in record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR)
    # The next pass: its approval is still unreadable (logged again), and nothing else is held up by it.
    Run.objects.filter(pk=stuck.pk).update(finished_at=timezone.now() - timedelta(days=1))
    assert runs_reconcile().approvals_ended == 0
    assert Approval.objects.filter(pk=claimed.pk).values_list("status", flat=True).get() == Approval.Status.EXECUTING


def test_a_due_approval_that_cannot_be_read_does_not_stop_the_steps_after_it(
    demo_agent, dispatched, django_capture_on_commit_callbacks
) -> None:
    blocked = submit(demo_agent)
    Run.objects.filter(pk=blocked.pk).update(status=Run.Status.AWAITING_APPROVAL)
    unreadable = approval_of(blocked, status=Approval.Status.PENDING, expires_in_s=-1)
    store_corrupt(Approval, "exact_args", unreadable.pk)
    decided = submit(demo_agent)  # parked, its approval decided where no transaction resumed it
    Run.objects.filter(pk=decided.pk).update(status=Run.Status.AWAITING_APPROVAL)
    approval_of(decided, status=Approval.Status.APPROVED)

    with django_capture_on_commit_callbacks(execute=True):
        report = runs_reconcile()

    assert (report.approvals_expired, report.parked_resumed) == (0, 1)
    assert fresh(decided).status == Run.Status.QUEUED
    assert dispatched == [str(decided.id)]


def test_a_due_approval_that_cannot_be_read_leaves_the_next_due_approval_to_expire(
    demo_agent, dispatched, caplog, django_capture_on_commit_callbacks
) -> None:
    first, second = submit(demo_agent), submit(demo_agent)
    Run.objects.filter(pk__in=[first.pk, second.pk]).update(status=Run.Status.AWAITING_APPROVAL)
    unreadable = approval_of(first, status=Approval.Status.PENDING, expires_in_s=-10)
    store_corrupt(Approval, "exact_args", unreadable.pk)
    due = approval_of(second, status=Approval.Status.PENDING, expires_in_s=-1)

    with caplog.at_level(logging.ERROR), django_capture_on_commit_callbacks(execute=True):
        assert approvals_expire_due() == 1

    assert Approval.objects.filter(pk=due.pk).values_list("status", flat=True).get() == Approval.Status.EXPIRED
    assert fresh(second).status == Run.Status.QUEUED and dispatched == [str(second.id)]
    assert Approval.objects.filter(pk=unreadable.pk).values_list("status", flat=True).get() == Approval.Status.PENDING
    assert any(str(first.id) in record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR)


# --- 3. the API names the configuration problem -------------------------------------------------------------------


def test_submitting_to_an_agent_whose_secret_cannot_be_decrypted_is_a_503_naming_the_problem(
    demo_agent, api_client: APIClient
) -> None:
    token = poison_agent(demo_agent)
    response = api_client.post("/api/v1/runs", {"agent": demo_agent.slug, "query": QUESTION}, format="json")
    assert response.status_code == 503, response.content
    error = response.json()["error"]
    assert error["code"] == UNREADABLE
    assert "SECRETS_ENCRYPTION_KEYS" in error["message"]
    assert int(response["Retry-After"]) > 0
    body = response.content.decode()
    assert token[10:40] not in body and "sk-foreign" not in body
    assert not Run.objects.exists()


# --- 4. a worker that lost its run while paused -----------------------------------------------------------------


class StepClock:
    """``execution.clock``: time moves only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_worker_paused_past_its_lease_appends_no_event_after_the_run_ended_elsewhere(
    demo_server, monkeypatch, settings
) -> None:
    settings.PLATFORM_RUN_LEASE_S = 10
    clock = StepClock()
    monkeypatch.setattr(execution, "clock", clock)
    agent = make_agent(
        slug="react",
        servers=[demo_server],
        provider="scripted",
        with_demo_rules=False,
        script=[
            {"tool_calls": [{"name": "search_employee", "args": {"name": "김하늘"}, "id": "call_1"}]},
            {"content": "답: {last_tool_result}"},
        ],
    )
    run = submit(agent)
    real_emit, real_emit_many = RunEventWriter.emit, RunEventWriter.emit_many
    paused: list[bool] = []

    def pause_before(events: list[tuple[str, dict[str, Any]]]) -> None:
        if any(kind == "tool_call" for kind, _ in events) and not paused:
            # The process stopped as its call returned, past its lease: another worker took the run over and
            # ended it (with its last event) before this one woke.
            paused.append(True)
            clock.now += settings.PLATFORM_RUN_LEASE_S
            Run.objects.filter(pk=run.pk).update(
                status=Run.Status.SUCCEEDED, worker="other-host:9", delivery_count=2, finished_at=timezone.now()
            )
            real_emit(RunEventWriter(run_id=run.pk, secrets=[]), "status", {"status": "succeeded", "answer": "다른 답"})

    def emit(self: RunEventWriter, kind: str, data: dict[str, Any]) -> None:
        pause_before([(kind, data)])
        real_emit(self, kind, data)

    def emit_many(self: RunEventWriter, events: list[tuple[str, dict[str, Any]]]) -> None:
        pause_before(events)
        real_emit_many(self, events)

    monkeypatch.setattr(RunEventWriter, "emit", emit)
    monkeypatch.setattr(RunEventWriter, "emit_many", emit_many)
    run_execute(run_id=str(run.id))
    assert paused

    events = list(RunEvent.objects.filter(run=run).order_by("seq").values_list("kind", "data"))
    assert events[-1] == ("status", {"status": "succeeded", "answer": "다른 답"})
    assert "tool_call" not in [kind for kind, _ in events]
    run = fresh(run)
    assert (run.status, run.worker, run.answer) == (Run.Status.SUCCEEDED, "other-host:9", "")
    # What the call did is recorded all the same.
    call = AuditEvent.objects.get(run_id=run.id, action="tool.call")
    assert (call.tool, call.ok) == ("search_employee", True)


def test_another_agents_unreadable_secret_fails_none_of_this_agents_runs(demo_server, dispatched) -> None:
    """Every binding's secrets mask every run (``every_binding_secret``): one row this process cannot decrypt
    failed the runs of every agent, and refused every submission."""
    healthy = make_agent(slug="healthy", servers=[demo_server])
    poison_agent(make_agent(slug="imported", servers=[demo_server]))
    run = submit(healthy)

    run_execute(run_id=str(run.id))

    assert fresh(run).status == Run.Status.SUCCEEDED, fresh(run).error_message
