"""Scoring rules the seed set does not exercise: Korean compared composed (NFC) on both sides, a repeated call in
a case whose order does not matter, and which answers say "I do not know"."""

from __future__ import annotations

import unicodedata

import pytest

from evals.scoring import CaseSpec, ToolCall, answer_check_failures, score_case

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
