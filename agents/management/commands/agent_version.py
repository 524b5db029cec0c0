"""``manage.py agent_version``: list, publish, roll back and compare an agent's versions; name its shadow.

agent_version list AGENT
agent_version publish AGENT [--note TEXT] [--candidate]
agent_version rollback AGENT NUMBER
agent_version diff AGENT OLD NEW
agent_version shadow AGENT (NUMBER | off) [--rate 0.1]
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from agent_platform.command_args import whole_number
from agents.admin_versions import (
    nothing_published_message,
    publish_message,
    rollback_message,
    version_note_text,
)
from agents.models import Agent, AgentVersion
from agents.services import agent_shadow_set, agent_version_publish, agent_version_rollback
from agents.versions import version_diff
from audit.visible import visible_text

ACTOR = "system:agent_version"
VIA = "command"


def sample_rate(text: str) -> float:
    """``shadow --rate``: the share of live runs shadowed, a number from 0 to 1, refused in the reader's language
    (argparse's ``float`` said "invalid float value" in English, and took ``nan``)."""
    try:
        rate = float(text)
    except ValueError:
        rate = math.nan
    if not 0.0 <= rate <= 1.0:
        raise argparse.ArgumentTypeError(_("a share from 0 to 1, e.g. 0.1"))
    return rate


class Command(BaseCommand):
    help = gettext_noop(
        "List, publish, roll back and compare an agent's versions; name the version its live runs shadow."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.description = _(self.help)  # marked above, translated now: argparse takes no lazy string
        sub = parser.add_subparsers(dest="action", required=True)
        listing = sub.add_parser("list")
        listing.add_argument("agent")
        publish = sub.add_parser("publish")
        publish.add_argument("agent")
        publish.add_argument("--note", default="", help=_("A note kept with the version (at most 500 characters)."))
        publish.add_argument(
            "--candidate", action="store_true", help=_("Publish without making it live (for a shadow or an A/B arm).")
        )
        rollback = sub.add_parser("rollback")
        rollback.add_argument("agent")
        rollback.add_argument("number", type=whole_number(1), help=_("The version whose content is published again."))
        diff = sub.add_parser("diff")
        diff.add_argument("agent")
        diff.add_argument("old", type=whole_number(1), help=_("The version compared from."))
        diff.add_argument("new", type=whole_number(1), help=_("The version compared to."))
        shadow = sub.add_parser("shadow")
        shadow.add_argument("agent")
        shadow.add_argument("version", help=_("A version number, or 'off'."))
        # No default here: "off" leaves the stored rate alone, a version without --rate is shadowed on every run.
        shadow.add_argument(
            "--rate",
            type=sample_rate,
            default=None,
            help=_("The share of live runs also run on the shadow version, from 0 to 1 (default 1)."),
        )

    def handle(self, *args: Any, **options: Any) -> None:
        agent = Agent.objects.filter(slug=options["agent"]).first()
        if agent is None:
            raise CommandError(_("no agent %(agent)s") % {"agent": repr(options["agent"])})
        action = options["action"]
        if action == "list":
            versions = AgentVersion.objects.filter(agent=agent).order_by("number")
            if not versions.exists():
                # Said on stderr: stdout stays one line per version for scripts, and an empty list is not silence.
                self.stderr.write(_("%(agent)s has no published version yet.") % {"agent": agent.slug})
            for version in versions:
                # The marks and a note the platform wrote in the reader's language, as the admin's versions list
                # shows them (``version_note_text``; they were English under a Korean platform).
                marks = [
                    m
                    for m, on in (
                        (_("live"), agent.live_version_id == version.pk),
                        (_("shadow"), agent.shadow_version_id == version.pk),
                    )
                    if on
                ]
                # Local time with its zone, as the admin and the run trace show times (it was UTC, unnamed).
                created = timezone.localtime(version.created_at)
                self.stdout.write(
                    f"v{version.number}\t{created:%Y-%m-%d %H:%M:%S %Z}\t{version.published_by}\t"
                    f"{version_note_text(version.note)}\t{','.join(marks)}"
                )
        elif action == "publish":
            try:
                version = agent_version_publish(
                    agent=agent, actor=ACTOR, via=VIA, note=options["note"], make_live=not options["candidate"]
                )
            except ValidationError as exc:
                raise CommandError("; ".join(exc.messages)) from None
            self.stdout.write(f"v{version.number}")
            if not options["candidate"]:
                self._warn_of_arms(*publish_message(agent=agent, number=version.number))
        elif action == "rollback":
            latest = AgentVersion.objects.filter(agent=agent).order_by("-number").values_list("number", flat=True)
            before = latest.first()
            try:
                version = agent_version_rollback(version=self._version(agent, options["number"]), actor=ACTOR, via=VIA)
            except ValidationError as exc:
                raise CommandError("; ".join(exc.messages)) from None
            self.stdout.write(f"v{version.number}")
            if before is not None and version.number <= before:
                # The live version already held this content: no version was made ("published again as v7" said
                # otherwise), as the admin's roll back says.
                self.stderr.write(nothing_published_message(agent=agent, old=options["number"], live=version.number))
            else:
                self._warn_of_arms(*rollback_message(agent=agent, old=options["number"], new=version.number))
        elif action == "diff":
            old, new = self._version(agent, options["old"]), self._version(agent, options["new"])
            for row in version_diff(old.content, new.content):
                # As the admin's diff page: what does not show itself is written out (``audit.visible``), or a
                # prompt with an instruction in tag characters appended reads as the one before it. Outside the
                # JSON's quotes nothing is changed, so each line stays JSON; Korean stays as written.
                self.stdout.write(visible_text(json.dumps(row, ensure_ascii=False, default=str)))
        else:
            given = options["version"].strip()
            if given != "off" and not given.isdecimal():
                raise CommandError(
                    _("the version must be a version number or 'off', not %(given)s") % {"given": repr(given)}
                )
            chosen = None if given == "off" else self._version(agent, int(given))
            rate = self._shadow_rate(agent, chosen, options["rate"])
            try:
                agent_shadow_set(agent=agent, actor=ACTOR, via=VIA, version=chosen, rate=rate)
            except ValidationError as exc:
                raise CommandError("; ".join(exc.messages)) from None
            if chosen is None:
                self.stdout.write(_("shadow off"))
            else:
                self.stdout.write(
                    _("shadow %(version)s at %(rate)s") % {"version": f"v{chosen.number}", "rate": f"{rate:g}"}
                )

    def _warn_of_arms(self, text: str, warning: bool) -> None:
        """On stderr, so that stdout stays the version's number for a script: while weighted A/B arms take the
        live traffic, the version just made live reaches no caller (``admin_versions.publish_message``)."""
        if warning:
            self.stderr.write(text)

    @staticmethod
    def _shadow_rate(agent: Agent, chosen: AgentVersion | None, given: float | None) -> float:
        """The sample rate ``shadow`` stores: ``--rate`` (1 where it is left out) for a version; the stored rate
        for "off", which turns the shadow off and changes nothing else (it set the rate to 1, audited, and an
        admin who named a version again later shadowed every run)."""
        if chosen is not None:
            return 1.0 if given is None else given
        if given is not None:
            raise CommandError(_("--rate is the rate of a shadow version: 'off' takes none"))
        return agent.shadow_sample_rate

    @staticmethod
    def _version(agent: Agent, number: int) -> AgentVersion:
        version = AgentVersion.objects.filter(agent=agent, number=number).first()
        if version is None:
            raise CommandError(_("%(agent)s has no version %(number)s") % {"agent": agent.slug, "number": number})
        return version
