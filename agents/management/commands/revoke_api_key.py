from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.models import Q

from agents.models import ApiKey
from agents.services import api_key_digest, api_key_revoke


class Command(BaseCommand):
    help = (
        "Revoke an API key, named by its prefix (apk_…, as the admin lists it), the whole key, or its name. "
        "Its next request is a 401. Revoking a revoked key changes nothing."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("key", metavar="PREFIX_OR_NAME")
        parser.add_argument(
            "--all", action="store_true", help="revoke every live key with this name (a name may be shared)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        given = options["key"].strip()
        if not given:
            raise CommandError("give a key prefix, a key or a key name")
        keys = list(
            ApiKey.objects.filter(Q(prefix=given) | Q(digest=api_key_digest(given)) | Q(name=given)).order_by(
                "created_at"
            )
        )
        if not keys:
            raise CommandError(f"no API key with the prefix or name {given!r}")
        live = [k for k in keys if k.revoked_at is None]
        if len(live) > 1 and not options["all"]:
            listed = ", ".join(f"{k.prefix} ({k.name})" for k in live)
            raise CommandError(f"{len(live)} live keys match {given!r}: {listed}. Give a prefix, or --all.")
        if not live:
            for key in keys:
                self.stdout.write(
                    f"{key.prefix} ({key.name}) was already revoked at {key.revoked_at:%Y-%m-%d %H:%M:%S %Z}"
                )
            return
        for key in live:
            api_key_revoke(api_key=key, actor="system:revoke_api_key", via="revoke_api_key")
            self.stdout.write(f"revoked {key.prefix} ({key.name})")
