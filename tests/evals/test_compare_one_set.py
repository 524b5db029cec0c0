"""Only eval runs of one set are compared (review defect: runs of two sets were paired by case key, and
``case-001`` is in every set imported without keys, so unrelated questions lined up as "changed"): the API answers
400 ``eval_runs_not_comparable``, the admin's action and comparison page say so; rows pair a case with itself."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from agents.models import Agent
from agents.services import api_key_create
from evals.models import EvalCase, EvalCaseResult, EvalRun, EvalSet
from evals.services import eval_run_compare, eval_set_apply

pytestmark = pytest.mark.django_db

NOT_COMPARABLE = "Only eval runs of the same eval set can be compared: &#x27;leave&#x27; and &#x27;assets&#x27;"


def _run_of(eval_set: EvalSet, agent: Agent, *, passed: bool) -> EvalRun:
    eval_run = EvalRun.objects.create(eval_set=eval_set, agent=agent, total=1)
    for case in eval_set.cases.all():
        EvalCaseResult.objects.create(
            eval_run=eval_run, case=case, scored=True, passed=passed, scores={"failed_checks": []}
        )
    return eval_run


@pytest.fixture
def two_sets() -> tuple[EvalRun, EvalRun]:
    """Two sets imported without keys: each has a ``case-001``, asking another question."""
    agent = Agent.objects.create(slug="a", name="a")
    leave = eval_set_apply(document={"name": "leave", "cases": [{"query": "연차는 며칠?"}]}, actor="t", via="tests")
    assets = eval_set_apply(document={"name": "assets", "cases": [{"query": "A-1001 상태?"}]}, actor="t", via="tests")
    assert {c.key for c in EvalCase.objects.all()} == {"case-001"}
    return _run_of(leave.eval_set, agent, passed=True), _run_of(assets.eval_set, agent, passed=False)


def test_the_api_refuses_to_compare_eval_runs_of_two_sets(two_sets: tuple[EvalRun, EvalRun]) -> None:
    a, b = two_sets
    _key, raw = api_key_create(actor="test", via="tests", name="ops", admin=True)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    response = client.get(f"/api/v1/evals/runs/{a.pk}/compare/{b.pk}")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "eval_runs_not_comparable"
    assert "'leave' and 'assets' are two sets" in error["message"]


def test_the_admin_says_so_instead_of_lining_up_other_questions(
    admin_client: Client, two_sets: tuple[EvalRun, EvalRun]
) -> None:
    a, b = two_sets
    action = admin_client.post(
        reverse("admin:evals_evalrun_changelist"),
        {"action": "compare", "_selected_action": [a.pk, b.pk]},
        follow=True,
    )
    changelist = reverse("admin:evals_evalrun_changelist")
    assert action.redirect_chain == [(changelist, 302)]  # back to the list, not to the comparison
    assert NOT_COMPARABLE in action.content.decode()
    page = admin_client.get(f"{reverse('admin:evals_evalrun_compare')}?a={a.pk}&b={b.pk}", follow=True)
    assert page.redirect_chain == [(changelist, 302)]
    assert NOT_COMPARABLE in page.content.decode()


def test_rows_pair_a_case_with_itself() -> None:
    agent = Agent.objects.create(slug="a", name="a")
    document = {"name": "s", "cases": [{"key": "k1", "query": "첫째"}, {"key": "k2", "query": "둘째"}]}
    eval_set = eval_set_apply(document=document, actor="t", via="tests").eval_set
    a, b = _run_of(eval_set, agent, passed=True), _run_of(eval_set, agent, passed=True)
    rows = eval_run_compare(a=a, b=b)
    assert [(r.a.case_id, r.b.case_id) for r in rows if r.a and r.b] == [(c.pk, c.pk) for c in eval_set.cases.all()]
