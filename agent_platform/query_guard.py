"""A NUL character in a page's address is a bad request, answered before any view reads it.

No database the platform runs on stores a NUL in text (PostgreSQL raises ``DataError``: "text fields cannot contain
NUL (0x00) bytes"), and no page has a use for one: an admin list filtered by ``?mcp_id=a%00b`` (the audit log, the
approvals, the rule tester, the metrics pages) was a 500 on PostgreSQL. Rather than every filter looking for it,
:class:`QueryGuardMiddleware` answers a request whose path or query (its decoded parameters, names or values)
holds a NUL with a ``400`` page in the reader's language (``400.html``).

The API's paths (``/api/``, ``/a2a/``, ``/mcp``, ``/.well-known/``) are refused before this, with the API's JSON
``{"error": {"code": "bad_request", ...}}``, by ``agent_platform.body_limit.BodyLimitMiddleware``: this passes them
on untouched, so the API keeps its one answer.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import unquote

from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.shortcuts import render
from django.utils.translation import gettext as _

from agent_platform.body_limit import is_api_path


class QueryGuardMiddleware:
    """Refuses (``400``) a request outside the API whose path or query holds a NUL; passes every other on. Placed
    after ``LocaleMiddleware``, so the page is in the reader's language."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        if not is_api_path(request.path) and holds_nul(request):
            return refusal(request)
        return self.get_response(request)


def holds_nul(request: HttpRequest) -> bool:
    """Whether the request's path or its query holds a NUL character: the query's every ``%XX`` decoded, so a
    parameter's name or value holds one exactly when this says so. Read from the raw query, not ``request.GET``:
    parsing it here would refuse a query past ``DATA_UPLOAD_MAX_NUMBER_FIELDS`` on pages that never read it."""
    return "\x00" in request.path or "\x00" in unquote(request.META.get("QUERY_STRING", ""))


def refusal(request: HttpRequest) -> HttpResponse:
    """The ``400`` page saying why (the same words the API uses)."""
    reason = _("The path and the query may not contain NUL characters.")
    return render(request, "400.html", {"reason": reason}, status=400)
