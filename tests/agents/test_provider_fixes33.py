"""The model providers, where they went wrong: a stored ``max_tokens`` that was no int ("100", 100.0) left a
budgeted run's calls capped at the whole reservation (and saving took a text or a bool); a turn cut off at its
token limit with a half-written tool call asked the model again and again until the iterations ran out; a model's
failure stored in the SDK's English whatever the agent's language; Bedrock's temperature range taken as Chat
Completions' (0–2); and a failed run's trace losing the tool results of its turns. Only the model is scripted: the
OpenAI-compatible provider through a local HTTP server, Bedrock through botocore's Stubber."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.stub import Stubber
from django.core.exceptions import ValidationError
from django.utils import translation

from agents import engine, model_texts, providers
from agents.budgets import budget_create, budget_reserve
from agents.execution import run_execute
from agents.models import Agent, Run
from agents.providers import ModelParams
from audit.models import AuditEvent
from mcpregistry.models import McpServer
from tests.agents.test_model_defects import converse_reply, stubbed_bedrock  # noqa: F401 - the fixture
from tests.agents.test_openai_compatible import TWO_TOOL_CALLS, openai_agent, submit
from tests.agents.test_tool_choice_and_stop_reason import FinishingOpenAIServer, bedrock_agent
from tests.openai_server import ScriptedOpenAIServer

pytestmark = pytest.mark.django_db


def cut_hint(agent: Agent) -> str:
    """The hint a run fails with when its model turn is cut off at the token limit, in the agent's language."""
    with translation.override(agent.language or translation.get_language()):
        return model_texts.cut_at_token_limit_text()


def sent_caps(server: ScriptedOpenAIServer) -> list[Any]:
    return [r["body"].get("max_completion_tokens", r["body"].get("max_tokens")) for r in server.requests]


def in_language(language: str, agent: Agent) -> Agent:
    Agent.objects.filter(pk=agent.pk).update(language=language)
    agent.refresh_from_db()
    return agent


def marked_translations(monkeypatch: pytest.MonkeyPatch, *modules: Any) -> None:
    """The modules' gettext and ngettext mark a text with the language active when it was asked for."""

    def gettext(text: str) -> str:
        return f"[{translation.get_language()}]{text}"

    def ngettext(singular: str, plural: str, count: int) -> str:
        return gettext(singular if count == 1 else plural)

    for module in modules:
        monkeypatch.setattr(module, "_", gettext)
        if hasattr(module, "ngettext"):
            monkeypatch.setattr(module, "ngettext", ngettext)


# --- 1. max_tokens: a whole number on save, the parsed value under a budget ---------------------------------------


@pytest.mark.parametrize("stored", ["100", 100.0], ids=["text", "float"])
def test_a_budgeted_run_caps_each_call_at_the_stored_max_tokens_given_as_a_text_or_a_float(
    demo_server: McpServer, stored: Any
) -> None:
    with ScriptedOpenAIServer(TWO_TOOL_CALLS).running() as server:
        agent = openai_agent(server, demo_server)
        # Stored before saving refused a text: the run reads it as its model is given it.
        Agent.objects.filter(pk=agent.pk).update(model_params={**agent.model_params, "max_tokens": stored})
        budget_create(
            actor="test-admin",
            via="tests",
            data={"agent": agent, "period": "day", "max_tokens": 1_000_000, "run_reservation_tokens": 20_000},
        )
        run = Run.objects.create(agent=agent, query="박도윤 님 팀과 프로젝트?")
        budget_reserve(run=run, agent=agent, api_key=None)
        run_execute(run_id=str(run.id))
        run.refresh_from_db()

    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert sent_caps(server) == [100, 100, 100]


@pytest.mark.parametrize("given", ["100", True, 100.5], ids=["text", "bool", "fraction"])
def test_a_max_tokens_that_is_no_whole_number_is_refused_on_save(given: Any) -> None:
    agent = Agent(slug="t", name="t", model_provider="bedrock", model_id="anthropic.claude-3-haiku-20240307-v1:0")
    agent.model_params = {"region_name": "us-east-1", "max_tokens": given}
    with pytest.raises(ValidationError) as refused:
        agent.full_clean()
    assert refused.value.message_dict["model_params"] == ["max_tokens: must be a whole number"]


def test_a_max_tokens_written_as_a_whole_float_is_taken_and_stored_as_an_int() -> None:
    agent = Agent(slug="t", name="t", model_provider="bedrock", model_id="anthropic.claude-3-haiku-20240307-v1:0")
    agent.model_params = {"region_name": "us-east-1", "max_tokens": 1e3}  # the admin's lines: max_tokens=1e3
    agent.full_clean()
    assert ModelParams.model_validate(agent.model_params).max_tokens == 1000
    saved = providers.saved_model_params(agent.model_params)
    assert saved == {"region_name": "us-east-1", "max_tokens": 1000} and type(saved["max_tokens"]) is int


