"""The platform's shipped local tools (seed 001's agent mixes them with MCP tools): ``calculate`` and
``classify_request``. Bound by a ``local`` server whose arguments name this module (``manage.py seed_demo``).

``calculate`` parses arithmetic itself (Python's ``ast``, evaluated over ``Decimal``): numbers, + - * / // %
** (× and ÷ read as * and /), unary signs and parentheses; no names, calls or attributes (the seed's ``eval`` is
"교육용" only). A number may group its digits with commas as amounts are written (``1,200,000``: a comma only
between groups of three digits, anything else is refused, never read as Python's tuple), and a ``원`` right after
a number is read as the number (``1,000원 * 3`` is 3000: the answer is the number, without the unit). Its size
is bounded (characters, nodes, digits), and so are exponents and every value (at most 10^30, and 0 or at least
10^-30 away from it). Its answers are exact or say they are not: a number is read from its own text (never
through a binary float), + - * // % and powers compute in 64 significant digits and refuse a result that would
need more, and only a division that does not end (1/3, 3 ** -1) is rounded, the answer then saying so. ``//`` and
``%`` are Python's, as the syntax is: floor division (``-7 // 2`` is -4) and a remainder with the divisor's sign
(``-7 % 2`` is 1, ``7 % -2`` is -1). A ``%`` right after a number or a closing parenthesis with no operand after
it (at the end, or before ``)``, ``*``, ``/``, or, written against its number, before ``+`` or ``-``) is a
percentage, as people write one (``200000 * 15% - 1000`` is 29000, ``48 * 112%`` is 53.76): that operand divided by
100. ``17 % 5`` (an operand after it, a sign against it too: ``7 % -2``) is the remainder. A spaced ``%`` before a
spaced sign (``15 % - 1000``) could be either and is refused, saying how to write each. A percentage is a factor
(of ``*``, ``/``, ``//``, ``%``, ``**``): one added to or subtracted from a number (``1000 + 10%``, ``50% - 10``,
``-10% + 5``) is refused as ambiguous, as a pocket calculator reads it as 1100 and the syntax as 1000.1; the refusal
says how to write each. Percentages added to each other (``200000 * (15% + 5%)``) are one percentage. A minus sign
(U+2212, ``−``, as documents print it) is ``-``. A refusal of the expression as written (what is not arithmetic, an
ambiguous ``%``) is ``ArgumentRefused``: the gate asks the model to rewrite it; what fails in computing one (a
division by zero, a value past the bounds) is the tool's error.
``classify_request`` reads its keyword → department table from ``RequestCategory`` rows that admins edit.
"""

from __future__ import annotations

import ast
import decimal
import io
import re
import tokenize
from collections.abc import Callable
from decimal import Decimal
from typing import Any, NamedTuple

from django.utils.translation import gettext as _
from pydantic import BaseModel, Field

from agent_platform.text import nfc
from mcpregistry.local_tools import ArgumentRefused, local_tool
from mcpregistry.models import RequestCategory

MAX_EXPRESSION_CHARS = 200
# Full-width ASCII (U+FF01–U+FF5E: "４８ ＊ １．１２", as a Korean or Japanese input method types in full-width
# mode) and the ideographic space, read as the ASCII they stand for. Only these: NFKC would also read "3²" as "32".
FULL_WIDTH_AS_ASCII = {0xFF01 + i: 0x21 + i for i in range(94)} | {0x3000: 0x20}
# × and ÷ as written by hand (and by a model quoting the user), and the minus sign (U+2212) as documents print it
# (text copied from one: ``1000 − 200``), read as Python's operators.
OPERATOR_SIGNS = {ord("×"): ord("*"), ord("÷"): ord("/"), ord("\N{MINUS SIGN}"): ord("-")}
# The line breaks Python's parser reads (a lone carriage return is one), for the positions of its nodes.
_LINE_BREAK = re.compile(r"\r\n?|\n")
# A number whose digits are grouped by commas, three to a group (1,200,000), not inside a longer word or number
# (0x1,000 and 1.5,000 are refused): its commas are dropped. Any other comma is Python's tuple, refused.
_DIGIT_GROUPS = re.compile(r"(?<![\w.])[0-9]{1,3}(?:,[0-9]{3})+(?!\w)")
# The won sign right after a number (1,000원), not a word that starts with it (1000원짜리 is refused).
_WON = re.compile(r"(?<=[0-9])\s*원(?!\w)")
MAX_NODES = 100
MAX_LITERAL_DIGITS = 30
MAX_EXPONENT = 100
MAX_MAGNITUDE = Decimal(10) ** 30
MIN_MAGNITUDE = Decimal(10) ** -30
# Every sum, difference and remainder of two values in bounds (30 integer digits) holds with 30 decimals to
# spare, and so does every product of two 30-digit numbers: 28 digits (the default) silently rounded 10**30 - 1.
SIGNIFICANT_DIGITS = 64
UNCLASSIFIED = "미분류"

