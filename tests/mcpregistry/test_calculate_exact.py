"""The built-in ``calculate`` tool answers exactly or says it does not. Defects held here: a 28-digit context
silently rounded values the README allows (``10**30 - 1``, ``2**95 + 1``, a 29-digit number plus 0, the negation
of a 30-digit number); a float literal was read through the Python float (17 significant digits); ``10**30 % 7``
and ``7 % 0`` both said "the result is not a finite number"; ``0 ** -1`` said a value was too large; a division
that does not end was rounded without a word; ``1e-999999999`` answered ``0``."""

from __future__ import annotations

import pytest

from mcpregistry.builtin_tools import calculate


def calc(expression: str) -> str:
    return str(calculate.invoke({"expression": expression}))


def refusal(expression: str) -> str:
    with pytest.raises(ValueError) as refused:
        calc(expression)
    return str(refused.value)


@pytest.mark.parametrize(
    ("expression", "exact"),
    [
        ("10**30 - 1", "9" * 30),
        ("99999999999999999999999999999 + 0", "9" * 29),
        ("2**95 + 1", "39614081257132168796771975169"),
        ("-(999999999999999999999999999999)", "-" + "9" * 30),
        ("10**30 % 7", "1"),
        ("10**30 // 7", "142857142857142857142857142857"),
        ("1.05 ** 30", "4.321942375150662009157288198886473341473378241062164306640625"),
    ],
)
def test_integers_and_powers_past_28_digits_are_exact(expression: str, exact: str) -> None:
    assert calc(expression) == exact


def test_a_value_past_10_to_the_30_is_refused_not_rounded_back_into_bounds() -> None:
    assert refusal("10**30 + 1") == "a value is larger than 10^30"


def test_a_float_literal_is_read_from_its_text_with_every_digit() -> None:
    assert calc("1234567890.12345678901234567890 * 1") == "1234567890.1234567890123456789"
    assert calc("0.1 + 0.2") == "0.3"
    assert calc("1_000.5 + 1e3") == "2000.5"
    assert refusal("1234567890.123456789012345678901 * 1") == "a number with more than 30 digits"


def test_a_result_that_needs_more_than_64_digits_is_refused_not_rounded() -> None:
    assert refusal("1.5 ** 100") == "the exact result has more than 64 significant digits"


@pytest.mark.parametrize("expression", ["7 % 0", "7 // 0", "7 / 0", "0 / 0", "0 % 0", "0 ** -1", "(1 / 3) % 0"])
def test_a_zero_divisor_is_called_division_by_zero(expression: str) -> None:
    assert refusal(expression) == "division by zero"


def test_a_division_that_ends_is_exact_and_says_nothing_more() -> None:
    assert calc("48 * (1 + 12 / 100)") == "53.76"
    assert calc("1 / 8") == "0.125"
    assert calc("2 ** -10") == "0.0009765625"


def test_a_division_that_does_not_end_is_rounded_and_says_so() -> None:
    note = "(not exact: a division in the expression does not end and was rounded to 64 significant digits)"
    assert calc("1 / 3") == f"about 0.{'3' * 64} {note}"
    assert calc("2 / 3") == f"about 0.{'6' * 63}7 {note}"
    assert calc("3 ** -1") == f"about 0.{'3' * 64} {note}"
    # What is made from a rounded value is said to be rounded too.
    assert calc("(1 / 3) * 3 // 1") == f"about 0 {note}"


def test_a_value_too_close_to_zero_is_refused_not_written_out_or_answered_as_zero() -> None:
    assert refusal("1e-999999999") == "a value is closer to 0 than 10^-30"
    assert refusal("(1e-20) ** 2") == "a value is closer to 0 than 10^-30"
    assert refusal("1e999999999") == "a value is larger than 10^30"
    assert calc("1e-30") == "0." + "0" * 29 + "1"


def test_zero_to_the_power_zero_is_named() -> None:
    assert refusal("0 ** 0") == "0 ** 0 has no value"


def test_the_zeros_before_a_fractions_first_digit_are_no_digits_of_its_own() -> None:
    """``0.000…001`` (10^-30 written out) is a number in bounds with one significant digit; it was refused as "a
    number with more than 30 digits". Thirty-one significant digits after them still are refused."""
    written_out = "0." + "0" * 29 + "1"
    assert calc(f"{written_out} * 2") == "0." + "0" * 29 + "2"
    assert refusal("0.000" + "1" * 31 + " * 1") == "a number with more than 30 digits"