def bedrock_draft(**params: Any) -> Agent:
    agent = Agent(slug="t", name="t", model_provider="bedrock", model_id="anthropic.claude-3-haiku-20240307-v1:0")
    agent.model_params = {"region_name": "us-east-1", **params}
    return agent


@pytest.mark.django_db
def test_the_agents_save_stores_a_whole_float_max_tokens_as_an_int() -> None:
    agent = bedrock_draft(max_tokens=1024.0)
    agent.full_clean()
    assert agent.model_params["max_tokens"] == 1024 and type(agent.model_params["max_tokens"]) is int


@pytest.mark.django_db
def test_the_agents_save_refuses_a_temperature_bedrock_does_not_take() -> None:
    with pytest.raises(ValidationError) as refused, translation.override("en"):
        bedrock_draft(temperature=1.5).full_clean()
    assert refused.value.message_dict["model_params"] == ["temperature: the bedrock provider takes 0 to 1."]
    bedrock_draft(temperature=1.0).full_clean()


@pytest.mark.django_db
def test_an_agent_stored_with_a_text_max_tokens_or_a_high_temperature_still_saves_unchanged() -> None:
    """Stored before the checks: its other settings can still be changed (the checks apply where the value
    changes), and its runs read the limit as they always did."""
    agent = bedrock_draft(max_tokens="100", temperature=1.5)
    Agent.objects.bulk_create([agent])  # as stored before the checks, bypassing them
    stored = Agent.objects.get(slug="t")
    stored.name = "renamed"
    stored.full_clean()
    assert providers.stored_model_params(stored.model_params).max_tokens == 100
    stored.model_params = {**stored.model_params, "max_tokens": "200"}
    with pytest.raises(ValidationError):
        stored.full_clean()


# --- 2. a tool call cut off at the token limit ---------------------------------------------------------------------


@pytest.mark.parametrize("arguments", ['{"name": "박도', '{"name": "박도윤"}'], ids=["half-written", "whole-looking"])
def test_an_openai_tool_call_cut_off_at_the_length_limit_fails_the_run_and_is_never_sent(
    demo_server: McpServer, arguments: str
) -> None:
    cut = {"tool_calls": [{"name": "search_employee", "raw_arguments": arguments}], "finish_reason": "length"}
    with FinishingOpenAIServer([cut] * 3).running() as server:
        agent = openai_agent(server, demo_server, max_tokens=8)
        run = submit(agent, "박도윤 님 팀?")

    assert (run.status, run.error_code) == (Run.Status.FAILED, "model:max_tokens"), run.error_message
    assert run.error_message == cut_hint(agent)
    assert len(server.requests) == 1  # not asked again under the same limit
    assert not AuditEvent.objects.filter(run_id=run.id, action="tool.call").exists()
    assert run.token_usage["model_calls"] == 1 and run.tokens == 110  # the cut turn's tokens are charged
    assert {"type": "outcome", "reason": "model:max_tokens", "stop_reason": "length"} in run.messages
    assert [e["type"] for e in run.messages if e["type"] in {"ai", "tool"}] == ["ai"]


def test_a_bedrock_tool_use_cut_off_at_max_tokens_fails_the_run_and_is_never_sent(
    demo_server: McpServer,
    stubbed_bedrock: Stubber,  # noqa: F811 - the fixture
) -> None:
    cut_use = {"toolUse": {"toolUseId": "tu-1", "name": "search_employee", "input": {"name": "박"}}}
    stubbed_bedrock.add_response("converse", converse_reply([cut_use], "max_tokens"))
    agent = bedrock_agent(demo_server, "cut-tool", model_params={"max_tokens": 12})

    run = submit(agent, "박도윤 님 팀?")

    assert (run.status, run.error_code) == (Run.Status.FAILED, "model:max_tokens"), run.error_message
    assert run.error_message == cut_hint(agent)
    assert not AuditEvent.objects.filter(run_id=run.id, action="tool.call").exists()
    assert run.tokens == 132
    assert {"type": "outcome", "reason": "model:max_tokens", "stop_reason": "max_tokens"} in run.messages


# --- 3. a model's failure in the agent's language ------------------------------------------------------------------


