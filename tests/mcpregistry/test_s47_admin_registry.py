"""The MCP registry's admin and services, as a demanding admin found them (review s47).

1. A bound server's MCP id was editable: renamed on its page, every run of an agent's live version failed
   ``mcp:not_loaded:<old id>`` (the version, code rules and configuration documents name the server by its id), and
   the save said nothing. The page now shows the id read-only and the service refuses a change of it.
2. Deleting a tool that another tool's contract names as its fallback said nothing of that contract: the fallback
   was gone, and the staying tool's page refused every later save for it. The delete confirmations (the tool's
   own and the list's bulk action) now name such contracts, each linked to its tool.
3. The server page's tool table cut a description by code points: one a server listed decomposed (ᄒ+ᅡ+ᆫ) ended
   in another syllable than the server wrote. It is cut where a reader sees a boundary."""

from __future__ import annotations

import html
import io
import re
import sys
import unicodedata

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from agents.execution import run_execute
from agents.models import Agent, Run
from agents.services import agent_version_publish, run_submit
from audit.models import AuditEvent
from mcpregistry.models import McpServer, McpTool, ToolContract
from mcpregistry.services import mcp_server_update
from tests.mcpregistry.test_contract_editor import editor_post
from tests.mcpregistry.test_registry import post_server_form

pytestmark = pytest.mark.django_db


