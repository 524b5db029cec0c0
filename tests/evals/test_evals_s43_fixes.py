"""Session 43's eval fixes: ``dont_know`` is not met by a made-up answer that ends by saying there is no more
information, and is met by the common Korean refusals; a call the gate refused as ``tool:out_of_date`` (nothing
sent) was never made; the admin's alternatives box names the keys it knows; starting an eval run is audited
(``eval_run.start``), as cancelling one is. Real demo servers and runs; only the model is scripted."""

from __future__ import annotations

import re
import unicodedata
from html import unescape
from typing import Any

import pytest
from django.test import Client
from django.utils import translation
from rest_framework.test import APIClient

from agents.models import Agent
from agents.services import api_key_create
from audit.models import AuditEvent
from evals.models import EvalCase, EvalRun
from evals.scoring import CaseSpec, ToolCall, answer_check_failures, score_case
from evals.services import (
    alternatives_problems,
    eval_run_cancel,
    eval_run_start,
    eval_set_apply,
    eval_set_create,
    run_tool_calls_for_scoring,
)
from tests.agents.test_stale_version_contract import (
    published,
    rename_lookups_argument,
    run_of,
    stale_contract_server,
    team_rule,
)
from tests.conftest import make_agent
from tests.evals.conftest import bind_stock_server, scripted_agent

pytestmark = pytest.mark.django_db

DONT_KNOW = [{"dont_know": True}]


# ---- 1. a made-up answer that ends by saying there is no more information ---------------------------------------


@pytest.mark.parametrize(
    "answer",
    [
        "육아휴직은 최대 1년까지 쓸 수 있습니다. 그 밖의 정보는 없습니다.",
        "육아휴직은 2년까지 가능합니다. 자세한 내용은 사내 규정에 나와 있지 않습니다.",
        "육아휴직은 1년입니다(정보가 없으므로 일반 기준으로 답했습니다).",
        "육아휴직은 최대 1년까지 쓸 수 있습니다. 다른 정보는 없습니다.",
        "육아휴직은 가능합니다. 관련 문서를 찾을 수 없습니다.",  # a statement before the refusal
        "육아휴직은 1년입니다.\n정보가 없습니다.",  # a line break ends a sentence
        "관련 정보는 없지만 일반적으로 1년입니다.",
        "규정을 찾지 못해서 일반 기준으로 답하면 1년입니다.",
        "더 이상의 정보는 없습니다.",
        "이상 징후는 확인되지 않습니다.",  # a finding: not where it looked
    ],
)
def test_a_made_up_answer_that_then_says_there_is_no_more_information_does_not_pass(answer: str) -> None:
    """Seed 001's ``no_answer`` case asks that the agent makes nothing up where no source exists."""
    assert answer_check_failures(DONT_KNOW, answer) == ["dont_know"]


# ---- 2. common Korean refusals ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "answer",
    [
        "제공된 문서에는 육아휴직 규정이 없습니다.",
        "육아휴직에 관한 답변을 드릴 수 없습니다.",
        "관련 문서에서 확인되지 않습니다.",
        "근거 문서가 없어 정확히 알려드릴 수 없습니다.",  # seed 001's own wording
        "육아휴직에 대해서는 안내해 드릴 수 없습니다.",
        "죄송합니다. 해당 질문에 대한 근거 문서가 없습니다.",  # a courtesy before it states nothing
        "육아휴직 관련 규정은 제공된 문서에서 확인되지 않습니다.",
        "정보가 없어서 답변을 드릴 수 없습니다.",
        "관련 정보가 없으니 인사팀에 문의하세요.",
        "확인할 수 없어서 죄송합니다.",
        "요청하신 정보를 찾지 못했습니다. 요청 내용을 확인해 주세요.",
    ],
)
def test_common_korean_refusals_pass_the_dont_know_check(answer: str) -> None:
    assert answer_check_failures(DONT_KNOW, answer) == []
    assert answer_check_failures(DONT_KNOW, unicodedata.normalize("NFD", answer)) == []


# ---- 3. a call refused as out of date was never made -----------------------------------------------------------


def test_a_call_refused_as_out_of_date_meets_no_expected_tool() -> None:
    spec = CaseSpec(expected_tools=[{"name": "search_employee", "args": {"name": "김하늘"}}])
    refused = ToolCall("search_employee", {"name": "김하늘"}, False, "tool:out_of_date", 0)

    score = score_case(spec, calls=[refused], answer="", run_succeeded=True)

    assert not score.passed and score.recall == 0.0 and score.argument_match == 0.0
    # The design's attempted calls stay counted: a paused server, a busy local tool.
    for reason in ("circuit:open", "local:busy"):
        tried = ToolCall("search_employee", {"name": "김하늘"}, False, reason, 0)
        assert score_case(spec, calls=[tried], answer="", run_succeeded=True).recall == 1.0


@pytest.mark.slow
def test_a_published_versions_rule_refused_as_out_of_date_is_scored_as_no_call(admin_user: Any) -> None:
    """A real stdio server renames ``lookup``'s argument; the version's rule is refused ``tool:out_of_date`` by the
    gate (nothing sent), and the call read back from the run's audit record meets no expected tool."""
    server = stale_contract_server("stale-eval")
    agent = make_agent(slug="stale-eval", servers=[server], with_demo_rules=False)
    team_rule(agent, server)
    published(agent, admin_user)
    rename_lookups_argument(server, admin_user)
    run = run_of(agent, "박도윤 님은 어느 팀인가요?")

    [call] = run_tool_calls_for_scoring(run.id)
    assert (call.name, call.ok, call.reason) == ("lookup", False, "tool:out_of_date")
    spec = CaseSpec(expected_tools=[{"name": "lookup", "args": {"name": "박도윤"}}])
    score = score_case(spec, calls=[call], answer=run.answer, run_succeeded=True)
    assert not score.passed and score.recall == 0.0 and "tools:mismatch" in score.failed_checks


