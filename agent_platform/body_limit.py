"""Request bodies are bounded before anything reads them, and every error under ``/api/`` is JSON.

Two layers, because the servers differ in when they read a body:

- ``BodyLimitASGIMiddleware`` wraps the ASGI application (``agent_platform/asgi.py``; uvicorn, gunicorn's
  uvicorn workers). Django's ASGI handler reads a whole body into a file before any middleware or view runs, so
  the limit must sit in front of it: a declared ``Content-Length`` over the limit is answered ``413`` at once,
  without reading a byte; a body sent without one (chunked) is counted as it arrives and answered ``413`` the
  moment it passes the limit. What it lets through it hands on unchanged (buffered: at most the limit), a body
  sent without a ``Content-Length`` with one added that gives its buffered size: Django's ASGI handler and DRF
  read a request without one as having no body (DRF's ``Request._load_stream``), so a chunked ``POST /runs`` was
  a ``400 agent: This field is required``.
- ``BodyLimitMiddleware`` is the first Django middleware (WSGI: ``runserver``, gunicorn's sync workers, the
  test client): a ``Content-Length`` over the limit is a ``413`` before sessions, CSRF or authentication read
  the body. It also refuses (``400 bad_request``) a path or query string on an API path that holds a NUL
  character (``%00``): no database stores one (PostgreSQL raises), so no view should have to look for it; and
  (``415 unsupported_media_type``) a ``Content-Type`` on an API path longer than DRF reads (it refuses one, and
  its message repeated the whole header), saying its first 100 characters.
  Under WSGI Django reads no more than ``Content-Length`` (its ``LimitedStream``), and the API's parser
  (``agents/api/parsers.py``) counts what it reads, too. A chunked body (no ``Content-Length``; gunicorn's
  workers decode the chunks and mark the input ``wsgi.input_terminated``) would be read as empty: it is read
  here, up to the limit (``413`` past it), and handed on with the ``Content-Length`` it turned out to have.

The API's paths (:func:`is_api_path`) are the REST API under ``/api/`` and the machine protocols beside it: A2A
(``/a2a/``, the agent cards under ``/.well-known/``) and MCP (``/mcp``). Their limit is
``PLATFORM_API_MAX_BODY_BYTES``; elsewhere (the admin) it is ``PLATFORM_MAX_BODY_BYTES``.

``ApiErrorShapeMiddleware`` is the outermost Django middleware: any error response on an API path that is not
JSON (Django's own 400/403/404/405/413 pages, a CSRF failure, anything a future view forgets) is replaced by the
API's ``{"error": {"code", "message"}}`` with the same status and headers that matter (``Allow``,
``Retry-After``, ``WWW-Authenticate``).
"""

from __future__ import annotations

import io
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import unquote

from django.conf import settings
from django.http import HttpRequest, HttpResponseBase, JsonResponse
from django.utils import translation
from django.utils.translation import gettext as _
from django.utils.translation import trans_real

from audit.visible import visible_text

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
AsgiApp = Callable[[Scope, Receive, Send], Awaitable[None]]

API_PREFIXES = ("/api/", "/a2a/", "/mcp/", "/.well-known/")
# The longest Content-Type DRF reads (``DefaultContentNegotiation.max_media_type_length``), and how much of a longer
# one an answer repeats.
CONTENT_TYPE_MAX_CHARS = 256
SHOWN_MAX_CHARS = 100
_KEPT_HEADERS = ("Allow", "Retry-After", "WWW-Authenticate")
_CODES = {
    400: "bad_request",
    401: "not_authenticated",
    403: "permission_denied",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    408: "request_timeout",
    411: "length_required",
    413: "body_too_large",
    414: "uri_too_long",
    415: "unsupported_media_type",
    429: "throttled",
}


def is_api_path(path: str) -> bool:
    """Whether ``path`` is one of the API's (its callers are programs: every answer there is JSON)."""
    return path.startswith(API_PREFIXES) or path == "/mcp"


def json_error(status: int, code: str | None = None, message: str | None = None) -> JsonResponse:
    """The API's error response (:func:`error_json`), Korean text kept as it is."""
    return JsonResponse(error_json(status, code, message), status=status, json_dumps_params={"ensure_ascii": False})


def body_limit_for(path: str) -> int:
    """The most bytes a request body to ``path`` may have."""
    if is_api_path(path):
        return int(settings.PLATFORM_API_MAX_BODY_BYTES)
    return int(settings.PLATFORM_MAX_BODY_BYTES)


def error_json(status: int, code: str | None = None, message: str | None = None) -> dict[str, Any]:
    """The API's error body for ``status`` (a generic message where none is given)."""
    return {
        "error": {
            "code": code or _CODES.get(status, "server_error" if status >= 500 else "error"),
            "message": message or _("The request failed (HTTP %(status)d).") % {"status": status},
        }
    }


def _too_large_message(limit: int) -> str:
    return _("The body is larger than %(max)d bytes.") % {"max": limit}


def _language_of(accept_language: str) -> str:
    """The language ``Accept-Language`` asks for among ours (Django's choice without the session, cookie and
    path, which nothing before ``LocaleMiddleware`` has), else the default."""
    for code, _quality in trans_real.parse_accept_lang_header(accept_language[:255]):
        if code == "*":
            break
        try:
            return translation.get_supported_language_variant(code)
        except LookupError:
            continue
    return str(settings.LANGUAGE_CODE)


