from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from agents.approvals import approvals_expire_due


class Command(BaseCommand):
    help = gettext_noop(
        "Expire pending approvals past their time; their runs resume and the model is told the call was not made."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.description = _(self.help)  # marked above, translated now: argparse takes no lazy string

    def handle(self, *args: Any, **options: Any) -> None:
        self.stdout.write(_("expired %(count)s approval(s)") % {"count": approvals_expire_due()})
