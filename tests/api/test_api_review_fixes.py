"""A review's findings on the runs API, each pinned: an unparseable file URI is a 400 (not a 500), an A2A 1.0
part refuses unknown members like a 0.3 one, ``previous`` is right where runs share a timestamp, and the
OpenAPI schema documents every status answered, the 1.0 parts, required output fields and strict bodies."""

from __future__ import annotations

import itertools
import json
import uuid
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from agents.models import Agent, Run
from tests.conftest import ApiCaller

pytestmark = pytest.mark.django_db
URL = "/api/v1/runs"


@pytest.fixture
def schema() -> dict[str, Any]:
    return APIClient().get("/api/v1/schema/?format=json").json()  # type: ignore[no-any-return]


# 1. A file URI that urlsplit() cannot parse (a broken IPv6 host, NFKC-changing characters) is a 400.
@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"query": "q", "files": [{"uri": "http://[::1"}]}, "files"),
        ({"query": "q", "files": [{"uri": "http://a\uff03b/x"}]}, "files"),
        ({"message": {"role": "user", "parts": [{"text": "q"}, {"url": "http://[zz"}]}}, "message"),
        (
            {
                "message": {
                    "role": "user",
                    "parts": [{"kind": "text", "text": "q"}, {"kind": "file", "file": {"uri": "https://[x"}}],
                }
            },
            "message",
        ),
    ],
)
def test_an_unparseable_file_uri_is_a_400_naming_the_field(
    demo_agent: Agent, api_caller: ApiCaller, body: dict[str, Any], field: str
) -> None:
    client = APIClient(raise_request_exception=False)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {api_caller.raw_key}")
    response = client.post(URL, {"agent": demo_agent.slug, **body}, format="json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid_input"
    assert field in error["fields"]
    # Named as the caller sent it: a 1.0 part's ``url``, a 0.3 part's or a file's ``uri``.
    named = "url" if "url" in json.dumps(body) else "uri"
    assert named in json.dumps(error["fields"][field])
    assert not Run.objects.exists()


def test_the_a2a_endpoint_answers_an_unparseable_url_with_invalid_params(
    demo_agent: Agent, api_caller: ApiCaller
) -> None:
    client = Client(HTTP_AUTHORIZATION=f"Bearer {api_caller.raw_key}", raise_request_exception=False)
    params = {"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "q"}, {"url": "http://[zz"}]}}
    body = {"jsonrpc": "2.0", "id": "r1", "method": "SendMessage", "params": params}
    response = client.post(f"/a2a/{demo_agent.slug}/", json.dumps(body), content_type="application/json")
    assert response.status_code == 200, response.content
    assert response.json()["error"]["code"] == -32602
    assert not Run.objects.exists()


# 2. A2A 1.0 parts: unknown members are refused (as in a 0.3 part), each named; the schema describes the 1.0 forms.
def test_an_unknown_member_of_an_a2a_1_0_part_is_refused_like_a_0_3_one(
    api_client: APIClient, demo_agent: Agent
) -> None:
    old = api_client.post(
        URL,
        {"agent": demo_agent.slug, "message": {"role": "user", "parts": [{"kind": "text", "text": "q", "zzz": 1}]}},
        format="json",
    )
    new = api_client.post(
        URL,
        {"agent": demo_agent.slug, "message": {"role": "user", "parts": [{"text": "q", "zzz": 1, "yyy": 2}]}},
        format="json",
    )
    assert old.status_code == 400
    assert new.status_code == 400, new.content
    errors = json.dumps(new.json()["error"]["fields"])
    assert "zzz" in errors and "yyy" in errors
    # The 1.0 members a part may have are still taken.
    ok = api_client.post(
        URL,
        {
            "agent": demo_agent.slug,
            "message": {
                "role": "ROLE_USER",
                "parts": [
                    {"text": "q", "metadata": {}},
                    {"url": "https://example.com/a.pdf", "filename": "a.pdf", "mediaType": "application/pdf"},
                ],
            },
        },
        format="json",
    )
    assert ok.status_code == 202, ok.content


def test_the_schema_describes_the_a2a_1_0_parts_the_api_takes(schema: dict[str, Any]) -> None:
    schemas = schema["components"]["schemas"]
    assert schemas["A2AMessage"]["properties"]["parts"]["items"] == {"$ref": "#/components/schemas/A2AMessagePart"}
    refs = [a["$ref"].rsplit("/", 1)[-1] for a in schemas["A2AMessagePart"]["oneOf"]]
    assert refs[0] == "A2APart"  # the 0.3 forms, by `kind`
    forms = [schemas[name] for name in refs[1:]]
    assert sorted(tuple(f["required"]) for f in forms) == [("data",), ("raw",), ("text",), ("url",)]
    for form in forms:
        assert form["additionalProperties"] is False
        assert "kind" not in form["properties"]


# 3. Cursor pagination: `previous` returns the page before even where runs share created_at.
IDS = [1, 2, 3, 4, 5]


def test_previous_returns_the_page_before_when_runs_share_a_timestamp(
    api_client: APIClient, api_caller: ApiCaller, demo_agent: Agent
) -> None:
    tie = timezone.now()
    for i in range(5):  # five runs created in the same microsecond (ids fixed: the result does not depend on chance)
        Run.objects.create(id=uuid.UUID(int=IDS[i]), agent=demo_agent, api_key=api_caller.key, query=f"q{i}")
    Run.objects.filter(query__in=[f"q{i}" for i in range(5)]).update(created_at=tie)
    for i in (5, 6):
        Run.objects.create(agent=demo_agent, api_key=api_caller.key, query=f"q{i}")
    pages = [api_client.get(f"{URL}?page_size=2").json()]
    while pages[-1]["next"]:
        pages.append(api_client.get(pages[-1]["next"]).json())
    seen = [r["id"] for page in pages for r in page["results"]]
    assert len(seen) == len(set(seen)) == 7
    assert pages[0]["previous"] is None
    for before, page in itertools.pairwise(pages):
        back = api_client.get(page["previous"]).json()
        assert [r["id"] for r in back["results"]] == [r["id"] for r in before["results"]]


@pytest.mark.parametrize(
    "cursor",
    [
        "abc",
        "cD0xJnI9MQ==",  # DRF's cursor format: no longer this API's
        "bnwyMDI0LTAxLTAxfHg=",  # "n|2024-01-01|x": no run id
        "bnx4fDE=",  # "n|x|1"
        "bnwyMDI0LTAxLTAxVDAwOjAwOjAwfDAwMDAwMDAwLTAwMDAtMDAwMC0wMDAwLTAwMDAwMDAwMDAwMQ==",  # a naive moment
        "bnwwMDAxLTAxLTAxVDAwOjAwOjAwKzA1OjAwfDAwMDAwMDAwLTAwMDAtMDAwMC0wMDAwLTAwMDAwMDAwMDAwMQ==",  # before year 1 UTC
    ],
)
def test_a_crafted_cursor_is_a_400(api_client: APIClient, cursor: str) -> None:
    response = api_client.get(f"{URL}?cursor={cursor}")
    assert response.status_code == 400
    assert "cursor" in response.json()["error"]["fields"]


# 4. Status codes the API answers but the schema did not document.
def test_every_answered_status_is_documented(
    schema: dict[str, Any], api_client: APIClient, api_caller: ApiCaller, demo_agent: Agent
) -> None:
    run = Run.objects.create(agent=demo_agent, api_key=api_caller.key, query="q", status="succeeded")
    big = '{"score": 1, "comment": "' + "x" * (3 * 1024 * 1024) + '"}'
    post, get = api_client.post, api_client.get
    answered = [
        (
            "/api/v1/runs/{run_id}/feedback",
            "post",
            post(f"{URL}/{run.id}/feedback", big, content_type="application/json"),
        ),
        (
            "/api/v1/runs/{run_id}/approvals/{approval_id}",
            "post",
            post(f"{URL}/{run.id}/approvals/x", big, content_type="application/json"),
        ),
        ("/api/v1/runs/{run_id}/cancel", "post", post(f"{URL}/{run.id}/cancel", big, content_type="application/json")),
        ("/api/v1/runs/{run_id}", "get", get(f"{URL}/%00")),
        ("/api/v1/runs/{run_id}/cancel", "post", post(f"{URL}/%00/cancel")),
        ("/api/v1/runs", "get", api_client.delete(URL)),
        ("/api/v1/usage", "get", get("/api/v1/usage", HTTP_ACCEPT="text/csv")),
    ]
    assert [r.status_code for *_, r in answered] == [413, 413, 413, 400, 400, 405, 406]
    assert all(r.json()["error"]["code"] for *_, r in answered)
    undocumented = {
        (path, method, r.status_code)
        for path, method, r in answered
        if str(r.status_code) not in schema["paths"][path][method]["responses"]
    }
    assert not undocumented, undocumented
    for path, operations in schema["paths"].items():
        if not path.startswith("/api/v1/runs") and path != "/api/v1/usage":
            continue
        for method, operation in operations.items():
            assert {"405", "406"} <= set(operation["responses"]) or path.endswith("/events"), (path, method)


# 5. Always-present output fields are required in the schema; the answers keep their shape.
def test_always_present_run_fields_are_required_in_the_schema(
    schema: dict[str, Any], api_client: APIClient, api_caller: ApiCaller, demo_agent: Agent
) -> None:
    schemas = schema["components"]["schemas"]
    body = api_client.post(URL, {"agent": demo_agent.slug, "query": "q"}, format="json").json()
    assert set(body) == set(schemas["Run"]["required"]) == set(schemas["Run"]["properties"])
    page = api_client.get(URL).json()
    assert set(page["results"][0]) == set(schemas["RunSummary"]["required"])
    assert set(schemas["Approval"]["properties"]) == set(schemas["Approval"]["required"])


# 6. The feedback body is documented as strict; the list says unknown query parameters are refused.
def test_the_feedback_body_is_documented_as_strict(
    schema: dict[str, Any], api_client: APIClient, api_caller: ApiCaller, demo_agent: Agent
) -> None:
    run = Run.objects.create(agent=demo_agent, api_key=api_caller.key, query="q", status="succeeded")
    assert api_client.post(f"{URL}/{run.id}/feedback", {"score": 1, "x": 1}, format="json").status_code == 400
    assert schema["components"]["schemas"]["RunFeedback"].get("additionalProperties") is False
    assert api_client.get(f"{URL}?zzz=1").status_code == 400
    assert "unknown query parameters are refused" in schema["paths"]["/api/v1/runs"]["get"]["description"].lower()
