"""The run engine against the real demo server (stdio, through the pool); only the model is scripted."""

from __future__ import annotations

import json

import pytest

from agents.execution import run_execute
from agents.models import Run
from audit.models import AuditEvent
from tests.conftest import DEMO_SECRET, bind_demo_server, make_agent

pytestmark = pytest.mark.django_db


def submit(agent, query: str, **fields) -> Run:
    run = Run.objects.create(agent=agent, query=query, **fields)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    return run


def test_a_deterministic_rule_answers_the_seed_question_offline(demo_agent) -> None:
    run = submit(demo_agent, "김하늘 님은 어느 팀 소속인가요?")
    assert run.status == Run.Status.SUCCEEDED
    assert "클라우드운영팀" in run.answer
    [result] = run.deterministic_results
    assert result["tool"] == "search_employee"
    assert result["args"] == {"name": "김하늘"}
    assert result["value"]["team"] == "클라우드운영팀"
    event = AuditEvent.objects.get(run_id=run.id, action="tool.call")
    assert (event.source, event.tool, event.ok) == ("deterministic", "search_employee", True)
    assert event.args == {"name": "김하늘"}


def test_the_team_size_question_is_answered_from_list_team_members(demo_agent) -> None:
    run = submit(demo_agent, "클라우드운영팀 인원이 몇 명인지 알려주세요.")
    assert run.answer == "클라우드운영팀 인원은 3명입니다: 김하늘, 이서준, 정하은."


def test_a_question_for_a_teams_members_is_answered_with_their_names(demo_agent) -> None:
    """명단 asks who is in the team: the count alone did not answer it."""
    run = submit(demo_agent, "클라우드운영팀 명단 보여줘")
    assert run.answer == "클라우드운영팀 인원은 3명입니다: 김하늘, 이서준, 정하은."


@pytest.mark.parametrize(
    "query",
    [
        "김하늘 님 팀 알려줘",
        "클라우드운영팀 명단 보여줘",
        "물류플랫폼팀 프로젝트 알려줘",
        "박도윤 님 자산 알려줘",
        "A-1004 상태 알려줘",
    ],
)
def test_the_demo_servers_examples_the_no_match_answer_gives_are_answered_by_the_rules(demo_agent, query) -> None:
    from agents.management.commands.seed_demo import NO_MATCH_ANSWER

    assert f"({query})" in NO_MATCH_ANSWER
    run = submit(demo_agent, query)
    assert run.status == Run.Status.SUCCEEDED and run.deterministic_results, (run.error_message, run.answer)


def test_every_rule_decision_is_in_the_trace(demo_agent) -> None:
    run = submit(demo_agent, "클라우드운영팀 인원이 몇 명인지 알려주세요.")
    decisions = [step for step in run.messages if step["type"] == "rule"]
    assert [d["rule"] for d in decisions] == [r.name for r in demo_agent.rules.order_by("order")]
    assert [d["matched"] for d in decisions] == [False, True, False, False, False]


def test_deterministic_results_are_injected_into_the_system_message(demo_agent) -> None:
    run = submit(demo_agent, "김하늘 님은 어느 팀 소속인가요?")
    [system] = [step for step in run.messages if step["type"] == "system"]
    assert "확정 호출 결과" in system["content"]
    assert "클라우드운영팀" in system["content"]


def test_a_scripted_model_calls_a_demo_tool_and_answers_from_its_result(demo_server) -> None:
    agent = make_agent(
        slug="react",
        servers=[demo_server],
        provider="scripted",
        with_demo_rules=False,
        script=[
            {"tool_calls": [{"name": "list_projects", "args": {"team": "물류플랫폼팀"}}]},
            {"content": "물류플랫폼팀 프로젝트: {last_tool_result}"},
        ],
    )
    run = submit(agent, "물류플랫폼팀 프로젝트 알려줘")
    assert run.status == Run.Status.SUCCEEDED
    assert "차세대 물류 플랫폼 구축" in run.answer
    event = AuditEvent.objects.get(run_id=run.id, action="tool.call")
    assert (event.source, event.tool, event.ok) == ("agent", "list_projects", True)
    assert [s["type"] for s in run.messages if s["type"] in {"human", "ai", "tool"}] == ["human", "ai", "tool", "ai"]
    assert run.token_usage["model_calls"] == 2


