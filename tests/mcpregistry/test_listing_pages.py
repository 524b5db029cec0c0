"""MCP listings: defect s29 local 2.

Discovery followed ``nextCursor`` for tools only: resources and prompts past their first page were never listed,
so they could not be chosen in the agent editor, and ``gate.read_resource`` refused them as ``resource:unknown``.
Every page of each is listed now, up to ``LIST_PAGES_MAX`` pages; a server whose cursor never ends fails its
discovery saying so. A real stdio server (``tests/mcp_fixtures/paged_listing_server.py``), 2 items to a page.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
from django.conf import settings

from mcpregistry import gate
from mcpregistry.models import McpServer
from mcpregistry.pool import LIST_PAGES_MAX, get_default_pool
from mcpregistry.services import mcp_server_discover

pytestmark = pytest.mark.django_db


def paged_server(mcp_id: str, **env: str) -> McpServer:
    return McpServer.objects.create(
        mcp_id=mcp_id,
        name=mcp_id,
        command=sys.executable,
        args=["-m", "tests.mcp_fixtures.paged_listing_server"],
        cwd=str(settings.BASE_DIR),
        env=env,  # type: ignore[misc]
        session_scope="shared",
        timeout_s=20,
    )


@pytest.fixture
def closed_after() -> Iterator[list[str]]:
    mcp_ids: list[str] = []
    yield mcp_ids
    for mcp_id in mcp_ids:
        get_default_pool().close(mcp_id)


def test_discovery_lists_every_page_of_resources_and_prompts_and_the_last_page_is_readable(
    closed_after: list[str],
) -> None:
    closed_after.append("paged")
    server = paged_server("paged")
    report = mcp_server_discover(server=server, actor="test-admin", via="tests")
    assert report.ok, report.error
    server.refresh_from_db()
    assert [r["uri"] for r in server.resources] == [f"notes://runbook/{n}" for n in range(1, 6)]
    assert [p["name"] for p in server.prompts] == [f"brief_{n}" for n in range(1, 6)]
    assert server.prompts[4]["description"] == "브리핑 5"

    who = gate.GateCall(source="admin")
    read = gate.read_resource(server=server, uri="notes://runbook/5", who=who)
    assert (read.ok, read.error, read.value) == (True, None, "운영 절차서 5번")
    prompt = gate.get_prompt(server=server, name="brief_5", arguments={}, who=who)
    assert (prompt.ok, prompt.value) == (True, {"messages": [{"role": "user", "text": "brief_5 브리핑"}]})


def test_a_listing_whose_cursor_never_ends_fails_discovery_saying_so(closed_after: list[str]) -> None:
    closed_after.append("endless")
    server = paged_server("endless", PAGED_ENDLESS="1")
    report = mcp_server_discover(server=server, actor="test-admin", via="tests")
    assert not report.ok
    assert f"server 'endless' answered resources/list with more than {LIST_PAGES_MAX} pages" in report.error
    server.refresh_from_db()
    assert (server.health, server.resources) == (McpServer.Health.ERROR, [])
