"""Defects of the MCP client side found in review, each held here by what it broke:

* key rotation re-encrypted only the bindings' secrets: an agent's model secrets and an approval's exact arguments
  (the same encrypted field, the same keys) could not be read once the old key was retired;
* the idle reaper closed a session whose call was still running (a stdio server killed mid-write: an unknown
  outcome), as ``last_used`` was set only when a call began;
* an HTTP session read with the SDK's 300 s timeout, cutting a slower answer that its call's own timeout allowed;
* a server's JSON-RPC error that said "closed" was taken for a broken session (an answered call made unknown);
* a listing with a name too long for the registry, a NUL character or one name twice aborted discovery (a
  DataError on PostgreSQL, an IntegrityError reported as a concurrent discovery);
* the server page posted form fields per tool: a server of a few hundred tools could not be saved (HTTP 400);
* a server's stderr was kept line by line whatever a line's size (a 20 MB line, a 20 MB error message);
* the pool kept an open lock per run scope for ever.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import unicodedata
from collections.abc import Iterator
from datetime import timedelta
from html.parser import HTMLParser
from io import StringIO
from typing import Any

import mcp.shared._httpx_utils as httpx_utils
import pytest
from cryptography.fernet import Fernet
from django.conf import settings
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone, translation
from mcp import McpError

import mcpregistry.services as services
from agents.models import Agent, Approval, Run
from audit.models import AuditEvent
from mcpregistry.models import McpServer, McpTool
from mcpregistry.pool import McpSessionPool, McpTransportError
from mcpregistry.services import mcp_server_discover
from tests.e2e.harness import free_port, wait_until
from tests.postgres import manage, postgres_url  # noqa: F401 - postgres_url is a fixture

RAW = ["-m", "tests.mcp_fixtures.raw_jsonrpc_server"]


def raw_config(mcp_id: str = "raw", **env: str) -> dict[str, Any]:
    return {
        "mcp_id": mcp_id,
        "transport": "stdio",
        "command": sys.executable,
        "args": RAW,
        "cwd": str(settings.BASE_DIR),
        "env": env,
    }


def raw_server(mcp_id: str, tools: list[dict[str, Any]]) -> McpServer:
    return McpServer.objects.create(
        mcp_id=mcp_id,
        name=mcp_id,
        command=sys.executable,
        args=RAW,
        cwd=str(settings.BASE_DIR),
        env={"TOOLS": json.dumps(tools)},
        public_env=["TOOLS"],
        session_scope="shared",
    )


@pytest.fixture
def pool() -> Iterator[McpSessionPool]:
    pool = McpSessionPool()
    yield pool
    pool.shutdown()


# ---- 1. key rotation covers every encrypted field ---------------------------------------------------------------


def raw_column(obj: Any, column: str) -> str:
    table, quote = obj._meta.db_table, connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {quote(column)} FROM {quote(table)} WHERE id = %s",
            [obj._meta.pk.get_db_prep_value(obj.pk, connection)],
        )
        return str(cursor.fetchone()[0])


def test_rotation_reencrypts_every_encrypted_field_so_the_old_key_can_go(db, settings, monkeypatch) -> None:
    monkeypatch.setattr(services, "ROTATE_BATCH", 2, raising=False)  # several batches of approvals
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.SECRETS_ENCRYPTION_KEYS = old
    server = McpServer.objects.create(mcp_id="rot", name="rot", command=sys.executable, env={"TOKEN": "tok-12345678"})
    agent = Agent.objects.create(slug="rot-agent", name="rot", model_secrets={"api_key": "sk-live-abcdefgh1234"})
    plain = Agent.objects.create(slug="plain", name="plain")  # no secret: stored empty, nothing to re-encrypt
    run = Run.objects.create(agent=agent, query="q", status=Run.Status.AWAITING_APPROVAL)
    approvals = [
        Approval.objects.create(
            run=run,
            mcp_id="rot",
            tool="pay",
            args={"amount": "***"},
            exact_args={"amount": n, "card": "4111-secret"},
            call_hash=str(n).ljust(64, "0"),
            expires_at=timezone.now() + timedelta(hours=1),
        )
        for n in range(5)
    ]
    settings.SECRETS_ENCRYPTION_KEYS = f"{new},{old}"
    out = StringIO()
    call_command("rotate_secrets", stdout=out)
    settings.SECRETS_ENCRYPTION_KEYS = new  # the old key retired, as rotation is meant to allow

    assert McpServer.objects.get(pk=server.pk).env == {"TOKEN": "tok-12345678"}
    assert Agent.objects.get(pk=agent.pk).model_secrets == {"api_key": "sk-live-abcdefgh1234"}
    assert Agent.objects.get(pk=plain.pk).model_secrets == {}
    for n, approval in enumerate(approvals):
        assert Approval.objects.get(pk=approval.pk).exact_args == {"amount": n, "card": "4111-secret"}
        assert "4111-secret" not in raw_column(approval, "exact_args")
    text = out.getvalue()
    assert "(agents.approval): 5 row(s) re-encrypted" in text
    assert "(agents.agent): 1 row(s) re-encrypted" in text
    assert "(mcpregistry.mcpserver): 1 row(s) re-encrypted" in text

    events = {e.action: e for e in AuditEvent.objects.filter(action__endswith=".rotate_secrets")}
    assert set(events) == {
        "config.mcp_server.rotate_secrets",
        "config.agent.rotate_secrets",
        "config.approval.rotate_secrets",
    }
    assert "model_secrets" in events["config.agent.rotate_secrets"].args  # which names: masked by the field's name
    assert events["config.approval.rotate_secrets"].result["count"] == 5
    assert all(e.actor == "system:rotate_secrets" for e in events.values())
    stored = json.dumps([[e.args, e.result] for e in events.values()])
    assert "sk-live" not in stored and "4111-secret" not in stored and "tok-12345678" not in stored


def test_rows_no_key_decrypts_are_reported_and_the_rest_rotated(db, settings) -> None:
    lost, old, new = (Fernet.generate_key().decode() for _ in range(3))
    settings.SECRETS_ENCRYPTION_KEYS = lost
    orphan = Agent.objects.create(slug="orphan", name="orphan", model_secrets={"api_key": "sk-lost-abcdefgh1234"})
    settings.SECRETS_ENCRYPTION_KEYS = old
    kept = Agent.objects.create(slug="kept", name="kept", model_secrets={"api_key": "sk-kept-abcdefgh1234"})
    settings.SECRETS_ENCRYPTION_KEYS = f"{new},{old}"
    with pytest.raises(CommandError, match=f"agents.agent: {orphan.pk}"):
        call_command("rotate_secrets", stdout=StringIO())
    settings.SECRETS_ENCRYPTION_KEYS = new
    assert Agent.objects.get(pk=kept.pk).model_secrets == {"api_key": "sk-kept-abcdefgh1234"}  # committed


ROTATE_ON_POSTGRES = r"""
import io, json
from datetime import timedelta
from cryptography.fernet import Fernet
from django.conf import settings
from django.core.management import CommandError, call_command
from django.utils import timezone
import mcpregistry.services as services
from agents.models import Agent, Approval, Run
from audit.change_guard import change_scope
old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
settings.SECRETS_ENCRYPTION_KEYS = old
with change_scope(actor="test", via="tests"):
    agent = Agent.objects.create(slug="pg-rot", name="rot", model_secrets={"api_key": "sk-live-abcdefgh1234"})
