"""Run outcomes that tell the truth: an answer resting on failed calls is not a plain success, and the guidance
written for a model never reaches an end user."""

from __future__ import annotations

import pytest

from agents.answers import compose_offline_answer, no_rule_matched_text
from agents.execution import run_execute
from agents.models import Agent, Run
from audit.models import AuditEvent
from mcpregistry.models import ToolContract
from tests.conftest import bind_demo_server, make_agent

pytestmark = pytest.mark.django_db

ASSET_QUESTION = "A-1001 자산의 현재 상태를 알려주세요."
# A tool's own error may be about the request or its backend: the user is told both.
TOOL_ERROR_TEXT = "답변에 필요한 정보를 가져오지 못했습니다: 도구가 오류를 알렸습니다. 요청 내용을 확인하시거나 잠시 후 다시 시도해 주세요."


def submit(agent: Agent, query: str) -> Run:
    run = Run.objects.create(agent=agent, query=query)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    return run


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "reason"), [("timeout", "timeout"), ("rate_limit", "rate_limit")])
def test_offline_a_backend_that_times_out_or_is_rate_limited_is_answered_by_the_backup(db, mode, reason) -> None:
    """Seed 001's other two injected failures are a backend's too: handed to the backup where no model reads."""
    server = bind_demo_server(mcp_id=f"assets-{mode}", failure_mode=mode)
    agent = make_agent(slug=f"offline-{mode}", servers=[server])
    run = submit(agent, ASSET_QUESTION)
    assert (run.status, run.error_code) == (Run.Status.SUCCEEDED, "")
    assert "백업 스냅샷 기준" in run.answer
    handed = AuditEvent.objects.get(run_id=run.id, action="tool.fallback")
    assert (handed.tool, handed.reason) == ("get_asset_status", reason)


@pytest.mark.slow
def test_offline_a_run_follows_the_fallback_its_contract_suggests_since_no_model_would(db) -> None:
    """Seed 001's recovery in the shipped demo: the backend answers in the wrong shape; with no model to read
    "use the backup", the gate calls the contract's fallback itself and the answer says where it came from."""
    server = bind_demo_server(mcp_id="assets-broken", failure_mode="bad_schema")
    agent = make_agent(slug="offline-recovers", servers=[server])
    run = submit(agent, ASSET_QUESTION)
    assert (run.status, run.error_code) == (Run.Status.SUCCEEDED, "")
    assert "A-1001: 사용중" in run.answer and "백업 스냅샷 기준" in run.answer
    [result] = run.deterministic_results
    assert (result["ok"], result["tool"], result["fallback_for"]) == (
        True,
        "get_asset_status_backup",
        "get_asset_status",
    )
    calls = AuditEvent.objects.filter(run_id=run.id, action__startswith="tool.").order_by("id")
    assert list(calls.values_list("action", "tool", "ok", "reason")) == [
        ("tool.call", "get_asset_status", False, "result:shape"),
        ("tool.fallback", "get_asset_status", False, "result:shape"),
        ("tool.call", "get_asset_status_backup", True, ""),
    ]
    assert calls[1].result == {"fallback_tool": "get_asset_status_backup", "policy": "no_model"}


def test_offline_an_unknown_asset_is_not_looked_up_in_the_backup_and_the_user_is_told_to_check_the_request(db) -> None:
    """The tool's own error (an unknown id) may be about the input: with no model to read "use the backup only if
    the input was right", the gate does not hand it to the backup (which would answer for an asset that does not
    exist), and the user is told to check the request, not to try again later, with what the tool said (seed
    001: the assets it knows, to choose from), never the model's guidance."""
    server = bind_demo_server(mcp_id="assets")
    agent = make_agent(slug="offline-unknown-asset", servers=[server])
    run = submit(agent, "A-9999 자산의 현재 상태를 알려주세요.")
    assert (run.status, run.error_code) == (Run.Status.FAILED, "deterministic:tool_failed")
    assert run.error_message.startswith(TOOL_ERROR_TEXT + " ")
    said = run.error_message.removeprefix(TOOL_ERROR_TEXT)
    assert "get_asset_status" in said and "'A-9999' 자산을 찾을 수 없습니다. 등록된 자산: A-1001, A-1002" in said
    assert "fallback" not in said and "get_asset_status_backup" not in said
    calls = AuditEvent.objects.filter(run_id=run.id, action__startswith="tool.").order_by("id")
    assert list(calls.values_list("action", "tool", "reason")) == [("tool.call", "get_asset_status", "tool:error")]


@pytest.mark.parametrize(
    ("codes", "expected"),
    [
        (["args:allowed:region"], "요청하신 값으로는 조회할 수 없습니다: 도구가 받지 않는 값이 있습니다."),
        (["result:empty", "result:empty"], "요청하신 내용에 해당하는 정보가 없습니다."),
        (["result:empty", "args:range:limit"], "요청하신 정보를 찾지 못했습니다. 요청 내용을 확인해 주세요."),
        (["tool:error", "args:range:limit"], TOOL_ERROR_TEXT),
        (["timeout", "result:empty"], "답변에 필요한 정보를 가져오지 못했습니다. 잠시 후 다시 시도해 주세요."),
        (["approval:rejected"], None),
    ],
    ids=["refused-value", "empty", "about-the-request", "tool-error", "transient", "declined"],
)
def test_the_failed_runs_message_says_whether_trying_again_later_can_help(codes, expected) -> None:
    from agents.answers import all_calls_failed_text

    text = all_calls_failed_text(language="ko", codes=codes)
    if expected is None:
        assert "다시 시도" not in text
    else:
        assert text == expected


