from __future__ import annotations

from rest_framework.renderers import JSONRenderer


class UnicodeJSONRenderer(JSONRenderer):
    """JSON with Korean (and every non-ASCII) text as it is, not as \\u escapes."""

    ensure_ascii = False
    charset = "utf-8"