def _declared_length(value: str | bytes | None) -> int | None:
    """``Content-Length`` as a number; None when absent; -1 when malformed (refused as a 400)."""
    if value is None:
        return None
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    text = text.strip()
    return int(text) if text.isdigit() and text.isascii() else -1


class BodyLimitASGIMiddleware:
    """Wraps an ASGI application; see the module docstring."""

    def __init__(self, app: AsgiApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = body_limit_for(scope.get("path", ""))
        headers = dict(scope.get("headers") or [])
        declared = _declared_length(headers.get(b"content-length"))

        async def refuse(status: int, code: str, message: Callable[[], str]) -> None:
            # In the caller's language, chosen only for a refusal (nothing is chosen for a request that goes on).
            with translation.override(_language_of(headers.get(b"accept-language", b"").decode("latin-1"))):
                await _send_json(send, status, error_json(status, code, message()))

        if declared == -1:
            await refuse(400, "bad_request", lambda: _("Content-Length must be a whole number."))
            return
        if declared is not None and declared > limit:
            await refuse(413, "body_too_large", lambda: _too_large_message(limit))
            return
        buffered: list[Message] = []
        size = 0
        while True:
            message = await receive()
            buffered.append(message)
            if message["type"] != "http.request":
                break  # http.disconnect: Django sees it and stops
            size += len(message.get("body", b""))
            if size > limit:
                await refuse(413, "body_too_large", lambda: _too_large_message(limit))
                return
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            return buffered.pop(0) if buffered else await receive()

        if declared is None and size:
            # Sent without a length (chunked): the application is told the size it turned out to have.
            kept = [(name, value) for name, value in scope.get("headers") or [] if name != b"content-length"]
            scope = {**scope, "headers": [*kept, (b"content-length", str(size).encode())]}
        await self.app(scope, replay, send)


async def _send_json(send: Send, status: int, body: dict[str, Any]) -> None:
    payload = json.dumps(body, ensure_ascii=False).encode("utf-8")
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})


class BodyLimitMiddleware:
    """Django middleware: a declared body over the limit is a ``413`` before anything reads it."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        return self._refusal(request) or self.get_response(request)

    @staticmethod
    def _refusal(request: HttpRequest) -> JsonResponse | None:
        """The error response for a request refused here, in the caller's language (this runs before
        ``LocaleMiddleware`` chooses it); None for one that may go on. A chunked body under WSGI is read here
        (:func:`_chunked_body_read`)."""
        limit = body_limit_for(request.path)
        declared = _declared_length(request.META.get("CONTENT_LENGTH") or None)
        too_large = declared is not None and declared > limit
        if declared is None:
            too_large = not _chunked_body_read(request, limit)
        nul = is_api_path(request.path) and (
            "\x00" in request.path or "\x00" in unquote(request.META.get("QUERY_STRING", ""))
        )
        content_type = str(request.META.get("CONTENT_TYPE", ""))
        has_body = bool(_declared_length(request.META.get("CONTENT_LENGTH") or None))  # a chunked one read above
        long_type = is_api_path(request.path) and len(content_type) > CONTENT_TYPE_MAX_CHARS and has_body
        if declared != -1 and not too_large and not nul and not long_type:
            return None
        with translation.override(_language_of(request.META.get("HTTP_ACCEPT_LANGUAGE", ""))):
            if declared == -1:
                return json_error(400, "bad_request", _("Content-Length must be a whole number."))
            if nul:
                return json_error(400, "bad_request", _("The path and the query may not contain NUL characters."))
            if long_type:
                shown = visible_text(content_type[:SHOWN_MAX_CHARS]) + "…"
                return json_error(
                    415,
                    "unsupported_media_type",
                    _("Unsupported media type %(media_type)s: send application/json.") % {"media_type": shown},
                )
            response = json_error(413, "body_too_large", _too_large_message(limit))
            response["Connection"] = "close"
            return response


def _chunked_body_read(request: HttpRequest, limit: int) -> bool:
    """Under a WSGI server that decodes a chunked body and says so (``wsgi.input_terminated``: gunicorn), read a
    body sent without ``Content-Length`` (at most ``limit`` + 1 bytes) and hand it on as one that has it: Django
    reads such a request as having no body. Returns False for a body over ``limit`` (a ``413``); True otherwise,
    also where there was nothing to read this way (ASGI: its wrapper has added the length)."""
    environ = getattr(request, "environ", None)
    chunked = "chunked" in str(request.META.get("HTTP_TRANSFER_ENCODING", "")).lower()
    if not chunked or not isinstance(environ, dict) or not environ.get("wsgi.input_terminated"):
        return True
    stream = environ["wsgi.input"]
    chunks: list[bytes] = []
    size = 0
    while chunk := stream.read(min(64 * 1024, limit + 1 - size) or 1):
        size += len(chunk)
        if size > limit:
            return False
        chunks.append(chunk)
    body = b"".join(chunks)
    request.META["CONTENT_LENGTH"] = str(len(body))
    # Django made the request's stream ``LimitedStream(wsgi.input, 0)``: the body read is its stream now (as
    # ``HttpRequest.body`` does once it has read one).
    request._stream = io.BytesIO(body)
    return True


class ApiErrorShapeMiddleware:
    """Django middleware: error responses under ``/api/`` are always the API's JSON; see the module docstring."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        response = self.get_response(request)
        if not is_api_path(request.path) or response.status_code < 400:
            return response
        if response.get("Content-Type", "").split(";")[0].strip() == "application/json":
            return response
        shaped = json_error(response.status_code)
        for name in _KEPT_HEADERS:
            if name in response:
                shaped[name] = response[name]
        return shaped