@pytest.mark.slow
def test_a_failing_tool_is_a_message_to_the_model_and_the_run_still_answers(db) -> None:
    server = bind_demo_server(mcp_id="assets-down", failure_mode="rate_limit")
    agent = make_agent(
        slug="recovering",
        servers=[server],
        provider="scripted",
        with_demo_rules=False,
        script=[
            {"tool_calls": [{"name": "get_asset_status", "args": {"asset_id": "A-1001"}}]},
            {
                "if_last_tool_result_contains": "get_asset_status_backup",
                "tool_calls": [{"name": "get_asset_status_backup", "args": {"asset_id": "A-1001"}}],
            },
            {"content": "백업 기준 상태: {last_tool_result}"},
        ],
    )
    run = submit(agent, "A-1001 자산의 현재 상태를 알려주세요.")
    assert run.status == Run.Status.SUCCEEDED
    assert "백업 스냅샷 기준" in run.answer
    events = list(AuditEvent.objects.filter(run_id=run.id, action="tool.call").order_by("id"))
    # The gate retried the rate limit (backing off), then the model took the backup tool.
    assert [(e.tool, e.ok, e.reason, e.attempt) for e in events] == [
        ("get_asset_status", False, "rate_limit", 1),
        ("get_asset_status", False, "rate_limit", 2),
        ("get_asset_status", False, "rate_limit", 3),
        ("get_asset_status_backup", True, "", 1),
    ]
    [failed_result] = [s for s in run.messages if s["type"] == "tool" and s["name"] == "get_asset_status"]
    assert "호출 한도를 초과했습니다" in failed_result["content"]


def test_a_tool_the_model_invents_does_not_crash_the_run(demo_server) -> None:
    agent = make_agent(
        slug="inventive",
        servers=[demo_server],
        provider="scripted",
        with_demo_rules=False,
        script=[{"tool_calls": [{"name": "delete_everything", "args": {}}]}, {"content": "못 했습니다."}],
    )
    run = submit(agent, "다 지워줘")
    assert run.status == Run.Status.SUCCEEDED
    assert run.answer == "못 했습니다."


def test_a_secret_bound_to_the_server_never_reaches_the_audit_or_the_run(demo_server) -> None:
    # The model passes the secret as an argument; the server echoes it back in its "not found" message.
    agent = make_agent(
        slug="leaky",
        servers=[demo_server],
        provider="scripted",
        with_demo_rules=False,
        script=[
            {"tool_calls": [{"name": "search_employee", "args": {"name": DEMO_SECRET}}]},
            {"content": "결과: {last_tool_result}"},
        ],
    )
    run = submit(agent, f"이 키로 찾아줘 {DEMO_SECRET}")
    assert run.status == Run.Status.SUCCEEDED
    events = list(AuditEvent.objects.filter(run_id=run.id).values())
    assert events, "the call must be audited"
    stored = json.dumps(events, ensure_ascii=False, default=str) + json.dumps(
        list(Run.objects.filter(pk=run.pk).values("answer", "messages", "deterministic_results", "error_message")),
        ensure_ascii=False,
        default=str,
    )
    assert DEMO_SECRET not in stored
    assert "***" in stored


def test_a_run_is_executed_once_even_if_delivered_twice(demo_agent) -> None:
    run = submit(demo_agent, "김하늘 님은 어느 팀 소속인가요?")
    run_execute(run_id=str(run.id))
    assert AuditEvent.objects.filter(run_id=run.id, action="tool.call").count() == 1


@pytest.mark.parametrize(
    ("language", "platform_language", "expected", "not_expected"),
    [
        ("ko", "en", "도구를 호출하지 않았습니다", "was not called"),
        ("en", "ko", "was not called", "도구를 호출하지 않았습니다"),
    ],
)
def test_the_gate_guides_the_model_in_the_agents_language(
    demo_server, settings, language, platform_language, expected, not_expected
) -> None:
    # The worker's LANGUAGE_CODE is the other language: what the model reads after a refused call (and what the
    # trace shows a reviewer) follows the agent, as its other texts for end users do.
    settings.LANGUAGE_CODE = platform_language
    agent = make_agent(
        slug=f"guided-{language}",
        servers=[demo_server],
        provider="scripted",
        with_demo_rules=False,
        script=[
            {"tool_calls": [{"name": "list_projects", "args": {"team": "물류플랫폼팀", "colour": "red"}}]},
            {"content": "{last_tool_result}"},
        ],
    )
    agent.language = language
    agent.save(update_fields=["language"])
    run = submit(agent, "물류플랫폼팀 프로젝트 알려줘")
    assert run.status == Run.Status.SUCCEEDED
    [refused] = [s for s in run.messages if s["type"] == "tool"]
    assert "[args:unknown:colour]" in refused["content"]
    assert expected in refused["content"]
    assert not_expected not in refused["content"]
    assert expected in run.answer


def test_a_run_stopped_by_its_iterations_keeps_the_turns_it_made(demo_server) -> None:
    # Its trace and its token usage count the model's turns (they were dropped: the run read as if the model had
    # never been called).
    again = {"tool_calls": [{"name": "search_employee", "args": {"name": "김하늘"}}]}
    agent = make_agent(
        slug="loops", servers=[demo_server], provider="scripted", with_demo_rules=False, script=[again] * 5
    )
    agent.max_iterations = 2
    agent.save()
    run = submit(agent, "김하늘 팀 알려줘")
    assert (run.status, run.error_code) == (Run.Status.FAILED, "max_iterations")
    assert sum(1 for step in run.messages if step.get("type") == "ai") == 2
    assert run.token_usage["model_calls"] == 2
