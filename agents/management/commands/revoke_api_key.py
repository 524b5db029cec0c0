from __future__ import annotations

import unicodedata
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.models import Q
from django.db.models.functions import Trim
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from agents.models import ApiKey
from agents.services import api_key_digest, api_key_revoke


class Command(BaseCommand):
    help = gettext_noop(
        "Revoke an API key, named by its prefix (apk_…, as the admin lists it), the whole key, or its name. "
        "Its next request is a 401. Revoking a revoked key changes nothing."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.description = _(self.help)  # marked above, translated now: argparse takes no lazy string
        parser.add_argument("key", metavar="PREFIX_OR_NAME")
        parser.add_argument(
            "--all", action="store_true", help=_("revoke every live key with this name (a name may be shared)")
        )

    def handle(self, *args: Any, **options: Any) -> None:
        given = options["key"].strip()
        if not given:
            raise CommandError(_("give a key prefix, a key or a key name"))
        # A name as given, or with the spaces around it: create_api_key stored " 공백키 " so until it stripped names,
        # and the admin's list shows it as 공백키.
        # Composed or not: names are stored composed (NFC) now, and were stored as typed before.
        spellings = {given, *(unicodedata.normalize(form, given) for form in ("NFC", "NFD"))}
        named = Q(name=options["key"]) | Q(trimmed_name__in=spellings)
        # A prefix or a whole key names one key: it is taken before names, which anyone may set to look like a
        # prefix (a key named after another's prefix left that prefix unable to revoke its key).
        keys = list(ApiKey.objects.filter(Q(prefix=given) | Q(digest=api_key_digest(given))).order_by("created_at"))
        if not keys:
            keys = list(ApiKey.objects.annotate(trimmed_name=Trim("name")).filter(named).order_by("created_at"))
        if not keys:
            raise CommandError(_("no API key with the prefix or name %(given)s") % {"given": repr(given)})
        live = [k for k in keys if k.revoked_at is None]
        if len(live) > 1 and not options["all"]:
            listed = ", ".join(f"{k.prefix} ({k.name})" for k in live)
            raise CommandError(
                _("%(count)s live keys match %(given)s: %(keys)s. Give a prefix, or --all.")
                % {"count": len(live), "given": repr(given), "keys": listed}
            )
        if not live:
            for key in keys:
                revoked_at = timezone.localtime(key.revoked_at)  # as the admin shows it (it was UTC)
                self.stdout.write(
                    _("%(key)s (%(name)s) was already revoked at %(at)s")
                    % {"key": key.prefix, "name": key.name, "at": f"{revoked_at:%Y-%m-%d %H:%M:%S %Z}"}
                )
            return
        for key in live:
            api_key_revoke(api_key=key, actor="system:revoke_api_key", via="revoke_api_key")
            self.stdout.write(_("revoked %(key)s (%(name)s)") % {"key": key.prefix, "name": key.name})