_SIGNALS = [decimal.DivisionByZero, decimal.InvalidOperation, decimal.Overflow]
# Where a result must be exact: a digit it would lose raises ``Inexact``.
_EXACT = decimal.Context(prec=SIGNIFICANT_DIGITS, traps=[*_SIGNALS, decimal.Inexact])
# Where it cannot be (a division that does not end, or an operand one made): rounded half-even.
_ROUNDED = decimal.Context(prec=SIGNIFICANT_DIGITS, traps=_SIGNALS)


class CalculateInput(BaseModel):
    expression: str = Field(
        description=(
            "산술식 하나. 숫자, + - * / // % ** (×, ÷) 와 괄호만 쓴다. 숫자 바로 뒤의 % 는 퍼센트(15% 는 0.15), "
            "양쪽에 피연산자가 있는 % 는 나머지(17 % 5 는 2)다. 퍼센트는 곱하거나 나누는 인수로만 쓴다: 숫자에 "
            "더하거나 빼는 퍼센트('1000 + 10%')는 모호해서 거절된다. 10% 더하기는 '1000 * 1.1', 10% 할인은 "
            "'1000 * 0.9' 로 쓴다. 천 단위 쉼표(1,200,000)와 금액 뒤 '원'은 읽는다. "
            "예: '48 * 1.12', '200000 * 15% - 1000', '(3 + 4) * 2000000', '1,200,000 * 0.1'"
        ),
        min_length=1,
        max_length=MAX_EXPRESSION_CHARS,
    )


