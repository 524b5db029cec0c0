"""Seed 004's contract checks as pure functions: every reason code, before and after the call."""

from __future__ import annotations

import random
from typing import Literal

import pytest
from django.utils import translation

from mcpregistry.contracts import (
    annotation_risk_hint,
    argument_constraints,
    backoff_delay,
    check_args,
    check_result,
    classify_tool_error,
    contract_defaults,
)

STOCK = {
    "sku": {"type": "str", "required": True},
    "region": {"type": "str", "required": True, "allowed": ["busan", "jeju", "seoul"]},
    "limit": {"type": "int", "required": True, "min": 1, "max": 2},
}
GOOD = {"sku": "A-1", "region": "busan", "limit": 2}


def reason_of(args, constraints=STOCK, unknown="refuse"):  # type: ignore[no-untyped-def]
    _clean, verdict = check_args(constraints, args, unknown=unknown)
    return verdict.reason if verdict else None


def test_good_arguments_pass() -> None:
    assert reason_of(GOOD) is None


def test_a_missing_argument_is_named() -> None:
    assert reason_of({"sku": "A-1", "region": "busan"}) == "args:missing:limit"


def test_a_bool_is_refused_where_an_int_is_expected() -> None:
    assert reason_of({**GOOD, "limit": True}) == "args:type:limit"


def test_a_numeric_string_is_not_a_number() -> None:
    assert reason_of({**GOOD, "limit": "2"}) == "args:type:limit"


@pytest.mark.parametrize("value", [True, False, "2", [1]])
def test_a_range_without_a_type_still_refuses_what_is_not_a_number(value) -> None:
    """Seed 004: bool is a subclass of int, so measure a number only after ruling out a bool; and a numeric
    string is not a number. A range alone (an admin's contract without a type) used to let these through."""
    _clean, verdict = check_args({"limit": {"required": True, "min": 1, "max": 2}}, {"limit": value})
    assert verdict is not None and verdict.reason == "args:type:limit"
    assert "must be a number" in verdict.detail
    assert check_args({"limit": {"required": True, "min": 1, "max": 2}}, {"limit": 2})[1] is None


def test_a_range_on_an_argument_typed_other_than_a_number_is_not_read() -> None:
    """A contract may carry a range beside a text type (pre-filled from ``{"type": ["string", "integer"],
    "minimum": 1}``): the range is not a number's there, and must not refuse every call."""
    assert reason_of({"q": "abc"}, {"q": {"type": "str", "min": 1}}) is None
    assert reason_of({"q": 5}, {"q": {"type": "str", "min": 1}}) == "args:type:q"


def test_an_allowed_list_of_numbers_does_not_take_a_bool_nor_one_of_bools_a_number() -> None:
    assert reason_of({"n": True}, {"n": {"allowed": [0, 1, 2]}}) == "args:allowed:n"
    assert reason_of({"n": 1}, {"n": {"allowed": [True, False]}}) == "args:allowed:n"
    assert reason_of({"n": 1}, {"n": {"allowed": [0, 1, 2]}}) is None
    assert reason_of({"n": 1.0}, {"n": {"allowed": [0, 1, 2]}}) is None  # JSON has one number type
    assert reason_of({"n": False}, {"n": {"allowed": [True, False]}}) is None


