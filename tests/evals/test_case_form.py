"""An eval case as an admin writes it on its set's page: the type is chosen from the five the scoring knows,
named in words; a type stored before the list is kept."""

from __future__ import annotations

import pytest
from django.test import Client

from agents.models import Agent
from evals.admin import EvalCaseForm
from evals.models import CASE_TYPES, EvalCase
from evals.services import eval_case_create, eval_set_create


@pytest.mark.django_db
def test_a_cases_type_is_chosen_in_words_and_its_json_fields_show_their_shape(admin_client: Client) -> None:
    agent = Agent.objects.create(slug="company-assistant", name="사내 비서")
    eval_set = eval_set_create(actor="test", via="tests", data={"name": "seed", "agent": agent})
    eval_case_create(
        actor="test",
        via="tests",
        data={"eval_set": eval_set, "key": "q1", "query": "육아휴직은 얼마나 쓸 수 있나요?", "case_type": "no_answer"},
    )
    page = admin_client.get(f"/admin/evals/evalset/{eval_set.pk}/change/", HTTP_ACCEPT_LANGUAGE="ko")
    form = page.context["inline_admin_formsets"][0].formset.forms[0]
    assert [value for value, _label in form.fields["case_type"].choices] == list(CASE_TYPES)
    assert form["case_type"].value() == "no_answer"
    html = page.content.decode()
    assert 'value="no_answer" selected' in html
    assert "답이 없음: 모른다고 말해야 함 (no_answer)" in html
    # The tools and checks as inputs named for what they hold (tests/evals/test_case_editor.py), in Korean.
    assert 'name="cases-0-expected_tools__lines"' in html and "한 줄에 도구 하나" in html
    assert "도구를 전혀 부르지 않음" in html and "답변에 포함 (한 줄에 하나)" in html


@pytest.mark.django_db
def test_a_type_stored_before_the_list_is_kept_not_silently_changed() -> None:
    agent = Agent.objects.create(slug="a", name="a")
    eval_set = eval_set_create(actor="test", via="tests", data={"name": "old", "agent": agent})
    case = EvalCase.objects.create(eval_set=eval_set, key="q", query="?", case_type="multi_agent")
    form = EvalCaseForm(instance=case)
    assert ("multi_agent", "multi_agent") in form.fields["case_type"].choices
    assert form["case_type"].value() == "multi_agent"
    fresh = EvalCaseForm()
    assert fresh["case_type"].value() == "single_tool"


@pytest.mark.django_db
def test_a_sets_sandbox_servers_are_picked_and_its_thresholds_name_every_score(admin_client: Client) -> None:
    from evals.models import EvalSet
    from evals.scoring import MAX_METRICS, RATE_METRICS
    from mcpregistry.models import McpServer

    McpServer.objects.create(mcp_id="crm", name="CRM", transport="stdio", command="python3")
    agent = Agent.objects.create(slug="company-assistant", name="사내 비서")
    page = admin_client.get("/admin/evals/evalset/add/")
    form = page.context["adminform"].form
    assert [value for value, _label in form.fields["sandbox_servers"].choices] == ["crm"]
    html = page.content.decode()
    assert all(f'name="thresholds__{score}"' in html for score in RATE_METRICS + MAX_METRICS)  # one input each
    data = {"name": "seed", "agent": agent.pk, "sandbox_servers": ["crm"], "thresholds": '{"recall": 0.9}'}
    data.update({"cases-TOTAL_FORMS": "0", "cases-INITIAL_FORMS": "0"})
    response = admin_client.post("/admin/evals/evalset/add/", data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    assert EvalSet.objects.get(name="seed").sandbox_servers == ["crm"]
    refused = admin_client.post("/admin/evals/evalset/add/", {**data, "name": "two", "sandbox_servers": ["nope"]})
    assert "sandbox_servers" in refused.context["adminform"].form.errors


@pytest.mark.django_db
def test_saving_a_set_unchanged_keeps_its_sandbox_servers_order_and_records_nothing(admin_client: Client) -> None:
    from audit.models import AuditEvent
    from evals.models import EvalSet
    from mcpregistry.models import McpServer

    for mcp_id in ("aaa", "zzz"):
        McpServer.objects.create(mcp_id=mcp_id, name=mcp_id, transport="stdio", command="python3")
    agent = Agent.objects.create(slug="a", name="a")
    eval_set = eval_set_create(
        actor="test", via="tests", data={"name": "s", "agent": agent, "sandbox_servers": ["zzz", "aaa"]}
    )
    form = admin_client.get(f"/admin/evals/evalset/{eval_set.pk}/change/").context["adminform"].form
    checked = [
        value for value, _label in form.fields["sandbox_servers"].choices if value in form["sandbox_servers"].value()
    ]
    data = {"name": "s", "agent": agent.pk, "sandbox_servers": checked, "thresholds": "{}"}
    data.update({"cases-TOTAL_FORMS": "0", "cases-INITIAL_FORMS": "0"})
    assert admin_client.post(f"/admin/evals/evalset/{eval_set.pk}/change/", data).status_code == 302
    assert EvalSet.objects.get(pk=eval_set.pk).sandbox_servers == ["zzz", "aaa"]
    assert not AuditEvent.objects.filter(action="config.eval_set.update").exists()


@pytest.mark.django_db
def test_a_cases_and_a_sets_json_problems_are_told_in_the_readers_language(admin_client: Client) -> None:
    agent = Agent.objects.create(slug="a", name="a")
    eval_set = eval_set_create(actor="test", via="tests", data={"name": "s", "agent": agent})
    data = {"name": "s", "agent": agent.pk, "thresholds": '{"recal": 0.9}'}
    data.update({"cases-TOTAL_FORMS": "1", "cases-INITIAL_FORMS": "0"})
    data.update({"cases-0-key": "q1", "cases-0-order": "1", "cases-0-case_type": "single_tool", "cases-0-query": "?"})
    data.update({"cases-0-expected_tools": '[{"nmae": "x"}]', "cases-0-forbidden_tools": "[]"})
    data.update({"cases-0-answer_checks": '[{"contain": "x"}]', "cases-0-alternatives": "[]"})
    data.update({"cases-0-context": "{}", "cases-0-data": "[]"})
    page = admin_client.post(f"/admin/evals/evalset/{eval_set.pk}/change/", data, HTTP_ACCEPT_LANGUAGE="ko")
    assert page.status_code == 200
    html = page.content.decode()
    assert "recal: 점수가 아닙니다. 점수: pass_rate" in html
    assert "expected_tools[0]: 도구 이름이 필요합니다" in html
    assert "[0]: contains, regex, dont_know 중 하나여야 합니다" in html
