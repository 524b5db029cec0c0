"""The OpenAI-compatible provider where its replies go wrong: a streamed tool call whose arguments are cut short is
refused as the same reply's JSON form is, an error event in the middle of a stream is a call that was sent (never
sent again by a budgeted run, charged an estimate), a 429's ``Retry-After`` is waited for (or the call fails at once
where it asks for longer than the policy's cap), OpenAI's own error words name their kind, and a web page at the
base URL is told as such. Only the model is scripted: a real local HTTP server speaking the OpenAI API."""

from __future__ import annotations

import json
import time
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

from agents.models import Run
from agents.providers import ModelErrorAnswer, model_error_kind
from audit.models import AuditEvent
from tests.agents.test_openai_compatible import openai_agent, submit
from tests.agents.test_provider_boundaries import budgeted, model_agent, raw_model_server, sse
from tests.openai_server import ScriptedOpenAIServer

pytestmark = pytest.mark.django_db

ROLE = sse({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
TEXT = sse({"choices": [{"index": 0, "delta": {"content": "박도윤 님은 물류플랫폼팀입니다. " * 20}}]})
FINISH = sse({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
USAGE = sse({"choices": [], "usage": {"prompt_tokens": 120, "completion_tokens": 30, "total_tokens": 150}})


def streamed(handler: BaseHTTPRequestHandler, events: list[bytes]) -> None:
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream")
    handler.send_header("Connection", "close")
    handler.end_headers()
    for event in events:
        handler.wfile.write(event)
        handler.wfile.flush()
    handler.close_connection = True


def answered(handler: BaseHTTPRequestHandler, status: int, body: bytes, content_type: str, **headers: str) -> None:
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    for name, value in headers.items():
        handler.send_header(name.replace("_", "-"), value)
    handler.end_headers()
    handler.wfile.write(body)


# --- 1. a streamed call whose arguments are cut short is refused, not "repaired" --------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("written", ['{"name": "박도', '{"name": "박도윤"', "[1, 2]"], ids=["cut", "unclosed", "list"])
def test_a_tool_call_whose_arguments_are_no_json_object_is_refused_streamed_or_not(
    demo_server, stream: bool, written: str
) -> None:
    turns = [{"tool_calls": [{"name": "search_employee", "raw_arguments": written}]}, {"content": "끝"}]
    with ScriptedOpenAIServer(turns).running() as server:
        run = submit(openai_agent(server, demo_server, slug=f"cut-args-{stream}", stream=stream), "박도윤 님 팀?")
        second = server.requests[1]["body"]["messages"]

    assert (run.status, run.answer) == (Run.Status.SUCCEEDED, "끝"), run.error_message
    event = AuditEvent.objects.get(run_id=run.id, action="tool.call")
    assert (event.tool, event.ok, event.reason) == ("search_employee", False, "args:json")
    # The model is sent its call back as it wrote it, and told of the refusal.
    call = next(m for m in second if m.get("role") == "assistant")["tool_calls"][0]
    assert call["function"]["arguments"] == written
    assert run.token_usage["model_calls"] == 2


def test_a_streamed_call_with_whole_arguments_still_runs_with_them(demo_server) -> None:
    turns = [{"tool_calls": [{"name": "search_employee", "args": {"name": "박도윤"}}]}, {"content": "끝"}]
    with ScriptedOpenAIServer(turns).running() as server:
        run = submit(openai_agent(server, demo_server, slug="whole-args", stream=True), "박도윤 님 팀?")

    event = AuditEvent.objects.get(run_id=run.id, action="tool.call")
    assert (event.ok, event.args) == (True, {"name": "박도윤"})
    assert run.status == Run.Status.SUCCEEDED, run.error_message


# --- 2. an error event after the stream began is a call that was sent ------------------------------------------


def error_midway_then_answer(state: dict[str, int]) -> Any:
    def answer(handler: BaseHTTPRequestHandler) -> None:
        state["n"] = state.get("n", 0) + 1
        if state["n"] == 1:
            streamed(handler, [ROLE, TEXT, b'data: {"error": {"message": "server_error", "code": 500}}\n\n'])
        else:
            streamed(handler, [ROLE, TEXT, FINISH, USAGE, b"data: [DONE]\n\n"])

    return answer


@pytest.mark.slow
def test_a_budgeted_run_does_not_send_a_call_whose_stream_failed_midway_again_and_is_charged_for_it(
    demo_server,
) -> None:
    with raw_model_server(error_midway_then_answer({})) as server:
        agent = model_agent(
            server["base_url"], demo_server, slug="mid-error", stream=True, retry={"max_attempts": 3, "backoff_s": 0}
        )
        run = budgeted(agent)
        requests = server["requests"]

    assert (run.status, run.error_code, requests) == (Run.Status.FAILED, "model:unavailable", 1)
    assert run.token_usage.get("model_calls_estimated") == 1
    assert run.token_usage["output_tokens"] > 0  # the max_tokens the failed call was given


@pytest.mark.slow
def test_without_a_budget_a_stream_failed_midway_is_sent_again_and_its_first_attempt_charged(demo_server) -> None:
    with raw_model_server(error_midway_then_answer({})) as server:
        agent = model_agent(
            server["base_url"], demo_server, slug="mid-error-2", stream=True, retry={"max_attempts": 3, "backoff_s": 0}
        )
        run = submit(agent, "박도윤 님 팀?")
        requests = server["requests"]

    assert (run.status, requests) == (Run.Status.SUCCEEDED, 2), run.error_message
    assert (run.token_usage["model_calls"], run.token_usage.get("model_calls_estimated")) == (2, 1)


# --- 3. a 429's Retry-After -------------------------------------------------------------------------------------


def rate_limited(times: list[float], retry_after: str) -> Any:
    body = json.dumps({"error": {"message": "Rate limit reached", "type": "requests"}}).encode()

    def answer(handler: BaseHTTPRequestHandler) -> None:
        times.append(time.monotonic())
        answered(handler, 429, body, "application/json", Retry_After=retry_after)

    return answer


@pytest.mark.slow
def test_a_429s_retry_after_is_waited_for_before_the_call_is_sent_again(demo_server) -> None:
    times: list[float] = []
    with raw_model_server(rate_limited(times, "1")) as server:
        agent = model_agent(
            server["base_url"], demo_server, slug="retry-after", retry={"max_attempts": 2, "backoff_s": 0.01}
        )
        run = submit(agent, "안녕")

    assert (run.status, run.error_code, len(times)) == (Run.Status.FAILED, "model:throttled", 2)
    assert times[1] - times[0] >= 1.0


@pytest.mark.slow
def test_a_retry_after_longer_than_the_policys_cap_fails_the_call_at_once_quoting_the_wait(demo_server) -> None:
    times: list[float] = []
    with raw_model_server(rate_limited(times, "30")) as server:
        agent = model_agent(
            server["base_url"],
            demo_server,
            slug="retry-after-cap",
            retry={"max_attempts": 3, "backoff_s": 0.01, "max_backoff_s": 2},
        )
        run = submit(agent, "안녕")

    assert (run.status, run.error_code, len(times)) == (Run.Status.FAILED, "model:throttled", 1)
    assert "Retry-After" in run.error_message and "30" in run.error_message


# --- 4. OpenAI's own error words --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        ({"message": "The server had an error", "type": "server_error", "code": None}, "unavailable"),
        ({"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}, "throttled"),
        ({"message": "Too many requests", "type": "rate_limit_error"}, "throttled"),
        ({"message": "Incorrect API key", "type": "invalid_request_error", "code": "invalid_api_key"}, "error"),
        ({"code": "503", "type": "rate_limit_error"}, "unavailable"),  # a status the code names comes first
    ],
)
def test_openais_own_error_words_name_the_failures_kind(error: dict[str, Any], kind: str) -> None:
    assert model_error_kind(ModelErrorAnswer(error)) == kind


def test_a_streamed_server_error_event_in_openais_shape_is_retried(demo_server) -> None:
    overloaded = {"error_object": {"message": "The server had an error", "type": "server_error", "code": None}}
    with ScriptedOpenAIServer([overloaded, {"content": "끝"}]).running() as server:
        agent = openai_agent(
            server, demo_server, slug="server-error-words", stream=True, retry={"max_attempts": 2, "backoff_s": 0}
        )
        run = submit(agent, "질문")

    assert (run.status, run.answer, len(server.requests)) == (Run.Status.SUCCEEDED, "끝", 2), run.error_message


# --- 5. a web page at the base URL ------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        ("<html><body>세션이 만료됨 " + "x" * 3000 + "</body></html>", "text/html; charset=utf-8"),
        ("<html><body>세션이 만료됨</body></html>", "application/json"),
    ],
    ids=["html", "html-said-json"],
)
def test_a_reply_that_is_no_json_says_so_and_to_check_the_base_url_without_the_page(
    demo_server, body: str, content_type: str
) -> None:
    def page(handler: BaseHTTPRequestHandler) -> None:
        answered(handler, 200, body.encode(), content_type)

    with raw_model_server(page) as server:
        agent = model_agent(server["base_url"], demo_server, slug="web-page", retry={"max_attempts": 1})
        run = submit(agent, "안녕")

    assert (run.status, run.error_code) == (Run.Status.FAILED, "model:error")
    assert content_type in run.error_message and "model_params.base_url" in run.error_message
    assert "<html" not in run.error_message and "세션이 만료됨" not in run.error_message
