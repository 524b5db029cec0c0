"""Review s39 of evals: a set with no thresholds is judged by none (never "met"), a threshold whose score no case
measured is not judged (not met); the sandbox servers are the eval run's from its start; a case with no order comes
after the case before it; a case's order stays within what its export imports; ``dont_know`` and ``contains`` read
Korean spacing; a ``no_tool`` case fails when its run calls a tool; the run's page shows the expected and sent
arguments and the answer of a case that failed its answer checks."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.exceptions import ValidationError
from django.test import Client
from rest_framework.test import APIClient

from agents.execution import run_execute
from agents.models import Agent, Run
from agents.services import api_key_create
from evals.models import EvalCase, EvalCaseResult, EvalRun
from evals.scoring import CaseSpec, ToolCall, answer_check_failures, score_case, threshold_failures
from evals.services import (
    eval_case_create,
    eval_run_refresh,
    eval_run_start,
    eval_set_apply,
    eval_set_create,
    eval_set_update,
)
from mcpregistry.models import McpServer
from mcpregistry.pool import get_default_pool
from tests.conftest import bind_demo_server, discover_as_admin, make_agent
from tests.evals.conftest import run_eval

# ---- scoring ----------------------------------------------------------------------------------------------


def test_a_threshold_whose_score_no_case_measured_is_not_judged_and_so_not_met() -> None:
    summary = {"pass_rate": 1.0, "answer_checks": None, "latency_p95_ms": None, "forbidden_violations": 0}

    failed = threshold_failures(summary, {"pass_rate": 0.9, "answer_checks": 0.9, "latency_p95_ms": 5000})

    assert failed == ["answer_checks not_judged 0.9", "latency_p95_ms not_judged 5000"]


@pytest.mark.parametrize(
    "answer", ["해당 정보를 찾을수 없습니다.", "그 내용은 알수 없습니다.", "관련 정보가 없습니다.", "I don't  know."]
)
def test_an_answer_that_says_it_does_not_know_is_read_whatever_its_spacing(answer: str) -> None:
    assert answer_check_failures([{"dont_know": True}], answer) == []


@pytest.mark.parametrize(
    "answer", ["별도 정보가 없으면 연차는 15일입니다.", "정보가 없어도 연차는 15일입니다.", "문제 없습니다."]
)
def test_a_confident_answer_with_a_conditional_does_not_pass_as_not_knowing(answer: str) -> None:
    assert answer_check_failures([{"dont_know": True}], answer) == ["dont_know"]


def test_contains_takes_a_space_between_hangul_syllables_as_optional_and_other_text_as_written() -> None:
    assert answer_check_failures([{"contains": "클라우드 운영팀"}], "김하늘님은 클라우드운영팀입니다.") == []
    assert answer_check_failures([{"contains": "클라우드 운영팀"}], "김하늘님은 클라우드  운영팀입니다.") == []
    assert answer_check_failures([{"contains": " 운영팀"}], "클라우드운영팀") == []
    # A space the check does not have is not made up: words of the answer do not run into each other (a review
    # found "정상" met by "점검 일정 상세는 확인할 수 없습니다").
    assert answer_check_failures([{"contains": "정상"}], "A-1001의 점검 일정 상세는 확인할 수 없습니다") == [
        "contains:정상"
    ]
    assert answer_check_failures([{"contains": "가능"}], "휴가 능력 평가는 불가합니다") == ["contains:가능"]
    # Not between two Hangul syllables: compared as written.
    assert answer_check_failures([{"contains": "A-1 B"}], "자산 A-1B") == ["contains:A-1 B"]
    assert answer_check_failures([{"contains": "15일"}], "연차는 15 일") == ["contains:15일"]


def test_a_no_tool_case_that_expects_a_tool_is_scored_by_what_it_expects() -> None:
    """A case typed ``no_tool`` by mistake that expects a tool could never pass (it forbade the tool it expects)."""
    spec = CaseSpec(expected_tools=[{"name": "search_employee"}], case_type="no_tool")
    called = score_case(spec, calls=[ToolCall("search_employee", {}, True)], answer="", run_succeeded=True)
    assert called.passed and called.forbidden_violations == 0


def test_a_no_tool_case_that_names_no_forbidden_tool_fails_when_its_run_calls_one() -> None:
    spec = CaseSpec(expected_tools=[], case_type="no_tool")
    called = score_case(spec, calls=[ToolCall("search_employee", {}, True)], answer="", run_succeeded=True)
    assert not called.passed and "tools:forbidden" in called.failed_checks and called.forbidden_violations == 1
    # As a case that forbids every tool ("*") is scored.
    every = CaseSpec(expected_tools=[], forbidden_tools=["*"])
    assert called == score_case(every, calls=[ToolCall("search_employee", {}, True)], answer="", run_succeeded=True)
    assert score_case(spec, calls=[], answer="", run_succeeded=True).passed
    # Forbidden tools given: those alone.
    named = CaseSpec(expected_tools=[], forbidden_tools=["delete_asset"], case_type="no_tool")
    assert score_case(named, calls=[ToolCall("search_employee", {}, True)], answer="", run_succeeded=True).passed


# ---- the set's cases --------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_case_with_no_order_comes_after_the_case_before_it() -> None:
    cases = [
        {"key": "a", "order": 100, "query": "첫 질문"},
        {"key": "b", "query": "이어지는 질문"},
        {"key": "c", "order": 5, "query": "q"},
        {"key": "d", "query": "q"},
    ]
    eval_set_apply(document={"name": "talk", "cases": cases}, actor="test", via="tests")

    orders = dict(EvalCase.objects.values_list("key", "order"))
    assert orders == {"a": 100, "b": 110, "c": 5, "d": 15}


@pytest.mark.django_db
def test_a_case_order_past_what_an_import_takes_is_refused_in_the_admin(admin_client: Client) -> None:
    agent = Agent.objects.create(slug="a", name="a")
    eval_set = eval_set_create(actor="test", via="tests", data={"name": "s", "agent": agent})
    case = EvalCase(eval_set=eval_set, key="k", query="q", order=2**31)
    with pytest.raises(ValidationError) as refused:
        case.full_clean()
    assert "order" in refused.value.message_dict
    EvalCase(eval_set=eval_set, key="k", query="q", order=2**31 - 1).full_clean()
    data = {
        "name": "s", "agent": agent.pk, "thresholds": "{}", "cases-TOTAL_FORMS": "1", "cases-INITIAL_FORMS": "0",
        "cases-0-key": "q1", "cases-0-order": str(2**31), "cases-0-case_type": "single_tool", "cases-0-query": "q",
        "cases-0-expected_tools__lines": "", "cases-0-forbidden_tools__lines": "", "cases-0-alternatives__lines": "",
        "cases-0-context__lines": "", "cases-0-data__lines": "", "cases-0-answer_checks__contains": "",
        "cases-0-answer_checks__regex": "",
        **{f"cases-0-{f}__editor": "1" for f in ("expected_tools", "forbidden_tools", "answer_checks", "alternatives", "context", "data")},
    }  # fmt: skip

    response = admin_client.post(f"/admin/evals/evalset/{eval_set.pk}/change/", data)

    assert response.status_code == 200 and not EvalCase.objects.exists()
    assert "order" in response.context["inline_admin_formsets"][0].formset.forms[0].errors


# ---- the sandbox servers of an eval run -------------------------------------------------------------------


@pytest.fixture
def notes(transactional_db: Any, tmp_path: Path) -> Any:
    """The probe server's ``append_note`` (a write) bound as ``notes``, and an agent whose model writes a note."""
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