@local_tool(args_schema=CalculateInput)
def calculate(expression: str) -> str:
    """수학 계산을 정확하게 수행한다. 수치 계산이 필요하면 암산하지 말고 이 도구를 쓴다.

    산술식(숫자, 사칙연산, //, %, **, 괄호)만 받는다. 변수나 함수 이름은 쓸 수 없다.
    숫자 바로 뒤의 % 는 퍼센트다 ('200000 * 15% - 1000' → '29000'). 양쪽에 피연산자가 있는 % 는 나머지다 ('17 % 5' → '2').
    퍼센트는 곱하거나 나누는 인수로만 쓴다. '1000 + 10%' 처럼 숫자에 더하거나 빼면 모호해서 거절된다:
    10% 더하기는 '1000 * 1.1', 10% 할인은 '1000 * 0.9' 로 쓴다.
    결과는 소수 표기 문자열이다 (예: '48 * 1.12' → '53.76'). 식이 잘못되면 무엇이 잘못됐는지 알려 준다.
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise _refused(_("the expression is longer than %(limit)d characters") % {"limit": MAX_EXPRESSION_CHARS})
    source, percentages = _percentages(_arithmetic_source(expression))
    stray = next((char for char in source if char in _PARSER_ONLY), None)
    if stray is not None:  # Python's parser drops a comment ("3 + 4 # 5" was 7) and joins lines at a backslash
        raise _refused(_syntax_problem(stray))
    try:
        tree = ast.parse(source, mode="eval")
    except SyntaxError:
        raise _refused(_syntax_problem(source)) from None
    if sum(1 for _node in ast.walk(tree)) > MAX_NODES:
        raise _refused(_("the expression has more than %(limit)d parts") % {"limit": MAX_NODES})
    result = _evaluate(tree.body, source)  # first: what is not arithmetic is refused as that
    _refuse_percentage_sums(tree.body, percentages)
    if result.rounded:
        return _(
            "about %(value)s (not exact: a division in the expression does not end and was rounded to "
            "%(digits)d significant digits)"
        ) % {"value": _decimal_text(result.value), "digits": SIGNIFICANT_DIGITS}
    return _decimal_text(result.value)


# Characters Python's parser reads that are no arithmetic: a comment's start and a line continuation.
_PARSER_ONLY = frozenset("#\\")


def _arithmetic_source(expression: str) -> str:
    """``expression`` as Python's arithmetic: full-width characters as the ASCII they stand for, × and ÷ as * and
    /, a ``원`` after a number dropped, and a number's digit-group commas (1,200,000) dropped. Composed (NFC) first:
    a ``원`` typed decomposed (three jamo, as macOS sends it) is the sign too."""
    source = nfc(expression).translate(FULL_WIDTH_AS_ASCII | OPERATOR_SIGNS).strip()
    source = _WON.sub("", source)
    return _DIGIT_GROUPS.sub(lambda number: number.group().replace(",", ""), source)


# What may follow a percent sign: nothing, a closing parenthesis, or an operator that takes no sign (a remainder
# could not be followed by these). ``+`` and ``-`` may also start the remainder's divisor (``17 % -5``).
_AFTER_PERCENT = frozenset({")", "*", "/", "**", "//"})
_SIGNS = frozenset({"+", "-"})
# What a percentage's ``%`` is written as (after a ``(`` before its operand): its operand divided by 100.
_PER_HUNDRED = "/100)"


def _percentages(source: str) -> tuple[str, frozenset[tuple[int, int]]]:
    """``source`` with each ``%`` that is a percentage as the division of its operand by 100: ``15%`` as
    ``(15/100)``, ``(3 + 4)%`` as ``((3 + 4)/100)``; and where each of those ``100`` is, as the parser's nodes say
    (line, UTF-8 column), to tell a percentage from a division written as one. A ``%`` is a percentage right after
    a number or a closing parenthesis where no operand follows it: at the end, before ``)``, ``*``, ``/``, ``**``,
    ``//``, or, written against its operand (``15% - 1000``), before ``+`` or ``-``; anything else is Python's
    remainder (``17 % 5``, ``7 % -2``: a sign written against its number). A spaced ``%`` before a spaced sign
    (``15 % - 1000``) is refused: it reads either way. A source that does not tokenize is returned as it is, for the
    parser to say why."""
    # The lines as the tokenizer reads them (``splitlines`` would also break at a form feed, misplacing an edit).
    lines = io.StringIO(source).readlines()
    try:
        tokens = [
            t
            for t in tokenize.generate_tokens(iter([*lines, ""]).__next__)
            if t.type not in {tokenize.NEWLINE, tokenize.NL, tokenize.ENDMARKER, tokenize.INDENT, tokenize.DEDENT}
        ]
    except (tokenize.TokenError, SyntaxError):
        return source, frozenset()
    line_starts = [0]
    for line in lines:
        line_starts.append(line_starts[-1] + len(line))

    def offset(position: tuple[int, int]) -> int:
        return line_starts[position[0] - 1] + position[1]

    opened: list[int] = []
    group_start: dict[int, int] = {}  # a closing parenthesis's token index -> its opening one's
    edits: list[tuple[int, int, str]] = []  # (start, end, text) in the source
    for index, token in enumerate(tokens):
        if token.type == tokenize.OP and token.string == "(":
            opened.append(index)
        elif token.type == tokenize.OP and token.string == ")" and opened:
            group_start[index] = opened.pop()
        if token.type != tokenize.OP or token.string != "%" or index == 0:
            continue
        before = tokens[index - 1]
        if before.type == tokenize.NUMBER:
            operand = before
        elif before.string == ")" and index - 1 in group_start:
            operand = tokens[group_start[index - 1]]
        else:
            continue  # no operand before it: the parser says why
        following = tokens[index + 1] if index + 1 < len(tokens) else None
        after = following.string if following is not None else None
        if following is not None and after in _SIGNS and before.end != token.start:
            if index + 2 < len(tokens) and tokens[index + 2].start == following.end:
                continue  # the sign is its divisor's: 7 % -2, a remainder
            raise _refused(
                _(
                    "'%%' followed by a sign is ambiguous: write a percentage as a decimal (15%% is 0.15) or "
                    "right after its number (200000 * 15%% - 1000), and a remainder's negative divisor in "
                    "parentheses (17 %% (-5))"
                )
                % {}
            )
        if after is None or after in _AFTER_PERCENT or after in _SIGNS:
            edits.append((offset(operand.start), offset(operand.start), "("))
            edits.append((offset(token.start), offset(token.end), _PER_HUNDRED))
    written: list[str] = []
    hundreds: set[tuple[int, int]] = set()
    copied = 0
    for start, end, text in sorted(edits):
        written.append(source[copied:start])
        if text == _PER_HUNDRED:
            *lines_before, line = _LINE_BREAK.split("".join(written) + "/")
            hundreds.add((len(lines_before) + 1, len(line.encode())))
        written.append(text)
        copied = end
    written.append(source[copied:])
    return "".join(written), frozenset(hundreds)


def _is_percentage(node: ast.expr, percentages: frozenset[tuple[int, int]]) -> bool:
    """Whether ``node`` is a percentage: one ``_percentages`` wrote (its ``100`` where it put one), one signed
    (``-10%``), or a sum or difference of two (``15% + 5%``, itself a percentage)."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
        return _is_percentage(node.operand, percentages)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub):
        return _is_percentage(node.left, percentages) and _is_percentage(node.right, percentages)
    return (
        isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.Div)
        and (node.right.lineno, node.right.col_offset) in percentages
    )


