"""Two tools of one name in an agent's runs, made by a change to the registry rather than to the agent.

The agent's form and ``import_config`` refused binding two servers that expose one tool name; a server's tool name
prefix changed, or a tool switched on, made the same clash unseen, and every run of the agents concerned failed
``config:tool_name_conflict`` until someone read a failed run. Now the change is refused where it is made (the
server's and the tool's admin pages, the services, an import), naming the agent; an import checks every agent once
its entries are in, so a prefix and the binding that fixes it may come in one document.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.test import Client

from agent_platform.errors import ApplicationError
from agents.configuration import config_import
from agents.models import Agent
from agents.services import agent_update, agent_version_publish
from audit.models import AuditEvent
from mcpregistry.models import McpServer, McpTool
from mcpregistry.services import mcp_server_update, mcp_tool_update
from tests.agents.test_agent_settings_round_trip import page_as_posted

pytestmark = pytest.mark.django_db

STDIO = {"transport": "stdio", "command": sys.executable, "args": ["-m", "json.tool"]}


def installation(**second: Any) -> dict[str, Any]:
    """Servers sa and sb (prefix b_) both exposing ping, and agent dup binding both."""
    return {
        "servers": [
            {"mcp_id": "sa", "name": "A", **STDIO},
            {"mcp_id": "sb", "name": "B", "tool_prefix": "b_", **STDIO, **second},
        ],
        "contracts": [
            {"mcp_id": "sa", "tool": "ping", "risk": "read"},
            {"mcp_id": "sb", "tool": "ping", "risk": "read"},
        ],
        "agents": [{"slug": "dup", "name": "Dup", "servers": ["sa", "sb"]}],
    }


def events(action: str) -> int:
    return AuditEvent.objects.filter(action=action).count()


def test_a_prefix_that_gives_two_tools_of_an_agent_one_name_is_refused_naming_the_agent() -> None:
    config_import(actor="test", document=installation())
    sb = McpServer.objects.get(mcp_id="sb")
    before = events("config.mcp_server.update")
    with pytest.raises(ValidationError) as refused:
        mcp_server_update(server=sb, actor="admin", via="tests", data={"tool_prefix": ""})
    (message,) = refused.value.message_dict["tool_prefix"]
    assert message.startswith("Agent dup would be offered two tools of one name: ping (sa, sb)")
    assert McpServer.objects.get(mcp_id="sb").tool_prefix == "b_"
    assert events("config.mcp_server.update") == before
    mcp_server_update(server=sb, actor="admin", via="tests", data={"tool_prefix": "bb_"})  # another is fine
    assert McpServer.objects.get(mcp_id="sb").tool_prefix == "bb_"


def test_a_version_the_agent_serves_counts_as_well_as_its_draft_bindings() -> None:
    config_import(actor="test", document=installation())
    agent = Agent.objects.get(slug="dup")
    agent_version_publish(agent=agent, actor="admin", via="tests")  # live: sa and sb
    agent_update(agent=agent, actor="admin", via="tests", servers=[McpServer.objects.get(mcp_id="sa")])
    with pytest.raises(ValidationError, match="Agent dup would be offered"):
        mcp_server_update(
            server=McpServer.objects.get(mcp_id="sb"), actor="admin", via="tests", data={"tool_prefix": ""}
        )


def switched_off_duplicate() -> McpTool:
    """The installation with sb unprefixed and its ping switched off: no clash until it is switched on."""
    document = installation(tool_prefix="")
    document["tools"] = [{"mcp_id": "sb", "tool": "ping", "enabled": False}]
    config_import(actor="test", document=document)
    return McpTool.objects.get(server__mcp_id="sb", name="ping")


def test_switching_on_a_tool_whose_name_another_server_of_the_agent_offers_is_refused() -> None:
    ping = switched_off_duplicate()
    before = events("config.mcp_tool.update")
    with pytest.raises(ValidationError) as refused:
        mcp_tool_update(tool=ping, actor="admin", via="tests", data={"enabled": True})
    (message,) = refused.value.message_dict["enabled"]
    assert message.startswith("Agent dup would be offered two tools of one name: ping (sa, sb)")
    assert not McpTool.objects.get(pk=ping.pk).enabled
    assert events("config.mcp_tool.update") == before


def test_the_tool_page_refuses_switching_it_on_with_the_reason(admin_client: Client) -> None:
    ping = switched_off_duplicate()
    url = f"/admin/mcpregistry/mcptool/{ping.pk}/change/"
    response = admin_client.post(url, {**page_as_posted(admin_client.get(url).content.decode()), "enabled": "on"})
    assert response.status_code == 200
    assert "Agent dup would be offered two tools of one name: ping (sa, sb)" in response.content.decode()
    assert not McpTool.objects.get(pk=ping.pk).enabled


def test_an_import_switching_on_the_duplicate_is_refused_for_the_agent_it_does_not_list() -> None:
    switched_off_duplicate()
    document = installation(tool_prefix="")
    document["tools"] = [{"mcp_id": "sb", "tool": "ping", "enabled": True}]
    del document["agents"]
    with pytest.raises(ApplicationError, match=r"dup: Agent dup would be offered two tools of one name"):
        config_import(actor="test", document=document)
    assert not McpTool.objects.get(server__mcp_id="sb", name="ping").enabled


def test_an_import_refuses_a_prefix_that_clashes_in_an_agent_it_does_not_list() -> None:
    config_import(actor="test", document=installation())
    document = installation(tool_prefix="")
    del document["agents"]
    with pytest.raises(ApplicationError) as refused:
        config_import(actor="test", document=document)
    assert "dup: Agent dup would be offered two tools of one name: ping (sa, sb)" in refused.value.message
    assert McpServer.objects.get(mcp_id="sb").tool_prefix == "b_"


def test_an_import_may_change_a_prefix_and_the_binding_that_fixes_it_together() -> None:
    config_import(actor="test", document=installation())
    document = installation(tool_prefix="")
    document["agents"][0]["servers"] = ["sa"]
    config_import(actor="test", document=document)
    assert McpServer.objects.get(mcp_id="sb").tool_prefix == ""
    assert list(Agent.objects.get(slug="dup").servers.values_list("mcp_id", flat=True)) == ["sa"]


def test_the_server_page_refuses_the_prefix_with_the_reason_at_its_field(admin_client: Client) -> None:
    config_import(actor="test", document=installation())
    sb = McpServer.objects.get(mcp_id="sb")
    url = f"/admin/mcpregistry/mcpserver/{sb.pk}/change/"
    response = admin_client.post(url, {**page_as_posted(admin_client.get(url).content.decode()), "tool_prefix": ""})
    assert response.status_code == 200
    assert "Agent dup would be offered two tools of one name: ping (sa, sb)" in response.content.decode()
    assert McpServer.objects.get(mcp_id="sb").tool_prefix == "b_"
