"""A rule run's stored failure message (``all_calls_failed_text``, in the run's language) reads back in every
reader's language, for each mix of failures it tells apart: the sentences read back are derived from the function
that says them, not kept by hand beside it."""

from __future__ import annotations

import itertools

import pytest
from django.utils import translation

from agents.answers import all_calls_failed_text, all_calls_failed_text_again

# The codes a rule's failed calls end with (the test's own list, not the module's).
CODES = (
    "approval:outcome_unknown",
    "tool:out_of_date",
    "approval:rejected",
    "approval:expired",
    "args:allowed:region",
    "result:empty",
    "timeout",
    "mcp:unavailable",
    "tool:error",
    "tool:error_value",
)


def _results(codes: tuple[str, ...]) -> list[dict[str, object]]:
    return [
        {"tool": f"tool_{n}", "ok": False, "error": code, "tool_error_text": "등록된 자산: A-1"}
        for n, code in enumerate(codes)
    ]


MIXES = [codes for size in (1, 2, 3) for codes in itertools.combinations(CODES, size)]


@pytest.mark.parametrize(("written", "read"), [("ko", "en"), ("en", "ko")])
def test_every_mix_of_failures_reads_back_in_the_readers_language(written: str, read: str) -> None:
    for codes in MIXES:
        results = _results(codes)
        stored = all_calls_failed_text(language=written, results=results)
        with translation.override(read):
            assert all_calls_failed_text_again(stored) == all_calls_failed_text(language=read, results=results), codes


def test_a_text_it_never_wrote_is_not_read_back() -> None:
    with translation.override("en"):
        assert all_calls_failed_text_again("도구가 응답하지 않았습니다.") is None
