"""Scoring rules the seed set does not exercise: Korean compared composed (NFC) on both sides, a repeated call in
a case whose order does not matter, and which answers say "I do not know" (a typographic apostrophe included).
Also seed 001's "no tool expected" (a document path, null), which is not "no tool allowed" ("none")."""

from __future__ import annotations

import unicodedata
from typing import Any

import pytest

from evals.scoring import CaseSpec, ToolCall, answer_check_failures, score_case
from evals.services import case_fields

NFD_NAME = unicodedata.normalize("NFD", "김하늘")


def test_a_case_typed_decomposed_matches_a_runs_composed_text() -> None:
    """Korean typed on macOS comes decomposed (NFD); a run's query, context, arguments and answer are composed."""
    assert NFD_NAME != "김하늘"
    assert answer_check_failures([{"contains": NFD_NAME}], "김하늘 님의 팀은 플랫폼팀입니다") == []
    assert answer_check_failures([{"regex": f"^{NFD_NAME}"}], "김하늘 님") == []
    assert answer_check_failures([{"contains": "김하늘"}], f"{NFD_NAME} 님") == []  # and the other way round
    spec = CaseSpec(expected_tools=[{"name": "search_employee", "args": {"name": NFD_NAME}}])
    score = score_case(
        spec, calls=[ToolCall("search_employee", {"name": "김하늘"}, True)], answer="", run_succeeded=True
    )
    assert score.passed and score.argument_match == 1.0, score.failed_checks


def test_a_tool_called_twice_passes_a_case_whose_order_does_not_matter() -> None:
    """A memo hit, or a rule's call and the model's again, is not a wrong run: which tools, not how often."""
    twice = [ToolCall("get_asset", {}, True), ToolCall("get_asset", {}, True)]
    score = score_case(CaseSpec(expected_tools=[{"name": "get_asset"}]), calls=twice, answer="", run_succeeded=True)
    assert score.passed and score.sequence_match, score.failed_checks
    both = [
        ToolCall("search_employee", {}, True),
        ToolCall("list_projects", {}, True),
        ToolCall("search_employee", {}, True),
    ]
    spec = CaseSpec(expected_tools=[{"name": "list_projects"}, {"name": "search_employee"}])
    assert score_case(spec, calls=both, answer="", run_succeeded=True).passed


def test_an_ordered_case_still_compares_the_exact_sequence_repeats_included() -> None:
    twice = [ToolCall("get_asset", {}, True), ToolCall("get_asset", {}, True)]
    spec = CaseSpec(expected_tools=[{"name": "get_asset"}], ordered=True)
    assert score_case(spec, calls=twice, answer="", run_succeeded=True).failed_checks == ["tools:order"]


@pytest.mark.parametrize(
    "answer",
    [
        "김하늘 님의 팀은 플랫폼팀이며 문제 없습니다.",
        "해당 자산은 반납되어 사용 중인 사람이 없습니다.",
        "There is no problem with this asset.",
    ],
)
def test_a_confident_answer_that_merely_says_there_is_none_is_no_i_dont_know(answer: str) -> None:
    """A bare "없습니다" ("there is none") ended many a confident answer and passed the dont_know check."""
    assert answer_check_failures([{"dont_know": True}], answer) == ["dont_know"]


@pytest.mark.parametrize(
    "answer",
    [
        "모르겠습니다.",
        "관련 규정을 찾을 수 없습니다.",
        "요청하신 내용에 해당하는 정보가 없습니다.",
        "요청하신 정보를 찾지 못했습니다. 요청 내용을 확인해 주세요.",
        "그 질문에는 답변할 수 없습니다.",
        "I don't know.",
        "I could not find that.",
    ],
)
def test_an_answer_that_says_it_does_not_know_passes_the_dont_know_check(answer: str) -> None:
    assert answer_check_failures([{"dont_know": True}], answer) == []
    assert answer_check_failures([{"dont_know": True}], unicodedata.normalize("NFD", answer)) == []


def test_an_answer_with_a_typographic_apostrophe_says_it_does_not_know() -> None:
    """Models and word processors write "don’t" (U+2019): the dont_know check missed it, and so did a contains
    check typed with the ASCII apostrophe (and the other way round)."""
    assert answer_check_failures([{"dont_know": True}], "I don’t know.") == []
    assert answer_check_failures([{"dont_know": True}], "Sorry, I can‘t find that policy.") == []
    assert answer_check_failures([{"contains": "can't"}], "I can’t say.") == []
    assert answer_check_failures([{"contains": "can’t"}], "I can't say.") == []
    assert answer_check_failures([{"contains": "won't"}], "I can’t say.") == ["contains:won't"]


def _seed_case(expected_source: Any, case_type: str) -> CaseSpec:
    """A case of seed 001 as its document gives it (the same reading as the API's and ``import_config``'s)."""
    fields = case_fields(
        {"question": "육아휴직은 얼마나 쓸 수 있나요?", "expected_source": expected_source, "type": case_type}, 0
    )
    return CaseSpec(
        expected_tools=fields["expected_tools"],
        forbidden_tools=fields["forbidden_tools"],
        answer_checks=fields["answer_checks"],
    )


@pytest.mark.parametrize(
    ("expected_source", "case_type", "call", "answer"),
    [
        (None, "no_answer", "search_docs", "관련 정보를 찾을 수 없습니다."),  # looked, found nothing, said so
        ("docs/leave_policy.md", "fact", "search_docs", "연차는 다음 해로 10일까지 이월됩니다."),  # a RAG case
    ],
)
def test_no_tool_expected_is_not_no_tool_allowed(expected_source: Any, case_type: str, call: str, answer: str) -> None:
    """Seed 001: a null source means the answer must say it does not know, a document path means no tool is
    expected; neither fails a run for looking something up (both scored ``tools:mismatch``, precision 0)."""
    spec = _seed_case(expected_source, case_type)
    score = score_case(spec, calls=[ToolCall(call, {"query": "육아휴직"}, True)], answer=answer, run_succeeded=True)
    assert score.passed and score.failed_checks == [], score.failed_checks
    assert (score.precision, score.recall, score.sequence_match) == (1.0, 1.0, True)
    silent = score_case(spec, calls=[], answer=answer, run_succeeded=True)
    assert silent.passed, silent.failed_checks


def test_none_still_fails_any_call_and_a_null_source_still_needs_i_dont_know() -> None:
    spec = _seed_case("none", "no_tool")
    called = score_case(spec, calls=[ToolCall("search_docs", {}, True)], answer="도와드릴게요", run_succeeded=True)
    assert not called.passed and called.forbidden_violations == 1
    assert called.failed_checks == ["tools:forbidden", "tools:mismatch"] and called.precision == 0.0
    made_up = score_case(
        _seed_case(None, "no_answer"),
        calls=[ToolCall("search_docs", {}, True)],
        answer="1년입니다.",
        run_succeeded=True,
    )
    assert made_up.failed_checks == ["dont_know"]


def test_an_alternative_of_no_tools_still_means_calling_nothing() -> None:
    """Only the case's own empty list is "no tool expected"; an alternative of no tools is a path of no calls."""
    spec = CaseSpec(expected_tools=[{"name": "get_asset"}], alternatives=[{"tools": [], "note": "되묻기"}])
    assert score_case(spec, calls=[], answer="", run_succeeded=True).matched == "되묻기"
    wrong = score_case(spec, calls=[ToolCall("list_projects", {}, True)], answer="", run_succeeded=True)
    assert not wrong.passed and "tools:mismatch" in wrong.failed_checks