def _refuse_percentage_sums(tree: ast.expr, percentages: frozenset[tuple[int, int]]) -> None:
    """Refuses a percentage added to or subtracted from a number (``1000 + 10%``, ``50% - 10``, ``(1 + 10%)``,
    ``-10% + 5``), at any depth: a pocket calculator reads ``1000 + 10%`` as 1100, the syntax as 1000.1, and either
    answer would be wrong for someone. A percentage is a factor (``200000 * 15% - 1000``: the product is the
    operand of ``-``); percentages added to each other are one percentage."""
    if not percentages:
        return
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.BinOp)
            and isinstance(node.op, ast.Add | ast.Sub)
            and _is_percentage(node.left, percentages) != _is_percentage(node.right, percentages)
        ):
            raise _refused(
                _(
                    "a percentage added to or subtracted from a number is ambiguous (1000 + 10%% may mean 1000.1 "
                    "or 1100): write 1000 * 1.1 (or 1000 * (1 + 0.1)) to add 10%%, 1000 * 0.9 to take 10%% off, "
                    "or 1000 + 0.1 to add the number 0.1"
                )
                % {}
            )


def _refused(message: str) -> ArgumentRefused:
    """A refusal of the expression as written, which the model can rewrite (the message says how): the gate's
    ``args:*`` refusal, counted toward the tool's self-correction cap, not a ``tool:error`` not to retry. What
    fails in computing a well-written expression (a division by zero, a value past the bounds) stays an error."""
    return ArgumentRefused(message, argument="expression")


# What an expression that does not parse may hold besides letters (names, refused on their own), digits and
# spaces: arithmetic's signs, a decimal point, a digit group's ``_`` or ``,`` (refused on their own where they stand
# wrong).
_ARITHMETIC_SIGNS = frozenset(".+-*/%()_,")


def _syntax_problem(source: str) -> str:
    """Why ``source``, which Python's parser refused, is not arithmetic, in the reader's language (the parser's
    own text is English): a character that is not part of arithmetic (named, with its code point), a parenthesis
    left open or one closed that was never opened; else that it is not arithmetic, no more."""
    for char in source:
        if not (char.isalnum() or char.isspace() or char in _ARITHMETIC_SIGNS):
            code = f"U+{ord(char):04X}"
            return _("not an arithmetic expression: %(char)s is not part of arithmetic") % {
                "char": f"'{char}' ({code})" if char.isprintable() else code
            }
    depth = 0
    for char in source:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth < 0:
            return _("not an arithmetic expression: a closing parenthesis has no opening one")
    if depth:
        return _("not an arithmetic expression: a parenthesis is opened and never closed")
    return _("not an arithmetic expression")


def _not_arithmetic() -> ValueError:
    return _refused(
        _(
            "only numbers, the operators + - * / // % ** (× and ÷ too) and parentheses are allowed; a comma only "
            "between groups of three digits, as in 1,200,000"
        )
    )


class _Number(NamedTuple):
    value: Decimal
    rounded: bool  # a division that does not end went into it


