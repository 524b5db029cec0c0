"""Template filters for the eval run pages (evals/labels.py)."""

from __future__ import annotations

from django import template
from django.utils.html import format_html_join
from django.utils.safestring import SafeString

from audit.labels import breakable
from evals.labels import CASE_TYPE_NAMES, checks_html, threshold_html

register = template.Library()


@register.filter
def failed_checks(codes: list[str] | None) -> SafeString:
    return checks_html(list(codes or []))


@register.filter
def thresholds_missed(failures: list[str] | None) -> SafeString:
    return format_html_join("; ", "{}", ((threshold_html(f),) for f in failures or []))


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
