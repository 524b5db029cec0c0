"""A list filter the database cannot hold is a bad filter, not a server error.

Django's admin turns a filter it cannot read (``?created_at__month=13``) into ``IncorrectLookupParameters``: the
list is shown again without its filters (``?e=1``). A value that reads but does not fit (``?created_at__gte=
0001-01-01``, which the time zone moves before year 1; ``?created_at__year=99999999999999999999``) raises
``OverflowError`` instead, where the list's query is built or run, and the page was a 500. This middleware answers
such a list the way Django answers a filter it cannot read: the list without its filters, and a message saying
why.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.contrib.admin.views.main import ERROR_FLAG
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.utils.translation import gettext as _


class AdminFilterOverflowMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> Any:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not isinstance(exception, OverflowError) or request.method != "GET" or not request.GET:
            return None
        match = request.resolver_match
        is_list = match is not None and "admin" in match.namespaces and str(match.url_name).endswith("_changelist")
        if not is_list or ERROR_FLAG in request.GET:
            return None  # elsewhere an OverflowError is a bug, and is left to show as one
        messages.error(request, _("A filter's value is out of range; the list is shown without filters."))
        return HttpResponseRedirect(f"{request.path}?{ERROR_FLAG}=1")
