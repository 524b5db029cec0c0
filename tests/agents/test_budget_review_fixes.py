"""Budgets hold where a review found they did not:

1. a run cancelled while its worker has a model call out keeps its reservation until that worker stops (or the
   reconciler finds its time up): released at once, its room was let to a new run while the call still spent it;
2. a model server that reports no usage is charged an upper bound of every such turn, so the run's ceiling and
   the budget hold (it was charged nothing, and each call was allowed nearly the whole reservation);
3. a run failed "bare" (its approvals cannot be read) still gives its reservation back;
4. the admin's dashboard tells apart two API keys of one name.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from agents.budgets import REFUSED_RUNS_IN_FLIGHT, budget_create, budget_reserve
from agents.dispatch import run_time_limits
from agents.execution import run_execute
from agents.models import Agent, Approval, BudgetUsage, Run, RunEvent
from agents.reconciler import runs_reconcile
from agents.services import api_key_create, run_cancel
from tests.agents.test_budgets import price_house_model, scripted_agent, submit
from tests.agents.test_budgets_unstored import interleave, turn_tokens
from tests.agents.test_openai_compatible import openai_agent
from tests.agents.test_poisoned_runs import approval_of, dispatched, fresh, held_by, store_corrupt  # noqa: F401
from tests.e2e.harness import redis_server, wait_until, workers_killed_at_exit
from tests.e2e.test_budgets_e2e import key_budget, model_turn_tokens
from tests.e2e.workers import platform_without_workers
from tests.openai_server import ScriptedOpenAIServer

pytestmark = pytest.mark.django_db


def day_budget_of(api_caller: Any, *, tokens: int) -> None:
    budget_create(
        actor="test-admin",
        via="tests",
        data={"api_key": api_caller.key, "period": "day", "max_tokens": tokens, "run_reservation_tokens": tokens},
    )


def counters() -> tuple[int, int]:
    usage = BudgetUsage.objects.get()
    return usage.used_tokens, usage.reserved_tokens


# --- 1. a run cancelled while its model call is out ------------------------------------------------------------


def test_a_run_cancelled_while_its_model_call_is_out_keeps_its_room_until_its_worker_stops(
    api_client, api_caller, monkeypatch
) -> None:
    price_house_model()
    scripted_agent(turns=2, output_tokens=100_000)  # its tool-call turn writes all that the call is allowed
    day_budget_of(api_caller, tokens=1000)
    run = Run.objects.get(pk=submit(api_client).json()["id"])
    seen: dict[str, Any] = {}

    def cancel_and_submit_again() -> None:
        run_cancel(run=Run.objects.get(pk=run.pk), actor="api_key:caller", source="api")
        seen["counters"] = counters()
        refused = submit(api_client)
        seen["refused"] = (refused.status_code, refused.json()["error"]["fields"].get("reason"))

    # The first model call is out (its event not yet written) when the run is cancelled.
    interleave(monkeypatch, "model_turn", cancel_and_submit_again, before=True)
    run_execute(run_id=str(run.id))

    assert seen["counters"] == (0, 1000)  # the call out still holds the run's room
    assert seen["refused"] == (429, REFUSED_RUNS_IN_FLIGHT)
    run.refresh_from_db()
    [spent] = turn_tokens(run)
    assert run.status == Run.Status.CANCELLED and run.tokens == spent
    assert counters() == (spent, 0)  # settled as its worker stopped, within the limit
    assert spent <= 1000
    run_execute(run_id=str(run.id))  # a later delivery settles nothing twice
    assert counters() == (spent, 0)
    assert submit(api_client).status_code == 429  # what the call spent is gone from the day: no room for a run


def test_a_cancelled_run_whose_worker_died_is_settled_by_the_reconciler_once_its_time_is_up(
    api_client, api_caller
) -> None:
    scripted_agent()
    day_budget_of(api_caller, tokens=1000)
    run = Run.objects.get(pk=submit(api_client).json()["id"])
    held_by(run, "live-host:1")
    # A model call it made before it died, its event written.
    usage = {"input_tokens": 30, "output_tokens": 12, "total_tokens": 42, "model_calls": 1}
    RunEvent.objects.create(run=run, seq=1, kind="model_turn", data={"type": "ai", "usage": usage})

    run_cancel(run=Run.objects.get(pk=run.pk), actor="test")
    assert counters() == (0, 1000)
    runs_reconcile()
    assert counters() == (0, 1000)  # its worker's time is not up: it may still be spending

    _soft, hard = run_time_limits(run.agent.time_limit_s)
    runs_reconcile(now=timezone.now() + timedelta(seconds=hard + 1))

    assert counters() == (42, 0)
    assert fresh(run).tokens == 42
    runs_reconcile(now=timezone.now() + timedelta(seconds=hard + 2))
    assert counters() == (42, 0)


def test_cancelling_a_run_whose_worker_is_gone_settles_it_at_once(api_client, api_caller) -> None:
    scripted_agent()
    day_budget_of(api_caller, tokens=1000)
    run = Run.objects.get(pk=submit(api_client).json()["id"])
    held_by(run, "dead-host:1", lease_s=-5)

    run_cancel(run=Run.objects.get(pk=run.pk), actor="test")

    assert counters() == (0, 0)


SLOW_CALL_AGENT = {
    "slug": "budgeted",
    "name": "Budgeted",
    "system_prompt": "예산 안에서 답한다.",
    "model": {
        "provider": "scripted",
        "model_id": "house-model",
        "params": {
            # Each model call is out this long: 1 s to be sure it is out, then 3 s for the cancel and the refusal.
            "latency_s": 4,
            "script": [
                {"tool_calls": [{"name": "no_such_tool", "args": {}}], "usage": {"output_tokens": 100_000}},
                {"content": "예산 안의 답"},
            ],
        },
    },
    "servers": [],
}


@pytest.mark.e2e
@pytest.mark.redis
def test_through_a_worker_a_run_cancelled_mid_call_holds_its_room_until_the_worker_records_its_end(
    tmp_path: Path,
) -> None:
    env = {"PLATFORM_ALLOW_SCRIPTED_MODEL": "1"}
    with (
        redis_server(tmp_path) as broker_url,
        platform_without_workers(tmp_path, broker_url=broker_url, env=env) as p,
        workers_killed_at_exit(p),
    ):
        worker = p.start_worker("w1", concurrency=2, wait=False)  # it starts while the commands below run
        p.import_config({"agents": [SLOW_CALL_AGENT]})
        key_budget(p, max_tokens=1000, reservation=1000)
        worker.wait_ready()
        with p.client() as client:
            run_id = client.post("/api/v1/runs", json={"agent": "budgeted", "query": "질문"}).json()["id"]
            wait_until(lambda: p.run_events(run_id, "status")[-1]["status"] == "running", timeout=60, what="running")
            time.sleep(1.0)  # its first model call (4 s) is out
            assert client.post(f"/api/v1/runs/{run_id}/cancel").json()["status"] == "cancelled"
            refused = client.post("/api/v1/runs", json={"agent": "budgeted", "query": "질문"})
            assert refused.status_code == 429, refused.text
            assert refused.json()["error"]["fields"]["reason"] == REFUSED_RUNS_IN_FLIGHT
            wait_until(lambda: p.run_events(run_id, "status")[-1]["status"] == "cancelled", timeout=60, what="its end")
        # Its end is recorded with its spend counted: the call that was out, capped to the reservation.
        spent = model_turn_tokens(p, run_id)
        assert 0 < spent <= 1000 and p.run_row(run_id)["tokens"] == spent
        assert p.query("SELECT used_tokens, reserved_tokens FROM agents_budgetusage") == [(spent, 0)]


# --- 2. a model server that reports no usage -------------------------------------------------------------------


class NoUsageServer(ScriptedOpenAIServer):
    """An OpenAI-compatible server that sends no ``usage``: neither in its JSON answer nor as a last stream chunk."""

    def completion(self, body: dict[str, Any], turn: dict[str, Any]) -> dict[str, Any]:
        completion = super().completion(body, turn)
        completion.pop("usage")
        return completion

    def chunks(self, completion: dict[str, Any]) -> Any:
        for chunk in super().chunks({**completion, "usage": None}):
            if chunk.get("choices") != []:
                yield chunk


TWO_SEARCHES = [{"tool_calls": [{"name": "search_employee", "args": {"name": "박도윤"}}]} for _ in range(2)] + [
    {"content": "박도윤 님은 물류플랫폼팀입니다."}
]
RESERVATION = 20_000


def no_usage_run(server: ScriptedOpenAIServer, demo_server: Any, *, stream: bool, budgeted: bool) -> Run:
    agent = openai_agent(server, demo_server, max_tokens=None, stream=stream)
    if budgeted:
        budget_create(
            actor="test-admin",
            via="tests",
            data={"agent": agent, "period": "day", "max_tokens": RESERVATION, "run_reservation_tokens": RESERVATION},
        )
    run = Run.objects.create(agent=Agent.objects.get(pk=agent.pk), query="박도윤 님 팀?")
    budget_reserve(run=run, agent=run.agent, api_key=None)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    return run


def turn_usages(run: Run) -> list[dict[str, int]]:
    turns = RunEvent.objects.filter(run=run, kind="model_turn").order_by("seq").values_list("data", flat=True)
    return [turn["usage"] for turn in turns]


@pytest.mark.parametrize(
    ("stream", "server"),
    [
        (False, lambda: NoUsageServer(TWO_SEARCHES)),
        (True, lambda: NoUsageServer(TWO_SEARCHES)),
        # A server that counts nothing and says 0.
        (False, lambda: ScriptedOpenAIServer(TWO_SEARCHES, usage={"prompt_tokens": 0, "completion_tokens": 0})),
    ],
    ids=["json", "sse", "zeros"],
)
def test_a_server_that_reports_no_usage_is_charged_an_upper_bound_within_the_reservation(
    demo_server, caplog, stream, server
) -> None:
    with server().running() as running, caplog.at_level(logging.WARNING, logger="agents.engine"):
        run = no_usage_run(running, demo_server, stream=stream, budgeted=True)
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    usages = turn_usages(run)
    caps = [request["body"]["max_completion_tokens"] for request in running.requests]
    assert len(usages) == len(caps) == 3
    spent = 0
    for usage, cap in zip(usages, caps, strict=True):
        assert usage["input_tokens"] > 0 and 0 < usage["output_tokens"] <= cap
        assert usage["model_calls_estimated"] == 1
        # What the call could have spent, on top of what the run had spent, fits its reservation.
        assert spent + usage["input_tokens"] + cap <= RESERVATION
        spent += usage["input_tokens"] + usage["output_tokens"]
    assert run.tokens == spent
    assert run.token_usage["model_calls_estimated"] == 3
    assert counters() == (spent, 0)
    assert [entry.get("usage_estimated") for entry in run.messages if entry.get("type") == "ai"] == [True] * 3
    warned = [r for r in caplog.records if "reported no token usage" in r.getMessage()]
    assert len(warned) == 1  # once per run


def test_a_run_without_a_budget_is_charged_the_bound_of_turns_without_usage(demo_server) -> None:
    with NoUsageServer(TWO_SEARCHES).running() as running:
        run = no_usage_run(running, demo_server, stream=False, budgeted=False)
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert run.tokens == sum(u["input_tokens"] + u["output_tokens"] for u in turn_usages(run)) > 0
    assert run.token_usage["model_calls_estimated"] == 3


def test_a_server_that_reports_usage_is_charged_what_it_reported(demo_server) -> None:
    with ScriptedOpenAIServer(TWO_SEARCHES).running() as running:
        run = no_usage_run(running, demo_server, stream=False, budgeted=True)
    assert run.tokens == 3 * (100 + 10)
    assert "model_calls_estimated" not in run.token_usage


# --- 3. a run failed bare ------------------------------------------------------------------------------------


def test_a_run_failed_bare_gives_its_reservation_back_once(
    demo_agent,
    dispatched,  # noqa: F811
    django_capture_on_commit_callbacks,
) -> None:
    budget_create(
        actor="t",
        via="tests",
        data={"agent": demo_agent, "period": "month", "max_tokens": 10_000, "run_reservation_tokens": 5_000},
    )
    stuck = Run.objects.create(agent=demo_agent, query="질문")
    budget_reserve(run=stuck, agent=demo_agent, api_key=None)
    held_by(stuck, "dead-host:1", lease_s=-5)
    # An approval its dead worker claimed that cannot be loaded: the run cannot be queued again or failed whole.
    store_corrupt(Approval, "exact_args", approval_of(stuck, status=Approval.Status.EXECUTING).pk)

    for _ in range(2):
        with django_capture_on_commit_callbacks(execute=True):
            runs_reconcile()

    assert (fresh(stuck).status, fresh(stuck).error_code) == (Run.Status.FAILED, "worker_lost")
    assert counters() == (0, 0)


# --- 4. the dashboard's API keys ----------------------------------------------------------------------------


def test_the_dashboard_shows_two_keys_of_one_name_apart_by_their_prefix(admin_client) -> None:
    price_house_model()
    scripted_agent()
    prefixes = []
    for runs in (2, 1):
        key, raw = api_key_create(name="default", actor="t", via="tests")
        prefixes.append(key.prefix)
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
        for _ in range(runs):
            run_execute(run_id=submit(client).json()["id"])

    page = admin_client.get("/admin/")

    keys = page.context["dashboard"]["usage"]["keys"]
    assert [(row["name"], row["runs"]) for row in keys] == [
        (f"default ({prefixes[0]}…)", 2),
        (f"default ({prefixes[1]}…)", 1),
    ]
    assert f"default ({prefixes[1]}…)" in page.content.decode()
