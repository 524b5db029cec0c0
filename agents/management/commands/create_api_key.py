from __future__ import annotations

import unicodedata
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import models, transaction
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop, ngettext

from agents.budgets import budget_key_rotate
from agents.models import Agent, ApiKey, Budget
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
                earlier = _live_keys(name) if options["replace"] else []
                given = {"agents": options["agents"] is not None, "admin": options["admin"]}
                carried = _carried(name, earlier, given=[part for part, on in given.items() if on])
                if "agents" in carried:
                    agents = list(Agent.objects.filter(slug__in=carried["agents"]))
                key, raw = api_key_create(
                    name=name,
                    agents=agents,
                    rate=carried.get("rate", ""),
                    admin=carried.get("admin", options["admin"]),
                    actor=ACTOR,
                    via=VIA,
                )
                if carried.get("budgets"):
                    # Moved, not copied: their counters hold the period's spend (copied, they started empty).
                    for budget in Budget.objects.filter(api_key=earlier[0]).order_by("pk"):
                        budget_key_rotate(budget=budget, api_key=key, actor=ACTOR, via=VIA)
                replaced = sum(api_key_revoke(api_key=old, actor=ACTOR, via=VIA) for old in earlier)
        except ValidationError as exc:  # an empty name, one too long: the model's own words, not a traceback
            raise CommandError("; ".join(exc.messages)) from None
        # Told where it gives the new key something a plain key lacks (bin/up replaces a plain key at every start).
        if any(carried.values()):
            words = "; ".join(f"{_part_label(part)}: {_part_words(part, value)}" for part, value in carried.items())
            self.stderr.write(_("carried over from the replaced key: %(scope)s") % {"scope": words})
        if options["replace"] and not earlier and ApiKey.objects.filter(name=name).exclude(pk=key.pk).exists():
            # Said, as a replace that found its key would be: one whose keys of that name were all revoked got a key
            # for every agent at the default rate, with nothing said (a first key of the name, as ./bin/up's first
            # start mints, replaces nothing and is not told so).
            self.stderr.write(
                _("no key in use is named %(name)s: nothing was replaced, and nothing carried over") % {"name": name}
                + (
                    _(" (the new key may use every agent, at the default rate)")
                    if options["agents"] is None and not options["admin"]
                    else ""
                )
            )
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


# What ``--replace`` gives the new key from the keys it replaces, unless the command line gives it: a key replaced to
# rotate it keeps its scope (issued with the command line's flags alone, it could use every agent, at the default
# rate and with no budget, while its budgets stayed on the revoked key).
CARRIED_PARTS = ("agents", "rate", "admin", "budgets")
BUDGET_FIGURES = ("period", "max_tokens", "max_cost", "run_reservation_tokens", "enabled")


def _live_keys(name: str) -> list[ApiKey]:
    """The keys named ``name`` still valid, locked until the replace commits (a key edited meanwhile would be
    replaced with its old scope)."""
    return list(ApiKey.objects.select_for_update().filter(name=name, revoked_at__isnull=True).order_by("pk"))


def _scope(key: ApiKey) -> dict[str, Any]:
    """What of ``key`` a replace carries over, comparable between keys."""
    budgets = Budget.objects.filter(api_key=key).order_by("pk").values_list(*BUDGET_FIGURES)
    return {
        "agents": tuple(sorted(key.agents.values_list("slug", flat=True))),
        "rate": key.rate,
        "admin": key.admin,
        "budgets": tuple(sorted(tuple(zip(BUDGET_FIGURES, figures, strict=True)) for figures in budgets)),
    }


def _carried(name: str, earlier: list[ApiKey], *, given: list[str]) -> dict[str, Any]:
    """What the new key takes from the keys it replaces (``earlier``), the parts ``given`` on the command line
    aside. Refused (CommandError naming each difference) where those keys differ in a part it would take: which
    one to keep is the operator's choice."""
    scopes = [_scope(key) for key in earlier]
    parts = [part for part in CARRIED_PARTS if part not in given]
    differences = [part for part in parts if len({scope[part] for scope in scopes}) > 1]
    if differences:
        raise CommandError(
            _(
                "the valid keys named %(name)s differ in what --replace would give the new key: %(differences)s. "
                "Give it on the command line (--agents, --admin), or revoke or edit the keys first"
            )
            % {
                "name": name,
                "differences": "; ".join(
                    f"{_part_label(part)}: {' | '.join(_part_words(part, scope[part]) for scope in scopes)}"
                    for part in differences
                ),
            }
        )
    return {part: scopes[0][part] for part in parts} if scopes else {}


def _part_label(part: str) -> str:
    return str(Budget._meta.verbose_name_plural) if part == "budgets" else _field_label(ApiKey, part)


def _field_label(model: type[models.Model], name: str) -> str:
    """The field's label in the reader's language (its verbose name)."""
    field = model._meta.get_field(name)
    return str(field.verbose_name) if isinstance(field, models.Field) else name


def _part_words(part: str, value: Any) -> str:
    if part == "agents":
        return ", ".join(value) or _("every agent")
    if part == "admin":
        return _("yes") if value else _("no")
    if part == "budgets":
        return "; ".join(_budget_words(dict(figures)) for figures in value) or "—"
    return str(value) or "—"


def _budget_words(figures: dict[str, Any]) -> str:
    limits = [
        f"{_field_label(Budget, field)} {figures[field]}"
        for field in ("max_tokens", "max_cost", "run_reservation_tokens")
        if figures[field] is not None
    ]
    if not figures["enabled"]:
        limits.append(f"{_field_label(Budget, 'enabled')}: {_('no')}")
    return f"{Budget.Period(figures['period']).label} ({', '.join(limits)})"


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
