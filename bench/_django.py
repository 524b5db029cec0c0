"""Django for a benchmark: the project's settings on a throwaway SQLite database (or DATABASE_URL if set)."""

from __future__ import annotations

import os
import tempfile
from typing import Any


def setup_django(*, keep_database_url: bool = False) -> str:
    """Point the settings at a fresh temporary folder, migrate, and return the folder."""
    workdir = tempfile.mkdtemp(prefix="bench-")
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
