"""An eval case's answer regex is searched with a bound: a pattern that backtracks catastrophically on a long
answer (the model's, which a test cannot choose) fails its check instead of holding the scoring for ever."""

from __future__ import annotations

import time

from evals.scoring import answer_check_failures


def test_a_catastrophic_answer_regex_fails_its_check_in_bounded_time() -> None:
    began = time.monotonic()
    failed = answer_check_failures([{"regex": "(a|aa)+$"}], "a" * 60 + "!")
    assert time.monotonic() - began < 5
    assert failed == ["regex:(a|aa)+$"]


def test_an_answer_regex_still_matches_korean() -> None:
    assert answer_check_failures([{"regex": r"클라우드\w+팀"}], "김하늘 님은 클라우드운영팀 소속입니다") == []
