"""A regular expression's error in the reader's language (reviewer's defect 3): ``agent_platform.text.
regex_error_text`` words the common ``re``/``regex`` messages and says where, counted from 1; a rule's regex, a
contract's argument pattern and an eval case's answer regex all use it (they showed the modules' English, "at
position 2", on Korean pages)."""

from __future__ import annotations

import re

import pytest
import regex  # type: ignore[import-untyped]
from django.utils import translation
from pydantic import ValidationError as PydanticValidationError

from agent_platform.text import regex_error_text
from agents.deterministic import WhenSpec
from evals.scoring import case_problems
from mcpregistry.contracts import ArgSpec, spec_problems


def error_of(module: object, pattern: str) -> BaseException:
    try:
        module.compile(pattern)  # type: ignore[attr-defined]
    except Exception as exc:  # noqa: BLE001 (whatever the module raises is what is worded)
        return exc
    raise AssertionError(f"{pattern!r} compiled")


@pytest.mark.parametrize(
    ("module", "pattern", "text"),
    [
        (re, "[a", "a character set [ is not closed with ] (at character 1)"),
        (regex, "[a", "a character set [ is not closed with ] (at the end of the pattern)"),
        (re, "x(a", "a ( is not closed with ) (at character 2)"),
        (regex, "(a", "a ( is not closed with ) (at the end of the pattern)"),
        (re, "a)", "a ) closes no group (at character 2)"),
        (re, "*a", "a repeat (*, +, ? or {n}) follows nothing it could repeat (at character 1)"),
        (re, r"\qa", r"unknown escape: \q (at character 1)"),
        (re, "(?<name>a)", "a named group is written (?P<name>…), not (?<name>…) (at character 2)"),
        (re, "(?Xa)", "unknown (?…) construct: ?X (at character 2)"),
        (re, "a**", "a repeat follows another repeat (as in a**) (at character 3)"),
        (
            re,
            "[z-a]",
            "a character range runs backwards (its first character comes after its last): z-a (at character 2)",
        ),
        (re, "(?<=a+)b", "a look-behind must match a fixed number of characters"),
        (re, "a{99999999999}", "a repeat count is too large"),
        (re, "a{2,1}", "a repeat's minimum is greater than its maximum (at character 3)"),
    ],
)
def test_the_common_errors_are_worded_with_their_place_counted_from_one(
    module: object, pattern: str, text: str
) -> None:
    assert regex_error_text(error_of(module, pattern)) == text


def test_a_message_not_known_is_kept_as_the_module_wrote_it_with_its_place() -> None:
    assert regex_error_text(error_of(re, "(?i")) == "missing -, : or ) (at the end of the pattern)"


def test_its_words_are_the_catalogues() -> None:
    with translation.override("ko"):
        assert (
            regex_error_text(RecursionError("maximum recursion depth exceeded")) == "그룹이 너무 깊이 중첩되어 있습니다"
        )


def test_a_rules_regex_error_is_worded() -> None:
    with pytest.raises(PydanticValidationError) as caught:
        WhenSpec.model_validate({"regex": "(?P<name>[가-힣"})
    assert spec_problems(caught.value, WhenSpec) == [
        "regex: not a valid regular expression: a character set [ is not closed with ] (at character 10)"
    ]


def test_a_contracts_pattern_error_is_worded() -> None:
    with pytest.raises(PydanticValidationError) as caught:
        ArgSpec.model_validate({"pattern": "a)"})
    [problem] = spec_problems(caught.value, ArgSpec)
    assert problem.endswith("not a valid regular expression: a ) closes no group (at character 2)"), problem


def test_an_answer_regex_error_names_the_regex() -> None:
    """Named by itself: the admin's box of answer regexes skips its blank lines, so a count of the regexes was no
    line number (a bad regex on the box's fourth line was told as "line 2")."""
    checks = [{"contains": "팀"}, {"regex": "A-[0-9]{4}"}, {"regex": "[0-9"}, {"regex": "(((a{1000}){1000}){1000})"}]
    problems = case_problems(expected_tools=[], forbidden_tools=[], answer_checks=checks, alternatives=[])
    assert problems == {
        "answer_checks": [
            "[0-9: not a valid regular expression: a character set [ is not closed with ] (at the end of the pattern)",
            "(((a{1000}){1000}){1000}): not a valid regular expression: a repeat count is too large",
        ]
    }
    with translation.override("ko"):
        problems = case_problems(expected_tools=[], forbidden_tools=[], answer_checks=checks, alternatives=[])
    assert problems["answer_checks"][0].startswith("[0-9: 올바른 정규식이 아닙니다: "), problems
