from __future__ import annotations

from typing import Any

from django.apps import apps
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from mcpregistry.services import secrets_rotate


class Command(BaseCommand):
    help = gettext_noop(
        "Re-encrypt every stored secret (binding secrets, agents' model secrets, approvals' exact arguments) with "
        "the first key of SECRETS_ENCRYPTION_KEYS (audited); the older keys can be retired afterwards."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.description = _(self.help)  # marked above, translated now: argparse takes no lazy string

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            report = secrets_rotate(actor="system:rotate_secrets", via="rotate_secrets")
        except ImproperlyConfigured as exc:  # a key that is not a Fernet key: its line, not a traceback
            raise CommandError(str(exc)) from None
        total = sum(report.rotated.values())
        if not total:  # a second run: the newest key encrypts every row it can read already
            self.stdout.write(
                self.style.SUCCESS(
                    _("nothing to re-encrypt: every stored secret this process can read has the newest key already")
                )
            )
        else:
            for label, count in report.rotated.items():
                self.stdout.write(
                    _("%(model)s (%(label)s): %(count)s row(s) re-encrypted")
                    % {"model": apps.get_model(label)._meta.verbose_name_plural, "label": label, "count": count}
                )
            self.stdout.write(
                self.style.SUCCESS(_("re-encrypted %(count)s row(s) with the newest key") % {"count": total})
            )
        if report.unreadable:
            # The rest is committed; these rows keep their old ciphertext, and the key they need must not be retired.
            rows = "; ".join(
                f"{label}: {', '.join(ids[:10])}{' …' if len(ids) > 10 else ''}"
                for label, ids in report.unreadable.items()
            )
            raise CommandError(
                _(
                    "rows that no key of SECRETS_ENCRYPTION_KEYS decrypts were left as they are (add the key they "
                    "were encrypted with and run this again before retiring any key): %(rows)s"
                )
                % {"rows": rows}
            )
