"""The ``dont_know`` check after session 43's review: a refusal that first says where it looked is a refusal (a digit
alone states no fact), and a made-up fact after a refusal, or before it across a comma, is no refusal."""

from __future__ import annotations

import unicodedata

import pytest

from evals.scoring import CaseSpec, answer_check_failures, score_case

DONT_KNOW = [{"dont_know": True}]


@pytest.mark.parametrize(
    "answer",
    [
        "사내 규정집 2024년 개정판을 검색했습니다. 해당 내용은 문서에 없습니다.",
        "검색 결과 3건을 확인했습니다. 그러나 요청하신 정보는 찾을 수 없습니다.",
        "문서 2건을 살펴보았습니다. 관련 규정이 없습니다.",
        "정보가 없습니다. 인사팀에 문의해 주세요.",  # a later redirect
        "관련 정보가 없습니다, 인사팀에 문의해 주세요.",
        "해당 내용은 문서에 없습니다. 죄송합니다.",  # a later courtesy
        "해당 내용은 문서에 없습니다. 다른 정보도 없습니다.",  # a later "no more" states nothing either
        "정보가 없어, 답변을 드릴 수 없습니다.",  # a comma no claim ends before goes on with its sentence
    ],
)
def test_a_refusal_with_where_it_looked_or_a_courtesy_around_it_is_a_refusal(answer: str) -> None:
    assert answer_check_failures(DONT_KNOW, answer) == []
    assert answer_check_failures(DONT_KNOW, unicodedata.normalize("NFD", answer)) == []


@pytest.mark.parametrize(
    "answer",
    [
        "정보가 없습니다. 하지만 연차는 15일입니다.",
        "해당 규정은 문서에 없습니다. 일반적으로 육아휴직은 최대 1년까지 사용할 수 있습니다.",
        "연차는 15일입니다, 그 외 정보는 없습니다",
        "연차는 15일입니다, 관련 정보는 없습니다",  # a comma after a claim ends its sentence
        "정보가 없습니다, 하지만 연차는 15일입니다.",
        "연차는 15일입니다. 이외의 정보는 없습니다.",
        "육아휴직은 1년입니다. 그 밖에 자세한 내용은 없습니다.",
    ],
)
def test_a_made_up_fact_before_or_after_a_refusal_is_no_refusal(answer: str) -> None:
    """Seed 001's ``no_answer`` case asks that the agent makes nothing up where no source exists."""
    assert answer_check_failures(DONT_KNOW, answer) == ["dont_know"]


def test_a_case_scored_on_a_refusal_that_says_where_it_looked_passes() -> None:
    spec = CaseSpec(expected_tools=[], answer_checks=DONT_KNOW, case_type="no_tool")

    looked = score_case(
        spec,
        calls=[],
        answer="검색 결과 3건을 확인했습니다. 그러나 요청하신 정보는 찾을 수 없습니다.",
        run_succeeded=True,
    )
    made_up = score_case(spec, calls=[], answer="정보가 없습니다. 하지만 연차는 15일입니다.", run_succeeded=True)

    assert looked.passed and looked.failed_checks == []
    assert not made_up.passed and made_up.failed_checks == ["dont_know"]
