"""``/api/v1/evals/``: admin keys only; sets and runs; bad input is a 4xx, never a 500."""

from __future__ import annotations

import json
from typing import Any

import pytest
from rest_framework.test import APIClient

from agents.execution import run_execute
from agents.models import Run
from agents.services import api_key_create
from evals.models import EvalSet
from tests.conftest import ApiCaller
from tests.evals.conftest import SEED_SET, company_assistant


@pytest.fixture
def admin_key_client(db: Any) -> APIClient:
    _key, raw = api_key_create(actor="test", via="tests", name="ops", admin=True)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def _seed_set_document() -> dict[str, Any]:
    return json.loads(SEED_SET.read_text(encoding="utf-8"))["eval_sets"][0]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("method", "url"),
    [
        ("get", "/api/v1/evals/sets"),
        ("post", "/api/v1/evals/sets"),
        ("get", "/api/v1/evals/runs"),
        ("post", "/api/v1/evals/runs"),
        ("get", "/api/v1/evals/runs/00000000-0000-0000-0000-000000000000"),
    ],
)
def test_a_callers_key_is_refused_and_no_key_is_unauthenticated(
    method: str, url: str, api_client: APIClient, api_caller: ApiCaller
) -> None:
    refused = getattr(api_client, method)(url, {}, format="json")
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "permission_denied"
    anonymous = getattr(APIClient(), method)(url, {}, format="json")
    assert anonymous.status_code == 401


@pytest.mark.django_db
def test_an_admin_key_posts_a_set_in_the_seeds_notation_and_reads_it_back(admin_key_client: APIClient) -> None:
    document = {**_seed_set_document(), "agent": None}
    created = admin_key_client.post("/api/v1/evals/sets", document, format="json")
    assert created.status_code == 201, created.content
    body = created.json()
    assert body["cases"][2]["forbidden_tools"] == ["*"]
    assert "김하늘" in created.content.decode("utf-8")  # Korean as is, not \\u escapes
    again = admin_key_client.post("/api/v1/evals/sets", document, format="json")
    assert again.status_code == 200
    listed = admin_key_client.get("/api/v1/evals/sets").json()["results"]
    assert [(s["name"], s["cases"]) for s in listed] == [("seed-001-tools", 5)]
    assert admin_key_client.get("/api/v1/evals/sets/seed-001-tools").json()["cases"][0]["key"] == "employee-team"
    assert admin_key_client.get("/api/v1/evals/sets/nope").status_code == 404


