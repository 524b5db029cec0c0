from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from agents.reconciler import runs_reconcile


class Command(BaseCommand):
    help = gettext_noop(
        "One pass of the run reconciler: fail runs past their time limit, queue again (or fail) runs whose worker "
        "was lost, dispatch again runs whose message was lost, expire due approvals. Prints what it changed."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.description = _(self.help)  # marked above, translated now: argparse takes no lazy string

    def handle(self, *args: Any, **options: Any) -> None:
        for name, count in runs_reconcile().as_dict().items():
            self.stdout.write(f"{name}: {count}")
