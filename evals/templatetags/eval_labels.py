"""Template filters for the eval run pages (evals/labels.py)."""

from __future__ import annotations

import json

from django import template
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from audit.labels import breakable
from audit.masking import mask_value
from evals.labels import CASE_TYPE_NAMES, checks_html, threshold_html

register = template.Library()


@register.filter
def failed_checks(codes: list[str] | None) -> SafeString:
    return checks_html(list(codes or []))


@register.filter
def thresholds_missed(failures: list[str] | None) -> SafeString:
    return format_html_join("; ", "{}", ((threshold_html(f),) for f in failures or []))


# How much of a call's arguments a run's page shows before the rest is opened (``arguments``).
ARGUMENTS_SHOWN = 120


@register.filter
def arguments(args: object) -> SafeString:
    """A call's arguments as JSON, masked as the audit record masks them (``audit.masking``: a recorded call's
    are already, an expected one's a secret typed into a case is hidden too), escaped; past ``ARGUMENTS_SHOWN``
    characters, shortened, the whole behind a ``<details>``."""
    text = json.dumps(mask_value(args) if isinstance(args, dict) else args, ensure_ascii=False, default=str)
    if len(text) <= ARGUMENTS_SHOWN:
        return format_html('<code class="eval-args">{}</code>', text)
    return format_html(
        '<details class="eval-args"><summary><code>{}…</code></summary><code>{}</code></details>',
        text[:ARGUMENTS_SHOWN],
        text,
    )


@register.filter
def code(value: str | None) -> str:
    """A code or a tool's name that wraps at its underscores, dots and colons, not after any letter."""
    return breakable(value or "")


@register.filter
def tool_name(tool: object) -> str:
    """An expected tool's name, whether stored as ``{"name": …}`` or, as the admin once wrote it, a bare name."""
    if isinstance(tool, dict):
        return str(tool.get("name") or "")
    return str(tool or "")


@register.filter
def case_type_name(case_type: str | None) -> str:
    """A case's type in words (``evals.labels.CASE_TYPE_NAMES``); a type written before the list: none."""
    return str(CASE_TYPE_NAMES.get(case_type or "", ""))
