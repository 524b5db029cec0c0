"""A contract's, a rule's and a server's settings are checked wherever they are saved, and every error names the
key it is about and the keys (or values) that would be valid."""

from __future__ import annotations

import sys

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from agents.models import DeterministicRule
from mcpregistry.contracts import ArgSpec, argument_constraints
from mcpregistry.models import McpServer, McpTool, ToolContract

pytestmark = pytest.mark.django_db


@pytest.fixture
def tools() -> dict[str, McpTool]:
    """A discovered server with three tools: ``lookup(name*, limit)``, ``lookup_backup(name*)`` and
    ``report(period*)``."""
    server = McpServer.objects.create(mcp_id="Ledger-Data", name="ledger", command=sys.executable, args=[])
    now = timezone.now()

    def tool(name: str, properties: dict[str, dict[str, str]], required: list[str]) -> McpTool:
        schema = {"type": "object", "properties": properties, "required": required}
        return McpTool.objects.create(server=server, name=name, input_schema=schema, discovered_at=now)

    return {
        "lookup": tool("lookup", {"name": {"type": "string"}, "limit": {"type": "integer"}}, ["name"]),
        "lookup_backup": tool("lookup_backup", {"name": {"type": "string"}}, ["name"]),
        "report": tool("report", {"period": {"type": "string"}}, ["period"]),
    }


def refused(contract: ToolContract) -> dict[str, list[str]]:
    with pytest.raises(ValidationError) as caught:
        contract.full_clean()
    return caught.value.message_dict


def test_an_unknown_argument_constraint_names_the_valid_keys_and_the_closest_one(tools) -> None:
    contract = ToolContract(tool=tools["lookup"], args={"name": {"type": "str", "max_len": 20}})
    [message] = refused(contract)["args"]
    assert message.startswith("name.max_len: 'max_len' is not a valid key (did you mean 'max_length'?)")
    assert "type, required, allowed, min, max, max_length, pattern" in message


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"min": 10, "max": 1}, "limit: min (10) is greater than max (1): no value fits"),
        ({"max_length": -3}, "limit.max_length: must be at least 0"),
        ({"pattern": "(["}, "limit.pattern: not a valid regular expression: "),
    ],
)
def test_an_argument_constraint_no_call_could_pass_is_refused_naming_it(tools, spec, expected) -> None:
    [message] = refused(ToolContract(tool=tools["lookup"], args={"limit": {"type": "int", **spec}}))["args"]
    assert message.startswith(expected), message


def test_a_result_field_s_range_no_value_fits_is_refused(tools) -> None:
    [message] = refused(ToolContract(tool=tools["lookup"], returns={"fields": {"total": {"min": 5, "max": 0}}}))[
        "returns"
    ]
    assert message.startswith("returns.fields.total: min (5) is greater than max (0)"), message


def test_discovery_proposes_only_the_bounds_of_a_schema_the_gate_can_check() -> None:
    schema = {
        "type": "object",
        "properties": {
            "code": {"type": "string", "pattern": "^\\p{L}+$", "maxLength": -1},  # ECMA's \p{L}: not Python's re
            "count": {"type": "integer", "minimum": 10, "maximum": 1},
            "ratio": {"type": "number", "minimum": "0", "maximum": 1},
            "name": {"type": "string", "pattern": "^[가-힣]+$", "maxLength": 20},
        },
        "required": ["code"],
    }
    assert argument_constraints(schema) == {
        "code": {"required": True, "type": "str"},
        "count": {"required": False, "type": "int"},
        "ratio": {"required": False, "type": "float", "max": 1},
        "name": {"required": False, "type": "str", "pattern": "^[가-힣]+$", "max_length": 20},
    }
    for spec in argument_constraints(schema).values():
        ArgSpec.model_validate(spec)


def test_an_unknown_type_names_the_valid_types(tools) -> None:
    [message] = refused(ToolContract(tool=tools["lookup"], args={"limit": {"type": "integer"}}))["args"]
    assert message.startswith("limit.type:") and all(t in message for t in ("'str'", "'int'", "'float'", "'dict'"))


