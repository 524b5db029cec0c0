"""Budget defects a review confirmed, each pinned by a test that failed before its fix:

- a budget's period changed while runs are in flight: their reservations move to the new period's counters, so
  new runs are not admitted beside them past the limit and their spend is counted in the period now limited (a
  settlement that read its reservation before the move settles on the row it was moved to);
- a refusal because runs in flight hold what is left of a budget says so, with a short ``Retry-After`` and
  ``fields.reason`` ``runs_in_flight``; a spent budget stays ``used_up`` until its period ends;
- a cost limit below what one run's reservation costs is refused in the form for an agent's budget (at the price of
  the model its live version runs, where the budget is new, switched on, or its figures change: switching it off
  after a price rise saves), and at the submission (409, saying the reservation alone exceeds it) for an API key's;
- a run cancelled during its second model call, or in the second pass of a resumed run, shows in its
  ``token_usage`` every call its tokens and cost count.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from agent_platform.celery import app as celery_app
from agents.budgets import (
    IN_FLIGHT_RETRY_AFTER_S,
    budget_create,
    budget_settle,
    budget_update,
    model_price_create,
    model_price_update,
)
from agents.execution import run_execute
from agents.models import Agent, Budget, BudgetReservation, BudgetUsage, ModelPrice, Run, RunEvent
from agents.run_state import RunEventWriter
from agents.services import agent_update, agent_version_publish, run_cancel
from tests.agents.test_approvals import decide, notes, park, writer  # noqa: F401 - fixtures
from tests.agents.test_budgets import price_house_model, scripted_agent, submit
from tests.conftest import ApiCaller

pytestmark = pytest.mark.django_db


def key_budget(api_caller: ApiCaller, **limits: Any) -> Budget:
    data = {"api_key": api_caller.key, "period": "day", "max_tokens": 1000, "run_reservation_tokens": 500}
    return budget_create(actor="test-admin", via="tests", data={**data, **limits})


def counters() -> dict[str, tuple[int, int]]:
    """Each period's (used, reserved) tokens, by its start."""
    return {
        row.period_start.date().isoformat(): (row.used_tokens, row.reserved_tokens) for row in BudgetUsage.objects.all()
    }


def events_usage(run: Run) -> dict[str, int]:
    totals: dict[str, int] = {}
    for data in RunEvent.objects.filter(run=run, kind="model_turn").values_list("data", flat=True):
        for key in ("input_tokens", "output_tokens", "total_tokens", "model_calls"):
            totals[key] = totals.get(key, 0) + data["usage"][key]
    return totals


# --- 1. a period changed while runs are in flight -------------------------------------------------------------


def test_a_period_changed_while_runs_are_in_flight_keeps_their_reservations_within_the_new_periods_limit(
    api_client: APIClient, api_caller: ApiCaller
) -> None:
    scripted_agent()
    budget = key_budget(api_caller)
    admitted = [submit(api_client) for _ in range(2)]
    assert [r.status_code for r in admitted] == [202, 202]
    budget_update(budget=Budget.objects.get(pk=budget.pk), actor="test-admin", via="tests", data={"period": "month"})
    # The two runs still hold the month's 1000 tokens: no third run, however the period is counted.
    refused = submit(api_client)
    assert refused.status_code == 429 and refused.json()["error"]["fields"]["reason"] == "runs_in_flight"
    month = api_client.get("/api/v1/usage").json()["budgets"][0]
    assert (month["period"], month["reserved_tokens"]) == ("month", 1000)
    for response in admitted:
        run_execute(run_id=response.json()["id"])
    spent = sum(Run.objects.values_list("tokens", flat=True))
    month = api_client.get("/api/v1/usage").json()["budgets"][0]
    assert (month["used_tokens"], month["reserved_tokens"]) == (spent, 0) and spent > 0
    assert all(reserved == 0 for _used, reserved in counters().values())
    assert sum(used for used, _reserved in counters().values()) == spent  # counted once, on the month's row


