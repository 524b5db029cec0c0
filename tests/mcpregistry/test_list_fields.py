"""Lists of texts as an admin writes them (``mcpregistry/list_fields.py``): a tool's tags comma-separated, its
example questions and a server's arguments a line each; a JSON list is still read; a list the separator cannot
carry is shown as JSON; opening and saving a page unchanged changes nothing."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from audit.models import AuditEvent
from mcpregistry.list_fields import TextListField
from mcpregistry.models import McpServer, McpTool
from tests.mcpregistry.test_registry import post_server_form

pytestmark = pytest.mark.django_db


@pytest.fixture
def tool() -> McpTool:
    server = McpServer.objects.create(mcp_id="assets", name="자산", command=sys.executable, args=[])
    return McpTool.objects.create(
        server=server, name="get_asset", input_schema={"type": "object"}, discovered_at=timezone.now()
    )


def post_tool(client: Client, tool: McpTool, **fields: Any) -> Any:
    data = {
        "enabled": "on",
        "tags": "",
        "example_queries": "",
        "contract-TOTAL_FORMS": "0",
        "contract-INITIAL_FORMS": "0",
    }
    data.update(fields)
    return client.post(f"/admin/mcpregistry/mcptool/{tool.pk}/change/", data)


def test_tags_are_comma_separated_and_example_questions_a_line_each(admin_client: Client, tool: McpTool) -> None:
    response = post_tool(
        admin_client,
        tool,
        tags=" 자산, asset ,, 장비 ",
        example_queries="A-1001 자산 상태 알려줘\n\n 노트북, 모니터 현황은? \n",
    )
    assert response.status_code == 302, response.context["adminform"].form.errors
    tool.refresh_from_db()
    assert tool.tags == ["자산", "asset", "장비"]
    assert tool.example_queries == ["A-1001 자산 상태 알려줘", "노트북, 모니터 현황은?"]  # a comma stays in a question
    page = admin_client.get(f"/admin/mcpregistry/mcptool/{tool.pk}/change/", HTTP_ACCEPT_LANGUAGE="ko")
    html = page.content.decode()
    assert 'value="자산, asset, 장비"' in html
    assert ">\nA-1001 자산 상태 알려줘\n노트북, 모니터 현황은?</textarea>" in html
    assert "쉼표로 구분한 단어" in html and "한 줄에 하나씩" in html

    before = AuditEvent.objects.count()
    form = page.context["adminform"].form
    same = {name: form[name].value() for name in ("tags", "example_queries")}
    assert post_tool(admin_client, tool, **same).status_code == 302
    assert AuditEvent.objects.count() == before  # sent back unchanged: nothing changed, nothing recorded


def test_a_json_list_is_still_read_and_a_list_commas_cannot_carry_is_shown_as_json(
    admin_client: Client, tool: McpTool
) -> None:
    assert post_tool(admin_client, tool, tags='["서울,부산", "x"]').status_code == 302
    tool.refresh_from_db()
    assert tool.tags == ["서울,부산", "x"]
    form = admin_client.get(f"/admin/mcpregistry/mcptool/{tool.pk}/change/").context["adminform"].form
    assert form["tags"].value() == '["서울,부산", "x"]'
    before = AuditEvent.objects.count()
    assert post_tool(admin_client, tool, tags=form["tags"].value()).status_code == 302
    tool.refresh_from_db()
    assert tool.tags == ["서울,부산", "x"] and AuditEvent.objects.count() == before

    refused = post_tool(admin_client, tool, tags='["x", 3]')
    assert refused.status_code == 200 and "tags" in refused.context["adminform"].form.errors


def test_a_servers_arguments_are_a_line_each(admin_client: Client) -> None:
    response = post_server_form(
        admin_client, None, mcp_id="lines", args="-m\nmcp_server_time\n--local-timezone=Asia/Seoul"
    )
    assert response.status_code == 302, response.context["adminform"].form.errors
    server = McpServer.objects.get(mcp_id="lines")
    assert server.args == ["-m", "mcp_server_time", "--local-timezone=Asia/Seoul"]
    form = admin_client.get(f"/admin/mcpregistry/mcpserver/{server.pk}/change/").context["adminform"].form
    assert form["args"].value() == "-m\nmcp_server_time\n--local-timezone=Asia/Seoul"


@pytest.mark.parametrize(
    ("separator", "stored", "shown"),
    [
        (",", ["a", "b"], "a, b"),
        (",", ["a,b"], '["a,b"]'),
        (",", ["[x]", "y"], '["[x]", "y"]'),
        ("\n", ["a, b", "c"], "a, b\nc"),
        ("\n", ["  padded"], '["  padded"]'),
        ("\n", ["two\nlines"], '["two\\nlines"]'),
        ("\n", ["", "x"], '["", "x"]'),
        ("\n", [], ""),
        ("\n", ["a\rb"], '["a\\rb"]'),  # a carriage return is a line break too
        ("\n", ["x\u2028y"], '["x\u2028y"]'),
        (",", ["a\rb"], '["a\\rb"]'),
    ],
)
def test_what_is_shown_reads_back_as_what_is_stored(separator: str, stored: list[str], shown: str) -> None:
    field = TextListField(separator=separator, required=False)
    assert field.prepare_value(stored) == shown
    assert field.clean(shown) == stored
    assert not field.has_changed(stored, shown)


def test_words_given_twice_in_a_unique_list_are_shown_as_json() -> None:
    field = TextListField(unique=True, required=False)
    assert field.prepare_value(["a", "a"]) == '["a", "a"]'
    assert field.clean('["a", "a"]') == ["a", "a"] and not field.has_changed(["a", "a"], '["a", "a"]')
