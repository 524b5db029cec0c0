"""What every benchmark shares: its percentiles and its count options.

One percentile for all of them, so that a ``p50`` is the median and a ``p95`` the same statistic in every bench:
linear interpolation between the closest ranks (``statistics.quantiles(..., method="inclusive")``), so that the
p50 of ``[1, 2, 3, 4]`` is 2.5. The benches used to pick one sample each in their own way (the upper middle, the
lower middle, a rounded or a truncated rank).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterable


def percentile(values: Iterable[float], q: float) -> float:
    """The ``q`` quantile (0 to 1) of ``values``, interpolated linearly between the closest ranks; ``nan`` for no
    values (a figure of what was not measured, which a bench does not print)."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"a quantile is between 0 and 1, not {q}")
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    position = q * (len(ordered) - 1)
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)


def median(values: Iterable[float]) -> float:
    """``percentile(values, 0.5)``: the middle value, or the mean of the two middle ones."""
    return percentile(values, 0.5)


def positive_int(text: str) -> int:
    """An argparse ``type`` for a count that must be at least 1 (runs, calls, rounds): anything else is a usage
    error before the bench starts anything."""
    return _whole_number(text, least=1)


def non_negative_int(text: str) -> int:
    """An argparse ``type`` for a count where 0 means "skip this part" (``--writers 0``, ``--shadow-runs 0``)."""
    return _whole_number(text, least=0)


def _whole_number(text: str, *, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"{value} is less than {least}")
    return value
