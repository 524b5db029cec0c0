"""The Bedrock provider end to end through ChatBedrockConverse, with botocore's Stubber answering Converse."""

from __future__ import annotations

import boto3
import pytest
from botocore.stub import ANY, Stubber
from django.utils import translation

from agents import providers
from agents.budgets import budget_create, budget_reserve
from agents.execution import run_execute
from agents.model_texts import attempts_text
from agents.models import Agent, Run
from agents.providers import supports_tool_choice
from audit.models import AuditEvent
from tests.conftest import make_agent

pytestmark = pytest.mark.django_db

HAIKU = "anthropic.claude-3-haiku-20240307-v1:0"


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
    monkeypatch.setattr(providers, "bedrock_runtime_client", lambda *, region_name, timeout_s: client)
    with stubber:
        yield stubber
    stubber.assert_no_pending_responses()


GUARDRAIL_CONFIG = {"guardrailIdentifier": "gr-7", "guardrailVersion": "3", "trace": "enabled"}


def test_a_bedrock_agent_with_a_guardrail_calls_a_tool_through_the_gate_and_answers(
    demo_server, stubbed_bedrock
) -> None:
    """The Bedrock path still passes with Guardrails on: both model calls carry the guardrail, the tool call goes
    through the gate (audited), and the answer comes back."""
    converse_params = {
        "modelId": HAIKU,
        "messages": ANY,
        "system": ANY,
        "inferenceConfig": ANY,
        "toolConfig": {"tools": ANY},
        "guardrailConfig": GUARDRAIL_CONFIG,
    }
    tool_use = {"toolUse": {"toolUseId": "tu-1", "name": "search_employee", "input": {"name": "박도윤"}}}
    stubbed_bedrock.add_response("converse", converse_reply([tool_use], "tool_use"), expected_params=converse_params)
    stubbed_bedrock.add_response(
        "converse",
        converse_reply([{"text": "박도윤 님은 물류플랫폼팀 소속입니다."}], "end_turn"),
        expected_params=converse_params,
    )
    agent = make_agent(slug="bedrock", servers=[demo_server], provider="bedrock", with_demo_rules=False)
    agent.model_id = "anthropic.claude-3-haiku-20240307-v1:0"
    agent.model_params = {"region_name": "us-east-1", "guardrail": {"id": "gr-7", "version": "3"}}
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
    assert not any(s.get("guardrail") for s in run.messages)  # the guardrail let both turns through


@pytest.mark.slow
def test_under_a_budget_each_converse_call_is_capped_to_what_is_left_of_the_runs_reservation(
    demo_server, stubbed_bedrock
) -> None:
    sent: list[dict] = []
    stubbed_bedrock.client.meta.events.register(
        "provide-client-params.bedrock-runtime.Converse", lambda params, **kwargs: sent.append(params)
    )
    tool_use = {"toolUse": {"toolUseId": "tu-1", "name": "search_employee", "input": {"name": "박도윤"}}}
    stubbed_bedrock.add_response("converse", converse_reply([tool_use], "tool_use"))
    stubbed_bedrock.add_response("converse", converse_reply([{"text": "물류플랫폼팀입니다."}], "end_turn"))
    agent = bedrock_agent(demo_server, slug="bedrock-budget", max_tokens=4000)
    budget_create(
        actor="test-admin",
        via="tests",
        data={"agent": agent, "period": "day", "max_tokens": 1_000_000, "run_reservation_tokens": 20_000},
    )
    run = Run.objects.create(agent=agent, query="박도윤 님 팀?")
    budget_reserve(run=run, agent=agent, api_key=None)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    first, second = (params["inferenceConfig"]["maxTokens"] for params in sent)
    assert first == 4000  # the agent's own max_tokens is lower than what the reservation leaves
    assert second == 4000
    agent.model_params = {**agent.model_params, "max_tokens": None}
    agent.save()
    sent.clear()
    stubbed_bedrock.add_response("converse", converse_reply([{"text": "안녕하세요"}], "end_turn"))
    again = Run.objects.create(agent=agent, query="안녕")
    budget_reserve(run=again, agent=agent, api_key=None)
    run_execute(run_id=str(again.id))
    [params] = sent
    # The input bound (bytes of the prompt and tool schemas) is taken off the reservation: the rest is the cap.
    assert 0 < params["inferenceConfig"]["maxTokens"] < 20_000


