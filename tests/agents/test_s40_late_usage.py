"""A model call still out when its worker loses the run is charged when it returns, however long after: its
``model_turn`` event (its usage alone) is appended, marked ``late``, and counted to the run's tokens and its budget,
once; nothing else of that worker (its tool calls, its outcome) is appended."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

import agents.execution as execution
from agents.admin_runs import run_timeline
from agents.budgets import budget_create, budget_settle
from agents.execution import run_execute
from agents.models import BudgetUsage, Run, RunEvent
from agents.run_state import run_fail_unheld
from tests.agents.test_budgets import price_house_model, scripted_agent, submit
from tests.agents.test_budgets_unstored import interleave, turn_tokens

pytestmark = pytest.mark.django_db


@pytest.fixture
def budgeted(api_caller) -> None:
    price_house_model()
    scripted_agent(turns=3)
    budget_create(
        actor="t",
        via="tests",
        data={"api_key": api_caller.key, "period": "day", "max_tokens": 10_000, "run_reservation_tokens": 500},
    )


def paused_past_its_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lost worker's clock moves on by an hour: it was silent longer than its lease (that is why it lapsed), so
    its claim is no longer taken as held without reading the run."""
    real = execution.clock
    monkeypatch.setattr(execution, "clock", lambda: real() + 3600)


def assert_charged_once(run: Run, events: list[int]) -> None:
    run.refresh_from_db()
    usage = BudgetUsage.objects.get()
    assert run.tokens == usage.used_tokens == sum(events) > 0
    assert usage.reserved_tokens == 0
    assert run.cost_micros == usage.used_cost_micros >= sum(events) * 3
    # Settling again (a retried task, another late call's count) adds nothing.
    budget_settle(run_id=run.pk)
    assert BudgetUsage.objects.get().used_tokens == sum(events)
    run.refresh_from_db()
    assert run.tokens == sum(events)


def test_a_call_returning_after_the_lease_lapsed_and_the_new_worker_finished_is_charged(
    api_client, budgeted, monkeypatch
) -> None:
    run = Run.objects.get(pk=submit(api_client).json()["id"])

    def taken_over_and_finished() -> None:
        Run.objects.filter(pk=run.pk).update(
            worker="other-host:2", lease_expires_at=timezone.now() - timedelta(seconds=1)
        )
        run_execute(run_id=str(run.id))
        paused_past_its_lease(monkeypatch)

    interleave(monkeypatch, "model_turn", taken_over_and_finished, before=True)
    run_execute(run_id=str(run.id))

    run.refresh_from_db()
    assert (run.status, run.delivery_count) == (Run.Status.SUCCEEDED, 2)
    events = turn_tokens(run)
    assert len(events) == 4  # the new worker's three turns, then the lost worker's late one
    turns = list(RunEvent.objects.filter(run=run, kind="model_turn").order_by("seq").values_list("data", flat=True))
    assert [bool(turn.get("late")) for turn in turns] == [False, False, False, True]
    # What it cost alone: its text and the call it asked for were never used, and the run's page does not show it
    # as a turn after the answer.
    assert set(turns[-1]) == {"usage", "late"}
    steps = [step.label for step in run_timeline(run)]
    assert [label for label in steps if label.startswith("model turn")] == [
        "model turn 1",
        "model turn 2",
        "model turn 3",
    ]
    assert steps[-1] == "answer", steps
    # Its tool call (the turn asked for one) is not appended: only the new worker's two.
    assert RunEvent.objects.filter(run=run, kind="tool_call").count() == 2
    assert_charged_once(run, events)


def test_a_call_returning_after_the_run_failed_without_its_worker_is_charged(api_client, budgeted, monkeypatch) -> None:
    run = Run.objects.get(pk=submit(api_client).json()["id"])

    def failed_by_the_reconciler() -> None:
        held = Run.objects.get(pk=run.pk)
        match = {"status": Run.Status.RUNNING, "worker": held.worker, "delivery_count": held.delivery_count}
        run_fail_unheld(run_id=run.pk, match=match, error_code="time_limit", error_message="t")
        paused_past_its_lease(monkeypatch)

    interleave(monkeypatch, "model_turn", failed_by_the_reconciler, before=True)
    run_execute(run_id=str(run.id))

    run.refresh_from_db()
    assert (run.status, run.error_code) == (Run.Status.FAILED, "time_limit")
    events = turn_tokens(run)
    assert len(events) == 1
    assert not RunEvent.objects.filter(run=run, kind="tool_call").exists()
    # The run's end is the reconciler's: the lost worker stored no outcome of its own.
    assert [e["status"] for e in RunEvent.objects.filter(run=run, kind="status").values_list("data", flat=True)][
        -1
    ] == "failed"
    assert_charged_once(run, events)
