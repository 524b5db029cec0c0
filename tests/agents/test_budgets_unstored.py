"""A run that ends without its worker storing a result — cancelled while it runs, or failed by the reconciler
because its worker was lost — is charged for the model calls it made (their ``model_turn`` events carry their
tokens): its reservation is released and spend is never under-counted."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from agents.budgets import budget_create
from agents.dispatch import lifecycle_setting
from agents.execution import run_execute
from agents.models import BudgetUsage, Run, RunEvent
from agents.reconciler import runs_reconcile
from agents.run_state import RunEventWriter
from agents.services import run_cancel
from tests.agents.test_budgets import price_house_model, scripted_agent, submit

pytestmark = pytest.mark.django_db


@pytest.fixture
def budgeted(api_caller: Any) -> Any:
    price_house_model()
    scripted_agent(turns=3)  # two tool calls, then the answer
    budget_create(
        actor="test-admin",
        via="tests",
        data={"api_key": api_caller.key, "period": "day", "max_tokens": 10_000, "run_reservation_tokens": 500},
    )
    return api_caller


def interleave(monkeypatch: pytest.MonkeyPatch, kind: str, action: Any, *, before: bool = False) -> None:
    """Run ``action`` at the worker's first event of ``kind``: after it is written, or (``before``) just before —
    a model call that was under way while the action happened, its event written after."""
    original = RunEventWriter.emit
    fired: list[bool] = []

    def emit(self: RunEventWriter, event_kind: str, data: dict[str, Any]) -> None:
        if event_kind == kind and not fired:
            fired.append(True)
            if before:
                action()
                original(self, event_kind, data)
                return
            original(self, event_kind, data)
            action()
            return
        original(self, event_kind, data)

    monkeypatch.setattr(RunEventWriter, "emit", emit)


def turn_tokens(run: Run) -> list[int]:
    turns = RunEvent.objects.filter(run=run, kind="model_turn").order_by("seq").values_list("data", flat=True)
    return [t["usage"]["input_tokens"] + t["usage"]["output_tokens"] for t in turns]


def assert_charged(run: Run, tokens: int) -> None:
    run.refresh_from_db()
    assert tokens > 0
    assert run.tokens == tokens
    usage = BudgetUsage.objects.get()
    assert (usage.used_tokens, usage.reserved_tokens) == (tokens, 0)
    # At $3 / $15 per million input / output tokens the cost is at least the input's.
    assert usage.used_cost_micros == run.cost_micros >= tokens * 3


def test_a_run_cancelled_while_it_runs_is_charged_for_its_model_calls(api_client, budgeted, monkeypatch) -> None:
    run = Run.objects.get(pk=submit(api_client).json()["id"])
    interleave(monkeypatch, "model_turn", lambda: run_cancel(run=Run.objects.get(pk=run.pk), actor="test"))

    run_execute(run_id=str(run.id))

    run.refresh_from_db()
    assert run.status == Run.Status.CANCELLED
    [first_turn] = turn_tokens(run)  # it stopped before its second model call
    assert_charged(run, first_turn)
    assert run.token_usage["model_calls"] == 1


def test_a_model_call_under_way_when_the_run_was_cancelled_is_counted_by_its_worker(
    api_client, budgeted, monkeypatch
) -> None:
    run = Run.objects.get(pk=submit(api_client).json()["id"])
    # The cancellation settles the budget while the first model call is still out: nothing spent yet.
    interleave(monkeypatch, "model_turn", lambda: run_cancel(run=Run.objects.get(pk=run.pk), actor="test"), before=True)
    run_execute(run_id=str(run.id))

    [first_turn] = turn_tokens(run)
    assert_charged(run, first_turn)  # the worker added the call when it saw the cancellation
    run_execute(run_id=str(run.id))  # a later delivery counts nothing twice
    assert_charged(run, first_turn)


def test_a_run_failed_by_the_reconciler_after_its_worker_was_lost_is_charged(api_client, budgeted, monkeypatch) -> None:
    run = Run.objects.get(pk=submit(api_client).json()["id"])
    max_deliveries = int(lifecycle_setting("PLATFORM_RUN_MAX_DELIVERIES"))

    def worker_gone() -> None:
        # As the reconciler finds it: another claim that stopped renewing its lease, on its last delivery.
        Run.objects.filter(pk=run.pk).update(
            worker="dead-host:1", delivery_count=max_deliveries, lease_expires_at=timezone.now() - timedelta(seconds=1)
        )

    interleave(monkeypatch, "model_turn", worker_gone)
    run_execute(run_id=str(run.id))  # this worker stops at its next step: it no longer holds the run
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING and BudgetUsage.objects.get().reserved_tokens == 500

    report = runs_reconcile()

    assert report.worker_lost == 1
    run.refresh_from_db()
    assert (run.status, run.error_code) == (Run.Status.FAILED, "worker_lost")
    [first_turn] = turn_tokens(run)
    assert_charged(run, first_turn)


def test_a_finished_run_is_charged_what_it_stored_once(api_client, budgeted) -> None:
    run = Run.objects.get(pk=submit(api_client).json()["id"])
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED
    assert sum(turn_tokens(run)) == run.token_usage["input_tokens"] + run.token_usage["output_tokens"]
    assert_charged(run, sum(turn_tokens(run)))
