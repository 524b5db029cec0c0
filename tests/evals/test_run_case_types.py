"""An eval run's page and the comparison of two eval runs name each case's type as the eval set's page does, with
its code beneath it, whole (reviewer's defect 4: the code alone, ``single_tool``, wrapped as single_/tool), and
the type the eval run asked (the case's snapshot), not the case as edited since."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from agents.models import Agent
from evals.admin import CASE_TYPE_LABELS
from evals.labels import CASE_TYPE_NAMES
from evals.models import CASE_TYPES, EvalCaseResult, EvalRun, EvalSet
from evals.services import eval_case_create, eval_set_create

pytestmark = pytest.mark.django_db

STEMS = {kind: str(name) for kind, name in CASE_TYPE_NAMES.items()}


@pytest.fixture
def eval_set() -> EvalSet:
    agent = Agent.objects.create(slug="a", name="a")
    return eval_set_create(actor="test", via="tests", data={"name": "s", "agent": agent})


def type_cells(html: str) -> list[str]:
    return [re.sub(r"\s+", " ", cell) for cell in re.findall(r'<span class="eval-check">(.*?)</span>', html, re.S)]


def test_the_words_are_the_eval_set_pages() -> None:
    assert set(STEMS) == set(CASE_TYPES)
    for kind, stem in STEMS.items():
        assert str(CASE_TYPE_LABELS[kind]) == f"{stem} ({kind})"


def test_each_type_is_named_with_its_code_beneath_on_the_run_and_compare_pages(
    admin_client: Client, eval_set: EvalSet
) -> None:
    a = EvalRun.objects.create(eval_set=eval_set, agent=eval_set.agent, total=len(CASE_TYPES))
    b = EvalRun.objects.create(eval_set=eval_set, agent=eval_set.agent, total=len(CASE_TYPES))
    for order, kind in enumerate(CASE_TYPES):
        case = eval_case_create(
            actor="test",
            via="tests",
            data={"eval_set": eval_set, "key": kind, "order": order, "query": "q", "case_type": kind},
        )
        for eval_run in (a, b):
            EvalCaseResult.objects.create(eval_run=eval_run, case=case)
    expected = [f'{STEMS[kind]} <code class="eval-code">{kind}</code>' for kind in CASE_TYPES]
    assert type_cells(admin_client.get(f"/admin/evals/evalrun/{a.pk}/change/").content.decode()) == expected
    compared = admin_client.get(f"/admin/evals/evalrun/compare/?a={a.pk}&b={b.pk}").content.decode()
    assert sorted(type_cells(compared)) == sorted(expected)


def test_the_type_shown_is_the_one_the_eval_run_asked(admin_client: Client, eval_set: EvalSet) -> None:
    case = eval_case_create(
        actor="test", via="tests", data={"eval_set": eval_set, "key": "k", "query": "q", "case_type": "no_tool"}
    )
    eval_run = EvalRun.objects.create(eval_set=eval_set, agent=eval_set.agent, total=1)
    EvalCaseResult.objects.create(eval_run=eval_run, case=case, case_snapshot={"case_type": "single_tool"})
    html = admin_client.get(f"/admin/evals/evalrun/{eval_run.pk}/change/").content.decode()
    assert type_cells(html) == ['one tool <code class="eval-code">single_tool</code>']


def test_a_type_written_before_the_list_is_shown_as_its_code(admin_client: Client, eval_set: EvalSet) -> None:
    case = eval_case_create(actor="test", via="tests", data={"eval_set": eval_set, "key": "k", "query": "q"})
    eval_run = EvalRun.objects.create(eval_set=eval_set, agent=eval_set.agent, total=1)
    EvalCaseResult.objects.create(eval_run=eval_run, case=case, case_snapshot={"case_type": "legacy_kind"})
    html = admin_client.get(f"/admin/evals/evalrun/{eval_run.pk}/change/").content.decode()
    assert type_cells(html) == ['<code class="eval-code">legacy_kind</code>']
