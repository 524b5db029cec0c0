"""A contract's checks on what tools really send (``tests/mcp_fixtures/typed_results_server``, local tools):

* an int, a float or a bool a tool gives typed (FastMCP's ``{"result": 3}`` beside the text ``3``, a local tool's
  own value) passes ``returns.type``; a text that says ``4개`` does not (seed 004), nor a text the tool typed as
  text;
* Korean in another Unicode form (decomposed, NFD: as macOS writes it) is the same word for allowed values,
  patterns and result keys, and the tool is sent what the caller wrote;
* NaN and the infinities are refused wherever a number is expected;
* a bound an argument's type does not take (``min`` on a text, ``pattern`` on a number) is refused when a
  contract is saved, and a stored one is neither checked nor shown to the model;
* a result field with one bound says which side it fell off."""

from __future__ import annotations

import sys
import unicodedata
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.core.exceptions import ValidationError

from audit.models import AuditEvent
from audit.visible import tool_data_block
from mcpregistry import gate
from mcpregistry.contracts import ArgSpec, argument_constraints, check_args, check_result, schema_with_contract
from mcpregistry.local_tools import local_tool
from mcpregistry.models import McpServer, McpTool, ToolContract
from mcpregistry.pool import get_default_pool
from mcpregistry.services import tool_contract_update
from tests.conftest import discover_as_admin
from tests.mcpregistry.test_contract_editor import errors, lookup, post  # noqa: F401 (lookup: a fixture)

pytestmark = pytest.mark.django_db

THIS_MODULE = __name__


def nfd(text: str) -> str:
    return unicodedata.normalize("NFD", text)


@local_tool
def count_items(team: str) -> int:
    """How many items a team holds."""
    return 3


@local_tool
def share_of_items(team: str) -> float:
    """The share of the items a team holds."""
    return 0.25


def bind(mcp_id: str, **env: str) -> McpServer:
    server = McpServer.objects.create(
        mcp_id=mcp_id,
        name=mcp_id,
        command=sys.executable,
        args=["-m", "tests.mcp_fixtures.typed_results_server"],
        cwd=str(settings.BASE_DIR),
        env=env,
        session_scope="shared",
        timeout_s=10,
    )
    assert discover_as_admin(server=server).ok
    return server


@pytest.fixture
def typed() -> Iterator[McpServer]:
    server = bind("typed")
    yield server
    get_default_pool().close("typed")


@pytest.fixture
def raw() -> Iterator[McpServer]:
    server = bind("typed-raw", TYPED_RESULTS_RAW="1")
    yield server
    get_default_pool().close("typed-raw")


def returns(server: McpServer, tool: str, spec: dict[str, Any]) -> None:
    ToolContract.objects.filter(tool__server=server, tool__name=tool).update(returns=spec)


def call(server: McpServer, tool: str, args: dict[str, Any] | None = None) -> gate.ToolResult:
    server = McpServer.objects.prefetch_related("tools__contract").get(pk=server.pk)
    return gate.call(server=server, tool_name=tool, args=args or {}, who=gate.GateCall(source="admin"))


def audited(tool: str) -> Any:
    return AuditEvent.objects.get(action="tool.call", tool=tool).result


# ---- 1. typed results -------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("tool", "kind", "expected"), [("count", "int", 3), ("ratio", "float", 0.5), ("flag", "bool", True)]
)
def test_an_int_float_or_bool_a_fastmcp_tool_returns_passes_its_contract_type(
    typed: McpServer, tool: str, kind: str, expected: Any
) -> None:
    """FastMCP sends ``3`` as text and ``{"result": 3}`` as structured content: the value is the tool's 3, for the
    check, the model and the audit alike (it used to be the text '3', refused on every call)."""
    returns(typed, tool, {"type": kind})
    result = call(typed, tool)
    assert (result.ok, result.error) == (True, None), result.message
    assert result.value == expected and type(result.value) is type(expected)
    assert result.for_model() == tool_data_block(expected)
    assert audited(tool) == expected and type(audited(tool)) is type(expected)


@pytest.mark.slow
def test_a_text_the_tool_typed_as_text_stays_text(typed: McpServer) -> None:
    """``def code() -> str: return "3"``: the tool says it is a text, whatever it reads like."""
    returns(typed, "code", {"type": "int"})
    refused = call(typed, "code")
    assert (refused.ok, refused.error) == (False, "result:shape")
    returns(typed, "code", {"type": "str"})
    assert call(typed, "code").value == "3"


@pytest.mark.slow
def test_a_count_whose_text_says_4개_is_refused_beside_a_typed_4(typed: McpServer) -> None:
    """Seed 004: a count that comes back as "4개" is caught; a structured 4 that its own text contradicts is not
    taken for it."""
    returns(typed, "mixed_count", {"type": "int"})
    result = call(typed, "mixed_count")
    assert (result.ok, result.error) == (False, "result:shape")
    assert audited("mixed_count") == "4개"


