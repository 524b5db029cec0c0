"""The eval sets' lists (the admin's and ``GET /api/v1/evals/sets``) read each set's agent and case count with the
sets: the number of queries does not grow with the number of sets."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from agents.models import Agent
from agents.services import api_key_create
from evals.services import eval_case_create, eval_set_create

pytestmark = pytest.mark.django_db


def _sets(count: int, *, start: int = 0) -> None:
    for i in range(start, start + count):
        agent = Agent.objects.create(slug=f"agent-{i}", name=f"비서 {i}")
        eval_set = eval_set_create(actor="test", via="tests", data={"name": f"set-{i}", "agent": agent})
        for key in ("a", "b"):
            eval_case_create(
                actor="test",
                via="tests",
                data={"eval_set": eval_set, "key": key, "query": "질문", "case_type": "no_tool"},
            )


def _queries(read: Any) -> int:
    with CaptureQueriesContext(connection) as captured:
        response = read()
    assert response.status_code == 200
    return len(captured.captured_queries)


def test_the_admins_eval_set_list_reads_agents_and_case_counts_with_the_sets(admin_client: Client) -> None:
    _sets(2)
    read = lambda: admin_client.get("/admin/evals/evalset/")  # noqa: E731
    few = _queries(read)
    _sets(4, start=2)
    many = _queries(read)
    assert many == few
    page = read().content.decode()
    assert "agent-5" in page
    assert '<td class="field-case_count">2</td>' in page


def test_the_apis_eval_set_list_reads_case_counts_with_the_sets(db: Any) -> None:
    _key, raw = api_key_create(actor="test", via="tests", name="ops", admin=True)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    _sets(2)
    read = lambda: client.get("/api/v1/evals/sets")  # noqa: E731
    read()  # the key's first use writes when it was last used: not what is counted
    few = _queries(read)
    _sets(4, start=2)
    many = _queries(read)
    assert many == few
    assert [s["cases"] for s in read().json()["results"]] == [2] * 6
