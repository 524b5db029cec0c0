"""Discovery does not switch on a tool whose name another server bound beside it already offers an agent.

A binding's first discovery enables its tools. Bound to an agent beside a server exposing a tool of the same name
(the agent's form saw no clash: the new server listed nothing yet), it switched the duplicate on and every run of
the agent failed ``config:tool_name_conflict``. So did an enabled tool listed again after it vanished, its name
taken meanwhile. Such a tool stays off now, the report naming it with the agents, until a prefix frees the name.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command

from agents.models import Agent
from agents.selectors import agent_tool_name_conflicts
from agents.services import agent_create
from mcpregistry.admin import discovery_message
from mcpregistry.models import McpServer, McpTool
from mcpregistry.pool import get_default_pool
from mcpregistry.services import mcp_server_discover, mcp_server_update, mcp_tool_update
from tests.mcpregistry.test_health_and_header_fixes import SCHEMA, raw_server

pytestmark = pytest.mark.django_db


def tools(*names: str) -> list[dict[str, Any]]:
    return [{"name": name, "description": name, "inputSchema": SCHEMA} for name in names]


def listing(*names: str) -> dict[str, str]:
    return {"TOOLS": json.dumps(tools(*names))}


@pytest.fixture
def servers() -> Iterator[tuple[McpServer, McpServer]]:
    """ra (discovered, exposing ping) and rb (listing ping and other, not discovered yet)."""
    ra = raw_server("ra", tools("ping"))
    assert mcp_server_discover(server=ra, actor="admin", via="tests").ok
    rb = raw_server("rb", tools("ping", "other"))
    yield ra, rb
    for mcp_id in ("ra", "rb"):
        get_default_pool().close(mcp_id)


def agent_binding(*bound: McpServer) -> Agent:
    return agent_create(actor="admin", via="tests", data={"slug": "dup", "name": "Dup"}, servers=bound)


def tool(mcp_id: str, name: str) -> McpTool:
    return McpTool.objects.get(server__mcp_id=mcp_id, name=name)


def test_first_discovery_leaves_off_a_tool_whose_name_another_bound_server_offers(servers: Any) -> None:
    ra, rb = servers
    agent_binding(ra, rb)  # rb lists nothing yet: no clash to refuse

    report = mcp_server_discover(server=rb, actor="admin", via="tests")

    assert report.ok and sorted(report.added) == ["other", "ping"]
    assert report.name_taken == ["ping (dup)"]
    assert not tool("rb", "ping").enabled and not tool("rb", "ping").review_required
    assert tool("rb", "other").enabled and tool("ra", "ping").enabled
    assert agent_tool_name_conflicts() == {}  # the agent's runs are offered one ping
    assert "left off: another server bound to the same agent offers this name" in discovery_message(report)
    assert "ping (dup)" in discovery_message(report)

    with pytest.raises(ValidationError, match="Agent dup would be offered two tools of one name"):
        mcp_tool_update(tool=tool("rb", "ping"), actor="admin", via="tests", data={"enabled": True})
    mcp_server_update(server=rb, actor="admin", via="tests", data={"tool_prefix": "b_"})
    mcp_tool_update(tool=tool("rb", "ping"), actor="admin", via="tests", data={"enabled": True})
    assert agent_tool_name_conflicts() == {}


def test_a_server_no_agent_binds_beside_another_switches_every_tool_on(servers: Any) -> None:
    _ra, rb = servers
    report = mcp_server_discover(server=rb, actor="admin", via="tests")
    assert report.name_taken == []
    assert tool("rb", "ping").enabled and tool("rb", "other").enabled


def test_an_enabled_tool_listed_again_after_its_name_was_taken_stays_off(servers: Any) -> None:
    ra, rb = servers
    assert mcp_server_discover(server=rb, actor="admin", via="tests").ok  # alone: ping enabled
    mcp_server_update(server=rb, actor="admin", via="tests", data={"env": listing("other")})
    get_default_pool().close("rb")
    assert mcp_server_discover(server=rb, actor="admin", via="tests").vanished == ["ping"]
    agent_binding(ra, rb)  # rb's ping is gone: no clash
    mcp_server_update(server=rb, actor="admin", via="tests", data={"env": listing("ping", "other")})
    get_default_pool().close("rb")

    report = mcp_server_discover(server=rb, actor="admin", via="tests")

    assert report.name_taken == ["ping (dup)"]
    assert tool("rb", "ping").available and not tool("rb", "ping").enabled
    assert agent_tool_name_conflicts() == {}


@pytest.mark.slow
def test_mcp_discover_says_which_tools_it_left_off(servers: Any, capsys: Any) -> None:
    ra, rb = servers
    agent_binding(ra, rb)
    call_command("mcp_discover", "rb")
    out = capsys.readouterr().out
    assert "rb: left off (another server bound to the same agent offers the name" in out
    assert "ping (dup)" in out
