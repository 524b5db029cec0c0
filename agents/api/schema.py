"""The OpenAPI description of the API (drf-spectacular): the error shape, the bearer scheme, and the one
endpoint that is not a DRF view (the run's event stream, an async Django view)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.plumbing import build_bearer_security_scheme_object
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema_serializer
from rest_framework import serializers

from agents.api.config import api_setting
from agents.api.serializers import DATA_PART_HELP

SECURITY_SCHEME = "bearerAuth"


class ApiKeyAuthenticationScheme(OpenApiAuthenticationExtension):
    """``Authorization: Bearer <api key>`` (keys from ``manage.py create_api_key``)."""

    target_class = "agents.api.auth.ApiKeyAuthentication"
    name = SECURITY_SCHEME

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return build_bearer_security_scheme_object(  # type: ignore[no-any-return]
            header_name="Authorization",
            token_prefix="Bearer",  # noqa: S106 - the scheme name, not a secret
            bearer_format="apk_…",
        )


@extend_schema_serializer(component_name="ErrorDetail")
class ErrorDetailSerializer(serializers.Serializer):
    """What went wrong: a stable `code`, a `message` for people and, where there is more to say, `fields`."""

    code = serializers.CharField(help_text="Stable, for programs: e.g. invalid_input, agent_not_found, throttled.")
    message = serializers.CharField(help_text="For people.")

    def get_fields(self) -> dict[str, serializers.Field]:
        # A field named "fields" cannot be declared as a class attribute: it would hide Serializer.fields.
        declared = super().get_fields()
        declared["fields"] = serializers.DictField(
            required=False,
            help_text=(
                "Invalid input (`invalid_input`, `idempotency_key_reused` for a `messageId`): each offending field "
                "(or header, or query parameter) and its problems, nested as the body is. A budget's refusal "
                "(`budget_exceeded`, `budget_misconfigured`): `budget`, the budget's id (as in `GET /usage`), and "
                "for `budget_exceeded` `resets_at`, when its period ends (ISO 8601), and `reason`: `used_up` (the "
                "period's spend reached a limit: `Retry-After` until it ends), `less_than_a_run` (what is left is "
                "less than one run's reservation: `Retry-After` until it ends) or `runs_in_flight` (runs in flight "
                "hold what is left: `Retry-After` a few seconds)."
            ),
        )
        return declared


@extend_schema_serializer(component_name="Error")
class ErrorSerializer(serializers.Serializer):
    error = ErrorDetailSerializer()


ERROR_DESCRIPTIONS = {
    400: (
        "Invalid input: malformed JSON, a field of the wrong type, a missing or unknown field, or a query parameter "
        "the operation does not take (named in `fields`); or, on any operation, `bad_request`: a NUL character "
        "(`%00`) in the path or the query, or a `Content-Length` that is not a whole number; or "
        "`too_many_fields`: more than `DATA_UPLOAD_MAX_NUMBER_FIELDS` (1,000) query parameters or form fields."
    ),
    401: "No API key, a malformed `Authorization` header, or an unknown or revoked key.",
    403: "The key may not do this.",
    404: "No such agent, run or approval for this key (another caller's run is a 404 too).",
    405: "Method not allowed.",
    406: "The `Accept` header asks for a type the API does not answer (it answers `application/json`).",
    409: "Conflict with the current state (see `code`).",
    413: (
        "`query_too_long`: the run's `query` is longer than `PLATFORM_RUN_QUERY_MAX_CHARS`; or, on any operation "
        "(a `GET` with a body too), `body_too_large`: the body is larger than `PLATFORM_API_MAX_BODY_BYTES`."
    ),
    415: "The body is not `application/json`, or its `charset` is not UTF-8.",
    429: (
        "The key's rate limit is used up (`throttled`), or, submitting a run, a budget of the key or the agent "
        "(`budget_exceeded`; its `fields.reason` says whether the period's spend or the runs in flight leave no "
        "room): retry after `Retry-After` seconds."
    ),
    503: (
        "`unavailable`: the database cannot answer now (it is down or unreachable, or it ended the request's "
        "transaction to let another through: a deadlock, a serialization failure): retry after "
        "`Retry-After` seconds."
    ),
}

# The event stream's 429 has one more cause.
EVENTS_429 = (
    "The key's rate limit is used up (`throttled`), or the key already holds `PLATFORM_SSE_MAX_STREAMS_PER_KEY` "
    "streams open (`too_many_streams`, 5 by default): retry after `Retry-After` seconds."
)


def retry_after_header(description: str) -> dict[str, Any]:
    """A response's ``headers``: its required ``Retry-After`` (seconds), and what the wait is for."""
    return {"Retry-After": {"schema": {"type": "integer"}, "required": True, "description": description}}


RETRY_AFTER = OpenApiParameter(
    "Retry-After",
    int,
    OpenApiParameter.HEADER,
    response=[429],
    required=True,
    description="Seconds until the key may send another request.",
)


