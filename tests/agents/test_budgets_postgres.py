"""The budget reservation on PostgreSQL, where concurrent transactions really overlap (SQLite serializes them):
50 threads of one platform process submit runs on one key at once; the conditional update admits exactly as many
runs as the budget holds reservations."""

from __future__ import annotations

import json

import pytest

from tests.postgres import manage, postgres_url  # noqa: F401 - postgres_url is a fixture

pytestmark = [pytest.mark.postgres]

SUBMIT_50_AT_ONCE = r"""
import json, threading, uuid
from django.db import connection
from agent_platform.errors import ApplicationError
from agents.budgets import budget_create
from agents.models import BudgetUsage, Run
from agents.services import agent_create, api_key_create, run_submit

tag = uuid.uuid4().hex[:8]
agent = agent_create(actor="test", via="tests", data={"slug": f"pg-budget-{tag}", "name": "pg", "model_provider": "offline"})
key, _raw = api_key_create(name=f"busy-{tag}", actor="test", via="tests")
budget = budget_create(actor="test", via="tests", data={"api_key": key, "period": "day", "max_tokens": 7000, "run_reservation_tokens": 1000})
barrier = threading.Barrier(50)
outcomes = []
lock = threading.Lock()

def one():
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

threads = [threading.Thread(target=one) for _ in range(50)]
for t in threads: t.start()
for t in threads: t.join(timeout=300)
usage = BudgetUsage.objects.get(budget=budget)
print(json.dumps({
    "admitted": outcomes.count("admitted"),
    "refused": outcomes.count("budget_exceeded"),
    "other": [o for o in outcomes if o not in {"admitted", "budget_exceeded"}],
    "runs": Run.objects.filter(api_key=key).count(),
    "reserved": usage.reserved_tokens,
}))
"""


def test_fifty_concurrent_submissions_on_postgres_admit_exactly_what_the_budget_holds(
    postgres_url: str,  # noqa: F811 - the fixture
) -> None:
    done = manage("shell", "-c", SUBMIT_50_AT_ONCE, database_url=postgres_url, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"admitted": 7, "refused": 43, "other": [], "runs": 7, "reserved": 7000}, result


# Half the submissions with an Idempotency-Key (as A2A and the MCP endpoint always send one), half without.
SUBMIT_40_MIXED = (
    SUBMIT_50_AT_ONCE.replace("threading.Barrier(50)", "threading.Barrier(40)")
    .replace("range(50)", "range(40)")
    .replace("def one():", "def one(i):")
    .replace(
        'run_submit(agent_slug=agent.slug, query="q", api_key=key)',
        "run_submit(agent_slug=agent.slug, query=\"q\", api_key=key, idempotency_key=f'k{i}' if i % 2 else '')",
    )
    .replace(
        "except ApplicationError as exc:\n            outcome = exc.code",
        "except ApplicationError as exc:\n            outcome = exc.code\n        except Exception as exc:\n            outcome = type(exc).__name__",
    )
    .replace("threading.Thread(target=one)", "threading.Thread(target=one, args=(i,))")
    .replace("for _ in range(40)", "for i in range(40)")
)


def test_submissions_with_and_without_an_idempotency_key_on_one_budgeted_key_do_not_deadlock(
    postgres_url: str,  # noqa: F811 - the fixture
) -> None:
    """The keyed submission locked the key's row FOR UPDATE, then waited for the budget's row; the unkeyed one held
    the budget's row and took the key-share lock of its run's deferred foreign key at commit: a deadlock, answered
    as a 503 "database not available" for most of the requests."""
    assert "idempotency_key=f'k{i}'" in SUBMIT_40_MIXED and "args=(i,)" in SUBMIT_40_MIXED
    done = manage("shell", "-c", SUBMIT_40_MIXED, database_url=postgres_url, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"admitted": 7, "refused": 33, "other": [], "runs": 7, "reserved": 7000}, result
