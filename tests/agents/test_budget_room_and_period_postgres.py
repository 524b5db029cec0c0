"""A budget's period changed while submissions on it run at once, on PostgreSQL (where transactions really
overlap): the change carries the reservations admitted before it to the new period's counters, and every admission
either committed before it (carried) or reads the new period (it waits for the change on the budget's row). So the
runs in flight never hold more than the limit together, and none is left reserved on the old period's counters."""

from __future__ import annotations

import json

import pytest

from tests.postgres import manage, postgres_url  # noqa: F401 - postgres_url is a fixture

pytestmark = [pytest.mark.postgres]

CHANGE_THE_PERIOD_UNDER_SUBMISSIONS = r"""
import json, threading, uuid
from django.db import connection
from django.utils import timezone
from agent_platform.errors import ApplicationError
from agents.budgets import budget_create, budget_settle, budget_update, period_bounds
from agents.models import Budget, BudgetReservation, BudgetUsage, Run
from agents.services import agent_create, api_key_create, run_submit

tag = uuid.uuid4().hex[:8]
agent = agent_create(actor="test", via="tests", data={"slug": f"pg-period-{tag}", "name": "pg", "model_provider": "offline"})
key, _raw = api_key_create(name=f"period-{tag}", actor="test", via="tests")
budget = budget_create(actor="test", via="tests", data={"api_key": key, "period": "day", "max_tokens": 10000, "run_reservation_tokens": 1000})
for _ in range(3):  # in flight when the period changes, whatever the order of what follows
    run_submit(agent_slug=agent.slug, query="q", api_key=key)
barrier = threading.Barrier(28)
outcomes = []
lock = threading.Lock()

def submit():
    try:
        barrier.wait(timeout=60)
        try:
            run_submit(agent_slug=agent.slug, query="q", api_key=key)
            outcome = "admitted"
        except ApplicationError as exc:
            outcome = exc.code
        with lock:
            outcomes.append(outcome)
    finally:
        connection.close()

def change():
    try:
        barrier.wait(timeout=60)
        budget_update(budget=Budget.objects.get(pk=budget.pk), actor="test", via="tests", data={"period": "month"})
    finally:
        connection.close()

threads = [threading.Thread(target=submit) for _ in range(27)] + [threading.Thread(target=change)]
for t in threads: t.start()
for t in threads: t.join(timeout=300)
month_start = period_bounds("month", timezone.now())[0]
open_rows = sorted(set(BudgetReservation.objects.filter(usage__budget=budget, settled_at__isnull=True).values_list("usage_id", flat=True)))
reserved = {row.pk: row.reserved_tokens for row in BudgetUsage.objects.filter(budget=budget)}
for run_id in Run.objects.filter(api_key=key).values_list("id", flat=True):
    budget_settle(run_id=run_id)
print(json.dumps({
    "admitted": 3 + outcomes.count("admitted"),
    "other": [o for o in outcomes if o not in {"admitted", "budget_exceeded"}],
    "open_rows": len(open_rows),
    "open_row_is_the_months": bool(open_rows) and BudgetUsage.objects.get(pk=open_rows[0]).period_start == month_start,
    "reserved_on_open_row": reserved[open_rows[0]] if open_rows else None,
    "reserved_elsewhere": sum(v for pk, v in reserved.items() if pk not in open_rows),
    "reserved_after_settling": sum(BudgetUsage.objects.filter(budget=budget).values_list("reserved_tokens", flat=True)),
}))
"""


def test_a_period_changed_under_concurrent_submissions_leaves_every_reservation_on_the_new_periods_counters(
    postgres_url: str,  # noqa: F811 - the fixture
) -> None:
    done = manage("shell", "-c", CHANGE_THE_PERIOD_UNDER_SUBMISSIONS, database_url=postgres_url, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {
        "admitted": 10,
        "other": [],
        "open_rows": 1,
        "open_row_is_the_months": True,
        "reserved_on_open_row": 10000,
        "reserved_elsewhere": 0,
        "reserved_after_settling": 0,
    }, result
