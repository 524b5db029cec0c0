"""The REST API under /api/v1/: runs, their events and approvals, and the OpenAPI schema with its docs."""

from typing import Any

from django.urls import path
from django.utils import translation
from django.utils.translation import gettext as _
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.request import Request
from rest_framework.response import Response

from agent_platform.errors import ApplicationError
from agents.api import events, views
from agents.api.renderers import UnicodeJSONRenderer


class SchemaFormat(DefaultContentNegotiation):
    """The schema's own ``?format=json|yaml`` (the API's other views have no such switch: settings'
    ``URL_FORMAT_OVERRIDE`` is off, so that ``?format=xml`` never makes a run a 404). Another format is a 400 that
    names the two (it was DRF's bare 404)."""

    def select_renderer(self, request: Request, renderers: list[Any], format_suffix: str | None = None) -> Any:
        wanted = format_suffix or request.query_params.get("format")
        if wanted and wanted not in {renderer.format for renderer in renderers}:
            raise ApplicationError(
                _("'format' must be json or yaml."),
                code="invalid_input",
                status=400,
                fields={"format": [_("Give json or yaml.")]},
            )
        return super().select_renderer(request, renderers, wanted)


class EnglishSchemaView(SpectacularAPIView):
    """The schema in English (``Content-Language: en``), whatever ``Accept-Language`` (or drf-spectacular's
    ``?lang=``) asks: its descriptions are written in English only, and the text it reads from the models (titles,
    enum labels) followed the caller's language, so a Korean caller got a schema half in Korean."""

    def handle_exception(self, exc: Exception) -> Response:
        # The API's one error shape, as JSON: rendered as the schema (YAML by default), an error's body was replaced
        # by the generic "The request failed (HTTP 405)." on its way out (``ApiErrorShapeMiddleware``).
        self.request.accepted_renderer, self.request.accepted_media_type = UnicodeJSONRenderer(), "application/json"
        response: Response = super().handle_exception(exc)
        return response

    def _get_schema_response(self, request: Request) -> Response:
        # drf-spectacular's one place that generates the schema, inside its ``?lang=`` override; the generator
        # turns every lazy translation into text, so nothing is translated later, when the response is rendered.
        with translation.override("en"):
            response: Response = super()._get_schema_response(request)  # type: ignore[no-untyped-call]
        response["Content-Language"] = "en"
        return response


urlpatterns = [
    path("schema/", EnglishSchemaView.as_view(content_negotiation_class=SchemaFormat), name="api-schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("usage", views.UsageApi.as_view(), name="usage"),
    path("runs", views.RunCollectionApi.as_view(), name="run-collection"),
    path("runs/<str:run_id>", views.RunDetailApi.as_view(), name="run-detail"),
    path("runs/<str:run_id>/cancel", views.RunCancelApi.as_view(), name="run-cancel"),
    path("runs/<str:run_id>/events", events.run_events, name="run-events"),
    path("runs/<str:run_id>/feedback", views.RunFeedbackApi.as_view(), name="run-feedback"),
    path(
        "runs/<str:run_id>/approvals/<str:approval_id>",
        views.RunApprovalDecideApi.as_view(),
        name="run-approval-decide",
    ),
]
