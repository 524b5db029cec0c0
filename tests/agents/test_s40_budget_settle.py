"""Settling a run's budgets beside admissions on the same budgets, on PostgreSQL (where transactions really
overlap), after an admin changed one budget's period (which rewrites the reservations it carries, and so their
order in the table): the settlement locks the budgets' counters in the order an admission does (by budget), so
neither waits for a row the other holds while holding one it needs ("deadlock detected", which threw a finished
run's result away). And a refusal's words: the reset time in the reader's time zone, and how long runs parked
awaiting approval hold a budget's room."""

from __future__ import annotations

import datetime as dt
import json
import math
import zoneinfo

import pytest
from django.test import override_settings
from django.utils import timezone

from agents.budgets import IN_FLIGHT_RETRY_AFTER_S, REFUSED_RUNS_IN_FLIGHT, REFUSED_USED_UP, budget_create
from agents.models import Approval, BudgetUsage, Run
from tests.agents.test_approvals import notes, park, writer  # noqa: F401 - fixtures
from tests.agents.test_budgets import scripted_agent, submit
from tests.postgres import manage, postgres_url  # noqa: F401 - postgres_url is a fixture

SETTLE_BESIDE_AN_ADMISSION = r"""
import json, threading, time, uuid
from django.db import connection, transaction
from agents.budgets import budget_create, budget_settle, budget_update
from agents.models import Budget, BudgetReservation, BudgetUsage, Run
from agents.services import agent_create, api_key_create, run_submit

tag = uuid.uuid4().hex[:8]
agent = agent_create(actor="test", via="tests", data={"slug": f"pg-settle-{tag}", "name": "pg", "model_provider": "offline"})
key, _raw = api_key_create(name=f"settle-{tag}", actor="test", via="tests")
other_key, _raw = api_key_create(name=f"other-{tag}", actor="test", via="tests")
limits = {"period": "day", "max_tokens": 100000, "run_reservation_tokens": 1000}
agents_budget = budget_create(actor="test", via="tests", data={"agent": agent, **limits})
keys_budget = budget_create(actor="test", via="tests", data={"api_key": key, **limits})
finished = run_submit(agent_slug=agent.slug, query="q", api_key=key).run
# An admin changes the agent's budget's period while the run is in flight: its reservation there is carried.
budget_update(budget=Budget.objects.get(pk=agents_budget.pk), actor="test", via="tests", data={"period": "month"})
table_order = list(BudgetReservation.objects.filter(run_id=finished.pk).values_list("usage__budget_id", flat=True))
errors = []
admitted = []
settled = []
holds_the_agents_counters = threading.Event()

def admit():
    # An admission of two runs in one transaction: the first reserves on the agent's budget alone (a key without a
    # budget), so this transaction holds the agent's counters while the settlement starts; the second wants the
    # key's counters too, as any admission on both budgets does after it has taken the agent's.
    try:
        with transaction.atomic():
            admitted.append(str(run_submit(agent_slug=agent.slug, query="q", api_key=other_key).run.id))
            holds_the_agents_counters.set()
            deadline = time.monotonic() + 20
            with connection.cursor() as cursor:
                while time.monotonic() < deadline:
                    cursor.execute("SELECT pg_stat_clear_snapshot()")  # else read once per transaction
                    cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()")
                    if cursor.fetchone()[0]:
                        break
                    time.sleep(0.02)
            admitted.append(str(run_submit(agent_slug=agent.slug, query="q", api_key=key).run.id))
    except Exception as exc:
        errors.append("admission: " + type(exc).__name__ + ": " + str(exc).splitlines()[0])
    finally:
        connection.close()

def settle():
    try:
        holds_the_agents_counters.wait(timeout=20)
        settled.append(budget_settle(run_id=finished.pk))
    except Exception as exc:
        errors.append("settlement: " + type(exc).__name__ + ": " + str(exc).splitlines()[0])
    finally:
        connection.close()

threads = [threading.Thread(target=admit), threading.Thread(target=settle)]
for t in threads: t.start()
for t in threads: t.join(timeout=120)
print(json.dumps({
    "keys_reservation_first_in_the_table": table_order[0] == keys_budget.pk,
    "errors": errors,
    "admitted": len(admitted),
    "settled": settled,
    "reserved": {
        "agent": sum(BudgetUsage.objects.filter(budget=agents_budget).values_list("reserved_tokens", flat=True)),
        "key": sum(BudgetUsage.objects.filter(budget=keys_budget).values_list("reserved_tokens", flat=True)),
    },
}))
"""


