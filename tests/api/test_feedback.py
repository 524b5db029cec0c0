"""POST /api/v1/runs/{id}/feedback: a caller's satisfaction on -1..1 or 1..5, validated (bad values are 400s),
recorded on the caller's own finished run; the run's output carries its version and arm."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from agents.execution import run_execute
from agents.models import Agent, Run
from agents.services import agent_version_publish
from audit.models import AuditEvent
from tests.conftest import ApiCaller

pytestmark = pytest.mark.django_db


def finished_run(client: APIClient, agent: Agent) -> str:
    response = client.post(
        "/api/v1/runs", {"agent": agent.slug, "query": "A-1001 자산의 현재 상태를 알려주세요."}, format="json"
    )
    assert response.status_code == 202, response.content
    run_id = response.json()["id"]
    run_execute(run_id=run_id)
    return run_id


def feedback(client: APIClient, run_id: str, body: Any) -> Any:
    return client.post(f"/api/v1/runs/{run_id}/feedback", body, format="json")


@pytest.mark.parametrize(
    "body",
    [
        {"score": 7},
        {"score": -2},
        {"score": 4.5},  # a five-point score is a whole number
        {"score": 0.5, "scale": "five"},
        {"score": 3, "scale": "signed"},
        {"score": True},
        {"score": "1"},
        {"score": None},
        {},
        {"score": 1, "comment": 5},
        {"score": 1, "mood": "happy"},
        {"score": 1, "scale": "ten"},
        [1],
    ],
)
def test_a_bad_feedback_is_a_400_and_records_nothing(api_client, demo_agent, body) -> None:  # type: ignore[no-untyped-def]
    run_id = finished_run(api_client, demo_agent)
    response = feedback(api_client, run_id, body)
    assert response.status_code == 400, response.content
    assert set(response.json()) == {"error"}
    assert response.json()["error"]["code"] == "invalid_input"  # the code of every other input error
    assert Run.objects.get(id=run_id).feedback_at is None


def test_feedback_is_recorded_normalized_and_audited(api_client, api_caller, demo_agent) -> None:  # type: ignore[no-untyped-def]
    run_id = finished_run(api_client, demo_agent)
    response = feedback(api_client, run_id, {"score": 5, "comment": "정확해요"})
    assert response.status_code == 200, response.content
    assert response.json()["feedback"] == {"score": 1.0, "scale": "five", "comment": "정확해요"}
    # A five-point 1 says its scale; a later score replaces the earlier one.
    response = feedback(api_client, run_id, {"score": 1, "scale": "five"})
    assert response.json()["feedback"]["score"] == -1.0
    response = feedback(api_client, run_id, {"score": -0.5})
    assert response.json()["feedback"] == {"score": -0.5, "scale": "signed", "comment": ""}
    events = AuditEvent.objects.filter(action="run.feedback", run_id=run_id).order_by("id")
    assert events.count() == 3
    # The caller's act, recorded as the API's with the caller's key, not as an administrator's.
    assert {(e.source, e.actor) for e in events} == {("api", f"api_key:{api_caller.key.prefix}")}
    assert events.last().args == {"score": -0.5, "scale": "signed", "arm": ""}  # type: ignore[union-attr]


def test_feedback_on_an_unfinished_run_is_a_409_and_on_another_callers_run_a_404(
    api_client, demo_agent, other_caller: ApiCaller
) -> None:  # type: ignore[no-untyped-def]
    response = api_client.post("/api/v1/runs", {"agent": demo_agent.slug, "query": "q"}, format="json")
    queued = response.json()["id"]
    assert feedback(api_client, queued, {"score": 1}).status_code == 409
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Bearer {other_caller.raw_key}")
    assert feedback(other, queued, {"score": 1}).status_code == 404


def test_the_run_output_carries_its_version_and_arm(api_client, demo_agent) -> None:  # type: ignore[no-untyped-def]
    unversioned = finished_run(api_client, demo_agent)
    body = api_client.get(f"/api/v1/runs/{unversioned}").json()
    assert (body["version"], body["arm"]) == (None, "")
    agent_version_publish(agent=demo_agent, actor="test-admin", via="tests")
    run_id = finished_run(api_client, demo_agent)
    body = api_client.get(f"/api/v1/runs/{run_id}").json()
    assert (body["version"], body["arm"], body["status"]) == (1, "", "succeeded")
    listed = api_client.get("/api/v1/runs").json()["results"]
    assert [r["version"] for r in listed] == [1, None]


def test_feedback_is_found_under_the_api_source_and_counts_as_no_tool_call(api_client, api_caller, demo_agent) -> None:  # type: ignore[no-untyped-def]
    from auditor.metrics import tool_metrics
    from auditor.selectors import AuditEventFilters, audit_event_filter

    run_id = finished_run(api_client, demo_agent)
    calls = tool_metrics().calls
    assert feedback(api_client, run_id, {"score": 4}).status_code == 200
    found = audit_event_filter(AuditEvent.objects.all(), AuditEventFilters(source="api"))
    assert [(e.action, str(e.run_id)) for e in found] == [("run.feedback", run_id)]
    assert not audit_event_filter(AuditEvent.objects.filter(action="run.feedback"), AuditEventFilters(source="admin"))
    assert tool_metrics().calls == calls
