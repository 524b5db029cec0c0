"""Deterministic rules as Korean callers write: the demo's name rules read a name past a title (박도윤 팀장님), a
keyword meets the query whatever its spacing (몇명 / 몇 명), a regex group typed in full-width digits is sent as
the tool knows it, a context id written as a number meets the same id sent as text; and the rule editor says each
problem once, truly."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils.datastructures import MultiValueDict

from agents.deterministic import condition_value_matches, match_conditions
from agents.models import Agent, Run
from agents.rule_form import DeterministicRuleForm
from audit.models import AuditEvent
from tests.agents.test_rule_editor import ledger, rule_post  # noqa: F401
from tests.agents.test_rule_input_forms import run_now


def calls(run: Run) -> list[tuple[str, dict[str, Any]]]:
    made = AuditEvent.objects.filter(run_id=run.id, action="tool.call").order_by("seq")
    return [(e.tool, e.args) for e in made]


@pytest.mark.slow
@pytest.mark.django_db
@pytest.mark.parametrize(
    ("query", "called", "said"),
    [
        ("박도윤 팀장님 자산 알려줘", ("get_asset", {"owner": "박도윤"}), "박도윤 님의 자산은"),
        ("박도윤팀장님 노트북", ("get_asset", {"owner": "박도윤"}), "박도윤 님의 자산은"),
        (
            "클라우드운영팀 몇명이야?",
            ("list_team_members", {"team": "클라우드운영팀"}),
            "클라우드운영팀 인원은 3명입니다: 김하늘",
        ),
        ("A-１００４ 상태 알려줘", ("get_asset_status", {"asset_id": "A-1004"}), "A-1004"),
    ],
)
def test_the_demo_answers_what_korean_callers_type(
    demo_agent: Agent, query: str, called: tuple[str, dict[str, Any]], said: str
) -> None:
    Agent.objects.filter(pk=demo_agent.pk).update(model_provider="offline")
    run = run_now(demo_agent, query)
    assert run.status == Run.Status.SUCCEEDED, (run.error_code, run.error_message)
    assert called in calls(run)
    assert ("get_asset", {"owner": "팀장"}) not in calls(run) and ("search_employee", {"name": "팀장"}) not in calls(
        run
    )
    assert said in run.answer


@pytest.mark.parametrize(
    ("keyword", "query", "meets"),
    [
        ("몇 명", "클라우드운영팀 몇명이야?", True),  # a space the keyword has may be left out
        ("몇 명", "클라우드운영팀 몇 명이야?", True),
        ("몇명", "클라우드운영팀 몇명이야?", True),
        ("사원", "회사 원격 근무 규정 알려줘", False),  # never looked for across words
        ("급여", "상여금 지급 여부 알려줘", False),
        ("가방", "아버지가 방에 들어가신다", False),
        (" VPN ", "사내 VPN접속", False),  # a space next to a latin letter stays
    ],
)
def test_a_keywords_space_between_hangul_syllables_may_be_left_out(keyword: str, query: str, meets: bool) -> None:
    matched, _reason, _groups = match_conditions(
        {"any_keywords": [keyword]}, query=query, context={}, a2a_data=None, available_tools=set()
    )
    assert matched is meets


@pytest.mark.parametrize(
    ("found", "expected", "meets"),
    [
        ("1234", 1234, True),  # the editor's chatbotId=1234 is a number; callers send ids as JSON text
        (1234, "1234", True),
        (" 12.5 ", 12.5, True),
        ("1234", 1235, False),
        ("01234", 1234, False),  # not how the number is written
        ("1e3", 1000, False),
        ("true", True, False),  # a boolean meets only a boolean (seed 004)
        (1, True, False),
        ("abc", 1234, False),
        ("9007199254740993", 9007199254740992, False),  # exactly: a float met the next integer
        ("0.1", 0.1, True),
    ],
)
def test_a_number_condition_meets_the_same_number_written_as_text(found: Any, expected: Any, meets: bool) -> None:
    assert condition_value_matches(found, expected) is meets
    matched, _reason, _groups = match_conditions(
        {"context": {"chatbotId": expected}},
        query="q",
        context={"chatbotId": found},
        a2a_data=None,
        available_tools=set(),
    )
    assert matched is meets


def form_errors(agent: Agent, **changes: Any) -> dict[str, list[str]]:
    data = rule_post(agent, **changes)
    form = DeterministicRuleForm(data=MultiValueDict({k: v if isinstance(v, list) else [v] for k, v in data.items()}))
    assert not form.is_valid()
    return {name: [str(e) for e in errors] for name, errors in form.errors.items()}


@pytest.mark.django_db
def test_a_tool_the_form_refuses_is_not_also_said_to_be_missing(ledger: Agent) -> None:  # noqa: F811
    errors = form_errors(ledger, tool_name="nope")
    assert errors["tool_name"] == ["'nope' is not an enabled tool of Ledger-Data; its enabled tools are: lookup"]


@pytest.mark.django_db
@pytest.mark.parametrize("when", [{"when__context": "chatbotid premium"}, {"when__any_keywords": '["팀"'}])
def test_conditions_that_could_not_be_read_give_no_false_named_group_error(
    ledger: Agent,  # noqa: F811
    when: dict[str, str],
) -> None:
    errors = form_errors(ledger, **when)
    assert list(errors) == ["when"], errors  # the regex's group "name" is there: {match.name} is no problem
