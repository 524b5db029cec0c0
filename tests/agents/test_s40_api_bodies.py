"""Request bodies as the REST API, A2A and MCP read them: a chunked body is read (under uvicorn and under gunicorn's
WSGI workers), a list over its length is refused before its elements are validated, JSON of too many values and
JSON that gives a key twice are refused before anything walks them, and a charset or a Content-Type nobody reads
is refused, repeating at most 100 characters of it."""

from __future__ import annotations

import io
import json
import unicodedata
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import pytest
from asgiref.sync import async_to_sync
from django.test import Client
from rest_framework import serializers
from rest_framework.exceptions import ParseError

from agent_platform.body_limit import BodyLimitASGIMiddleware
from agents.api.parsers import json_depth, json_parse_bounded
from agents.api.serializers import A2AMessageSerializer
from agents.models import Run
from tests.e2e.workers import platform_without_workers

pytestmark = pytest.mark.django_db

RUNS = "/api/v1/runs"
A2A = "/a2a/company-assistant/"


@pytest.fixture
def key(api_caller: Any, settings: Any) -> str:
    settings.PLATFORM_API_RATE = "100000/min"
    return str(api_caller.raw_key)


def post(client: Client, path: str, body: str, *, key: str, content_type: str = "application/json") -> Any:
    return client.generic("POST", path, body, content_type=content_type, HTTP_AUTHORIZATION=f"Bearer {key}")


def rpc(method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}


# --- 1. a chunked body (no Content-Length) is read ----------------------------------------------------------


def _chunks(body: bytes) -> Iterator[bytes]:
    """The body in three pieces: httpx sends an iterator with ``Transfer-Encoding: chunked`` and no length."""
    third = len(body) // 3
    yield body[:third]
    yield body[third : 2 * third]
    yield body[2 * third :]


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize("web", ["uvicorn", "gunicorn"])
def test_a_chunked_body_is_read_under_uvicorn_and_gunicorn(web: Literal["uvicorn", "gunicorn"], tmp_path: Path) -> None:
    body = json.dumps({"agent": "company-assistant", "query": "청크 전송"}, ensure_ascii=False).encode()
    with platform_without_workers(tmp_path, broker_url="filesystem://", web=web) as platform, platform.client() as c:
        response = c.post(RUNS, content=_chunks(body), headers={"Content-Type": "application/json"})
        assert response.request.headers.get("Transfer-Encoding") == "chunked"
        assert "Content-Length" not in response.request.headers
        assert response.status_code == 202, response.text
        assert response.json()["query"] == "청크 전송"
        answer = c.post(
            A2A, content=_chunks(json.dumps(rpc("GetTask", {"id": "nothing"})).encode()), headers={"A2A-Version": "1.0"}
        )
        assert answer.json()["error"]["code"] == -32001, answer.text  # task not found: the body was read


