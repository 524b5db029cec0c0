"""Defect 2 of the Korean admin crawl: the pool's messages for a server it could not open (could not be reached,
could not be started, did not initialize, failed to initialize, did not answer as an MCP server) were English
f-strings, so a Korean admin page and the dashboard read "도구 탐색 실패(dead-http): server 'dead-http' could not
be reached: …". They are gettext sentences now, written in the language of whoever met the failure: the pool's
loop thread runs each submitted coroutine in the submitting thread's language, so an admin's discovery stores
``last_error`` in that admin's language.

Until the maintainer translates the new messages, ``korean_pool_messages`` puts a provisional Korean text of each
into the loaded Korean catalogue (a message the shipped catalogue already translates keeps its translation).
"""

from __future__ import annotations

import html
import socket
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.utils import translation
from django.utils.translation import trans_real

from mcpregistry.models import McpServer
from mcpregistry.pool import McpSessionPool, McpTimeoutError, McpTransportError
from mcpregistry.services import mcp_server_discover
from tests.mcp_fixtures.scripts import script_file

PROVISIONAL_KOREAN = {
    "server '%(server)s' could not be reached: %(error)s": "서버 '%(server)s'에 연결할 수 없음: %(error)s",
    "server '%(server)s' could not be started: %(error)s": "서버 '%(server)s'을(를) 시작할 수 없음: %(error)s",
    "server '%(server)s' did not initialize within %(seconds)ss": (
        "서버 '%(server)s'이(가) %(seconds)s초 안에 초기화되지 않음"
    ),
    "server '%(server)s' failed to initialize: %(error)s": "서버 '%(server)s' 초기화 실패: %(error)s",
    "server '%(server)s' did not answer as an MCP server: %(error)s": (
        "서버 '%(server)s'의 응답이 MCP가 아님: %(error)s"
    ),
    "not MCP on stdout: %(output)s": "stdout에 MCP가 아닌 출력: %(output)s",
    "not MCP over HTTP: %(output)s": "HTTP로 받은 MCP가 아닌 응답: %(output)s",
}


@pytest.fixture
def korean_pool_messages() -> Iterator[None]:
    catalogue = trans_real.translation("ko")._catalog  # type: ignore[attr-defined]
    added = [msgid for msgid in PROVISIONAL_KOREAN if msgid not in catalogue]
    for msgid in added:
        catalogue[msgid] = PROVISIONAL_KOREAN[msgid]
    yield
    for msgid in added:
        del catalogue._catalogs[0][msgid]


@pytest.fixture
def pool() -> Iterator[McpSessionPool]:
    pool = McpSessionPool()
    yield pool
    pool.shutdown()


def _closed_port_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/mcp"  # nothing listens there now


def _in_korean(msgid: str, **params: str) -> str:
    with translation.override("ko"):
        return translation.gettext(msgid) % params


def _failure(pool: McpSessionPool, config: dict[str, Any], language: str) -> str:
    with translation.override(language), pytest.raises((McpTransportError, McpTimeoutError)) as failed:
        pool.list_tools(config, timeout_s=5)
    return str(failed.value)


def dead_http_config() -> dict[str, Any]:
    return {"mcp_id": "dead-http", "transport": "streamable_http", "url": _closed_port_url()}


def missing_command_config() -> dict[str, Any]:
    return {"mcp_id": "no-binary", "transport": "stdio", "command": "/nonexistent/bin/mcp-server", "args": []}


def test_a_server_that_cannot_be_reached_is_said_so_in_the_callers_language(
    pool: McpSessionPool, korean_pool_messages: None
) -> None:
    config = dead_http_config()

    korean = _failure(pool, config, "ko")
    english = _failure(pool, config, "en")

    prefix = _in_korean("server '%(server)s' could not be reached: %(error)s", server="dead-http", error="")
    assert korean.startswith(prefix), korean
    assert "서버 'dead-http'" in korean
    assert "ConnectError" in korean  # the exception's own words are the parameter, untranslated
    # The transport's own words beside what they mean (an admin met them bare on a Korean page).
    assert english.startswith("server 'dead-http' could not be reached: nothing answers at that address"), english
    assert "(ConnectError: All connection attempts failed)" in english
    assert (
        _in_korean("nothing answers at that address (the connection was refused, or the host cannot be reached)")
        in korean
    )


