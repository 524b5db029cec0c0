"""The MCP server and tool admin, as a reviewer found it: a URL typed without its scheme is refused in one error
(never saved as https://); a binding switched to local tools shows its stored secrets and settings, and clears them
audited; counts read as counts ("1 tool listed", nothing awaited review); the server list's error is cut at a word
with "…", the whole in its title; a secret in a setting names "the setting"; the contract editor says a schema's
type in words; ``calculate`` says why an expression does not parse in the reader's words, not Python's."""

from __future__ import annotations

import html
import re
from typing import Any

import pytest
from django.contrib.messages import get_messages
from django.test import Client
from django.utils import timezone, translation

from audit.models import AuditEvent
from mcpregistry.builtin_tools import calculate
from mcpregistry.local_tools import ArgumentRefused
from mcpregistry.models import McpServer, McpTool, ToolContract
from tests.mcpregistry.test_registry import post_server_form

pytestmark = pytest.mark.django_db


def errors_shown(page: str) -> list[str]:
    return [
        html.unescape(item)
        for block in re.findall(r'<ul class="errorlist[^>]*>(.*?)</ul>', page, re.S)
        for item in re.findall(r"<li>(.*?)</li>", block, re.S)
    ]


def page_messages(response) -> list[str]:  # type: ignore[no-untyped-def]
    return [str(m) for m in get_messages(response.wsgi_request)]


# 1. a URL without its scheme ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    ["127.0.0.1:8746/mcp", "localhost:8746/mcp", "mcp.example.com/mcp", "ftp://mcp.example.com/", "http://[::1/mcp"],
)
def test_a_url_typed_without_its_scheme_is_refused_in_one_error(admin_client: Client, url: str) -> None:
    response = post_server_form(admin_client, None, transport="streamable_http", command="", url=url)
    assert response.status_code == 200  # was saved as https://127.0.0.1:8746/mcp
    assert errors_shown(response.content.decode()) == ["Enter an http:// or https:// URL."]
    assert not McpServer.objects.filter(mcp_id="new-server").exists()


def test_a_url_without_its_scheme_leaves_the_stored_one(admin_client: Client) -> None:
    server = McpServer.objects.create(
        mcp_id="remote", name="remote", transport="streamable_http", url="https://mcp.example.com/mcp"
    )
    response = post_server_form(
        admin_client, server, mcp_id="remote", transport="streamable_http", command="", url="mcp.example.com/v2"
    )
    assert errors_shown(response.content.decode()) == ["Enter an http:// or https:// URL."]
    server.refresh_from_db()
    assert server.url == "https://mcp.example.com/mcp"


# 2. a binding switched to local tools ---------------------------------------------------------------------------


def fieldset_classes(page: str, field: str) -> str:
    """The classes of the fieldset that holds ``field``'s row."""
    before = page[: page.index(f"field-{field}")]
    classes: list[str] = re.findall(r'<fieldset class="([^"]*)"', before)
    return classes[-1]


@pytest.mark.slow
def test_a_binding_switched_to_local_shows_its_stored_secrets_and_clears_them_audited(
    admin_client: Client, demo_server: McpServer, settings: Any
) -> None:
    settings.PLATFORM_LOCAL_TOOL_MODULES = ["mcpregistry.builtin_tools"]
    saved = post_server_form(
        admin_client, demo_server, new_env="LEFT_TOKEN=sk-live-LEFTOVER-1234567890", env_settings="FAILURE_MODE=none"
    )
    assert saved.status_code == 302, errors_shown(saved.content.decode())
    saved = post_server_form(
        admin_client,
        demo_server,
        transport="local",
        command="",
        args="mcpregistry.builtin_tools",
        env_settings="FAILURE_MODE=none",
    )
    assert saved.status_code == 302, errors_shown(saved.content.decode())
    page = admin_client.get(f"/admin/mcpregistry/mcpserver/{demo_server.pk}/change/").content.decode()
    # server_form.js shows a fieldset whose classes name the transport chosen: the secrets (state, remove boxes)
    # and the settings stored are shown for local tools too (were stdio and HTTP only, hidden and kept).
    for field in ("secrets_state", "remove_secrets", "env_settings"):
        assert "server-transport-local" in fieldset_classes(page, field).split(), field
    assert 'value="env:LEFT_TOKEN"' in page
    removed = post_server_form(
        admin_client,
        demo_server,
        transport="local",
        command="",
        args="mcpregistry.builtin_tools",
        env_settings="",
        remove_secrets=["env:LEFT_TOKEN", "env:INTERNAL_API_KEY"],
    )
    assert removed.status_code == 302, errors_shown(removed.content.decode())
    demo_server.refresh_from_db()
    assert demo_server.env == {} and demo_server.public_env == []
    update = AuditEvent.objects.filter(action="config.mcp_server.update", result__id=demo_server.pk).latest("pk")
    assert {"env", "public_env"} <= set(update.args)
    page = admin_client.get(f"/admin/mcpregistry/mcpserver/{demo_server.pk}/change/").content.decode()
    assert "server-transport-local" not in fieldset_classes(page, "secrets_state").split()  # nothing left to show


# 3. counts ------------------------------------------------------------------------------------------------------