def test_under_asgi_a_body_sent_without_a_length_reaches_django_with_its_length() -> None:
    seen: list[dict[bytes, bytes]] = []

    async def app(scope: Any, receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        seen.append(dict(scope["headers"]))
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    chunks = [b'{"a":', b' "b"}']
    taken = iter(chunks)

    async def receive() -> dict[str, Any]:
        chunk = next(taken)
        return {"type": "http.request", "body": chunk, "more_body": chunk is not chunks[-1]}

    async def send(message: Any) -> None:
        pass

    headers = [(b"transfer-encoding", b"chunked"), (b"content-type", b"application/json")]
    scope = {"type": "http", "method": "POST", "path": RUNS, "headers": headers}
    async_to_sync(BodyLimitASGIMiddleware(app))(scope, receive, send)
    assert seen[0][b"content-length"] == b"10"


def _wsgi_post(path: str, body: bytes, *, key: str) -> Any:
    """``POST path`` through Django's WSGI handler as gunicorn hands on a chunked body: decoded, without
    ``CONTENT_LENGTH``, the input marked terminated."""
    chunked: dict[str, Any] = {"wsgi.input": io.BytesIO(body), "wsgi.input_terminated": True}
    return Client().generic(
        "POST",
        path,
        body,
        content_type="application/json",
        CONTENT_LENGTH="",
        HTTP_TRANSFER_ENCODING="chunked",
        HTTP_AUTHORIZATION=f"Bearer {key}",
        **chunked,
    )


def test_under_wsgi_a_chunked_body_reaches_the_view(key: str, demo_agent: Any) -> None:
    body = json.dumps({"agent": "company-assistant", "query": "청크 전송"}).encode()
    response = _wsgi_post(RUNS, body, key=key)
    assert response.status_code == 202, response.content
    assert Run.objects.get(id=response.json()["id"]).query == "청크 전송"


def test_under_wsgi_a_chunked_body_over_the_limit_is_a_413(key: str, settings: Any) -> None:
    settings.PLATFORM_API_MAX_BODY_BYTES = 1000
    body = json.dumps({"agent": "company-assistant", "query": "x" * 5000}).encode()
    response = _wsgi_post(RUNS, body, key=key)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "body_too_large"
    assert "1000" in response.json()["error"]["message"]


# --- 2. a list over its length is refused before its elements are validated --------------------------------

TOO_LONG = "Ensure this field has no more than 100 elements."


def test_too_many_parts_are_refused_without_validating_one(key: str, demo_agent: Any) -> None:
    # Every part invalid: validated first, each would be named in the answer.
    message = {"role": "user", "parts": [{"kind": "bogus"}] * 101}
    response = post(Client(), RUNS, json.dumps({"agent": "company-assistant", "message": message}), key=key)
    assert response.status_code == 400
    assert response.json()["error"]["fields"]["message"]["parts"] == [TOO_LONG]


@pytest.mark.parametrize("field", ["referenceTaskIds", "extensions"])
def test_the_envelopes_lists_are_counted_before_their_elements_are_validated(field: str) -> None:
    serializer = A2AMessageSerializer(data={"role": "user", "parts": [{"kind": "text", "text": "a"}], field: [1] * 101})
    assert not serializer.is_valid()
    assert serializer.errors[field] == [TOO_LONG]
    assert serializer.errors[field][0].code == "max_length"


def test_a_bounded_list_field_counts_before_it_validates() -> None:
    from agents.api.serializers import BoundedListField  # the field views.py's data and files are to use

    field = BoundedListField(child=serializers.DictField(), max_length=100)
    with pytest.raises(serializers.ValidationError) as refused:
        field.run_validation(["not an object"] * 101)
    assert refused.value.detail == [TOO_LONG]
    assert field.run_validation([{}] * 100) == [{}] * 100


# --- 3. JSON of too many values -----------------------------------------------------------------------------


def test_json_of_too_many_tiny_values_is_refused_naming_the_limit(key: str, demo_agent: Any) -> None:
    body = json.dumps(
        {"agent": "company-assistant", "query": "a", "data": [{"x": [[]] * 600_000}]}, separators=(",", ":")
    )
    response = post(Client(), RUNS, body, key=key)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "too_many_json_values"
    assert "10000" in error["message"]


def test_the_value_limit_is_a_setting_and_strings_do_not_count(key: str, demo_agent: Any, settings: Any) -> None:
    settings.PLATFORM_API_MAX_JSON_ITEMS = 40
    within = {"agent": "company-assistant", "query": "[[[,,,{{{" * 100, "data": [{"n": list(range(30))}]}
    assert post(Client(), RUNS, json.dumps(within), key=key).status_code == 202
    over = {**within, "data": [{"n": list(range(41))}]}
    response = post(Client(), RUNS, json.dumps(over), key=key)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "too_many_json_values"
    assert "40" in response.json()["error"]["message"]


def test_a2a_and_mcp_refuse_json_of_too_many_values(key: str, demo_agent: Any, settings: Any) -> None:
    settings.PLATFORM_API_MAX_JSON_ITEMS = 50
    parts: list[dict[str, Any]] = [{"data": {}}] * 60
    a2a = post(
        Client(), A2A, json.dumps(rpc("SendMessage", {"message": {"role": "ROLE_USER", "parts": parts}})), key=key
    )
    assert a2a.json()["error"]["code"] == -32700 and "50" in a2a.json()["error"]["message"]
    mcp = post(Client(), "/mcp", json.dumps(rpc("tools/call", {"name": "x", "arguments": {"l": [0] * 60}})), key=key)
    assert mcp.status_code == 400
    assert mcp.json()["error"]["code"] == -32700 and "50" in mcp.json()["error"]["message"]


def test_depth_is_measured_as_before() -> None:
    assert json_depth('{"a": [1, {"b": "[[[{{{"}]}, "c": [2, 3]}') == 3
    with pytest.raises(ParseError):
        json_parse_bounded(b"[" * 33 + b"]" * 33, max_depth=32, max_values=1000)


# --- 4. a key given twice ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        '{"agent": "company-assistant", "query": "a", "query": "b"}',
        '{"agent": "company-assistant", "query": "a", "context": {"x": {"decision": "reject", "decision": "approve"}}}',
    ],
    ids=["top", "nested"],
)
def test_a_key_given_twice_is_refused_at_any_depth(key: str, demo_agent: Any, body: str) -> None:
    response = post(Client(), RUNS, body, key=key)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_json"
    assert ('"query"' in error["message"]) or ('"decision"' in error["message"])
    assert not Run.objects.exists()


