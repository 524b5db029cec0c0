"""A multi-select of rows whose posted id no integer column holds is an invalid choice, not a server error.

Django's ``ModelMultipleChoiceField`` looks the posted ids up with one ``pk__in`` query. On SQLite an id past 64
bits (``99999999999999999999``) raises ``OverflowError`` there, and the page was a 500; PostgreSQL and the
single-choice fields already answer "Select a valid choice". :class:`InRangeModelMultipleChoiceField` refuses such
an id with Django's own message before anything is queried, whatever the database.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.db import connections, models
from django.db.models import QuerySet


def key_in_range(queryset: QuerySet[Any], value: Any, *, to_field: str | None = None) -> bool:
    """Whether ``value`` can be looked up as a key of ``queryset``'s rows on their database without overflowing.
    False only for an integer outside the key column's range; True for anything else (text that is no integer,
    a key that is no integer column), which the lookup itself refuses or finds."""
    meta = queryset.model._meta
    field = meta.pk if to_field in (None, "pk") else meta.get_field(str(to_field))
    if not isinstance(field, models.IntegerField):  # AutoField and BigAutoField are IntegerFields too
        return True
    try:
        number = int(str(value).strip())
    except ValueError:  # no integer, or one of more digits than Python reads (its lookup says so)
        return True
    low, high = connections[queryset.db].ops.integer_field_range(field.get_internal_type())
    return (low is None or number >= low) and (high is None or number <= high)


class InRangeModelMultipleChoiceField(forms.ModelMultipleChoiceField):  # type: ignore[type-arg]
    """Django's multi-select of rows, where an id outside the database's integer range is an invalid choice
    (Django's "Select a valid choice. … is not one of the available choices.") instead of an ``OverflowError``."""

    def clean(self, value: Any) -> Any:
        if isinstance(value, list | tuple) and self.queryset is not None:
            for key in value:
                if not key_in_range(self.queryset, key, to_field=self.to_field_name):
                    raise ValidationError(
                        self.error_messages["invalid_choice"], code="invalid_choice", params={"value": key}
                    )
        return super().clean(value)
