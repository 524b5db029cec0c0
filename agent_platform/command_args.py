"""Argument types the management commands share (argparse ``type=``), each refusing what the command could not
use with a translated message."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from django.utils.translation import gettext as _


def timeout_seconds(text: str) -> float:
    """A wait for ``--timeout`` (``run_query``, ``run_eval``): a finite number of seconds, 0 or more. argparse's
    ``float`` takes ``nan`` and ``inf``, and a deadline of NaN is never passed: the command waited forever."""
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(_("a number of seconds, e.g. 120")) from None
    if not math.isfinite(seconds) or seconds < 0:
        raise argparse.ArgumentTypeError(_("a finite number of seconds, 0 or more"))
    return seconds


# The largest count or number an option takes: what every integer column holds on every database (a larger one
# reached the database, ``run_eval --workers 99999999999999999999`` a traceback: SQLite's OverflowError,
# PostgreSQL's check constraint on a window wrapped negative), and more than any command can use.
WHOLE_NUMBER_MAX = 2**31 - 1


def whole_number(minimum: int) -> Callable[[str], int]:
    """A count for options such as ``--workers`` or ``--chunk-size``: a whole number, ``minimum`` or more, at most
    ``WHOLE_NUMBER_MAX``. argparse's ``int`` takes ``-3``, which the commands then read as something else
    (``verify_audit --workers -3`` verified in one process, ``--chunk-size 0`` fetched one row at a time) instead
    of saying the value is wrong."""

    def parse(text: str) -> int:
        try:
            number = int(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(_("a whole number, e.g. %(example)s") % {"example": minimum + 1}) from None
        if number < minimum:
            raise argparse.ArgumentTypeError(_("a whole number, %(minimum)s or more") % {"minimum": minimum})
        if number > WHOLE_NUMBER_MAX:
            raise argparse.ArgumentTypeError(
                _("a whole number, at most %(maximum)s") % {"maximum": f"{WHOLE_NUMBER_MAX:,}"}
            )
        return number

    parse.__name__ = "whole_number"  # argparse names the type in its "invalid … value" message
    return parse
