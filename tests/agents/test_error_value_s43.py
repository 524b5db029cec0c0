"""A read tool's own error returned as a value (seed 002 §8: ``{"error": "classifier_unavailable", "fallback":
"retry"}``) is a failed call (``tool:error_value``), s43: it was handed over as an answer, so a rule's template
phrased "the classifier is down" as "환자식별번호의 도메인 그룹: 미분류" in a run that succeeded with no failed
call, the per-tool error rate counted it a success, and the A/B citation rate counted it a citation.

The server is real (``tests/mcp_fixtures/error_value_ledger_server.py``: its first ``classify_term`` answers the
error value); only the model is scripted."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from agents.execution import run_execute
from agents.experiments import arm_metrics
from agents.models import DeterministicRule, Run
from agents.services import api_key_create
from auditor.metrics import tool_metrics
from mcpregistry.models import McpServer
from tests.conftest import make_agent
from tests.mcpregistry.test_gate_error_value_and_key import ledger, received, server  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.django_db, pytest.mark.slow]


def executed(agent: Any, query: str, **fields: Any) -> Run:
    key, _raw = api_key_create(actor="test", via="tests", name="caller")
    run = Run.objects.create(agent=agent, api_key=key, query=query, **fields)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    return run


@pytest.mark.parametrize("template", ["{params.term}의 도메인 그룹: {result.group|미분류}", "그룹: {result.group}"])
def test_a_rules_template_never_phrases_a_tools_error_value_as_its_answer(
    server: McpServer,  # noqa: F811 - the fixture
    ledger: Path,  # noqa: F811 - the fixture
    template: str,
) -> None:
    agent = make_agent(slug="classify", servers=[server], with_demo_rules=False)  # offline: no model
    DeterministicRule.objects.create(
        agent=agent,
        server=server,
        name="분류",
        order=10,
        tool_name="classify_term",
        when={"any_keywords": ["분류"]},
        params={"term": "환자식별번호"},
        answer_template=template,
    )

    run = executed(agent, "환자식별번호 도메인 분류해줘")

    # The rule path's "could not get it", with the tool's own words quoted (never its JSON, nor "미분류").
    assert (run.status, run.error_code, run.tool_failures) == (Run.Status.FAILED, "deterministic:tool_failed", 1)
    assert run.error_message.endswith("classify_term 도구의 답: “classifier_unavailable”"), run.error_message
    assert "미분류" not in run.error_message and "fallback" not in run.error_message
    assert "도메인 그룹" not in run.answer and "그룹:" not in run.answer
    [result] = run.deterministic_results
    assert (result["ok"], result["error"]) == (False, "tool:error_value")
    assert len(received(ledger, "classify_term")) == 1


def test_a_models_call_answered_with_an_error_value_counts_as_an_error_and_no_citation(
    server: McpServer,  # noqa: F811 - the fixture
    ledger: Path,  # noqa: F811 - the fixture
) -> None:
    script = [
        {"tool_calls": [{"name": "classify_term", "args": {"term": "환자식별번호"}, "id": "c1"}]},
        {"content": "분류기를 지금 사용할 수 없습니다."},
    ]
    agent = make_agent(slug="classify-ab", servers=[server], provider="scripted", script=script, with_demo_rules=False)

    run = executed(agent, "환자식별번호 도메인 분류해줘", arm="b")

    assert run.status == Run.Status.SUCCEEDED and run.tool_failures == 1
    [tool_message] = [m for m in run.messages if m.get("type") == "tool"]
    assert tool_message["status"] == "error"
    assert "[tool:error_value]" in tool_message["content"] and "classifier_unavailable" in tool_message["content"]
    # The per-tool error rate, by reason.
    report = tool_metrics(since=timezone.now() - dt.timedelta(hours=1))
    [classify] = [t for t in report.tools if t.tool == "classify_term"]
    assert (classify.calls, classify.errors, classify.errors_by_reason) == (1, 1, {"tool:error_value": 1})
    assert report.errors == 1
    # The A/B tool-citation rate: the answer rests on no tool result.
    [arm] = arm_metrics(agent=agent)
    assert (arm.arm, arm.runs, arm.succeeded, arm.cited) == ("b", 1, 1, 0)
