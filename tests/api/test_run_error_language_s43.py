"""A failed run's error message in the REST caller's language (``GET /runs/{id}``, ``GET /runs``).

The defect: the engine stores a run's error message in English; the A2A and MCP servers read it back in the
caller's language (``agents.error_texts.error_message_text``), while the REST API returned it as stored, so a
Korean caller read "the agent did not finish within 1 iterations". ``code`` stays the stable value.
"""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from agents.execution import run_execute
from agents.models import Agent, Run
from tests.conftest import ApiCaller, bind_demo_server, make_agent

pytestmark = pytest.mark.django_db

RUNS = "/api/v1/runs"


@pytest.mark.slow
def test_a_runs_error_message_reads_in_the_callers_language(api_client: APIClient, api_caller: ApiCaller) -> None:
    script = [{"tool_calls": [{"name": "no_such_tool", "args": {}}]}] * 5
    agent = make_agent(
        slug="api-loops",
        servers=[bind_demo_server(mcp_id="loops-api")],
        provider="scripted",
        script=script,
        with_demo_rules=False,
    )
    Agent.objects.filter(pk=agent.pk).update(max_iterations=1)
    run = Run.objects.create(agent=agent, api_key=api_caller.key, query="아무거나")
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert (run.status, run.error_code) == (Run.Status.FAILED, "max_iterations")
    assert run.error_message == "the agent did not finish within 1 iterations"  # stored as the engine wrote it

    korean = {"code": "max_iterations", "message": "에이전트가 1번 반복 안에 끝내지 못함"}
    english = {"code": "max_iterations", "message": "the agent did not finish within 1 iterations"}
    for language, error in (("ko", korean), ("en", english)):
        one = api_client.get(f"{RUNS}/{run.id}", HTTP_ACCEPT_LANGUAGE=language)
        assert one.status_code == 200, one.content
        assert one.json()["error"] == error
        listed = api_client.get(RUNS, HTTP_ACCEPT_LANGUAGE=language)
        assert listed.status_code == 200, listed.content
        assert [r["error"] for r in listed.json()["results"] if r["id"] == str(run.id)] == [error]
