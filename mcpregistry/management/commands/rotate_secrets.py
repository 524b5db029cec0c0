from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from mcpregistry.services import mcp_server_secrets_rotate


class Command(BaseCommand):
    help = "Re-encrypt every stored binding secret with the first key of SECRETS_ENCRYPTION_KEYS (audited)."

    def handle(self, *args: Any, **options: Any) -> None:
        rotated = mcp_server_secrets_rotate(actor="system:rotate_secrets", via="rotate_secrets")
        self.stdout.write(self.style.SUCCESS(f"re-encrypted the secrets of {rotated} binding(s) with the newest key"))