def test_an_optional_arguments_type_and_limits_are_read_from_its_one_non_null_branch() -> None:
    """Pydantic (FastMCP) writes ``limit: int | None = Field(None, ge=1, le=50)`` as an anyOf with null."""
    schema = {
        "type": "object",
        "properties": {
            "limit": {"anyOf": [{"type": "integer", "minimum": 1, "maximum": 50}, {"type": "null"}], "default": None},
            "region": {"oneOf": [{"type": "string", "enum": ["busan", "seoul"]}, {"type": "null"}]},
            "either": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
        },
    }
    assert argument_constraints(schema) == {
        "limit": {"required": False, "type": "int", "min": 1, "max": 50},
        "region": {"required": False, "type": "str", "allowed": ["busan", "seoul"]},
        "either": {"required": False},
    }
    constraints = argument_constraints(schema)
    assert reason_of({"limit": None}, constraints) is None  # null for an optional argument: not given, not sent
    assert check_args(constraints, {"limit": None, "region": "busan"})[0] == {"region": "busan"}
    # Where the tool's default is not null, null may mean something of its own ("no limit"): sent as it is.
    schema["properties"]["limit"]["default"] = 10
    assert check_args(constraints, {"limit": None}, input_schema=schema) == ({"limit": None}, None)
    assert reason_of({"limit": 0}, constraints) == "args:range:limit"
    assert reason_of({"limit": None}, {"limit": {"type": "int", "required": True}}) == "args:type:limit"


def test_an_out_of_range_number_is_refused() -> None:
    assert reason_of({**GOOD, "limit": 20}) == "args:range:limit"
    assert reason_of({**GOOD, "limit": 0}) == "args:range:limit"


def test_a_value_outside_the_allowed_list_is_refused_and_says_what_is_allowed() -> None:
    _clean, verdict = check_args(STOCK, {**GOOD, "region": "daegu"})
    assert verdict is not None and verdict.reason == "args:allowed:region"
    assert "busan, jeju, seoul" in verdict.detail


def test_an_invented_argument_name_is_refused_with_a_hint() -> None:
    _clean, verdict = check_args(STOCK, {**GOOD, "sku_id": "A-1"})
    assert verdict is not None and verdict.reason == "args:unknown:sku_id"
    assert "sku" in verdict.detail


NO_ARGUMENTS = {"type": "object", "properties": {}}


def test_a_tool_without_arguments_refuses_an_invented_one() -> None:
    """Seed 004: an argument the contract does not have is refused, also where the tool has none at all."""
    _clean, verdict = check_args({}, {"verbose": True}, input_schema=NO_ARGUMENTS)
    assert verdict is not None and verdict.reason == "args:unknown:verbose"
    assert "takes no arguments" in verdict.detail
    assert check_args({}, {}, input_schema=NO_ARGUMENTS) == ({}, None)
    assert check_args({}, {"verbose": True}, input_schema=NO_ARGUMENTS, unknown="drop") == ({}, None)
    with translation.override("ko"):
        assert "인자가 없는 도구" in check_args({}, {"v": 1}, input_schema=NO_ARGUMENTS)[1].detail  # type: ignore[union-attr]


def test_without_contract_arguments_the_schema_says_which_names_exist() -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    assert reason_of({"town": "Seoul"}, constraints={}) is None  # no schema known: nothing to compare with
    assert check_args({}, {"town": "Seoul"}, input_schema=schema)[1].reason == "args:unknown:town"  # type: ignore[union-attr]
    assert check_args({}, {"city": "Seoul"}, input_schema=schema)[1] is None
    # A schema that lets other names through, or names none, closes nothing.
    for open_schema in (
        {**NO_ARGUMENTS, "patternProperties": {"^x_": {}}},
        {**NO_ARGUMENTS, "additionalProperties": True},
        {"type": "object"},
        {**schema, "additionalProperties": {}},
    ):
        assert check_args({}, {"town": "Seoul"}, input_schema=open_schema)[1] is None
    # The contract's names, when it has any, are the list (the schema does not add to them).
    assert reason_of({**GOOD, "city": "x"}) == "args:unknown:city"


def test_unknown_arguments_can_be_dropped_instead() -> None:
    clean, verdict = check_args(STOCK, {**GOOD, "sku_id": "A-1"}, unknown="drop")
    assert verdict is None and clean == GOOD


def test_arguments_that_are_not_an_object_are_refused() -> None:
    assert reason_of(["A-1"]) == "args:json"
    assert reason_of(None) == "args:json"


