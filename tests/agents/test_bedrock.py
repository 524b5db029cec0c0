"""The Bedrock provider end to end through ChatBedrockConverse, with botocore's Stubber answering Converse."""

from __future__ import annotations

import boto3
import pytest
from botocore.stub import Stubber

from agents import llm
from agents.execution import run_execute
from agents.models import Run
from audit.models import AuditEvent
from tests.conftest import make_agent

pytestmark = pytest.mark.django_db


def converse_reply(content: list[dict], stop_reason: str) -> dict:
    return {
        "output": {"message": {"role": "assistant", "content": content}},
        "stopReason": stop_reason,
        "usage": {"inputTokens": 120, "outputTokens": 12, "totalTokens": 132},
        "metrics": {"latencyMs": 50},
    }


@pytest.fixture
def stubbed_bedrock(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    client = boto3.client("bedrock-runtime", region_name="us-east-1")
    stubber = Stubber(client)
    monkeypatch.setattr(llm, "bedrock_runtime_client", lambda *, region_name: client)
    with stubber:
        yield stubber
    stubber.assert_no_pending_responses()


def test_a_bedrock_agent_calls_a_tool_through_the_gate_and_answers(demo_server, stubbed_bedrock) -> None:
    tool_use = {"toolUse": {"toolUseId": "tu-1", "name": "search_employee", "input": {"name": "박도윤"}}}
    stubbed_bedrock.add_response(
        "converse",
        converse_reply([tool_use], "tool_use"),
    )
    stubbed_bedrock.add_response(
        "converse",
        converse_reply([{"text": "박도윤 님은 물류플랫폼팀 소속입니다."}], "end_turn"),
    )
    agent = make_agent(slug="bedrock", servers=[demo_server], provider="bedrock", with_demo_rules=False)
    agent.model_id = "anthropic.claude-3-haiku-20240307-v1:0"
    agent.model_params = {"region_name": "us-east-1"}
    agent.save()
    run = Run.objects.create(agent=agent, query="박도윤 님 팀?")
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert run.answer == "박도윤 님은 물류플랫폼팀 소속입니다."
    event = AuditEvent.objects.get(run_id=run.id, action="tool.call")
    assert (event.source, event.tool, event.args, event.ok) == ("agent", "search_employee", {"name": "박도윤"}, True)
    assert run.token_usage["input_tokens"] == 240
    tool_message = next(s for s in run.messages if s["type"] == "tool")
    assert "물류플랫폼팀" in tool_message["content"]


def test_a_bedrock_error_fails_the_run_with_a_value_not_a_crash(demo_server, stubbed_bedrock) -> None:
    stubbed_bedrock.add_client_error("converse", service_error_code="ThrottlingException", http_status_code=429)
    agent = make_agent(slug="bedrock-down", servers=[demo_server], provider="bedrock", with_demo_rules=False)
    agent.model_id = "anthropic.claude-3-haiku-20240307-v1:0"
    agent.model_params = {"region_name": "us-east-1"}
    agent.save()
    run = Run.objects.create(agent=agent, query="안녕")
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert run.status == Run.Status.FAILED
    assert run.error_code == "model:error"
    assert "ThrottlingException" in run.error_message
