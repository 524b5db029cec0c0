"""A list filter the database cannot hold is a bad filter, not a server error.

Django's admin turns a filter it cannot read (``?created_at__month=13``) into ``IncorrectLookupParameters``: the
list is shown again without its filters (``?e=1``). A value that reads but does not fit (``?created_at__gte=
0001-01-01``, which the time zone moves before year 1; ``?created_at__year=99999999999999999999``) raises
``OverflowError`` instead, where the list's query is built or run, and a year out of Python's range
(``?created_at__year=10000``) ``ValueError``: the page was a 500. This middleware answers such a list the way Django
answers a filter it cannot read: the list without its filters, and a message saying why.

Django's admin also takes any lookup on a model's own fields from the query string, so that a list can be asked
what no filter on it offers: a regular expression (``?hash__regex=^([0-9a-f]+)+z$``, which backtracks for ever in
Python's ``re``, SQLite's ``REGEXP``: a web process held until it is killed), or a JSON lookup (``?args__contains=
{}``, which SQLite does not have: a 500). No filter of this project's lists is either: such a parameter is refused,
before the view runs, the same way.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.contrib.admin.views.main import ERROR_FLAG
from django.core.exceptions import FieldDoesNotExist
from django.db.models import JSONField, Model
from django.db.models.constants import LOOKUP_SEP
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.utils.translation import gettext as _

logger = logging.getLogger(__name__)

# What Python's dates say of a year they cannot hold (``year 10000 is out of range``, ``year -1 is out of range``,
# ``year 0 is out of range``): Django's year lookups build such dates from a list's ``__year`` filter.
_DATE_OUT_OF_RANGE = re.compile(r"^year -?\d+ is out of range$")

REFUSED_LOOKUPS = frozenset({"regex", "iregex"})
"""Lookups no list takes, at any place in a parameter (``hash__regex``, ``run__query__iregex``)."""

JSON_FIELD_LOOKUPS = ((), ("exact",), ("isnull",))
"""What a list takes after a JSON field's name: nothing else (no key, no ``contains``, ``has_key``…)."""


class AdminFilterOverflowMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> Any:
        return self.get_response(request)

    def process_view(
        self, request: HttpRequest, view_func: Callable[..., Any], view_args: Any, view_kwargs: Any
    ) -> HttpResponse | None:
        """A list asked with a lookup it must not run (``REFUSED_LOOKUPS``, a JSON field's lookups) is shown
        without its filters, and says why, before its query is built."""
        # The view first: reading the query string of any other request here took its own handling of a query
        # string it refuses (too many fields: the API's 400) and logged a security error instead.
        if request.method != "GET" or not _is_admin_list(request) or not request.GET:
            return None
        model_admin = getattr(view_func, "model_admin", None)  # set on every ModelAdmin view by get_urls()
        model = getattr(model_admin, "model", None)
        if model is None or not any(_lookup_refused(model, parameter) for parameter in request.GET):
            return None
        messages.error(request, _("A filter cannot be used on this list; the list is shown without filters."))
        return HttpResponseRedirect(f"{request.path}?{ERROR_FLAG}=1")

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        # ValueError: a year the database reads but Python's dates cannot hold (``year 10000 is out of range``),
        # that one alone: any other is a bug, and is left to show as one.
        out_of_range = isinstance(exception, OverflowError) or (
            type(exception) is ValueError and _DATE_OUT_OF_RANGE.search(str(exception)) is not None
        )
        if not out_of_range or request.method != "GET" or not request.GET:
            return None
        if not _is_admin_list(request):
            return None  # elsewhere such an error is a bug, and is left to show as one
        logger.info("admin list %s: a filter out of range (%s), shown without filters", request.path, exception)
        messages.error(request, _("A filter's value is out of range; the list is shown without filters."))
        return HttpResponseRedirect(f"{request.path}?{ERROR_FLAG}=1")


def _is_admin_list(request: HttpRequest) -> bool:
    """An admin list (a ``*_changelist`` view) asked without the error flag (which shows the list unfiltered)."""
    match = request.resolver_match
    is_list = match is not None and "admin" in match.namespaces and str(match.url_name).endswith("_changelist")
    return is_list and ERROR_FLAG not in request.GET  # the query string read only for an admin list


def _lookup_refused(model: type[Model], parameter: str) -> bool:
    """Whether ``parameter`` (a query-string name) is a lookup a list must not run: ``regex``/``iregex`` at any
    place, or anything but ``exact``/``isnull`` after a JSON field, on the model or across its relations. A name
    that is no field (``q``, ``o``, a list filter's own parameter) is the list's to read."""
    parts = parameter.split(LOOKUP_SEP)
    if REFUSED_LOOKUPS.intersection(parts):
        return True
    opts = model._meta
    for i, part in enumerate(parts):
        try:
            field = opts.get_field(part)
        except FieldDoesNotExist:
            return False
        if isinstance(field, JSONField):
            return tuple(parts[i + 1 :]) not in JSON_FIELD_LOOKUPS
        if not field.is_relation or field.related_model is None:
            return False
        opts = field.related_model._meta
    return False