def _floor_divmod(context: decimal.Context, dividend: Decimal, divisor: Decimal) -> tuple[Decimal, Decimal]:
    """``(dividend // divisor, dividend % divisor)`` as Python computes them: the quotient rounded toward negative
    infinity, the remainder taking the divisor's sign (``-7 // 2`` is -4, ``-7 % 2`` is 1). Decimal's own
    ``divide_int`` and ``remainder`` truncate toward zero (-3 and -1): where a remainder is left and its sign (the
    dividend's) is not the divisor's, the quotient is one lower and the remainder one divisor further. Raises
    the context's signals as they do (a zero divisor, a quotient past its digits)."""
    quotient, remainder = context.divmod(dividend, divisor)
    if not remainder.is_zero() and remainder.is_signed() != divisor.is_signed():
        return context.subtract(quotient, Decimal(1)), context.add(remainder, divisor)
    return quotient, remainder


def _floor_divide(context: decimal.Context, dividend: Decimal, divisor: Decimal) -> Decimal:
    return _floor_divmod(context, dividend, divisor)[0]


def _floor_remainder(context: decimal.Context, dividend: Decimal, divisor: Decimal) -> Decimal:
    return _floor_divmod(context, dividend, divisor)[1]


_BINARY: dict[type[ast.operator], Callable[[decimal.Context, Decimal, Decimal], Decimal]] = {
    ast.Add: decimal.Context.add,
    ast.Sub: decimal.Context.subtract,
    ast.Mult: decimal.Context.multiply,
    ast.Div: decimal.Context.divide,
    ast.FloorDiv: _floor_divide,
    ast.Mod: _floor_remainder,
    ast.Pow: decimal.Context.power,
}
_DIVISIONS = (ast.Div, ast.FloorDiv, ast.Mod)


def _evaluate(node: ast.AST, source: str) -> _Number:
    if isinstance(node, ast.Constant) and type(node.value) in {int, float}:
        return _Number(_literal(node, source), rounded=False)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
        operand = _evaluate(node.operand, source)
        if isinstance(node.op, ast.UAdd):
            return operand
        # ``copy_negate``, not ``-``: the operator rounds to the thread's context (28 digits).
        return _Number(operand.value.copy_negate(), operand.rounded)
    if isinstance(node, ast.BinOp):
        operation = _BINARY.get(type(node.op))
        if operation is None:
            raise _not_arithmetic()
        left, right = _evaluate(node.left, source), _evaluate(node.right, source)
        if isinstance(node.op, ast.Pow):
            exponent = right.value
            if exponent != exponent.to_integral_value() or exponent.copy_abs() > MAX_EXPONENT:
                raise ValueError(
                    _("an exponent must be a whole number between -%(limit)d and %(limit)d") % {"limit": MAX_EXPONENT}
                )
            if left.value.is_zero() and exponent < 0:
                # Decimal answers Infinity here without a signal.
                raise ValueError(_("division by zero"))
        # A division, or a power below zero (1 / x ** n), may have no exact decimal result: only those round.
        may_round = isinstance(node.op, ast.Div) or (isinstance(node.op, ast.Pow) and right.value < 0)
        return _apply(operation, node.op, left, right, may_round=may_round)
    raise _not_arithmetic()


def _literal(node: ast.Constant, source: str) -> Decimal:
    """A number as written: an int's value is exact (also hex, octal, binary), a float's own text is read
    into ``Decimal`` (``repr`` of the Python float kept 17 significant digits of a 30-digit literal)."""
    if type(node.value) is int:
        text = str(node.value)
        significand = text
    else:
        # A parsed node always has its position; create_decimal would refuse "" (never reached).
        text = (ast.get_source_segment(source, node) or "").replace("_", "")
        significand = text.lower().partition("e")[0]
    # Its significant digits: the zeros before the first other digit (0.000…001) hold no place of the value.
    if sum(ch.isdigit() for ch in significand.replace(".", "").lstrip("0")) > MAX_LITERAL_DIGITS:
        raise ValueError(_("a number with more than %(limit)s digits") % {"limit": MAX_LITERAL_DIGITS})
    try:
        value = _EXACT.create_decimal(text)
    except decimal.Overflow:  # an exponent past what Decimal holds (1e999999999)
        raise ValueError(_("a value is larger than 10^30")) from None
    except decimal.Inexact:  # closer to 0 than Decimal holds (1e-999999999); 30 digits never round
        raise ValueError(_("a value is closer to 0 than 10^-30")) from None
    return _bounded(value)