def test_a_server_that_cannot_be_started_is_said_so_in_the_callers_language(
    pool: McpSessionPool, korean_pool_messages: None
) -> None:
    config = missing_command_config()

    korean = _failure(pool, config, "ko")
    english = _failure(pool, config, "en")

    assert korean.startswith(
        _in_korean("server '%(server)s' could not be started: %(error)s", server="no-binary", error="")
    ), korean
    assert "/nonexistent/bin/mcp-server" in korean
    assert english.startswith("server 'no-binary' could not be started: "), english


def test_the_server_s_non_mcp_output_is_quoted_in_the_callers_language(
    pool: McpSessionPool, korean_pool_messages: None
) -> None:
    config = {
        "mcp_id": "noisy",
        "transport": "stdio",
        "command": sys.executable,
        "args": [script_file("print('Usage: tool [--serve]')")],
    }

    korean = _failure(pool, config, "ko")

    assert _in_korean("not MCP on stdout: %(output)s", output="Usage: tool [--serve]") in korean, korean
    assert "not MCP" not in korean


def test_the_pool_s_loop_gives_the_language_back_after_a_call(pool: McpSessionPool, korean_pool_messages: None) -> None:
    """A Korean call leaves no Korean behind on the loop: the next caller's language is its own."""
    _failure(pool, dead_http_config(), "ko")

    async def language_on_the_loop() -> str | None:
        return translation.get_language()

    with translation.override("en"):
        assert pool.submit(language_on_the_loop()) == "en"
    with translation.override("ko"):
        assert pool.submit(language_on_the_loop()) == "ko"


@pytest.mark.django_db
@pytest.mark.parametrize("language", ["ko", "en"])
def test_a_discovery_stores_last_error_in_the_language_it_ran_in(language: str, korean_pool_messages: None) -> None:
    server = McpServer.objects.create(
        mcp_id="dead-http",
        name="dead-http",
        transport=McpServer.Transport.STREAMABLE_HTTP,
        url=_closed_port_url(),
        timeout_s=3,
        session_scope=McpServer.SessionScope.PER_RUN,
    )

    with translation.override(language):
        report = mcp_server_discover(server=server, actor="test-admin", via="tests")

    server.refresh_from_db()
    assert not report.ok
    if language == "ko":
        prefix = _in_korean("server '%(server)s' could not be reached: %(error)s", server="dead-http", error="")
        assert server.last_error.startswith(prefix), server.last_error
        assert "could not be reached" not in server.last_error
    else:
        assert server.last_error.startswith("server 'dead-http' could not be reached: nothing answers at that")


@pytest.mark.django_db
def test_the_admin_s_discover_button_shows_the_failure_in_korean(admin_client: Any, korean_pool_messages: None) -> None:
    server = McpServer.objects.create(
        mcp_id="dead-http",
        name="dead-http",
        transport=McpServer.Transport.STREAMABLE_HTTP,
        url=_closed_port_url(),
        timeout_s=3,
        session_scope=McpServer.SessionScope.PER_RUN,
    )
    admin_client.cookies[settings.LANGUAGE_COOKIE_NAME] = "ko"

    page = admin_client.post(f"/admin/mcpregistry/mcpserver/{server.pk}/discover/", follow=True)

    text = html.unescape(page.content.decode())
    prefix = _in_korean("server '%(server)s' could not be reached: %(error)s", server="dead-http", error="")
    assert prefix in text
    assert "could not be reached" not in text
    server.refresh_from_db()
    assert server.last_error.startswith(prefix), server.last_error
