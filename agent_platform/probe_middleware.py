"""``/healthz`` and ``/readyz`` answered whatever the request's ``Host``.

A probe names the address it dials, not the site: a kubelet's ``httpGet`` sends ``Host: <pod IP>:8000``, a load
balancer's health check its own target's address. Django checks the Host against ``ALLOWED_HOSTS`` where anything
asks for it (``CommonMiddleware`` on every request): the probes answered such a probe with an HTML 400 and an ERROR
``DisallowedHost`` traceback in the log each time, and a liveness probe would have restarted healthy pods. Listing
every pod's address in ``ALLOWED_HOSTS`` is no answer (they change), and ``*`` would give up the check for the
admin and the API.

The probes' answers depend on no host (no link, no redirect, no cookie), so this middleware, placed before anything
that asks for the Host, answers exactly those two paths, for ``GET`` and ``HEAD`` only, with the views urls.py
routes them to (the match is kept on the request, so the request's trace span is still named by its route).
Everything else goes on as before: ``/metrics`` keeps its Host check (its scrapers are configured like any client,
and its figures are not for any address that reaches the port).
"""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponseBase
from django.urls import resolve

# Exact paths, as urls.py routes them (``/healthz/`` is no probe).
PROBE_PATHS = frozenset({"/healthz", "/readyz"})


class ProbeMiddleware:
    """Answers ``GET``/``HEAD`` ``/healthz`` and ``/readyz`` itself, before the Host is checked; passes every other
    request on."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        if request.path_info in PROBE_PATHS and request.method in {"GET", "HEAD"}:
            match = resolve(request.path_info)
            request.resolver_match = match
            response: HttpResponseBase = match.func(request, *match.args, **match.kwargs)
            return response
        return self.get_response(request)
