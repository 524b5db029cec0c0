"""An eval case's answer regex is searched with a bound: a pattern that backtracks catastrophically on a long
answer (the model's, which a test cannot choose) fails its check instead of holding the scoring for ever.

And it is compiled under the bound the editor applies (``bounded_regex``): a stored pattern the editor would
refuse (stored before the bound, or around the editor) failed to compile out of the scoring, or compiled
unbounded; now its check fails as refused, saying why."""

from __future__ import annotations

import time

from django.utils import translation

from evals.labels import check_label
from evals.scoring import CaseSpec, answer_check_failures, score_case


def test_a_catastrophic_answer_regex_fails_its_check_in_bounded_time() -> None:
    began = time.monotonic()
    failed = answer_check_failures([{"regex": "(a|aa)+$"}], "a" * 60 + "!")
    assert time.monotonic() - began < 5
    assert failed == ["regex:(a|aa)+$"]


def test_an_answer_regex_still_matches_korean() -> None:
    assert answer_check_failures([{"regex": r"클라우드\w+팀"}], "김하늘 님은 클라우드운영팀 소속입니다") == []


def test_a_stored_regex_that_does_not_compile_fails_its_check_as_refused_instead_of_raising() -> None:
    failed = answer_check_failures([{"contains": "팀"}, {"regex": "클라우드(팀"}], "클라우드운영팀")
    assert failed == ["regex_refused:클라우드(팀"]


def test_a_stored_regex_past_the_editors_bound_is_refused_not_compiled() -> None:
    # Cheap to compile whole (so the old scoring searched it), but past the bound the editor applies.
    assert answer_check_failures([{"regex": "(x{400}){400}"}], "x" * 10) == ["regex_refused:(x{400}){400}"]
    began = time.monotonic()  # one that takes gigabytes to compile unbounded: refused before compiling
    assert answer_check_failures([{"regex": "((a{1000}){1000}){1000}"}], "a") == [
        "regex_refused:((a{1000}){1000}){1000}"
    ]
    assert time.monotonic() - began < 5


def test_a_case_with_a_refused_regex_fails_and_the_page_says_why() -> None:
    spec = CaseSpec(expected_tools=[], answer_checks=[{"regex": "A-[0-9"}])
    score = score_case(spec, calls=[], answer="A-1001", run_succeeded=True)
    assert (score.passed, score.answer_checks, score.failed_checks) == (False, False, ["regex_refused:A-[0-9"])
    with translation.override("en"):
        label = check_label("regex_refused:A-[0-9")
    assert (
        label
        == "the check's regex A-[0-9 is refused: a character set [ is not closed with ] (at the end of the pattern)"
    )
    with translation.override("ko"):
        assert "A-[0-9" in check_label("regex_refused:A-[0-9")
