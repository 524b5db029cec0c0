"""The OpenAPI schema (drf-spectacular) at /api/v1/schema/ and its Swagger UI at /api/v1/docs/, served from the
package's own static files (no CDN); and schemathesis against a running server: no 500, no response outside
the schema."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from django.conf import settings
from django.contrib.staticfiles import finders
from drf_spectacular.validation import validate_schema
from rest_framework.test import APIClient

from tests.api.test_events_stream import asgi_platform

pytestmark = pytest.mark.django_db

ERRORS = {
    ("/api/v1/runs", "post"): {"400", "401", "404", "409", "413", "415", "429"},
    ("/api/v1/runs", "get"): {"400", "401", "429"},
    ("/api/v1/runs/{run_id}", "get"): {"401", "404", "429"},
    ("/api/v1/runs/{run_id}/cancel", "post"): {"401", "404", "409", "429"},
    ("/api/v1/runs/{run_id}/approvals/{approval_id}", "post"): {"400", "401", "404", "409", "415", "429"},
    ("/api/v1/runs/{run_id}/events", "get"): {"400", "401", "404", "405", "429"},
    ("/api/v1/usage", "get"): {"401", "429"},
    ("/api/v1/runs/{run_id}/feedback", "post"): {"400", "401", "404", "409", "415", "429"},
}


@pytest.fixture(autouse=True)
def _the_api_settings_are_merged(request) -> None:  # type: ignore[no-untyped-def]
    if "tmp_path" in request.fixturenames:
        return  # the schemathesis test's server reads its settings on its own
    assert "drf_spectacular" in settings.INSTALLED_APPS, (
        "agent_platform/settings.py must merge agent_platform/settings_api.py (its docstring has the two lines)"
    )


@pytest.fixture
def schema() -> dict:
    response = APIClient().get("/api/v1/schema/?format=json")
    assert response.status_code == 200, response.content
    return response.json()


def test_the_schema_is_served_without_a_key_and_is_valid_openapi(schema) -> None:
    validate_schema(schema)
    assert schema["openapi"].startswith("3.")
    assert schema["info"]["title"] == "Agent platform API"


def test_the_schema_is_also_served_as_yaml() -> None:
    response = APIClient().get("/api/v1/schema/")
    assert response.status_code == 200
    assert response.content.startswith(b"openapi: 3.")


def test_every_endpoint_and_method_is_documented(schema) -> None:
    documented = {(path, method) for path, item in schema["paths"].items() for method in item}
    assert documented == set(ERRORS)


def test_every_operation_documents_its_errors_in_the_error_shape(schema) -> None:
    for (path, method), codes in ERRORS.items():
        responses = schema["paths"][path][method]["responses"]
        assert codes <= set(responses), (path, method, set(responses))
        for code in codes:
            content = responses[code]["content"]["application/json"]["schema"]
            assert content == {"$ref": "#/components/schemas/Error"}, (path, method, code)
    error = schema["components"]["schemas"]["Error"]
    assert error["required"] == ["error"]
    detail = schema["components"]["schemas"]["ErrorDetail"]
    assert set(detail["properties"]) == {"code", "message", "fields"}
    assert set(detail["required"]) == {"code", "message"}


def test_a_429_says_when_to_retry(schema) -> None:
    for path, method in ERRORS:
        headers = schema["paths"][path][method]["responses"]["429"]["headers"]
        assert headers["Retry-After"]["schema"]["type"] == "integer", (path, method)


def test_every_operation_needs_the_bearer_key(schema) -> None:
    assert schema["components"]["securitySchemes"]["bearerAuth"] == {
        "type": "http",
        "scheme": "bearer",
        "bearerFormat": "apk_…",
    }
    for path, method in ERRORS:
        assert schema["paths"][path][method]["security"] == [{"bearerAuth": []}], (path, method)


def test_the_submission_documents_both_shapes_its_header_and_its_answers(schema) -> None:
    post = schema["paths"]["/api/v1/runs"]["post"]
    body = post["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/RunCreateRequest"}
    components = schema["components"]["schemas"]
    request = components["RunCreateRequest"]
    assert set(request["properties"]) == {"agent", "query", "message", "context", "data", "files"}
    assert request["required"] == ["agent"]
    assert request["additionalProperties"] is False
    part = components["A2APart"]
    assert part["discriminator"]["propertyName"] == "kind"
    assert set(part["discriminator"]["mapping"]) == {"text", "data", "file"}
    assert set(components["A2AFile"]["properties"]) == {"name", "mimeType", "uri", "bytes"}
    parameters = {(p["in"], p["name"]) for p in post["parameters"]}
    assert {("header", "Idempotency-Key"), ("query", "wait")} <= parameters
    assert post["responses"]["202"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Run"}
    assert post["responses"]["200"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Run"}


def test_the_run_and_its_list_are_described_precisely(schema) -> None:
    components = schema["components"]["schemas"]
    run = components["Run"]["properties"]
    assert run["tool_calls"]["items"] == {"$ref": "#/components/schemas/ToolCall"}
    assert run["approvals"]["items"] == {"$ref": "#/components/schemas/Approval"}
    assert run["error"]["nullable"] is True
    assert set(components["RunStatusEnum"]["enum"]) == {
        "queued",
        "running",
        "succeeded",
        "failed",
        "awaiting_approval",
        "cancelled",
    }
    listing = schema["paths"]["/api/v1/runs"]["get"]
    assert {p["name"] for p in listing["parameters"] if p["in"] == "query"} == {
        "agent",
        "status",
        "page_size",
        "cursor",
    }
    page = components["RunPage"]["properties"]
    assert page["results"]["items"] == {"$ref": "#/components/schemas/RunSummary"}


def test_the_event_stream_is_documented_as_text_event_stream(schema) -> None:
    events = schema["paths"]["/api/v1/runs/{run_id}/events"]["get"]
    assert set(events["responses"]["200"]["content"]) == {"text/event-stream"}
    assert {(p["in"], p["name"]) for p in events["parameters"]} == {
        ("path", "run_id"),
        ("query", "after"),
        ("header", "Last-Event-ID"),
    }


def test_the_docs_page_loads_swagger_ui_from_our_static_files_not_a_cdn() -> None:
    response = APIClient().get("/api/v1/docs/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "/api/v1/schema/" in html
    linked = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert linked, html
    assert not [url for url in linked if re.match(r"(https?:)?//", url)], linked
    static = [url for url in linked if url.startswith(settings.STATIC_URL) or url.startswith("/" + settings.STATIC_URL)]
    assert any(url.endswith("swagger-ui-bundle.js") for url in static), static
    for url in static:
        relative = url.split(settings.STATIC_URL, 1)[1]
        assert finders.find(relative), f"{relative} is not among the static files"


# --- schemathesis against a running server -------------------------------------------------------------------


@pytest.mark.e2e
def test_schemathesis_finds_no_server_error_and_no_response_outside_the_schema(tmp_path: Path) -> None:
    with asgi_platform(
        tmp_path,
        collect_static=True,
        # Fuzzing must not be throttled, nor wait up to a minute for runs no worker executes.
        PLATFORM_API_RATE="100000/min",
        PLATFORM_API_MAX_WAIT_S="1",
    ) as platform:
        done = subprocess.run(
            [
                *(sys.executable, "-m", "schemathesis.cli", "run", f"{platform.base_url}/api/v1/schema/?format=json"),
                *("--url", platform.base_url, "--header", f"Authorization: Bearer {platform.api_key}"),
                "--checks=not_a_server_error,status_code_conformance,content_type_conformance,"
                "response_headers_conformance,response_schema_conformance",
                *("--include-path-regex", "^/api/v1/runs", "--exclude-path-regex", "/events$"),
                *("--max-examples", "25", "--seed", "7", "--workers", "1", "--request-timeout", "15"),
                *("--phases", "examples,coverage,fuzzing,stateful", "--suppress-health-check", "all"),
            ],
            cwd=tmp_path,
            env=platform.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        output = done.stdout + done.stderr
        assert done.returncode == 0, output[-6000:]
        assert re.search(r"\d+ passed", output), output[-3000:]
        assert "failed" not in output.split("SUMMARY")[-1].lower(), output[-3000:]

        # The docs page works offline on the production server: the UI's files come from our static files.
        docs = httpx.get(f"{platform.base_url}/api/v1/docs/", timeout=10)
        assert docs.status_code == 200
        for url in re.findall(r'(?:src|href)="(/static/[^"]+)"', docs.text):
            served = httpx.get(f"{platform.base_url}{url}", timeout=10)
            assert served.status_code == 200, url


def test_a_decision_the_caller_may_not_take_is_a_documented_403(schema) -> None:
    # approval_needs_reviewer: the caller approving a write the model asked for, where the agent does not allow it.
    decide = next(
        operation
        for path in schema["paths"].values()
        for operation in path.values()
        if isinstance(operation, dict) and operation.get("operationId") == "runs_approvals_decide"
    )
    assert "403" in decide["responses"]
