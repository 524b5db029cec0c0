"""The model providers and the model call, where they went wrong: an A2A conversation's earlier turns taken for the
run's own model turns, a run taken over from a lost worker spending its reservation again, ``tool_choice`` forced on
every turn or sent to Bedrock as a tool named "none", signature refusals and a missing AWS region not read as the
model's failures, and a fault outside the model losing the turns it made. Only the model is scripted: Bedrock
through botocore's Stubber, the OpenAI-compatible provider through a local HTTP server."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import boto3
import pytest
from botocore.stub import ANY, Stubber
from django.utils import timezone

from agents import providers
from agents.budgets import budget_create
from agents.execution import run_execute
from agents.models import Agent, BudgetUsage, Run, RunEvent
from tests.agents.test_budgets import price_house_model, scripted_agent, submit
from tests.agents.test_budgets_unstored import interleave, turn_tokens
from tests.conftest import make_agent
from tests.openai_server import ScriptedOpenAIServer

pytestmark = pytest.mark.django_db

HAIKU = "anthropic.claude-3-haiku-20240307-v1:0"
SEARCH = {"toolUse": {"toolUseId": "tu-1", "name": "search_employee", "input": {"name": "박도윤"}}}


def converse_reply(content: list[dict[str, Any]], stop_reason: str = "end_turn") -> dict[str, Any]:
    return {
        "output": {"message": {"role": "assistant", "content": content}},
        "stopReason": stop_reason,
        "usage": {"inputTokens": 120, "outputTokens": 12, "totalTokens": 132},
        "metrics": {"latencyMs": 50},
    }


@pytest.fixture
def stubbed_bedrock(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    client = boto3.client("bedrock-runtime", region_name="us-east-1")
    stubber = Stubber(client)
    monkeypatch.setattr(providers, "bedrock_runtime_client", lambda *, region_name, timeout_s: client)
    with stubber:
        yield stubber
        stubber.assert_no_pending_responses()


def sent_to_converse(stubber: Stubber) -> list[dict[str, Any]]:
    """The parameters of every Converse call, as the client was given them."""
    sent: list[dict[str, Any]] = []
    stubber.client.meta.events.register(
        "provide-client-params.bedrock-runtime.Converse", lambda params, **kwargs: sent.append(params)
    )
    return sent


def bedrock_agent(demo_server, slug: str, **fields: Any) -> Agent:
    agent = make_agent(slug=slug, servers=[demo_server], provider="bedrock", with_demo_rules=False)
    agent.model_id = HAIKU
    agent.model_params = {"region_name": "us-east-1", "retry": {"max_attempts": 1}}
    for name, value in fields.items():
        setattr(agent, name, value)
    agent.full_clean()
    agent.save()
    return agent


def executed(agent: Agent, query: str, **fields: Any) -> Run:
    run = Run.objects.create(agent=agent, query=query, **fields)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    return run


def earlier_turns(agent: Agent, context_id: str, count: int) -> None:
    for i in range(count):
        Run.objects.create(
            agent=agent, query=f"q{i}", answer=f"a{i}", status=Run.Status.SUCCEEDED, context={"contextId": context_id}
        )


# --- 1. an A2A conversation's earlier turns are no model turns of the run -------------------------------------


def test_a_conversations_earlier_turns_do_not_use_up_the_runs_iterations(demo_server, stubbed_bedrock) -> None:
    agent = bedrock_agent(demo_server, "history", max_iterations=2)
    earlier_turns(agent, "c-1", 2)  # two earlier answers: as many as the agent's iterations
    sent = sent_to_converse(stubbed_bedrock)
    stubbed_bedrock.add_response("converse", converse_reply([{"text": "세 번째 답"}]))

    run = executed(agent, "q2", context={"contextId": "c-1"})

    assert (run.status, run.error_code) == (Run.Status.SUCCEEDED, ""), run.error_message
    assert run.answer == "세 번째 답"
    assert run.token_usage["model_calls"] == 1
    assert run.tokens == 132
    # The model still read the conversation: the earlier questions and answers, then this one.
    texts = [block["text"] for m in sent[0]["messages"] for block in m["content"] if "text" in block]
    assert texts == ["q0", "a0", "q1", "a1", "q2"]


def test_a_conversations_earlier_turns_leave_the_forced_first_tool_and_the_script_in_place(demo_server) -> None:
    script = [
        {"tool_calls": [{"name": "search_employee", "args": {"name": "박도윤"}}]},
        {"content": "답: {last_tool_result}"},
    ]
    agent = make_agent(
        slug="history-scripted", servers=[demo_server], provider="scripted", script=script, with_demo_rules=False
    )
    agent.tool_selection = {"force_first_tool": "search_employee"}
    agent.save()
    earlier_turns(agent, "c-2", 3)

    run = executed(agent, "박도윤 님 팀?", context={"contextId": "c-2"})

    assert run.status == Run.Status.SUCCEEDED, (run.error_code, run.error_message)
    assert run.answer.startswith("답: ") and "물류플랫폼팀" in run.answer
    assert run.token_usage["model_calls"] == 2
    turns = RunEvent.objects.filter(run=run, kind="model_turn").order_by("seq")
    assert [t.data["tool_calls"][0]["name"] for t in turns[:1]] == ["search_employee"]
    first_choice = run.conversation[-3]["data"]["response_metadata"]["tool_choice"]
    assert first_choice == "search_employee"  # the run's first turn is still forced


# --- 2. a run taken over from a lost worker counts what the lost delivery spent --------------------------------


def test_a_run_taken_over_does_not_spend_its_reservation_again(api_client, api_caller, monkeypatch) -> None:
    price_house_model()
    scripted_agent(turns=3, output_tokens=100_000)  # every tool-call turn writes as much as it may
    budget_create(
        actor="test-admin",
        via="tests",
        data={"api_key": api_caller.key, "period": "day", "max_tokens": 10_000, "run_reservation_tokens": 500},
    )
    run = Run.objects.get(pk=submit(api_client).json()["id"])

    def worker_gone() -> None:  # the first worker dies after its first model call; its lease lapses
        Run.objects.filter(pk=run.pk).update(
            worker="dead-host:1", lease_expires_at=timezone.now() - timedelta(seconds=1)
        )

    interleave(monkeypatch, "model_turn", worker_gone)
    run_execute(run_id=str(run.id))  # delivery 1: one model call, then its run is lost
    first = sum(turn_tokens(run))
    assert 0 < first <= 500
    run_execute(run_id=str(run.id))  # delivery 2 takes the run over
    run.refresh_from_db()

    spent = sum(turn_tokens(run))
    assert spent <= 500, f"the run spent {spent} tokens on a 500-token reservation ({first} before the takeover)"
    assert (run.status, run.error_code) == (Run.Status.FAILED, "budget:run_ceiling")
    assert BudgetUsage.objects.get().used_tokens == spent  # each call counted once


# --- 3. a forcing model_params.tool_choice holds for the run's first turn only -----------------------------------


def test_a_forced_bedrock_tool_choice_holds_for_the_first_turn_only(demo_server, stubbed_bedrock) -> None:
    sent = sent_to_converse(stubbed_bedrock)
    agent = bedrock_agent(demo_server, "choice-any")
    agent.model_params = {**agent.model_params, "tool_choice": "any"}
    agent.full_clean()
    agent.save()
    stubbed_bedrock.add_response("converse", converse_reply([SEARCH], "tool_use"))
    stubbed_bedrock.add_response("converse", converse_reply([{"text": "물류플랫폼팀입니다."}]))

    run = executed(agent, "박도윤 님 팀?")

    assert (run.status, run.answer) == (Run.Status.SUCCEEDED, "물류플랫폼팀입니다."), run.error_message
    assert sent[0]["toolConfig"].get("toolChoice") == {"any": {}}
    assert "toolChoice" not in sent[1]["toolConfig"], sent[1]["toolConfig"]


@pytest.mark.slow
def test_openai_compatible_tool_choice_any_is_forced_once_and_none_on_every_turn(demo_server) -> None:
    script = [
        {"tool_calls": [{"name": "search_employee", "args": {"name": "박도윤"}}]},
        {"content": "물류플랫폼팀입니다."},
    ]
    choices: dict[str, list[Any]] = {}
    for choice in ("any", "none"):
        with ScriptedOpenAIServer(script).running() as server:
            agent = make_agent(
                slug=f"openai-{choice}", servers=[demo_server], provider="openai_compatible", with_demo_rules=False
            )
            agent.model_id = "qwen2.5-7b-instruct"
            agent.model_params = {"base_url": server.base_url, "tool_choice": choice}
            agent.full_clean()
            agent.save()
            run = executed(agent, "박도윤 님 팀?")
        assert run.status == Run.Status.SUCCEEDED, (run.error_code, run.error_message)
        assert all(request["body"].get("tools") for request in server.requests)
        choices[choice] = [request["body"].get("tool_choice") for request in server.requests]
    assert choices == {"any": ["required", None], "none": ["none", "none"]}


# --- 4. tool_choice "none" on Bedrock: no tool named "none" ------------------------------------------------------


@pytest.mark.slow
def test_bedrock_tool_choice_none_gives_the_model_no_tools(demo_server, stubbed_bedrock) -> None:
    agent = bedrock_agent(demo_server, "choice-none")
    agent.model_params = {**agent.model_params, "tool_choice": "none"}
    agent.full_clean()  # accepted
    agent.save()
    stubbed_bedrock.add_response(
        "converse",
        converse_reply([{"text": "안녕하세요"}]),
        # No toolConfig: Converse's toolChoice is auto, any or a tool, and "none" would name a tool.
        expected_params={"modelId": HAIKU, "messages": ANY, "system": ANY, "inferenceConfig": ANY},
    )

    run = executed(agent, "안녕")

    assert (run.status, run.answer) == (Run.Status.SUCCEEDED, "안녕하세요"), (run.error_code, run.error_message)


# --- 5. a refused signature is an auth failure --------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("code", "status"),
    [
        ("InvalidSignatureException", 403),
        ("MissingAuthenticationTokenException", 403),
        ("IncompleteSignatureException", 400),
        ("SignatureDoesNotMatch", 403),
        ("SomeNewDenial", 403),
        ("SomeNewDenial", 401),
    ],
)
def test_a_refused_signature_or_credential_is_an_auth_failure(demo_server, stubbed_bedrock, code, status) -> None:
    stubbed_bedrock.add_client_error("converse", service_error_code=code, http_status_code=status)
    agent = bedrock_agent(demo_server, f"sig-{status}-{code.lower()}")

    run = executed(agent, "안녕")

    assert (run.status, run.error_code) == (Run.Status.FAILED, "model:auth")


# --- 6. a Bedrock agent without a region -------------------------------------------------------------------------


def test_a_bedrock_agent_without_a_region_fails_as_the_model_unavailable(demo_server, monkeypatch, tmp_path) -> None:
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))  # "/nonexistent" may exist (root)
    agent = make_agent(slug="no-region", servers=[demo_server], provider="bedrock", with_demo_rules=False)
    agent.model_id = HAIKU
    agent.model_params = {}
    agent.full_clean()  # the agent validates: the worker's environment may name the region
    agent.save()

    run = executed(agent, "안녕")

    assert (run.status, run.error_code) == (Run.Status.FAILED, "model:unavailable"), run.error_message
    assert "region_name" in run.error_message and "AWS_REGION" in run.error_message


# --- 7. a fault outside the model keeps the turns made, and is no model failure ---------------------------------


def test_an_unexpected_error_after_a_model_turn_keeps_its_tokens_and_is_internal(
    demo_server, stubbed_bedrock, monkeypatch
) -> None:
    from mcpregistry import gate

    def broken(**kwargs: Any) -> Any:
        raise RuntimeError("a bug past the model call")

    monkeypatch.setattr(gate, "call", broken)
    stubbed_bedrock.add_response("converse", converse_reply([SEARCH], "tool_use"))
    agent = bedrock_agent(demo_server, "crash-after-turn")

    run = executed(agent, "박도윤 님 팀?")

    assert (run.status, run.error_code) == (Run.Status.FAILED, "internal")
    assert "a bug past the model call" in run.error_message
    assert run.token_usage.get("model_calls") == 1 and run.tokens == 132, (run.token_usage, run.tokens)
    assert [e["type"] for e in run.messages if e.get("type") in ("ai", "outcome")] == ["outcome", "ai"]


def test_a_tool_choice_the_model_refuses_at_binding_is_a_model_failure(demo_server, stubbed_bedrock) -> None:
    """langchain-aws refuses a forced choice its model does not take when the tools are bound: the model's
    refusal (``model:validation``), not the platform's fault."""
    agent = bedrock_agent(demo_server, "bind-refused")
    Agent.objects.filter(pk=agent.pk).update(model_id="meta.llama3-8b-instruct-v1:0")  # stored before the check
    agent.refresh_from_db()
    agent.model_params = {**agent.model_params, "tool_choice": "any"}
    Agent.objects.filter(pk=agent.pk).update(model_params=agent.model_params)

    run = executed(agent, "박도윤 님 팀?")

    assert (run.status, run.error_code) == (Run.Status.FAILED, "model:validation"), run.error_message
