"""A key sees only the agents it may use now (review defect 1): once it is taken off an agent (its agents narrowed,
or the agent disabled), that agent's runs it submitted earlier are a ``404 run_not_found`` on every REST endpoint,
as another key's run is, and as A2A already answers (``agent_get_for_key``): it can no longer read, list, cancel,
approve, rate or follow them. Widened again (or the agent enabled again), it sees them again. Nor does it get such a run back by sending its
request again under the same Idempotency-Key (answered as a new submission is: 404 ``agent_not_found`` or 409
``agent_disabled``), or cancel it by an MCP ``notifications/cancelled`` (ignored, as for a request id it never sent)."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from agent_platform.errors import ApplicationError
from agents.api.mcp_server import call_idempotency_key
from agents.models import Agent, ApiKey, Approval, Run
from agents.selectors import run_get
from agents.services import agent_update, api_key_create, api_key_update

pytestmark = pytest.mark.django_db

URL = "/api/v1/runs"


@pytest.fixture
def agents() -> tuple[Agent, Agent]:
    return (
        Agent.objects.create(slug="company-assistant", name="company-assistant", model_provider="offline"),
        Agent.objects.create(slug="other", name="other", model_provider="offline"),
    )


@pytest.fixture
def scoped(agents: tuple[Agent, Agent]) -> tuple[ApiKey, APIClient, str]:
    """A key scoped to company-assistant, its client, and its raw key."""
    key, raw = api_key_create(actor="test", via="tests", name="scoped", agents=[agents[0]])
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return key, client, raw


def parked_run(agent: Agent, key: ApiKey) -> tuple[Run, Approval]:
    run = Run.objects.create(agent=agent, api_key=key, query="메모 남겨줘", status=Run.Status.AWAITING_APPROVAL)
    approval = Approval.objects.create(
        run=run,
        mcp_id="notes",
        tool="append_note",
        args={"text": "x"},
        call_hash="h",
        expires_at=timezone.now() + dt.timedelta(hours=1),
    )
    return run, approval


def finished_run(agent: Agent, key: ApiKey) -> Run:
    return Run.objects.create(
        agent=agent, api_key=key, query="q", status=Run.Status.SUCCEEDED, answer="a", finished_at=timezone.now()
    )


def narrow(key: ApiKey, to: Agent) -> None:
    api_key_update(api_key=key, actor="test", via="tests", agents=[to])


def assert_run_not_found(response: Any) -> None:
    assert response.status_code == 404, response.content
    assert response.json()["error"]["code"] == "run_not_found"


def test_a_narrowed_key_can_no_longer_approve_its_parked_run(scoped, agents) -> None:  # type: ignore[no-untyped-def]
    key, client, _raw = scoped
    run, approval = parked_run(agents[0], key)
    narrow(key, agents[1])
    response = client.post(f"{URL}/{run.id}/approvals/{approval.id}", {"decision": "approve"}, format="json")
    assert_run_not_found(response)
    approval.refresh_from_db()
    run.refresh_from_db()
    assert (approval.status, run.status) == (Approval.Status.PENDING, Run.Status.AWAITING_APPROVAL)


def test_a_narrowed_key_can_no_longer_cancel_its_run(scoped, agents) -> None:  # type: ignore[no-untyped-def]
    key, client, _raw = scoped
    run, _approval = parked_run(agents[0], key)
    narrow(key, agents[1])
    assert_run_not_found(client.post(f"{URL}/{run.id}/cancel"))
    run.refresh_from_db()
    assert run.status == Run.Status.AWAITING_APPROVAL


def test_a_narrowed_key_can_no_longer_read_its_run_and_widened_again_it_can(scoped, agents) -> None:  # type: ignore[no-untyped-def]
    key, client, _raw = scoped
    run, _approval = parked_run(agents[0], key)
    assert client.get(f"{URL}/{run.id}").status_code == 200
    narrow(key, agents[1])
    assert_run_not_found(client.get(f"{URL}/{run.id}"))
    api_key_update(api_key=key, actor="test", via="tests", agents=[agents[1], agents[0]])
    assert client.get(f"{URL}/{run.id}").status_code == 200


def test_a_narrowed_key_can_no_longer_rate_its_run(scoped, agents) -> None:  # type: ignore[no-untyped-def]
    key, client, _raw = scoped
    run = finished_run(agents[0], key)
    narrow(key, agents[1])
    assert_run_not_found(client.post(f"{URL}/{run.id}/feedback", {"score": 1}, format="json"))
    run.refresh_from_db()
    assert run.feedback_at is None


def test_a_narrowed_key_no_longer_lists_the_runs_of_the_agent_it_lost(scoped, agents) -> None:  # type: ignore[no-untyped-def]
    key, client, _raw = scoped
    lost = finished_run(agents[0], key)
    kept = finished_run(agents[1], key)
    assert [r["id"] for r in client.get(URL).json()["results"]] == [str(lost.id)]
    api_key_update(api_key=key, actor="test", via="tests", agents=[agents[1]])
    assert [r["id"] for r in client.get(URL).json()["results"]] == [str(kept.id)]
    assert client.get(URL, {"agent": "company-assistant"}).json()["results"] == []


def test_a_narrowed_key_can_no_longer_follow_its_runs_events(scoped, agents) -> None:  # type: ignore[no-untyped-def]
    key, _client, raw = scoped
    run = finished_run(agents[0], key)
    narrow(key, agents[1])
    response = Client().get(f"{URL}/{run.id}/events", HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert_run_not_found(response)


def test_the_runs_of_a_disabled_agent_are_hidden_until_it_is_enabled_again(api_caller, api_client, agents) -> None:  # type: ignore[no-untyped-def]
    run, approval = parked_run(agents[0], api_caller.key)  # a key for every agent
    Agent.objects.filter(pk=agents[0].pk).update(enabled=False)
    assert_run_not_found(api_client.get(f"{URL}/{run.id}"))
    assert_run_not_found(api_client.post(f"{URL}/{run.id}/approvals/{approval.id}", {"decision": "approve"}))
    assert api_client.get(URL).json()["results"] == []
    Agent.objects.filter(pk=agents[0].pk).update(enabled=True)
    assert api_client.get(f"{URL}/{run.id}").status_code == 200
    assert [r["id"] for r in api_client.get(URL).json()["results"]] == [str(run.id)]


def test_run_get_refuses_an_out_of_scope_run_as_it_refuses_another_keys(scoped, agents, other_caller) -> None:  # type: ignore[no-untyped-def]
    key, _client, _raw = scoped
    run = finished_run(agents[0], key)
    assert run_get(run_id=str(run.id), api_key=key) == run
    narrow(key, agents[1])
    for caller in (key, other_caller.key):
        with pytest.raises(ApplicationError, match="Run not found") as refused:
            run_get(run_id=str(run.id), api_key=caller)
        assert (refused.value.code, refused.value.status) == ("run_not_found", 404)


REPLAYED_BODY = {"agent": "company-assistant", "query": "김하늘 님은 어느 팀 소속인가요?"}


def submitted_and_answered(client: APIClient) -> Run:
    """A run submitted under an Idempotency-Key, then finished with an answer the key must not get back once it
    may no longer use the agent (review defect: the replay was looked up before the key's scope was checked)."""
    response = client.post(URL, REPLAYED_BODY, format="json", HTTP_IDEMPOTENCY_KEY="order-7f3a")
    assert response.status_code == 202, response.content
    Run.objects.filter(pk=response.json()["id"]).update(
        status=Run.Status.SUCCEEDED, answer="비밀 답변", finished_at=timezone.now()
    )
    return Run.objects.get(pk=response.json()["id"])


def assert_answered_as_a_new_submission(client: APIClient, status: int, code: str) -> None:
    """The replayed request is refused exactly as the same body under a fresh Idempotency-Key is."""
    replayed = client.post(URL, REPLAYED_BODY, format="json", HTTP_IDEMPOTENCY_KEY="order-7f3a")
    fresh = client.post(URL, REPLAYED_BODY, format="json", HTTP_IDEMPOTENCY_KEY="order-new")
    assert (replayed.status_code, replayed.json()["error"]["code"]) == (status, code), replayed.content
    assert (replayed.status_code, replayed.json()) == (fresh.status_code, fresh.json())
    assert "비밀 답변" not in replayed.content.decode()
    assert "Idempotent-Replayed" not in replayed


def test_a_narrowed_key_does_not_get_its_earlier_run_back_by_replaying_its_request(scoped, agents) -> None:  # type: ignore[no-untyped-def]
    key, client, _raw = scoped
    submitted_and_answered(client)
    narrow(key, agents[1])
    assert_answered_as_a_new_submission(client, 404, "agent_not_found")
    assert (
        client.post(f"{URL}?wait=1", REPLAYED_BODY, format="json", HTTP_IDEMPOTENCY_KEY="order-7f3a").status_code == 404
    )
    assert Run.objects.count() == 1


def test_a_key_does_not_get_its_earlier_run_back_by_replaying_it_once_the_agent_is_disabled(scoped, agents) -> None:  # type: ignore[no-untyped-def]
    _key, client, _raw = scoped
    submitted_and_answered(client)
    agent_update(agent=agents[0], actor="test", via="tests", data={"enabled": False})
    assert_answered_as_a_new_submission(client, 409, "agent_disabled")
    assert Run.objects.count() == 1


def mcp_cancel(raw: str, request_id: int) -> int:
    body = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": request_id}}
    response = Client().post(
        "/mcp/",
        json.dumps(body),
        content_type="application/json",
        headers={"Accept": "application/json", "Authorization": f"Bearer {raw}"},
    )
    return int(response.status_code)


def test_a_narrowed_key_can_no_longer_cancel_its_mcp_call_and_is_answered_as_for_an_unknown_request(  # type: ignore[no-untyped-def]
    scoped, agents
) -> None:
    key, client, raw = scoped
    run = Run.objects.create(agent=agents[0], api_key=key, query="q", idempotency_key=call_idempotency_key("", 7))
    narrow(key, agents[1])
    assert_run_not_found(client.post(f"{URL}/{run.id}/cancel"))  # as REST answers it
    assert mcp_cancel(raw, 7) == mcp_cancel(raw, 8) == 202  # as a request id it never sent
    run.refresh_from_db()
    assert run.status == Run.Status.QUEUED
    api_key_update(api_key=key, actor="test", via="tests", agents=[agents[0]])
    assert mcp_cancel(raw, 7) == 202
    run.refresh_from_db()
    assert run.status == Run.Status.CANCELLED