def _execute_queued(eval_run: EvalRun) -> None:
    for run_id in Run.objects.filter(eval_results__eval_run=eval_run, status=Run.Status.QUEUED).values_list("id"):
        run_execute(run_id=str(run_id[0]))


@pytest.mark.slow
def test_a_set_given_a_sandbox_while_its_eval_runs_does_not_make_later_cases_write(notes: Path) -> None:
    case = {"query": "회의록을 저장해줘", "expected_tools": [{"name": "append_note"}]}
    document = {"name": "writes", "cases": [{"key": "one", **case}, {"key": "two", **case}], "sandbox_servers": []}
    eval_set = eval_set_apply(document=document, actor="test", via="tests").eval_set
    eval_run = eval_run_start(eval_set=eval_set, agent=Agent.objects.get(slug="minutes"), actor="test", window=1)
    _execute_queued(eval_run)

    eval_set_update(eval_set=eval_set, actor="test", via="tests", data={"sandbox_servers": ["notes"]})
    eval_run = eval_run_refresh(eval_run=eval_run)  # scores the first case, submits the second
    _execute_queued(eval_run)
    eval_run = eval_run_refresh(eval_run=eval_run)

    assert eval_run.status == EvalRun.Status.FINISHED and eval_run.sandbox_servers == []
    for result in eval_run.results.select_related("run"):
        assert result.run is not None and result.run.write_sandbox == []
        assert [(c["ok"], c["reason"]) for c in result.called_tools] == [(False, "eval:write_blocked")]
    assert not notes.exists() or "주간 회의록" not in notes.read_text(encoding="utf-8")


# ---- the eval run's page ----------------------------------------------------------------------------------


