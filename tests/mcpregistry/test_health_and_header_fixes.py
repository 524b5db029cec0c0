"""A health check records the listing's problems as discovery does (a server whose tools are never offered to a
model stays an error); a header value with a leading or trailing space or tab is refused at save (h11 refused it
at every connection); a rejected or expired approval tells the model its reason code, as every failure does."""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.core.exceptions import ValidationError
from django.utils import timezone

from agents.approvals import approvals_expire_due
from agents.models import Approval, Run
from mcpregistry.models import McpServer
from mcpregistry.pool import get_default_pool
from mcpregistry.services import mcp_server_create, mcp_server_discover, mcp_server_health_check, mcp_server_update
from tests.agents.test_approvals import decide, eager_tasks, lines, notes, park, writer  # noqa: F401 - fixtures

pytestmark = pytest.mark.django_db

SCHEMA = {"type": "object", "properties": {"x": {"type": "string"}}}
TOKEN = "tok-9f8e7d6c5b4a3210"


def raw_server(mcp_id: str, tools: list[dict[str, Any]]) -> McpServer:
    return mcp_server_create(
        actor="admin",
        via="tests",
        data={
            "mcp_id": mcp_id,
            "name": mcp_id,
            "transport": "stdio",
            "command": sys.executable,
            "args": ["-m", "tests.mcp_fixtures.raw_jsonrpc_server"],
            "cwd": str(settings.BASE_DIR),
            "env": {"TOOLS": json.dumps(tools)},
            "public_env": ["TOOLS"],
            "session_scope": "shared",
        },
    )


@pytest.fixture
def flawed() -> Any:
    """A server listing one tool twice and one whose input schema is not an object's."""
    tools = [
        {"name": "same", "description": "first", "inputSchema": SCHEMA},
        {"name": "same", "description": "second", "inputSchema": SCHEMA},
        {"name": "broken", "description": "b", "inputSchema": {"type": "string"}},
        {"name": "fine", "description": "f", "inputSchema": SCHEMA},
    ]
    server = raw_server("flawed", tools)
    yield server
    get_default_pool().close("flawed")


def test_a_health_check_keeps_the_problems_discovery_recorded_for_the_same_listing(flawed: McpServer) -> None:
    assert mcp_server_discover(server=flawed, actor="admin", via="tests").ok
    flawed.refresh_from_db()
    discovered = flawed.last_error
    assert flawed.health == McpServer.Health.ERROR
    assert "same: listed more than once" in discovered and "broken: the input schema's type is" in discovered

    report = mcp_server_health_check(server=flawed)

    flawed.refresh_from_db()
    assert (flawed.health, flawed.last_error) == (McpServer.Health.ERROR, discovered)
    # The admin's message says why (the server answered; its listing is what is wrong).
    assert not report.ok and report.error == discovered
    assert (report.tool_count, report.new, report.missing) == (3, [], [])


def test_a_health_check_of_a_clean_listing_is_ok_with_no_error() -> None:
    server = raw_server("clean", [{"name": "fine", "description": "f", "inputSchema": SCHEMA}])
    try:
        McpServer.objects.filter(pk=server.pk).update(health=McpServer.Health.ERROR, last_error="earlier")
        report = mcp_server_health_check(server=server)
    finally:
        get_default_pool().close("clean")
    server.refresh_from_db()
    assert report.ok and report.error == ""
    assert (server.health, server.last_error) == (McpServer.Health.OK, "")


def http_server(headers: dict[str, Any], mcp_id: str = "web") -> McpServer:
    return McpServer(
        mcp_id=mcp_id, name=mcp_id, transport="streamable_http", url="https://mcp.example.com/mcp", headers=headers
    )


@pytest.mark.parametrize("value", [f"Bearer {TOKEN} ", f"Bearer {TOKEN}\t", f" Bearer {TOKEN}"])
def test_a_header_value_with_a_space_or_tab_at_an_end_is_refused_naming_the_header_not_its_value(value: str) -> None:
    with pytest.raises(ValidationError) as refused:
        http_server({"Authorization": value}).full_clean()
    [message] = refused.value.message_dict["headers"]
    assert message.startswith("Header Authorization: a header's value may not begin or end with a space or a tab")
    assert TOKEN not in str(refused.value.message_dict)


def test_a_header_value_with_inner_spaces_saves() -> None:
    http_server({"Authorization": f"Bearer {TOKEN}", "X-Note": "a\tb"}).full_clean()


def test_a_header_value_stored_before_the_check_still_saves_and_a_changed_one_is_checked() -> None:
    server = http_server({"Authorization": f"Bearer {TOKEN} "}, mcp_id="older")
    server.save()  # stored before the check (no clean)
    server = McpServer.objects.get(pk=server.pk)
    mcp_server_update(server=server, actor="admin", via="tests", data={"name": "renamed"})
    with pytest.raises(ValidationError):
        mcp_server_update(server=server, actor="admin", via="tests", data={"headers": {"Authorization": f"{TOKEN} "}})


@pytest.mark.slow
def test_the_model_reads_the_reason_code_of_a_rejected_call(writer, notes, django_capture_on_commit_callbacks) -> None:  # noqa: F811
    run, client = writer
    approval = park(run)
    with django_capture_on_commit_callbacks(execute=True):
        assert decide(client, run, approval, "reject", "필요 없음").status_code == 200
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED
    assert "[approval:rejected]" in run.answer and "필요 없음" in run.answer  # the answer quotes the tool message
    assert lines(notes) == []


@pytest.mark.slow
def test_the_model_reads_the_reason_code_of_an_expired_approval(
    writer,  # noqa: F811
    notes,  # noqa: F811
    django_capture_on_commit_callbacks,
) -> None:
    run, _client = writer
    approval = park(run)
    Approval.objects.filter(pk=approval.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    with django_capture_on_commit_callbacks(execute=True):
        assert approvals_expire_due() == 1
    run.refresh_from_db()
    assert "[approval:expired]" in run.answer
    assert lines(notes) == []