def bedrock_agent(demo_server, *, slug: str, model_id: str = HAIKU, **params) -> Agent:
    agent = make_agent(slug=slug, servers=[demo_server], provider="bedrock", with_demo_rules=False)
    agent.model_id = model_id
    agent.model_params = {"region_name": "us-east-1", "retry": {"max_attempts": 2, "backoff_s": 0}, **params}
    agent.full_clean()
    agent.save()
    return agent


def submit(agent: Agent, query: str) -> Run:
    run = Run.objects.create(agent=agent, query=query)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    return run


def test_throttling_past_the_retries_fails_the_run_with_model_throttled(demo_server, stubbed_bedrock) -> None:
    for _ in range(2):
        stubbed_bedrock.add_client_error("converse", service_error_code="ThrottlingException", http_status_code=429)
    run = submit(bedrock_agent(demo_server, slug="bedrock-down"), "안녕")
    assert run.status == Run.Status.FAILED
    assert run.error_code == "model:throttled"
    with translation.override(run.agent.language):  # the run's language: the platform's words in it
        assert "ThrottlingException" in run.error_message and attempts_text(2) in run.error_message


def test_a_throttled_call_is_retried_and_the_run_succeeds(demo_server, stubbed_bedrock) -> None:
    stubbed_bedrock.add_client_error("converse", service_error_code="ThrottlingException", http_status_code=429)
    stubbed_bedrock.add_response("converse", converse_reply([{"text": "안녕하세요"}], "end_turn"))
    run = submit(bedrock_agent(demo_server, slug="bedrock-retry"), "안녕")
    assert (run.status, run.answer) == (Run.Status.SUCCEEDED, "안녕하세요")


def test_a_validation_error_is_not_retried(demo_server, stubbed_bedrock) -> None:
    stubbed_bedrock.add_client_error("converse", service_error_code="ValidationException", http_status_code=400)
    run = submit(bedrock_agent(demo_server, slug="bedrock-invalid"), "안녕")
    assert (run.status, run.error_code) == (Run.Status.FAILED, "model:validation")


GUARDRAIL_TRACE = {
    "guardrail": {
        "inputAssessment": {
            "gr-7": {"contentPolicy": {"filters": [{"type": "VIOLENCE", "confidence": "HIGH", "action": "BLOCKED"}]}}
        }
    }
}


def test_a_guardrail_a_cross_region_profile_and_a_tool_choice_are_passed_to_converse_and_the_intervention_is_traced(
    demo_server, stubbed_bedrock
) -> None:
    blocked = converse_reply([{"text": "이 요청에는 답할 수 없습니다."}], "guardrail_intervened")
    blocked["trace"] = GUARDRAIL_TRACE
    stubbed_bedrock.add_response(
        "converse",
        blocked,
        expected_params={
            "modelId": "us." + HAIKU,
            "messages": ANY,
            "system": ANY,
            "inferenceConfig": ANY,
            "toolConfig": {"tools": ANY, "toolChoice": {"any": {}}},
            "guardrailConfig": {"guardrailIdentifier": "gr-7", "guardrailVersion": "3", "trace": "enabled"},
        },
    )
    agent = bedrock_agent(
        demo_server,
        slug="guarded",
        model_id="us." + HAIKU,
        guardrail={"id": "gr-7", "version": "3"},
        tool_choice="any",
    )
    run = submit(agent, "위험한 질문")
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    [turn] = [s for s in run.messages if s["type"] == "ai"]
    assert turn["guardrail"]["stop_reason"] == "guardrail_intervened"
    assert turn["guardrail"]["trace"]["inputAssessment"]["gr-7"]["contentPolicy"]["filters"][0]["action"] == "BLOCKED"


def test_both_network_providers_declare_a_forced_tool_choice() -> None:
    assert supports_tool_choice(provider="openai_compatible")
    assert supports_tool_choice(provider="bedrock", model_id="apac." + HAIKU)
    assert not supports_tool_choice(provider="bedrock", model_id="meta.llama3-2-1b-instruct-v1:0")
    assert not supports_tool_choice(provider="offline")
