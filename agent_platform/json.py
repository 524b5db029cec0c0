"""JSON as people read it: Korean (any non-ASCII) text stored and shown as itself, not as \\u escapes."""

from __future__ import annotations

import json
import math
import re
import sys
from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.core.serializers.json import DjangoJSONEncoder

NESTED_TOO_DEEPLY = "Nested too deeply"
NOT_A_FINITE_NUMBER = "Not a finite number"
# A string (skipped), or a token that is no finite number: NaN, Infinity, -Infinity, or a number that overflows.
_STRING_OR_NUMBER = re.compile(r'"(?:[^"\\]|\\.)*"|(-?Infinity|NaN)|(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)', re.DOTALL)


class _NotFinite(ValueError):
    """A NaN, an infinity, or a number that overflows to one: no JSON column stores it."""


def _refuse_constant(name: str) -> Any:
    raise _NotFinite(name)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotFinite(text)
    return value


def _not_finite_at(text: str) -> int:
    """Where the first number that is not finite starts (the text before it parsed, so strings are whole)."""
    for match in _STRING_OR_NUMBER.finditer(text):
        if match.group(1) or (match.group(2) and not math.isfinite(float(match.group(2)))):
            return match.start()
    return 0


class BoundedJSONDecoder(json.JSONDecoder):
    """Python's decoder, where text nested deeper than the interpreter's recursion limit (``[[[[…]]]]`` pasted
    into a form, or a tool's hostile answer) is a ``JSONDecodeError`` like any other text that is no JSON,
    not a ``RecursionError`` that ends a page as a server error or a run as a crash."""

    def decode(self, s: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().decode(s, *args, **kwargs)
        except RecursionError:
            raise json.JSONDecodeError(NESTED_TOO_DEEPLY, s, 0) from None
        except _NotFinite:
            raise json.JSONDecodeError(NOT_A_FINITE_NUMBER, s, _not_finite_at(s)) from None


class FiniteJSONDecoder(BoundedJSONDecoder):
    """:class:`BoundedJSONDecoder` where ``NaN``, ``Infinity``, ``-Infinity`` and numbers that overflow to them
    (``1e400``), which Python's decoder accepts and no JSON column stores, are a ``JSONDecodeError`` too (what
    a raw JSON box of the admin decodes with: saved, they were a server error). Not the default: an editor
    that writes a typed ``nan`` into its JSON to refuse it at the field that holds it needs it to decode
    (``mcpregistry.contract_form``). A caller's own ``parse_constant`` / ``parse_float`` is used when given."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["parse_constant"] = kwargs.get("parse_constant") or _refuse_constant
        kwargs["parse_float"] = kwargs.get("parse_float") or _finite_float
        super().__init__(*args, **kwargs)


def loads(text: str | bytes, **kwargs: Any) -> Any:
    """``json.loads`` with :class:`BoundedJSONDecoder`: raises ``ValueError`` (``JSONDecodeError``) only."""
    return json.loads(text, cls=BoundedJSONDecoder, **kwargs)


class BoundedJSONField(forms.JSONField):
    """Django's JSON form field with :class:`BoundedJSONDecoder` (a model's JSON field on every admin page that
    saves through a service: ``audit.admin_changes.ServiceAdminMixin``), and text that is no JSON refused saying
    what is wrong and where, not "Enter a valid JSON"."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("decoder") is None:  # a model field's formfield() passes its own, None by default
            kwargs["decoder"] = BoundedJSONDecoder
        super().__init__(*args, **kwargs)

    def to_python(self, value: Any) -> Any:
        if not self.disabled and isinstance(value, str) and value.strip():
            try:
                json.loads(value, cls=self.decoder)
            except json.JSONDecodeError as exc:
                from django.utils.translation import gettext as _

                raise ValidationError(
                    _("Not valid JSON: %(error)s") % {"error": json_error_text(exc)}, code="invalid"
                ) from None
        return super().to_python(value)


def bounded_json_overrides(*, finite: bool = False) -> dict[Any, dict[str, Any]]:
    """``formfield_overrides`` for an admin or an inline: a model's JSON fields read with :class:`BoundedJSONField`
    (``finite``: with :class:`FiniteJSONDecoder`, so ``NaN`` and ``Infinity`` are refused as no JSON)."""
    from django.db import models

    if finite:
        return {models.JSONField: {"form_class": BoundedJSONField, "decoder": FiniteJSONDecoder}}
    return {models.JSONField: {"form_class": BoundedJSONField}}


class UnicodeJSONEncoder(DjangoJSONEncoder):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["ensure_ascii"] = False
        super().__init__(*args, **kwargs)


def json_error_text(exc: BaseException) -> str:
    """Why a text is not JSON, in the active language: what is wrong and where (``Expecting value: line 1 column
    10 (char 9)`` as "a value was expected, at line 1, column 10")."""
    from django.utils.translation import gettext as _

    if not isinstance(exc, json.JSONDecodeError):
        if "sys.set_int_max_str_digits" in str(exc):  # Python's advice to a developer, in English
            return _("a number with more than %(limit)s digits") % {"limit": sys.get_int_max_str_digits()}
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
        NESTED_TOO_DEEPLY: _("the JSON is nested too deeply"),
        NOT_A_FINITE_NUMBER: _("a number is not finite (NaN and Infinity are not JSON)"),
    }.get(exc.msg, exc.msg)
    return _("%(what)s, at line %(line)d, column %(column)d") % {"what": what, "line": exc.lineno, "column": exc.colno}
