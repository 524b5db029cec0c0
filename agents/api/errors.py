"""One error shape for the whole API: ``{"error": {"code", "message", "fields"?}}``."""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.core.exceptions import DisallowedHost, PermissionDenied, TooManyFieldsSent
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.utils.translation import gettext as _
from django.views import defaults
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from agent_platform.body_limit import is_api_path, json_error
from agent_platform.errors import ApplicationError, database_unreachable

logger = logging.getLogger(__name__)


class LoginLocked(exceptions.Throttled):
    """429 ``login_locked``: too many failed passwords for this username or from this address."""

    def __init__(self, message: str, *, wait: float) -> None:
        super().__init__(wait=wait, detail=message)


# The first class an exception is an instance of names its code (subclasses before their bases).
_CODES = {
    LoginLocked: "login_locked",
    exceptions.ParseError: "invalid_json",
    exceptions.NotAuthenticated: "not_authenticated",
    exceptions.AuthenticationFailed: "authentication_failed",
    exceptions.PermissionDenied: "permission_denied",
    exceptions.NotFound: "not_found",
    exceptions.MethodNotAllowed: "method_not_allowed",
    exceptions.UnsupportedMediaType: "unsupported_media_type",
    exceptions.NotAcceptable: "not_acceptable",
    exceptions.Throttled: "throttled",
    exceptions.ValidationError: "invalid_input",
}


def error_response(
    code: str,
    message: str,
    http_status: int,
    fields: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    body: dict[str, Any] = {"code": code, "message": message}
    if fields:
        body["fields"] = fields
    return Response({"error": body}, status=http_status, headers=headers)


# The Retry-After of a 503 while the database does not answer (seconds).
DATABASE_RETRY_AFTER_S = 5


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, ApplicationError):
        return error_response(exc.code, exc.message, exc.status, exc.fields or None, headers=exc.headers or None)
    if database_unreachable(exc):
        # The database is down or unreachable (a connection refused or timed out, a server that went away): the
        # caller can only try again later, so 503 with Retry-After, not a 500. Its text (it may name the server's
        # address) is never sent to the caller; the log has it, masked. Any other database error is a bug: a 500.
        logger.warning("API: the database did not answer: %s", exc)
        return error_response(
            "unavailable",
            _("The database is not available right now. Try again shortly."),
            status.HTTP_503_SERVICE_UNAVAILABLE,
            headers={"Retry-After": str(DATABASE_RETRY_AFTER_S)},
        )
    if isinstance(exc, TooManyFieldsSent):
        # Raised where DRF (its content negotiation) or a view first reads the query. Left to Django, ``bad_request``
        # below would answer it in the same words, but only after logging a caller's mistake as a security error
        # with its traceback; answered here, it is logged as any other 400 (a warning).
        return error_response("too_many_fields", too_many_fields_message(), status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied()
    elif isinstance(exc, DjangoValidationError):
        exc = exceptions.ValidationError(exc.message_dict if hasattr(exc, "error_dict") else exc.messages)
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        fields = exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail}
        return error_response("invalid_input", _("The request is not valid."), status.HTTP_400_BAD_REQUEST, fields)
    code = next((c for cls, c in _CODES.items() if isinstance(exc, cls)), "error")
    detail = getattr(exc, "detail", str(exc))
    if isinstance(exc, exceptions.UnsupportedMediaType) and not _content_type(context):
        # DRF's words for a request with no Content-Type, 'Unsupported media type "" in request.', do not say what
        # to send.
        detail = _("The request has no Content-Type: send Content-Type: application/json.")
    headers = {k: v for k, v in response.items() if k in {"WWW-Authenticate", "Retry-After", "Allow"}}
    return error_response(code, str(detail), response.status_code, headers=headers)


def _content_type(context: dict[str, Any]) -> str:
    request = context.get("request")
    return str(getattr(request, "content_type", "") or "").strip()


def too_many_fields_message() -> str:
    """Why a request with more parameters than ``DATA_UPLOAD_MAX_NUMBER_FIELDS`` (Django's ``TooManyFieldsSent``)
    is refused, and the limit: the caller can only fix it by sending fewer."""
    limit = settings.DATA_UPLOAD_MAX_NUMBER_FIELDS or 0  # None turns the check (and this error) off
    return _("The request has more than %(max)d query parameters or form fields.") % {"max": limit}


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    """The URLconf's ``handler400``: Django answers a request it refuses before any view (a Host header not in
    ``ALLOWED_HOSTS``, too many fields) here. On the API's paths the API's JSON, saying when the host is the cause
    (without repeating the header, which the client chose) or when the query has too many fields (read by the
    event stream, a plain Django view; the REST views answer it through ``exception_handler``); elsewhere Django's
    page."""
    if not is_api_path(request.path):
        return defaults.bad_request(request, exception)
    if isinstance(exception, DisallowedHost):
        return json_error(400, "bad_request", _("The request's host name is not allowed on this server."))
    if isinstance(exception, TooManyFieldsSent):
        return json_error(400, "too_many_fields", too_many_fields_message())
    return json_error(400)
