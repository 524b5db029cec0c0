"""Django for a benchmark: the project's settings on a throwaway SQLite database (or DATABASE_URL if set)."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from typing import Any


class NotThrowaway(SystemExit):
    """The database a benchmark was pointed at holds data: it is not a throwaway one."""


def refuse_unless_empty() -> None:
    """Stop (before anything is written) unless the configured database holds no audit event and no run.

    A benchmark that keeps ``DATABASE_URL`` writes tens of thousands of events into the audit chain and deletes
    its placeholder rows past the append-only triggers: pointed by mistake at a real platform's database (a shell
    where ``DATABASE_URL`` is set for the platform), it would add fake events to that record."""
    from django.db import connection

    tables = set(connection.introspection.table_names())
    held = []
    with connection.cursor() as cursor:
        for table, what in (("audit_auditevent", "audit events"), ("agents_run", "runs")):
            if table in tables:
                cursor.execute(f"SELECT COUNT(*) FROM {connection.ops.quote_name(table)}")  # two fixed table names
                count = int(cursor.fetchone()[0])
                if count:
                    held.append(f"{count} {what}")
    if held:
        raise NotThrowaway(
            f"refusing to run: the database at DATABASE_URL holds {', '.join(held)}. This benchmark writes to the "
            "audit chain: give it an empty, throwaway database (or unset DATABASE_URL for a private one)."
        )


def setup_django(*, keep_database_url: bool = False) -> str:
    """Point the settings at a fresh temporary folder, migrate, and return the folder. With
    ``keep_database_url``, the database ``DATABASE_URL`` names is used only if it holds no audit event and no run
    (``refuse_unless_empty``). The folder is removed when the process exits."""
    workdir = tempfile.mkdtemp(prefix="bench-")
    atexit.register(shutil.rmtree, workdir, ignore_errors=True)
    os.environ["PLATFORM_VAR_DIR"] = workdir
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agent_platform.settings")
    # Benchmarks stand in for a model with the scripted provider (a fixed latency per turn).
    os.environ["PLATFORM_ALLOW_SCRIPTED_MODEL"] = "1"
    if not keep_database_url:
        os.environ.pop("DATABASE_URL", None)
    os.environ["SQLITE_PATH"] = os.path.join(workdir, "bench.sqlite3")
    import django
    from django.core.management import call_command

    django.setup()
    if keep_database_url and os.environ.get("DATABASE_URL"):
        refuse_unless_empty()
    call_command("migrate", "--noinput", verbosity=0)
    return workdir


def bind_bench_demo_server() -> Any:
    """The demo MCP server bound as ``bench`` (one shared session), discovered, with the demo's contracts; its
    tools and contracts prefetched."""
    import sys

    from django.conf import settings

    from agents.management.commands.seed_demo import apply_demo_contracts
    from mcpregistry.models import McpServer
    from mcpregistry.services import mcp_server_create, mcp_server_discover

    server = mcp_server_create(
        actor="system:bench",
        via="bench",
        data={
            "mcp_id": "bench",
            "name": "bench",
            "command": sys.executable,
            "args": ["-m", settings.PLATFORM_DEMO_SERVER_MODULE],
            "cwd": str(settings.BASE_DIR),
            "env": {"FAILURE_MODE": "none"},
            "session_scope": "shared",
        },
    )
    assert mcp_server_discover(server=server, actor="system:bench", via="bench").ok
    apply_demo_contracts(server)
    return McpServer.objects.prefetch_related("tools__contract").get(pk=server.pk)
