"""Two discoveries of one server at once (two admins pressing "discover", a command beside the page): each tool
is created once, with one audit event, and neither discovery fails. On SQLite the writer lock (transactions begin
IMMEDIATE) serialises them; on PostgreSQL, where transactions really overlap, the server's row lock does. Both
discoveries have listed the server's tools before either applies its listing (a barrier), so both start from a
registry without the tools."""

from __future__ import annotations

import json

import pytest

from tests.postgres import manage, postgres_url  # noqa: F401 - postgres_url is a fixture

DISCOVER_TWICE_AT_ONCE = r"""
import json, sys, threading, uuid
from django.conf import settings
from django.db import connection
import mcpregistry.services as services
from audit.models import AuditEvent
from mcpregistry.models import McpServer, McpTool

server = services.mcp_server_create(actor="test", via="tests", data={
    "mcp_id": f"race-{uuid.uuid4().hex[:8]}",
    "name": "race",
    "transport": McpServer.Transport.STDIO,
    "command": sys.executable,
    "args": ["-m", settings.PLATFORM_DEMO_SERVER_MODULE],
    "cwd": str(settings.BASE_DIR),
    "env": {"INTERNAL_API_KEY": "race-secret-0123456789"},
    "timeout_s": 10,
})
both_listed = threading.Barrier(2)
apply = services._discovery_apply

def apply_once_both_listed(*args, **kwargs):
    both_listed.wait(timeout=60)
    return apply(*args, **kwargs)

services._discovery_apply = apply_once_both_listed
reports = []

def one(who):
    try:
        reports.append(services.mcp_server_discover(server=McpServer.objects.get(pk=server.pk), actor=who, via="tests"))
    finally:
        connection.close()

threads = [threading.Thread(target=one, args=(f"admin-{n}",)) for n in range(2)]
for t in threads: t.start()
for t in threads: t.join(timeout=120)
from audit.services import audit_chain_pending
audit_chain_pending(wait=True)  # PostgreSQL chains after commit: the events join the record first
names = list(McpTool.objects.filter(server=server).values_list("name", flat=True))
created = list(AuditEvent.objects.filter(action="config.mcp_tool.create", mcp_id=server.mcp_id).values_list("tool", flat=True))
print(json.dumps({
    "ok": [r.ok for r in reports],
    "errors": [r.error for r in reports if r.error],
    "added": sorted(len(r.added) for r in reports),
    "tools": len(names),
    "distinct_tools": len(set(names)),
    "created_events": len(created),
    "distinct_created": len(set(created)),
    "enabled": McpTool.objects.filter(server=server, enabled=True).count(),
}))
"""

MIGRATE_FIRST = """
from django.core.management import call_command
call_command("migrate", "--no-input", verbosity=0)
"""


def _checked(result: dict) -> None:
    tools = result["tools"]
    assert tools >= 5, result  # the demo server's tools
    # Both discoveries answered; the second found the first's tools and added none.
    assert result["ok"] == [True, True] and result["errors"] == [], result
    assert result["added"] == [0, tools], result
    assert result["distinct_tools"] == tools, result
    # Each tool created once, with one audit event; the first discovery enabled them, the second changed nothing.
    assert result["created_events"] == result["distinct_created"] == tools, result
    assert result["enabled"] == tools, result


@pytest.mark.slow
def test_two_discoveries_at_once_create_each_tool_once_on_sqlite(tmp_path) -> None:
    sqlite_path = str(tmp_path / "race.sqlite3")
    # The fresh file is migrated by the same process, first (a process of its own was a second start of Django).
    done = manage("shell", "-c", MIGRATE_FIRST + DISCOVER_TWICE_AT_ONCE, sqlite_path=sqlite_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    _checked(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.postgres
def test_two_discoveries_at_once_create_each_tool_once_on_postgres(postgres_url: str) -> None:  # noqa: F811
    done = manage("shell", "-c", DISCOVER_TWICE_AT_ONCE, database_url=postgres_url, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    _checked(json.loads(done.stdout.strip().splitlines()[-1]))