def text(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", fragment))


# 1. a bound server's id ----------------------------------------------------------------------------------------


def live_demo_agent() -> Agent:
    """``seed_demo`` without its MCP server process: the local tools' server ``local`` bound, its agent's draft
    published (the version freezes its servers by their MCP ids)."""
    call_command("seed_demo", "--no-discover", stdout=io.StringIO())
    agent = Agent.objects.get(slug="company-assistant")
    agent_version_publish(agent=agent, actor="test-admin", via="tests")
    return agent


def live_run(query: str) -> Run:
    run = run_submit(agent_slug="company-assistant", query=query, api_key=None).run
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    return run


def test_the_service_refuses_to_change_a_bound_servers_id_and_the_live_version_still_calls_it() -> None:
    live_demo_agent()
    local = McpServer.objects.get(mcp_id="local")
    updates = AuditEvent.objects.filter(action="config.mcp_server.update").count()
    with pytest.raises(ValidationError) as refused:
        mcp_server_update(server=local, actor="test-admin", via="tests", data={"mcp_id": "local-tools"})
    assert "cannot be changed" in " ".join(refused.value.message_dict["mcp_id"])
    assert McpServer.objects.filter(pk=local.pk, mcp_id="local").exists()
    assert AuditEvent.objects.filter(action="config.mcp_server.update").count() == updates
    run = live_run("48건이 12% 늘면 몇 건인지 계산해줘")
    # Renamed, the run failed mcp:not_loaded:local: the live version names the server "local".
    assert (run.status, run.error_code) == (Run.Status.SUCCEEDED, ""), run.error_message
    assert run.deterministic_results[0]["mcp_id"] == "local"


def test_other_changes_of_a_server_still_save_the_id_given_as_it_is() -> None:
    server = McpServer.objects.create(mcp_id="ledger", name="장부", command=sys.executable, args=[])
    mcp_server_update(server=server, actor="test-admin", via="tests", data={"name": "새 장부", "mcp_id": "ledger"})
    server.refresh_from_db()
    assert (server.mcp_id, server.name) == ("ledger", "새 장부")


def test_the_server_page_shows_a_bound_servers_id_read_only_and_a_posted_one_changes_nothing(
    admin_client: Client,
) -> None:
    server = McpServer.objects.create(mcp_id="ledger", name="장부", command=sys.executable, args=[])
    page = admin_client.get(f"/admin/mcpregistry/mcpserver/{server.pk}/change/").content.decode()
    assert 'name="mcp_id"' not in page
    assert re.search(r'field-mcp_id.*?<div class="readonly">ledger</div>', page, re.S)
    response = post_server_form(admin_client, server, mcp_id="ledger-2", name="새 장부")
    assert response.status_code == 302
    server.refresh_from_db()
    assert (server.mcp_id, server.name) == ("ledger", "새 장부")
    (event,) = AuditEvent.objects.filter(action="config.mcp_server.update", result__id=server.pk)
    assert "mcp_id" not in event.args


def test_a_new_server_is_still_given_its_id_on_the_add_page(admin_client: Client) -> None:
    add = admin_client.get("/admin/mcpregistry/mcpserver/add/").content.decode()
    assert 'name="mcp_id"' in add
    assert post_server_form(admin_client, None, mcp_id="new-ledger").status_code == 302
    assert McpServer.objects.filter(mcp_id="new-ledger").exists()


# 2. a tool deleted that a contract names as its fallback --------------------------------------------------------


@pytest.fixture
def lookup() -> McpTool:
    """``lookup`` (its contract's fallback set to ``report`` on its page, as an admin does) and ``report``."""
    server = McpServer.objects.create(mcp_id="Ledger-Data", name="ledger", command=sys.executable, args=[])
    now = timezone.now()
    tool = McpTool.objects.create(
        server=server, name="lookup", input_schema={"type": "object", "required": ["name"]}, discovered_at=now
    )
    ToolContract.objects.create(tool=tool, args={"name": {"type": "str", "required": True}, "limit": {"type": "int"}})
    McpTool.objects.create(server=server, name="report", input_schema={"type": "object"}, discovered_at=now)
    return tool


def set_fallback(client: Client, tool: McpTool, fallback: str) -> None:
    response = client.post(
        f"/admin/mcpregistry/mcptool/{tool.pk}/change/", editor_post(tool, **{"contract-0-fallback_tool": fallback})
    )
    assert response.status_code == 302, response.content.decode()[:3000]
    assert ToolContract.objects.get(tool=tool).fallback_tool == fallback


def contracts_left_section(page: str) -> str:
    found = re.search(r'<div id="contracts-left">(.*?)</div>', page, re.S)
    return found.group(1) if found else ""


def test_a_tools_delete_page_names_the_contracts_whose_fallback_it_is(admin_client: Client, lookup: McpTool) -> None:
    set_fallback(admin_client, lookup, "report")
    report = McpTool.objects.get(server=lookup.server, name="report")
    section = contracts_left_section(
        admin_client.get(f"/admin/mcpregistry/mcptool/{report.pk}/delete/").content.decode()
    )
    assert f'<a href="/admin/mcpregistry/mcptool/{lookup.pk}/change/">Ledger-Data.lookup</a>' in section
    assert "names report as its fallback tool" in text(section)
    assert admin_client.post(f"/admin/mcpregistry/mcptool/{report.pk}/delete/", {"post": "yes"}).status_code == 302
    # What the section warns of: the staying tool's page is refused for the fallback that is gone.
    as_shown = editor_post(lookup, **{"contract-0-fallback_tool": "report", "tags": "장부"})
    refused = admin_client.post(f"/admin/mcpregistry/mcptool/{lookup.pk}/change/", as_shown)
    assert refused.status_code == 200 and "The server has no tool" in html.unescape(refused.content.decode())


def test_the_bulk_delete_names_them_unless_the_contracts_tool_goes_too(admin_client: Client, lookup: McpTool) -> None:
    set_fallback(admin_client, lookup, "report")
    report = McpTool.objects.get(server=lookup.server, name="report")
    alone = admin_client.post(
        "/admin/mcpregistry/mcptool/", {"action": "delete_selected", "_selected_action": [report.pk]}
    )
    assert "Ledger-Data.lookup" in contracts_left_section(alone.content.decode())
    both = admin_client.post(
        "/admin/mcpregistry/mcptool/", {"action": "delete_selected", "_selected_action": [report.pk, lookup.pk]}
    )
    assert both.status_code == 200 and 'id="contracts-left"' not in both.content.decode()


def test_a_tool_no_contract_falls_back_to_has_no_such_section(admin_client: Client, lookup: McpTool) -> None:
    page = admin_client.get(f"/admin/mcpregistry/mcptool/{lookup.pk}/delete/").content.decode()
    assert 'id="contracts-left"' not in page and "Yes, I’m sure" in page


# 3. a decomposed Korean description on the server page ---------------------------------------------------------


def test_the_server_pages_tool_table_cuts_a_decomposed_description_between_syllables(admin_client: Client) -> None:
    server = McpServer.objects.create(mcp_id="hr", name="인사", command=sys.executable, args=[])
    composed = "김하늘 님의 소속 팀과 직무를 찾습니다. " * 5  # 115 characters composed, 240 decomposed
    McpTool.objects.create(
        server=server,
        name="search_employee",
        description=unicodedata.normalize("NFD", composed),
        discovered_at=timezone.now(),
    )
    long_one = "한" * 200
    McpTool.objects.create(
        server=server, name="long", description=unicodedata.normalize("NFD", long_one), discovered_at=timezone.now()
    )
    page = admin_client.get(f"/admin/mcpregistry/mcpserver/{server.pk}/change/").content.decode()
    cells = re.findall(r"<tr><td><a [^>]*><code>([^<]*)</code></a></td><td>[^<]*</td><td>([^<]*)</td></tr>", page)
    shown = {name: html.unescape(cell) for name, cell in cells}
    # Cut at 160 code points, it ended "…직무를 찾습니" + a lone ᄃ, and said it went on.
    assert shown["search_employee"] == composed
    assert shown["long"] == "한" * 160 + "…"


def test_a_discovery_reports_long_decomposed_name_is_cut_between_syllables() -> None:
    """A listed name past 60 characters is cut where a reader sees a boundary: cut by code points, a Korean name
    listed decomposed ended in another syllable than the server wrote (``기`` for ``김``)."""
    import unicodedata

    from mcpregistry.services import _shown_name

    name = "가" * 59 + "김하늘"
    shown = _shown_name(unicodedata.normalize("NFD", name))
    assert shown == "가" * 59 + "김…"
    assert _shown_name("짧은\x1b이름") == "짧은\\x1b이름"
