"""Review s42 of budgets: a budget's counters opened by its creation or a change of its period count the period's
spend so far (and no run twice); a cost limit on a model without a price is refused, never void; a refusal
for too little room left says so, not "used up"; the dashboard's days and month are labelled UTC."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from agents.budgets import (
    REFUSED_LESS_THAN_A_RUN,
    REFUSED_USED_UP,
    budget_create,
    budget_update,
    period_bounds,
)
from agents.models import Agent, Budget, BudgetReservation, BudgetUsage, Run
from tests.agents.test_budgets import finish, price_house_model, scripted_agent, submit
from tests.conftest import ApiCaller

pytestmark = pytest.mark.django_db


def run_until_refused(client: APIClient) -> tuple[int, Any]:
    """Submit and finish runs until one is refused: how many were admitted, and the refusal."""
    admitted = 0
    while (response := submit(client)).status_code == 202:
        run = finish(response.json()["id"])
        assert run.tokens > 0, run.error_message  # its second call may be stopped at its reservation: it spent
        admitted += 1
        assert admitted < 10, "never refused"
    return admitted, response


def spent_since(start: dt.datetime) -> int:
    return sum(Run.objects.filter(created_at__gte=start).values_list("tokens", flat=True))


def period_row(budget: Budget) -> BudgetUsage:
    start, _end = period_bounds(Budget.objects.get(pk=budget.pk).period, timezone.now())
    return BudgetUsage.objects.get(budget=budget, period_start=start)


# --- 1. counters opened by a budget's creation or a change of its period --------------------------------------


@pytest.mark.parametrize(("before", "after"), [("day", "month"), ("month", "day")])
def test_a_change_of_period_keeps_what_the_new_period_spent_so_far(
    api_client: APIClient, api_caller: ApiCaller, before: str, after: str
) -> None:
    scripted_agent(turns=2, output_tokens=1500)  # about 1,526 tokens a run
    budget = budget_create(
        actor="t",
        via="tests",
        data={"api_key": api_caller.key, "period": before, "max_tokens": 5000, "run_reservation_tokens": 2000},
    )
    admitted, refused = run_until_refused(api_client)
    assert admitted == 2 and refused.status_code == 429

    budget_update(budget=Budget.objects.get(pk=budget.pk), actor="t", via="tests", data={"period": after})

    refused = submit(api_client)
    assert refused.status_code == 429, "the new period's counters forgot its spend"
    assert Run.objects.count() == 2
    start, _end = period_bounds(after, timezone.now())
    assert period_row(budget).used_tokens == spent_since(start) > 3000
    usage = api_client.get("/api/v1/usage").json()
    shown = "this_month" if after == "month" else "today"
    assert [b["used_tokens"] for b in usage["budgets"]] == [usage[shown]["tokens"]]


def test_a_budget_created_mid_period_counts_the_periods_runs(api_client: APIClient, api_caller: ApiCaller) -> None:
    scripted_agent(turns=2, output_tokens=1500)
    for _ in range(2):
        assert finish(submit(api_client).json()["id"]).status == Run.Status.SUCCEEDED
    budget = budget_create(
        actor="t",
        via="tests",
        data={"api_key": api_caller.key, "period": "month", "max_tokens": 5000, "run_reservation_tokens": 2000},
    )
    month_start, _end = period_bounds("month", timezone.now())
    assert period_row(budget).used_tokens == spent_since(month_start) > 3000
    assert submit(api_client).status_code == 429


def test_a_budget_created_before_any_run_of_its_period_opens_no_counters(api_caller: ApiCaller) -> None:
    scripted_agent()
    budget_create(
        actor="t",
        via="tests",
        data={"api_key": api_caller.key, "period": "day", "max_tokens": 5000, "run_reservation_tokens": 2000},
    )
    assert not BudgetUsage.objects.exists()  # the first admission opens them, as before


def test_changing_the_period_back_and_forth_counts_no_run_twice(api_client: APIClient, api_caller: ApiCaller) -> None:
    scripted_agent()
    budget = budget_create(
        actor="t",
        via="tests",
        data={"api_key": api_caller.key, "period": "day", "max_tokens": 100_000, "run_reservation_tokens": 500},
    )
    finish(submit(api_client).json()["id"])
    in_flight = submit(api_client).json()["id"]  # its reservation is carried along, settled once
    for period in ("month", "day", "month", "day"):
        budget_update(budget=Budget.objects.get(pk=budget.pk), actor="t", via="tests", data={"period": period})
        finish(submit(api_client).json()["id"])
    finish(in_flight)
    day_start, _end = period_bounds("day", timezone.now())
    row = period_row(budget)
    assert (row.used_tokens, row.reserved_tokens) == (spent_since(day_start), 0)
    assert Run.objects.count() == 6
    usage = api_client.get("/api/v1/usage").json()
    assert usage["budgets"][0]["used_tokens"] == usage["today"]["tokens"]


def test_switching_a_budget_on_counts_what_was_spent_while_it_was_off(
    api_client: APIClient, api_caller: ApiCaller
) -> None:
    scripted_agent(turns=2, output_tokens=1500)
    budget = budget_create(
        actor="t",
        via="tests",
        data={
            "api_key": api_caller.key,
            "period": "day",
            "max_tokens": 5000,
            "run_reservation_tokens": 2000,
            "enabled": False,
        },
    )
    for _ in range(2):
        finish(submit(api_client).json()["id"])
    budget_update(budget=Budget.objects.get(pk=budget.pk), actor="t", via="tests", data={"enabled": True})
    assert submit(api_client).status_code == 429


# --- 2. a cost limit on a model without a price -----------------------------------------------------------------


def test_an_agents_cost_limit_on_a_model_without_a_price_is_refused_in_the_form_naming_the_model(
    admin_client: Any,
) -> None:
    agent = scripted_agent()
    form = {"agent": agent.pk, "period": "day", "max_cost": "0.0001", "run_reservation_tokens": "5", "enabled": "on"}
    page = admin_client.post("/admin/agents/budget/add/", form, HTTP_ACCEPT_LANGUAGE="en")
    assert page.status_code == 200 and not Budget.objects.exists()
    text = str(page.context["adminform"].form.errors["max_cost"])
    assert "house-model" in text and "no price" in text
    price_house_model()  # 5 tokens at $15 per 1M: US$0.000075, within the limit
    assert admin_client.post("/admin/agents/budget/add/", form).status_code == 302
    assert Budget.objects.get().max_cost == Decimal("0.0001")


def test_a_run_under_a_cost_limit_whose_model_has_no_price_is_refused_naming_the_model(
    api_client: APIClient, api_caller: ApiCaller
) -> None:
    scripted_agent()
    budget = budget_create(
        actor="t",
        via="tests",
        data={"api_key": api_caller.key, "period": "day", "max_cost": Decimal("0.0001"), "run_reservation_tokens": 5},
    )
    refused = submit(api_client)
    error = refused.json()["error"]
    assert (refused.status_code, error["code"], error["fields"]) == (409, "budget_misconfigured", {"budget": budget.pk})
    assert "house-model" in error["message"] and "no price" in error["message"]
    assert not Run.objects.exists()
    price_house_model()
    assert submit(api_client).status_code == 202


def test_a_token_limit_alone_admits_a_model_without_a_price(api_client: APIClient, api_caller: ApiCaller) -> None:
    scripted_agent()
    budget_create(
        actor="t",
        via="tests",
        data={"api_key": api_caller.key, "period": "day", "max_tokens": 1000, "run_reservation_tokens": 5},
    )
    assert submit(api_client).status_code == 202


# --- 3. too little left for one run's reservation -----------------------------------------------------------------


def test_too_little_left_for_one_reservation_is_told_as_such_not_as_used_up(
    api_client: APIClient, api_caller: ApiCaller
) -> None:
    scripted_agent()
    budget = budget_create(
        actor="t",
        via="tests",
        data={"api_key": api_caller.key, "period": "month", "max_tokens": 1000, "run_reservation_tokens": 1000},
    )
    run = finish(submit(api_client).json()["id"])
    refused = submit(api_client)
    error = refused.json()["error"]
    assert (refused.status_code, error["code"], error["fields"]["reason"]) == (
        429,
        "budget_exceeded",
        REFUSED_LESS_THAN_A_RUN,
    )
    assert f"{1000 - run.tokens:,} tokens left" in error["message"] and "1,000 tokens" in error["message"]
    assert "used up" not in error["message"]
    resets_at = dt.datetime.fromisoformat(error["fields"]["resets_at"])
    assert int(refused["Retry-After"]) >= (resets_at - timezone.now()).total_seconds()  # still the period's end

    BudgetUsage.objects.filter(budget=budget).update(used_tokens=1000)
    refused = submit(api_client)
    error = refused.json()["error"]
    assert (error["fields"]["reason"], "used up" in error["message"]) == (REFUSED_USED_UP, True)


def test_too_little_cost_left_for_one_reservation_names_the_dollars(
    api_client: APIClient, api_caller: ApiCaller
) -> None:
    price_house_model()  # 500 tokens at $15 per 1M reserve US$0.0075
    scripted_agent()
    budget = budget_create(
        actor="t",
        via="tests",
        data={"api_key": api_caller.key, "period": "day", "max_cost": Decimal("0.01"), "run_reservation_tokens": 500},
    )
    BudgetUsage.objects.create(
        budget=budget, period_start=period_bounds("day", timezone.now())[0], used_cost_micros=4_000
    )
    error = submit(api_client).json()["error"]
    assert error["fields"]["reason"] == REFUSED_LESS_THAN_A_RUN
    assert "US$0.006 left" in error["message"] and "US$0.0075" in error["message"], error["message"]


# --- 4. the dashboard's days and month are UTC ones ---------------------------------------------------------------


def test_the_dashboards_days_and_month_are_labelled_utc(admin_client: Any) -> None:
    agent = Agent.objects.create(slug="spender", name="spender")
    Run.objects.create(agent=agent, query="q", status=Run.Status.SUCCEEDED, tokens=1234, cost_micros=2_500_000)
    page = admin_client.get("/admin/", HTTP_ACCEPT_LANGUAGE="en").content.decode()
    panel = page[page.index('id="dashboard-usage"') :]
    for label in (
        "tokens this month (UTC)",
        "tokens per day (UTC)",
        "cost per day (USD, UTC)",
        "Agents this month (UTC)",
    ):
        assert label in panel, label


def test_a_cost_limit_on_the_offline_model_which_calls_no_service_is_accepted_and_admits_runs(
    admin_client: Any, api_client: APIClient, api_caller: ApiCaller, demo_agent: Agent
) -> None:
    """The offline model has no price and needs none: it costs nothing (only a paid model's missing price is void)."""
    assert demo_agent.model_provider == Agent.Provider.OFFLINE
    form = {
        "agent": demo_agent.pk,
        "period": "day",
        "max_cost": "0.0001",
        "run_reservation_tokens": "5",
        "enabled": "on",
    }
    assert admin_client.post("/admin/agents/budget/add/", form).status_code == 302
    budget_create(
        actor="t",
        via="tests",
        data={"api_key": api_caller.key, "period": "day", "max_cost": Decimal("0.0001"), "run_reservation_tokens": 5},
    )
    response = api_client.post("/api/v1/runs", {"agent": demo_agent.slug, "query": "김하늘 팀"}, format="json")
    assert response.status_code == 202, response.json()


# --- 5. runs in flight when a budget is opened ----------------------------------------------------------------------


def reservations_per_run(budget: Budget) -> dict[Any, int]:
    rows = BudgetReservation.objects.filter(usage__budget=budget).values_list("run_id", flat=True)
    return {run_id: list(rows).count(run_id) for run_id in set(rows)}


def test_runs_in_flight_when_a_budget_is_created_are_counted_on_it(
    api_client: APIClient, api_caller: ApiCaller
) -> None:
    scripted_agent(turns=2, output_tokens=1500)  # about 1,526 tokens a run
    in_flight = [submit(api_client).json()["id"] for _ in range(2)]  # admitted with no budget
    budget = budget_create(
        actor="t",
        via="tests",
        data={"api_key": api_caller.key, "period": "day", "max_tokens": 5000, "run_reservation_tokens": 2000},
    )
    row = period_row(budget)
    assert (row.used_tokens, row.reserved_tokens) == (0, 4000)
    assert submit(api_client).status_code == 429  # their reservations hold the room
    for run_id in in_flight:
        assert finish(run_id).tokens > 1000

    admitted, refused = run_until_refused(api_client)
    day_start, _end = period_bounds("day", timezone.now())
    assert (admitted, refused.status_code) == (0, 429)
    assert spent_since(day_start) <= 5000
    row = period_row(budget)
    assert (row.used_tokens, row.reserved_tokens) == (spent_since(day_start), 0)
    usage = api_client.get("/api/v1/usage").json()
    assert [b["used_tokens"] for b in usage["budgets"]] == [usage["today"]["tokens"]]


def test_a_run_in_flight_when_a_budget_is_switched_on_is_counted_on_it(
    api_client: APIClient, api_caller: ApiCaller
) -> None:
    price_house_model()  # 2,000 tokens at $15 per 1M reserve US$0.03
    scripted_agent(turns=2, output_tokens=1500)
    budget = budget_create(
        actor="t",
        via="tests",
        data={
            "api_key": api_caller.key,
            "period": "day",
            "max_tokens": 5000,
            "run_reservation_tokens": 2000,
            "enabled": False,
        },
    )
    in_flight = submit(api_client).json()["id"]
    budget_update(budget=Budget.objects.get(pk=budget.pk), actor="t", via="tests", data={"enabled": True})
    reservation = BudgetReservation.objects.get(usage__budget=budget)
    assert (str(reservation.run_id), reservation.tokens, reservation.cost_micros) == (in_flight, 2000, 30_000)
    row = period_row(budget)
    assert (row.reserved_tokens, row.reserved_cost_micros) == (2000, 30_000)

    run = finish(in_flight)
    row = period_row(budget)
    assert run.tokens > 1000
    assert (row.used_tokens, row.used_cost_micros, row.reserved_tokens, row.reserved_cost_micros) == (
        run.tokens,
        run.cost_micros,
        0,
        0,
    )
    usage = api_client.get("/api/v1/usage").json()
    assert [b["used_tokens"] for b in usage["budgets"]] == [usage["today"]["tokens"]] == [run.tokens]


def test_a_change_of_period_gives_no_run_in_flight_a_second_reservation(
    api_client: APIClient, api_caller: ApiCaller
) -> None:
    scripted_agent()
    budget = budget_create(
        actor="t",
        via="tests",
        data={
            "api_key": api_caller.key,
            "period": "day",
            "max_tokens": 100_000,
            "run_reservation_tokens": 500,
            "enabled": False,
        },
    )
    unreserved = submit(api_client).json()["id"]  # admitted while the budget was off
    budget_update(budget=Budget.objects.get(pk=budget.pk), actor="t", via="tests", data={"enabled": True})
    reserved = submit(api_client).json()["id"]  # admitted by the budget
    for period in ("month", "day"):
        budget_update(budget=Budget.objects.get(pk=budget.pk), actor="t", via="tests", data={"period": period})
        counts = reservations_per_run(budget)
        assert {str(run_id): n for run_id, n in counts.items()} == {unreserved: 1, reserved: 1}
        assert period_row(budget).reserved_tokens == 1000

    tokens = [finish(run_id).tokens for run_id in (unreserved, reserved)]
    row = period_row(budget)
    assert (row.used_tokens, row.reserved_tokens) == (sum(tokens), 0)
    usage = api_client.get("/api/v1/usage").json()
    assert usage["budgets"][0]["used_tokens"] == usage["today"]["tokens"]


def test_a_run_already_running_when_a_budget_opens_is_settled_by_the_reconciler_once_it_has_finished(
    api_client: APIClient, api_caller: ApiCaller
) -> None:
    """Its pass was claimed without a reservation, so it does not settle: the reservation the budget gave it is
    settled at the reconciler's next pass (it held the room for good)."""
    from agents.reconciler import runs_reconcile

    scripted_agent()
    run_id = submit(api_client).json()["id"]
    Run.objects.filter(pk=run_id).update(status=Run.Status.RUNNING, started_at=timezone.now())  # its worker's claim
    budget = budget_create(
        actor="t",
        via="tests",
        data={"api_key": api_caller.key, "period": "day", "max_tokens": 5000, "run_reservation_tokens": 2000},
    )
    assert period_row(budget).reserved_tokens == 2000
    Run.objects.filter(pk=run_id).update(status=Run.Status.SUCCEEDED, tokens=1234, finished_at=timezone.now())

    runs_reconcile()  # its next pass: the room is not held for minutes after the run ended
    row = period_row(budget)
    assert (row.used_tokens, row.reserved_tokens) == (1234, 0)
    assert BudgetReservation.objects.get(run_id=run_id).settled_at is not None
    runs_reconcile()  # once
    assert period_row(budget).used_tokens == 1234
