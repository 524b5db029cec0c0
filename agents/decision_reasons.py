"""A rule decision's reason in the reader's language.

The reasons are stored as the deterministic stage writes them (``agents/deterministic.py``: ``regex did not
match``, ``keyword missing: 팀``, ``context.tier is not 3``): stable English, the same in every run's trace and
audit event, whatever language the admin reads. The admin's pages (a run's timeline, the rule tester) show them
through :func:`reason_text`, which translates the known forms and leaves any other text as it is.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from django.utils.translation import gettext

_FIXED: dict[str, Callable[[], str]] = {
    "matched": lambda: gettext("matched"),
    "none of the keywords present": lambda: gettext("none of the keywords present"),
    "regex did not match": lambda: gettext("the regex did not match"),
    "returned None": lambda: gettext("the code rule returned nothing"),
}
_PATTERNS: list[tuple[re.Pattern[str], Callable[[re.Match[str]], str]]] = [
    (
        re.compile(r"keyword missing: (?P<word>.+)", re.S),
        lambda m: gettext("keyword missing: %(word)s") % m.groupdict(),
    ),
    (
        re.compile(r"context\.(?P<key>\S+) is not (?P<value>.+)", re.S),
        lambda m: gettext("context.%(key)s is not %(value)s") % m.groupdict(),
    ),
    (re.compile(r"data\.(?P<path>\S+) absent", re.S), lambda m: gettext("data.%(path)s is absent") % m.groupdict()),
    (
        re.compile(r"data\.(?P<path>\S+) is not (?P<value>.+)", re.S),
        lambda m: gettext("data.%(path)s is not %(value)s") % m.groupdict(),
    ),
    (
        re.compile(r"tool (?P<tool>\S+) not available", re.S),
        lambda m: gettext("tool %(tool)s is not available") % m.groupdict(),
    ),
    (
        re.compile(r"regex gave up after (?P<seconds>\S+) s on this query", re.S),
        lambda m: gettext("the regex gave up after %(seconds)s s on this query") % m.groupdict(),
    ),
    (
        re.compile(r"no value for (?P<placeholder>\{.+\})", re.S),
        lambda m: gettext("no value for %(placeholder)s") % m.groupdict(),
    ),
]


def reason_text(reason: str) -> str:
    """``reason`` (a stored rule decision's) in the active language; unknown text unchanged."""
    fixed = _FIXED.get(reason)
    if fixed is not None:
        return fixed()
    for pattern, text in _PATTERNS:
        found = pattern.fullmatch(reason)
        if found is not None:
            return text(found)
    return reason


# An approval's reason as the platform stores it (stable English; a person's reason for a rejection is stored as
# they wrote it): translated where it is shown.
UNUSED_APPROVAL = "the run ended without making this call"
CANCELLED_APPROVAL = "the run was cancelled"
ASKED_AGAIN_APPROVAL = "the run was made again and did not ask for this call"
_APPROVAL_REASONS: dict[str, Callable[[], str]] = {
    ASKED_AGAIN_APPROVAL: lambda: gettext("the run was made again and did not ask for this call"),
    UNUSED_APPROVAL: lambda: gettext("the run ended without making this call"),
    CANCELLED_APPROVAL: lambda: gettext("the run was cancelled"),
}


def approval_reason_text(reason: str) -> str:
    """An approval's stored reason in the reader's language where the platform wrote it; a person's as written."""
    fixed = _APPROVAL_REASONS.get(reason)
    return fixed() if fixed is not None else reason