@pytest.mark.slow
def test_offline_a_run_whose_calls_all_failed_fails_with_the_calls_codes_in_the_trace(db) -> None:
    server = bind_demo_server(mcp_id="assets-broken", failure_mode="bad_schema")
    ToolContract.objects.filter(tool__server=server, tool__name="get_asset_status").update(fallback_tool="")
    agent = make_agent(slug="offline-broken", servers=[server])
    run = submit(agent, ASSET_QUESTION)
    assert (run.status, run.error_code, run.tool_failures) == (Run.Status.FAILED, "deterministic:tool_failed", 1)
    [call] = [e for e in run.messages if e["type"] == "deterministic_call"]
    assert call["error"] == "result:shape"
    [verdict] = [e for e in run.messages if e["type"] == "outcome"]
    assert verdict["tool_errors"] == ["result:shape"]
    assert "get_asset_status_backup" not in run.error_message and run.answer == ""


@pytest.mark.slow
def test_with_a_model_a_run_on_failed_calls_carries_its_tool_failures(db) -> None:
    server = bind_demo_server(mcp_id="assets-broken", failure_mode="bad_schema")
    agent = make_agent(slug="model-broken", servers=[server], provider="scripted", script=[{"content": "모델 답변"}])
    run = submit(agent, ASSET_QUESTION)
    assert (run.status, run.answer, run.tool_failures) == (Run.Status.SUCCEEDED, "모델 답변", 1)


def test_the_model_guidance_of_a_failed_call_never_reaches_the_offline_answer() -> None:
    guidance = "get_asset_status failed (result:shape). Use the fallback tool get_asset_status_backup."
    results = [
        {"tool": "list_projects", "ok": True, "value": "P-1", "args": {}},
        {"tool": "get_asset_status", "ok": False, "error": "result:shape", "message": guidance, "args": {}},
    ]
    answer = compose_offline_answer(query="q", results=results, answer_template="", no_match_text="", language="en")
    assert "fallback" not in answer and "get_asset_status_backup" not in answer
    assert answer.splitlines() == [
        "list_projects: P-1",
        "get_asset_status: the information could not be retrieved right now.",
    ]


def test_the_text_when_no_rule_matched_is_the_agents_own(demo_server) -> None:
    agent = make_agent(slug="own-text", servers=[demo_server])
    Agent.objects.filter(pk=agent.pk).update(no_match_answer="Ask me about the weather.")
    run = submit(agent, "아무 규칙에도 맞지 않는 질문")
    assert (run.status, run.answer) == (Run.Status.SUCCEEDED, "Ask me about the weather.")


def test_without_its_own_text_no_demo_topics_are_named() -> None:
    text = no_rule_matched_text(agent_text="", language="ko")
    assert text and "직원" not in text and "자산" not in text


@pytest.mark.slow
def test_run_query_says_which_call_a_fallback_stood_in_for(db) -> None:
    from io import StringIO

    from django.core.management import call_command

    make_agent(slug="offline-cli", servers=[bind_demo_server(mcp_id="assets-cli", failure_mode="bad_schema")])
    out = StringIO()
    call_command("run_query", "offline-cli", ASSET_QUESTION, "--inline", stdout=out)
    text = out.getvalue()
    assert "A-1001: 사용중" in text
    assert 'deterministic get_asset_status_backup({"asset_id": "A-1001"}) ok=True' in text
    assert "(fallback for get_asset_status, which failed)" in text


def test_a_query_longer_than_any_caller_may_send_is_refused_whoever_submits_it(db, settings) -> None:
    """The limit was checked by the REST, A2A and MCP views only: a command or an eval case went past it."""
    from django.core.management import CommandError, call_command

    from agents.models import Run

    settings.PLATFORM_RUN_QUERY_MAX_CHARS = 10
    make_agent(slug="short-queries", servers=[], with_demo_rules=False)
    with pytest.raises(CommandError, match="The query is longer than 10 characters"):
        call_command("run_query", "short-queries", "김하늘 님은 어느 팀 소속인가요?", "--inline")
    assert not Run.objects.exists()


@pytest.mark.slow
def test_run_query_prints_a_call_that_was_never_sent_without_a_latency(db) -> None:
    """A refused call (here a tool the model invented) has no latency: run_query raised formatting None."""
    from io import StringIO

    from django.core.management import call_command

    script = [{"tool_calls": [{"name": "no_such_tool", "args": {}}]}, {"content": "끝"}]
    make_agent(
        slug="cli-refused",
        servers=[bind_demo_server(mcp_id="refused-cli")],
        provider="scripted",
        script=script,
        with_demo_rules=False,
    )
    out = StringIO()
    call_command("run_query", "cli-refused", "아무거나", "--inline", stdout=out)
    assert "no_such_tool ok=False tool:unknown —" in out.getvalue()


@pytest.mark.slow
def test_run_query_tells_a_failure_in_the_platforms_language(db) -> None:
    """A failed run's stored message is English (the engine writes it): the command printed it as stored, where
    the admin's run page reads it back in the reader's language."""
    from io import StringIO

    from django.core.management import CommandError, call_command
    from django.utils import translation

    script = [{"tool_calls": [{"name": "no_such_tool", "args": {}}]}] * 5
    agent = make_agent(
        slug="cli-loops",
        servers=[bind_demo_server(mcp_id="loops-cli")],
        provider="scripted",
        script=script,
        with_demo_rules=False,
    )
    Agent.objects.filter(pk=agent.pk).update(max_iterations=1)
    out = StringIO()
    with translation.override("ko"), pytest.raises(CommandError) as failed:
        call_command("run_query", "cli-loops", "아무거나", "--inline", stdout=out)
    assert str(failed.value) == "max_iterations: 에이전트가 1번 반복 안에 끝내지 못함"
    assert "did not finish" not in out.getvalue()
