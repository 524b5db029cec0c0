"""No 500s, and only JSON errors: bounded JSON (depth, size, numbers, text), bodies bounded before anything reads
them (Django middleware under WSGI, the ASGI wrapper in front of Django's handler), and a fuzzing pass of well
over 150 hostile requests across the API that must bring no 5xx and nothing but JSON."""

from __future__ import annotations

import base64
import io
import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.test import Client

from agent_platform.body_limit import BodyLimitASGIMiddleware
from agents.api.parsers import json_depth, json_parse_bounded
from agents.models import Run
from agents.services import api_key_create, api_key_revoke
from tests.conftest import AUDITOR_PASSWORD

pytestmark = pytest.mark.django_db

RUNS = "/api/v1/runs"


def post_raw(client: Client, body: bytes | str, *, key: str, content_type: str = "application/json", **extra: Any):  # type: ignore[no-untyped-def]
    return client.generic("POST", RUNS, body, content_type=content_type, HTTP_AUTHORIZATION=f"Bearer {key}", **extra)


@pytest.fixture
def raw_client() -> Client:
    """A client that returns a 500 as a response instead of raising: the fuzzing counts them."""
    return Client(raise_request_exception=False)


@pytest.fixture
def key(api_caller, settings) -> str:  # type: ignore[no-untyped-def]
    settings.PLATFORM_API_RATE = "100000/min"  # the fuzzing is not about the rate limit
    return str(api_caller.raw_key)


# --- the parser ------------------------------------------------------------------------------------------


def test_depth_counts_only_brackets_outside_strings() -> None:
    assert json_depth('{"a": [1, {"b": "[[[{{{"}]}') == 3
    assert json_depth("[]") == 1
    assert json_depth('"[[["') == 0
    assert json_depth('"unterminated [[[') == 0


@pytest.mark.parametrize("depth", [33, 900, 1000, 100_000])
def test_json_nested_past_the_limit_is_a_400_invalid_json_not_a_recursion_error(raw_client, key, depth) -> None:
    response = post_raw(raw_client, "[" * depth + "]" * depth, key=key)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_json"


def test_json_nested_within_the_limit_reaches_the_serializer(raw_client, key, demo_agent) -> None:
    nested: Any = "leaf"
    for _level in range(30):
        nested = {"n": nested}
    response = post_raw(
        raw_client, json.dumps({"agent": "company-assistant", "query": "q", "context": nested}), key=key
    )
    assert response.status_code == 202, response.content


@pytest.mark.parametrize("number", ["1e999", "-1e999", "NaN", "Infinity", "-Infinity", "9" * 30, "-" + "9" * 5000])
def test_numbers_no_database_can_hold_are_refused(raw_client, key, number) -> None:
    body = '{"agent": "company-assistant", "query": "q", "context": {"n": VALUE}}'.replace("VALUE", number)
    response = post_raw(raw_client, body, key=key)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_json"


@pytest.mark.parametrize("text", ['"a\\u0000b"', '"\\ud800"', '"\\udfff tail"'])
def test_text_with_nul_or_unpaired_surrogates_is_refused(raw_client, key, text) -> None:
    for body in (
        '{"agent": "x", "query": VALUE}'.replace("VALUE", text),
        '{"agent": "x", "query": "q", "context": {VALUE: 1}}'.replace("VALUE", text),
    ):
        response = post_raw(raw_client, body, key=key)
        assert response.status_code == 400
        assert response.json()["error"]["code"] == "invalid_json"


def test_a_paired_surrogate_escape_is_ordinary_text() -> None:
    assert json_parse_bounded(b'{"e": "\\ud83d\\ude00"}', max_depth=4) == {"e": "\U0001f600"}


def test_a_body_that_is_not_utf8_is_refused(raw_client, key) -> None:
    response = post_raw(raw_client, '{"query": "ü"}'.encode("latin-1"), key=key)
    assert response.status_code == 400
    response = post_raw(
        raw_client, '{"a": 1}'.encode("utf-16"), key=key, content_type="application/json; charset=utf-16"
    )
    assert response.status_code == 415  # a charset other than UTF-8: as on A2A and MCP
    assert response.json()["error"]["code"] == "unsupported_media_type"