def test_a_discovery_of_one_tool_says_one_tool(admin_client: Client, settings: Any) -> None:
    settings.PLATFORM_LOCAL_TOOL_MODULES = ["mcpregistry.builtin_tools"]
    server = McpServer.objects.create(
        mcp_id="One-Tool", name="one", transport="local", args=["mcpregistry.builtin_tools.calculate"], timeout_s=5
    )
    [message] = page_messages(admin_client.post(f"/admin/mcpregistry/mcpserver/{server.pk}/discover/"))
    assert message.startswith("Discovery of One-Tool: 1 tool listed; added: calculate"), message
    message = page_messages(admin_client.post(f"/admin/mcpregistry/mcpserver/{server.pk}/health/"))[-1]
    assert re.match(r"Health of One-Tool: ok, 1 tool listed in \d+ ms$", message), message


def test_approving_tools_that_awaited_no_review_says_so(admin_client: Client, demo_server: McpServer) -> None:
    tool = McpTool.objects.create(server=demo_server, name="s45_probe", input_schema={}, discovered_at=timezone.now())
    response = admin_client.post(
        "/admin/mcpregistry/mcptool/", {"action": "approve_reviewed_changes", "_selected_action": [tool.pk]}
    )
    assert page_messages(response) == ["None of the selected tools awaited review."]  # was "0 tool(s) approved."
    McpTool.objects.filter(pk=tool.pk).update(review_required=True, enabled_before_review=False)
    response = admin_client.post(
        "/admin/mcpregistry/mcptool/", {"action": "approve_reviewed_changes", "_selected_action": [tool.pk]}
    )
    assert page_messages(response)[-1] == "1 tool approved."


# 4. the server list's error -------------------------------------------------------------------------------------


def test_the_server_lists_error_is_cut_at_a_word_with_an_ellipsis_and_whole_in_its_title(
    admin_client: Client, demo_server: McpServer
) -> None:
    error = "ConnectError: " + " ".join(f"word{n:03d}" for n in range(40)) + " 👩‍💻 end"
    McpServer.objects.filter(pk=demo_server.pk).update(health="error", last_error=error)
    page = html.unescape(admin_client.get("/admin/mcpregistry/mcpserver/").content.decode())
    [(title, shown)] = re.findall(r'<span title="([^"]*)">([^<]*)</span>', page)
    assert title == error
    assert shown.endswith("…") and len(shown) <= 120
    assert error.startswith(shown[:-1]) and error[len(shown) - 1] == " "  # a whole word before the cut


# 5. a secret in a setting ---------------------------------------------------------------------------------------


def test_a_secret_in_a_setting_names_the_setting_so_no_particle_attaches_to_it(
    admin_client: Client, demo_server: McpServer
) -> None:
    page = post_server_form(
        admin_client, demo_server, args="-m\nmcp_demo_server\n--api-key=sk-live-ARGKEY-1122334455"
    ).content.decode()
    assert "but the setting arguments is stored, shown and exported in clear" in " ".join(errors_shown(page))


# 6. the contract editor's schema type ---------------------------------------------------------------------------


def test_the_contract_editor_says_the_schema_type_in_words(admin_client: Client, demo_server: McpServer) -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "ids": {"type": "array"}}}
    tool = McpTool.objects.create(
        server=demo_server, name="s45_lookup", input_schema=schema, discovered_at=timezone.now()
    )
    ToolContract.objects.create(tool=tool, args={"name": {"type": "str"}, "extra": {"type": "int"}})
    page = admin_client.get(f"/admin/mcpregistry/mcptool/{tool.pk}/change/").content.decode()
    assert "schema: text" in page and "schema: list" in page
    assert "schema: string" not in page and "schema: array" not in page
    assert page.count("schema: ") == 2  # none for the argument the schema does not list
    with translation.override("ko"):
        page = admin_client.get(
            f"/admin/mcpregistry/mcptool/{tool.pk}/change/", HTTP_ACCEPT_LANGUAGE="ko"
        ).content.decode()
    assert "스키마: string" not in page


# 7. calculate's refusals ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "said"),
    [
        ("(1+2", "not an arithmetic expression: a parenthesis is opened and never closed"),
        ("1 + (2 * 3", "not an arithmetic expression: a parenthesis is opened and never closed"),
        ("1+2)", "not an arithmetic expression: a closing parenthesis has no opening one"),
        ("₩1000 * 2", "not an arithmetic expression: '₩' (U+20A9) is not part of arithmetic"),
        ("1 + 2 =", "not an arithmetic expression: '=' (U+003D) is not part of arithmetic"),
        ("1\u200b+2", "not an arithmetic expression: U+200B is not part of arithmetic"),
        ("3 +", "not an arithmetic expression"),
        # Python's parser drops a comment ("3 + 4 # 5" was 7) and joins lines at a backslash: no arithmetic.
        ("3 + 4 # 5", "not an arithmetic expression: '#' (U+0023) is not part of arithmetic"),
        ("3 + 4 \\\n + 1", "not an arithmetic expression: '\\' (U+005C) is not part of arithmetic"),
    ],
)
def test_calculate_says_why_an_expression_does_not_parse_in_its_own_words(expression: str, said: str) -> None:
    with pytest.raises(ArgumentRefused) as refused:
        calculate.invoke({"expression": expression})
    assert str(refused.value) == said


def test_calculate_refusals_carry_no_english_parser_text_in_korean() -> None:
    # Python's parser's own words (were appended under the Korean "산술식이 아닙니다: "); ours go through gettext.
    for expression in ("(1+2", "₩1000 * 2", "1+2)", "3 +"):
        with translation.override("ko"), pytest.raises(ArgumentRefused) as refused:
            calculate.invoke({"expression": expression})
        text = str(refused.value)
        for english in ("' was never closed", "invalid character", "unmatched ')'", "invalid syntax"):
            assert english not in text, text
