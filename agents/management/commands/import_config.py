from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from agent_platform.command_args import whole_number
from agent_platform.errors import ApplicationError
from agent_platform.os_errors import os_error_text
from agents.configuration import config_import, load_document


class Command(BaseCommand):
    help = gettext_noop(
        "Import servers, contracts, agents and rules from a JSON or YAML file (idempotent, all-or-nothing)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.description = _(self.help)  # marked above, translated now: argparse takes no lazy string
        parser.add_argument("path", help=_("the file to read; - reads the standard input"))
        parser.add_argument("--dry-run", action="store_true", help=_("validate and report, change nothing"))
        parser.add_argument(
            "--format",
            choices=["json", "yaml"],
            default=None,
            help=_(
                "how the file is written (default: YAML for a name ending in .yaml or .yml, JSON for .json; another "
                "name is read as JSON, and as YAML where it does not begin as JSON does)"
            ),
        )
        parser.add_argument(
            "--progress-every",
            type=whole_number(1),
            default=500,
            metavar="N",
            help=_("print progress every N entries of a section (default 500)"),
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            report = config_import(
                document=load_document(options["path"], kind=options["format"]),
                actor="system:import_config",
                dry_run=options["dry_run"],
                progress=lambda message: self.stderr.write("  " + message),
                progress_every=options["progress_every"],
            )
        except ApplicationError as exc:
            raise CommandError(exc.message) from exc
        except OSError as exc:
            raise CommandError(
                _("cannot read %(path)s: %(reason)s") % {"path": options["path"], "reason": os_error_text(exc)}
            ) from exc
        dry_run = options["dry_run"]
        for label, items in (
            (_("would be created: %(item)s") if dry_run else _("created: %(item)s"), report.created),
            (_("would be updated: %(item)s") if dry_run else _("updated: %(item)s"), report.updated),
            (_("would be unchanged: %(item)s") if dry_run else _("unchanged: %(item)s"), report.unchanged),
            (_("would be deleted: %(item)s") if dry_run else _("deleted: %(item)s"), report.deleted),
        ):
            for item in items:
                self.stdout.write(label % {"item": item})
        for warning in report.warnings:
            self.stdout.write(self.style.WARNING(_("warning: %(item)s") % {"item": warning}))
        counts = {
            "created": len(report.created),
            "updated": len(report.updated),
            "unchanged": len(report.unchanged),
            "deleted": len(report.deleted),
        }
        if dry_run and report.deleted:
            summary = _(
                "would be created %(created)s, updated %(updated)s, unchanged %(unchanged)s, deleted %(deleted)s"
            )
        elif dry_run:
            summary = _("would be created %(created)s, updated %(updated)s, unchanged %(unchanged)s")
        elif report.deleted:
            summary = _("created %(created)s, updated %(updated)s, unchanged %(unchanged)s, deleted %(deleted)s")
        else:
            summary = _("created %(created)s, updated %(updated)s, unchanged %(unchanged)s")
        self.stdout.write(self.style.SUCCESS(summary % counts))
