from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from mcpregistry.models import McpServer
from mcpregistry.pool import shutdown_default_pool
from mcpregistry.services import mcp_server_discover


class Command(BaseCommand):
    help = "Connect to MCP servers, list their tools, update the registry and report health."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("mcp_ids", nargs="*", help="servers to discover (default: every enabled server)")

    def handle(self, *args: Any, **options: Any) -> None:
        servers = McpServer.objects.all()
        if options["mcp_ids"]:
            servers = servers.filter(mcp_id__in=options["mcp_ids"])
            missing = set(options["mcp_ids"]) - {s.mcp_id for s in servers}
            if missing:
                raise CommandError(f"unknown MCP server(s): {', '.join(sorted(missing))}")
        else:
            servers = servers.filter(enabled=True)
        failed = 0
        try:
            for server in servers:
                self.stdout.write(f"{server.mcp_id}: connecting…")
                report = mcp_server_discover(server=server, actor="system:mcp_discover", via="mcp_discover")
                if report.ok:
                    self.stdout.write(
                        self.style.SUCCESS(
                            f"{server.mcp_id}: ok, {report.tool_count} tools "
                            f"(added {len(report.added)}, updated {len(report.updated)}, vanished {len(report.vanished)})"
                        )
                    )
                else:
                    failed += 1
                    self.stdout.write(self.style.ERROR(f"{server.mcp_id}: {report.error}"))
        finally:
            shutdown_default_pool()
        if failed:
            raise CommandError(f"{failed} server(s) failed discovery")
