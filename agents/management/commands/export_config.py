from __future__ import annotations

import json
from typing import Any

import yaml
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from agent_platform.os_errors import os_error_text
from agents.configuration import config_export
from mcpregistry.crypto import SecretDecryptionError


class _PlainDumper(yaml.SafeDumper):
    """YAML without anchors and aliases: each value written where it is (a reviewer reads the text; an import
    counts every use of an alias against its limit)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


# Line breaks YAML reads as a break inside a plain, single-quoted or folded scalar and folds into a space on the
# way back (U+0085 NEL, what a cp1252 "…" becomes when read as Latin-1; U+2028 and U+2029): written double-quoted,
# where they are escapes, so the export re-imports as itself.
_FOLDED_BREAKS = ("\x85", "\u2028", "\u2029")


def _text(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    if any(mark in text for mark in _FOLDED_BREAKS):
        return dumper.represent_scalar("tag:yaml.org,2002:str", text, style='"')
    if "\n" in text:
        # A multi-line text (a system prompt, an answer template) as a literal block, a line a line as a reviewer
        # reads it (it was one double-quoted line of \n, an emoji as \U0001F600); the emitter falls back to double
        # quotes where a block cannot hold the text as it is (a tab, a control character).
        return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|")
    return dumper.represent_str(text)


_PlainDumper.add_representer(str, _text)


class Command(BaseCommand):
    help = gettext_noop(
        "Export servers, contracts, agents and rules as JSON (or YAML). Secret values are never written."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.description = _(self.help)  # marked above, translated now: argparse takes no lazy string
        parser.add_argument("--format", choices=["json", "yaml"], default="json")
        parser.add_argument("--output", "-o", help=_("write to this file instead of standard output"))

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            document = config_export()
        except SecretDecryptionError as exc:
            raise CommandError(str(exc)) from None
        if options["format"] == "yaml":
            text = yaml.dump(document, Dumper=_PlainDumper, allow_unicode=True, sort_keys=False)
        else:
            text = json.dumps(document, ensure_ascii=False, indent=2) + "\n"
        if options["output"]:
            try:
                with open(options["output"], "w", encoding="utf-8") as f:
                    f.write(text)
            except OSError as exc:
                raise CommandError(
                    _("cannot write %(path)s: %(why)s") % {"path": options["output"], "why": os_error_text(exc)}
                ) from None
            self.stderr.write(_("wrote %(path)s") % {"path": options["output"]})
        else:
            self.stdout.write(text, ending="")
