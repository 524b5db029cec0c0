from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from agent_platform.errors import ApplicationError
from agent_platform.os_errors import os_error_text
from agents.configuration import config_import, load_document


class Command(BaseCommand):
    help = gettext_noop(
        "Import servers, contracts, agents and rules from a JSON or YAML file (idempotent, all-or-nothing)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.description = _(self.help)  # marked above, translated now: argparse takes no lazy string
        parser.add_argument("path")
        parser.add_argument("--dry-run", action="store_true", help=_("validate and report, change nothing"))

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            report = config_import(
                document=load_document(options["path"]), actor="system:import_config", dry_run=options["dry_run"]
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
