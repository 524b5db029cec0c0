from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from agent_platform.errors import ApplicationError
from agents.configuration import config_import, load_document


class Command(BaseCommand):
    help = "Import servers, contracts, agents and rules from a JSON or YAML file (idempotent, all-or-nothing)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("path")
        parser.add_argument("--dry-run", action="store_true", help="validate and report, change nothing")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            report = config_import(
                document=load_document(options["path"]), actor="system:import_config", dry_run=options["dry_run"]
            )
        except ApplicationError as exc:
            raise CommandError(exc.message) from exc
        except OSError as exc:
            raise CommandError(f"cannot read {options['path']}: {exc.strerror}") from exc
        prefix = "would be " if options["dry_run"] else ""
        for label, items in (
            ("created", report.created),
            ("updated", report.updated),
            ("unchanged", report.unchanged),
            ("deleted", report.deleted),
        ):
            for item in items:
                self.stdout.write(f"{prefix}{label}: {item}")
        self.stdout.write(
            self.style.SUCCESS(
                f"{prefix}created {len(report.created)}, updated {len(report.updated)}, unchanged {len(report.unchanged)}"
                + (f", deleted {len(report.deleted)}" if report.deleted else "")
            )
        )
