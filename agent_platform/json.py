"""JSON as people read it: Korean (any non-ASCII) text stored and shown as itself, not as \\u escapes."""

from __future__ import annotations

import json
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder


class UnicodeJSONEncoder(DjangoJSONEncoder):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["ensure_ascii"] = False
        super().__init__(*args, **kwargs)


def json_error_text(exc: BaseException) -> str:
    """Why a text is not JSON, in the active language: what is wrong and where (``Expecting value: line 1 column
    10 (char 9)`` as "a value was expected, at line 1, column 10")."""
    from django.utils.translation import gettext as _

    if not isinstance(exc, json.JSONDecodeError):
        return str(exc)
    what = {
        "Expecting value": _("a value was expected"),
        "Expecting property name enclosed in double quotes": _("a key in double quotes was expected"),
        "Expecting ',' delimiter": _("a comma was expected"),
        "Expecting ':' delimiter": _("a colon was expected"),
        "Extra data": _("there is more after the JSON value"),
        "Unterminated string starting at": _("a string is not closed"),
        "Invalid control character at": _("a control character is inside a string"),
        "Invalid \\escape": _("an escape sequence is not valid"),
        "Illegal trailing comma before end of object": _("a comma is before the end of an object"),
        "Illegal trailing comma before end of array": _("a comma is before the end of a list"),
    }.get(exc.msg, exc.msg)
    return _("%(what)s, at line %(line)d, column %(column)d") % {"what": what, "line": exc.lineno, "column": exc.colno}