@pytest.mark.django_db
@pytest.mark.parametrize(
    "body",
    [
        [1, 2],
        {"cases": []},
        {"name": "bad name!", "cases": [{"query": "q"}]},
        {"name": "x", "cases": [{"query": "q", "expected_source": 5}]},
        {"name": "x", "cases": ["not a case"]},
        {"name": "x", "thresholds": {"recall": "high"}, "cases": [{"query": "q"}]},
        {"name": "x", "thresholds": {"recall": 7}, "cases": [{"query": "q"}]},
        {"name": "x", "cases": [{"query": "q", "answer_checks": [{"regex": "("}]}]},
        {"name": "x", "cases": [{"query": "q", "expected_tools": [{"nme": "t"}]}]},
        {"name": "x", "agent": "nobody", "cases": [{"query": "q"}]},
        # Longer than any caller may send (PLATFORM_RUN_QUERY_MAX_CHARS): its runs would skip that limit.
        {"name": "x", "cases": [{"query": "질문" * 4001}]},
    ],
)
def test_a_bad_set_is_a_400_naming_the_problem(admin_key_client: APIClient, body: Any) -> None:
    response = admin_key_client.post("/api/v1/evals/sets", body, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["error"]["message"]
    assert not EvalSet.objects.filter(name="x").exists()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_an_admin_key_runs_a_set_and_reads_its_scores(admin_key_client: APIClient) -> None:
    company_assistant()
    assert admin_key_client.post("/api/v1/evals/sets", _seed_set_document(), format="json").status_code == 201

    assert admin_key_client.post("/api/v1/evals/runs", {"set": "nope"}, format="json").status_code == 404
    assert admin_key_client.post("/api/v1/evals/runs", {"set": 5}, format="json").status_code == 400
    assert (
        admin_key_client.post("/api/v1/evals/runs", {"set": "seed-001-tools", "extra": 1}, format="json").status_code
        == 400
    )
    versioned = admin_key_client.post("/api/v1/evals/runs", {"set": "seed-001-tools", "version": 2}, format="json")
    assert versioned.status_code == 404 and versioned.json()["error"]["code"] == "version_not_found"

    started = admin_key_client.post("/api/v1/evals/runs", {"set": "seed-001-tools", "label": "baseline"}, format="json")
    assert started.status_code == 202, started.content
    eval_run_id = started.json()["id"]
    assert started.json()["progress"] == {"done": 0, "total": 5}
    runs = Run.objects.filter(eval_results__eval_run_id=eval_run_id)
    assert runs.count() == 4  # PLATFORM_EVAL_WINDOW's cases in flight; the fifth waits for one of them to end
    for _pass in range(2):
        for run in runs.filter(status=Run.Status.QUEUED):  # what a worker does with each queued run
            run_execute(run_id=str(run.id))
        detail = admin_key_client.get(f"/api/v1/evals/runs/{eval_run_id}").json()  # scored, the next submitted
    assert {r.purpose for r in runs} == {"eval"}
    assert detail["status"] == "finished" and detail["progress"] == {"done": 5, "total": 5}
    assert detail["summary"]["passed"] == 4 and detail["passed"] is True
    assert {c["case"]: c["passed"] for c in detail["cases"]}["team-projects"] is False
    listed = admin_key_client.get("/api/v1/evals/runs?set=seed-001-tools").json()["results"]
    assert [r["id"] for r in listed] == [eval_run_id]
    compared = admin_key_client.get(f"/api/v1/evals/runs/{eval_run_id}/compare/{eval_run_id}").json()
    assert compared["changed"] == 0 and len(compared["cases"]) == 5
    assert admin_key_client.get("/api/v1/evals/runs/not-a-uuid").status_code == 404


@pytest.mark.django_db
def test_the_eval_runs_filters_are_checked_as_the_runs_apis_are(admin_key_client: APIClient) -> None:
    """A misspelt or unknown filter is a 400 naming it, not silently ignored (which answered every run)."""
    refused = admin_key_client.get("/api/v1/evals/runs?limit=abc")
    assert refused.status_code == 400
    assert "limit" in json.dumps(refused.json())
    assert admin_key_client.get("/api/v1/evals/runs?set=").status_code == 200


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("method", "url"),
    [
        ("get", "/api/v1/evals/sets?verbose=1"),
        ("post", "/api/v1/evals/sets?dry_run=1"),
        ("get", "/api/v1/evals/sets/seed-001-tools?format=yaml"),
        ("post", "/api/v1/evals/runs?wait=30"),
        ("get", "/api/v1/evals/runs/0/compare/1?x=1"),
    ],
)
def test_a_query_parameter_an_eval_endpoint_does_not_take_is_a_400_naming_it(
    admin_key_client: APIClient, method: str, url: str
) -> None:
    """Ignored, ``?dry_run=1`` on a set's POST replaced the set, and ``?wait=30`` answered at once."""
    sets_before = EvalSet.objects.count()
    body = {"name": "x", "set": "x"} if method == "post" else None
    answer = getattr(admin_key_client, method)(url, body, format="json")
    assert answer.status_code == 400, answer.content
    error = answer.json()["error"]
    name = url.partition("?")[2].partition("=")[0]
    assert (error["code"], list(error["fields"])) == ("invalid_input", [name])
    assert "This endpoint takes no query parameters." in error["message"]
    assert EvalSet.objects.count() == sets_before
