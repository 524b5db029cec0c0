from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand
from django.db import connection, transaction

from mcpregistry.crypto import PREFIX, rotate_token
from mcpregistry.models import McpServer


class Command(BaseCommand):
    help = "Re-encrypt every stored binding secret with the first key of SECRETS_ENCRYPTION_KEYS."

    def handle(self, *args: Any, **options: Any) -> None:
        table = McpServer._meta.db_table
        quote = connection.ops.quote_name
        rotated = 0
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(f"SELECT id, env, headers FROM {quote(table)}")  # noqa: S608 - table name from the model
            for pk, env, headers in cursor.fetchall():
                new_env = rotate_token(env) if env and env.startswith(PREFIX) else env
                new_headers = rotate_token(headers) if headers and headers.startswith(PREFIX) else headers
                cursor.execute(
                    f"UPDATE {quote(table)} SET env = %s, headers = %s WHERE id = %s",  # noqa: S608
                    [new_env, new_headers, pk],
                )
                rotated += 1
        self.stdout.write(self.style.SUCCESS(f"re-encrypted the secrets of {rotated} binding(s) with the newest key"))