# ---- 4. the admin's alternatives box names the keys --------------------------------------------------------------


def test_an_unknown_key_of_an_alternative_is_named_with_the_keys_it_has() -> None:
    with translation.override("en"):
        assert alternatives_problems([{"tools": ["a"], "orderd": True}]) == [
            "alternatives.0.orderd: not a known field (the keys are tools, note, ordered)"
        ]
        assert alternatives_problems([{"tools": ["a"], "ordered": "maybe"}]) == [
            "alternatives.0.ordered: must be true or false"
        ]


def test_the_admins_alternatives_box_names_the_keys_of_a_misspelt_one(admin_client: Client) -> None:
    agent = Agent.objects.create(slug="a", name="a")
    eval_set = eval_set_create(actor="test", via="tests", data={"name": "s", "agent": agent})
    data = {"name": "s", "agent": agent.pk, "thresholds": "{}", "cases-TOTAL_FORMS": "1", "cases-INITIAL_FORMS": "0"}
    data.update({
        "cases-0-key": "q1", "cases-0-order": "1", "cases-0-case_type": "single_tool", "cases-0-query": "김하늘 님은?",
        "cases-0-expected_tools__editor": "1", "cases-0-expected_tools__lines": "search_employee\n  name=김하늘",
        "cases-0-forbidden_tools": "[]", "cases-0-answer_checks": "[]", "cases-0-context": "{}", "cases-0-data": "[]",
        "cases-0-alternatives": '[{"tools": ["a"], "orderd": true}]',
    })  # fmt: skip

    page = admin_client.post(f"/admin/evals/evalset/{eval_set.pk}/change/", data, HTTP_ACCEPT_LANGUAGE="en")

    assert page.status_code == 200 and not EvalCase.objects.exists()
    text = " ".join(unescape(re.sub(r"<[^>]+>", " ", page.content.decode())).split())
    assert "alternatives.0.orderd: not a known field (the keys are tools, note, ordered)" in text


# ---- 5. starting an eval run is audited ------------------------------------------------------------------------


def _notice_set(settings: Any) -> tuple[Any, Agent]:
    server = bind_stock_server(settings)
    script: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "send_notice", "args": {"team": "ops", "text": "점검"}}]},
        {"content": "보냄"},
    ]
    agent = scripted_agent(slug="notifier", server=server, script=script)
    cases = [{"key": f"c{i}", "query": f"공지 {i}", "expected_tools": ["send_notice"]} for i in range(3)]
    document = {"name": "notices", "sandbox_servers": ["stock"], "cases": cases}
    return eval_set_apply(document=document, actor="test", via="tests").eval_set, agent


def test_starting_an_eval_run_records_eval_run_start_as_cancelling_records_eval_run_cancel(settings: Any) -> None:
    eval_set, agent = _notice_set(settings)

    eval_run = eval_run_start(eval_set=eval_set, agent=agent, actor="admin:kim", window=2)

    [event] = AuditEvent.objects.filter(action="eval_run.start")
    assert (event.source, event.actor) == ("admin", "admin:kim")
    assert event.args == {
        "eval_set": "notices",
        "agent": "notifier",
        "version": eval_run.version,
        "sandbox_servers": ["stock"],
        "window": 2,
        "cases": 3,
    }
    assert eval_run.version is not None  # the draft frozen, as the event says
    result = event.result or {}
    assert result["model"] == "evals.evalrun" and result["id"] == str(eval_run.pk) and result["via"] == "admin"
    eval_run_cancel(eval_run=eval_run, actor="admin:kim", via="admin")
    start, cancel = AuditEvent.objects.filter(action__startswith="eval_run.").order_by("id")
    assert (start.action, cancel.action) == ("eval_run.start", "eval_run.cancel")
    assert (start.result or {})["id"] == (cancel.result or {})["id"]


def test_an_eval_run_refused_at_its_start_records_nothing(settings: Any) -> None:
    eval_set, agent = _notice_set(settings)
    Agent.objects.filter(pk=agent.pk).update(enabled=False)
    with pytest.raises(Exception, match="disabled"):
        eval_run_start(eval_set=eval_set, agent=Agent.objects.get(pk=agent.pk), actor="admin:kim")
    assert not EvalRun.objects.exists() and not AuditEvent.objects.filter(action="eval_run.start").exists()


def test_an_eval_run_started_through_the_api_is_recorded_as_the_keys_act(settings: Any) -> None:
    eval_set, agent = _notice_set(settings)
    key, raw = api_key_create(actor="test", via="tests", name="ops", admin=True)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")

    response = client.post("/api/v1/evals/runs", {"set": eval_set.name, "agent": agent.slug}, format="json")

    assert response.status_code == 202, response.content
    [event] = AuditEvent.objects.filter(action="eval_run.start")
    assert (event.source, event.actor) == ("api", f"api_key:{key.prefix}")
    assert event.result == {**(event.result or {}), "id": response.json()["id"], "via": "api"}
    # run_eval's actor is an administrator's act, as its cancellation is.
    eval_run_start(eval_set=eval_set, agent=agent, actor="system:run_eval")
    latest = AuditEvent.objects.filter(action="eval_run.start").latest("id")
    assert (latest.source, latest.actor, (latest.result or {})["via"]) == ("admin", "system:run_eval", "run_eval")