def _apply(
    operation: Callable[[decimal.Context, Decimal, Decimal], Decimal],
    operator: ast.operator,
    left: _Number,
    right: _Number,
    *,
    may_round: bool,
) -> _Number:
    """``left operator right``, exact unless an operand was rounded already or ``may_round`` and it cannot be.
    Raises ``ValueError`` with a translated reason for every failure."""
    try:
        if not (left.rounded or right.rounded):
            try:
                return _Number(_bounded(operation(_EXACT, left.value, right.value)), rounded=False)
            except decimal.Inexact as lost:
                if isinstance(lost, decimal.Overflow) or not may_round:
                    raise
        return _Number(_bounded(operation(_ROUNDED, left.value, right.value)), rounded=True)
    except decimal.Overflow:
        raise ValueError(_("a value is larger than 10^30")) from None
    except decimal.Inexact:
        raise ValueError(
            _("the exact result has more than %(digits)d significant digits") % {"digits": SIGNIFICANT_DIGITS}
        ) from None
    except (decimal.DivisionByZero, decimal.InvalidOperation) as exc:
        raise ValueError(_failure(exc, operator, left.value, right.value)) from None


def _failure(exc: decimal.DecimalException, operator: ast.operator, left: Decimal, right: Decimal) -> str:
    """Why ``left operator right`` failed. The C module raises the trapped signal with the conditions behind it
    as its argument (``InvalidOperation([DivisionImpossible])``), the pure-Python one the condition itself; and
    ``x % 0`` is a bare ``InvalidOperation``, so a zero divisor is looked at too."""
    conditions = {type(exc), *(exc.args[0] if exc.args and isinstance(exc.args[0], list) else [])}
    if any(issubclass(c, decimal.DivisionByZero | decimal.DivisionUndefined) for c in conditions) or (
        isinstance(operator, _DIVISIONS) and right.is_zero()
    ):
        return _("division by zero")
    if any(issubclass(c, decimal.DivisionImpossible) for c in conditions):
        return _("the whole-number quotient has more than %(digits)d digits") % {"digits": SIGNIFICANT_DIGITS}
    if isinstance(operator, ast.Pow) and left.is_zero() and right.is_zero():
        return _("0 ** 0 has no value")
    return _("the result is not a finite number")


def _bounded(value: Decimal) -> Decimal:
    # ``copy_abs``, not ``abs``: the builtin rounds to the thread's context (28 digits) before comparing.
    magnitude = value.copy_abs()
    if magnitude > MAX_MAGNITUDE:
        raise ValueError(_("a value is larger than 10^30"))
    if magnitude and magnitude < MIN_MAGNITUDE:
        # Written out in full, a value this small is that many zeros (1e-999999 was a megabyte of answer).
        raise ValueError(_("a value is closer to 0 than 10^-30"))
    return value


def _decimal_text(value: Decimal) -> str:
    if value == value.to_integral_value():
        return str(int(value))
    # ``normalize`` under the thread's context would round to its 28 digits.
    return format(value.normalize(_EXACT), "f")


class ClassifyRequestInput(BaseModel):
    request: str = Field(description="분류할 문의 원문. 예: '프린터가 고장 났어요'", min_length=1, max_length=500)


@local_tool(args_schema=ClassifyRequestInput)
def classify_request(request: str) -> dict[str, Any]:
    """지원 문의를 담당 부서로 분류한다.

    문의가 어느 부서 소관인지 물을 때 사용한다. 직원·프로젝트 조회에는 사용하지 않는다.
    {"department": 부서, "matched": [근거 키워드]} 를 돌려준다. 맞는 부서가 없으면 department 가 '미분류'이다.
    """
    # Both sides composed (NFC): a request or a keyword typed decomposed (stored so before keywords were
    # composed on save) reads the same and must match the same.
    text = nfc(request).casefold()
    best: tuple[int, int, str, list[str]] | None = None
    for category in RequestCategory.objects.filter(enabled=True).order_by("order", "department"):
        keywords = dict.fromkeys(nfc(str(k)) for k in category.keywords)
        matched = [k for k in keywords if k.casefold() in text]
        if matched and (best is None or len(matched) > best[0]):
            best = (len(matched), category.order, nfc(category.department), matched)
    if best is None:
        return {"department": UNCLASSIFIED, "matched": []}
    return {"department": best[2], "matched": best[3]}