def test_length_and_pattern_are_checked() -> None:
    constraints = {"code": {"type": "str", "max_length": 6, "pattern": "^A-[0-9]{4}$"}}
    assert reason_of({"code": "A-12345"}, constraints) == "args:range:code"
    assert reason_of({"code": "B-1001"}, constraints) == "args:pattern:code"
    assert reason_of({"code": "A-1001"}, constraints) is None


@pytest.mark.parametrize(
    ("returns", "value", "reason"),
    [
        ({"required": ["status", "owner"]}, {"assetStatus": "사용중인듯"}, "result:shape"),
        ({"type": "dict"}, "a string", "result:shape"),
        ({"fields": {"count": {"type": "int"}}}, {"count": "4개"}, "result:shape"),
        ({"non_empty": True}, [], "result:empty"),
        ({"fields": {"rows": {"non_empty": True}}}, {"rows": []}, "result:empty"),
        ({"max_items": 2}, [1, 2, 3], "result:too_big"),
        ({"fields": {"rows": {"max_items": 2}}}, {"rows": list(range(20))}, "result:too_big"),
        ({"max_chars": 10}, "x" * 11, "result:too_big"),
        ({"fields": {"days": {"min": 0, "max": 30}}}, {"days": 720}, "result:range"),
        ({"fields": {"stock": {"min": 0}}}, {"stock": -3}, "result:range"),
    ],
)
def test_a_result_is_checked_after_the_call(returns, value, reason) -> None:  # type: ignore[no-untyped-def]
    verdict = check_result(returns, value)
    assert verdict is not None and verdict.reason == reason


def test_a_result_within_its_contract_passes() -> None:
    assert check_result({"required": ["status"], "fields": {"days": {"max": 30}}}, {"status": "ok", "days": 14}) is None


def test_a_timeout_is_retried_at_once() -> None:
    assert backoff_delay(reason="timeout", attempt=1, retry={}, retry_after_s=None, rng=random.Random(1)) == 0.0


def test_a_rate_limit_backs_off_exponentially_with_jitter_up_to_the_cap() -> None:
    retry = {"backoff_base_s": 2.0, "backoff_cap_s": 4.0}
    rng = random.Random(7)
    delays = [
        backoff_delay(reason="rate_limit", attempt=n, retry=retry, retry_after_s=None, rng=rng) for n in (1, 2, 3)
    ]
    assert 2.0 <= delays[0] <= 2.5  # the wait, and up to a quarter more: never less (seed 001)
    assert 4.0 <= delays[1] <= 5.0
    assert 4.0 <= delays[2] <= 5.0  # capped


def test_a_servers_retry_after_is_honoured_within_the_cap() -> None:
    retry = {"backoff_base_s": 1.0, "backoff_cap_s": 10.0}
    assert backoff_delay(reason="rate_limit", attempt=1, retry=retry, retry_after_s=3.0, rng=random.Random()) == 3.0
    assert backoff_delay(reason="rate_limit", attempt=1, retry=retry, retry_after_s=60.0, rng=random.Random()) == 10.0


def test_tool_errors_are_classified() -> None:
    assert classify_tool_error("429 Too Many Requests; Retry-After: 2") == ("rate_limit", 2.0)
    assert classify_tool_error("rate limit exceeded") == ("rate_limit", None)
    assert classify_tool_error("'x' 직원을 찾을 수 없습니다") == ("tool:error", None)
    assert classify_tool_error("HTTP 429 from the backend") == ("rate_limit", None)
    assert classify_tool_error("backend status code: 429") == ("rate_limit", None)
    assert classify_tool_error("429 rate_limit: 에러: 호출 한도를 초과했습니다.") == ("rate_limit", None)


def test_a_429_a_message_quotes_is_no_rate_limit_and_a_timeout_it_reports_wins() -> None:
    assert classify_tool_error("order 429 was not found") == ("tool:error", None)
    assert classify_tool_error("invoice 429 saved; the notification backend timed out") == ("timeout", None)
    assert classify_tool_error("the mailer's rate limit was hit, then it timed out") == ("timeout", None)
    assert classify_tool_error("order 504 was not found") == ("tool:error", None)