def _finished_run(*, thresholds: dict[str, Any], failed: list[str]) -> tuple[EvalRun, EvalCase]:
    agent = Agent.objects.create(slug="a", name="a")
    eval_set = eval_set_create(actor="test", via="tests", data={"name": "s", "agent": agent})
    case = eval_case_create(
        actor="test",
        via="tests",
        data={
            "eval_set": eval_set,
            "key": "retire",
            "query": "A-1 폐기해줘",
            "expected_tools": [{"name": "update_asset", "args": {"asset_id": "A-1", "status": "폐기"}}],
            "answer_checks": [{"contains": "폐기"}, {"dont_know": True}],
        },
    )
    eval_run = EvalRun.objects.create(
        eval_set=eval_set,
        agent=agent,
        total=1,
        done=1,
        status=EvalRun.Status.FINISHED,
        summary={"cases": 1, "passed": 0, "pass_rate": 0.0},
        thresholds=thresholds,
        failed_thresholds=failed,
    )
    return eval_run, case


@pytest.mark.django_db
def test_a_run_of_a_set_with_no_thresholds_reads_no_thresholds_set_not_met(admin_client: Client) -> None:
    eval_run, _case = _finished_run(thresholds={}, failed=[])

    page = admin_client.get(f"/admin/evals/evalrun/{eval_run.pk}/change/").content.decode()
    listing = admin_client.get("/admin/evals/evalrun/").content.decode()

    assert "No thresholds set: no threshold judged this eval run." in page and "Every threshold met" not in page
    assert "no thresholds set" in listing and ">met<" not in listing
    assert eval_run.passed is None and eval_run.verdict == "no_thresholds"
    _key, raw = api_key_create(actor="test", via="tests", name="ops", admin=True)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    body = api.get(f"/api/v1/evals/runs/{eval_run.pk}").json()
    assert (body["passed"], body["verdict"]) == (None, "no_thresholds")


@pytest.mark.django_db
def test_a_threshold_not_judged_is_shown_as_not_judged_and_the_run_did_not_pass(admin_client: Client) -> None:
    eval_run, _case = _finished_run(thresholds={"answer_checks": 0.9}, failed=["answer_checks not_judged 0.9"])

    page = admin_client.get(f"/admin/evals/evalrun/{eval_run.pk}/change/").content.decode()

    assert "Thresholds not met" in page and "answer checks (limit 0.9): not judged, no case measured it" in page
    assert eval_run.passed is False and eval_run.verdict == "not_met"


@pytest.mark.django_db
def test_the_run_page_shows_expected_and_sent_arguments_and_the_failed_answer_escaped(admin_client: Client) -> None:
    eval_run, case = _finished_run(thresholds={"pass_rate": 1.0}, failed=["pass_rate 0.0 < 1.0"])
    answer = "자산 A-1의 상태를 <b>보류</b>로 바꿨습니다. " + "추가 설명. " * 30
    EvalCaseResult.objects.create(
        eval_run=eval_run,
        case=case,
        scored=True,
        passed=False,
        scores={"answer_checks": False, "failed_checks": ["tools:args", "contains:폐기", "dont_know"]},
        called_tools=[
            {"name": "update_asset", "args": {"asset_id": "A-1", "status": "보류", "password": "hunter2"}, "ok": True}
        ],
        answer=answer,
    )

    page = admin_client.get(f"/admin/evals/evalrun/{eval_run.pk}/change/").content.decode()
    table = page[page.find('class="eval-cases') :]

    assert "{&quot;asset_id&quot;: &quot;A-1&quot;, &quot;status&quot;: &quot;폐기&quot;}" in table  # expected
    assert "&quot;status&quot;: &quot;보류&quot;" in table and "hunter2" not in table  # sent, masked
    assert '<details class="eval-answer">' in table and "&lt;b&gt;보류&lt;/b&gt;" in table and "<b>보류" not in table
    assert answer.count("추가 설명.") == 30 and table.count("추가 설명.") > 30  # shortened in its summary, whole below


# ---- run_eval -----------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_run_eval_says_no_threshold_judged_a_set_without_any_and_fails_one_not_judged() -> None:
    server = bind_demo_server(mcp_id="sds-s39")
    make_agent(
        slug="looker",
        servers=[server],
        provider="scripted",
        script=[{"tool_calls": [{"name": "search_employee", "args": {"name": "김하늘"}}]}, {"content": "찾았습니다"}],
        with_demo_rules=False,
    )
    quiet = {"key": "hello", "type": "no_tool", "query": "안녕하세요"}
    eval_set_apply(document={"name": "plain", "cases": [quiet]}, actor="test", via="tests")
    gated = {"name": "gated", "cases": [quiet], "thresholds": {"answer_checks": 0.9}}
    eval_set_apply(document=gated, actor="test", via="tests")
    try:
        status, out, err = run_eval("looker", "plain")
        assert status == 0, out + err
        assert "FAIL hello [no_tool]" in out and "tools:forbidden" in out  # a tool was called: it fails
        assert "no thresholds set: no threshold judged eval run" in err
        assert EvalRun.objects.get(eval_set__name="plain").passed is None

        status, out, err = run_eval("looker", "gated")
        assert status == 1 and "answer_checks not_judged 0.9" in err, out + err
        assert EvalRun.objects.get(eval_set__name="gated").passed is False
    finally:
        get_default_pool().close("sds-s39")
