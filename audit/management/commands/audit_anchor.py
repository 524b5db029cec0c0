"""``manage.py audit_anchor``: write the audit chain's head, authenticated, outside the database."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from agent_platform.errors import ApplicationError
from audit.anchors import anchor_store, audit_chain_anchor


class Command(BaseCommand):
    help = gettext_noop(
        "Append the audit chain head (seq, hash, time, MAC under AUDIT_CHAIN_KEY) to the anchor store: the file "
        "AUDIT_ANCHOR_PATH, or objects under object lock in AUDIT_ANCHOR_S3_BUCKET. verify_audit then requires "
        "the chain to still hold every anchored event. Every worker also does this every AUDIT_ANCHOR_INTERVAL_S."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.description = _(self.help)  # marked above, translated now: argparse takes no lazy string

    def handle(self, *args: Any, **options: Any) -> None:
        store = anchor_store()
        try:
            anchor = audit_chain_anchor(store=store)
        except ApplicationError as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(
            _("anchored seq %(seq)s, head %(head)s, at %(at)s in %(store)s")
            % {"seq": anchor.seq, "head": anchor.hash, "at": anchor.at, "store": store.description}
        )
