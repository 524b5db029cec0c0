"""What discovery read, as the admin shows it: a tool's arguments as a table (type, required, description, limits
in words), its annotations in words, the server's resources and prompts as tables; the JSON folded beneath;
every text masked with the binding's secrets."""

from __future__ import annotations

import sys

import pytest
from django.conf import settings
from django.test import Client
from django.utils import translation

from mcpregistry import discovery_view
from mcpregistry.models import McpServer, McpTool, ToolContract
from mcpregistry.pool import get_default_pool
from tests.conftest import DEMO_SECRET, bind_demo_server, discover_as_admin

SCHEMA = {
    "type": "object",
    "properties": {
        "region": {"type": "string", "enum": ["busan", "seoul"], "description": "지역"},
        "limit": {"type": "integer", "minimum": 1, "maximum": 50, "default": 10},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
        "note": {"anyOf": [{"type": "string", "maxLength": 1}, {"type": "null"}], "title": "Note"},
        "filter": {
            "type": "object",
            "properties": {"owner": {"type": "string", "pattern": "^[가-힣]+$"}},
            "required": ["owner"],
        },
        "api_key": {"type": "string", "description": "the caller's key"},
    },
    "required": ["region"],
}


def test_an_input_schema_reads_as_one_row_per_argument_with_its_limits_in_words() -> None:
    rows = {row.name: row for row in discovery_view.schema_rows(SCHEMA)}
    assert list(rows) == ["region", "limit", "tags", "note", "filter", "filter.owner", "api_key"]
    assert (rows["region"].type, rows["region"].required, rows["region"].description) == ("text", True, "지역")
    assert rows["region"].limits == "one of: busan, seoul"
    assert (rows["limit"].type, rows["limit"].limits) == ("whole number", "at least 1 · at most 50 · default: 10")
    assert (rows["tags"].type, rows["tags"].limits) == ("list of text", "at most 3 items")
    assert (rows["note"].type, rows["note"].description) == ("text or nothing (null)", "Note")
    assert rows["note"].limits == "at most 1 character"  # the limit Pydantic writes inside an optional's anyOf
    assert (rows["filter.owner"].required, rows["filter.owner"].limits) == (True, "matches ^[가-힣]+$")
    assert not rows["filter"].required
    with translation.override("ko"):
        korean = {row.name: row for row in discovery_view.schema_rows(SCHEMA)}
    assert (korean["tags"].type, korean["tags"].limits) == ("문자열 목록", "항목 3개 이하")
    assert korean["limit"].limits == "1 이상 · 50 이하 · 기본값: 10"


def test_the_table_masks_the_bindings_secrets_but_keeps_an_argument_called_api_key() -> None:
    schema = {**SCHEMA, "description": f"token {DEMO_SECRET}"}
    schema["properties"] = {**SCHEMA["properties"], "region": {"type": "string", "description": f"not {DEMO_SECRET}"}}
    html = str(discovery_view.arguments_table(schema, secrets=[DEMO_SECRET]))
    assert DEMO_SECRET not in html
    assert "<code>api_key</code>" in html and "the caller&#x27;s key" in html
    assert "the input schema as discovered (JSON)" in html  # folded beneath


def test_an_odd_schema_is_shown_not_a_failure() -> None:
    odd = {"type": "object", "properties": {"q": {"type": ["string", 3]}, "r": "text"}, "required": [["q"], "r"]}
    rows = discovery_view.schema_rows(odd)
    assert [(r.name, r.required) for r in rows] == [("q", False), ("r", True)]
    assert "<code>q</code>" in str(discovery_view.arguments_table(odd))
    assert discovery_view.server_info_text({"name": f"demo {DEMO_SECRET}"}, secrets=[DEMO_SECRET]) == "demo ***"


def test_a_tool_without_arguments_says_so() -> None:
    html = str(discovery_view.arguments_table({"type": "object", "properties": {}}))
    assert "This tool takes no arguments." in html and "<table" not in html
    assert "The schema names no arguments." in str(discovery_view.arguments_table({"type": "object"}))