def test_a_key_given_composed_and_decomposed_is_given_twice() -> None:
    # What a run stores is composed: the two became one key, the last value silently winning.
    nfd = unicodedata.normalize("NFD", "부서")
    with pytest.raises(ParseError) as refused:
        json_parse_bounded(f'{{"context": {{"부서": "A", "{nfd}": "B"}}}}'.encode(), max_depth=32)
    assert "given twice" in str(refused.value.detail)
    assert json_parse_bounded('{"부서": "A", "부서장": "B"}'.encode(), max_depth=32) == {"부서": "A", "부서장": "B"}


def test_a_repeated_key_is_named_masked_and_bounded() -> None:
    secret = "sk-proj-abcdefghijklmnopqrstuvwxyz0123456789ABCD"
    with pytest.raises(ParseError) as refused:
        json_parse_bounded(json.dumps({secret: 1}).replace("}", f', "{secret}": 2}}').encode(), max_depth=32)
    assert secret not in str(refused.value.detail)
    long_key = "k" * 5000
    with pytest.raises(ParseError) as refused:
        json_parse_bounded(f'{{"{long_key}": 1, "{long_key}": 2}}'.encode(), max_depth=32)
    assert '"' + "k" * 100 + '…"' in str(refused.value.detail)
    assert len(str(refused.value.detail)) < 200


# --- 5. charsets and Content-Types ------------------------------------------------------------------------------


def test_an_unknown_charset_is_refused_as_latin_1_is(key: str, demo_agent: Any) -> None:
    body = json.dumps({"agent": "company-assistant", "query": "a"})
    for charset in ("latin-1", "nonsense"):
        response = post(Client(), RUNS, body, key=key, content_type=f"application/json; charset={charset}")
        assert response.status_code == 415
        assert response.json()["error"]["code"] == "unsupported_media_type"
        assert charset in response.json()["error"]["message"]
    assert post(Client(), RUNS, body, key=key, content_type="application/json; charset=UTF-8").status_code == 202


def test_a_charset_is_repeated_at_most_100_characters_written_out(key: str) -> None:
    charset = "c\x9b" + "c" * 150  # a terminal's CSI
    response = post(Client(), RUNS, "{}", key=key, content_type=f"application/json; charset={charset}")
    assert response.status_code == 415
    message = response.json()["error"]["message"]
    assert "c⟦U+009B⟧" + "c" * 98 + "…" in message
    assert "c" * 100 not in message


def test_a_content_type_longer_than_drf_reads_is_a_415_repeating_100_characters(key: str) -> None:
    content_type = "application/json; charset=" + "x" * 5000
    response = post(Client(), RUNS, "{}", key=key, content_type=content_type)
    assert response.status_code == 415
    error = response.json()["error"]
    assert error["code"] == "unsupported_media_type"
    assert content_type[:100] + "…" in error["message"]
    assert "x" * 100 not in error["message"]