def error_responses(*statuses: int, conflicts: str = "") -> dict[int, OpenApiResponse]:
    """The documented error responses of an operation, all in the one error shape."""
    described = dict(ERROR_DESCRIPTIONS)
    if conflicts:
        described[409] = conflicts
    return {status: OpenApiResponse(ErrorSerializer, description=described[status]) for status in statuses}


EVENTS_DESCRIPTION = """Server-sent events (`text/event-stream`): the run's events from the start (or after
`Last-Event-ID` / `?after=`), then new ones as the worker writes them, until the run has finished; then a
final `event: end` (`data: {"status": ...}`) and the stream closes. Each event is `id: <seq>`,
`event: <kind>` (`status`, `rule`, `deterministic_result`, `model_turn`, `tool_call`, `tool_selection`,
`parallel_calls`, `approval`, `flow_node`) and
`data: <JSON>`. A stream whose key is revoked, or may no longer read the run (taken off its agent, or the agent
disabled), ends with `event: error` (`data:` the error body, code `authentication_failed` or `run_not_found`)
and closes. A comment line (`: keep-alive`) is sent after `PLATFORM_SSE_KEEPALIVE_S` seconds (4 by default)
without events. A stream stays open at most `PLATFORM_SSE_MAX_S` seconds (600 by default) and then closes
without `end`: reconnect with `Last-Event-ID` (an `EventSource` does so by itself) to go on where it stopped."""


# Request bodies whose serializers refuse undeclared keys (``StrictSerializer``): said so in the schema, so that
# clients and fuzzers know an extra key is a 400.
STRICT_REQUEST_COMPONENTS = (
    "RunCreateRequest",
    "A2AMessage",
    "A2ATextPart",
    "A2ADataPart",
    "A2AFilePart",
    "A2AFile",
    "ApprovalDecision",
    "RunFeedback",
)