def test_a_failed_model_call_says_what_failed_in_the_agents_language_then_the_providers_words(
    demo_server: McpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    marked_translations(monkeypatch, model_texts)
    with ScriptedOpenAIServer([{"status": 429, "error": "slow down"}] * 2).running() as server:
        agent = in_language("ko", openai_agent(server, demo_server, retry={"max_attempts": 2, "backoff_s": 0}))
        run = submit(agent, "안녕하세요")

    assert (run.status, run.error_code) == (Run.Status.FAILED, "model:throttled")
    assert run.error_message.startswith("[ko]The model provider refused the call for its rate limit or quota. ")
    assert "slow down" in run.error_message and run.error_message.endswith("[ko](after 2 attempts)")


@pytest.mark.parametrize(
    ("kind", "sentence"),
    [
        ("throttled", "The model provider refused the call for its rate limit or quota."),
        ("timeout", "The model did not answer in time."),
        ("connection", "The model server could not be reached, or the connection to it broke off."),
        ("unavailable", "The model provider is unavailable: it answered with a server error."),
        ("validation", "The model provider refused the request: check the model id and the model parameters."),
        (
            "auth",
            "The model provider refused the credentials: check the model's API key, or the worker's AWS credentials "
            "and their access to the model.",
        ),
        ("error", "The model call failed."),
    ],
)
def test_each_model_failure_kind_has_its_own_sentence_before_the_masked_detail(kind: str, sentence: str) -> None:
    failed = providers.ModelCallFailed(kind=kind, detail="APIError: key sk-secret-123 refused", attempts=1)  # type: ignore[arg-type]
    with translation.override("en"):
        shown = engine.model_failure_message(failed, ["sk-secret-123"])
    assert shown == f"{sentence} APIError: key *** refused (after 1 attempt)"


def test_a_run_out_of_iterations_keeps_its_tool_results(
    demo_server: McpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    marked_translations(monkeypatch, engine)
    with ScriptedOpenAIServer(TWO_TOOL_CALLS).running() as server:
        agent = openai_agent(server, demo_server)
        Agent.objects.filter(pk=agent.pk).update(max_iterations=1)
        run = submit(in_language("ko", agent), "박도윤 님 팀과 프로젝트?")

    assert (run.status, run.error_code) == (Run.Status.FAILED, "max_iterations")
    # Stored in English, as the workers' texts are: the admin reads it back in its reader's language.
    assert run.error_message == "the agent did not finish within 1 iterations"
    # The search the one turn asked for ran: its result stays in the trace and the conversation.
    assert [e["type"] for e in run.messages if e["type"] in {"ai", "tool"}] == ["ai", "tool"]
    assert [m["type"] for m in run.conversation if m["type"] in {"ai", "tool"}] == ["ai", "tool"]


# --- 4. Bedrock's temperature range ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("provider", "temperature", "refused"),
    [("bedrock", 1.5, True), ("bedrock", 1.0, False), ("openai_compatible", 1.5, False)],
)
def test_a_temperature_above_the_providers_range_is_named_with_that_range(
    provider: str, temperature: float, refused: bool
) -> None:
    parsed = ModelParams.model_validate({"temperature": temperature})
    problems = providers.provider_param_problems(provider=provider, parsed=parsed)
    assert problems == (["temperature: the bedrock provider takes 0 to 1."] if refused else [])


# --- 5. a failed run keeps the tool results of its turns -------------------------------------------------------


def test_a_run_whose_model_fails_after_a_tool_call_keeps_that_calls_result(demo_server: McpServer) -> None:
    turns = [TWO_TOOL_CALLS[0], {"status": 429, "error": "slow down"}]
    with ScriptedOpenAIServer(turns).running() as server:
        agent = openai_agent(server, demo_server, retry={"max_attempts": 1})
        run = submit(agent, "박도윤 님 팀?")

    assert (run.status, run.error_code) == (Run.Status.FAILED, "model:throttled")
    tool = [e for e in run.messages if e["type"] == "tool"]
    assert len(tool) == 1 and "물류플랫폼팀" in str(tool[0]["content"])
    ai = next(e for e in run.messages if e["type"] == "ai")
    assert tool[0]["tool_call_id"] == ai["tool_calls"][0]["id"]
    assert [m["type"] for m in run.conversation] == ["system", "human", "ai", "tool"]


@pytest.mark.django_db
def test_a_version_frozen_with_a_text_max_tokens_can_still_be_rolled_back_to() -> None:
    """Its runs read "100" as 100 (``stored_model_params``): a roll back to it, or its import, was refused as if it
    were a new value typed today."""
    from agents.models import AgentVersion
    from agents.services import agent_create, agent_update, agent_version_publish, agent_version_rollback
    from audit.changes import audited_save

    agent = agent_create(actor="test", via="tests", data={"slug": "old", "name": "old"})
    audited_save(agent, actor="test", via="tests", data={"model_params": {"max_tokens": "100"}}, validate=False)
    first = agent_version_publish(agent=Agent.objects.get(pk=agent.pk), actor="test", via="tests")
    agent_update(
        agent=Agent.objects.get(pk=agent.pk), actor="test", via="tests", data={"model_params": {"max_tokens": 200}}
    )
    agent_version_publish(agent=Agent.objects.get(pk=agent.pk), actor="test", via="tests")

    agent_version_rollback(version=AgentVersion.objects.get(pk=first.pk), actor="test", via="tests")

    live = Agent.objects.get(pk=agent.pk).live_version
    assert live.content["agent"]["model_params"] == {"max_tokens": "100"}
