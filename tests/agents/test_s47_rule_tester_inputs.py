"""The rule tester reads its input as a run does (review s47):

- a context line ``vip=true`` is the boolean the rule editor reads in a rule's ``vip=true`` and a caller sends as
  JSON ``true`` (it was the text "true", which a boolean condition never meets: the tester said "skipped" where a
  run matched); a number stays the text callers send ids as, and quoted ``"true"`` stays text;
- an A2A data entry that is not a JSON object is kept as ``{"value": …}``, as the API keeps it (it was refused)."""

from __future__ import annotations

from typing import Any

import pytest

from agents.execution import run_execute
from agents.models import DeterministicRule, Run
from agents.rule_form import key_value_pairs
from agents.rule_tester import RuleTesterForm


def matched_shown(admin_client: Any, agent: Any, **fields: str) -> list[str]:
    """The admin's rule tester page posted: the rules its trial matched."""
    posted = {"agent": agent.pk, "query": "사번 조회", "context": "", "a2a_data": "", **fields}
    response = admin_client.post("/admin/agents/rule-tester/", posted)
    assert response.status_code == 200
    assert response.context["form"].is_valid(), response.context["form"].errors
    return [trial.name for trial in response.context["trials"] if trial.matched]


def api_run(api_client: Any, agent: Any, *, parts: list[dict[str, Any]], context: dict[str, Any]) -> Run:
    """A run submitted through ``POST /api/v1/runs`` as an A2A message, then executed."""
    body = {"agent": agent.slug, "message": {"role": "user", "parts": parts}, "context": context}
    response = api_client.post("/api/v1/runs", body, format="json")
    assert response.status_code == 202, response.json()
    run_execute(run_id=response.json()["id"])
    return Run.objects.get(pk=response.json()["id"])


def rule_of(agent: Any, server: Any, name: str, when: dict[str, Any]) -> None:
    DeterministicRule.objects.create(
        agent=agent,
        server=server,
        name=name,
        order=1,
        tool_name="search_employee",
        when={"all_keywords": ["사번"], **when},
        params={"name": "김하늘"},
    )


@pytest.mark.django_db
def test_a_boolean_context_line_meets_the_rule_editors_boolean_condition_as_a_run_does(
    admin_client, api_client, demo_agent, demo_server
) -> None:
    # The condition as the rule editor reads its context line vip=true: the boolean.
    condition = key_value_pairs("vip=true", "context")
    assert condition == {"vip": True}
    rule_of(demo_agent, demo_server, "vip only", {"context": condition})

    run = api_run(api_client, demo_agent, parts=[{"kind": "text", "text": "사번 조회"}], context={"vip": True})
    assert [r["rule"] for r in run.deterministic_results] == ["vip only"]
    assert matched_shown(admin_client, demo_agent, context="vip=true") == ["vip only"]

    # Text "true", quoted, is what a caller's JSON "true" is: a boolean condition does not meet it, in a run or here.
    assert matched_shown(admin_client, demo_agent, context='vip="true"') == []
    text_run = api_run(api_client, demo_agent, parts=[{"kind": "text", "text": "사번 조회"}], context={"vip": "true"})
    assert text_run.deterministic_results == []


@pytest.mark.django_db
def test_context_lines_read_true_false_and_null_as_the_rule_editor_and_numbers_as_text(demo_agent) -> None:
    lines = 'vip=true\nblocked=false\nnone=null\nempno=1234\nname="true"\nuser={"id": 7}\nteam=클라우드운영팀'
    form = RuleTesterForm({"agent": demo_agent.pk, "query": "q", "context": lines})
    assert form.is_valid(), form.errors
    assert form.cleaned_data["context"] == {
        "vip": True,
        "blocked": False,
        "none": None,
        "empno": "1234",  # as callers send ids: a rule's empno=1234 meets it (condition_value_matches)
        "name": "true",
        "user": {"id": 7},
        "team": "클라우드운영팀",
    }
    help_text = str(form.fields["context"].help_text)
    assert "vip=true" in help_text and "for a number, a boolean or null" not in help_text


@pytest.mark.django_db
def test_a_data_entry_that_is_no_object_is_kept_as_the_api_keeps_it(
    admin_client, api_client, demo_agent, demo_server
) -> None:
    rule_of(demo_agent, demo_server, "seven", {"data": {"value": 7}})
    run = api_run(
        api_client, demo_agent, parts=[{"kind": "text", "text": "사번 조회"}, {"kind": "data", "data": 7}], context={}
    )
    assert run.a2a_data == [{"value": 7}]
    assert [r["rule"] for r in run.deterministic_results] == ["seven"]
    assert matched_shown(admin_client, demo_agent, a2a_data="[7]") == ["seven"]

    entries = '[7, null, [1, 2], "김하늘", {"order": 1}]'
    form = RuleTesterForm({"agent": demo_agent.pk, "query": "q", "a2a_data": entries})
    assert form.is_valid(), form.errors
    assert form.cleaned_data["a2a_data"] == [
        {"value": 7},
        {"value": None},
        {"value": [1, 2]},
        {"value": "김하늘"},
        {"order": 1},
    ]


@pytest.mark.django_db
def test_a_file_that_is_no_object_is_still_refused_as_the_api_refuses_it(demo_agent) -> None:
    form = RuleTesterForm(
        {"agent": demo_agent.pk, "query": "q", "a2a_files": '[{"name": "a.txt", "uri": "https://x/a"}, 7]'}
    )
    assert not form.is_valid()
    assert "2" in form.errors["a2a_files"][0]
