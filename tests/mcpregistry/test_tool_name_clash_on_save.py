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
from mcpregistry.services import mcp_server_update, mcp_tool_review_approve, mcp_tool_update
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


def three_servers_sharing_ping() -> None:
    """sa, sb and sc all expose ping unprefixed, all bound to dup: a clash stored before such changes were refused."""
    document = installation()
    document["servers"].append({"mcp_id": "sc", "name": "C", "tool_prefix": "c_", **STDIO})
    document["contracts"].append({"mcp_id": "sc", "tool": "ping", "risk": "read"})
    document["agents"][0]["servers"] = ["sa", "sb", "sc"]
    config_import(actor="test", document=document)
    McpServer.objects.filter(mcp_id__in=["sb", "sc"]).update(tool_prefix="")  # as stored before the check


def test_a_prefix_that_undoes_part_of_a_clash_there_before_is_taken() -> None:
    three_servers_sharing_ping()
    for mcp_id in ("sa", "sb"):  # the message's own advice: each step leaves fewer servers sharing the name
        server = McpServer.objects.get(mcp_id=mcp_id)
        mcp_server_update(server=server, actor="admin", via="tests", data={"tool_prefix": f"{mcp_id}_"})
    assert set(McpServer.objects.values_list("tool_prefix", flat=True)) == {"sa_", "sb_", ""}


def test_a_clash_there_before_refuses_neither_an_unrelated_import_nor_an_unrelated_prefix() -> None:
    three_servers_sharing_ping()
    McpServer.objects.filter(mcp_id="sc").update(tool_prefix="c_")  # sa and sb clash; sc does not
    config_import(actor="test", document={"servers": [{"mcp_id": "other", "name": "O", **STDIO}]})
    server = McpServer.objects.get(mcp_id="sc")
    mcp_server_update(server=server, actor="admin", via="tests", data={"tool_prefix": "cc_"})
    with pytest.raises(ValidationError, match=r"ping \(sa, sb, sc\)"):  # joining the clash is a new one
        mcp_server_update(server=server, actor="admin", via="tests", data={"tool_prefix": ""})


def waiting_for_review() -> McpTool:
    """sb grows a ping of its own after its first discovery: stored disabled, waiting for a review, enabled again
    once approved (``enabled_before_review``)."""
    config_import(actor="test", document=installation())
    ping = McpTool.objects.get(server__mcp_id="sb", name="ping")
    McpTool.objects.filter(pk=ping.pk).update(enabled=False, review_required=True, enabled_before_review=True)
    McpServer.objects.filter(mcp_id="sb").update(tool_prefix="")  # its ping, waiting, clashes with no one yet
    return McpTool.objects.get(pk=ping.pk)


def test_approving_a_review_that_would_enable_a_clashing_tool_is_refused_naming_the_agent() -> None:
    ping = waiting_for_review()
    with pytest.raises(ValidationError) as refused:
        mcp_tool_review_approve(tool=ping, actor="admin", via="tests")
    assert refused.value.message_dict["enabled"][0].startswith("Agent dup would be offered two tools of one name")
    ping.refresh_from_db()
    assert (ping.enabled, ping.review_required) == (False, True)


def test_the_approve_action_says_which_tool_was_not_approved_and_why(admin_client: Client) -> None:
    ping = waiting_for_review()
    response = admin_client.post(
        "/admin/mcpregistry/mcptool/",
        {"action": "approve_reviewed_changes", "_selected_action": [ping.pk]},
        follow=True,
    )
    page = response.content.decode()
    assert "The review of sb.ping was not approved: Agent dup would be offered two tools of one name" in page
    assert "0 tools approved." in page
    assert McpTool.objects.get(pk=ping.pk).review_required
