"""The one check of the ASCII slugs an admin types: an agent's slug, an A/B arm's name, an MCP server's id and an
eval set's name. Each is a ``CharField`` with ``validate_ascii_slug``, not a ``SlugField``: Django's slug message
("letters, numbers, underscores or hyphens", in Korean "문자, 숫자, ...") reads as if Hangul were letters it took,
so a Korean admin typing "회사도우미" was refused without being told why. The admin's forms, the API's documents
and ``import_config`` all reach this check through ``full_clean``.
"""

from __future__ import annotations

import re

from django.core.exceptions import ValidationError
from django.utils.translation import gettext_lazy as _

# What Django's ``validate_slug`` takes, ASCII only (its ``allow_unicode`` is off for every field here).
_ASCII_SLUG = re.compile(r"[-a-zA-Z0-9_]+")

ASCII_SLUG_REFUSAL = _(
    "Use ASCII letters (a–z, A–Z), digits, _ and - only (e.g. team-a_v2): the name is used in URLs and commands."
)


def validate_ascii_slug(value: str) -> None:
    """Refuses a value that is not an ASCII slug (an empty one included), saying which characters it may hold and
    why. A value stored while these fields were ``SlugField`` passed Django's same rule, so it passes here too."""
    if not _ASCII_SLUG.fullmatch(value):
        raise ValidationError(ASCII_SLUG_REFUSAL, code="invalid")
