"""Defect of the eval set page (forms2): a case key typed decomposed (NFD, Korean from macOS) equal to another key
composed passed the formset's uniqueness check on the text as typed, then the service composed it and its check
failed inside the save: a server error. Now the form composes what the service stores, and a refusal by the
service while the cases are saved is told on the page, with nothing saved."""

from __future__ import annotations

import unicodedata
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.test import Client

from agents.models import Agent
from audit.models import AuditEvent
from evals.models import EvalCase, EvalSet
from evals.services import eval_case_create, eval_set_create

pytestmark = pytest.mark.django_db


def nfd(text: str) -> str:
    return unicodedata.normalize("NFD", text)


def case_rows(*rows: dict[str, str], initial: int = 0) -> dict[str, str]:
    data = {"cases-TOTAL_FORMS": str(len(rows)), "cases-INITIAL_FORMS": str(initial)}
    for i, row in enumerate(rows):
        fields = {"order": str(i), "case_type": "no_tool", "query": "질문", "forbidden_tools": "[]"}
        fields.update({"expected_tools": "[]", "answer_checks": "[]", "alternatives": "[]"})
        fields.update({"context": "{}", "data": "[]", **row})
        data.update({f"cases-{i}-{name}": value for name, value in fields.items()})
    return data


def a_set() -> tuple[EvalSet, Agent]:
    agent = Agent.objects.create(slug="a", name="a")
    return eval_set_create(actor="test", via="tests", data={"name": "s", "agent": agent}), agent


@pytest.fixture
def refused_by_the_form(monkeypatch: pytest.MonkeyPatch) -> None:
    """The form refuses the row itself: no case service is asked (the backstop below is not what refuses it)."""
    import evals.admin

    def not_asked(**kwargs: Any) -> None:
        raise AssertionError("the form let the row through")

    monkeypatch.setattr(evals.admin, "eval_case_create", not_asked)
    monkeypatch.setattr(evals.admin, "eval_case_update", not_asked)


@pytest.mark.usefixtures("refused_by_the_form")
def test_a_key_typed_decomposed_that_another_case_holds_composed_is_refused_at_its_field(admin_client: Client) -> None:
    eval_set, agent = a_set()
    held = eval_case_create(actor="test", via="tests", data={"eval_set": eval_set, "key": "휴가", "query": "?"})
    data = {"name": "s", "agent": agent.pk, "thresholds": "{}"}
    data.update(
        case_rows(
            {"id": str(held.pk), "eval_set": str(eval_set.pk), "key": "휴가", "query": "?"},
            {"key": nfd("휴가")},
            initial=1,
        )
    )
    page = admin_client.post(f"/admin/evals/evalset/{eval_set.pk}/change/", data)
    assert page.status_code == 200
    formset = page.context["inline_admin_formsets"][0].formset
    assert "duplicate" in str(formset.errors[1])
    assert EvalCase.objects.count() == 1


def test_a_key_typed_decomposed_that_a_case_added_meanwhile_holds_is_refused_at_its_row(admin_client: Client) -> None:
    """The case is not on the page that was sent (another admin added it): Django checks a row's key in its set
    only when the service saves it; that refusal is told at the row, and nothing of the page is saved."""
    eval_set, agent = a_set()
    data = {"name": "renamed", "agent": agent.pk, "thresholds": "{}"}
    data.update(case_rows({"key": nfd("휴가")}))
    eval_case_create(actor="test", via="tests", data={"eval_set": eval_set, "key": "휴가", "query": "?"})
    page = admin_client.post(f"/admin/evals/evalset/{eval_set.pk}/change/", data)
    assert page.status_code == 200
    assert "already exists" in str(page.context["inline_admin_formsets"][0].formset.errors[0])
    assert EvalCase.objects.count() == 1 and EvalSet.objects.get().name == "s"


@pytest.mark.usefixtures("refused_by_the_form")
def test_two_new_keys_that_differ_only_in_composition_are_refused(admin_client: Client) -> None:
    eval_set, agent = a_set()
    data = {"name": "s", "agent": agent.pk, "thresholds": "{}"}
    data.update(case_rows({"key": "연차"}, {"key": nfd("연차")}))
    page = admin_client.post(f"/admin/evals/evalset/{eval_set.pk}/change/", data)
    assert page.status_code == 200
    formset = page.context["inline_admin_formsets"][0].formset
    assert "duplicate data for key" in str(formset.non_form_errors())
    assert not EvalCase.objects.exists()


def test_a_refusal_by_the_service_while_the_cases_are_saved_is_told_on_the_page(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backstop: whatever the form let through, a ValidationError from a case's service is a form error and
    rolls back the whole page (the set's change too), never a server error."""
    import evals.admin

    def refused(*, actor: Any, via: str, data: Any) -> EvalCase:
        raise ValidationError({"key": ["taken meanwhile"], "eval_set": ["not shown on the row"]})

    monkeypatch.setattr(evals.admin, "eval_case_create", refused)
    eval_set, agent = a_set()
    data = {"name": "renamed", "agent": agent.pk, "thresholds": "{}"}
    data.update(case_rows({"key": "q1"}))
    page = admin_client.post(f"/admin/evals/evalset/{eval_set.pk}/change/", data)
    assert page.status_code == 200
    html = page.content.decode()
    assert "taken meanwhile" in html and "not shown on the row" in html
    assert EvalSet.objects.get().name == "s" and not EvalCase.objects.exists()
    assert not AuditEvent.objects.filter(action="config.eval_set.update").exists()