@pytest.mark.slow
def test_an_object_whose_one_key_is_result_stays_that_object(typed: McpServer) -> None:
    returns(typed, "result_object", {"type": "dict", "required": ["result"]})
    result = call(typed, "result_object")
    assert (result.ok, result.value) == (True, {"result": 3})


@pytest.mark.slow
def test_a_text_only_number_is_one_only_where_the_contract_asks_for_a_number(typed: McpServer) -> None:
    """A server that answers text only can say a number only as its whole text: read as one where the contract
    asks for an int or a float; otherwise it is the text it is, and "4개" never is a number."""
    returns(typed, "text_count", {"type": "int"})
    read = call(typed, "text_count")
    assert (read.ok, read.value) == (True, 3)
    returns(typed, "text_count", {"non_empty": True})
    assert call(typed, "text_count").value == "3"
    returns(typed, "text_count_with_unit", {"type": "int"})
    refused = call(typed, "text_count_with_unit")
    assert (refused.ok, refused.error) == (False, "result:shape")
    assert "got str" in refused.message


@pytest.mark.parametrize(("tool", "kind", "expected"), [("count_items", "int", 3), ("share_of_items", "float", 0.25)])
def test_a_local_tool_s_own_number_passes_its_contract_type(settings, tool: str, kind: str, expected: Any) -> None:  # type: ignore[no-untyped-def]
    settings.PLATFORM_LOCAL_TOOL_MODULES = ["mcpregistry.builtin_tools", THIS_MODULE]
    server = McpServer(mcp_id="local-typed", name="local", transport=McpServer.Transport.LOCAL, args=[THIS_MODULE])
    server.full_clean()
    server.save()
    assert discover_as_admin(server=server).ok
    ToolContract.objects.filter(tool__server=server).update(risk="read", returns={"type": kind})
    result = call(server, tool, {"team": "물류"})
    assert (result.ok, result.value) == (True, expected), result.message
    assert audited(tool) == expected


# ---- 2. Korean in another Unicode form --------------------------------------------------------------------------


def test_a_decomposed_allowed_value_or_pattern_is_the_composed_one() -> None:
    constraints = {"region": {"type": "str", "allowed": ["서울", "부산"]}, "team": {"type": "str", "pattern": "^물류"}}
    assert check_args(constraints, {"region": nfd("서울"), "team": nfd("물류플랫폼팀")}) == (
        {"region": nfd("서울"), "team": nfd("물류플랫폼팀")},  # sent as the caller wrote it
        None,
    )
    decomposed = {"region": {"type": "str", "allowed": [nfd("서울")]}, "team": {"type": "str", "pattern": nfd("^물류")}}
    assert check_args(decomposed, {"region": "서울", "team": "물류플랫폼팀"})[1] is None
    verdict = check_args(constraints, {"region": nfd("대구")})[1]
    assert verdict is not None and verdict.reason == "args:allowed:region"


def test_a_decomposed_result_key_is_the_key() -> None:
    value = {nfd("지역"): "서울", nfd("재고"): 3}
    assert check_result({"required": ["지역", "재고"], "fields": {"재고": {"type": "int", "min": 0}}}, value) is None
    verdict = check_result({"fields": {"재고": {"type": "str"}}}, value)
    assert verdict is not None and verdict.reason == "result:shape"
    assert check_result({"required": [nfd("지역")]}, {"지역": 1}) is None


@pytest.mark.slow
def test_a_decomposed_region_passes_the_gate_and_reaches_the_tool_as_written(typed: McpServer) -> None:
    contract = ToolContract.objects.get(tool__server=typed, tool__name="echo")
    tool_contract_update(
        contract=contract, actor="admin", via="tests", data={"args": {"region": {"type": "str", "allowed": ["서울"]}}}
    )
    result = call(typed, "echo", {"region": nfd("서울")})
    assert result.ok, result.message
    assert result.value == [ord(c) for c in nfd("서울")]


@pytest.mark.slow
def test_a_decomposed_result_key_passes_the_gate_and_its_range_is_checked(typed: McpServer) -> None:
    returns(typed, "stock", {"required": ["지역"], "fields": {"재고": {"type": "int", "min": 0}}})
    result = call(typed, "stock", {"region": "서울"})
    assert (result.ok, result.error) == (False, "result:range")
    assert "'재고' is -3, below 0" in result.message


# ---- 3. NaN and the infinities ----------------------------------------------------------------------------------


@pytest.mark.parametrize("number", [float("nan"), float("inf"), float("-inf")])
def test_a_number_that_is_not_finite_is_refused_where_a_number_is_expected(number: float) -> None:
    for spec, value in (({"type": "float"}, number), ({"fields": {"days": {"type": "float"}}}, {"days": number})):
        verdict = check_result(spec, value)
        assert verdict is not None and verdict.reason == "result:shape", spec
        assert "finite number" in verdict.detail
    assert check_result({"fields": {"days": {"type": "float"}}}, {"days": 14.0}) is None
    assert check_result({"type": "dict"}, {"days": number}) is None  # no number expected there


