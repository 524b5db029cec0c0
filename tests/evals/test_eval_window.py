"""Defect 5: an eval started from the admin or the API created and queued a run for every case at once on the
live queue (only ``run_eval`` kept a window), and ``GET /evals/runs/{id}`` answered every case in one body.

Now every eval run keeps at most its window of cases in flight (``PLATFORM_EVAL_WINDOW``, or ``run_eval
--workers``), the background refresh topping it up, and the detail pages its cases.
"""

from __future__ import annotations

import base64
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from agents.execution import run_execute
from agents.models import Agent, Run
from agents.services import api_key_create
from evals.models import EvalCaseResult, EvalRun, EvalSet
from evals.services import eval_run_start, eval_runs_refresh_open, eval_set_apply
from tests.evals.conftest import bind_stock_server, scripted_agent

pytestmark = pytest.mark.django_db(transaction=True)

CASES = 5


@pytest.fixture
def agent(settings: Any) -> Agent:
    settings.PLATFORM_EVAL_WINDOW = 2
    server = bind_stock_server(settings)
    return scripted_agent(slug="stock-agent", server=server, script=[{"content": "네"}])


@pytest.fixture
def eval_set(agent: Agent) -> EvalSet:
    cases = [
        {"key": f"case-{i}", "query": f"질문 {i}", "type": "no_tool", "forbidden_tools": ["*"]} for i in range(CASES)
    ]
    document = {"name": "questions", "agent": agent.slug, "cases": cases}
    return eval_set_apply(document=document, actor="test", via="tests").eval_set


@pytest.fixture
def admin_key() -> APIClient:
    _key, raw = api_key_create(actor="test", via="tests", name="ops", admin=True)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def in_flight(eval_run: EvalRun) -> list[Run]:
    return list(Run.objects.filter(eval_results__eval_run=eval_run, status=Run.Status.QUEUED))


def finish_in_the_background(eval_run: EvalRun, *, window: int) -> EvalRun:
    """What the workers and their timers do: each pass finds at most ``window`` cases in flight."""
    for _round in range(CASES + 1):
        queued = in_flight(eval_run)
        waiting = EvalCaseResult.objects.filter(eval_run=eval_run, scored=False).count()
        assert len(queued) == min(window, waiting)  # topped up to the window, never past it
        for run in queued:
            run_execute(run_id=str(run.id))
        if eval_runs_refresh_open():
            eval_run.refresh_from_db()
            return eval_run
    raise AssertionError("the eval run did not end")


def test_an_eval_started_through_the_api_keeps_the_default_window_in_flight(admin_key: APIClient, eval_set: EvalSet):
    started = admin_key.post("/api/v1/evals/runs", {"set": eval_set.name}, format="json")
    assert started.status_code == 202, started.content
    eval_run = EvalRun.objects.get(pk=started.json()["id"])
    assert len(in_flight(eval_run)) == 2
    assert Run.objects.filter(eval_results__eval_run=eval_run).count() == 2

    eval_run = finish_in_the_background(eval_run, window=2)
    assert (eval_run.done, eval_run.summary["passed"]) == (CASES, CASES)


def test_an_eval_started_from_the_admin_keeps_the_default_window_in_flight(admin_client: Client, eval_set: EvalSet):
    response = admin_client.post(
        reverse("admin:evals_evalset_changelist"), {"action": "run_against_agent", "_selected_action": [eval_set.pk]}
    )
    assert response.status_code == 302
    eval_run = EvalRun.objects.get()
    assert len(in_flight(eval_run)) == 2
    assert finish_in_the_background(eval_run, window=2).status == EvalRun.Status.FINISHED


def test_the_background_refresh_keeps_a_run_evals_own_window(eval_set: EvalSet, agent: Agent) -> None:
    eval_run = eval_run_start(eval_set=eval_set, agent=agent, actor="system:run_eval", window=3)  # --workers 3
    assert len(in_flight(eval_run)) == 3
    assert finish_in_the_background(eval_run, window=3).status == EvalRun.Status.FINISHED


def test_an_eval_runs_cases_are_read_a_page_at_a_time(admin_key: APIClient, eval_set: EvalSet, agent: Agent) -> None:
    eval_run = eval_run_start(eval_set=eval_set, agent=agent, actor="test")
    url = f"/api/v1/evals/runs/{eval_run.id}"

    whole = admin_key.get(url).json()  # as before: no parameter, every case of a set up to 100 of them
    assert [c["case"] for c in whole["cases"]] == [f"case-{i}" for i in range(CASES)]
    assert whole["cases_next"] is None

    keys: list[str] = []
    page = admin_key.get(url, {"page_size": 2}).json()
    pages = 1
    while True:
        assert len(page["cases"]) <= 2 and page["progress"] == {"done": 0, "total": CASES}
        keys += [c["case"] for c in page["cases"]]
        if page["cases_next"] is None:
            break
        page = admin_key.get(page["cases_next"]).json()
        pages += 1
    assert (pages, keys) == (3, [f"case-{i}" for i in range(CASES)])


@pytest.mark.parametrize(
    "params",
    [
        {"cursor": "not-a-cursor"},
        {"cursor": base64.urlsafe_b64encode(b"x|1").decode()},
        {"page_size": 0},
        {"page_size": 101},
        {"limit": 2},
    ],
)
def test_a_bad_page_of_an_eval_runs_cases_is_a_400(
    admin_key: APIClient, eval_set: EvalSet, agent: Agent, params: dict[str, Any]
) -> None:
    eval_run = eval_run_start(eval_set=eval_set, agent=agent, actor="test")
    refused = admin_key.get(f"/api/v1/evals/runs/{eval_run.id}", params)
    assert refused.status_code == 400, refused.content
    assert refused.json()["error"]["fields"]


def test_an_eval_of_an_agent_never_published_is_refused_in_the_admin_to_who_may_not_publish(eval_set: EvalSet) -> None:
    """Its eval would freeze the draft as a version: a publish, which the agent's own page allows only to who may
    change agents. Who may only run evals is told so, and nothing is made."""
    from django.contrib.auth.models import Permission

    from agents.models import AgentVersion
    from audit.roles import user_create

    evaluator = user_create(actor="test", via="tests", username="evaluator", password="pw-1234-xyz!", is_staff=True)
    evaluator.user_permissions.add(
        *Permission.objects.filter(codename__in=["view_evalset", "add_evalrun", "view_evalrun"])
    )
    client = Client()
    client.force_login(evaluator)
    response = client.post(
        reverse("admin:evals_evalset_changelist"),
        {"action": "run_against_agent", "_selected_action": [eval_set.pk]},
        follow=True,
    )
    assert "was never published" in response.content.decode()
    assert not EvalRun.objects.exists() and not AgentVersion.objects.exists()
