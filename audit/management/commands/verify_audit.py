"""``manage.py verify_audit``: check that the audit chain was not altered, and name the first event that was."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from agent_platform.command_args import whole_number
from audit.verification import audit_archive_verify, audit_chain_verify


class Command(BaseCommand):
    help = gettext_noop(
        "Walk the audit chain in seq order (streaming), recompute every hash and check its MAC (AUDIT_CHAIN_KEY), "
        "check every link and that no seq is missing, compare its end with the chain head, check every archive "
        "checkpoint against its archive file and every anchor written by audit_anchor. Exits non-zero naming the "
        "first altered, removed, inserted or forged event. With --archive, check archive files instead."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.description = _(self.help)  # marked above, translated now: argparse takes no lazy string
        parser.add_argument(
            "--archive",
            action="append",
            type=Path,
            metavar="PATH",
            help=_(
                "check an archive file written by archive_audit instead of the database (repeat to check that "
                "archives chain into each other: they are checked oldest first, in whatever order they are given)"
            ),
        )
        parser.add_argument(
            "--checkpoint-file",
            type=Path,
            metavar="PATH",
            help=_(
                "a signed head kept outside the database: the chain must still contain the seq and hash it "
                "holds; rewritten with the new head on success (created if missing). With --archive, the archive "
                "that holds its seq must hold its hash, and the file is left as it is"
            ),
        )
        parser.add_argument(
            "--archive-dir",
            type=Path,
            metavar="DIR",
            help=_("where the archive files are kept now, if not where archive_audit wrote them (found by file name)"),
        )
        parser.add_argument(
            "--progress-every",
            type=whole_number(1),
            default=100_000,
            metavar="N",
            help=_("print progress every N events (default 100000)"),
        )
        parser.add_argument(
            "--chunk-size", type=whole_number(1), default=2000, metavar="N", help=_("rows fetched at a time")
        )
        parser.add_argument(
            "--workers",
            type=whole_number(0),
            default=None,
            metavar="N",
            help=_(
                "processes that verify the chain in parallel, a segment each (default: one per core, up to 8, for "
                "a chain of 20,000 events or more; 0: none)"
            ),
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["archive"]:
            report, summaries = audit_archive_verify(options["archive"], checkpoint_file=options["checkpoint_file"])
            for line in [*report.notes, *summaries]:
                self.stdout.write(line)
            if report.problem:
                raise CommandError(report.problem)
            self.stdout.write(
                _("verified %(count)s archived events, head %(head)s")
                % {"count": report.count, "head": report.head_hash}
            )
            return
        report = audit_chain_verify(
            checkpoint_file=options["checkpoint_file"],
            archive_dir=options["archive_dir"],
            progress=lambda count: self.stderr.write("  " + _("%(count)s events verified…") % {"count": f"{count:,}"}),
            progress_every=options["progress_every"],
            chunk_size=options["chunk_size"],
            workers=options["workers"],
            progress_note=lambda text: self.stderr.write("  " + text),
        )
        for note in report.notes:
            self.stdout.write(note)
        if report.problem:
            raise CommandError(report.problem)
        self.stdout.write(
            _("verified %(count)s events, head %(head)s") % {"count": report.count, "head": report.head_hash}
        )
