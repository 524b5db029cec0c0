"""Argument types the management commands share (argparse ``type=``), each refusing what the command could not
use with a translated message."""

from __future__ import annotations

import argparse
import math

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
