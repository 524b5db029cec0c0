"""A run of a published version speaks and is traced as that version, not as the agent's draft edited since: the
A2A/MCP progress lines took the draft's language, and the run's span named the draft's model."""

from __future__ import annotations

from typing import Any

import pytest

from agents.api.protocol_http import status_progress_text, tool_progress_text
from agents.execution import run_execute
from agents.models import Agent, Run
from agents.services import agent_update, agent_version_publish, run_create

pytestmark = pytest.mark.django_db


def run_of(agent: Agent) -> Run:
    run = run_create(agent_slug=agent.slug, query="A-1001 자산의 현재 상태를 알려주세요.", api_key=None)
    run_execute(run_id=str(run.id))
    return Run.objects.select_related("agent", "version").get(pk=run.pk)


def test_a_published_versions_progress_lines_are_in_its_language_not_the_drafts(demo_agent: Agent) -> None:
    agent_update(agent=demo_agent, actor="test", via="tests", data={"language": "ko"})
    agent_version_publish(agent=Agent.objects.get(pk=demo_agent.pk), actor="test", via="tests")
    agent_update(agent=Agent.objects.get(pk=demo_agent.pk), actor="test", via="tests", data={"language": "en"})

    run = run_of(Agent.objects.get(pk=demo_agent.pk))

    assert run.version is not None and run.language == "ko" and run.agent.language == "en"
    assert status_progress_text(run, "succeeded") == "상태: 성공"
    assert "실패" in tool_progress_text(run, {"name": "get_asset", "ok": False})


def test_a_runs_span_names_the_model_its_version_calls(spans: Any, demo_agent: Agent) -> None:
    agent_update(agent=demo_agent, actor="test", via="tests", data={"model_id": "frozen-model"})
    agent_version_publish(agent=Agent.objects.get(pk=demo_agent.pk), actor="test", via="tests")
    agent_update(agent=Agent.objects.get(pk=demo_agent.pk), actor="test", via="tests", data={"model_id": "draft-model"})

    run = run_of(Agent.objects.get(pk=demo_agent.pk))

    assert run.version is not None
    [invoke] = [s for s in spans.get_finished_spans() if s.name.startswith("invoke_agent")]
    assert invoke.attributes.get("gen_ai.request.model") == "frozen-model"