@pytest.mark.postgres
@pytest.mark.slow
def test_a_settlement_beside_an_admission_after_a_period_change_locks_the_counters_in_budget_order(
    postgres_url: str,  # noqa: F811 - the fixture
) -> None:
    done = manage("shell", "-c", SETTLE_BESIDE_AN_ADMISSION, database_url=postgres_url, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {
        # The case at hand: the carried reservation now comes after the key's in the table.
        "keys_reservation_first_in_the_table": True,
        "errors": [],
        "admitted": 2,
        "settled": [2],
        # The two runs admitted: both on the agent's budget, one on the key's.
        "reserved": {"agent": 2000, "key": 1000},
    }, result


# --- a refusal's words ------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_used_up_budget_tells_its_reset_in_the_readers_time_zone_and_keeps_the_iso_value_in_its_fields(
    api_client, api_caller
) -> None:
    scripted_agent()
    budget = budget_create(
        actor="test-admin",
        via="tests",
        data={"api_key": api_caller.key, "period": "day", "max_tokens": 1000, "run_reservation_tokens": 500},
    )
    assert submit(api_client).status_code == 202
    BudgetUsage.objects.filter(budget=budget).update(used_tokens=1000)  # the limit reached
    with timezone.override("Asia/Seoul"):
        refused = api_client.post(
            "/api/v1/runs", {"agent": "budgeted", "query": "질문"}, format="json", HTTP_ACCEPT_LANGUAGE="ko"
        )
    error = refused.json()["error"]
    assert (refused.status_code, error["fields"]["reason"]) == (429, REFUSED_USED_UP)
    resets_at = error["fields"]["resets_at"]
    assert resets_at.endswith("T00:00:00+00:00")  # the period's end, midnight UTC, for machines
    reset_day = dt.datetime.fromisoformat(resets_at).astimezone(zoneinfo.ZoneInfo("Asia/Seoul"))
    assert f"{reset_day:%Y-%m-%d} 09:00 KST에 초기화됩니다" in error["message"], error["message"]
    assert "+00:00" not in error["message"]


@pytest.mark.django_db
@pytest.mark.slow
def test_room_held_only_by_runs_awaiting_approval_says_so_and_asks_to_retry_when_the_first_approval_expires(
    writer,  # noqa: F811 - the fixture
) -> None:
    first, client = writer
    Run.objects.filter(pk=first.pk).delete()  # not admitted through the budget: the runs below are
    budget_create(
        actor="test-admin",
        via="tests",
        data={"agent": first.agent, "period": "month", "max_tokens": 40_000, "run_reservation_tokens": 20_000},
    )

    def submit_note() -> object:
        return client.post("/api/v1/runs", {"agent": "notes", "query": "회의록을 저장해줘"}, format="json")

    admitted = [Run.objects.get(pk=submit_note().json()["id"]) for _ in range(2)]
    park(admitted[0])
    refused = submit_note()
    error = refused.json()["error"]
    # One of them runs still (queued): it ends within seconds.
    assert (refused.status_code, error["fields"]["reason"]) == (429, REFUSED_RUNS_IN_FLIGHT)
    assert int(refused["Retry-After"]) == IN_FLIGHT_RETRY_AFTER_S
    assert "runs in flight" in error["message"]

    with override_settings(PLATFORM_APPROVAL_TTL_S=600):
        soonest = park(admitted[1])
    refused = submit_note()
    error = refused.json()["error"]
    assert (refused.status_code, error["fields"]["reason"]) == (429, REFUSED_RUNS_IN_FLIGHT)
    assert "awaiting approval" in error["message"], error["message"]
    wait = (soonest.expires_at - timezone.now()).total_seconds()
    assert wait - 5 <= int(refused["Retry-After"]) <= math.ceil(wait)
    assert Approval.objects.filter(run__in=admitted, status=Approval.Status.PENDING).count() == 2
