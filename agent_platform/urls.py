"""URLs: the admin, the REST API under /api/v1/, and a health check for load balancers."""

from django.contrib import admin
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.urls import include, path
from django.views import defaults

from agents.rule_tester import rule_tester_view


def healthz(request: HttpRequest) -> JsonResponse:
    connection.ensure_connection()
    return JsonResponse({"status": "ok"})


urlpatterns = [
    path("admin/agents/rule-tester/", admin.site.admin_view(rule_tester_view), name="rule-tester"),
    path("admin/", admin.site.urls),
    path("api/v1/audit/", include("auditor.urls")),
    path("api/v1/", include("agents.api.urls")),
    path("healthz", healthz),
]


def _api_aware(default_view, code: str, message: str, status: int):  # type: ignore[no-untyped-def]
    """JSON errors under /api/ (callers parse them), Django's pages elsewhere."""

    def view(request: HttpRequest, *args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        if request.path.startswith("/api/"):
            return JsonResponse({"error": {"code": code, "message": message}}, status=status)
        return default_view(request, *args, **kwargs)

    return view


handler404 = _api_aware(defaults.page_not_found, "not_found", "Not found.", 404)
handler500 = _api_aware(defaults.server_error, "server_error", "Internal error.", 500)
