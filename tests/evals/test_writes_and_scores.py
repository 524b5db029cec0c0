"""An eval never writes outside its sandbox servers (scored on the attempted call); scores that the seed set does
not exercise: argument subsets, ordered sequences, answer checks, and model calls saved by rules."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from agents.models import Agent
from agents.services import agent_update
from audit.models import AuditEvent
from evals.models import EvalRun
from evals.scoring import CaseSpec, ToolCall, score_case, summarize, threshold_failures
from evals.services import eval_set_apply
from mcpregistry.models import McpServer
from mcpregistry.pool import get_default_pool
from tests.conftest import discover_as_admin, make_agent
from tests.evals.conftest import company_assistant, import_seed_set, run_eval

NOTE_CASE = {
    "key": "save-minutes",
    "type": "write",
    "query": "회의록을 저장해줘",
    "expected_tools": [{"name": "append_note", "args": {"text": "주간 회의록"}}],
}


@pytest.fixture
def notes(transactional_db: Any, tmp_path: Path) -> Any:
    server = McpServer.objects.create(
        mcp_id="notes", name="notes", command=sys.executable, args=["-m", "tests.mcp_fixtures.probe_server"],
        cwd=str(settings.BASE_DIR), env={"NOTES_FILE": str(tmp_path / "notes.txt")}, session_scope="shared",
    )  # fmt: skip
    assert discover_as_admin(server=server).ok
    make_agent(
        slug="minutes",
        servers=[server],
        provider="scripted",
        script=[{"tool_calls": [{"name": "append_note", "args": {"text": "주간 회의록"}}]}, {"content": "저장됨"}],
        with_demo_rules=False,
    )
    yield tmp_path / "notes.txt"
    get_default_pool().close("notes")


@pytest.mark.slow
@pytest.mark.parametrize("sandbox", [False, True], ids=["blocked", "sandbox"])
def test_a_write_runs_only_on_a_sandbox_server_and_is_scored_on_the_attempt(notes: Path, sandbox: bool) -> None:
    document = {"name": "writes", "cases": [NOTE_CASE], "sandbox_servers": ["notes"] if sandbox else []}
    eval_set_apply(document=document, actor="test", via="tests")

    status, out, err = run_eval("minutes", "writes")

    assert status == 0, out + err
    result = EvalRun.objects.get().results.get()
    assert result.passed and result.scores["argument_match"] == 1.0
    [call] = result.called_tools
    assert result.run is not None and result.run.write_sandbox == (["notes"] if sandbox else [])
    if sandbox:
        assert call["ok"] is True
        assert notes.read_text(encoding="utf-8").strip().endswith("주간 회의록")
    else:
        assert (call["ok"], call["reason"]) == (False, "eval:write_blocked")
        assert not notes.exists() or "주간 회의록" not in notes.read_text(encoding="utf-8")
    assert AuditEvent.objects.filter(action="tool.call", tool="append_note").get().source == "eval"


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_model_calls_saved_by_rules_are_counted() -> None:
    agent = company_assistant()
    agent_update(agent=agent, actor="test", via="tests", data={"answer_from_deterministic": True})
    import_seed_set()

    run_eval("company-assistant", "seed-001-tools")

    summary = EvalRun.objects.get().summary
    # Every question a rule matched (all but the no-tool one) is answered from its results, without the model.
    assert (summary["model_calls_saved"], summary["model_calls"]) == (4, 1)


def test_arguments_are_a_subset_and_an_ordered_case_needs_the_order() -> None:
    spec = CaseSpec(
        expected_tools=[{"name": "search_employee", "args": {"name": "이서준"}}, {"name": "list_projects"}],
        ordered=True,
    )
    right = [ToolCall("search_employee", {"name": "이서준", "extra": 1}, True), ToolCall("list_projects", {}, True)]
    assert score_case(spec, calls=right, answer="", run_succeeded=True).passed
    swapped = score_case(spec, calls=right[::-1], answer="", run_succeeded=True)
    assert not swapped.passed and swapped.failed_checks == ["tools:order"] and swapped.recall == 1.0
    wrong_args = [ToolCall("search_employee", {"name": "김하늘"}, True), ToolCall("list_projects", {}, True)]
    scored = score_case(spec, calls=wrong_args, answer="", run_succeeded=True)
    assert scored.argument_match == 0.0 and "tools:args" in scored.failed_checks


def test_answer_checks_contains_regex_and_i_dont_know() -> None:
    spec = CaseSpec(expected_tools=[], answer_checks=[{"contains": "클라우드"}, {"regex": r"\d+명"}])
    assert score_case(spec, calls=[], answer="클라우드운영팀은 3명입니다.", run_succeeded=True).answer_checks is True
    failed = score_case(spec, calls=[], answer="모르겠습니다", run_succeeded=True)
    assert failed.answer_checks is False and failed.failed_checks == ["contains:클라우드", "regex:\\d+명"]
    dont_know = CaseSpec(expected_tools=[], answer_checks=[{"dont_know": True}])
    assert score_case(dont_know, calls=[], answer="관련 규정을 찾을 수 없습니다.", run_succeeded=True).passed
    assert not score_case(dont_know, calls=[], answer="육아휴직은 1년입니다.", run_succeeded=True).passed


def test_a_failed_run_fails_its_case_and_thresholds_name_what_missed() -> None:
    spec = CaseSpec(expected_tools=[{"name": "ping"}])
    assert score_case(spec, calls=[ToolCall("ping", {}, True)], answer="", run_succeeded=False).failed_checks == [
        "run:failed"
    ]
    scores = [
        score_case(spec, calls=[ToolCall("ping", {}, True)], answer="", run_succeeded=True).as_dict(),
        score_case(spec, calls=[], answer="", run_succeeded=True).as_dict(),
    ]
    summary = summarize(scores)
    assert (summary["pass_rate"], summary["recall"], summary["precision"]) == (0.5, 0.5, 1.0)
    assert threshold_failures(summary, {"recall": 0.9, "precision": 1.0, "forbidden_violations": 0}) == [
        "recall 0.5 < 0.9"
    ]


@pytest.mark.django_db
def test_a_case_that_cannot_become_a_run_fails_and_its_eval_run_still_ends(settings: Any) -> None:
    """A case stored before the query limit was lowered: the run it asks for is refused. The eval run stayed
    "running", retrying it at every refresh (and stopped the refresh of the eval runs after it)."""
    from evals.models import EvalSet
    from evals.services import eval_run_refresh, eval_run_start

    make_agent(slug="short", servers=[], with_demo_rules=False)
    eval_set_apply(
        document={"name": "long-queries", "cases": [{"key": "long", "query": "김하늘 님은 어느 팀 소속인가요?"}]},
        actor="test",
        via="tests",
    )
    settings.PLATFORM_RUN_QUERY_MAX_CHARS = 5
    eval_run = eval_run_start(
        eval_set=EvalSet.objects.get(name="long-queries"), agent=Agent.objects.get(slug="short"), actor="test"
    )

    eval_run = eval_run_refresh(eval_run=eval_run, window=1)

    assert eval_run.status == EvalRun.Status.FINISHED
    result = eval_run.results.get()
    assert (result.scored, result.passed, result.run) == (True, False, None)
    assert "eval:not_submitted:query_too_long" in result.scores["failed_checks"]
    assert result.answer == "The query is longer than 5 characters."