def test_a_settlement_that_read_its_reservation_before_the_period_changed_settles_on_the_new_periods_row(
    api_client: APIClient, api_caller: ApiCaller
) -> None:
    scripted_agent()
    budget = key_budget(api_caller)
    run_id = submit(api_client).json()["id"]
    run_execute(run_id=run_id)  # settled; its reservation is opened again below to be settled by hand
    run = Run.objects.get(pk=run_id)
    BudgetReservation.objects.filter(run=run).update(settled_at=None)
    BudgetUsage.objects.update(used_tokens=0, reserved_tokens=500)

    def change_period_first(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        # The period changes between the settlement's read of the reservation and its compare-and-swap.
        if not changed and sql.startswith('UPDATE "agents_budgetreservation" SET "settled_at"'):
            changed.append(True)
            budget_update(
                budget=Budget.objects.get(pk=budget.pk), actor="test-admin", via="tests", data={"period": "month"}
            )
        return execute(sql, params, many, context)

    changed: list[bool] = []
    with connection.execute_wrapper(change_period_first):
        assert budget_settle(run_id=run_id) == 1
    assert changed
    month = api_client.get("/api/v1/usage").json()["budgets"][0]
    assert (month["used_tokens"], month["reserved_tokens"]) == (run.tokens, 0)
    assert all(reserved == 0 for _used, reserved in counters().values())


# --- 2. room held by runs in flight, not a budget used up -----------------------------------------------------


def test_a_budget_whose_room_runs_in_flight_hold_says_so_and_asks_to_retry_in_seconds(
    api_client: APIClient, api_caller: ApiCaller
) -> None:
    scripted_agent()
    key_budget(api_caller, period="month")
    admitted = [submit(api_client) for _ in range(2)]
    refused = submit(api_client)
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert (error["code"], error["fields"]["reason"]) == ("budget_exceeded", "runs_in_flight")
    assert int(refused["Retry-After"]) == IN_FLIGHT_RETRY_AFTER_S
    assert "held by runs in flight" in error["message"] and "used up" not in error["message"]
    for response in admitted:
        run_execute(run_id=response.json()["id"])
    assert submit(api_client).status_code == 202  # they gave back what they did not use


def test_a_budget_its_spend_leaves_no_room_in_is_used_up_until_its_period_ends(
    api_client: APIClient, api_caller: ApiCaller
) -> None:
    scripted_agent()
    budget = key_budget(api_caller, period="month")
    assert submit(api_client).status_code == 202
    BudgetUsage.objects.filter(budget=budget).update(used_tokens=1000)  # the limit reached
    refused = submit(api_client)
    error = refused.json()["error"]
    assert (refused.status_code, error["code"], error["fields"]["reason"]) == (429, "budget_exceeded", "used_up")
    assert "used up" in error["message"]
    resets_at = dt.datetime.fromisoformat(error["fields"]["resets_at"])
    assert int(refused["Retry-After"]) >= (resets_at - timezone.now()).total_seconds()  # told to wait for it


# --- 4. a cost limit below one run's reservation -------------------------------------------------------------


def test_an_agents_cost_limit_below_one_runs_reservation_is_refused_in_the_form_naming_the_figures(
    admin_client: Any,
) -> None:
    price_house_model()  # $15 per 1M tokens at the dearest: 20,000 tokens reserve $0.30
    agent = scripted_agent()
    form = {"agent": agent.pk, "period": "day", "max_cost": "0.10", "run_reservation_tokens": "20000", "enabled": "on"}
    page = admin_client.post("/admin/agents/budget/add/", form, HTTP_ACCEPT_LANGUAGE="en")
    assert page.status_code == 200 and "max_cost" in page.context["adminform"].form.errors
    text = str(page.context["adminform"].form.errors["max_cost"])
    assert "20,000" in text and "0.30" in text and "0.10" in text and "house-model" in text
    assert not Budget.objects.exists()
    admitted = admin_client.post("/admin/agents/budget/add/", {**form, "run_reservation_tokens": "6000"})
    assert admitted.status_code == 302 and Budget.objects.get().run_reservation_tokens == 6000


def test_an_api_keys_cost_limit_below_one_runs_reservation_refuses_the_run_saying_so(
    api_client: APIClient, api_caller: ApiCaller
) -> None:
    price_house_model()
    scripted_agent()
    budget = key_budget(api_caller, max_tokens=None, max_cost=Decimal("0.10"), run_reservation_tokens=20_000)
    refused = submit(api_client)
    assert refused.status_code == 409, refused.content
    error = refused.json()["error"]
    assert (error["code"], error["fields"]) == ("budget_misconfigured", {"budget": budget.pk})
    assert "20,000 tokens" in error["message"] and "0.30" in error["message"] and "0.10" in error["message"]
    assert "used up" not in error["message"]
    assert not Run.objects.exists() and not BudgetReservation.objects.exists()


def raise_house_price() -> None:
    """$100 per 1M output tokens: 20,000 tokens now reserve $2.00."""
    price = ModelPrice.objects.get(model_id="house-model")
    model_price_update(price=price, actor="test-admin", via="tests", data={"output_per_mtok": Decimal("100")})


def test_a_budget_a_price_rise_outgrew_can_still_be_switched_off_and_edited(admin_client: Any) -> None:
    """The check judges the figures an admin sets, not a stored budget at every save: after a price rise, unticking
    ``enabled`` (the way out) and other edits save; switching it on, or a limit still too low, is judged again."""
    price_house_model()
    agent = scripted_agent()
    data = {"agent": agent, "period": "day", "max_cost": Decimal("1.00"), "run_reservation_tokens": 20_000}
    budget = budget_create(actor="test-admin", via="tests", data=data)
    raise_house_price()
    form = {"agent": agent.pk, "period": "day", "max_cost": "1.00", "run_reservation_tokens": "20000"}
    url = f"/admin/agents/budget/{budget.pk}/change/"

    switched_off = admin_client.post(url, form, HTTP_ACCEPT_LANGUAGE="en")  # enabled left unticked

    assert switched_off.status_code == 302 and Budget.objects.get(pk=budget.pk).enabled is False
    budget_update(budget=Budget.objects.get(pk=budget.pk), actor="test-admin", via="tests", data={"period": "month"})
    switched_on = admin_client.post(url, {**form, "enabled": "on"}, HTTP_ACCEPT_LANGUAGE="en")
    assert switched_on.status_code == 200 and "max_cost" in switched_on.context["adminform"].form.errors
    assert "2.00" in str(switched_on.context["adminform"].form.errors["max_cost"])
    assert admin_client.post(url, {**form, "enabled": "on", "max_cost": "2.00"}).status_code == 302


def test_an_enabled_budget_whose_figures_change_is_judged_at_the_price_now(admin_client: Any) -> None:
    price_house_model()
    agent = scripted_agent()
    data = {"agent": agent, "period": "day", "max_cost": Decimal("1.00"), "run_reservation_tokens": 20_000}
    budget = budget_create(actor="test-admin", via="tests", data=data)
    raise_house_price()
    form = {
        "agent": agent.pk,
        "period": "month",
        "max_cost": "1.00",
        "run_reservation_tokens": "20000",
        "enabled": "on",
    }
    url = f"/admin/agents/budget/{budget.pk}/change/"

    assert admin_client.post(url, form).status_code == 302  # its period only: saved as it is
    refused = admin_client.post(url, {**form, "max_cost": "1.50"}, HTTP_ACCEPT_LANGUAGE="en")
    assert refused.status_code == 200 and "max_cost" in refused.context["adminform"].form.errors
    assert admin_client.post(url, {**form, "run_reservation_tokens": "10000"}).status_code == 302


def publish_model(agent: Agent, model_id: str) -> None:
    """Publish ``agent`` with ``model_id`` live, then leave publishing on save off (later edits are a draft)."""
    agent_update(agent=agent, actor="test-admin", via="tests", data={"model_id": model_id})
    agent_version_publish(agent=Agent.objects.get(pk=agent.pk), actor="test-admin", via="tests")
    agent_update(agent=Agent.objects.get(pk=agent.pk), actor="test-admin", via="tests", data={"publish_on_save": False})


@pytest.mark.parametrize(
    ("live", "draft", "admitted"), [("cheap", "house-model", True), ("house-model", "cheap", False)]
)
def test_an_agents_budget_is_priced_at_its_live_versions_model_not_its_draft(
    live: str, draft: str, admitted: bool
) -> None:
    """Runs are charged at the model of the version live traffic runs (``agents.budgets.run_model``), not at a
    draft's that runs nowhere until published."""
    price_house_model()  # 20,000 tokens reserve $0.30
    cheap = {"provider": "scripted", "model_id": "cheap", "input_per_mtok": Decimal("0.10")}
    model_price_create(actor="test-admin", via="tests", data={**cheap, "output_per_mtok": Decimal("0.10")})
    agent = scripted_agent()
    publish_model(agent, live)
    agent_update(agent=Agent.objects.get(pk=agent.pk), actor="test-admin", via="tests", data={"model_id": draft})
    agent = Agent.objects.get(pk=agent.pk)
    assert agent.model_id == draft and agent.live_version is not None
    data = {"agent": agent, "period": "day", "max_cost": Decimal("0.10"), "run_reservation_tokens": 20_000}

    if admitted:
        budget_create(actor="test-admin", via="tests", data=data)
    else:
        with pytest.raises(ValidationError) as refused:
            budget_create(actor="test-admin", via="tests", data=data)
        assert "house-model" in str(refused.value)
    assert Budget.objects.exists() is admitted


@pytest.fixture
def eager_resume() -> Iterator[None]:
    """Runs dispatched in-process: the resumed run is executed right here, as a worker would."""
    celery_app.conf.task_always_eager = True
    yield
    celery_app.conf.task_always_eager = False


# --- 5. token_usage of a run cancelled during a later model call ----------------------------------------------


def test_a_run_cancelled_during_its_second_model_call_shows_both_calls_in_its_token_usage(
    api_client: APIClient, api_caller: ApiCaller, monkeypatch: pytest.MonkeyPatch
) -> None:
    price_house_model()
    scripted_agent(turns=3)
    key_budget(api_caller, max_tokens=10_000)
    run = Run.objects.get(pk=submit(api_client).json()["id"])
    original = RunEventWriter.emit
    turns: list[int] = []

    def emit(self: RunEventWriter, kind: str, data: dict[str, Any]) -> None:
        if kind == "model_turn":
            turns.append(1)
            if len(turns) == 2:  # the second call was under way when the run was cancelled
                run_cancel(run=Run.objects.get(pk=run.pk), actor="test")
        original(self, kind, data)

    monkeypatch.setattr(RunEventWriter, "emit", emit)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    spent = events_usage(run)
    assert (run.status, spent["model_calls"]) == (Run.Status.CANCELLED, 2)
    assert {key: run.token_usage[key] for key in spent} == spent
    assert run.tokens == spent["input_tokens"] + spent["output_tokens"] == BudgetUsage.objects.get().used_tokens
    shown = api_client.get(f"/api/v1/runs/{run.id}").json()["token_usage"]
    assert shown["model_calls"] == 2 and shown["input_tokens"] + shown["output_tokens"] == run.tokens


@pytest.mark.slow
def test_a_resumed_run_cancelled_in_its_second_pass_shows_both_passes_in_its_token_usage(
    writer: Any,  # noqa: F811
    notes: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    django_capture_on_commit_callbacks: Any,
    eager_resume: None,
) -> None:
    run, client = writer
    approval = park(run)
    original = RunEventWriter.emit
    armed = [True]

    def emit(self: RunEventWriter, kind: str, data: dict[str, Any]) -> None:
        original(self, kind, data)
        if kind == "model_turn" and armed:
            armed.clear()
            run_cancel(run=Run.objects.get(pk=run.pk), actor="test")

    monkeypatch.setattr(RunEventWriter, "emit", emit)
    with django_capture_on_commit_callbacks(execute=True):
        assert decide(client, run, approval, "approve").status_code == 200
    run.refresh_from_db()
    spent = events_usage(run)
    assert (run.status, spent["model_calls"]) == (Run.Status.CANCELLED, 2)
    assert {key: run.token_usage[key] for key in spent} == spent
    assert run.tokens == spent["input_tokens"] + spent["output_tokens"]
