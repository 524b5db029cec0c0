"""Template filters for the audit record's codes in words (audit/labels.py)."""

from __future__ import annotations

from django import template

from audit.labels import actor_in_words

register = template.Library()


@register.filter
def actor_words(actor: str | None) -> str:
    """Who did it, in words (``admin:alice`` → "alice (admin)"): :func:`audit.labels.actor_in_words`."""
    return actor_in_words(actor or "")