def test_annotations_resources_and_prompts_read_in_words_and_are_masked() -> None:
    words = str(discovery_view.annotations_text({"readOnlyHint": True, "destructiveHint": False, "x": 1}))
    assert "only reads <code>readOnlyHint</code>" in words and "does not destroy data" in words
    assert "1 <code>x</code>" in words
    assert discovery_view.annotations_text({}) == "—"
    resources = [{"uri": "notes://a", "name": "a", "mimeType": "text/plain", "description": f"key {DEMO_SECRET}"}]
    html = str(discovery_view.resources_table(resources, secrets=[DEMO_SECRET]))
    assert "<code>notes://a</code>" in html and "text/plain" in html and DEMO_SECRET not in html
    prompts = [{"name": "p", "description": "d", "arguments": [{"name": "team", "required": True}, {"name": "tone"}]}]
    assert "team (required), tone" in str(discovery_view.prompts_table(prompts))
    assert discovery_view.server_info_text({"name": "demo", "version": "1.2"}) == "demo 1.2"


@pytest.mark.slow
@pytest.mark.django_db
def test_the_tool_page_shows_the_arguments_table_and_the_annotations_in_words(admin_client: Client) -> None:
    server = bind_demo_server(mcp_id="shown")
    tool = McpTool.objects.get(server=server, name="get_asset")
    page = admin_client.get(f"/admin/mcpregistry/mcptool/{tool.pk}/change/").content.decode()
    assert '<table class="discovery-table">' in page
    assert "<td><code>owner</code></td><td>text</td><td>optional</td>" in page
    assert "only reads <code>readOnlyHint</code>" in page
    assert "&quot;properties&quot;" in page  # the JSON, folded
    ping = McpTool.objects.get(server=server, name="ping")
    page = admin_client.get(f"/admin/mcpregistry/mcptool/{ping.pk}/change/", HTTP_ACCEPT_LANGUAGE="ko").content
    assert "인자가 없는 도구입니다." in page.decode()


@pytest.mark.slow
@pytest.mark.django_db
def test_the_tool_page_shows_the_arguments_as_the_model_is_shown_them_with_the_contracts_limits(
    admin_client: Client,
) -> None:
    server = bind_demo_server(mcp_id="limits")
    tool = McpTool.objects.get(server=server, name="get_asset_status")
    ToolContract.objects.filter(tool=tool).update(
        args={"asset_id": {"type": "str", "required": True, "allowed": ["A-1001", "A-1002"], "max_length": 6}}
    )
    page = admin_client.get(f"/admin/mcpregistry/mcptool/{tool.pk}/change/").content.decode()
    discovered, shown = page.split("As the model is shown it", 1)
    assert "one of: A-1001, A-1002" not in discovered  # the server's schema says nothing of it
    assert "<td>one of: A-1001, A-1002 · at most 6 characters</td>" in shown
    assert "the schema the model is sent (JSON)" in shown and "Named <code>get_asset_status</code>." in shown
    assert "Not offered to a model now" not in shown
    McpTool.objects.filter(pk=tool.pk).update(enabled=False)
    page = admin_client.get(f"/admin/mcpregistry/mcptool/{tool.pk}/change/").content.decode()
    assert "Not offered to a model now: the tool is disabled" in page
    McpTool.objects.filter(pk=tool.pk).update(schema_error="the input schema is not a JSON object")
    page = admin_client.get(f"/admin/mcpregistry/mcptool/{tool.pk}/change/").content.decode()
    assert "Not offered to a model: the schema is unusable." in page


@pytest.mark.django_db
@pytest.mark.slow
def test_the_server_page_lists_its_resources_and_prompts_as_tables(admin_client: Client) -> None:
    server = McpServer.objects.create(
        mcp_id="context-listing",
        name="context",
        command=sys.executable,
        args=["-m", "tests.mcp_fixtures.secret_context_server"],
        cwd=str(settings.BASE_DIR),
        env={"BACKEND_TOKEN": "bk-tok-listing-0000"},
        timeout_s=10,
    )
    try:
        assert discover_as_admin(server=server).ok
        page = admin_client.get(f"/admin/mcpregistry/mcpserver/{server.pk}/change/").content.decode()
    finally:
        get_default_pool().close("context-listing")
    assert "<td><code>notes://ops/runbook</code></td><td>runbook</td><td>text/plain</td>" in page
    assert "<td><code>ops-prompt</code></td>" in page and "team (required)" in page
    assert "the listing as discovered (JSON)" in page