# --- the body's size, before anything reads it -------------------------------------------------------------


class CountingStream(io.BytesIO):
    """A request body that records how much of it was read."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.bytes_read = 0

    def read(self, size: int | None = -1) -> bytes:
        chunk = super().read(size)
        self.bytes_read += len(chunk)
        return chunk


@pytest.mark.parametrize("credentials", ["Bearer not-a-key", None])
def test_a_declared_50_mb_body_is_a_413_before_authentication_and_unread(raw_client, credentials) -> None:
    body = CountingStream(b"x" * 1024)
    extra = {"HTTP_AUTHORIZATION": credentials} if credentials else {}
    response = raw_client.post(
        RUNS, content_type="application/json", CONTENT_LENGTH=str(50 * 1024 * 1024), **{"wsgi.input": body}, **extra
    )
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "body_too_large"
    assert body.bytes_read == 0


def test_a_body_longer_than_the_limit_is_refused_while_the_parser_reads_it(raw_client, key, settings) -> None:
    settings.PLATFORM_API_MAX_BODY_BYTES = 1000
    response = post_raw(raw_client, json.dumps({"agent": "a", "query": "q" * 5000}), key=key)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "body_too_large"


def test_a_malformed_content_length_is_a_400(raw_client, key) -> None:
    response = raw_client.post(RUNS, "{}", content_type="application/json", CONTENT_LENGTH="12abc")
    assert response.status_code == 400
    assert response["Content-Type"] == "application/json"


def _asgi_call(app: Any, *, path: str, headers: list[tuple[bytes, bytes]], chunks: list[bytes]) -> tuple[list, int]:
    """Send one request through ``app``; returns the messages sent back and how many body chunks were taken."""
    taken = 0
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal taken
        if taken < len(chunks):
            taken += 1
            return {"type": "http.request", "body": chunks[taken - 1], "more_body": taken < len(chunks)}
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "headers": headers}
    async_to_sync(app)(scope, receive, send)
    return sent, taken


def _refusing_app(*args: Any) -> Any:
    raise AssertionError("the application must not be reached")


def test_under_asgi_a_declared_oversized_body_is_answered_413_without_reading_it() -> None:
    app = BodyLimitASGIMiddleware(_refusing_app)
    sent, taken = _asgi_call(
        app, path=RUNS, headers=[(b"content-length", str(50 * 1024 * 1024).encode())], chunks=[b"x" * 1024] * 3
    )
    assert taken == 0
    assert sent[0]["status"] == 413
    assert json.loads(sent[1]["body"])["error"]["code"] == "body_too_large"


def test_under_asgi_a_chunked_body_is_cut_off_as_soon_as_it_passes_the_limit(settings) -> None:
    settings.PLATFORM_API_MAX_BODY_BYTES = 10_000
    app = BodyLimitASGIMiddleware(_refusing_app)
    sent, taken = _asgi_call(app, path=RUNS, headers=[], chunks=[b"x" * 4000] * 100)
    assert taken == 3
    assert sent[0]["status"] == 413


def test_under_asgi_a_body_within_the_limit_reaches_the_application_whole() -> None:
    received: list[bytes] = []

    async def app(scope: Any, receive: Callable, send: Callable) -> None:
        while True:
            message = await receive()
            received.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    sent, _taken = _asgi_call(BodyLimitASGIMiddleware(app), path=RUNS, headers=[], chunks=[b"ab", b"cd"])
    assert b"".join(received) == b"abcd"
    assert sent[0]["status"] == 204


# --- every error under /api/ is JSON ---------------------------------------------------------------------


def test_a_csrf_failure_under_api_is_json(auditor_user) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(auditor_user)
    response = client.post("/api/v1/audit/events", {})
    assert response.status_code == 403
    assert response.json()["error"]["code"] in {"permission_denied", "forbidden"}


def test_a_disallowed_host_under_api_is_a_json_400(raw_client) -> None:
    response = raw_client.get(RUNS, HTTP_HOST="evil.example")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "bad_request"


# --- fuzzing ---------------------------------------------------------------------------------------------


def hostile_requests(key: str, revoked_key: str, run_id: str) -> list[tuple[str, Callable[[Client], Any]]]:
    """(label, request) pairs: each sends one hostile request with the given client."""
    bearer = {"HTTP_AUTHORIZATION": f"Bearer {key}"}
    cases: list[tuple[str, Callable[[Client], Any]]] = []

    def post(
        label: str, body: bytes | str, content_type: str = "application/json", path: str = RUNS, **extra: Any
    ) -> None:
        cases.append((label, lambda c: c.generic("POST", path, body, content_type=content_type, **{**bearer, **extra})))

    def get(label: str, path: str, **extra: Any) -> None:
        cases.append((label, lambda c: c.get(path, **{**bearer, **extra})))

    # Nesting, arrays and objects, in the body and in fields.
    for depth in (33, 64, 500, 900, 999, 1000, 1500, 5000, 50_000):
        post(f"array depth {depth}", "[" * depth + "]" * depth)
        post(f"object depth {depth}", '{"a":' * depth + "1" + "}" * depth)
        post(
            f"context depth {depth}",
            '{"agent":"company-assistant","query":"q","context":' + '{"a":' * depth + "1" + "}" * depth + "}",
        )
    post("unbalanced deep", "[" * 100_000)
    # Numbers.
    for number in (
        "1e999",
        "-1e999",
        "1e309",
        "NaN",
        "-NaN",
        "Infinity",
        "-Infinity",
        "1" * 25,
        "-" + "9" * 5000,
        "1e-999",
        "0.1e400",
        "123456789012345678901234567890.5",
    ):
        post(
            f"number {number[:20]}",
            '{"agent":"company-assistant","query":"q","context":{"n":VALUE}}'.replace("VALUE", number),
        )
        post(
            f"number in data {number[:20]}",
            '{"agent":"company-assistant","query":"q","data":[{"n":VALUE}]}'.replace("VALUE", number),
        )
    # Text.
    for text in ('"\\u0000"', '"\\ud800"', '"\\udbff\\u0041"', '"a\\u0000b"', '"\\uDFFF"', '"\\u00"', '"\\x41"'):
        post(f"query {text}", '{"agent":"company-assistant","query":VALUE}'.replace("VALUE", text))
        post(f"key {text}", '{"agent":"company-assistant","query":"q","context":{VALUE:1}}'.replace("VALUE", text))
    post("query too long", json.dumps({"agent": "company-assistant", "query": "가" * 9000}))
    post("agent too long", json.dumps({"agent": "a" * 10_000, "query": "q"}))
    post("agent with NUL via serializer", json.dumps({"agent": "company\u0000", "query": "q"}))
    # Not JSON, or not a JSON object.
    for label, body in [
        ("empty", ""),
        ("whitespace", "   \n "),
        ("truncated", '{"agent": "company-assistant", "query": "q"'),
        ("trailing", '{"agent":"a","query":"q"} garbage'),
        ("single quotes", "{'agent': 'a'}"),
        ("comment", '{"agent": "a" /* hi */}'),
        ("bom", "\ufeff" + json.dumps({"agent": "nope", "query": "q"})),
        ("array", "[1, 2, 3]"),
        ("string", '"just a string"'),
        ("number", "42"),
        ("null", "null"),
        ("true", "true"),
        ("duplicate keys", '{"agent":"a","agent":"b","query":"q"}'),
        ("unknown fields", json.dumps({"agent": "company-assistant", "query": "q", "admin": True})),
        ("wrong types", json.dumps({"agent": 1, "query": ["q"], "context": "x", "data": {}, "files": 3})),
        ("query and message", json.dumps({"agent": "company-assistant", "query": "q", "message": {}})),
        (
            "message parts not list",
            json.dumps({"agent": "company-assistant", "message": {"role": "user", "parts": "x"}}),
        ),
        (
            "message unknown kind",
            json.dumps({"agent": "company-assistant", "message": {"role": "user", "parts": [{"kind": "video"}]}}),
        ),
        (
            "message many parts",
            json.dumps(
                {
                    "agent": "company-assistant",
                    "message": {"role": "user", "parts": [{"kind": "text", "text": "a"}] * 500},
                }
            ),
        ),
        (
            "file both",
            json.dumps({"agent": "company-assistant", "query": "q", "files": [{"uri": "https://x", "bytes": "AA=="}]}),
        ),
        ("file bad base64", json.dumps({"agent": "company-assistant", "query": "q", "files": [{"bytes": "!!!"}]})),
        ("file uri without scheme", json.dumps({"agent": "company-assistant", "query": "q", "files": [{"uri": "x"}]})),
        ("data not objects", json.dumps({"agent": "company-assistant", "query": "q", "data": [1, "a", None]})),
        ("too many data", json.dumps({"agent": "company-assistant", "query": "q", "data": [{}] * 500})),
    ]:
        post(f"body {label}", body)
    post("latin-1 bytes", '{"query": "é"}'.encode("latin-1"))
    post("utf-16", '{"a": 1}'.encode("utf-16"), content_type="application/json; charset=utf-16")
    post("unknown charset", "{}", content_type="application/json; charset=klingon")
    # Media types.
    for content_type in (
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/xml",
        "",
        "application/json-patch+json",
        "*/*",
    ):
        post(f"content type {content_type or 'none'}", '{"agent": "a", "query": "q"}', content_type=content_type)
    # Sizes.
    post("declared 50 MB", b"{}", CONTENT_LENGTH=str(50 * 1024 * 1024))
    post("declared negative", b"{}", CONTENT_LENGTH="-1")
    post("declared garbage", b"{}", CONTENT_LENGTH="lots")
    post("3 MB body", json.dumps({"agent": "company-assistant", "query": "q", "context": {"x": "y" * 3_000_000}}))
    # Methods and paths.
    for method in ("PUT", "PATCH", "DELETE", "TRACE", "PROPFIND"):
        cases.append(
            (f"{method} /runs", lambda c, m=method: c.generic(m, RUNS, "{}", content_type="application/json", **bearer))
        )
    cases.append(("POST events", lambda c: c.post(f"{RUNS}/{run_id}/events", **bearer)))
    cases.append(("DELETE run", lambda c: c.delete(f"{RUNS}/{run_id}", **bearer)))
    cases.append(("GET cancel", lambda c: c.get(f"{RUNS}/{run_id}/cancel", **bearer)))
    cases.append(("POST audit", lambda c: c.post("/api/v1/audit/events", {}, **bearer)))
    for path in (
        "/api/v1/nope",
        "/api/v2/runs",
        "/api/",
        "/api/v1/runs/",
        f"{RUNS}/not-a-uuid",
        f"{RUNS}/{uuid.uuid4()}",
        f"{RUNS}/%00",
        f"{RUNS}/%ff%fe",
        f"{RUNS}/{'x' * 5000}",
        f"{RUNS}/{run_id}/approvals/not-a-uuid",
        f"{RUNS}/{run_id}/events/extra",
        "/api/v1/schema/../../etc/passwd",
        "/api/v1/runs/..%2f..%2f",
    ):
        get(f"GET {path[:40]}", path)
    # Query strings.
    for query in (
        "wait=nan",
        "wait=inf",
        "wait=-1",
        "wait=1e999",
        "wait=abc",
        "page_size=0",
        "page_size=1e999",
        "page_size=-5",
        "page_size=99999999999999999999999",
        "cursor=!!!",
        "cursor=" + "A" * 2000,
        "status=bogus",
        "agent=%00",
        "agent=" + "a" * 500,
        "unknown=1",
        "status=%ff",
    ):
        get(f"GET runs?{query[:30]}", f"{RUNS}?{query}")
    post("POST wait=nan", json.dumps({"agent": "company-assistant", "query": "q"}), path=f"{RUNS}?wait=nan")
    post("POST wait=1e999", json.dumps({"agent": "company-assistant", "query": "q"}), path=f"{RUNS}?wait=1e999")
    # Headers.
    for idem in ("\x01", " ", "k" * 500, "é", "a b"):
        post(
            f"idempotency {idem[:5]!r}",
            json.dumps({"agent": "company-assistant", "query": "q"}),
            HTTP_IDEMPOTENCY_KEY=idem,
        )
    for last in ("abc", "-1", "1e999", "١٢", "9" * 100):
        get(f"last-event-id {last[:10]}", f"{RUNS}/{run_id}/events", HTTP_LAST_EVENT_ID=last)
    get("after=nan", f"{RUNS}/{run_id}/events?after=nan")
    get("bad host", RUNS, HTTP_HOST="evil.example")
    get("host with port junk", RUNS, HTTP_HOST="localhost:99999999")
    # Authentication.
    for label, header in [
        ("none", None),
        ("empty bearer", "Bearer "),
        ("basic on runs", "Basic " + base64.b64encode(b"a:b").decode()),
        ("unknown scheme", "Token abc"),
        ("garbage", "\x00\x01"),
        ("huge bearer", "Bearer " + "k" * 100_000),
        ("unicode bearer", "Bearer 키"),
        ("revoked", f"Bearer {revoked_key}"),
        ("unknown key", "Bearer pk_live_nope"),
    ]:
        extra = {"HTTP_AUTHORIZATION": header} if header is not None else {}
        cases.append((f"auth {label} runs", lambda c, e=extra: c.get(RUNS, **e)))
        cases.append((f"auth {label} events", lambda c, e=extra: c.get(f"{RUNS}/{run_id}/events", **e)))
    # The audit API.
    for label, header in [
        ("no credentials", None),
        ("wrong password", "Basic " + base64.b64encode(b"audrey:wrong").decode()),
        ("bad base64", "Basic !!!notbase64"),
        ("no colon", "Basic " + base64.b64encode(b"audrey").decode()),
        ("latin-1 user", "Basic " + base64.b64encode("ü:x".encode("latin-1")).decode()),
        ("api key", f"Bearer {key}"),
    ]:
        extra = {"HTTP_AUTHORIZATION": header} if header is not None else {}
        cases.append((f"audit {label}", lambda c, e=extra: c.get("/api/v1/audit/events", **e)))
    auditor = {"HTTP_AUTHORIZATION": "Basic " + base64.b64encode(f"audrey:{AUDITOR_PASSWORD}".encode()).decode()}
    for query in (
        "format=xml",
        "since=yesterday",
        "until=2026-13-45",
        "limit=0",
        "limit=1e999",
        "cursor=-1",
        "run=not-a-uuid",
        "ok=maybe",
        "bogus=1",
        "source=%00",
        "since=2026-01-02&until=2026-01-01",
        "format=csv&cursor=1",
    ):
        cases.append((f"audit ?{query[:20]}", lambda c, q=query: c.get(f"/api/v1/audit/events?{q}", **auditor)))
        cases.append((f"metrics ?{query[:20]}", lambda c, q=query: c.get(f"/api/v1/audit/metrics?{q}", **auditor)))
    return cases


@pytest.mark.slow
def test_at_least_150_hostile_requests_bring_no_5xx_and_only_json_errors(
    raw_client, key, demo_agent, auditor_user, settings
) -> None:
    settings.PLATFORM_API_BAD_KEY_RATE = "100000/min"  # the per-address throttle has its own tests
    revoked, revoked_raw = api_key_create(actor="test", via="tests", name="revoked")
    api_key_revoke(api_key=revoked, actor="test", via="tests")
    run = Run.objects.create(agent=demo_agent, api_key=revoked, query="q", status=Run.Status.SUCCEEDED)
    cases = hostile_requests(key, revoked_raw, str(run.pk))
    assert len(cases) >= 150
    server_errors, not_json = [], []
    for label, send in cases:
        response = send(raw_client)
        if response.status_code >= 500:
            server_errors.append((label, response.status_code))
        if response.status_code >= 400:
            try:
                body = json.loads(b"".join(response.streaming_content) if response.streaming else response.content)
            except ValueError:
                not_json.append((label, response.status_code, response.get("Content-Type")))
                continue
            if not isinstance(body, dict) or set(body["error"]) - {"code", "message", "fields"}:
                not_json.append((label, response.status_code, "not the error shape"))
    assert server_errors == []
    assert not_json == []