@pytest.mark.parametrize("tool", ["nan_days", "inf_days"])
def test_a_structured_nan_never_reaches_the_model(raw: McpServer, tool: str) -> None:
    returns(raw, tool, {"type": "dict", "fields": {"days": {"type": "float"}}})
    result = call(raw, tool)
    assert (result.ok, result.error, result.value) == (False, "result:shape", None)
    assert "'days' should be a finite number" in result.message


# ---- 4. bounds an argument's type does not take ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        ({"type": "str", "min": 1, "max": 5}, "min, max"),
        ({"type": "bool", "max": 1}, "max"),
        ({"type": "int", "max_length": 2}, "max_length"),
        ({"type": "float", "pattern": "^9"}, "pattern"),
        ({"type": "list", "pattern": "x"}, "pattern"),
        ({"type": "dict", "max_length": 3}, "max_length"),
    ],
)
def test_a_bound_the_argument_s_type_does_not_take_is_refused(spec: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=f"{named} cannot limit an argument of type {spec['type']}"):
        ArgSpec.model_validate(spec)


@pytest.mark.parametrize(
    "spec",
    [
        {"type": "str", "max_length": 5, "pattern": "^A"},
        {"type": "list", "max_length": 2},
        {"type": "int", "min": 1, "max": 2},
        {"min": 1, "max_length": 3, "pattern": "x"},  # no type: its value's kind decides
    ],
)
def test_the_bounds_an_argument_s_type_takes_are_kept(spec: dict[str, Any]) -> None:
    ArgSpec.model_validate(spec)


@pytest.mark.slow
def test_a_contract_saved_with_a_range_on_a_text_is_refused_naming_the_argument(typed: McpServer) -> None:
    contract = ToolContract.objects.get(tool__server=typed, tool__name="echo")
    with pytest.raises(ValidationError) as refused:
        tool_contract_update(
            contract=contract, actor="admin", via="tests", data={"args": {"region": {"type": "str", "min": 1}}}
        )
    assert any(message.startswith("region: min cannot limit") for message in refused.value.messages)


def test_a_stored_range_on_a_text_is_neither_checked_nor_shown_and_the_editor_names_it(
    admin_client,
    lookup: McpTool,  # noqa: F811 (the editor's fixture)
) -> None:
    """Stored before such bounds were refused: the contract still loads, the gate does what it did (a text has no
    range), the model is not shown a limit nobody holds, and the editor names it at the next save."""
    ToolContract.objects.filter(tool=lookup).update(
        args={"name": {"type": "str", "required": True, "min": 1, "max": 5}, "limit": {"type": "int"}}
    )
    contract = ToolContract.objects.get(tool=lookup)
    assert check_args(contract.args, {"name": "김하늘 님의 팀 전체 명단"})[1] is None
    shown = schema_with_contract(lookup.input_schema, contract.args)["properties"]["name"]
    assert "minimum" not in shown and "maximum" not in shown
    assert admin_client.get(f"/admin/mcpregistry/mcptool/{lookup.pk}/change/").status_code == 200
    status, page = post(admin_client, lookup, **{"contract-0-args__0__min": "1", "contract-0-args__0__max": "5"})
    assert status == 200
    assert any("name: min, max cannot limit an argument of type str" in e for e in errors(page)), errors(page)


def test_discovery_leaves_out_a_bound_the_schema_puts_on_another_type() -> None:
    """JSON Schema lets ``minimum`` sit on a string (it applies to numbers only): not proposed, or the first
    contract would fail its own check."""
    schema = {
        "type": "object",
        "properties": {
            "sku": {"type": "string", "minimum": 1, "maxLength": 8},
            "limit": {"type": "integer", "maximum": 2, "pattern": "^[0-9]$"},
        },
    }
    assert argument_constraints(schema) == {
        "sku": {"required": False, "type": "str", "max_length": 8},
        "limit": {"required": False, "type": "int", "max": 2},
    }


# ---- 5. one bound ----------------------------------------------------------------------------------------------


def test_a_field_with_one_bound_says_which_side_it_fell_off() -> None:
    below = check_result({"fields": {"재고": {"min": 0}}}, {"재고": -3})
    above = check_result({"fields": {"days": {"max": 14}}}, {"days": 720})
    both = check_result({"fields": {"days": {"min": 1, "max": 14}}}, {"days": 720})
    assert below is not None and below.detail == "'재고' is -3, below 0"
    assert above is not None and above.detail == "'days' is 720, above 14"
    assert both is not None and both.detail == "'days' is 720, outside [1, 14]"
