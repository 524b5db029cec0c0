"""argparse's own words (``usage:``, ``options:``, ``error: the following arguments are required: …``) in the
platform's language, like the rest of a management command's help and errors.

argparse takes its texts from the ``argparse`` gettext domain, which has no Korean catalogue, through the
module-level ``_`` and ``ngettext`` it looks up at call time. ``install()`` (run once when ``agent_platform`` is
imported, i.e. at every Django start) points those two at Django's translation once the app registry is ready, so
the texts come from our catalogue; before that (``manage.py`` reading ``--settings``) they stay argparse's.

The msgids below are argparse's strings of this Python version, exactly (a lookup matches only on the exact text):
``makemessages`` extracts them into our catalogue. ``DJANGO_OPTION_HELP`` are the help texts of the options every
command has (``--verbosity``, ``--settings`` …), which Django passes untranslated."""

from __future__ import annotations

import argparse
from typing import Any

from django.apps import apps
from django.utils import translation
from django.utils.translation import ngettext_lazy


def gettext_noop(message: str) -> str:
    """Marks ``message`` for ``makemessages`` (which finds it by this name) and returns it as it is. Django's own
    reads the settings, and this module is imported with ``agent_platform`` before any settings are (uvicorn
    imports ``agent_platform.asgi``, whose package this is, before the module names them)."""
    return message


# What argparse says to a user of a command (its messages for a programming error, such as a conflicting option
# string, are left out: a user never meets them).
MESSAGES = (
    gettext_noop("usage: "),
    gettext_noop("positional arguments"),
    gettext_noop("options"),
    gettext_noop("show this help message and exit"),
    gettext_noop("subcommands"),
    gettext_noop("%(prog)s: error: %(message)s\n"),
    gettext_noop("argument %(argument_name)s: %(message)s"),
    gettext_noop("the following arguments are required: %s"),
    gettext_noop("one of the arguments %s is required"),
    gettext_noop("unrecognized arguments: %s"),
    gettext_noop("not allowed with argument %s"),
    gettext_noop("ignored explicit argument %r"),
    gettext_noop("ambiguous option: %(option)s could match %(matches)s"),
    gettext_noop("unexpected option string: %s"),
    gettext_noop("expected one argument"),
    gettext_noop("expected at most one argument"),
    gettext_noop("expected at least one argument"),
    gettext_noop("invalid %(type)s value: %(value)r"),
    gettext_noop("invalid choice: %(value)r (choose from %(choices)s)"),
    gettext_noop("unknown parser %(parser_name)r (choices: %(choices)s)"),
    gettext_noop("can't open '%(filename)s': %(error)s"),
    gettext_noop('argument "-" with mode %r'),
)
PLURAL_MESSAGES = (ngettext_lazy("expected %s argument", "expected %s arguments"),)

DJANGO_OPTION_HELP = frozenset(
    {
        gettext_noop("Show program's version number and exit."),
        gettext_noop("Verbosity level; 0=minimal output, 1=normal output, 2=verbose output, 3=very verbose output"),
        gettext_noop(
            'The Python path to a settings module, e.g. "myproject.settings.main". If this isn\'t provided, the '
            "DJANGO_SETTINGS_MODULE environment variable will be used."
        ),
        gettext_noop('A directory to add to the Python path, e.g. "/home/djangoprojects/myproject".'),
        gettext_noop("Display a full stack trace on CommandError exceptions."),
        gettext_noop("Don't colorize the command output."),
        gettext_noop("Force colorization of the command output."),
        gettext_noop("Skip system checks."),
    }
)

_argparse_gettext = argparse._
_argparse_ngettext = argparse.ngettext
_argparse_help_string = argparse.HelpFormatter._get_help_string


def _gettext(message: Any) -> Any:
    # argparse also passes None (a subparsers group without a description): Django's gettext takes only text, and
    # gives the catalogue's header for "".
    if isinstance(message, str) and message and apps.ready:
        return translation.gettext(message)
    return _argparse_gettext(message)


def _ngettext(singular: str, plural: str, number: int) -> str:
    if apps.ready:
        return translation.ngettext(singular, plural, number)
    return _argparse_ngettext(singular, plural, number)


def _help_string(formatter: argparse.HelpFormatter, action: argparse.Action) -> str | None:
    text = _argparse_help_string(formatter, action)
    if text in DJANGO_OPTION_HELP and apps.ready:
        return translation.gettext(text)
    return text


def install() -> None:
    """Routes argparse's messages, and the help of Django's common options, through Django's translation. Safe to
    call again."""
    argparse._ = _gettext  # type: ignore[attr-defined]
    argparse.ngettext = _ngettext  # type: ignore[attr-defined]
    argparse.HelpFormatter._get_help_string = _help_string  # type: ignore[method-assign]