def test_a_quoted_429_or_504_opening_a_message_is_a_value_it_echoes_no_status() -> None:
    """The demo server's "unknown asset" error opens with the id it was given: asset 429 or 504 was read as a rate
    limit or a timeout (retried, counted by the breaker, the model sent to the backup)."""
    assert classify_tool_error("'429' 자산을 찾을 수 없습니다. 등록된 자산: A-1001") == ("tool:error", None)
    assert classify_tool_error("'504' 자산을 찾을 수 없습니다. 등록된 자산: A-1001") == ("tool:error", None)
    assert classify_tool_error('"429" not found') == ("tool:error", None)
    assert classify_tool_error("「504」 없음") == ("tool:error", None)
    # After the word that names a status, a number is one, however a JSON or Python error body quotes its key.
    assert classify_tool_error('{"error":{"code":429,"message":"Resource has been exhausted"}}') == ("rate_limit", None)
    assert classify_tool_error("{'status': 429, 'message': 'Quota exceeded'}") == ("rate_limit", None)
    assert classify_tool_error('{"code": 504, "message": "Gateway Timeout"}') == ("timeout", None)
    assert classify_tool_error('Upstream returned {"status":504}') == ("timeout", None)
    assert classify_tool_error('error: "504"') == ("timeout", None)
    assert classify_tool_error("[429] slow down") == ("rate_limit", None)
    assert classify_tool_error("(504) gateway") == ("timeout", None)
    assert classify_tool_error('"429 Too Many Requests"') == ("rate_limit", None)


def test_rate_limit_words_a_text_only_names_are_no_rate_limit() -> None:
    """The demo server's refusal of a mistyped FAILURE_MODE names the modes: it is a tool error (retried as a
    rate limit, and sent to the model as "use the backup", it hid the typo)."""
    named = "FAILURE_MODE 'rate-limit' is not one of none, timeout, rate_limit, bad_schema"
    assert classify_tool_error(named) == ("tool:error", None)
    assert classify_tool_error("set rate_limit_per_minute in the config") == ("tool:error", None)
    assert classify_tool_error("the API's rate limit was exceeded") == ("rate_limit", None)
    assert classify_tool_error("upstream: rate limited, slow down") == ("rate_limit", None)
    assert classify_tool_error("quota: rate-limit reached for key") == ("rate_limit", None)


def test_a_text_that_opens_with_a_rate_limit_is_one_whatever_it_says_after() -> None:
    assert classify_tool_error("Rate limit exceeded, retry after 504 seconds") == ("rate_limit", 504.0)
    assert classify_tool_error("Too many requests: a previous request timed out") == ("rate_limit", None)
    assert classify_tool_error("HTTP 504 Gateway Timeout") == ("timeout", None)


def test_a_servers_read_only_claim_is_a_hint_and_discovery_proposes_write_whatever_it_says() -> None:
    assert annotation_risk_hint({"readOnlyHint": True}) == "read"
    assert annotation_risk_hint({"readOnlyHint": True, "destructiveHint": True}) == "write"
    assert annotation_risk_hint({}) == "write"
    schema = {"type": "object", "properties": {"q": {"type": "string"}}}
    assert contract_defaults(schema, {"readOnlyHint": True})["risk"] == "write"


def test_a_value_outside_a_closed_set_lists_the_allowed_ones_with_commas() -> None:
    from pydantic import BaseModel, ValidationError

    from mcpregistry.contracts import pydantic_message

    class Risky(BaseModel):
        risk: Literal["read", "write"]

    try:
        Risky.model_validate({"risk": "maybe"})
    except ValidationError as exc:
        assert pydantic_message(exc.errors()[0]) == "must be one of: 'read', 'write'"
    else:
        raise AssertionError("taken")


