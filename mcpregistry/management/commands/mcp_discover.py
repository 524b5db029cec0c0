from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from mcpregistry.models import McpServer
from mcpregistry.pool import shutdown_default_pool
from mcpregistry.services import DiscoveryReport, mcp_server_discover


class Command(BaseCommand):
    help = gettext_noop("Connect to MCP servers, list their tools, update the registry and report health.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.description = _(self.help)  # marked above, translated now: argparse takes no lazy string
        parser.epilog = _(
            "Exit status: 0 when every server was discovered and its health is ok (a tool held for review is a "
            "warning); 1 when a server is unknown, could not be discovered, or its health after discovery is "
            "error (a listed tool whose name or input schema is unusable). Every server is discovered first."
        )
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
        failed: list[str] = []
        try:
            for server in servers:
                self.stdout.write(_("%(server)s: connecting…") % {"server": server.mcp_id})
                report = mcp_server_discover(server=server, actor="system:mcp_discover", via="mcp_discover")
                if not report.ok:
                    failed.append(server.mcp_id)
                    self.stdout.write(self.style.ERROR(f"{server.mcp_id}: {report.error}"))
                    continue
                server.refresh_from_db()
                if server.health == McpServer.Health.ERROR:
                    failed.append(server.mcp_id)
                self._write_report(server, report)
        finally:
            shutdown_default_pool()
        if failed:
            raise CommandError(
                _("discovery failed, or left the health at error, for %(count)s server(s): %(servers)s")
                % {"count": len(failed), "servers": ", ".join(failed)}
            )

    def _write_report(self, server: McpServer, report: DiscoveryReport) -> None:
        """What a discovery that listed the server's tools found, as the admin's Discover action shows it: the
        counts, the tools held for review (disabled until approved: a warning), the tools never offered to a model
        (a name that cannot be one, an unusable input schema: the server's health is error) and what else it
        lists. The health is the one recorded, read back after discovery."""
        counts = {
            "server": server.mcp_id,
            "count": report.tool_count,
            "added": len(report.added),
            "updated": len(report.updated),
            "vanished": len(report.vanished),
        }
        if server.health == McpServer.Health.ERROR:
            self.stdout.write(
                self.style.ERROR(
                    _(
                        "%(server)s: health error, %(count)s tools (added %(added)s, updated %(updated)s, "
                        "vanished %(vanished)s)"
                    )
                    % counts
                )
            )
        else:
            style = self.style.WARNING if report.review_required else self.style.SUCCESS
            self.stdout.write(
                style(
                    _("%(server)s: ok, %(count)s tools (added %(added)s, updated %(updated)s, vanished %(vanished)s)")
                    % counts
                )
            )
        if report.review_required:
            self.stdout.write(
                self.style.WARNING(
                    _("%(server)s: review required (not offered to a model until approved in the admin): %(tools)s")
                    % {"server": server.mcp_id, "tools": ", ".join(report.review_required)}
                )
            )
        if report.name_taken:
            self.stdout.write(
                self.style.WARNING(
                    _(
                        "%(server)s: left off (another server bound to the same agent offers the name; give one a "
                        "tool name prefix, then enable them): %(tools)s"
                    )
                    % {"server": server.mcp_id, "tools": ", ".join(report.name_taken)}
                )
            )
        for warning in report.warnings():
            self.stdout.write(self.style.WARNING(f"{server.mcp_id}: {warning}"))
        problems = report.health_problems()  # the health's error, as discovery recorded it
        if not problems and server.health == McpServer.Health.ERROR and server.last_error:
            problems.append(server.last_error)  # recorded by a check that ran beside this discovery
        for problem in problems:
            self.stdout.write(self.style.ERROR(f"{server.mcp_id}: {problem}"))
        self.stdout.write(
            f"{server.mcp_id}: {_('resources')}: {len(server.resources)}; {_('prompts')}: {len(server.prompts)}"
        )
