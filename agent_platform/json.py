"""JSON as people read it: Korean (any non-ASCII) text stored and shown as itself, not as \\u escapes."""

from __future__ import annotations

from typing import Any

from django.core.serializers.json import DjangoJSONEncoder


class UnicodeJSONEncoder(DjangoJSONEncoder):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["ensure_ascii"] = False
        super().__init__(*args, **kwargs)
