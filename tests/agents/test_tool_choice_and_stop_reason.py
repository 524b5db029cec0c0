"""The model side of a run, where it went wrong: the agent's own ``model_params.tool_choice`` naming a tool forced
on a turn whose top-K offer did not hold it (a choice the providers refuse); the object forms of ``tool_choice``
sent to the providers as they were written (Bedrock failed every run, Chat Completions got a form it does not
know, ``{"type": "none"}`` held for the first turn only); a named tool accepted for a Bedrock model that takes only
"any"; and a final turn cut off at the token limit, or empty, stored as a succeeded run. Only the model is
scripted: Bedrock through botocore's Stubber, the OpenAI-compatible provider through a local HTTP server."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from django.core.exceptions import ValidationError

from agents import providers
from agents.execution import run_execute
from agents.models import Agent, DeterministicRule, Run
from agents.providers import supports_tool_choice
from mcpregistry.models import McpServer
from mcpregistry.services import mcp_tool_update
from tests.conftest import make_agent
from tests.openai_server import ScriptedOpenAIServer

pytestmark = pytest.mark.django_db

HAIKU = "anthropic.claude-3-haiku-20240307-v1:0"
MISTRAL_LARGE = "mistral.mistral-large-2407-v1:0"
SEARCH = {"toolUse": {"toolUseId": "tu-1", "name": "search_employee", "input": {"name": "박도윤"}}}


def converse_reply(content: list[dict[str, Any]], stop_reason: str = "end_turn") -> dict[str, Any]:
    return {
        "output": {"message": {"role": "assistant", "content": content}},
        "stopReason": stop_reason,
        "usage": {"inputTokens": 120, "outputTokens": 12, "totalTokens": 132},
        "metrics": {"latencyMs": 50},
    }


@pytest.fixture
def stubbed_bedrock(monkeypatch: pytest.MonkeyPatch) -> Iterator[Stubber]:
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


def offered(params: dict[str, Any]) -> list[str]:
    return [tool["toolSpec"]["name"] for tool in params.get("toolConfig", {}).get("tools", [])]


def bedrock_agent(demo_server: McpServer, slug: str, *, model_id: str = HAIKU, **fields: Any) -> Agent:
    agent = make_agent(slug=slug, servers=[demo_server], provider="bedrock", with_demo_rules=False)
    agent.model_id = model_id
    params = fields.pop("model_params", {})
    agent.model_params = {"region_name": "us-east-1", "retry": {"max_attempts": 1}, **params}
    for name, value in fields.items():
        setattr(agent, name, value)
    agent.full_clean()
    agent.save()
    return agent


def openai_agent(server: ScriptedOpenAIServer, demo_server: McpServer, slug: str, **params: Any) -> Agent:
    agent = make_agent(slug=slug, servers=[demo_server], provider="openai_compatible", with_demo_rules=False)
    agent.model_id = "qwen2.5-7b-instruct"
    agent.model_params = {"base_url": server.base_url, "retry": {"max_attempts": 1}, **params}
    agent.full_clean()
    agent.save()
    return agent


def executed(agent: Agent, query: str) -> Run:
    run = Run.objects.create(agent=agent, query=query)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    return run


# --- 1. the model's own named tool_choice is the offer's forced first tool ---------------------------------------


@pytest.mark.slow
def test_a_tool_the_model_params_force_is_offered_on_the_first_turn_under_top_k_selection(
    demo_server: McpServer, stubbed_bedrock: Stubber
) -> None:
    sent = sent_to_converse(stubbed_bedrock)
    agent = bedrock_agent(
        demo_server,
        "forced-by-params",
        model_params={"tool_choice": "get_asset_status"},
        tool_selection={"enabled": True, "top_k": 1},
    )
    stubbed_bedrock.add_response("converse", converse_reply([{"text": "박도윤 님은 물류플랫폼팀입니다."}]))

    run = executed(agent, "박도윤 님 팀? employee search")

    assert run.status == Run.Status.SUCCEEDED, (run.error_code, run.error_message)
    assert "get_asset_status" in offered(sent[0]), offered(sent[0])
    assert sent[0]["toolConfig"]["toolChoice"] == {"tool": {"name": "get_asset_status"}}
    selection = next(e for e in run.messages if e["type"] == "tool_selection")
    assert {o["name"]: o["why"] for o in selection["offered"]}["get_asset_status"] == "forced"


@pytest.mark.slow
def test_a_tool_the_model_params_force_is_not_forced_where_the_hard_filters_leave_it_out(
    demo_server: McpServer, stubbed_bedrock: Stubber
) -> None:
    mcp_tool_update(
        tool=demo_server.tools.get(name="get_asset_status"), actor="admin", via="tests", data={"tags": ["자산"]}
    )
    sent = sent_to_converse(stubbed_bedrock)
    agent = bedrock_agent(
        demo_server,
        "forced-but-filtered",
        model_params={"tool_choice": "search_employee"},
        tool_selection={"enabled": True, "top_k": 3, "tags": ["자산"]},
    )
    stubbed_bedrock.add_response("converse", converse_reply([{"text": "자산 A-1001은 정상입니다."}]))

    run = executed(agent, "A-1001 자산 상태")

    assert run.status == Run.Status.SUCCEEDED, (run.error_code, run.error_message)
    assert offered(sent[0]) == ["get_asset_status"]
    assert "toolChoice" not in sent[0]["toolConfig"], sent[0]["toolConfig"]


# --- 2. the object forms of tool_choice reach each provider as its own form --------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ({"type": "tool", "name": "search_employee"}, {"tool": {"name": "search_employee"}}),
        ({"type": "function", "function": {"name": "search_employee"}}, {"tool": {"name": "search_employee"}}),
        ({"type": "any"}, {"any": {}}),
    ],
    ids=["tool", "function", "any"],
)
def test_bedrock_gets_an_object_tool_choice_as_its_own_tool_choice(
    demo_server: McpServer, stubbed_bedrock: Stubber, choice: dict[str, Any], expected: dict[str, Any]
) -> None:
    sent = sent_to_converse(stubbed_bedrock)
    agent = bedrock_agent(demo_server, "object-choice", model_params={"tool_choice": choice})
    stubbed_bedrock.add_response("converse", converse_reply([SEARCH], "tool_use"))
    stubbed_bedrock.add_response("converse", converse_reply([{"text": "물류플랫폼팀입니다."}]))

    run = executed(agent, "박도윤 님 팀?")

    assert (run.status, run.answer) == (Run.Status.SUCCEEDED, "물류플랫폼팀입니다."), run.error_message
    assert sent[0]["toolConfig"]["toolChoice"] == expected
    assert "toolChoice" not in sent[1]["toolConfig"]  # forcing: the first turn only


def test_bedrock_takes_an_object_none_as_none_giving_the_model_no_tools(
    demo_server: McpServer, stubbed_bedrock: Stubber
) -> None:
    sent = sent_to_converse(stubbed_bedrock)
    agent = bedrock_agent(demo_server, "object-none", model_params={"tool_choice": {"type": "none"}})
    stubbed_bedrock.add_response("converse", converse_reply([{"text": "안녕하세요"}]))

    run = executed(agent, "안녕")

    assert (run.status, run.answer) == (Run.Status.SUCCEEDED, "안녕하세요"), run.error_message
    assert "toolConfig" not in sent[0]


@pytest.mark.slow
def test_openai_compatible_gets_an_object_tool_choice_in_the_chat_completions_form(demo_server: McpServer) -> None:
    script: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "search_employee", "args": {"name": "박도윤"}}]},
        {"content": "물류플랫폼팀입니다."},
    ]
    choices: dict[str, list[Any]] = {}
    for label, choice in (("tool", {"type": "tool", "name": "search_employee"}), ("none", {"type": "none"})):
        with ScriptedOpenAIServer(list(script)).running() as server:
            agent = openai_agent(server, demo_server, f"openai-object-{label}", tool_choice=choice)
            run = executed(agent, "박도윤 님 팀?")
        assert run.status == Run.Status.SUCCEEDED, (run.error_code, run.error_message)
        choices[label] = [request["body"].get("tool_choice") for request in server.requests]
    assert choices == {
        "tool": [{"type": "function", "function": {"name": "search_employee"}}, None],
        "none": ["none", "none"],  # "none" holds on every turn, as the text "none" does
    }


# --- 3. a named tool for a model that takes only "any" ------------------------------------------------------------


def test_a_bedrock_model_that_takes_any_but_no_named_tool_says_so() -> None:
    assert supports_tool_choice(provider="bedrock", model_id=MISTRAL_LARGE, kind="any")
    assert not supports_tool_choice(provider="bedrock", model_id=MISTRAL_LARGE, kind="tool")
    assert supports_tool_choice(provider="bedrock", model_id=HAIKU, kind="tool")
    assert supports_tool_choice(provider="openai_compatible", kind="tool")


def test_saving_refuses_a_named_tool_for_a_model_that_takes_only_any(demo_server: McpServer) -> None:
    with pytest.raises(ValidationError) as caught:
        bedrock_agent(demo_server, "mistral-named", model_id=MISTRAL_LARGE, model_params={"tool_choice": "ping"})
    [message] = caught.value.message_dict["model_params"]
    assert MISTRAL_LARGE in message and '"any"' in message and message.startswith("tool_choice:")

    with pytest.raises(ValidationError) as caught:
        bedrock_agent(
            demo_server,
            "mistral-selection",
            model_id=MISTRAL_LARGE,
            tool_selection={"force_first_tool": "ping"},
        )
    [message] = caught.value.message_dict["tool_selection"]
    assert MISTRAL_LARGE in message and message.startswith("force_first_tool:")

    agent = bedrock_agent(demo_server, "mistral-any", model_id=MISTRAL_LARGE, model_params={"tool_choice": "any"})
    rule = DeterministicRule(
        agent=agent,
        name="핑 규칙",
        server=demo_server,
        tool_name="ping",
        when={"any_keywords": ["핑"]},
        force_first_tool="ping",
    )
    with pytest.raises(ValidationError) as caught:
        rule.full_clean()
    assert MISTRAL_LARGE in str(caught.value.message_dict["force_first_tool"])
    rule.force_first_tool = "any"
    rule.full_clean()  # "any" is what the model takes


def test_switching_to_a_model_that_takes_no_named_tool_is_refused_where_one_is_forced(demo_server: McpServer) -> None:
    agent = bedrock_agent(demo_server, "switch-model", model_params={"tool_choice": "ping"})
    agent.model_id = MISTRAL_LARGE
    with pytest.raises(ValidationError) as caught:
        agent.full_clean()
    assert MISTRAL_LARGE in str(caught.value.message_dict["model_params"])


# --- 4. a final turn cut off at the token limit, or empty ---------------------------------------------------------


def test_a_bedrock_answer_cut_off_at_max_tokens_fails_the_run_keeping_its_tokens(
    demo_server: McpServer, stubbed_bedrock: Stubber, spans: Any
) -> None:
    stubbed_bedrock.add_response("converse", converse_reply([SEARCH], "tool_use"))
    stubbed_bedrock.add_response("converse", converse_reply([{"text": "박도윤 님은 물류플"}], "max_tokens"))
    agent = bedrock_agent(demo_server, "cut-off", model_params={"max_tokens": 12})

    run = executed(agent, "박도윤 님 팀?")

    assert (run.status, run.error_code) == (Run.Status.FAILED, "model:max_tokens"), run.error_message
    assert "max_tokens" in run.error_message and run.answer == ""
    assert run.token_usage["model_calls"] == 2 and run.tokens == 264, (run.token_usage, run.tokens)
    assert {"type": "outcome", "reason": "model:max_tokens", "stop_reason": "max_tokens"} in run.messages
    # The cut text stays in the trace, for the reader to see where it stopped.
    assert [e["content"] for e in run.messages if e["type"] == "ai"][-1] == "박도윤 님은 물류플"
    chats = [s for s in spans.get_finished_spans() if s.name == f"chat {HAIKU}"]
    assert [tuple(c.attributes["gen_ai.response.finish_reasons"]) for c in chats] == [("tool_use",), ("max_tokens",)]


def test_an_empty_bedrock_answer_fails_the_run_as_no_answer(demo_server: McpServer, stubbed_bedrock: Stubber) -> None:
    stubbed_bedrock.add_response("converse", converse_reply([], "end_turn"))
    agent = bedrock_agent(demo_server, "empty")

    run = executed(agent, "안녕")

    assert (run.status, run.error_code) == (Run.Status.FAILED, "model:empty"), run.error_message
    assert run.token_usage["model_calls"] == 1 and run.tokens == 132


class FinishingOpenAIServer(ScriptedOpenAIServer):
    """The scripted server, with a turn's ``finish_reason`` as the script gives it (``length``: cut off)."""

    def completion(self, body: dict[str, Any], turn: dict[str, Any]) -> dict[str, Any]:
        completion = super().completion(body, turn)
        if "finish_reason" in turn:
            completion["choices"][0]["finish_reason"] = turn["finish_reason"]
        return completion


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_an_openai_compatible_answer_cut_off_at_the_length_limit_fails_the_run(
    demo_server: McpServer, stream: bool
) -> None:
    with FinishingOpenAIServer([{"content": "박도윤 님은 물류플", "finish_reason": "length"}]).running() as server:
        agent = openai_agent(server, demo_server, "length", stream=stream, max_tokens=8)
        run = executed(agent, "박도윤 님 팀?")

    assert (run.status, run.error_code) == (Run.Status.FAILED, "model:max_tokens"), run.error_message
    assert run.token_usage["model_calls"] == 1 and run.tokens == 110


def test_an_empty_openai_compatible_answer_fails_the_run_and_a_short_one_succeeds(demo_server: McpServer) -> None:
    with ScriptedOpenAIServer([{"content": ""}, {"content": "네"}]).running() as server:
        agent = openai_agent(server, demo_server, "empty-openai")
        empty = executed(agent, "안녕")
        short = executed(agent, "안녕")

    assert (empty.status, empty.error_code) == (Run.Status.FAILED, "model:empty")
    assert (short.status, short.answer) == (Run.Status.SUCCEEDED, "네")
