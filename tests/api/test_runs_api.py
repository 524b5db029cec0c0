"""The runs API: 202 on submit, and a clear 4xx JSON error for every bad input — never a 500."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from agents.models import Run

pytestmark = pytest.mark.django_db

URL = "/api/v1/runs"


def error_of(response) -> dict:
    body = response.json()
    assert set(body) == {"error"}, body
    assert {"code", "message"} <= set(body["error"])
    return body["error"]


def test_a_valid_submission_is_accepted_with_202_and_queued(api_client, demo_agent) -> None:
    response = api_client.post(
        URL, {"agent": "company-assistant", "query": "김하늘 님은 어느 팀 소속인가요?"}, format="json"
    )
    assert response.status_code == 202
    body = response.json()
    assert body["status"] == "queued"
    assert Run.objects.get(id=body["id"]).query == "김하늘 님은 어느 팀 소속인가요?"


def test_korean_text_comes_back_unescaped(api_client, demo_agent) -> None:
    response = api_client.post(URL, {"agent": "company-assistant", "query": "팀 인원"}, format="json")
    assert "팀 인원".encode() in response.content


def test_a_missing_query_is_a_400_naming_the_field(api_client, demo_agent) -> None:
    response = api_client.post(URL, {"agent": "company-assistant"}, format="json")
    assert response.status_code == 400
    assert "query" in error_of(response)["fields"]


def test_a_query_of_the_wrong_type_is_a_400(api_client, demo_agent) -> None:
    response = api_client.post(URL, {"agent": "company-assistant", "query": 123}, format="json")
    assert response.status_code == 400
    assert "query" in error_of(response)["fields"]


def test_context_of_the_wrong_type_is_a_400(api_client, demo_agent) -> None:
    response = api_client.post(URL, {"agent": "company-assistant", "query": "q", "context": "x"}, format="json")
    assert response.status_code == 400
    assert "context" in error_of(response)["fields"]


def test_a_body_that_is_not_json_is_a_400(api_client, demo_agent) -> None:
    response = api_client.post(URL, data="{not json", content_type="application/json")
    assert response.status_code == 400
    assert error_of(response)["code"] == "invalid_json"


def test_a_json_body_that_is_not_an_object_is_a_400(api_client, demo_agent) -> None:
    response = api_client.post(URL, data="[1, 2]", content_type="application/json")
    assert response.status_code == 400
    assert error_of(response)["code"] == "invalid_input"


def test_a_form_encoded_body_is_a_415(api_client, demo_agent) -> None:
    response = api_client.post(URL, data="agent=x&query=y", content_type="application/x-www-form-urlencoded")
    assert response.status_code == 415
    assert error_of(response)["code"] == "unsupported_media_type"


def test_an_unknown_agent_is_a_404(api_client, demo_agent) -> None:
    response = api_client.post(URL, {"agent": "nobody", "query": "hi"}, format="json")
    assert response.status_code == 404
    assert error_of(response)["code"] == "agent_not_found"


def test_a_disabled_agent_is_a_409(api_client, demo_agent) -> None:
    demo_agent.enabled = False
    demo_agent.save()
    response = api_client.post(URL, {"agent": "company-assistant", "query": "hi"}, format="json")
    assert response.status_code == 409


def test_an_overlong_query_is_a_413(api_client, demo_agent, settings) -> None:
    settings.PLATFORM_RUN_QUERY_MAX_CHARS = 10
    response = api_client.post(URL, {"agent": "company-assistant", "query": "가" * 11}, format="json")
    assert response.status_code == 413


def test_a_missing_key_is_a_401_with_a_bearer_challenge(db) -> None:
    response = APIClient().post(URL, {"agent": "company-assistant", "query": "hi"}, format="json")
    assert response.status_code == 401
    assert error_of(response)["code"] == "not_authenticated"
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_a_wrong_key_is_a_401(db) -> None:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer apk_not-a-real-key")
    response = client.get(f"{URL}/00000000-0000-0000-0000-000000000000")
    assert response.status_code == 401
    assert error_of(response)["code"] == "authentication_failed"


def test_a_malformed_authorization_header_is_a_401(db) -> None:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token abc")
    assert client.get(f"{URL}/x").status_code == 401


def test_a_revoked_key_is_a_401(api_client, api_caller) -> None:
    from django.utils import timezone

    key, _raw = api_caller
    key.revoked_at = timezone.now()
    key.save()
    assert api_client.get(f"{URL}/00000000-0000-0000-0000-000000000000").status_code == 401


def test_a_malformed_run_id_is_a_404(api_client) -> None:
    response = api_client.get(f"{URL}/not-a-uuid")
    assert response.status_code == 404
    assert error_of(response)["code"] == "run_not_found"


def test_another_callers_run_is_a_404(api_client, demo_agent, outsider) -> None:
    run_id = api_client.post(URL, {"agent": "company-assistant", "query": "hi"}, format="json").json()["id"]
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Bearer {outsider[1]}")
    assert other.get(f"{URL}/{run_id}").status_code == 404
    assert api_client.get(f"{URL}/{run_id}").status_code == 200


def test_a_key_scoped_to_other_agents_cannot_use_this_one(demo_agent) -> None:
    from agents.models import Agent
    from agents.services import api_key_create

    other = Agent.objects.create(slug="other", name="other")
    _key, raw = api_key_create(name="scoped", agents=[other])
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    response = client.post(URL, {"agent": "company-assistant", "query": "hi"}, format="json")
    assert response.status_code == 404


def test_an_unknown_api_path_is_a_json_404(api_client) -> None:
    response = api_client.get("/api/v1/nothing-here")
    assert response.status_code == 404
    assert error_of(response)["code"] == "not_found"


def test_a_wrong_method_is_a_405(api_client) -> None:
    response = api_client.delete(URL)
    assert response.status_code == 405
    assert error_of(response)["code"] == "method_not_allowed"
