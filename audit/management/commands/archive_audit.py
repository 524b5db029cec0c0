"""``manage.py archive_audit --older-than-days N``: move old audit events into a verifiable gzip JSONL file."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from agent_platform.command_args import whole_number
from agent_platform.errors import ApplicationError
from audit.archive import audit_events_archive


class Command(BaseCommand):
    help = gettext_noop(
        "Write the audit events older than N days to a gzip-compressed JSONL file ending with a checkpoint line, "
        "record the checkpoint, and delete those events. The rest of the chain still verifies from the checkpoint; "
        "check the file with verify_audit --archive PATH."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.description = _(self.help)  # marked above, translated now: argparse takes no lazy string
        parser.add_argument("--older-than-days", type=_days, required=True, metavar="N")
        parser.add_argument(
            "--output",
            type=str,  # as typed: a trailing separator names a folder (a Path drops it)
            metavar="PATH",
            help=_(
                "the archive file (default var/audit-archive/audit-<first seq>-<last seq>.jsonl.gz); never overwritten"
            ),
        )
        parser.add_argument(
            "--progress-every",
            type=whole_number(1),
            default=100_000,
            metavar="N",
            help=_("print progress every N events (default 100000)"),
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            report = audit_events_archive(
                older_than_days=options["older_than_days"],
                output=options["output"],
                progress=lambda message: self.stderr.write("  " + message),
                progress_every=options["progress_every"],
            )
        except ApplicationError as exc:
            raise CommandError(exc.message) from exc
        if report.count == 0:
            self.stdout.write(
                _("nothing to archive: no event older than %(days)s days") % {"days": options["older_than_days"]}
            )
            return
        self.stdout.write(
            _("archived %(count)s events (seq %(first)s to %(last)s) to %(path)s, checkpoint %(hash)s")
            % {
                "count": report.count,
                "first": report.first_seq,
                "last": report.last_seq,
                "path": report.path,
                "hash": report.hash,
            }
        )


def _days(text: str) -> int:
    """A day count for ``--older-than-days``: a whole number from 0 to 36,500 (a hundred years)."""
    try:
        days = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(_("a whole number of days, e.g. 365")) from None
    if not 0 <= days <= 36_500:
        raise argparse.ArgumentTypeError(_("from 0 to 36500 days"))
    return days
