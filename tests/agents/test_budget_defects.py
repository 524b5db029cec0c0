"""Budget and usage defects, each pinned by a test that failed before its fix:

- a model call of a worker whose lease lapsed, still out when the worker that took the run over finished it, is
  counted by the late worker (its run's ``tokens``, ``/usage``, the budget);
- a failure outside the engine after its model calls (its outcome lost) keeps their tokens on a run without a
  budget;
- a run a budget admitted is charged at the price it was admitted at, so a price raised (or first set) while it
  runs cannot take the budget past its cost limit; a run without a budget is charged at the price when it ends;
- a reservation is priced at the dearest rate, a cache read's included;
- a run of an agent never published whose model an admin switched while the run was queued is charged (at least)
  at the price of the model it ran, not at the admission price of the model it no longer runs.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

import agents.engine as engine
from agents.budgets import (
    _reservation_cost_micros,
    budget_create,
    cost_micros,
    model_price_create,
    model_price_update,
)
from agents.execution import run_execute
from agents.models import Agent, BudgetReservation, BudgetUsage, ModelPrice, Run
from agents.services import agent_update
from tests.agents.test_budgets import price_house_model, scripted_agent, submit
from tests.agents.test_budgets_unstored import interleave, turn_tokens
from tests.conftest import ApiCaller

pytestmark = pytest.mark.django_db


def test_a_lost_workers_call_that_returns_after_the_new_worker_finished_is_counted(
    api_client, api_caller, monkeypatch
) -> None:
    price_house_model()
    scripted_agent(turns=3)
    budget_create(
        actor="t",
        via="tests",
        data={"api_key": api_caller.key, "period": "day", "max_tokens": 10_000, "run_reservation_tokens": 500},
    )
    run = Run.objects.get(pk=submit(api_client).json()["id"])

    def taken_over_and_finished() -> None:
        # This worker's first model call is still out: its lease lapses, another worker takes the run over and
        # finishes it before the call returns.
        Run.objects.filter(pk=run.pk).update(
            worker="other-host:2", lease_expires_at=timezone.now() - timedelta(seconds=1)
        )
        run_execute(run_id=str(run.id))

    interleave(monkeypatch, "model_turn", taken_over_and_finished, before=True)
    run_execute(run_id=str(run.id))

    run.refresh_from_db()
    assert (run.status, run.delivery_count) == (Run.Status.SUCCEEDED, 2)
    events = turn_tokens(run)
    assert len(events) == 4  # the new worker's three turns, then the lost worker's late one
    usage = BudgetUsage.objects.get()
    assert run.tokens == usage.used_tokens == sum(events)
    assert usage.reserved_tokens == 0
    assert run.cost_micros == usage.used_cost_micros
    assert api_client.get("/api/v1/usage").json()["today"]["tokens"] == sum(events)


def test_a_failure_outside_the_engine_after_its_model_calls_keeps_their_tokens_without_a_budget(
    api_client, monkeypatch
) -> None:
    price_house_model()
    scripted_agent(turns=2)
    run = Run.objects.get(pk=submit(api_client).json()["id"])

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the conversation could not be stored")

    monkeypatch.setattr(engine, "stored_conversation", broken)
    run_execute(run_id=str(run.id))

    run.refresh_from_db()
    assert (run.status, run.error_code) == (Run.Status.FAILED, "internal")
    events = turn_tokens(run)
    assert len(events) == 2 and run.tokens == sum(events) > 0
    assert run.cost_micros >= run.tokens * 3  # at $3 / $15 per million input / output tokens
    assert api_client.get("/api/v1/usage").json()["today"]["tokens"] == sum(events)


# A model first priced after its run was admitted under a cost limit is no case any more: unpriced, the run is refused
# (409 budget_misconfigured, tests/agents/test_budgets_s42.py).
@pytest.mark.parametrize("priced_at_admission", [True], ids=["price_raised"])
def test_a_run_a_budget_admitted_is_charged_at_the_price_it_was_admitted_at(
    api_client, api_caller, priced_at_admission
) -> None:
    if priced_at_admission:
        price_house_model()
    scripted_agent(turns=1)
    # Room for one reservation of 500 tokens at $15 per million: 7,500 µUSD.
    budget_create(
        actor="t",
        via="tests",
        data={
            "api_key": api_caller.key,
            "period": "day",
            "max_cost": Decimal("0.0075"),
            "run_reservation_tokens": 500,
        },
    )
    run = Run.objects.get(pk=submit(api_client).json()["id"])
    dear = {"input_per_mtok": Decimal("300"), "output_per_mtok": Decimal("1500")}
    if priced_at_admission:
        model_price_update(price=ModelPrice.objects.get(), actor="t", via="tests", data=dear)
    else:
        price_house_model()
        model_price_update(price=ModelPrice.objects.get(), actor="t", via="tests", data=dear)

    run_execute(run_id=str(run.id))

    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    usage = BudgetUsage.objects.get()
    assert usage.used_cost_micros <= 7_500
    at_admission = run.token_usage["input_tokens"] * 3 + run.token_usage["output_tokens"] * 15
    assert run.cost_micros == usage.used_cost_micros == (at_admission if priced_at_admission else 0)


def test_a_run_without_a_budget_is_charged_at_the_price_when_it_finishes(api_client) -> None:
    price_house_model()
    scripted_agent(turns=1)
    run = Run.objects.get(pk=submit(api_client).json()["id"])
    model_price_update(
        price=ModelPrice.objects.get(), actor="t", via="tests", data={"input_per_mtok": 300, "output_per_mtok": 1500}
    )
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert run.cost_micros == run.token_usage["input_tokens"] * 300 + run.token_usage["output_tokens"] * 1500


def test_a_reservation_kept_without_its_price_is_charged_at_the_price_when_the_run_finishes(
    api_client, api_caller
) -> None:
    price_house_model()
    scripted_agent(turns=1)
    budget_create(
        actor="t",
        via="tests",
        data={"api_key": api_caller.key, "period": "day", "max_tokens": 10_000, "run_reservation_tokens": 500},
    )
    run = Run.objects.get(pk=submit(api_client).json()["id"])
    BudgetReservation.objects.filter(run=run).update(input_per_mtok=None, output_per_mtok=None)  # taken before 0029
    model_price_update(
        price=ModelPrice.objects.get(), actor="t", via="tests", data={"input_per_mtok": 30, "output_per_mtok": 150}
    )
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert run.cost_micros == run.token_usage["input_tokens"] * 30 + run.token_usage["output_tokens"] * 150


def test_a_reservation_is_priced_at_the_dearest_rate_a_cache_read_included() -> None:
    price = ModelPrice(
        provider="scripted",
        model_id="",
        input_per_mtok=Decimal("3"),
        output_per_mtok=Decimal("15"),
        cache_read_per_mtok=Decimal("30"),
    )
    all_read = {"input_tokens": 1000, "output_tokens": 0, "cache_read_tokens": 1000}
    assert cost_micros(price=price, token_usage=all_read) == 30_000
    assert _reservation_cost_micros(price=price, tokens=1000) == 30_000


def price_big_model() -> None:
    model_price_create(
        actor="t",
        via="tests",
        data={"provider": "scripted", "model_id": "big-model", "input_per_mtok": 30, "output_per_mtok": 150},
    )


@pytest.mark.parametrize("budgeted", [True, False], ids=["budgeted", "unbudgeted"])
def test_a_run_whose_agent_switched_to_a_dearer_model_while_it_was_queued_is_charged_at_that_model(
    api_client: APIClient, api_caller: ApiCaller, budgeted: bool
) -> None:
    price_house_model()
    price_big_model()
    agent = scripted_agent(turns=1)
    if budgeted:
        budget_create(actor="t", via="tests", data={"api_key": api_caller.key, "period": "day", "max_cost": 100})
    submit(api_client)
    run = Run.objects.get()
    # Never published: the run executes the model its agent names when it is claimed.
    agent_update(agent=Agent.objects.get(pk=agent.pk), actor="t", via="tests", data={"model_id": "big-model"})

    run_execute(run_id=str(run.id))

    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    at_big_model = run.token_usage["input_tokens"] * 30 + run.token_usage["output_tokens"] * 150
    assert run.cost_micros == at_big_model
    if budgeted:
        usage = BudgetUsage.objects.get()
        assert (usage.used_cost_micros, usage.reserved_cost_micros) == (at_big_model, 0)


def test_a_run_whose_agent_switched_to_a_cheaper_model_is_charged_at_its_admission_price(
    api_client: APIClient, api_caller: ApiCaller
) -> None:
    price_house_model()
    price_big_model()
    agent = scripted_agent(turns=1)
    agent_update(agent=Agent.objects.get(pk=agent.pk), actor="t", via="tests", data={"model_id": "big-model"})
    budget_create(actor="t", via="tests", data={"api_key": api_caller.key, "period": "day", "max_cost": 100})
    submit(api_client)
    run = Run.objects.get()
    assert BudgetReservation.objects.values_list("provider", "model_id").get() == ("scripted", "big-model")
    agent_update(agent=Agent.objects.get(pk=agent.pk), actor="t", via="tests", data={"model_id": "house-model"})

    run_execute(run_id=str(run.id))

    run.refresh_from_db()
    at_admission = run.token_usage["input_tokens"] * 30 + run.token_usage["output_tokens"] * 150
    assert run.cost_micros == BudgetUsage.objects.get().used_cost_micros == at_admission