HOSTS = {"url": {"allowed_hosts": ["api.example.com"]}}
ARGUMENT_FAILURES = [
    (STOCK, ["A-1"], "인자가 JSON 객체가 아닙니다"),
    (STOCK, {**GOOD, "sku_id": "A-1"}, "'sku_id'은(는) 이 도구의 인자가 아닙니다; 'sku'을(를) 뜻했나요?"),
    (STOCK, {**GOOD, "zone": "A-1"}, "'zone'은(는) 이 도구의 인자가 아닙니다; 이 도구의 인자: limit, region, sku"),
    (STOCK, {"sku": "A-1", "region": "busan"}, "필수 인자 'limit'이(가) 없습니다"),
    (STOCK, {**GOOD, "limit": True}, "'limit'은(는) int 타입이어야 합니다. 받은 값: bool True"),
    (STOCK, {**GOOD, "region": "대구"}, "'region'은(는) busan, jeju, seoul 중 하나여야 합니다. 받은 값: '대구'"),
    (STOCK, {**GOOD, "limit": 20}, "'limit'은(는) 1 이상 2 이하여야 합니다. 받은 값: 20"),
    ({"n": {"type": "int", "min": 1}}, {"n": 0}, "'n'은(는) 1 이상이어야 합니다. 받은 값: 0"),
    ({"n": {"type": "int", "max": 9}}, {"n": 10}, "'n'은(는) 9 이하여야 합니다. 받은 값: 10"),
    ({"code": {"type": "str", "max_length": 3}}, {"code": "A-1001"}, "'code'이(가) 3보다 깁니다 (6)"),
    (
        {"code": {"type": "str", "pattern": "^A-"}},
        {"code": "B-1"},
        "'code'은(는) ^A- 패턴에 맞아야 합니다. 받은 값: 'B-1'",
    ),
    (HOSTS, {"url": 7}, "'url': URL이어야 합니다"),
    (HOSTS, {"url": "ftp://api.example.com/x"}, "'url': 자격 증명이 없는 http:// 또는 https:// URL이어야 합니다"),
    (
        HOSTS,
        {"url": "https://evil.test/x"},
        "'url': 호스트는 api.example.com만 쓸 수 있습니다. 받은 호스트: 'evil.test'",
    ),
]
RESULT_FAILURES = [
    ({"type": "dict"}, "a string", "dict 결과를 기대했지만 str을(를) 받았습니다"),
    ({"required": ["status"]}, ["x"], "status이(가) 있는 객체를 기대했지만 list을(를) 받았습니다"),
    (
        {"required": ["status", "owner"]},
        {"assetStatus": "사용중인듯"},
        "결과에 status, owner이(가) 없습니다 (있는 키: assetStatus)",
    ),
    ({"non_empty": True}, [], "도구가 아무것도 돌려주지 않았습니다"),
    ({"max_items": 2}, [1, 2, 3], "항목 3개, 한도 2개 초과"),
    ({"max_chars": 10}, "x" * 11, "11자, 한도 10자 초과"),
    ({"fields": {"count": {"type": "int"}}}, {"count": "4개"}, "'count'은(는) int이어야 하지만 '4개'입니다"),
    ({"fields": {"rows": {"non_empty": True}}}, {"rows": []}, "'rows'이(가) 비어 있습니다"),
    ({"fields": {"rows": {"max_items": 2}}}, {"rows": [1, 2, 3]}, "'rows'의 항목 3개, 한도 2개 초과"),
    ({"fields": {"days": {"min": 0, "max": 30}}}, {"days": 720}, "'days'의 값 720이(가) 범위 [0, 30] 밖입니다"),
]


