"""A tool's tags are stored composed (NFC), however they came (defect B of the tool-selection review).

Tags typed on macOS come decomposed; the agents' tag filters and the ranker compare composed text, so a tag stored
decomposed matched no filter written composed. The tool's page and ``mcp_tool_update`` (through ``McpTool.clean``)
now store them composed; tags stored decomposed before are compared composed (no data migration: a change no
audit event would record).
"""

from __future__ import annotations

import sys
import unicodedata

import pytest
from django.test import Client
from django.utils import timezone

from audit.models import AuditEvent
from mcpregistry.models import McpServer, McpTool
from mcpregistry.services import mcp_tool_update

pytestmark = pytest.mark.django_db

ASSET = "자산"
ASSET_NFD = unicodedata.normalize("NFD", ASSET)


@pytest.fixture
def tool() -> McpTool:
    server = McpServer.objects.create(mcp_id="assets", name="assets", command=sys.executable, args=[])
    return McpTool.objects.create(server=server, name="get_asset", input_schema={}, discovered_at=timezone.now())


def test_the_service_stores_a_decomposed_tag_composed(tool: McpTool) -> None:
    mcp_tool_update(tool=tool, actor="admin", via="tests", data={"tags": [ASSET_NFD, "asset"]})
    assert McpTool.objects.get(pk=tool.pk).tags == [ASSET, "asset"]
    event = AuditEvent.objects.filter(action="config.mcp_tool.update").latest("id")
    assert event.args["tags"] == [[], [ASSET, "asset"]]


def test_the_tools_page_stores_a_decomposed_tag_composed(admin_client: Client, tool: McpTool) -> None:
    form = {
        "enabled": "on",
        "tags": f"{ASSET_NFD}, asset",
        "example_queries": "",
        "contract-TOTAL_FORMS": "0",
        "contract-INITIAL_FORMS": "0",
        "contract-MIN_NUM_FORMS": "0",
        "contract-MAX_NUM_FORMS": "1",
    }
    response = admin_client.post(f"/admin/mcpregistry/mcptool/{tool.pk}/change/", form)
    assert response.status_code == 302, response.content.decode()[:2000]
    assert McpTool.objects.get(pk=tool.pk).tags == [ASSET, "asset"]
