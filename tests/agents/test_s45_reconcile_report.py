"""What the reconciler reports, and how a cancelled run's end is recorded (defects s45 "Runs survive workers").

1. ``reconcile_runs`` did not report the approved calls it ended ``outcome_unknown`` as it queued again (or
   failed) a lost run (``approvals_ended: 0`` in the same pass), nor the ``cancelled`` ends it recorded (step 7):
   both are figures of the report now (``approvals_interrupted``, ``cancellations_recorded``), printed.
2. A cancelled run's ``tool_failures`` stayed 0 when a call had failed: only a stored outcome set it, and a
   cancelled run stores none. The end's record counts the stopped pass's failed calls now, as an outcome does.
3. A cancelled run whose worker recorded its end kept its lease (the run page showed one minutes ahead).

The run of items 2 and 3 calls the real demo server over stdio; the cancel is patched in where it lands, as in
``tests/agents/test_cancel_stops_calls_s43.py``.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.utils import timezone

from agents.dispatch import run_time_limits
from agents.execution import run_execute
from agents.models import Agent, Approval, Run, RunEvent
from agents.reconciler import runs_reconcile
from agents.services import run_cancel
from audit.models import AuditEvent
from mcpregistry.pool import get_default_pool
from tests.agents.test_cancel_end import approval_of
from tests.agents.test_cancel_stops_calls_s43 import QUESTION, cancel_while_the_first_attempt_is_out
from tests.agents.test_lifecycle import dispatched, fresh, held_by, status_events  # noqa: F401 - dispatched: a fixture
from tests.conftest import bind_demo_server, make_agent

pytestmark = pytest.mark.django_db


def reconcile_printed() -> dict[str, str]:
    out = io.StringIO()
    call_command("reconcile_runs", stdout=out)
    return dict(line.split(": ", 1) for line in out.getvalue().splitlines())


def outcome_unknown_audits(run: Run) -> list[tuple[str, str]]:
    rows = AuditEvent.objects.filter(run_id=run.pk, action="approval.outcome_unknown").order_by("id")
    return [(row.actor, str(row.result["why"])) for row in rows]  # type: ignore[index]


# --- 1. the report ------------------------------------------------------------------------------------------


@pytest.mark.usefixtures("dispatched")
def test_reconcile_runs_reports_the_approved_call_it_ended_as_it_queues_a_lost_run_again(demo_agent: Agent) -> None:
    run = Run.objects.create(agent=demo_agent, query="메모 남겨줘")
    held_by(run, "dead-host:42", lease_s=-1)
    approval = approval_of(run, Approval.Status.EXECUTING, "하나")

    printed = reconcile_printed()

    assert (printed["requeued"], printed["approvals_interrupted"], printed["approvals_ended"]) == ("1", "1", "0")
    assert fresh(run).status == Run.Status.QUEUED
    approval.refresh_from_db()
    assert approval.status == Approval.Status.OUTCOME_UNKNOWN
    assert outcome_unknown_audits(run) == [("reconciler", "worker_lost")]


@pytest.mark.usefixtures("dispatched")
def test_the_report_counts_the_approved_calls_of_runs_it_fails(demo_agent: Agent, settings: Any) -> None:
    settings.PLATFORM_RUN_MAX_DELIVERIES = 1
    lost = Run.objects.create(agent=demo_agent, query="메모 남겨줘")
    held_by(lost, "dead-host:42", lease_s=-1)
    approval_of(lost, Approval.Status.EXECUTING, "하나")
    overdue = Run.objects.create(agent=demo_agent, query="메모 두 개 남겨줘")
    held_by(overdue, "live-host:7", lease_s=60)
    _soft, hard = run_time_limits(demo_agent.time_limit_s)
    Run.objects.filter(pk=overdue.pk).update(pass_started_at=timezone.now() - timedelta(seconds=hard + 1))
    approval_of(overdue, Approval.Status.EXECUTING, "둘")
    approval_of(overdue, Approval.Status.EXECUTING, "셋")

    report = runs_reconcile()

    assert (report.timed_out, report.worker_lost, report.approvals_interrupted) == (1, 1, 3)
    assert (fresh(lost).error_code, fresh(overdue).error_code) == ("worker_lost", "time_limit")
    assert outcome_unknown_audits(lost) == [("reconciler", "worker_lost")]
    assert outcome_unknown_audits(overdue) == [("reconciler", "time_limit")] * 2


def cancelled_while_running(agent: Agent, *, worker_gone_s: float) -> Run:
    """A run cancelled while its worker held it, that worker's time up ``worker_gone_s`` ago (it died before
    recording the end)."""
    run = Run.objects.create(agent=agent, query="김하늘 님은 어느 팀 소속인가요?")
    held_by(run, "dead-host:42", lease_s=60)
    Run.objects.filter(pk=run.pk).update(pass_started_at=timezone.now())
    RunEvent.objects.create(run=run, seq=1, kind="status", data={"status": "running", "delivery": 1})
    run_cancel(run=fresh(run), actor="admin:alice")
    Run.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=worker_gone_s))
    return fresh(run)


def test_reconcile_runs_reports_the_cancelled_ends_it_recorded(demo_agent: Agent) -> None:
    run = cancelled_while_running(demo_agent, worker_gone_s=1)
    assert status_events(run)[-1]["status"] == "running"

    printed = reconcile_printed()

    assert printed["cancellations_recorded"] == "1"
    assert status_events(run)[-1]["status"] == "cancelled"
    assert reconcile_printed()["cancellations_recorded"] == "0"  # recorded once


def test_every_figure_of_the_report_is_printed_in_its_order(demo_agent: Agent) -> None:
    assert list(reconcile_printed()) == list(runs_reconcile().as_dict())
    assert list(runs_reconcile().as_dict())[-1] == "cancellations_recorded"


# --- 2. and 3. a cancelled run's end -------------------------------------------------------------------------


def call_event(seq: int, run: Run, **result: Any) -> RunEvent:
    data = {"source": "agent", "mcp_id": "demo", "tool": "t", "args": {}, "value": None, "error": None, **result}
    return RunEvent.objects.create(run=run, seq=seq, kind="tool_call", data=data)


def test_the_reconciler_records_a_cancelled_runs_failed_calls_with_its_end(demo_agent: Agent) -> None:
    run = cancelled_while_running(demo_agent, worker_gone_s=1)
    Run.objects.filter(pk=run.pk).update(tool_failures=2)  # counted by the passes before (stored with a park)
    call_event(2, run, ok=False, error="tool:timeout")
    call_event(3, run, ok=True, value={"status": "ok"}, fallback_for="get_asset_status")  # failed all the same
    call_event(4, run, ok=False, error="approval:pending")  # waits for a person: not failed
    call_event(5, run, ok=True, value={"status": "ok"})
    RunEvent.objects.create(run=run, seq=6, kind="deterministic_result", data={"ok": False, "error": "tool:error"})

    runs_reconcile()

    assert status_events(run)[-1]["status"] == "cancelled"
    run = fresh(run)
    assert (run.tool_failures, run.lease_expires_at) == (2 + 3, None)


def test_a_cancel_of_a_parked_run_counts_no_call_of_the_pass_that_parked_it_again(demo_agent: Agent) -> None:
    run = Run.objects.create(agent=demo_agent, query="메모 남겨줘", status=Run.Status.AWAITING_APPROVAL)
    RunEvent.objects.create(run=run, seq=1, kind="status", data={"status": "running", "delivery": 1})
    call_event(2, run, ok=False, error="tool:timeout")
    RunEvent.objects.create(run=run, seq=3, kind="status", data={"status": "awaiting_approval"})
    Run.objects.filter(pk=run.pk).update(tool_failures=1)  # stored with the park

    run_cancel(run=fresh(run), actor="admin:alice")

    assert fresh(run).tool_failures == 1


@pytest.fixture
def _close_timeout_server() -> Iterator[None]:
    yield
    get_default_pool().close("s45-timeout")


@pytest.mark.slow
@pytest.mark.usefixtures("_close_timeout_server")
def test_a_run_cancelled_while_its_call_is_out_counts_the_failed_call_and_holds_no_lease(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = bind_demo_server(mcp_id="s45-timeout", failure_mode="timeout")  # each attempt times out
    agent = make_agent(slug="s45-timeout", servers=[server])
    run = Run.objects.create(agent=agent, query=QUESTION)
    cancel_while_the_first_attempt_is_out(monkeypatch, run)

    run_execute(run_id=str(run.id))

    run = fresh(run)
    assert run.status == Run.Status.CANCELLED
    assert status_events(run)[-1]["status"] == "cancelled"  # its worker recorded the end
    calls = AuditEvent.objects.filter(run_id=run.id, action="tool.call", latency_ms__isnull=False)
    assert [call.ok for call in calls] == [False]
    assert (run.tool_failures, run.lease_expires_at) == (1, None)
