"""The reconciler's batches get past the rows it cannot repair (s47, h7, suspicion 1: head-of-line blocking).

Each step that reads a batch (``PLATFORM_RECONCILE_BATCH``) read it oldest first. A batch's worth of rows it could not
repair at the head (a repair that raised, or a run left for later) was every pass's batch, and every newer row waited
for good: approvals of finished runs left ``executing``/``pending``, lost runs left ``running``, cancelled runs left
without their end. A pass now reads the rows it passed over after the others, and tries them again where a batch has
room.

The unreadable row is real where the platform can hold one (an approval whose stored arguments cannot be loaded, as
``tests/agents/test_poisoned_runs.py`` writes it); where no row can be made unreadable, a fault is raised where the
repair of one run meets it (the repair itself is the real one for every other run).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from agents import reconciler, run_state
from agents.budgets import budget_create, budget_reserve
from agents.models import Agent, Approval, BudgetReservation, Run
from agents.reconciler import runs_reconcile
from tests.agents.test_poisoned_runs import approval_of, fresh, held_by, status_events, store_corrupt, submit
from tests.conftest import make_agent

pytestmark = pytest.mark.django_db

PASSES = 4


def reconciled(passes: int = PASSES) -> None:
    for _ in range(passes):
        runs_reconcile()


def finished(run: Run, *, status: str = Run.Status.FAILED, ago: timedelta) -> Run:
    Run.objects.filter(pk=run.pk).update(status=status, finished_at=timezone.now() - ago)
    return fresh(run)


def approval_status(approval: Approval) -> str:
    return Approval.objects.filter(pk=approval.pk).values_list("status", flat=True).get()


def raising_for(monkeypatch: pytest.MonkeyPatch, module: Any, name: str, run: Run) -> None:
    """``module.name`` raises for ``run`` (a fault its repair meets), and does what it does for every other run."""
    real: Callable[..., Any] = getattr(module, name)

    def faulty(*args: Any, **kwargs: Any) -> Any:
        run_id = kwargs.get("run_id", args[0] if args else None)
        if str(run_id) == str(run.pk):
            raise RuntimeError("a row this process cannot read")
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, faulty)


@pytest.fixture
def _dispatched(monkeypatch: pytest.MonkeyPatch) -> None:
    from agents.tasks import run_agent

    monkeypatch.setattr(run_agent, "apply_async", lambda *args, **kwargs: None)


# --- step 6: approvals of finished runs ------------------------------------------------------------------------


def test_finished_runs_whose_approvals_cannot_be_read_do_not_keep_a_newer_runs_approval_claimed(
    demo_agent: Agent, settings: Any
) -> None:
    settings.PLATFORM_RECONCILE_BATCH = 2
    unreadable = []
    for _ in range(2):  # a batch of them, finished first
        run = finished(submit(demo_agent), ago=timedelta(days=2))
        claimed = approval_of(run, status=Approval.Status.EXECUTING)
        store_corrupt(Approval, "exact_args", claimed.pk)
        unreadable.append(claimed)
    newer = finished(submit(demo_agent), status=Run.Status.CANCELLED, ago=timedelta(days=1))
    left_claimed = approval_of(newer, status=Approval.Status.EXECUTING)

    reconciled()

    assert approval_status(left_claimed) == Approval.Status.OUTCOME_UNKNOWN
    # Those it cannot read are left as they are (and tried again), as before.
    assert [approval_status(a) for a in unreadable] == [Approval.Status.EXECUTING] * 2


def test_runs_finished_within_a_long_time_limit_do_not_hold_back_the_approvals_of_runs_already_due(
    demo_server: Any, demo_agent: Agent, settings: Any
) -> None:
    settings.PLATFORM_RECONCILE_BATCH = 1
    slow = make_agent(slug="slow-agent", servers=[demo_server])
    Agent.objects.filter(pk=slow.pk).update(time_limit_s=1800)
    # Finished first, its worker may be finishing a call for half an hour yet: left for later.
    long_run = finished(submit(slow), status=Run.Status.CANCELLED, ago=timedelta(minutes=10))
    waiting = approval_of(long_run, status=Approval.Status.PENDING)
    # Finished after it, of an agent whose time limit (300 s and the grace) has passed since.
    due_run = finished(submit(demo_agent), status=Run.Status.CANCELLED, ago=timedelta(minutes=8))
    unused = approval_of(due_run, status=Approval.Status.PENDING)

    reconciled()

    assert approval_status(unused) == Approval.Status.EXPIRED
    assert approval_status(waiting) == Approval.Status.PENDING


# --- step 2: runs of lost workers ------------------------------------------------------------------------------


@pytest.mark.usefixtures("_dispatched")
def test_a_lost_run_that_can_be_neither_queued_again_nor_failed_does_not_keep_the_next_one_running(
    demo_agent: Agent, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.PLATFORM_RECONCILE_BATCH = 1
    stuck = submit(demo_agent)
    held_by(stuck, "dead-host:1", lease_s=-60)  # lost first
    claimed = approval_of(stuck, status=Approval.Status.EXECUTING)
    store_corrupt(Approval, "exact_args", claimed.pk)  # queueing it again, or failing it whole, reads it
    raising_for(monkeypatch, run_state, "budget_settle", stuck)  # and failing it bare meets a fault too
    other = submit(demo_agent)
    held_by(other, "dead-host:2", lease_s=-1)

    reconciled()

    assert fresh(other).status == Run.Status.QUEUED
    assert fresh(stuck).status == Run.Status.RUNNING  # still tried again every pass it has room for


# --- step 5: parked runs with nothing to wait for --------------------------------------------------------------


@pytest.mark.usefixtures("_dispatched")
def test_a_parked_run_that_cannot_be_resumed_does_not_keep_the_others_parked(
    demo_agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    stuck, other = submit(demo_agent), submit(demo_agent)  # the first one created first
    for run in (stuck, other):
        Run.objects.filter(pk=run.pk).update(status=Run.Status.AWAITING_APPROVAL)
        approval_of(run, status=Approval.Status.APPROVED)  # decided where no transaction resumed it
    raising_for(monkeypatch, reconciler, "run_resume", stuck)

    reconciled()

    assert fresh(other).status == Run.Status.QUEUED
    assert fresh(stuck).status == Run.Status.AWAITING_APPROVAL


# --- step 7: runs cancelled while they ran ---------------------------------------------------------------------


def cancelled_while_running(agent: Agent, *, worker_gone_s: float) -> Run:
    run = submit(agent)
    Run.objects.filter(pk=run.pk).update(
        status=Run.Status.CANCELLED,
        worker="dead-host:1",
        finished_at=timezone.now(),
        lease_expires_at=timezone.now() - timedelta(seconds=worker_gone_s),
    )
    return fresh(run)


def test_a_cancelled_run_whose_end_cannot_be_recorded_does_not_keep_the_others_without_theirs(
    demo_agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    stuck = cancelled_while_running(demo_agent, worker_gone_s=60)  # its worker's time was up first
    other = cancelled_while_running(demo_agent, worker_gone_s=1)
    raising_for(monkeypatch, reconciler, "cancellation_recorded", stuck)

    reconciled()

    assert status_events(other)[-1]["status"] == "cancelled"
    assert fresh(other).lease_expires_at is None
    assert status_events(stuck) == []
    assert fresh(stuck).lease_expires_at is not None  # rolled back with the rest: tried again


# --- step 8: reservations of finished runs ---------------------------------------------------------------------


def test_a_finished_runs_reservation_that_cannot_be_settled_does_not_keep_the_next_ones_open(
    demo_agent: Agent, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.PLATFORM_RECONCILE_BATCH = 1
    budget = budget_create(
        actor="test-admin",
        via="tests",
        data={"agent": demo_agent, "period": "day", "max_tokens": 1000, "run_reservation_tokens": 100},
    )
    runs = sorted((submit(demo_agent) for _ in range(2)), key=lambda run: run.pk)  # read in the order of their ids
    for run in runs:
        budget_reserve(run=run, agent=demo_agent, api_key=None, budgets=[budget])
        finished(run, ago=timedelta(minutes=1))  # finished with its reservation open
    stuck, other = runs
    raising_for(monkeypatch, reconciler, "budget_settle", stuck)

    reconciled()

    assert BudgetReservation.objects.get(run=other).settled_at is not None
    assert BudgetReservation.objects.get(run=stuck).settled_at is None
