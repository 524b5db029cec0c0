"""The built-in ``calculate`` tool, defects s42 localtools 1 and 4.

1. A percent sign was Python's remainder: ``200000 * 15% - 1000`` answered 0 (read as ``15 % (-1000)``), ``48 * 112%``
   was a syntax error, and the manual listed ``%`` without saying what it is. A ``%`` right after a number or a
   closing parenthesis with no operand after it is now a percentage (``15%`` is 0.15); ``17 % 5`` is still the
   remainder, as is ``7 % -2`` (a sign written against its divisor); a spaced ``%`` before a spaced sign
   (``15 % - 1000``) reads either way and is refused, saying how to write each.
4. An amount typed decomposed (NFD, as macOS sends it: ``원`` as three jamo) was "not an arithmetic expression".

A percentage added to or subtracted from a number (``1000 + 10%``) silently answered 1000.1 where a pocket
calculator, and the Korean user asking for 부가세 10% 더하기, means 1100: it is refused as ambiguous, saying how to
write each; a percentage as a factor is still read. A minus sign (U+2212) copied from a document is ``-``.
"""

from __future__ import annotations

import unicodedata
from decimal import Decimal

import pytest

from mcpregistry.builtin_tools import calculate


def calc(expression: str) -> str:
    return str(calculate.invoke({"expression": expression}))


@pytest.mark.parametrize(
    ("expression", "answer"),
    [
        ("200000 * 15% - 1000", "29000"),
        ("1000 * 10% + 5", "105"),
        ("48 * 112%", "53.76"),
        ("15%", "0.15"),
        ("15 %", "0.15"),
        ("(3 + 4)% * 100", "7"),
        ("1,200,000원 * 3.3%", "39600"),
        ("200000 * (15% + 5%)", "40000"),
        ("200000 * 15%-1000", "29000"),
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
        "(200000 * 15% - 1000), and a remainder's negative divisor in parentheses (17 % (-5))"
    )


AMBIGUOUS_SUM = (
    "a percentage added to or subtracted from a number is ambiguous (1000 + 10% may mean 1000.1 or 1100): write "
    "1000 * 1.1 (or 1000 * (1 + 0.1)) to add 10%, 1000 * 0.9 to take 10% off, or 1000 + 0.1 to add the number 0.1"
)


@pytest.mark.parametrize(
    "expression",
    [
        "1000 + 10%",
        "100 - 10%",
        "1000 +10%",
        "50% - 10",
        "15%-1000",
        "(1 + 10%)",
        "1000 * (1 + 10%)",
        "-10% + 5",
        "5 - -10%",
        "(15% + 5%) + 1000",
        "1,000원 + 10%",
        "15% − 1000",
        "(1 +\r 10%)",
        "(1 +\x0c\n 10%)",
    ],
)
def test_a_percentage_added_to_or_subtracted_from_a_number_is_refused_as_ambiguous(expression: str) -> None:
    with pytest.raises(ValueError) as refused:
        calc(expression)
    assert str(refused.value) == AMBIGUOUS_SUM


@pytest.mark.parametrize(
    ("expression", "answer"),
    [
        ("200000 * 15% - 1000", Decimal("29000")),
        ("48 * 112%", Decimal("53.76")),
        ("200 ÷ 5%", Decimal("4000")),
        ("(3+4)%", Decimal("0.07")),
        ("10% ** 2", Decimal("0.01")),
        ("-10%", Decimal("-0.1")),
        ("1000 + 10% * 1000", Decimal("1100")),
        ("1000 + 10/100", Decimal("1000.1")),
        ("17 % 5 + 1", Decimal("3")),
        ("200000 * (15% + 5%) + 1000", Decimal("41000")),
        ("(2\x0c\n *10%)", Decimal("0.2")),
    ],
)
def test_a_percentage_as_a_factor_is_still_read(expression: str, answer: Decimal) -> None:
    assert Decimal(calc(expression)) == answer


@pytest.mark.parametrize(
    ("expression", "answer"),
    [
        ("1000 − 200", "800"),
        ("200000 * 15% − 1000", "29000"),
        ("−7 // 2", "-4"),
        ("３ × (１０ − ４)", "18"),
    ],
)
def test_a_minus_sign_is_read_as_minus(expression: str, answer: str) -> None:
    assert "\N{MINUS SIGN}" in expression
    assert calc(expression) == answer


def test_the_manual_says_what_a_percent_sign_means() -> None:
    described = calculate.args_schema.model_json_schema()["properties"]["expression"]["description"]  # type: ignore[union-attr]
    assert "15% 는 0.15" in described and "17 % 5 는 2" in described
    assert "퍼센트" in calculate.description and "나머지" in calculate.description
    for manual in (described, calculate.description):
        assert "인수로만" in manual and "'1000 * 1.1'" in manual and "'1000 * 0.9'" in manual


def test_a_decomposed_won_sign_is_read_as_the_composed_one() -> None:
    decomposed = unicodedata.normalize("NFD", "1,000원 * 3")
    assert decomposed != "1,000원 * 3"
    assert calc(decomposed) == "3000"
    assert calc(unicodedata.normalize("NFD", "200,000원 * 15% - 1,000원")) == "29000"
