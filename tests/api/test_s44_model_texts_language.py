"""A run failed by a model turn its provider said was unfinished (cut off at its token limit, its context window
full, filtered, malformed), or that held nothing, or by a context-window overflow the provider refused, stores its
error message in the run's language (its agent's), and was answered so to every reader: a Korean agent's run read
"모델의 답변이 토큰 한도에서 잘렸습니다. …" under ``Accept-Language: en``. It is read back in the reader's language
(``agents.error_texts.error_message_text``), the provider's own words kept as stored. Only the model is scripted:
the OpenAI-compatible provider through a local HTTP server, Bedrock through botocore's Stubber."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from botocore.stub import Stubber
from django.conf import settings
from django.test import Client
from django.utils import translation

from agents.error_texts import error_message_text
from agents.execution import run_execute
from agents.model_texts import attempts_text, cut_at_token_limit_text, empty_turn_text, unfinished_turn_text
from agents.models import Agent, Run
from mcpregistry.models import McpServer
from tests.agents.test_fix_model_review import answering
from tests.agents.test_provider_boundaries import model_agent, raw_model_server
from tests.agents.test_tool_choice_and_stop_reason import (  # noqa: F401 - stubbed_bedrock: the fixture
    FinishingOpenAIServer,
    bedrock_agent,
    converse_reply,
    openai_agent,
    stubbed_bedrock,
)
from tests.conftest import ApiCaller

pytestmark = pytest.mark.django_db

LANGUAGES = [code for code, _name in settings.LANGUAGES]
REFUSAL = "This model's maximum context length is 8192 tokens. However, you requested 9000 tokens (2 msgs)."

# Each sentence a model turn's failure is stored with, by its code: said in the active language.
SENTENCES: list[tuple[str, Callable[[], str]]] = [
    ("model:max_tokens", cut_at_token_limit_text),
    ("model:context_window", lambda: unfinished_turn_text("model:context_window")),
    ("model:content_filter", lambda: unfinished_turn_text("model:content_filter")),
    ("model:malformed", lambda: unfinished_turn_text("model:malformed")),
    ("model:empty", lambda: empty_turn_text(no_choice=False)),
    ("model:empty", lambda: empty_turn_text(no_choice=True)),
]


def korean(agent: Agent) -> Agent:
    Agent.objects.filter(pk=agent.pk).update(language="ko")
    agent.refresh_from_db()
    return agent


def executed(agent: Agent, caller: ApiCaller) -> Run:
    run = Run.objects.create(agent=agent, api_key=caller.key, query="박도윤 님 팀?")
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    return run


def read_error(caller: ApiCaller, run: Run, language: str) -> dict[str, Any]:
    client = Client(HTTP_AUTHORIZATION=f"Bearer {caller.raw_key}", HTTP_ACCEPT_LANGUAGE=language)
    response = client.get(f"/api/v1/runs/{run.id}")
    assert response.status_code == 200, response.content
    return dict(response.json()["error"])


def assert_read_in_each_language(caller: ApiCaller, run: Run, code: str, said: Callable[[], str]) -> None:
    with translation.override("ko"):
        assert run.error_message == said()  # stored in the agent's language
    for language in LANGUAGES:
        with translation.override(language):
            expected = said()
        assert read_error(caller, run, language) == {"code": code, "message": expected}, language


# --- a Korean agent's run, read over REST in each language ------------------------------------------------------


@pytest.mark.parametrize(
    ("finish_reason", "code"), [("length", "model:max_tokens"), ("content_filter", "model:content_filter")]
)
def test_a_korean_agents_unfinished_openai_turn_reads_in_the_callers_language(
    api_caller: ApiCaller, demo_server: McpServer, finish_reason: str, code: str
) -> None:
    with FinishingOpenAIServer([{"content": "박도윤 님은 물류플", "finish_reason": finish_reason}]).running() as server:
        run = executed(korean(openai_agent(server, demo_server, f"ko-{finish_reason}")), api_caller)

    assert (run.status, run.error_code) == (Run.Status.FAILED, code)
    assert_read_in_each_language(api_caller, run, code, lambda: unfinished_turn_text(code))


@pytest.mark.parametrize(
    ("stop_reason", "code"),
    [("model_context_window_exceeded", "model:context_window"), ("malformed_model_output", "model:malformed")],
)
def test_a_korean_agents_unfinished_bedrock_turn_reads_in_the_callers_language(
    api_caller: ApiCaller,
    demo_server: McpServer,
    stubbed_bedrock: Stubber,  # noqa: F811 - the fixture
    stop_reason: str,
    code: str,
) -> None:
    stubbed_bedrock.add_response("converse", converse_reply([{"text": "박도윤 님의 소속 팀은 물류"}], stop_reason))
    run = executed(korean(bedrock_agent(demo_server, f"ko-{stop_reason[:20]}")), api_caller)

    assert (run.status, run.error_code) == (Run.Status.FAILED, code)
    assert_read_in_each_language(api_caller, run, code, lambda: unfinished_turn_text(code))


def test_a_korean_agents_empty_answer_reads_in_the_callers_language(
    api_caller: ApiCaller, demo_server: McpServer
) -> None:
    with FinishingOpenAIServer([{"content": ""}]).running() as server:
        run = executed(korean(openai_agent(server, demo_server, "ko-empty")), api_caller)

    assert (run.status, run.error_code) == (Run.Status.FAILED, "model:empty")
    assert_read_in_each_language(api_caller, run, "model:empty", lambda: empty_turn_text(no_choice=False))


@pytest.mark.slow
def test_a_korean_agents_reply_with_no_choice_reads_in_the_callers_language(
    api_caller: ApiCaller, demo_server: McpServer
) -> None:
    body = {"id": "c", "object": "chat.completion", "created": 1, "model": "m", "choices": []}
    body["usage"] = {"prompt_tokens": 5, "completion_tokens": 0, "total_tokens": 5}
    with raw_model_server(answering([json.dumps(body).encode()])) as model:
        agent = model_agent(model["base_url"], demo_server, slug="ko-no-choice", retry={"max_attempts": 1})
        run = executed(korean(agent), api_caller)

    assert (run.status, run.error_code) == (Run.Status.FAILED, "model:empty")
    assert_read_in_each_language(api_caller, run, "model:empty", lambda: empty_turn_text(no_choice=True))


def test_a_korean_agents_context_window_refusal_reads_in_the_callers_language_with_the_providers_words(
    api_caller: ApiCaller, demo_server: McpServer
) -> None:
    with FinishingOpenAIServer([{"status": 400, "error": REFUSAL}]).running() as server:
        run = executed(korean(openai_agent(server, demo_server, "ko-refused")), api_caller)

    assert (run.status, run.error_code) == (Run.Status.FAILED, "model:context_window")
    with translation.override("ko"):
        sentence, after = unfinished_turn_text("model:context_window"), attempts_text(1)
    assert run.error_message.startswith(sentence + " ") and run.error_message.endswith(" " + after)
    detail = run.error_message[len(sentence) + 1 : -len(after) - 1]  # the provider's own words, kept
    assert "maximum context length" in detail
    for language in LANGUAGES:
        with translation.override(language):
            expected = f"{unfinished_turn_text('model:context_window')} {detail} {attempts_text(1)}"
        assert read_error(api_caller, run, language) == {"code": "model:context_window", "message": expected}


# --- every sentence, stored in each language, read in each --------------------------------------------------------


@pytest.mark.parametrize(("code", "said"), SENTENCES, ids=[f"{c}-{i}" for i, (c, _s) in enumerate(SENTENCES)])
@pytest.mark.parametrize("stored_in", LANGUAGES)
@pytest.mark.parametrize("reader", LANGUAGES)
def test_every_model_turn_failure_sentence_is_read_back_in_the_readers_language(
    code: str, said: Callable[[], str], stored_in: str, reader: str
) -> None:
    with translation.override(stored_in):
        stored = said()
    with translation.override(reader):
        assert error_message_text(code, stored) == said()


@pytest.mark.parametrize("stored_in", LANGUAGES)
@pytest.mark.parametrize("reader", LANGUAGES)
def test_a_refused_context_window_is_read_back_with_the_providers_words_and_attempts(
    stored_in: str, reader: str
) -> None:
    detail = "Error code: 400 - {'error': 'context (3) too long'}"  # the provider's words: kept, numbers and all
    with translation.override(stored_in):
        stored = [
            f"{unfinished_turn_text('model:context_window')} {detail} {attempts_text(1)}",
            f"{unfinished_turn_text('model:context_window')} {detail}",
        ]
    with translation.override(reader):
        expected = [
            f"{unfinished_turn_text('model:context_window')} {detail} {attempts_text(1)}",
            f"{unfinished_turn_text('model:context_window')} {detail}",
        ]
        assert [error_message_text("model:context_window", text) for text in stored] == expected


def test_a_model_turn_failure_sentence_under_another_code_stays_as_stored() -> None:
    with translation.override("ko"):
        cut, filtered = cut_at_token_limit_text(), unfinished_turn_text("model:content_filter")
    with translation.override("en"):
        assert error_message_text("model:content_filter", cut) == cut
        assert error_message_text("model:empty", filtered) == filtered
        assert error_message_text("model:max_tokens", "cut") == "cut"