run = Run.objects.create(agent=agent, query="q", status=Run.Status.AWAITING_APPROVAL)
ids = [Approval.objects.create(run=run, mcp_id="m", tool="t", exact_args={"n": n}, call_hash=str(n).ljust(64, "0"),
                               expires_at=timezone.now() + timedelta(hours=1)).pk for n in range(3)]
services.ROTATE_BATCH = 1
settings.SECRETS_ENCRYPTION_KEYS = f"{new},{old}"
out = io.StringIO()
try:
    call_command("rotate_secrets", stdout=out)
except CommandError:
    pass  # rows of other tests in this shared database, under keys this process does not have: left as they are
settings.SECRETS_ENCRYPTION_KEYS = new
print(json.dumps({"out": out.getvalue(), "secrets": Agent.objects.get(pk=agent.pk).model_secrets,
                  "args": [Approval.objects.get(pk=pk).exact_args for pk in ids]}))
"""


@pytest.mark.postgres
def test_rotation_on_postgres_in_batches(postgres_url: str) -> None:  # noqa: F811
    done = manage("shell", "-c", ROTATE_ON_POSTGRES, database_url=postgres_url)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert "(agents.approval): " in got["out"]
    assert got["secrets"] == {"api_key": "sk-live-abcdefgh1234"}
    assert got["args"] == [{"n": 0}, {"n": 1}, {"n": 2}]


# ---- 2. the idle reaper leaves a busy session alone -------------------------------------------------------------


@pytest.mark.slow
def test_the_idle_reaper_never_closes_a_session_with_a_call_in_flight() -> None:
    # A call may run up to PLATFORM_TOOL_TIMEOUT_MAX_S; sessions idle for PLATFORM_MCP_IDLE_CLOSE_S are reaped.
    # Scaled down: a 1 s call under a 0.3 s idle limit (the reaper looks every 0.15 s: five times past the limit).
    pool = McpSessionPool(idle_close_s=0.3)
    try:
        assert pool.call_tool(raw_config(), "slow", {"s": 1}, timeout_s=20).text == "ok"
        # Idle from when the call ended: still open just after it, closed once idle past the limit.
        assert len(pool.live_sessions()) == 1
        wait_until(lambda: pool.live_sessions() == {}, timeout=10, what="the idle session closed")
    finally:
        pool.shutdown()


# ---- 3. an HTTP session reads as long as a call may last --------------------------------------------------------


@pytest.fixture
def slow_http() -> Iterator[str]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.mcp_fixtures.slow_http_server", str(port)],
        cwd=settings.BASE_DIR,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def listening() -> bool:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True

        wait_until(listening, timeout=30, what="the slow HTTP MCP server", interval=0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(10)


@pytest.mark.slow
def test_an_http_call_within_its_timeout_is_not_cut_by_the_sdks_read_timeout(monkeypatch, slow_http: str) -> None:
    # The SDK reads for 300 s by default; a call may be allowed up to 3,600 s. Scaled: the SDK's 0.5 s against 1 s.
    monkeypatch.setattr(httpx_utils, "MCP_DEFAULT_SSE_READ_TIMEOUT", 0.5)
    pool = McpSessionPool()
    try:
        config = {"mcp_id": "slow", "transport": "streamable_http", "url": slow_http}
        assert "done" in pool.call_tool(config, "slow", {"s": 1}, timeout_s=20).text
        [session] = pool._sessions.values()
        assert session.http_client is not None
        assert session.http_client.timeout.read > 3600  # as long as the longest call may last, and more
    finally:
        pool.shutdown()


# ---- 4. a server's error that says "closed" is its answer -------------------------------------------------------


def test_a_protocol_error_that_says_closed_is_an_answer_not_a_broken_session(pool: McpSessionPool) -> None:
    assert pool.call_tool(raw_config(), "echo", {}, timeout_s=10).text == "ok"
    [session] = pool._sessions.values()
    with pytest.raises(McpError) as refused:  # not McpTransportError(sent=True): nothing about it is unknown
        pool.call_tool(raw_config(), "close_ticket", {"id": "T-1"}, timeout_s=10)
    assert "already closed" in str(refused.value)
    assert pool.call_tool(raw_config(), "echo", {}, timeout_s=10).text == "ok"
    assert list(pool._sessions.values()) == [session] and not session.dead  # the same session, never dropped


# ---- 5, 6. a hostile listing is reported, never aborts discovery -----------------------------------------------

SCHEMA = {"type": "object", "properties": {"x": {"type": "string"}}}


def test_a_name_listed_twice_keeps_the_first_and_is_reported(db) -> None:
    server = raw_server(
        "dup",
        [
            {"name": "same", "description": "first", "inputSchema": SCHEMA},
            {"name": "same", "description": "second", "inputSchema": SCHEMA},
            {"name": "other", "description": "other", "inputSchema": SCHEMA},
        ],
    )
    report = mcp_server_discover(server=server, actor="test", via="tests")
    assert report.ok, report.error  # not "another discovery of this server ran at the same time"
    assert report.added == ["same", "other"] and report.tool_count == 2
    assert report.rejected == ["same: listed more than once (the first is kept)"]
    assert report.rejected[0] in report.schema_errors
    assert McpTool.objects.get(server=server, name="same").description == "first"
    server.refresh_from_db()
    assert server.health == McpServer.Health.ERROR and "listed more than once" in server.last_error


def test_a_servers_health_note_is_written_in_the_language_of_whoever_discovered(db) -> None:
    # It was English whatever the admin read: the one untranslated line of a Korean server page.
    server = raw_server(
        "dup",
        [
            {"name": "same", "description": "first", "inputSchema": SCHEMA},
            {"name": "same", "description": "second", "inputSchema": SCHEMA},
            {"name": "broken", "description": "bad schema", "inputSchema": {"type": "array"}},
        ],
    )
    with translation.override("ko"):
        report = mcp_server_discover(server=server, actor="test", via="tests")
    assert report.ok, report.error
    server.refresh_from_db()
    assert "tools not registered" not in server.last_error and "unusable input schema" not in server.last_error
    assert "모델에 제공되지 않음" in server.last_error and "same" in server.last_error and "broken" in server.last_error


def test_names_that_cannot_be_stored_are_reported_and_nul_is_removed_from_texts(db) -> None:
    server = raw_server(
        "odd",
        [
            {"name": "t" * 300, "description": "long", "inputSchema": SCHEMA},
            {"name": "bad\u0000name", "description": "nul", "inputSchema": SCHEMA},
            {"name": "tab\tname", "description": "control", "inputSchema": SCHEMA},
            {
                "name": "fine",
                "description": "nul\u0000here",
                "inputSchema": {
                    "type": "object",
                    "properties": {"x\u0000": {"type": "string", "description": "a\u0000"}},
                },
            },
        ],
    )
    report = mcp_server_discover(server=server, actor="test", via="tests")
    assert report.ok, report.error
    assert report.added == ["fine"]
    assert [entry.split(": ", 1)[1] for entry in report.rejected] == [
        "a name longer than 200 characters",
        "a name with control characters",
        "a name with control characters",
    ]
    assert report.rejected[1].startswith("bad\\x00name:")  # shown escaped, never as the character itself
    assert all(len(entry) < 200 for entry in report.rejected)
    tool = McpTool.objects.get(server=server, name="fine")
    # NUL stored as U+FFFD, as the audit's masking stores it (PostgreSQL takes no NUL in text or JSON).
    assert tool.description == "nul\ufffdhere"
    assert tool.input_schema == {
        "type": "object",
        "properties": {"x\ufffd": {"type": "string", "description": "a\ufffd"}},
    }
    server.refresh_from_db()
    assert "tools not registered" in server.last_error and "\x00" not in server.last_error


HOSTILE_ON_POSTGRES = r"""
import json, sys
from django.conf import settings
from mcpregistry.services import mcp_server_create, mcp_server_discover
results = {}
for mode, tools in {
    "long": [{"name": "t" * 300, "description": "long", "inputSchema": {"type": "object"}}],
    "nul": [{"name": "bad\u0000name", "description": "nul\u0000desc", "inputSchema": {"type": "object"}},
            {"name": "ok", "description": "nul\u0000desc", "inputSchema": {"type": "object", "title": "a\u0000"}}],
    "dup": [{"name": "same", "inputSchema": {"type": "object"}}, {"name": "same", "inputSchema": {"type": "object"}}],
}.items():
    server = mcp_server_create(actor="test", via="tests", data=dict(
        mcp_id="hostile-" + mode, name=mode, command=sys.executable, args=["-m", "tests.mcp_fixtures.raw_jsonrpc_server"],
        cwd=str(settings.BASE_DIR), env={"TOOLS": json.dumps(tools)}, public_env=["TOOLS"], session_scope="per_run"))
    report = mcp_server_discover(server=server, actor="test", via="tests")
    results[mode] = [report.ok, report.error, report.added, len(report.rejected)]
