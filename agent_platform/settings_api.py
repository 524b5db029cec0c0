"""Settings of the REST API's extras: the OpenAPI schema and its docs (drf-spectacular, offline UI), per-key
throttling and the run event stream. Merged into ``agent_platform.settings`` by two lines at its end (after
``INSTALLED_APPS`` and ``REST_FRAMEWORK``; the blank line keeps ruff's import sorting content):

    from agent_platform.settings_api import *  # noqa: E402, F403

    INSTALLED_APPS, REST_FRAMEWORK = [*INSTALLED_APPS, *API_APPS], {**REST_FRAMEWORK, **API_REST_FRAMEWORK}  # noqa: F405

The code reads each ``PLATFORM_*`` value through ``django.conf.settings`` only
(``agents.api.config.api_setting``): a settings module must merge this one (the schema and its docs need the
merge too: the apps and ``DEFAULT_SCHEMA_CLASS``).
"""

from __future__ import annotations

import os

from agent_platform.settings_deploy import _env_float, _env_int

__all__ = [
    "API_APPS",
    "API_REST_FRAMEWORK",
    "PLATFORM_API_BAD_KEY_RATE",
    "PLATFORM_API_MAX_BODY_BYTES",
    "PLATFORM_API_MAX_JSON_DEPTH",
    "PLATFORM_API_MAX_JSON_ITEMS",
    "PLATFORM_API_MAX_WAIT_S",
    "PLATFORM_API_RATE",
    "PLATFORM_SSE_AUTH_RECHECK_S",
    "PLATFORM_SSE_KEEPALIVE_S",
    "PLATFORM_SSE_MAX_S",
    "PLATFORM_SSE_MAX_STREAMS_PER_KEY",
    "PLATFORM_SSE_POLL_S",
    "SPECTACULAR_SETTINGS",
]

# drf_spectacular: the schema view and the docs templates; the sidecar: Swagger UI and Redoc as static files
# (no CDN: the docs must work on a machine without internet access).
API_APPS = ["drf_spectacular", "drf_spectacular_sidecar"]

API_REST_FRAMEWORK = {
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    # Per API key (a key's own ``rate``, else PLATFORM_API_RATE); requests without an API key are not counted.
    "DEFAULT_THROTTLE_CLASSES": ["agents.api.throttling.ApiKeyRateThrottle"],
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Agent platform API",
    "DESCRIPTION": (
        "Submit queries to agents, follow their runs, decide pending approvals. Every error is "
        '`{"error": {"code", "message", "fields"?}}`. Authenticate with `Authorization: Bearer <api key>`.'
    ),
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SCHEMA_PATH_PREFIX": r"/api/v1",
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "SWAGGER_UI_SETTINGS": {"persistAuthorization": True},
    "ENUM_NAME_OVERRIDES": {
        "RunStatusEnum": "agents.models.Run.Status",
        "ApprovalStatusEnum": "agents.models.Approval.Status",
    },
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "agents.api.schema.add_run_events_path",
        "agents.api.schema.forbid_unknown_request_fields",
    ],
}

# Requests per period for an API key whose own rate is empty: N/s, N/min, N/hour or N/day.
PLATFORM_API_RATE = os.environ.get("PLATFORM_API_RATE", "120/min")
# A request body under /api/ larger than this is refused with a 413 before anything reads it
# (agent_platform/body_limit.py), and counted again while the parser reads it (agents/api/parsers.py).
PLATFORM_API_MAX_BODY_BYTES = _env_int("PLATFORM_API_MAX_BODY_BYTES", 2 * 1024 * 1024, at_least=1)
# JSON nested deeper than this (arrays and objects) is a 400 invalid_json.
PLATFORM_API_MAX_JSON_DEPTH = _env_int("PLATFORM_API_MAX_JSON_DEPTH", 32, at_least=1)
# JSON with more values than this (arrays, objects and their elements: agents/api/parsers.py counts them) is a 400
# too_many_json_values on the REST API, a parse error on A2A and MCP: a body of many tiny values within the byte
# limit cost seconds of web CPU (parsing, masking, normalizing).
PLATFORM_API_MAX_JSON_ITEMS = _env_int("PLATFORM_API_MAX_JSON_ITEMS", 10_000, at_least=1)
# Requests with an unknown or revoked API key, per client IP: past this, every request from that IP is a 429
# (with Retry-After) until the window ends, whatever key it carries.
PLATFORM_API_BAD_KEY_RATE = os.environ.get("PLATFORM_API_BAD_KEY_RATE", "20/15min")
# POST /api/v1/runs?wait=N: the longest N allowed.
PLATFORM_API_MAX_WAIT_S = _env_float("PLATFORM_API_MAX_WAIT_S", 60.0, at_least=0)
# GET /api/v1/runs/{id}/events: how often new events are looked for, a keep-alive comment after this much
# silence (4 s: under httpx's default 5 s read timeout, which the A2A and MCP SDK clients keep unless told
# otherwise: a stream waiting on a slow model step read as a timeout), and the longest a stream stays open (the
# client reconnects with Last-Event-ID).
PLATFORM_SSE_POLL_S = _env_float("PLATFORM_SSE_POLL_S", 0.5, above=0)
# A keep-alive of 0 or less: one at every poll that finds nothing to send.
PLATFORM_SSE_KEEPALIVE_S = _env_float("PLATFORM_SSE_KEEPALIVE_S", 4.0)
PLATFORM_SSE_MAX_S = _env_float("PLATFORM_SSE_MAX_S", 600.0, above=0)
# An open stream checks its API key again this often (at most 15 s) and closes once the key is revoked.
PLATFORM_SSE_AUTH_RECHECK_S = min(15.0, _env_float("PLATFORM_SSE_AUTH_RECHECK_S", 10.0, above=0))
# Streams one API key may hold open at once (across every web process: slots in the cache); one more is a 429.
PLATFORM_SSE_MAX_STREAMS_PER_KEY = _env_int("PLATFORM_SSE_MAX_STREAMS_PER_KEY", 5, at_least=1)
