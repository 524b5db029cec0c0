from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from mcpregistry.services import mcp_server_secrets_rotate


class Command(BaseCommand):
    help = gettext_noop(
        "Re-encrypt every stored binding secret with the first key of SECRETS_ENCRYPTION_KEYS (audited)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.description = _(self.help)  # marked above, translated now: argparse takes no lazy string

    def handle(self, *args: Any, **options: Any) -> None:
        rotated = mcp_server_secrets_rotate(actor="system:rotate_secrets", via="rotate_secrets")
        self.stdout.write(
            self.style.SUCCESS(
                _("re-encrypted the secrets of %(count)s binding(s) with the newest key") % {"count": rotated}
            )
        )
