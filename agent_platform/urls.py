"""URLs: the admin (and its language switch under /i18n/), the REST API under /api/v1/, the A2A and MCP endpoints,
and the operators' probes and metrics."""

from django.contrib import admin
from django.http import HttpRequest
from django.urls import include, path, reverse, reverse_lazy
from django.utils.functional import Promise
from django.utils.translation import gettext_lazy as _
from django.views import defaults
from django.views.generic import RedirectView

from agent_platform import probes
from agent_platform.body_limit import is_api_path, json_error
from agent_platform.dashboard import dashboard_index
from agents.api import a2a_server, mcp_server
from agents.api.errors import bad_request
from agents.rule_tester import rule_tester_view
from audit.login_form import LockoutAwarePasswordChangeView
from audit.roles import user_password_page

# The admin's "View site" leads to the API's documentation (the platform has no public site of its own).
admin.site.site_url = reverse_lazy("api-docs")  # type: ignore[assignment]
admin.site.site_header = _("Agent platform administration")
admin.site.site_title = _("Agent platform")


def own_password_change(request: HttpRequest, extra_context: object = None):  # type: ignore[no-untyped-def]
    """The admin's own password page, in a change scope: the change is recorded with this admin as its actor. The
    old password is checked under the login lockout (``audit.login_form``): Django's page, as the admin site serves
    it, checked it unthrottled and unrecorded."""
    request.current_app = admin.site.name
    view = LockoutAwarePasswordChangeView.as_view(
        success_url=reverse("admin:password_change_done", current_app=admin.site.name),
        extra_context=admin.site.each_context(request),
    )
    with user_password_page(actor=request.user, via="admin"):
        return view(request)


urlpatterns = [
    # The address ./bin/up prints: the admin (its login first), not a 404.
    path("", RedirectView.as_view(url="/admin/", permanent=False), name="home"),
    path("admin/password_change/", admin.site.admin_view(own_password_change, cacheable=True)),
    path("admin/agents/rule-tester/", admin.site.admin_view(rule_tester_view), name="rule-tester"),
    path("admin/", admin.site.admin_view(dashboard_index), name="dashboard"),
    path("admin/", admin.site.urls),
    # The admin's language switch (set_language: a POST that keeps the reader's choice in a cookie).
    path("i18n/", include("django.conf.urls.i18n")),
    path("api/v1/audit/", include("auditor.urls")),
    path("api/v1/evals/", include("evals.urls")),
    path("api/v1/", include("agents.api.urls")),
    path("healthz", probes.healthz, name="healthz"),
    path("readyz", probes.readyz, name="readyz"),
    path("metrics", probes.metrics, name="metrics"),
    # A2A (each agent at /a2a/<slug>/) and MCP (the agents as tools): see agents/api/a2a_server.py, mcp_server.py.
    path(".well-known/agent-card.json", a2a_server.platform_card_view, name="a2a-directory"),
    path("a2a/<slug:slug>/.well-known/agent-card.json", a2a_server.agent_card_view, name="a2a-card"),
    path("a2a/<slug:slug>/", a2a_server.rpc_view, name="a2a-rpc"),
    # Without the slash too: a redirected POST loses its body (clients re-send it as a GET), as for /mcp.
    path("a2a/<slug:slug>", a2a_server.rpc_view),
    path("mcp/", mcp_server.mcp_view, name="mcp"),
    path("mcp", mcp_server.mcp_view),
]


def _api_aware(default_view, status: int, message: Promise):  # type: ignore[no-untyped-def]
    """JSON errors on the API's paths (callers parse them: the REST API, A2A, MCP), Django's pages elsewhere."""

    def view(request: HttpRequest, *args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        if is_api_path(request.path):
            return json_error(status, message=str(message))
        return default_view(request, *args, **kwargs)

    return view


handler404 = _api_aware(defaults.page_not_found, 404, _("Not found."))
handler500 = _api_aware(defaults.server_error, 500, _("Internal error."))
# A request Django refuses before any view (a Host header not in ALLOWED_HOSTS): on the API, JSON saying so.
handler400 = bad_request