def test_result_and_retry_keys_are_named_with_their_valid_keys(tools) -> None:
    errors = refused(
        ToolContract(
            tool=tools["lookup"],
            returns={"fields": {"total": {"minimum": 0}}},
            retry={"attempts": 3, "on": ["timeout", "5xx"]},
        )
    )
    [returns] = errors["returns"]
    assert returns.startswith("returns.fields.total.minimum: 'minimum' is not a valid key")
    assert "type, non_empty, max_items, min, max" in returns
    assert any(
        m.startswith("retry.attempts: 'attempts' is not a valid key") and "max_attempts" in m for m in errors["retry"]
    )
    assert any(m.startswith("retry.on.1:") and "'rate_limit'" in m for m in errors["retry"])


@pytest.mark.parametrize("timeout", [-1.0, 0.0, 3601.0])
def test_a_timeout_must_be_positive_and_within_the_platform_cap(tools, timeout: float) -> None:
    [message] = refused(ToolContract(tool=tools["lookup"], timeout_s=timeout))["timeout_s"]
    assert "more than 0 and at most 3600 seconds" in message


def test_the_timeout_cap_is_a_setting(tools, settings) -> None:
    settings.PLATFORM_TOOL_TIMEOUT_MAX_S = 10
    assert "at most 10 seconds" in refused(ToolContract(tool=tools["lookup"], timeout_s=11))["timeout_s"][0]
    ToolContract(tool=tools["lookup"], timeout_s=10).full_clean()


def test_a_tool_is_never_its_own_fallback(tools) -> None:
    [message] = refused(ToolContract(tool=tools["lookup"], fallback_tool="lookup"))["fallback_tool"]
    assert "cannot be its own fallback" in message


def test_a_fallback_must_take_the_same_arguments(tools) -> None:
    [message] = refused(ToolContract(tool=tools["lookup"], fallback_tool="report"))["fallback_tool"]
    assert "'report' requires period" in message
    [message] = refused(ToolContract(tool=tools["lookup"], fallback_tool="nope"))["fallback_tool"]
    assert "its other tools are: lookup_backup, report" in message
    ToolContract(tool=tools["lookup"], fallback_tool="lookup_backup").full_clean()


def test_a_rule_condition_names_the_valid_keys(tools) -> None:
    rule = DeterministicRule(
        name="r",
        server=tools["lookup"].server,
        tool_name="lookup",
        when={"keywords": ["x"]},
        params={"name": "{query}"},
    )
    with pytest.raises(ValidationError) as caught:
        rule.full_clean()
    [message] = caught.value.message_dict["when"]
    assert message.startswith("keywords: 'keywords' is not a valid key")
    assert "all_keywords, any_keywords, regex, context, data, tool_available" in message


def test_a_rule_for_an_unknown_tool_names_the_servers_tools(tools) -> None:
    rule = DeterministicRule(name="r", server=tools["lookup"].server, tool_name="lokup", params={})
    with pytest.raises(ValidationError) as caught:
        rule.full_clean()
    assert "its tools are: lookup, lookup_backup, report" in caught.value.message_dict["tool_name"][0]


@pytest.mark.parametrize(
    ("values", "field", "expected"),
    [
        ({"timeout_s": -5}, "timeout_s", "The timeout must be more than 0 and at most 3600 seconds."),
        ({"timeout_s": 0}, "timeout_s", "The timeout must be more than 0"),
        ({"breaker_threshold": 0}, "breaker_threshold", "At least 1: with 0 the circuit opens"),
        ({"breaker_cooldown_s": -1}, "breaker_cooldown_s", "Enter 0 to 86400 seconds."),
    ],
)
def test_a_server_setting_no_call_could_pass_is_refused(values, field: str, expected: str) -> None:
    server = McpServer(mcp_id="Ledger-Data", name="ledger", command=sys.executable, args=[], **values)
    with pytest.raises(ValidationError) as caught:
        server.full_clean()
    assert list(caught.value.message_dict) == [field]
    assert caught.value.message_dict[field][0].startswith(expected)


def test_a_shape_error_reads_in_the_admin_s_language(tools) -> None:
    from django.utils import translation

    with translation.override("ko"):
        [message] = refused(ToolContract(tool=tools["lookup"], args={"limit": {"type": "int", "max_length": -3}}))[
            "args"
        ]
    assert message == "limit.max_length: 0 이상이어야 합니다"
