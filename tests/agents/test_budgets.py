"""Tokens, prices and budgets: a run's cost from the price table, budgets per key and per agent refused with
``429 budget_exceeded``, the reservation that holds under 50 concurrent submissions, and ``GET /api/v1/usage``."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import pytest
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from agents.budgets import budget_create, model_price_create, period_bounds
from agents.execution import run_execute
from agents.models import Agent, Budget, BudgetReservation, BudgetUsage, Run
from agents.services import api_key_create
from audit.models import AuditEvent
from tests.conftest import make_agent

# The scripted model counts a quarter token per character: this conversation costs a fixed amount per run.
ANSWER = "예산 안에서 답합니다."


def scripted_agent(slug: str = "budgeted", *, turns: int = 1, output_tokens: int | None = None) -> Agent:
    """An agent whose model calls a tool ``turns - 1`` times, then answers; with ``output_tokens``, every tool
    call turn reports that many output tokens (a long turn, cut at the call's ``max_tokens``)."""
    usage = {"usage": {"output_tokens": output_tokens}} if output_tokens is not None else {}
    script = [{"tool_calls": [{"name": "no_such_tool", "args": {}}], **usage} for _ in range(turns - 1)]
    script.append({"content": ANSWER})
    agent = make_agent(slug=slug, servers=[], provider="scripted", script=script, with_demo_rules=False)
    agent.model_id = "house-model"
    agent.save()
    return agent


def price_house_model() -> None:
    model_price_create(
        actor="test-admin",
        via="tests",
        data={
            "provider": "scripted",
            "model_id": "house-model",
            "input_per_mtok": Decimal("3.00"),
            "output_per_mtok": Decimal("15.00"),
        },
    )


def submit(client: APIClient, agent: str = "budgeted") -> object:
    return client.post("/api/v1/runs", {"agent": agent, "query": "질문"}, format="json")


def finish(run_id: str) -> Run:
    run_execute(run_id=run_id)
    return Run.objects.get(pk=run_id)


@pytest.mark.django_db
def test_a_run_costs_its_tokens_at_its_models_price(api_client) -> None:
    price_house_model()
    agent = scripted_agent()
    run = finish(submit(api_client).json()["id"])
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    usage = run.token_usage
    assert run.tokens == usage["input_tokens"] + usage["output_tokens"] > 0
    assert run.cost_micros == usage["input_tokens"] * 3 + usage["output_tokens"] * 15
    assert agent.model_provider == "scripted"


@pytest.mark.django_db
def test_a_run_of_a_published_version_costs_the_price_of_the_model_it_ran(api_client, api_caller) -> None:
    from agents.services import agent_update, agent_version_publish

    price_house_model()
    model_price_create(
        actor="test-admin",
        via="tests",
        data={"provider": "scripted", "model_id": "dear-model", "input_per_mtok": 300, "output_per_mtok": 1500},
    )
    agent = scripted_agent()
    agent_version_publish(agent=agent, actor="test-admin", via="tests")  # live: house-model
    # The draft moves to a dearer model, not published: runs still run (and are charged for) the live version.
    agent_update(agent=Agent.objects.get(pk=agent.pk), actor="test-admin", via="tests", data={"model_id": "dear-model"})
    budget_create(actor="test-admin", via="tests", data={"api_key": api_caller.key, "period": "day", "max_cost": 100})
    run = finish(submit(api_client).json()["id"])
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert run.version.content["agent"]["model_id"] == "house-model"
    usage = run.token_usage
    at_its_price = usage["input_tokens"] * 3 + usage["output_tokens"] * 15
    assert run.cost_micros == at_its_price
    assert BudgetUsage.objects.get().used_cost_micros == at_its_price
    # Its reservation was priced the same way (released at the settlement).
    [reservation] = BudgetReservation.objects.filter(run_id=run.id)
    assert reservation.cost_micros < 20_000 * 300  # not the dear model's price for the reserved tokens


@pytest.mark.django_db
def test_price_and_budget_changes_are_audited() -> None:
    price_house_model()
    agent = scripted_agent()
    budget_create(
        actor="test-admin",
        via="tests",
        data={"agent": agent, "period": "day", "max_tokens": 1000, "run_reservation_tokens": 500},
    )
    actions = set(AuditEvent.objects.values_list("action", flat=True))
    assert {"config.model_price.create", "config.budget.create"} <= actions


@pytest.mark.django_db
def test_a_spent_key_budget_refuses_the_run_with_429_and_retry_after_the_day(api_client, api_caller) -> None:
    scripted_agent()
    budget_create(
        actor="test-admin",
        via="tests",
        data={"api_key": api_caller.key, "period": "day", "max_tokens": 250, "run_reservation_tokens": 100},
    )
    first, second = submit(api_client), submit(api_client)
    assert (first.status_code, second.status_code) == (202, 202)
    refused = submit(api_client)
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "budget_exceeded"
    assert 0 < int(refused["Retry-After"]) <= 86400
    assert Run.objects.count() == 2  # the refused run was rolled back with its reservation
    # The two runs settle with what they really used (less than reserved): room for another run again.
    for body in (first.json(), second.json()):
        finish(body["id"])
    usage = BudgetUsage.objects.get()
    assert usage.reserved_tokens == 0
    assert usage.used_tokens == sum(Run.objects.values_list("tokens", flat=True)) < 200
    assert submit(api_client).status_code == 202


@pytest.mark.django_db
def test_an_agent_budget_on_cost_refuses_every_key(api_client, other_caller) -> None:
    price_house_model()
    agent = scripted_agent()
    # 100 tokens at the dearest price ($15/1M) reserve 1500 µUSD; the limit holds one such run.
    budget_create(
        actor="test-admin",
        via="tests",
        data={"agent": agent, "period": "month", "max_cost": Decimal("0.002"), "run_reservation_tokens": 100},
    )
    assert submit(api_client).status_code == 202
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Bearer {other_caller.raw_key}")
    refused = submit(other)
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "budget_exceeded"
    _start, end = period_bounds("month", timezone.now())
    assert refused.json()["error"]["fields"]["resets_at"] == end.isoformat()


@pytest.mark.django_db
def test_a_run_stops_with_budget_run_ceiling_before_the_call_that_could_cross_its_reservation(
    api_client, api_caller
) -> None:
    agent = scripted_agent(turns=5, output_tokens=150)
    budget_create(
        actor="test-admin",
        via="tests",
        data={"api_key": api_caller.key, "period": "day", "max_tokens": 10_000, "run_reservation_tokens": 700},
    )
    run = finish(submit(api_client).json()["id"])
    assert (run.status, run.error_code) == (Run.Status.FAILED, "budget:run_ceiling"), (run.token_usage, run.messages)
    assert "next model call" in run.error_message
    assert 0 < run.tokens <= 700  # never past the reservation: the call that might cross it is not made
    assert 1 <= run.token_usage["model_calls"] < 5
    assert BudgetUsage.objects.get().used_tokens == run.tokens
    assert agent.slug == "budgeted"


@pytest.mark.django_db
def test_a_model_call_is_capped_to_what_is_left_of_the_reservation(api_client, api_caller) -> None:
    scripted_agent(turns=3, output_tokens=5_000)
    budget_create(
        actor="test-admin",
        via="tests",
        data={"api_key": api_caller.key, "period": "day", "max_tokens": 10_000, "run_reservation_tokens": 2000},
    )
    run = finish(submit(api_client).json()["id"])
    assert (run.status, run.error_code) == (Run.Status.FAILED, "budget:run_ceiling")
    # The first turn wanted 5000 output tokens; its max_tokens left room only up to the reservation.
    assert run.token_usage["model_calls"] == 1
    assert run.token_usage["output_tokens"] < 2000 and run.tokens <= 2000


@pytest.mark.django_db
def test_cancelling_a_queued_run_releases_its_reservation(api_client, api_caller) -> None:
    scripted_agent()
    budget_create(
        actor="test-admin",
        via="tests",
        data={"api_key": api_caller.key, "period": "day", "max_tokens": 150, "run_reservation_tokens": 100},
    )
    run_id = submit(api_client).json()["id"]
    assert submit(api_client).status_code == 429
    assert api_client.post(f"/api/v1/runs/{run_id}/cancel").status_code == 200
    assert BudgetReservation.objects.get(run_id=run_id).settled_at is not None
    assert submit(api_client).status_code == 202


@pytest.mark.django_db
def test_usage_shows_the_keys_tokens_cost_and_budgets(api_client, api_caller) -> None:
    price_house_model()
    scripted_agent()
    budget_create(
        actor="test-admin",
        via="tests",
        data={"api_key": api_caller.key, "period": "day", "max_tokens": 10_000, "run_reservation_tokens": 500},
    )
    runs = [finish(submit(api_client).json()["id"]) for _ in range(2)]
    queued = submit(api_client)
    assert queued.status_code == 202
    body = api_client.get("/api/v1/usage").json()
    tokens = sum(r.tokens for r in runs)
    cost = sum(r.cost_micros for r in runs) / 1_000_000
    assert body["today"] == {"runs": 3, "tokens": tokens, "cost_usd": pytest.approx(cost)}
    assert body["by_agent"] == [{"agent": "budgeted", "runs": 3, "tokens": tokens, "cost_usd": pytest.approx(cost)}]
    assert len(body["by_day"]) == 30 and body["by_day"][-1]["tokens"] == tokens
    [budget] = body["budgets"]
    assert (budget["scope"], budget["used_tokens"], budget["reserved_tokens"]) == ("api_key", tokens, 500)


@pytest.mark.django_db
def test_usage_needs_a_key() -> None:
    response = APIClient().get("/api/v1/usage")
    assert response.status_code == 401


@pytest.mark.slow  # ≥ 1.5 s: the fast loop stays under five minutes
@pytest.mark.django_db(transaction=True)
def test_a_budget_holds_under_50_concurrent_submissions_on_one_key(settings) -> None:
    """50 requests at once on one key whose budget holds 7 reservations: exactly 7 are admitted, the rest get a
    429, and after the admitted runs settle the budget is not overspent."""
    settings.PLATFORM_API_RATE = "1000/min"
    key, raw = api_key_create(name="busy", actor="test", via="tests")
    scripted_agent()
    budget = budget_create(
        actor="test-admin",
        via="tests",
        data={"api_key": key, "period": "day", "max_tokens": 7_000, "run_reservation_tokens": 1000},
    )
    start = threading.Barrier(50)
    statuses: list[int] = []
    ids: list[str] = []
    lock = threading.Lock()

    def one() -> None:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
        try:
            start.wait(timeout=60)
            response = submit(client)
            with lock:
                statuses.append(response.status_code)
                if response.status_code == 202:
                    ids.append(response.json()["id"])
        finally:
            connection.close()

    threads = [threading.Thread(target=one) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert sorted(set(statuses)) == [202, 429], statuses
    assert statuses.count(202) == 7 and statuses.count(429) == 43
    usage = BudgetUsage.objects.get(budget=budget)
    assert usage.reserved_tokens == 7000
    for run_id in ids:
        finish(run_id)
    usage.refresh_from_db()
    assert usage.reserved_tokens == 0
    assert usage.used_tokens == sum(Run.objects.filter(api_key=key).values_list("tokens", flat=True))
    assert usage.used_tokens <= budget.max_tokens
    assert Budget.objects.count() == 1


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_50_concurrent_runs_on_one_key_that_cross_their_reservations_do_not_overspend_the_budget(settings) -> None:
    """50 runs admitted at once on one key (the budget holds all 50 reservations), each of whose model wants more
    tokens than its reservation: the cap on every call keeps each run within its reservation, so the key's spend
    stays within its limit (the promise: never past the limit plus one run's worth)."""
    settings.PLATFORM_API_RATE = "1000/min"
    key, raw = api_key_create(name="busy", actor="test", via="tests")
    scripted_agent(turns=5, output_tokens=1500)
    reservation = 2000
    budget = budget_create(
        actor="test-admin",
        via="tests",
        data={"api_key": key, "period": "day", "max_tokens": 50 * reservation, "run_reservation_tokens": reservation},
    )
    start = threading.Barrier(50)
    ids: list[str] = []
    lock = threading.Lock()

    def admit() -> None:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
        try:
            start.wait(timeout=60)
            response = submit(client)
            assert response.status_code == 202, response.content
            with lock:
                ids.append(response.json()["id"])
        finally:
            connection.close()

    threads = [threading.Thread(target=admit) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert len(ids) == 50
    assert BudgetUsage.objects.get(budget=budget).reserved_tokens == 50 * reservation  # all 50 in flight

    def execute(run_id: str) -> None:
        try:
            run_execute(run_id=run_id)
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=5) as pool:
        list(pool.map(execute, ids))
    runs = Run.objects.filter(api_key=key)
    assert {r.error_code for r in runs} == {"budget:run_ceiling"}  # every run ran into its reservation
    usage = BudgetUsage.objects.get(budget=budget)
    assert usage.reserved_tokens == 0
    assert usage.used_tokens == sum(r.tokens for r in runs)
    assert usage.used_tokens <= budget.max_tokens + reservation
    assert max(r.tokens for r in runs) <= reservation


@pytest.mark.django_db
def test_a_finished_run_shows_its_cost_to_the_caller(api_client) -> None:
    price_house_model()
    scripted_agent()
    run = finish(submit(api_client).json()["id"])
    body = api_client.get(f"/api/v1/runs/{run.pk}").json()
    assert body["cost_usd"] == pytest.approx(run.cost_micros / 1_000_000) and body["cost_usd"] > 0
    assert body["token_usage"]["input_tokens"] == run.token_usage["input_tokens"]


@pytest.mark.django_db
def test_admins_edit_prices_and_budgets_through_the_audited_services(admin_client, api_caller) -> None:
    response = admin_client.post(
        "/admin/agents/modelprice/add/",
        {
            "provider": "openai_compatible",
            "model_id": "gpt-4o-mini",
            "input_per_mtok": "0.15",
            "output_per_mtok": "0.6",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    response = admin_client.post(
        "/admin/agents/budget/add/",
        {
            "api_key": api_caller.key.pk,
            "period": "month",
            "max_cost": "25",
            "run_reservation_tokens": "20000",
            "enabled": "on",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    events = AuditEvent.objects.filter(action__in=["config.model_price.create", "config.budget.create"])
    assert {e.actor for e in events} == {"admin"} and events.count() == 2
    page = admin_client.get("/admin/agents/budget/").content.decode()
    assert "0 tokens, $0.00 (reserved: 0 tokens)" in page  # dollars as people write them, not $0.0
    budget = Budget.objects.get()
    BudgetUsage.objects.create(
        budget=budget, period_start=period_bounds(budget.period, timezone.now())[0], used_tokens=7, used_cost_micros=42
    )
    assert "7 tokens, $0.000042 (reserved: 0 tokens)" in admin_client.get("/admin/agents/budget/").content.decode()


@pytest.mark.django_db
def test_a_budget_for_both_a_key_and_an_agent_or_without_a_limit_is_refused(admin_client, api_caller) -> None:
    agent = scripted_agent()
    both = admin_client.post(
        "/admin/agents/budget/add/",
        {
            "api_key": api_caller.key.pk,
            "agent": agent.pk,
            "period": "day",
            "max_tokens": "10",
            "run_reservation_tokens": "5",
        },
    )
    assert "A budget belongs to one API key or one agent." in both.content.decode()
    no_limit = admin_client.post(
        "/admin/agents/budget/add/", {"agent": agent.pk, "period": "day", "run_reservation_tokens": "5"}
    )
    assert "Give a token limit, a cost limit, or both." in no_limit.content.decode()
    assert not Budget.objects.exists()


def test_the_price_page_names_the_model_ids_the_agents_use(admin_client) -> None:
    Agent.objects.create(slug="claude", name="claude", model_provider="bedrock", model_id="anthropic.claude-x-v1")
    page = admin_client.get("/admin/agents/modelprice/add/").content.decode()
    assert "The model id exactly as an agent names it; empty: every model of the provider" in page
    assert "The agents&#x27; models: bedrock: anthropic.claude-x-v1." in page


@pytest.mark.django_db
def test_an_offline_agent_runs_within_a_small_reservation(demo_agent) -> None:
    """The offline model reads nothing and spends no token: a reservation smaller than its prompt's size failed
    every run of the demo agent with ``budget:run_ceiling`` before its answer."""
    from agents.services import run_create

    budget_create(
        actor="test-admin",
        via="tests",
        data={"agent": demo_agent, "period": "day", "max_tokens": 2_500, "run_reservation_tokens": 1_000},
    )
    run = run_create(agent_slug=demo_agent.slug, query="A-1001 자산의 현재 상태를 알려주세요.", api_key=None)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, (run.error_code, run.error_message)
    assert "A-1001" in run.answer
    assert BudgetUsage.objects.get().reserved_tokens == 0  # settled


@pytest.mark.django_db
def test_a_budget_that_could_admit_no_run_is_refused(admin_client) -> None:
    key, _raw = api_key_create(name="small", actor="test", via="tests")
    form = {"api_key": key.pk, "period": "day", "max_tokens": "10", "run_reservation_tokens": "20000", "enabled": "on"}
    page = admin_client.post("/admin/agents/budget/add/", form, HTTP_ACCEPT_LANGUAGE="en")
    assert page.status_code == 200  # the form again, with the error at its field
    assert "more than the limit of 10" in page.content.decode()
    assert not Budget.objects.exists()
    assert admin_client.post("/admin/agents/budget/add/", {**form, "run_reservation_tokens": "10"}).status_code == 302


@pytest.mark.django_db(transaction=True)
def test_a_budget_deleted_while_a_submission_read_it_limits_nothing_and_fails_nothing() -> None:
    """A submission holding the budgets it read (the process's cache, or a read just before an admin's delete)
    created counters for the deleted budget: its foreign key, checked only at commit, failed the submission (500)."""
    from django.db import transaction

    from agents.budgets import budget_delete, budget_reserve

    agent = scripted_agent()
    budget = budget_create(
        actor="test-admin",
        via="tests",
        data={"agent": agent, "period": "day", "max_tokens": 1000, "run_reservation_tokens": 500},
    )
    stale = [Budget.objects.get(pk=budget.pk)]
    budget_delete(budget=budget, actor="test-admin", via="tests")
    with transaction.atomic():
        run = Run.objects.create(agent=agent, query="안녕")
        budget_reserve(run=run, agent=agent, api_key=None, budgets=stale)
    assert Run.objects.filter(pk=run.pk).exists()
    assert not BudgetUsage.objects.exists() and not BudgetReservation.objects.exists()
