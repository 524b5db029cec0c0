"""Input schemas a server may list that a model provider refuses at their root, or that are too deep to check.

The defects they hold: an argument-less tool listed with the schema ``{}`` (no root ``type``) passed discovery
and was offered as is, so Bedrock was sent ``inputSchema.json: {}`` and refused every run of every agent bound
to the server; a root ``anyOf`` (which Anthropic's models refuse) passed the same way. And a schema nested some
80 ``anyOf``s deep made the schema check raise ``RecursionError``, which escaped discovery, the health check and
``manage.py mcp_discover`` (the servers after it were never discovered). Real stdio servers
(``tests/mcp_fixtures/schema_root_fixes_server.py``); Bedrock through botocore's Stubber.
"""

from __future__ import annotations

import sys
from io import StringIO
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError

from agents.models import Run
from audit.models import AuditEvent
from mcpregistry.contracts import SCHEMA_MAX_DEPTH, schema_problem, schema_with_contract
from mcpregistry.models import McpServer
from mcpregistry.services import mcp_server_discover, mcp_server_health_check
from tests.agents.test_bedrock import (
    bedrock_agent,
    converse_reply,
    stubbed_bedrock,  # noqa: F401 - the fixture
    submit,
)
from tests.conftest import discover_as_admin

pytestmark = [pytest.mark.django_db, pytest.mark.slow]  # each starts real servers

TOO_DEEP = f"the input schema is nested more than {SCHEMA_MAX_DEPTH} levels deep"


def schema_roots_server(case: str, mcp_id: str = "schema-roots") -> McpServer:
    """A binding to the fixture server listing ``lookup`` and the tool of ``case`` (``SCHEMA_CASE``)."""
    return McpServer.objects.create(
        mcp_id=mcp_id,
        name=mcp_id,
        transport=McpServer.Transport.STDIO,
        command=sys.executable,
        args=["-m", "tests.mcp_fixtures.schema_root_fixes_server"],
        cwd=str(settings.BASE_DIR),
        env={"SCHEMA_CASE": case},
        public_env=["SCHEMA_CASE"],
        timeout_s=10,
        session_scope=McpServer.SessionScope.PER_RUN,
    )


def test_an_argument_less_tool_listed_with_an_empty_schema_is_offered_to_bedrock_as_an_object(
    stubbed_bedrock,  # noqa: F811
) -> None:
    server = schema_roots_server("typeless")
    report = discover_as_admin(server=server)
    assert report.ok and report.schema_errors == [], report.error
    sent: list[dict[str, Any]] = []
    stubbed_bedrock.client.meta.events.register(
        "provide-client-params.bedrock-runtime.Converse", lambda params, **kwargs: sent.append(params)
    )
    tool_use = {"toolUse": {"toolUseId": "tu-1", "name": "server_status", "input": {}}}
    stubbed_bedrock.add_response("converse", converse_reply([tool_use], "tool_use"))
    stubbed_bedrock.add_response("converse", converse_reply([{"text": "The backend is up."}], "end_turn"))
    run = submit(bedrock_agent(server, slug="schema-roots-bedrock"), "Is the backend up?")
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    offered = {
        tool["toolSpec"]["name"]: tool["toolSpec"]["inputSchema"]["json"] for tool in sent[0]["toolConfig"]["tools"]
    }
    assert offered["server_status"] == {"type": "object", "properties": {}}
    assert offered["lookup"]["type"] == "object" and offered["lookup"]["required"] == ["id"]
    event = AuditEvent.objects.get(run_id=run.id, action="tool.call")
    assert (event.tool, event.args, event.ok) == ("server_status", {}, True)


def test_a_tool_naming_its_arguments_only_in_a_root_any_of_is_offered_them_beside_the_root() -> None:
    server = schema_roots_server("bare_union")
    report = mcp_server_discover(server=server, actor="test-admin", via="tests")
    assert report.schema_errors == []  # it worked on OpenAI-compatible servers: it keeps working, on every provider
    find = server.tools.get(name="find")
    assert find.callable
    assert schema_with_contract(find.input_schema, {}) == {
        "type": "object",
        "properties": {"id": {"type": "string"}, "name": {"type": "string"}},
    }


def test_a_root_any_of_beside_named_arguments_is_discovered_and_offered_without_it() -> None:
    server = schema_roots_server("root_union")
    report = mcp_server_discover(server=server, actor="test-admin", via="tests")
    assert report.schema_errors == []
    assert server.tools.get(name="find").callable


def test_a_root_union_is_offered_without_it_under_an_object_root() -> None:
    stored = {
        "properties": {"id": {"type": "string"}, "name": {"type": "string"}},
        "anyOf": [{"required": ["id"]}, {"required": ["name"]}],
    }
    expected = {"type": "object", "properties": {"id": {"type": "string"}, "name": {"type": "string"}}}
    assert schema_with_contract(stored, {}) == expected
    assert schema_with_contract(stored, {"id": {"type": "str"}}) == expected
    assert "anyOf" in stored and "type" not in stored  # the discovered schema itself is kept as listed


def test_a_tool_nested_too_deeply_to_check_is_reported_and_the_servers_other_tool_is_discovered() -> None:
    server = schema_roots_server("deep")
    report = mcp_server_discover(server=server, actor="test-admin", via="tests")
    assert report.schema_errors == [f"nested: {TOO_DEEP}"]
    tools = {tool.name: tool for tool in server.tools.all()}
    assert tools["lookup"].callable and not tools["nested"].callable
    assert tools["nested"].schema_error == TOO_DEEP
    health = mcp_server_health_check(server=server)
    assert not health.ok and f"nested: {TOO_DEEP}" in health.error


def test_the_discover_command_goes_on_to_the_next_server_after_one_nested_too_deeply() -> None:
    schema_roots_server("deep", mcp_id="deep-one")
    schema_roots_server("typeless", mcp_id="plain-one")
    out = StringIO()
    with pytest.raises(CommandError, match="deep-one"):
        call_command("mcp_discover", "deep-one", "plain-one", stdout=out)
    plain = McpServer.objects.get(mcp_id="plain-one")
    assert plain.health == McpServer.Health.OK
    assert set(plain.tools.values_list("name", flat=True)) == {"lookup", "server_status"}
    assert f"deep-one: tools with an unusable input schema (never offered to a model): nested: {TOO_DEEP}" in (
        out.getvalue()
    )


def test_a_schema_at_the_depth_bound_is_checked_and_a_deeper_one_is_refused() -> None:
    def object_nested(levels: int) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": "object", "required": ["a"]}  # two levels: the object, its list
        for _ in range(levels):
            schema = {"type": "object", "properties": {"a": schema}}  # two more each: the object, its properties
        return schema

    at_bound = object_nested(SCHEMA_MAX_DEPTH // 2 - 1)
    assert schema_problem(at_bound) is None
    assert schema_problem(object_nested(SCHEMA_MAX_DEPTH // 2)) == TOO_DEEP
