"""The runs API as a demanding client meets it: a cancellation refuses the fields it would ignore, and a reused
Idempotency-Key names the header, as a reused messageId names its field."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from agents.models import Agent, ApiKey, Run

URL = "/api/v1/runs"


@pytest.mark.django_db
def test_a_cancellation_refuses_a_body_it_would_ignore(api_client: APIClient, api_caller, demo_agent: Agent) -> None:  # type: ignore[no-untyped-def]
    key: ApiKey = api_caller[0]
    run = Run.objects.create(agent=demo_agent, api_key=key, query="김하늘 님은 어느 팀 소속인가요?")
    refused = api_client.post(f"{URL}/{run.id}/cancel", {"reason": "잘못 보냄"}, format="json")
    assert refused.status_code == 400, refused.content
    assert refused.json()["error"]["code"] == "invalid_input"
    assert refused.json()["error"]["fields"] == {"reason": ["Unknown field."]}
    run.refresh_from_db()
    assert run.status == Run.Status.QUEUED  # nothing was done
    listed = api_client.post(f"{URL}/{run.id}/cancel", [1], format="json")
    assert listed.status_code == 400, listed.content
    empty = api_client.post(f"{URL}/{run.id}/cancel", {}, format="json")
    assert empty.status_code == 200, empty.content
    assert empty.json()["status"] == "cancelled"


@pytest.mark.django_db
def test_a_reused_idempotency_key_names_the_header(api_client: APIClient, api_caller, demo_agent: Agent) -> None:  # type: ignore[no-untyped-def]
    headers = {"HTTP_IDEMPOTENCY_KEY": "s43-key"}
    first = api_client.post(URL, {"agent": demo_agent.slug, "query": "김하늘 님 팀"}, format="json", **headers)
    assert first.status_code == 202, first.content
    reused = api_client.post(URL, {"agent": demo_agent.slug, "query": "박도윤 님 팀"}, format="json", **headers)
    assert reused.status_code == 409, reused.content
    error = reused.json()["error"]
    assert error["code"] == "idempotency_key_reused"
    assert error["fields"] == {"Idempotency-Key": ["Used with another request body."]}
