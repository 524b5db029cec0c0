"""The MCP admin pages, as a reviewer found them: a secret typed on a refused server page is named (never sent
back); a setting refused for holding a secret is not sent back either; the contract editor sets a URL argument's
allowed hosts, reads a bool's allowed values typed as words, labels its inputs by argument and marks the cells its
errors name; the Discover tools button says how long it may wait; errors name a field as the page does."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from django.test import Client
from django.utils import translation

from mcpregistry.models import McpServer, McpTool
from tests.mcpregistry.test_contract_editor import editor_post
from tests.mcpregistry.test_registry import post_server_form

pytestmark = pytest.mark.django_db


def test_a_secret_typed_on_a_page_refused_for_another_field_is_named_to_enter_again(
    admin_client: Client, demo_server: McpServer
) -> None:
    page = post_server_form(
        admin_client,
        demo_server,
        new_env="API_TOKEN=sk-live-TYPED-123456789\nOTHER_KEY=${OTHER}",
        new_headers="Authorization=Bearer hdr-TYPED-987654321",
        timeout_s="-1",  # refused: the page comes back
    ).content.decode()
    assert "sk-live-TYPED-123456789" not in page and "hdr-TYPED-987654321" not in page
    assert "API_TOKEN, OTHER_KEY: enter their values again; values are never sent back." in page
    assert "Authorization: enter its value again; values are never sent back." in page


@pytest.mark.parametrize(
    ("changes", "typed", "field_error"),
    [
        (
            {"env_settings": "FAILURE_MODE=none\nSERVICE_URL=https://u:sk-live-ECHO-998877@api.example.com/"},
            "sk-live-ECHO-998877",
            "SERVICE_URL: not sent back, as it holds a secret: enter it again as a secret value.",
        ),
        (
            {"env_settings": "FAILURE_MODE=none\nDB_PASSWORD=hunter2hunter2"},
            "hunter2hunter2",
            "DB_PASSWORD: not sent back, as it holds a secret: enter it again as a secret value.",
        ),
        (
            {"transport": "streamable_http", "url": "https://mcp.example.com/mcp?api_key=sk-live-URLKEY-4455667788"},
            "sk-live-URLKEY-4455667788",
            "It was not sent back, as it holds a secret: enter it again without it.",
        ),
        (
            {"args": "-m\nmcp_demo_server\n--api-key=sk-live-ARGKEY-1122334455"},
            "sk-live-ARGKEY-1122334455",
            "It was not sent back, as it holds a secret: enter it again without it.",
        ),
    ],
)
def test_a_setting_refused_for_holding_a_secret_is_not_sent_back(
    admin_client: Client, demo_server: McpServer, changes: dict[str, str], typed: str, field_error: str
) -> None:
    page = post_server_form(admin_client, demo_server, **changes).content.decode()
    assert "holds a secret" in page and field_error in page
    assert typed not in page
    if "env_settings" in changes:  # the other settings typed stay as they were typed
        assert "FAILURE_MODE=none" in page


def test_errors_name_a_setting_as_the_page_does(demo_server: McpServer) -> None:
    from django.core.exceptions import ValidationError

    demo_server.args = ["-m", "x", "--api-key=sk-live-ARGKEY-1122334455"]
    demo_server.cwd = "/srv/sk-live-CWDKEY-99887766aa"
    with translation.override("ko"), pytest.raises(ValidationError) as refused:
        demo_server.full_clean()
    for field, name in (("args", "arguments"), ("cwd", "working directory")):
        [problem] = refused.value.message_dict[field]
        with translation.override("ko"):
            shown = str(McpServer._meta.get_field(field).verbose_name)
        assert shown != name, "the field's name is translated"
        assert shown in problem and f"{field}" not in problem.split()[0], problem


def test_the_discover_button_says_how_long_it_may_wait(admin_client: Client) -> None:
    server = McpServer.objects.create(mcp_id="slow", name="slow", command=sys.executable, args=[], timeout_s=45)
    page = admin_client.get(f"/admin/mcpregistry/mcpserver/{server.pk}/change/").content.decode()
    assert 'data-busy="Discovering… (up to 45 s)"' in page
    server.timeout_s = 2
    server.save()
    page = admin_client.get(f"/admin/mcpregistry/mcpserver/{server.pk}/change/").content.decode()
    assert 'data-busy="Discovering… (up to 30 s)"' in page


@pytest.fixture
def fetcher(admin_client: Client) -> McpTool:
    from django.utils import timezone

    from mcpregistry.models import ToolContract

    server = McpServer.objects.create(mcp_id="fetch", name="fetch", command=sys.executable, args=[])
    schema = {
        "type": "object",
        "properties": {"url": {"type": "string"}, "urgent": {"type": "boolean"}},
        "required": ["url"],
    }
    tool = McpTool.objects.create(server=server, name="fetch_page", input_schema=schema, discovered_at=timezone.now())
    ToolContract.objects.create(tool=tool, args={"url": {"type": "str", "allowed_hosts": ["api.example.com"]}})
    return tool


def fetcher_post(tool: McpTool, **changes: Any) -> dict[str, Any]:
    data = editor_post(tool)
    data.update(
        {
            "contract-0-args__rows": ["0", "1"],
            "contract-0-args__0__name": "url",
            "contract-0-args__0__type": "str",
            "contract-0-args__0__required": None,
            "contract-0-args__0__allowed_hosts": "api.example.com",
            "contract-0-args__1__name": "urgent",
            "contract-0-args__1__type": "",
        }
    )
    data.update(changes)
    return {k: v for k, v in data.items() if v is not None}


def test_the_editor_shows_and_sets_a_url_arguments_allowed_hosts(admin_client: Client, fetcher: McpTool) -> None:
    page = admin_client.get(f"/admin/mcpregistry/mcptool/{fetcher.pk}/change/").content.decode()
    assert 'name="contract-0-args__0__allowed_hosts" value="api.example.com"' in page
    response = admin_client.post(f"/admin/mcpregistry/mcptool/{fetcher.pk}/change/", fetcher_post(fetcher))
    assert response.status_code == 302, response.content.decode()[:3000]
    fetcher.contract.refresh_from_db()
    assert fetcher.contract.args["url"] == {"type": "str", "allowed_hosts": ["api.example.com"]}
    changed = fetcher_post(fetcher, **{"contract-0-args__0__allowed_hosts": "api.example.com, *.example.org:8443"})
    response = admin_client.post(f"/admin/mcpregistry/mcptool/{fetcher.pk}/change/", changed)
    assert response.status_code == 302, response.content.decode()[:3000]
    fetcher.contract.refresh_from_db()
    assert fetcher.contract.args["url"]["allowed_hosts"] == ["api.example.com", "*.example.org:8443"]


def test_a_bools_allowed_values_typed_as_words_are_booleans(admin_client: Client, fetcher: McpTool) -> None:
    changed = fetcher_post(
        fetcher, **{"contract-0-args__1__type": "bool", "contract-0-args__1__allowed": "true, False"}
    )
    response = admin_client.post(f"/admin/mcpregistry/mcptool/{fetcher.pk}/change/", changed)
    assert response.status_code == 302, response.content.decode()[:3000]
    fetcher.contract.refresh_from_db()
    assert fetcher.contract.args["urgent"] == {"type": "bool", "allowed": [True, False]}


def test_the_editors_inputs_are_labelled_by_argument_and_only_the_cells_in_error_are_marked(
    admin_client: Client, fetcher: McpTool
) -> None:
    page = admin_client.get(f"/admin/mcpregistry/mcptool/{fetcher.pk}/change/").content.decode()
    assert 'aria-label="url: pattern"' in page and 'aria-label="urgent: max length"' in page
    for field in ("args", "returns", "retry"):  # the field's label names an element of the page
        assert f'for="id_contract-0-{field}"' in page and f'id="id_contract-0-{field}"' in page
    refused = fetcher_post(fetcher, **{"contract-0-args__0__pattern": "(", "contract-0-args__1__max_length": "-1"})
    page = admin_client.post(f"/admin/mcpregistry/mcptool/{fetcher.pk}/change/", refused).content.decode()
    assert "url.pattern:" in page
    marked = page.count("contract-invalid")
    assert marked == 2, marked
    assert 'name="contract-0-args__0__pattern" value="(" aria-label="url: pattern" class="contract-invalid"' in page
    assert 'class="contract-bound contract-invalid" name="contract-0-args__1__max_length"' in page
