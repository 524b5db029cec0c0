"""The built-in ``calculate`` tool, defects s42 localtools 1 and 4.

1. A percent sign was Python's remainder: ``200000 * 15% - 1000`` answered 0 (read as ``15 % (-1000)``), ``48 * 112%``
   was a syntax error, and the manual listed ``%`` without saying what it is. A ``%`` right after a number or a
   closing parenthesis with no operand after it is now a percentage (``15%`` is 0.15); ``17 % 5`` is still the
   remainder, as is ``7 % -2`` (a sign written against its divisor); a spaced ``%`` before a spaced sign
   (``15 % - 1000``) reads either way and is refused, saying how to write each.
4. An amount typed decomposed (NFD, as macOS sends it: ``원`` as three jamo) was "not an arithmetic expression".
"""

from __future__ import annotations

import unicodedata

import pytest

from mcpregistry.builtin_tools import calculate


def calc(expression: str) -> str:
    return str(calculate.invoke({"expression": expression}))


@pytest.mark.parametrize(
    ("expression", "answer"),
    [
        ("200000 * 15% - 1000", "29000"),
        ("1000 * 10% + 5", "105"),
        ("50% - 10", "-9.5"),
        ("48 * 112%", "53.76"),
        ("15%", "0.15"),
        ("15 %", "0.15"),
        ("(3 + 4)% * 100", "7"),
        ("1,200,000원 * 3.3%", "39600"),
        ("200000 * (15% + 5%)", "40000"),
        ("15%-1000", "-999.85"),
    ],
)
def test_a_percent_sign_with_no_operand_after_it_is_a_percentage(expression: str, answer: str) -> None:
    assert calc(expression) == answer


@pytest.mark.parametrize(
    ("expression", "answer"),
    [
        ("17 % 5", "2"),
        ("17%5", "2"),
        ("-7 % 2", "1"),
        ("7 % (2)", "1"),
        ("17 % (-5)", "-3"),
        ("17 % -5", "-3"),
        ("7 %-2", "-1"),
        ("10**30 % 7", "1"),
    ],
)
def test_a_percent_sign_between_two_operands_is_still_the_remainder(expression: str, answer: str) -> None:
    assert calc(expression) == answer


@pytest.mark.parametrize("expression", ["15 % - 1000", "200000 * 15 % + 1000", "(3 + 4) % - 1"])
def test_a_spaced_percent_sign_before_a_spaced_sign_is_refused_saying_how_to_write_each(expression: str) -> None:
    with pytest.raises(ValueError) as refused:
        calc(expression)
    assert str(refused.value) == (
        "'%' followed by a sign is ambiguous: write a percentage as a decimal (15% is 0.15) or right after its number "
        "(15% - 1000), and a remainder's negative divisor in parentheses (17 % (-5))"
    )


def test_the_manual_says_what_a_percent_sign_means() -> None:
    described = calculate.args_schema.model_json_schema()["properties"]["expression"]["description"]  # type: ignore[union-attr]
    assert "15% 는 0.15" in described and "17 % 5 는 2" in described
    assert "퍼센트" in calculate.description and "나머지" in calculate.description


def test_a_decomposed_won_sign_is_read_as_the_composed_one() -> None:
    decomposed = unicodedata.normalize("NFD", "1,000원 * 3")
    assert decomposed != "1,000원 * 3"
    assert calc(decomposed) == "3000"
    assert calc(unicodedata.normalize("NFD", "200,000원 * 15% - 1,000원")) == "29000"
