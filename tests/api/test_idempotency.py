"""Idempotency-Key: the same key and body (from the same API key) return the run the first request created;
the same key with another body is a 409; two identical requests racing create one run."""

from __future__ import annotations

import hashlib
import json
import threading
import time

import pytest
from django.db import connection
from rest_framework.test import APIClient

from agents import services
from agents.models import Run

URL = "/api/v1/runs"
BODY = {"agent": "company-assistant", "query": "김하늘 님은 어느 팀 소속인가요?", "context": {"userId": "u-1"}}


def post(client: APIClient, body: dict | str, key: str | None = "order-7f3a") -> object:
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key is not None else {}
    if isinstance(body, str):
        return client.post(URL, data=body, content_type="application/json", **headers)
    return client.post(URL, body, format="json", **headers)


@pytest.mark.django_db
def test_the_same_key_and_body_return_the_same_run_with_200(api_client, demo_agent) -> None:
    first = post(api_client, BODY)
    again = post(api_client, BODY)
    assert first.status_code == 202
    assert again.status_code == 200
    assert again.json()["id"] == first.json()["id"]
    assert again["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first
    assert Run.objects.count() == 1


@pytest.mark.django_db
def test_key_order_and_spacing_do_not_make_another_body(api_client, demo_agent) -> None:
    first = post(api_client, BODY)
    reordered = (
        '{ "context": {"userId": "u-1"},  "query": "김하늘 님은 어느 팀 소속인가요?", "agent": "company-assistant" }'
    )
    again = post(api_client, reordered)
    assert again.status_code == 200
    assert again.json()["id"] == first.json()["id"]


@pytest.mark.django_db
def test_the_same_key_with_another_body_is_a_409(api_client, demo_agent) -> None:
    post(api_client, BODY)
    response = post(api_client, {**BODY, "query": "다른 질문"})
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "idempotency_key_reused"
    assert Run.objects.count() == 1


@pytest.mark.django_db
def test_the_request_digest_is_the_sha256_of_the_canonical_run_input(api_client, demo_agent) -> None:
    # Of the run the request asks for (since 2026-12-07), not of the body's bytes: the same query typed decomposed,
    # or with a space the query loses, is the same request.
    run_id = post(api_client, BODY).json()["id"]
    run_input = {"agent": BODY["agent"], "query": BODY["query"], "context": BODY["context"], "data": [], "files": []}
    canonical = json.dumps(run_input, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    expected = hashlib.sha256(canonical.encode()).hexdigest()
    run = Run.objects.get(id=run_id)
    assert (run.idempotency_key, run.request_digest) == ("order-7f3a", expected)


@pytest.mark.django_db
def test_a_retry_of_a_run_stored_with_the_bodys_digest_is_replayed(api_client, demo_agent) -> None:
    # A run stored before the digest was of the run's input holds the body's: a retry across the upgrade replays it.
    run_id = post(api_client, BODY).json()["id"]
    canonical = json.dumps(BODY, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    Run.objects.filter(id=run_id).update(request_digest=hashlib.sha256(canonical.encode()).hexdigest())
    again = post(api_client, BODY)
    assert again.status_code == 200 and again.json()["id"] == run_id and again["Idempotent-Replayed"] == "true"


@pytest.mark.django_db
def test_keys_are_scoped_to_the_api_key(api_client, demo_agent, other_caller) -> None:
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Bearer {other_caller.raw_key}")
    mine = post(api_client, BODY).json()["id"]
    theirs = post(other, BODY)
    assert theirs.status_code == 202
    assert theirs.json()["id"] != mine


@pytest.mark.django_db
def test_without_a_key_every_request_makes_a_run(api_client, demo_agent) -> None:
    post(api_client, BODY, key=None)
    post(api_client, BODY, key=None)
    assert Run.objects.count() == 2


@pytest.mark.django_db
def test_a_replay_is_refused_as_a_new_request_once_its_agent_is_disabled(api_client, demo_agent) -> None:
    # The key may no longer use the agent, so it does not get the run's answer back (tests/api/test_key_scope_narrowed.py).
    post(api_client, BODY)
    demo_agent.enabled = False
    demo_agent.save()
    again = post(api_client, BODY)
    assert (again.status_code, again.json()["error"]["code"]) == (409, "agent_disabled")
    assert post(api_client, BODY, key="fresh-key").status_code == 409


@pytest.mark.django_db
@pytest.mark.parametrize("key", ["", "   ", "has space", "x" * 201, "키"])
def test_a_malformed_key_is_a_400(api_client, demo_agent, key) -> None:
    response = post(api_client, BODY, key=key)
    assert response.status_code == 400
    assert "Idempotency-Key" in response.json()["error"]["fields"]
    assert Run.objects.count() == 0


@pytest.mark.django_db
def test_a_failed_request_does_not_use_up_the_key(api_client, demo_agent) -> None:
    assert post(api_client, {**BODY, "agent": "nobody"}).status_code == 404
    assert post(api_client, BODY).status_code == 202


@pytest.mark.django_db(transaction=True)
def test_two_identical_requests_at_once_create_one_run(api_client, demo_agent, monkeypatch) -> None:
    dispatched: list[str] = []
    monkeypatch.setattr(
        "agents.services.run_dispatch", lambda *, run_id, time_limit_s, purpose=None: dispatched.append(run_id) or True
    )
    # Widen the window between "no earlier run with this key" and "create it": without the lock on the API key's
    # row, both requests would pass the check before either created its run.
    real_create = services.run_create

    def slow_create(**kwargs):  # type: ignore[no-untyped-def]
        time.sleep(0.3)
        return real_create(**kwargs)

    monkeypatch.setattr(services, "run_create", slow_create)
    start = threading.Barrier(2)
    responses: list = []

    def request() -> None:
        try:
            start.wait()
            responses.append(post(api_client, BODY, key="race-1"))
        finally:
            connection.close()

    threads = [threading.Thread(target=request) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(r.status_code for r in responses) == [200, 202]
    assert len({r.json()["id"] for r in responses}) == 1
    assert Run.objects.count() == 1
    assert dispatched == [responses[0].json()["id"]]
