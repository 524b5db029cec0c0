"""``mcp-server-fetch`` (PyPI, from its own virtualenv) bound as seed 001 binds it, under a contract that limits its
``url`` to allowed hosts: a page on an allowed host is fetched; a URL elsewhere (a cloud metadata address, a
private one, another port) is refused by the gate with ``args:host:url``, audited, and never reaches the server.

The page comes from a loopback HTTP server of the test's own. The server's own private-address refusal is
turned off (``--allow-private-ips``) so that loopback can be fetched at all: the gate's check is then the only
guard, which is what these tests show.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING

import pytest

from audit.models import AuditEvent
from mcpregistry import gate
from mcpregistry.models import McpServer, ToolContract
from mcpregistry.pool import get_default_pool
from tests.conftest import discover_as_admin

if TYPE_CHECKING:
    from tests.thirdparty import StdioCommand

pytest_plugins = ["tests.thirdparty"]
pytestmark = [pytest.mark.django_db, pytest.mark.thirdparty]

PAGE = "<html><head><title>공지</title></head><body><h1>사내 공지</h1><p>프린터 점검은 금요일입니다.</p></body></html>"


class _Pages(BaseHTTPRequestHandler):
    requests: list[str] = []

    def do_GET(self) -> None:
        _Pages.requests.append(self.path)
        body = PAGE.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return


@pytest.fixture
def page_server() -> Iterator[str]:
    """A loopback HTTP server for one test: its ``host:port``."""
    _Pages.requests = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Pages)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def _one_fetch_process() -> Iterator[None]:
    """The module's tests bind the same command: the pool gives each the session (and server process) the test
    before left (the allowed host is the contract's, in the database; a start of the server is a second or two).
    Closed after the module's last test."""
    yield
    get_default_pool().close("fetch")


@pytest.fixture
def fetch(fetch_server_command: StdioCommand, page_server: str, _one_fetch_process: None) -> McpServer:
    server = McpServer.objects.create(
        mcp_id="fetch",
        name="fetch",
        transport=McpServer.Transport.STDIO,
        command=fetch_server_command.command,
        args=[*fetch_server_command.args, "--allow-private-ips"],
        session_scope=McpServer.SessionScope.SHARED,
        timeout_s=20,
    )
    server.full_clean()
    report = discover_as_admin(server=server)
    assert report.ok, report.error
    contract = ToolContract.objects.get(tool__server=server, tool__name="fetch")
    args = dict(contract.args)
    args["url"] = {**args["url"], "allowed_hosts": [page_server]}
    contract.args = args
    contract.risk = "read"
    contract.full_clean()
    contract.save()
    return server


def call(server: McpServer, args: dict) -> gate.ToolResult:
    server = McpServer.objects.prefetch_related("tools__contract").get(pk=server.pk)
    return gate.call(server=server, tool_name="fetch", args=args, who=gate.GateCall(source="admin"))


def test_a_page_on_an_allowed_host_is_fetched(fetch: McpServer, page_server: str) -> None:
    result = call(fetch, {"url": f"http://{page_server}/notice"})
    assert result.ok, result.message
    assert "프린터 점검은 금요일입니다" in str(result.value)
    assert _Pages.requests == ["/notice"]
    event = AuditEvent.objects.get(tool="fetch", action="tool.call")
    assert (event.ok, event.attempt) == (True, 1)


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
        "http://10.0.0.7/admin",
        "http://127.0.0.1:1/other-port",
        "file:///etc/passwd",
    ],
)
def test_a_url_outside_the_allowed_hosts_is_refused_audited_and_never_sent(fetch: McpServer, url: str) -> None:
    result = call(fetch, {"url": url})
    assert (result.ok, result.error, result.attempts) == (False, "args:host:url", 0)
    assert "Fix the argument" in result.message
    event = AuditEvent.objects.get(tool="fetch", action="tool.call")
    assert (event.ok, event.reason, event.attempt, event.latency_ms) == (False, "args:host:url", 0, None)
    assert _Pages.requests == []