@pytest.mark.parametrize(("constraints", "args", "korean"), ARGUMENT_FAILURES)
def test_an_argument_checks_detail_is_in_the_readers_language(constraints, args, korean) -> None:  # type: ignore[no-untyped-def]
    """The detail goes into the message the model and the admin read (seed 004: what is wrong and what is allowed),
    whose frame is already translated: a Korean message does not carry an English detail."""
    with translation.override("ko"):
        _clean, verdict = check_args(constraints, args)
    assert verdict is not None and verdict.detail.startswith(korean), verdict.detail
    with translation.override("en"):
        _clean, english = check_args(constraints, args)
    assert english is not None and english.reason == verdict.reason and english.detail != verdict.detail


@pytest.mark.parametrize(("returns", "value", "korean"), RESULT_FAILURES)
def test_a_result_checks_detail_is_in_the_readers_language(returns, value, korean) -> None:  # type: ignore[no-untyped-def]
    with translation.override("ko"):
        verdict = check_result(returns, value)
    assert verdict is not None and verdict.detail == korean
    with translation.override("en"):
        english = check_result(returns, value)
    assert english is not None and english.reason == verdict.reason and english.detail != verdict.detail


def test_the_model_is_shown_the_contracts_argument_limits_in_the_tools_schema() -> None:
    from mcpregistry.contracts import schema_with_contract

    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "description": "who"}, "tags": {"type": "array"}},
        "required": ["name"],
    }
    constraints = {
        "name": {"type": "str", "required": True, "allowed": ["김하늘", "이서준"], "max_length": 20},
        "tags": {"type": "list", "max_length": 3},
        "limit": {"type": "int", "min": 1, "max": 50, "required": True},
        "code": {"type": "str", "pattern": "^[A-Z]-\\d{4}$"},
        "python_only": {"type": "str", "pattern": "(?P<id>\\d+)\\Z"},
    }
    shown = schema_with_contract(schema, constraints)
    assert shown["properties"]["name"] == {
        "type": "string",
        "description": "who",
        "enum": ["김하늘", "이서준"],
        "maxLength": 20,
    }
    assert shown["properties"]["tags"] == {"type": "array", "maxItems": 3}
    assert shown["properties"]["limit"] == {"type": "integer", "minimum": 1, "maximum": 50}
    assert shown["properties"]["code"] == {"type": "string", "pattern": "^[A-Z]-\\d{4}$"}
    assert shown["properties"]["python_only"] == {"type": "string"}  # the gate checks it; a provider may not read it
    assert shown["required"] == ["name", "limit"]
    assert schema["properties"]["name"] == {"type": "string", "description": "who"}  # the discovered one unchanged
    assert schema_with_contract(schema, {}) == schema
    assert schema_with_contract(None, None) == {"type": "object", "properties": {}}


@pytest.mark.parametrize("pattern", ["a{99999999999}", "x{4294967296}", "(" * 1_000 + ")" * 1_000])
def test_a_pattern_too_large_to_compile_is_refused_as_not_valid_not_a_crash(pattern: str) -> None:
    """A repeat count too large (OverflowError) or groups nested too deep (RecursionError) is no re.error: the
    contract's validation let it out as a 500."""
    from pydantic import ValidationError

    from mcpregistry.contracts import ArgSpec

    with pytest.raises(ValidationError, match="not a valid regular expression"):
        ArgSpec(type="str", pattern=pattern)


def test_a_servers_pattern_too_large_to_compile_is_left_out_of_the_first_contract() -> None:
    schema = {"type": "object", "properties": {"code": {"type": "string", "pattern": "a{99999999999}"}}}
    assert "pattern" not in contract_defaults(schema, {})["args"]["code"]  # discovery went on (it raised)


@pytest.mark.parametrize("name", [1, None, ("a",)])
def test_arguments_whose_names_are_not_text_are_no_json_object_not_a_crash(name: object) -> None:
    """A flow's or a code rule's dict keyed 1 or None: the hint for an unknown name crashed on it (str methods)."""
    _args, verdict = check_args({"name": {"type": "str"}}, {"name": "김하늘", name: "x"})
    assert verdict is not None and verdict.reason == "args:json"
