"""``mcpregistry.client_session.ClientSession``: the MCP SDK's check of a tool's structured result against its
``outputSchema``, with a validator made once per schema. It refuses what the SDK refuses, with the SDK's errors
(checked side by side with ``mcp.ClientSession`` on the same results), and the pool's sessions are this one
(checked against a real stdio server whose tool breaks its own output schema)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from django.conf import settings
from mcp import ClientSession as SdkClientSession
from mcp import types

from mcpregistry.client_session import ClientSession, ToolResultInvalid, output_validator
from mcpregistry.pool import McpSessionPool
from tests.mcp_fixtures.output_schema_server import OUTPUT_SCHEMA

SCHEMAS: dict[str, dict[str, Any]] = {
    "plain": OUTPUT_SCHEMA,
    "draft-07": {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "required": ["count"]},
    "not a schema": {"type": 5},
    "unresolvable": {"type": "object", "properties": {"count": {"$ref": "#/$defs/missing"}}},
}
RESULTS: list[tuple[str, dict[str, Any] | None]] = [
    ("plain", {"count": 3, "팀": "클라우드운영팀"}),
    ("plain", {"count": "many"}),
    ("plain", {"팀": "클라우드운영팀"}),
    ("plain", {"count": 3, "팀": 7}),
    ("plain", None),
    ("draft-07", {"count": 1}),
    ("draft-07", {}),
    ("not a schema", {"count": 3}),
    ("unresolvable", {"count": 3}),
]


def outcome(session_class: type[SdkClientSession], schema: dict[str, Any], structured: Any) -> str:
    """What the session's check makes of one result: "ok", or the error's type and message."""

    async def check() -> str:
        sent, _ = anyio.create_memory_object_stream[Any](1)
        _, received = anyio.create_memory_object_stream[Any](1)
        session = session_class(received, sent)
        session._tool_output_schemas["report"] = schema
        result = types.CallToolResult(content=[], structuredContent=structured)
        try:
            await session._validate_tool_result("report", result)
        except Exception as exc:  # noqa: BLE001 - the outcome compared is whatever is raised
            return f"{type(exc).__name__}: {exc}"
        return "ok"

    return anyio.run(check)


@pytest.mark.parametrize(("schema", "structured"), RESULTS, ids=[f"{s}-{i}" for i, (s, _) in enumerate(RESULTS)])
def test_a_result_is_refused_or_taken_as_the_sdk_would(schema: str, structured: Any) -> None:
    ours = outcome(ClientSession, SCHEMAS[schema], structured)
    theirs = outcome(SdkClientSession, SCHEMAS[schema], structured)

    assert (ours == "ok") == (theirs == "ok")
    if theirs != "ok":  # the SDK's first line (a RuntimeError of our kind), without its dump of result and schema
        assert ours.startswith("ToolResultInvalid: " + theirs.splitlines()[0].removeprefix("RuntimeError: ")), ours
        assert "\n" not in ours and issubclass(ToolResultInvalid, RuntimeError)
    assert (ours == "ok") == (
        schema in ("plain", "draft-07") and structured in ({"count": 3, "팀": "클라우드운영팀"}, {"count": 1})
    )


def test_a_validator_is_made_once_per_schema() -> None:
    first = output_validator({"type": "object", "required": ["이름"]})
    assert output_validator({"required": ["이름"], "type": "object"}) is first  # the same schema, keys in any order
    assert output_validator({"type": "object", "required": ["팀"]}) is not first


@pytest.fixture
def pool() -> Iterator[McpSessionPool]:
    pool = McpSessionPool(idle_close_s=300)
    yield pool
    pool.shutdown()


@pytest.mark.slow
def test_the_pool_s_sessions_check_results_against_the_tool_s_output_schema(pool: McpSessionPool) -> None:
    config = {
        "mcp_id": "output-schema",
        "transport": "stdio",
        "command": sys.executable,
        "args": ["-m", "tests.mcp_fixtures.output_schema_server"],
        "cwd": str(settings.BASE_DIR),
    }

    good = pool.call_tool(config, "report", {"count": 3}, timeout_s=30)
    sessions = [pooled.session for pooled in pool._sessions.values() if not pooled.dead]
    with pytest.raises(RuntimeError, match="Invalid structured content returned by tool report: 'many' is not of"):
        pool.call_tool(config, "report", {"count": "many"}, timeout_s=30)

    assert good.structured == {"count": 3, "팀": "클라우드운영팀"} and not good.is_error
    assert len(sessions) == 1 and isinstance(sessions[0], ClientSession)


@pytest.mark.slow
@pytest.mark.django_db
def test_a_result_its_own_output_schema_refuses_is_result_shape_through_the_gate_with_what_is_wrong() -> None:
    from mcpregistry import gate
    from mcpregistry.models import McpServer, ToolContract
    from mcpregistry.pool import get_default_pool
    from tests.conftest import discover_as_admin

    server = McpServer.objects.create(
        mcp_id="output-schema",
        name="output-schema",
        command=sys.executable,
        args=["-m", "tests.mcp_fixtures.output_schema_server"],
        cwd=str(settings.BASE_DIR),
        session_scope="shared",
    )
    try:
        assert discover_as_admin(server=server).ok
        ToolContract.objects.filter(tool__server=server, tool__name="report").update(risk="read")
        server = McpServer.objects.prefetch_related("tools__contract").get(pk=server.pk)
        result = gate.call(server=server, tool_name="report", args={"count": "many"}, who=gate.GateCall(source="admin"))
    finally:
        get_default_pool().close("output-schema")

    assert (result.ok, result.error, result.attempts) == (False, "result:shape", 1)  # was "unexpected"
    assert "'many' is not of type 'integer'" in result.message and "(at count)" in result.message
