"""The platform's shipped local tools (seed 001's agent mixes them with MCP tools): ``calculate`` and
``classify_request``. Bound by a ``local`` server whose arguments name this module (``manage.py seed_demo``).

``calculate`` parses arithmetic itself (Python's ``ast``, evaluated over ``Decimal``): numbers, + - * / // %
**, unary signs and parentheses; no names, calls or attributes (the seed's ``eval`` is "교육용" only). Its size
is bounded (characters, nodes, digits), and so are exponents and every intermediate value.
``classify_request`` reads its keyword → department table from ``RequestCategory`` rows that admins edit.
"""

from __future__ import annotations

import ast
import decimal
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from pydantic import BaseModel, Field

from agent_platform.text import nfc
from mcpregistry.local_tools import local_tool
from mcpregistry.models import RequestCategory

MAX_EXPRESSION_CHARS = 200
MAX_NODES = 100
MAX_LITERAL_DIGITS = 30
MAX_EXPONENT = 100
MAX_MAGNITUDE = Decimal(10) ** 30
UNCLASSIFIED = "미분류"

_CONTEXT = decimal.Context(prec=28, traps=[decimal.DivisionByZero, decimal.InvalidOperation, decimal.Overflow])


class CalculateInput(BaseModel):
    expression: str = Field(
        description="산술식 하나. 숫자, + - * / // % ** 와 괄호만 쓴다. 예: '48 * 1.12', '(3 + 4) * 2000000'",
        min_length=1,
        max_length=MAX_EXPRESSION_CHARS,
    )


@local_tool(args_schema=CalculateInput)
def calculate(expression: str) -> str:
    """수학 계산을 정확하게 수행한다. 수치 계산이 필요하면 암산하지 말고 이 도구를 쓴다.

    산술식(숫자, 사칙연산, //, %, **, 괄호)만 받는다. 변수나 함수 이름은 쓸 수 없다.
    결과는 소수 표기 문자열이다 (예: '48 * 1.12' → '53.76'). 식이 잘못되면 무엇이 잘못됐는지 알려 준다.
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an arithmetic expression: {exc.msg}") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise ValueError(f"the expression has more than {MAX_NODES} parts")
    result = _evaluate(tree.body)
    return _decimal_text(result)


_BINARY: dict[type[ast.operator], Callable[[Decimal, Decimal], Decimal]] = {
    ast.Add: _CONTEXT.add,
    ast.Sub: _CONTEXT.subtract,
    ast.Mult: _CONTEXT.multiply,
    ast.Div: _CONTEXT.divide,
    ast.FloorDiv: _CONTEXT.divide_int,
    ast.Mod: _CONTEXT.remainder,
}


def _evaluate(node: ast.AST) -> Decimal:
    if isinstance(node, ast.Constant) and type(node.value) in {int, float}:
        text = repr(node.value)
        if sum(ch.isdigit() for ch in text) > MAX_LITERAL_DIGITS:
            raise ValueError(f"a number has more than {MAX_LITERAL_DIGITS} digits")
        return _bounded(Decimal(text))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
        value = _evaluate(node.operand)
        return value if isinstance(node.op, ast.UAdd) else -value
    if isinstance(node, ast.BinOp):
        left, right = _evaluate(node.left), _evaluate(node.right)
        try:
            if isinstance(node.op, ast.Pow):
                if right != right.to_integral_value() or abs(right) > MAX_EXPONENT:
                    raise ValueError(f"an exponent must be a whole number between -{MAX_EXPONENT} and {MAX_EXPONENT}")
                return _bounded(_CONTEXT.power(left, right))
            operation = _BINARY.get(type(node.op))
            if operation is None:
                raise ValueError(f"the operator {type(node.op).__name__} is not arithmetic")
            return _bounded(operation(left, right))
        except decimal.DivisionByZero:
            raise ValueError("division by zero") from None
        except (decimal.InvalidOperation, decimal.Overflow):
            raise ValueError("the result is not a finite number") from None
    raise ValueError(f"only numbers and arithmetic operators are allowed, not {type(node).__name__}")


def _bounded(value: Decimal) -> Decimal:
    if abs(value) > MAX_MAGNITUDE:
        raise ValueError("a value is larger than 10^30")
    return value


def _decimal_text(value: Decimal) -> str:
    if value == value.to_integral_value():
        return str(int(value))
    return format(value.normalize(), "f")


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
