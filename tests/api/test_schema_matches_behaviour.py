"""The served OpenAPI schema says what the REST API does (a reviewer's comparison of the two):

1. an A2A message's envelope on ``POST /runs``: its ``contextId`` is the run's ``context.contextId`` (another one
   in ``context`` is a 400 naming both), its ``messageId`` the idempotency key when no ``Idempotency-Key`` is sent,
   and the members REST does not use are described as such;
2. the event stream's description: the keep-alive's setting, ``event: error``, the 429 ``too_many_streams``;
3. A2A 1.0 parts: ``filename`` and ``mediaType`` on every part, and their errors under the names the caller sent;
4. ``ErrorDetail.fields`` of a budget's refusal;
5. no internal docstring published (components, ``OPTIONS``), ``GET /usage``'s members, the run's timings and
   token usage;
6. parameter limits in the parameters' schemas, not only in prose.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from rest_framework.test import APIClient

from agents.api.serializers import BuiltOnceFields, StrictSerializer
from agents.budgets import budget_reserve
from agents.models import Agent, Budget, Run
from tests.conftest import ApiCaller, make_agent

pytestmark = pytest.mark.django_db

RUNS = "/api/v1/runs"


@pytest.fixture
def schema() -> dict[str, Any]:
    response = APIClient().get("/api/v1/schema/?format=json")
    assert response.status_code == 200, response.content
    return response.json()  # type: ignore[no-any-return]


@pytest.fixture
def agent(db: Any) -> Agent:
    """An agent without servers: enough to queue runs (no worker runs them here)."""
    return make_agent(slug="company-assistant", servers=[], with_demo_rules=False)


def message(**envelope: Any) -> dict[str, Any]:
    return {"role": "user", "parts": [{"kind": "text", "text": "주문 상태를 알려주세요"}], **envelope}


def submit(client: APIClient, body: dict[str, Any], **headers: str) -> Any:
    return client.post(RUNS, body, format="json", **headers)  # type: ignore[arg-type]


# --- 1. the message's envelope -----------------------------------------------------------------------------


def test_a_messages_context_id_is_the_runs_context_id(api_client: APIClient, agent: Agent) -> None:
    response = submit(api_client, {"agent": agent.slug, "message": message(contextId="대화-1")})
    assert response.status_code == 202, response.content
    assert response.json()["context"]["contextId"] == "대화-1"
    assert Run.objects.get(id=response.json()["id"]).context["contextId"] == "대화-1"


def test_the_same_context_id_in_the_context_is_taken_and_another_is_a_400_naming_both(
    api_client: APIClient, agent: Agent
) -> None:
    same = submit(
        api_client,
        {"agent": agent.slug, "message": message(contextId="c-1"), "context": {"contextId": "c-1", "userId": "u"}},
    )
    assert same.status_code == 202, same.content
    assert same.json()["context"] == {"contextId": "c-1", "userId": "u"}
    other = submit(
        api_client, {"agent": agent.slug, "message": message(contextId="c-1"), "context": {"contextId": "c-2"}}
    )
    assert other.status_code == 400, other.content
    fields = other.json()["error"]["fields"]
    assert set(fields) == {"message", "context"}
    assert "message.contextId" in fields["message"]["contextId"][0]
    assert "context.contextId" in fields["context"]["contextId"][0]
    assert Run.objects.count() == 1


def test_a_message_id_is_the_idempotency_key_when_no_header_is_sent(api_client: APIClient, agent: Agent) -> None:
    body = {"agent": agent.slug, "message": message(messageId="m-1")}
    first = submit(api_client, body)
    again = submit(api_client, body)
    assert first.status_code == 202, first.content
    assert again.status_code == 200, again.content
    assert again.json()["id"] == first.json()["id"]
    assert again["Idempotent-Replayed"] == "true"
    reused = submit(
        api_client, {"agent": agent.slug, "message": {**message(messageId="m-1"), "parts": [{"text": "x"}]}}
    )
    assert reused.status_code == 409, reused.content
    error = reused.json()["error"]
    assert error["code"] == "idempotency_key_reused"
    assert "messageId" in error["message"]
    assert set(error["fields"]["message"]) == {"messageId"}
    assert Run.objects.count() == 1


def test_the_header_wins_over_the_message_id_and_a_long_id_still_makes_a_key(
    api_client: APIClient, agent: Agent
) -> None:
    long_id = "가" * 200
    first = submit(api_client, {"agent": agent.slug, "message": message(messageId=long_id)})
    again = submit(api_client, {"agent": agent.slug, "message": message(messageId=long_id)})
    assert (first.status_code, again.status_code) == (202, 200)
    assert len(Run.objects.get(id=first.json()["id"]).idempotency_key) <= 200
    other_body = {"agent": agent.slug, "message": message(messageId=long_id, contextId="c")}
    with_header = submit(api_client, other_body, HTTP_IDEMPOTENCY_KEY="order-1")
    assert with_header.status_code == 202, with_header.content  # the header's key, not the messageId's
    assert Run.objects.get(id=with_header.json()["id"]).idempotency_key == "order-1"


def test_the_schema_says_what_rest_does_with_each_envelope_member(schema: dict[str, Any]) -> None:
    members = schema["components"]["schemas"]["A2AMessage"]["properties"]
    assert "Idempotency-Key" in members["messageId"]["description"]
    assert "context.contextId" in members["contextId"]["description"]
    for name in ("taskId", "referenceTaskIds", "extensions", "metadata"):
        assert "not used" in members[name]["description"], name


# --- 2. the event stream -----------------------------------------------------------------------------------


def test_the_event_stream_documents_its_keep_alive_setting_its_error_event_and_too_many_streams(
    schema: dict[str, Any],
) -> None:
    events = schema["paths"]["/api/v1/runs/{run_id}/events"]["get"]
    assert "15 s" not in events["description"]
    assert "`PLATFORM_SSE_KEEPALIVE_S` seconds (4 by default)" in events["description"]
    for word in ("event: error", "authentication_failed", "run_not_found"):
        assert word in events["description"], word
    assert "too_many_streams" in events["responses"]["429"]["description"]


# --- 3. A2A 1.0 parts --------------------------------------------------------------------------------------


def test_every_a2a_1_0_part_may_name_a_file_and_a_media_type(
    schema: dict[str, Any], api_client: APIClient, agent: Agent
) -> None:
    components = schema["components"]["schemas"]
    for name in ("A2ATextPartV1", "A2ADataPartV1", "A2AUrlPartV1", "A2ARawPartV1"):
        assert {"filename", "mediaType"} <= set(components[name]["properties"]), name
    parts = [
        {"text": "질문", "filename": "q.txt", "mediaType": "text/plain"},
        {"data": {"order": 1}, "mediaType": "application/json"},
    ]
    response = submit(api_client, {"agent": agent.slug, "message": {"role": "ROLE_USER", "parts": parts}})
    assert response.status_code == 202, response.content


def test_a_bad_member_of_an_a2a_1_0_part_is_reported_under_the_name_the_caller_sent(
    api_client: APIClient, agent: Agent
) -> None:
    parts = [
        {"text": "질문"},
        {"url": "https://example.com/r.pdf", "filename": "x" * 256},
        {"url": "no-scheme"},
        {"text": "t", "mediaType": 7},
    ]
    response = submit(api_client, {"agent": agent.slug, "message": {"role": "ROLE_USER", "parts": parts}})
    assert response.status_code == 400, response.content
    errors = response.json()["error"]["fields"]["message"]["parts"]
    assert set(errors) == {"1", "2", "3"}
    assert set(errors["1"]) == {"filename"}
    assert set(errors["2"]) == {"url"}
    assert set(errors["3"]) == {"mediaType"}


# --- 4. budget errors --------------------------------------------------------------------------------------


def test_error_detail_says_what_fields_holds_for_a_budgets_refusal(
    schema: dict[str, Any], api_caller: ApiCaller, agent: Agent
) -> None:
    budget = Budget.objects.create(api_key=api_caller.key, max_tokens=10, run_reservation_tokens=10)
    run = Run.objects.create(agent=agent, api_key=api_caller.key, query="q")
    budget_reserve(run=run, agent=agent, api_key=api_caller.key)
    refused = submit(_client_of(api_caller.raw_key), {"agent": agent.slug, "query": "q"})
    assert refused.status_code == 429, refused.content
    assert set(refused.json()["error"]["fields"]) == {"budget", "resets_at", "reason"}
    assert refused.json()["error"]["fields"]["reason"] == "runs_in_flight"  # the one run holds the room
    assert refused.json()["error"]["fields"]["budget"] == budget.pk
    described = schema["components"]["schemas"]["ErrorDetail"]["properties"]["fields"]["description"]
    for word in ("budget_exceeded", "budget_misconfigured", "`budget`", "`resets_at`", "`reason`"):
        assert word in described, word


def _client_of(raw_key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    return client


# --- 5. descriptions, /usage, a run's JSON fields --------------------------------------------------------------


def test_no_component_is_described_by_an_internal_docstring(schema: dict[str, Any]) -> None:
    internal = {inspect.cleandoc(cls.__doc__ or "") for cls in (StrictSerializer, BuiltOnceFields)}
    for name, component in schema["components"]["schemas"].items():
        description = component.get("description", "")
        assert description not in internal, name
        for word in ("DRF", "Documentation only", "serializer"):
            assert word not in description, (name, word)
    components = schema["components"]["schemas"]
    for name in ("Run", "ApprovalDecision", "RunFeedback", "A2ATextPart", "A2ADataPart", "A2AFilePart", "ErrorDetail"):
        assert components[name].get("description"), name


def test_options_does_not_answer_a_views_docstring(api_client: APIClient) -> None:
    response = api_client.options(RUNS)
    assert response.status_code == 200, response.content
    description = response.json()["description"]
    assert "RunListApi" not in description
    assert "/api/v1/schema/" in description


def test_usage_is_documented_member_by_member_as_it_answers(
    schema: dict[str, Any], api_client: APIClient, api_caller: ApiCaller, agent: Agent
) -> None:
    Budget.objects.create(api_key=api_caller.key, max_tokens=1000, run_reservation_tokens=10)
    Budget.objects.create(agent=agent, period=Budget.Period.MONTH, max_cost=5, run_reservation_tokens=10)
    assert submit(api_client, {"agent": agent.slug, "query": "q"}).status_code == 202
    operation = schema["paths"]["/api/v1/usage"]["get"]
    assert operation["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Usage"
    }
    answer = api_client.get("/api/v1/usage").json()
    assert len(answer["budgets"]) == 2 and answer["by_agent"]
    _assert_matches(answer, {"$ref": "#/components/schemas/Usage"}, schema, "usage")


def test_a_runs_timings_and_token_usage_name_their_keys(schema: dict[str, Any]) -> None:
    components = schema["components"]["schemas"]
    run = components["Run"]["properties"]
    assert run["timings"]["allOf"] == [{"$ref": "#/components/schemas/RunTimings"}]
    assert run["token_usage"]["allOf"] == [{"$ref": "#/components/schemas/TokenUsage"}]
    assert {"queue_wait_ms", "deterministic_ms", "model_ms", "tools_ms", "total_ms"} <= set(
        components["RunTimings"]["properties"]
    )
    assert {"input_tokens", "output_tokens", "total_tokens", "model_calls"} <= set(
        components["TokenUsage"]["properties"]
    )


def _assert_matches(value: Any, node: dict[str, Any], schema: dict[str, Any], where: str) -> None:
    """``value`` has exactly the members ``node`` declares (each required one, no other) and the right JSON types."""
    if "$ref" in node:
        node = schema["components"]["schemas"][node["$ref"].rsplit("/", 1)[1]]
    if "allOf" in node:
        node = {**node, **schema["components"]["schemas"][node["allOf"][0]["$ref"].rsplit("/", 1)[1]]}
    if value is None:
        assert node.get("nullable"), where
        return
    kind = node.get("type")
    if "properties" in node:
        assert isinstance(value, dict), where
        assert set(node.get("required", [])) <= set(value) <= set(node["properties"]), (where, set(value))
        for name, member in value.items():
            _assert_matches(member, node["properties"][name], schema, f"{where}.{name}")
    elif kind == "array":
        assert isinstance(value, list), where
        for i, item in enumerate(value):
            _assert_matches(item, node["items"], schema, f"{where}[{i}]")
    elif kind == "integer":
        assert isinstance(value, int) and not isinstance(value, bool), where
    elif kind == "number":
        assert isinstance(value, int | float) and not isinstance(value, bool), where
    elif kind == "string" or "enum" in node:
        assert isinstance(value, str), where


# --- 6. parameter limits -----------------------------------------------------------------------------------


def _parameter(operation: dict[str, Any], where: str, name: str) -> dict[str, Any]:
    return next(p["schema"] for p in operation["parameters"] if (p["in"], p["name"]) == (where, name))


def test_parameter_limits_are_in_the_parameters_schemas(schema: dict[str, Any]) -> None:
    create = schema["paths"][RUNS]["post"]
    assert _parameter(create, "query", "wait") == {"type": "number", "minimum": 0, "maximum": 60}
    key = _parameter(create, "header", "Idempotency-Key")
    assert (key["maxLength"], key["pattern"]) == (200, "^[!-+\\--~]{1,200}$")  # no comma
    listing = schema["paths"][RUNS]["get"]
    assert _parameter(listing, "query", "page_size") == {"type": "integer", "minimum": 1, "maximum": 100}
    assert _parameter(listing, "query", "agent")["maxLength"] == 64
    assert schema["components"]["schemas"]["A2AMessage"]["properties"]["parts"]["minItems"] == 1


def test_the_waits_maximum_is_the_deployments_setting(settings: Any) -> None:
    settings.PLATFORM_API_MAX_WAIT_S = 5
    schema = APIClient().get("/api/v1/schema/?format=json").json()
    assert _parameter(schema["paths"][RUNS]["post"], "query", "wait")["maximum"] == 5


def test_the_limits_the_schema_declares_are_the_ones_enforced(api_client: APIClient, agent: Agent) -> None:
    assert api_client.get(RUNS, {"page_size": 101}).status_code == 400
    assert api_client.get(RUNS, {"page_size": 100}).status_code == 200
    assert api_client.get(RUNS, {"agent": "a" * 65}).status_code == 400
    assert api_client.get(RUNS, {"agent": "a" * 64}).status_code == 200
    body = {"agent": agent.slug, "query": "q"}
    assert api_client.post(f"{RUNS}?wait=1e-05", body, format="json").status_code == 400
    assert submit(api_client, body, HTTP_IDEMPOTENCY_KEY="k" * 201).status_code == 400
    assert submit(api_client, {"agent": agent.slug, "message": {"role": "user", "parts": []}}).status_code == 400
