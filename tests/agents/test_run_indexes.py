"""How an API key's runs are found (migration ``agents/0019``): the Idempotency-Key lookup of every POST that sends
one, ``GET /runs`` a page at a time and ``GET /usage`` each read their runs from an index that leads with the API
key, never by walking every run of the key and sorting them (a cost per request that grew with the key's
history); and the migration goes back (to the API key's plain index) and forward again, on SQLite and on a real
PostgreSQL cluster, keeping the runs."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from agents.models import Run
from tests.postgres import manage, postgres_url  # noqa: F401 - postgres_url is a fixture

BODY = {"agent": "company-assistant", "query": "김하늘 님은 어느 팀 소속인가요?"}
NEW_INDEXES = {"run_key_idempotency_idx", "run_key_created_idx"}


def _plans_of_run_reads(client: APIClient, method: str, url: str, **kwargs: Any) -> list[str]:
    """The SQLite query plan of each statement that reads ``agents_run`` by its API key during one request."""
    with CaptureQueriesContext(connection) as queries:
        response = getattr(client, method)(url, **kwargs)
    assert response.status_code in (200, 202), response.content
    reads = [
        q["sql"]
        for q in queries.captured_queries
        if q["sql"].startswith("SELECT") and '"agents_run"' in q["sql"] and '"api_key_id" =' in q["sql"]
    ]
    plans = []
    with connection.cursor() as cursor:
        for sql in reads:
            cursor.execute("EXPLAIN QUERY PLAN " + sql)
            plans.append(" | ".join(str(row[-1]) for row in cursor.fetchall()))
    assert plans, [q["sql"] for q in queries.captured_queries]
    return plans


@pytest.fixture
def history(api_client: APIClient, demo_agent: Any) -> APIClient:
    for n in range(25):  # more than a page of GET /runs
        assert (
            api_client.post("/api/v1/runs", BODY, format="json", HTTP_IDEMPOTENCY_KEY=f"earlier-{n}").status_code == 202
        )
    return api_client


@pytest.mark.django_db
def test_an_idempotency_key_is_found_by_its_index(history: APIClient) -> None:
    (plan,) = _plans_of_run_reads(history, "post", "/api/v1/runs", data=BODY, format="json", HTTP_IDEMPOTENCY_KEY="now")
    assert "SEARCH agents_run USING INDEX run_key_idempotency_idx (api_key_id=? AND idempotency_key=?)" in plan, plan
    assert "TEMP B-TREE" not in plan, plan


@pytest.mark.django_db
def test_the_runs_list_reads_each_page_newest_first_from_the_keys_index(history: APIClient) -> None:
    (first,) = _plans_of_run_reads(history, "get", "/api/v1/runs")
    assert "SEARCH agents_run USING INDEX run_key_created_idx (api_key_id=?)" in first, first
    page = history.get("/api/v1/runs").json()
    assert len(page["results"]) == 20 and page["next"]
    (following,) = _plans_of_run_reads(history, "get", page["next"].split("testserver", 1)[1])
    assert "USING INDEX run_key_created_idx (api_key_id=?" in following, following
    for plan in (first, following):
        assert "TEMP B-TREE" not in plan, plan
    second = history.get(page["next"].split("testserver", 1)[1]).json()
    listed = [run["id"] for run in page["results"] + second["results"]]
    assert listed == [str(pk) for pk in Run.objects.order_by("-created_at", "-id").values_list("id", flat=True)]


@pytest.mark.django_db
def test_usage_sums_the_keys_runs_since_a_date_from_the_keys_index(history: APIClient) -> None:
    plans = _plans_of_run_reads(history, "get", "/api/v1/usage")
    by_index = re.compile(
        r"SEARCH agents_run USING (COVERING )?INDEX run_key_created_idx \(api_key_id=\? AND created_at>\?\)"
    )
    assert all(by_index.search(plan) for plan in plans), "\n".join(plans)


def _sqlite_run_indexes() -> dict[str, list[str]]:
    with connection.cursor() as cursor:
        found = connection.introspection.get_constraints(cursor, "agents_run")
    return {name: about["columns"] for name, about in found.items() if about["index"] and not about["unique"]}


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_on_sqlite_the_migration_goes_back_to_the_api_keys_plain_index_and_forward_again(demo_agent: Any) -> None:
    run = Run.objects.create(agent=demo_agent, query="보존")
    forward = _sqlite_run_indexes()
    assert forward["run_key_idempotency_idx"] == ["api_key_id", "idempotency_key", "created_at"]
    assert forward["run_key_created_idx"] == ["api_key_id", "created_at", "id"]
    assert ["api_key_id"] not in forward.values()  # both lead with it
    try:
        call_command("migrate", "agents", "0018", verbosity=0)
        back = _sqlite_run_indexes()
        assert not NEW_INDEXES & set(back) and ["api_key_id"] in back.values(), back
    finally:
        call_command("migrate", "agents", verbosity=0)
    assert _sqlite_run_indexes() == forward
    assert Run.objects.get(pk=run.pk).query == "보존"


PG_MIGRATE = """
import json
from django.core.management import call_command
from django.db import connection
def indexes():
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'agents_run'")
        return {name: definition.split(" USING ")[1] for name, definition in cursor.fetchall()
                if "api_key_id" in definition}
seen = {"forward": indexes()}
call_command("migrate", "agents", "0018", verbosity=0)
seen["back"] = indexes()
call_command("migrate", "agents", verbosity=0)
seen["again"] = indexes()
print(json.dumps(seen))
"""


@pytest.mark.postgres
def test_on_postgresql_the_keys_indexes_replace_its_plain_index_and_the_migration_goes_back_and_forth(
    postgres_url: str,  # noqa: F811 - the fixture
) -> None:
    result = manage("shell", "-c", PG_MIGRATE, database_url=postgres_url)
    assert result.returncode == 0, result.stdout + result.stderr
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    expected = {
        "run_key_idempotency_idx": "btree (api_key_id, idempotency_key, created_at)",
        "run_key_created_idx": "btree (api_key_id, created_at, id)",
    }
    assert seen["forward"] == expected == seen["again"], seen
    assert list(seen["back"].values()) == ["btree (api_key_id)"], seen["back"]
