from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from mcpregistry.models import McpServer
from mcpregistry.pool import shutdown_default_pool
from mcpregistry.services import mcp_server_discover


class Command(BaseCommand):
    help = gettext_noop("Connect to MCP servers, list their tools, update the registry and report health.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.description = _(self.help)  # marked above, translated now: argparse takes no lazy string
        parser.add_argument("mcp_ids", nargs="*", help=_("servers to discover (default: every enabled server)"))

    def handle(self, *args: Any, **options: Any) -> None:
        servers = McpServer.objects.all()
        if options["mcp_ids"]:
            servers = servers.filter(mcp_id__in=options["mcp_ids"])
            missing = set(options["mcp_ids"]) - {s.mcp_id for s in servers}
            if missing:
                raise CommandError(_("unknown MCP server(s): %(servers)s") % {"servers": ", ".join(sorted(missing))})
        else:
            servers = servers.filter(enabled=True)
        failed = 0
        try:
            for server in servers:
                self.stdout.write(_("%(server)s: connecting…") % {"server": server.mcp_id})
                report = mcp_server_discover(server=server, actor="system:mcp_discover", via="mcp_discover")
                if report.ok:
                    self.stdout.write(
                        self.style.SUCCESS(
                            _(
                                "%(server)s: ok, %(count)s tools (added %(added)s, updated %(updated)s, "
                                "vanished %(vanished)s)"
                            )
                            % {
                                "server": server.mcp_id,
                                "count": report.tool_count,
                                "added": len(report.added),
                                "updated": len(report.updated),
                                "vanished": len(report.vanished),
                            }
                        )
                    )
                else:
                    failed += 1
                    self.stdout.write(self.style.ERROR(f"{server.mcp_id}: {report.error}"))
        finally:
            shutdown_default_pool()
        if failed:
            raise CommandError(_("%(count)s server(s) failed discovery") % {"count": failed})