def forbid_unknown_request_fields(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """Postprocessing hook: ``additionalProperties: false`` on the request bodies that refuse unknown keys, and
    ``POST /runs``'s exactly one of ``query`` and ``message``, the latter without ``data`` and ``files`` (the
    serializer's ``validate``, which drf-spectacular cannot read). The last hook of ``SPECTACULAR_SETTINGS``, it
    runs the ones below too: the A2A 1.0 parts, and the statuses every operation may answer."""
    schemas = result.get("components", {}).get("schemas", {})
    for name in STRICT_REQUEST_COMPONENTS:
        if name in schemas:
            schemas[name]["additionalProperties"] = False
    if "RunCreateRequest" in schemas:
        # With ``message``, its data and files are parts of it: ``data`` and ``files`` beside it are refused (even
        # empty), so that branch says so too.
        schemas["RunCreateRequest"]["oneOf"] = [
            {"required": ["query"]},
            {"required": ["message"], "not": {"anyOf": [{"required": ["data"]}, {"required": ["files"]}]}},
        ]
    result = describe_a2a_1_0_parts(result, generator, request, public)
    result = declare_setting_limits(result, generator, request, public)
    return document_shared_statuses(result, generator, request, public)


def declare_setting_limits(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """Postprocessing hook: the limits that are settings, as this deployment has them (a decorator's schema is
    fixed at import): ``?wait``'s maximum, ``PLATFORM_API_MAX_WAIT_S``."""
    post = result.get("paths", {}).get("/api/v1/runs", {}).get("post", {})
    for parameter in post.get("parameters", []):
        if parameter.get("in") == "query" and parameter.get("name") == "wait":
            parameter["schema"]["maximum"] = float(api_setting("PLATFORM_API_MAX_WAIT_S"))
    return result


def add_run_events_path(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """Postprocessing hook: describe ``GET /api/v1/runs/{run_id}/events`` (an async Django view, which
    drf-spectacular does not see) with its parameters, its stream and its errors."""
    error_ref = {"$ref": "#/components/schemas/Error"}

    def error(status: int) -> dict[str, Any]:
        response: dict[str, Any] = {
            "description": ERROR_DESCRIPTIONS[status],
            "content": {"application/json": {"schema": error_ref}},
        }
        if status == 429:
            response["description"] = EVENTS_429
            response["headers"] = retry_after_header("Seconds until the key may send another request.")
        return response

    result.setdefault("paths", {})["/api/v1/runs/{run_id}/events"] = {
        "get": {
            "operationId": "runs_events_retrieve",
            "summary": "Follow a run's events (server-sent events)",
            "description": EVENTS_DESCRIPTION,
            "tags": ["runs"],
            "security": [{SECURITY_SCHEME: []}],
            "parameters": [
                {"name": "run_id", "in": "path", "required": True, "schema": {"type": "string"}},
                {
                    "name": "after",
                    "in": "query",
                    "required": False,
                    "schema": {"type": "integer", "minimum": 0},
                    "description": "Send only the events numbered after this one.",
                },
                {
                    "name": "Last-Event-ID",
                    "in": "header",
                    "required": False,
                    "schema": {"type": "string", "pattern": "^[0-9]+$"},
                    "description": "As `after`; sent by an `EventSource` when it reconnects. Wins over `after`.",
                },
            ],
            "responses": {
                "200": {
                    "description": "The event stream.",
                    "content": {"text/event-stream": {"schema": {"type": "string"}}},
                },
                **{str(status): error(status) for status in (400, 401, 404, 405, 429)},
            },
        }
    }
    return result


def _metadata() -> dict[str, Any]:
    return {"type": "object", "additionalProperties": {}, "nullable": True}


def _file_naming(kept: bool) -> dict[str, Any]:
    """``filename`` and ``mediaType``, which every A2A 1.0 part may carry (kept only with a file)."""
    note = "" if kept else "Accepted and not kept (a text or data part is no file)."
    return {
        name: {"type": "string", "maxLength": 255, "nullable": True, **({"description": note} if note else {})}
        for name in ("filename", "mediaType")
    }


# A2A 1.0 parts (no ``kind``: the member present says what the part is), which ``POST /runs`` takes as well as the
# kind-shaped 0.3 ones (``agents.api.serializers.kind_shaped_part``). Strict, as the 0.3 forms are.
A2A_1_0_PARTS: dict[str, dict[str, Any]] = {
    "A2ATextPartV1": {
        "type": "object",
        "description": "An A2A 1.0 text part: joined with the other text parts, the query.",
        "properties": {"text": {"type": "string"}, **_file_naming(kept=False), "metadata": _metadata()},
        "required": ["text"],
        "additionalProperties": False,
    },
    "A2ADataPartV1": {
        "type": "object",
        "description": "An A2A 1.0 data part: one entry of the run's a2a_data.",
        "properties": {
            "data": {"description": DATA_PART_HELP},
            **_file_naming(kept=False),
            "metadata": _metadata(),
        },
        "required": ["data"],
        "additionalProperties": False,
    },
    "A2AUrlPartV1": {
        "type": "object",
        "description": "An A2A 1.0 file part by URL (kept with the run).",
        "properties": {
            "url": {"type": "string", "maxLength": 2048},
            **_file_naming(kept=True),
            "metadata": _metadata(),
        },
        "required": ["url"],
        "additionalProperties": False,
    },
    "A2ARawPartV1": {
        "type": "object",
        "description": "An A2A 1.0 file part with base64 content: counted (size), never stored.",
        "properties": {
            "raw": {"type": "string"},
            **_file_naming(kept=True),
            "metadata": _metadata(),
        },
        "required": ["raw"],
        "additionalProperties": False,
    },
}

# Answered by DRF itself on every operation it serves (and written in the error shape by the exception handler).
DRF_STATUSES = (405, 406)
# Answered on every operation, the event stream's too: before any view, by the body limit
# (``agent_platform.body_limit``: a NUL in the path or query, a body over the limit, whatever the method), and
# when the database cannot answer (``agents.api.errors.exception_handler``, ``agents.api.events.run_events``).
SHARED_STATUSES = (400, 413, 503)


def describe_a2a_1_0_parts(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """Postprocessing hook: a message's part is an A2A 0.3 part (``A2APart``, by ``kind``) or an A2A 1.0 part (by
    its member, no ``kind``): ``A2AMessagePart``. Each alternative refuses the others' members
    (``additionalProperties: false``), so that exactly one matches."""
    schemas = result.get("components", {}).get("schemas", {})
    parts = schemas.get("A2AMessage", {}).get("properties", {}).get("parts")
    if parts is None or "A2APart" not in schemas:
        return result
    schemas.update(A2A_1_0_PARTS)
    schemas["A2AMessagePart"] = {
        "description": "An A2A 0.3 part (with `kind`) or an A2A 1.0 part (`text`, `data`, `url` or `raw`).",
        "oneOf": [{"$ref": f"#/components/schemas/{name}"} for name in ("A2APart", *A2A_1_0_PARTS)],
    }
    parts["items"] = {"$ref": "#/components/schemas/A2AMessagePart"}
    return result


def document_shared_statuses(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """Postprocessing hook: the statuses an operation answers whatever it is, on every operation: 400, 413 and 503
    (``SHARED_STATUSES``; a 503 with its ``Retry-After``), and on those DRF serves 405 and 406 (another method, an
    ``Accept`` the API does not answer; the event stream, added by ``add_run_events_path``, has its own 405 and
    answers no 406). Where an operation describes one of them itself, its description is kept."""
    error_ref = {"$ref": "#/components/schemas/Error"}
    for path, operations in result.get("paths", {}).items():
        statuses = SHARED_STATUSES if path == "/api/v1/runs/{run_id}/events" else (*SHARED_STATUSES, *DRF_STATUSES)
        for operation in operations.values():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            for status in statuses:
                response: dict[str, Any] = {
                    "description": ERROR_DESCRIPTIONS[status],
                    "content": {"application/json": {"schema": error_ref}},
                }
                if status == 503:
                    response["headers"] = retry_after_header("Seconds to wait before sending the request again.")
                operation["responses"].setdefault(str(status), response)
    return result