print(json.dumps(results))
"""


@pytest.mark.postgres
def test_a_hostile_listing_on_postgres_is_reported_not_raised(postgres_url: str) -> None:  # noqa: F811
    done = manage("shell", "-c", HOSTILE_ON_POSTGRES, database_url=postgres_url)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert results == {"long": [True, "", [], 1], "nul": [True, "", ["ok"], 1], "dup": [True, "", ["same"], 1]}


# ---- 7. the server page of a server with many tools can be saved ------------------------------------------------


class FormFields(HTMLParser):
    """The fields a browser would post from the server's change form."""

    def __init__(self) -> None:
        super().__init__()
        self.data: list[tuple[str, str | None]] = []
        self.in_form = False
        self.textarea = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "form" and a.get("id") == "mcpserver_form":
            self.in_form = True
        if not self.in_form:
            return
        if tag == "option" and "selected" in a and self.data and self.data[-1][1] is None:
            self.data[-1] = (self.data[-1][0], a.get("value") or "")
        if "name" not in a:
            return
        name = str(a["name"])
        if tag == "input" and a.get("type") not in ("submit", "button"):
            if a.get("type") == "checkbox" and "checked" not in a:
                return
            self.data.append((name, a.get("value") or ""))
        elif tag == "select":
            self.data.append((name, None))
        elif tag == "textarea":
            self.data.append((name, ""))
            self.textarea = True

    def handle_data(self, data: str) -> None:
        if self.textarea:
            self.data[-1] = (self.data[-1][0], (self.data[-1][1] or "") + data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self.in_form = False
        if tag == "textarea":
            self.textarea = False


@pytest.mark.slow
def test_the_page_of_a_server_with_400_tools_is_saved_and_links_its_tools(admin_client) -> None:
    tools = [{"name": f"t{i:03}", "description": f"tool {i}", "inputSchema": {"type": "object"}} for i in range(400)]
    server = raw_server("many", tools)
    assert mcp_server_discover(server=server, actor="test", via="tests").ok
    url = f"/admin/mcpregistry/mcpserver/{server.pk}/change/"
    page = admin_client.get(url).content.decode()
    form = FormFields()
    form.feed(page)
    data: dict[str, list[str]] = {}
    for name, value in form.data:
        data.setdefault(name, []).append(value or "")
    assert not any(name.startswith("tools-") for name in data)  # no form field per tool
    assert sum(len(v) for v in data.values()) < settings.DATA_UPLOAD_MAX_NUMBER_FIELDS // 10
    first = McpTool.objects.get(server=server, name="t000")
    assert f'href="/admin/mcpregistry/mcptool/{first.pk}/change/"' in page
    assert f'href="/admin/mcpregistry/mcptool/?server__id__exact={server.pk}"' in page
    assert "<code>t099</code>" in page and "<code>t100</code>" not in page and "the first 100 of 400 tools" in page
    data["name"] = ["renamed"]
    response = admin_client.post(url, data)
    assert response.status_code == 302, response.content.decode()[:2000]
    server.refresh_from_db()
    assert server.name == "renamed" and server.args == RAW and server.env["TOOLS"] == json.dumps(tools)
    listed = admin_client.get(f"/admin/mcpregistry/mcptool/?server__id__exact={server.pk}")
    assert listed.status_code == 200 and "400" in listed.content.decode()


# ---- 8. a server's stderr is kept bounded -----------------------------------------------------------------------


def test_a_huge_stderr_line_makes_a_bounded_error(pool: McpSessionPool) -> None:
    started = time.monotonic()
    with pytest.raises(McpTransportError) as failed:
        pool.list_tools(raw_config("bomb", STDERR_CHARS=str(20_000_000)), timeout_s=20)
    message = str(failed.value)
    assert "EEEE" in message and len(message) < 5_000
    assert time.monotonic() - started < 15


# ---- 9. a run's scope leaves no open lock behind ---------------------------------------------------------------


def test_closed_run_scopes_leave_nothing_behind(pool: McpSessionPool) -> None:
    for run in range(3):
        pool.call_tool(raw_config(), "echo", {}, timeout_s=10, scope=f"run:{run}")
        pool.close_scope(f"run:{run}")
    with pytest.raises(McpTransportError):  # a scope whose server never started leaves none either
        pool.call_tool(raw_config("bomb", STDERR_CHARS="10"), "echo", {}, timeout_s=10, scope="run:failed")
    assert pool.live_sessions() == {}
    assert pool._open_locks == {}
    pool.call_tool(raw_config(), "echo", {}, timeout_s=10)  # the shared session keeps its lock while it lives
    assert len(pool._open_locks) == 1
    pool.close("raw")
    assert pool._open_locks == {}


def test_one_name_listed_composed_and_decomposed_is_one_name_listed_twice(db) -> None:
    # 직원검색 written on macOS arrives decomposed: beside its composed form on one server, the agent's conflict check
    # (which compares in NFC) failed every run of that server with config:tool_name_conflict, and no prefix could
    # part them. The second is reported and left out, as any name listed twice.
    composed = "직원검색"
    decomposed = unicodedata.normalize("NFD", composed)
    server = raw_server(
        "hangul",
        [
            {"name": composed, "description": "first", "inputSchema": SCHEMA},
            {"name": decomposed, "description": "second", "inputSchema": SCHEMA},
        ],
    )
    report = mcp_server_discover(server=server, actor="test", via="tests")
    assert report.added == [composed] and report.tool_count == 1
    assert len(report.rejected) == 1 and report.rejected[0].endswith("listed more than once (the first is kept)")
    assert [tool.description for tool in McpTool.objects.filter(server=server)] == ["first"]
