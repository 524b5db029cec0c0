from __future__ import annotations

import unicodedata
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop, ngettext

from agents.models import Agent, ApiKey
from agents.services import api_key_create, api_key_revoke

ACTOR, VIA = "system:create_api_key", "create_api_key"


class Command(BaseCommand):
    help = gettext_noop("Issue an API key. Prints the key alone on one line; it is shown only this once.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.description = _(self.help)  # marked above, translated now: argparse takes no lazy string
        parser.add_argument("name")
        # No default: left out, the key may use every agent; given, it must name one (see ``_agent_slugs``).
        parser.add_argument("--agents", help=_("comma-separated agent slugs the key may use (default: all)"))
        parser.add_argument("--admin", action="store_true", help=_("an admin key: may use /api/v1/evals/"))
        parser.add_argument(
            "--replace",
            action="store_true",
            help=_("revoke the keys of this name still valid, in the same transaction (./bin/up's quickstart key)"),
        )

    def handle(self, *args: Any, **options: Any) -> None:
        # As the admin's form takes a name: stripped (" 공백키 " was stored padded, and revoke_api_key, which strips
        # what it is given, never found it), and not blank. Control characters are refused too (the form refuses
        # NUL): no one can type them to find the key again, and they garble the admin's list.
        name = unicodedata.normalize("NFC", options["name"].strip())
        if not name:
            raise CommandError(_("give the key a name"))
        if any(unicodedata.category(c) == "Cc" for c in name):
            raise CommandError(_("a key's name may not contain control characters"))
        slugs = _agent_slugs(options["agents"])
        agents = list(Agent.objects.filter(slug__in=slugs))
        missing = set(slugs) - {a.slug for a in agents}
        if missing:
            raise CommandError(_("unknown agent(s): %(slugs)s") % {"slugs": ", ".join(sorted(missing))})
        try:
            with transaction.atomic():
                key, raw = api_key_create(name=name, agents=agents, admin=options["admin"], actor=ACTOR, via=VIA)
                replaced = _revoke_others(key) if options["replace"] else 0
        except ValidationError as exc:  # an empty name, one too long: the model's own words, not a traceback
            raise CommandError("; ".join(exc.messages)) from None
        if replaced:
            self.stderr.write(
                ngettext(
                    "revoked %(count)d earlier key named %(name)s",
                    "revoked %(count)d earlier keys named %(name)s",
                    replaced,
                )
                % {"count": replaced, "name": name}
            )
        self.stdout.write(raw)


def _revoke_others(key: ApiKey) -> int:
    """Revoke the keys named as ``key`` that are still valid, ``key`` aside (each audited as a revocation): a key
    issued at every start of ``./bin/up`` left every earlier one valid, printed in old terminals and logs."""
    earlier = ApiKey.objects.filter(name=key.name, revoked_at__isnull=True).exclude(pk=key.pk).order_by("pk")
    return sum(api_key_revoke(api_key=old, actor=ACTOR, via=VIA) for old in earlier)


def _agent_slugs(given: str | None) -> list[str]:
    """The slugs ``--agents`` names; [] (every agent) only where it is left out. Given but naming none (``""``,
    ``","``: a variable that was empty in a script), it is refused: the key would silently have been one for
    every agent, the widest there is."""
    if given is None:
        return []
    slugs = [s.strip() for s in given.split(",") if s.strip()]
    if not slugs:
        raise CommandError(_("--agents names no agent: leave it out for a key that may use every agent"))
    return slugs
