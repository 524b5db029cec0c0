"""A model's turn as its provider returned it, where it went wrong: a lone surrogate (``"\\ud83d"``, valid JSON) in a
tool call's arguments or its text, used as received (the MCP request failed to encode and was taken for the
server's transport failure, retried and counted by its circuit breaker; the next model request failed to encode);
a turn its provider said was cut off at its context window, filtered or malformed, passed as an answer or its call
sent; a reply with no choice, or an error object with HTTP 200, failed as ``model:error`` with Python's words.
Only the model is scripted: the OpenAI-compatible provider through a local HTTP server, Bedrock through botocore's
Stubber; the tools are the demo MCP server's, over stdio."""

from __future__ import annotations

import json
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from typing import Any

import botocore.session
import pytest
from django.utils import translation

from agents.models import Run
from agents.providers import UNFINISHED_TURN_CODES, ModelErrorAnswer, model_error_kind
from audit.labels import reason_label
from audit.models import AuditEvent
from mcpregistry import gate
from mcpregistry.contracts import check_args
from mcpregistry.models import McpServer
from tests.agents.test_model_defects import (  # noqa: F401 - stubbed_bedrock: the fixture
    bedrock_agent,
    converse_reply,
    executed,
    sent_to_converse,
    stubbed_bedrock,
)
from tests.agents.test_openai_compatible import openai_agent, submit
from tests.agents.test_provider_boundaries import model_agent, raw_model_server
from tests.openai_server import ScriptedOpenAIServer

pytestmark = pytest.mark.django_db

LONE = "\ud83d"  # the first half of 😀, alone
REPLACED = "박\ufffd"


def completion(message: dict[str, Any], finish: str = "stop", usage: dict[str, int] | None = None) -> bytes:
    """A Chat Completions reply as JSON bytes; ``json.dumps`` writes a lone surrogate as the escape ``\\ud83d``."""
    body = {
        "id": "c1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}],
        "usage": usage or {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110},
    }
    return json.dumps(body).encode()


def answering(payloads: list[bytes]) -> Callable[[BaseHTTPRequestHandler], None]:
    """Answers each request with the next payload (the last one again once they are used up)."""
    left = list(payloads)

    def answer(handler: BaseHTTPRequestHandler) -> None:
        data = left.pop(0) if len(left) > 1 else left[0]
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    return answer


def tool_call(call_id: str, arguments: str, name: str = "search_employee") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def tool_calls_of(run: Run) -> list[tuple[str, bool, str, Any]]:
    events = AuditEvent.objects.filter(run_id=run.id, action="tool.call").order_by("id")
    return [(e.tool, e.ok, e.reason, e.args) for e in events]


def breaker_of(server: McpServer) -> tuple[str, int]:
    server.refresh_from_db()
    return server.breaker_state, server.breaker_failures


# --- 1. a lone surrogate in a model turn becomes U+FFFD as the turn is received ------------------------------------


def test_a_lone_surrogate_in_an_openai_tool_call_is_replaced_and_the_servers_breaker_is_not_moved(demo_server) -> None:
    arguments = '{"name": "박\\ud83d"}'  # valid JSON: the escape of half a pair
    script = [
        {"tool_calls": [{"name": "search_employee", "raw_arguments": arguments}] * 2},
        {"content": "끝"},
    ]
    with ScriptedOpenAIServer(script).running() as server:
        run = submit(openai_agent(server, demo_server, slug="lone-openai"), "박도윤?")
        sent_back = server.requests[1]["body"]["messages"]

    assert (run.status, run.error_code, run.answer) == (Run.Status.SUCCEEDED, "", "끝"), run.error_message
    # Sent to the tool as U+FFFD, once each (the second is the first's memo): no transport failure, no retry.
    assert [(tool, ok, args) for tool, ok, _reason, args in tool_calls_of(run)] == [
        ("search_employee", True, {"name": REPLACED}),
        ("search_employee", True, {"name": REPLACED}),
    ]
    assert breaker_of(demo_server) == ("closed", 0)
    # The next model request carried the turn back, as valid text.
    echoed = next(m for m in sent_back if m["role"] == "assistant")["tool_calls"][0]["function"]["arguments"]
    assert json.loads(echoed) == {"name": REPLACED}
    assert run.token_usage["model_calls"] == 2


@pytest.mark.slow
def test_a_lone_surrogate_in_the_text_beside_a_call_does_not_fail_the_next_model_request(demo_server) -> None:
    turn = {"content": f"찾아볼게요 {LONE}", "tool_calls": [tool_call("c1", json.dumps({"name": "박도윤"}))]}
    with raw_model_server(answering([completion(turn, "tool_calls"), completion({"content": "끝"})])) as model:
        agent = model_agent(model["base_url"], demo_server, slug="lone-text", retry={"max_attempts": 1})
        run = submit(agent, "박도윤?")
        requests = model["requests"]

    assert (run.status, run.error_code, run.answer) == (Run.Status.SUCCEEDED, "", "끝"), run.error_message
    assert requests == 2
    assert [(tool, ok) for tool, ok, _reason, _args in tool_calls_of(run)] == [("search_employee", True)]
    assert next(m for m in run.messages if m["type"] == "ai")["content"] == "찾아볼게요 \ufffd"


def test_a_lone_surrogate_in_a_bedrock_tool_use_is_replaced_and_the_servers_breaker_is_not_moved(
    demo_server,
    stubbed_bedrock,  # noqa: F811 - the fixture
) -> None:
    agent = bedrock_agent(demo_server, "lone-bedrock")
    sent = sent_to_converse(stubbed_bedrock)
    use = {"toolUse": {"toolUseId": "tu-1", "name": "search_employee", "input": {"name": "박" + LONE}}}
    stubbed_bedrock.add_response("converse", converse_reply([{"text": "찾아볼게요 " + LONE}, use], "tool_use"))
    stubbed_bedrock.add_response("converse", converse_reply([{"text": "done"}]))

    run = executed(agent, "박도윤?")

    assert (run.status, run.error_code, run.answer) == (Run.Status.SUCCEEDED, "", "done"), run.error_message
    assert [(tool, ok, args) for tool, ok, _reason, args in tool_calls_of(run)] == [
        ("search_employee", True, {"name": REPLACED})
    ]
    assert breaker_of(demo_server) == ("closed", 0)
    replayed = [block for m in sent[1]["messages"] if m["role"] == "assistant" for block in m["content"]]
    assert {"text": "찾아볼게요 \ufffd"} in replayed
    assert {"toolUse": {"toolUseId": "tu-1", "name": "search_employee", "input": {"name": REPLACED}}} in replayed


@pytest.mark.parametrize("args", [{"name": "박" + LONE}, {"name" + LONE: "박도윤"}, {"names": ["a", LONE]}])
def test_arguments_holding_a_lone_surrogate_are_refused_as_no_json(args: dict[str, Any]) -> None:
    _args, verdict = check_args({}, args, unknown="drop")
    assert verdict is not None and verdict.reason == "args:json"
    assert LONE not in verdict.detail


def test_a_pair_of_surrogates_written_as_one_character_is_no_lone_one() -> None:
    assert check_args({}, {"name": "😀박"}, unknown="drop") == ({"name": "😀박"}, None)


def test_the_gate_refuses_a_lone_surrogate_before_anything_is_sent(demo_server) -> None:
    result = gate.call(
        server=demo_server,
        tool_name="search_employee",
        args={"name": "박" + LONE},
        who=gate.GateCall(source="admin", actor="tester"),
    )
    assert (result.ok, result.error) == (False, "args:json")
    assert not AuditEvent.objects.filter(action="tool.call", reason="transport").exists()
    assert breaker_of(demo_server) == ("closed", 0)


@pytest.mark.slow
def test_a_request_the_session_cannot_encode_is_no_transport_failure_of_the_server(
    demo_server, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A caller that went around the argument check: the session fails to write the request, before sending it.
    monkeypatch.setattr(gate, "check_args", lambda constraints, args, **kwargs: (args, None))
    who = gate.GateCall(source="admin", actor="tester")

    result = gate.call(server=demo_server, tool_name="search_employee", args={"name": "박" + LONE}, who=who)

    assert (result.ok, result.error) == (False, "args:json")
    events = AuditEvent.objects.filter(action="tool.call").order_by("id")
    assert [(e.ok, e.reason, e.attempt) for e in events] == [(False, "args:json", 1)]  # not retried
    assert breaker_of(demo_server) == ("closed", 0)
    # The server is as healthy as it was: the next call goes out and is answered.
    answered = gate.call(server=demo_server, tool_name="search_employee", args={"name": "박도윤"}, who=who)
    assert answered.ok, answered.message


# --- 2. a turn its provider said was cut off, filtered or malformed ------------------------------------------------


def test_every_converse_stop_reason_is_either_an_ending_or_an_unfinished_turn() -> None:
    model = botocore.session.get_session().get_service_model("bedrock-runtime")
    endings = {"end_turn", "tool_use", "stop_sequence", "guardrail_intervened"}
    assert set(model.shape_for("StopReason").enum) - endings <= set(UNFINISHED_TURN_CODES)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("stop_reason", "code"),
    [
        ("model_context_window_exceeded", "model:context_window"),
        ("content_filtered", "model:content_filter"),
        ("malformed_model_output", "model:malformed"),
    ],
)
def test_a_bedrock_answer_stopped_short_fails_with_its_own_code(
    demo_server,
    stubbed_bedrock,  # noqa: F811 - the fixture
    stop_reason: str,
    code: str,
) -> None:
    agent = bedrock_agent(demo_server, f"short-{stop_reason[:20]}")
    stubbed_bedrock.add_response("converse", converse_reply([{"text": "박도윤 님의 소속 팀은 물류"}], stop_reason))

    run = executed(agent, "박도윤?")

    assert (run.status, run.error_code, run.answer) == (Run.Status.FAILED, code, "")
    assert {"type": "outcome", "reason": code, "stop_reason": stop_reason} in run.messages
    assert run.token_usage["total_tokens"] == 132  # spent, and counted


@pytest.mark.parametrize(
    ("stop_reason", "code"),
    [
        ("model_context_window_exceeded", "model:context_window"),
        ("malformed_tool_use", "model:malformed"),
        ("content_filtered", "model:content_filter"),
    ],
)
def test_a_bedrock_tool_use_stopped_short_is_never_sent(
    demo_server,
    stubbed_bedrock,  # noqa: F811 - the fixture
    stop_reason: str,
    code: str,
) -> None:
    agent = bedrock_agent(demo_server, f"short-call-{stop_reason[:15]}")
    use = {"toolUse": {"toolUseId": "tu-1", "name": "search_employee", "input": {"name": "박"}}}
    stubbed_bedrock.add_response("converse", converse_reply([use], stop_reason))

    run = executed(agent, "박도윤?")

    assert (run.status, run.error_code) == (Run.Status.FAILED, code)
    assert tool_calls_of(run) == []
    assert {"type": "outcome", "reason": code, "stop_reason": stop_reason} in run.messages


@pytest.mark.slow
@pytest.mark.parametrize("calls", [False, True], ids=["text", "tool_call"])
def test_an_openai_turn_the_content_filter_stopped_fails_and_sends_nothing(demo_server, calls: bool) -> None:
    turn: dict[str, Any] = {"content": "박도윤 님의 연봉은"}
    if calls:
        turn = {"content": None, "tool_calls": [tool_call("c1", json.dumps({"name": "박"}))]}
    with raw_model_server(answering([completion(turn, "content_filter"), completion({"content": "끝"})])) as model:
        agent = model_agent(model["base_url"], demo_server, slug=f"filtered-{calls}", retry={"max_attempts": 1})
        run = submit(agent, "박도윤?")

    assert (run.status, run.error_code, run.answer) == (Run.Status.FAILED, "model:content_filter", "")
    assert tool_calls_of(run) == []
    assert {"type": "outcome", "reason": "model:content_filter", "stop_reason": "content_filter"} in run.messages
    assert run.token_usage["model_calls"] == 1


@pytest.mark.parametrize("code", ["model:context_window", "model:content_filter", "model:malformed"])
def test_the_new_ways_a_run_can_end_have_words(code: str) -> None:
    with translation.override("en"):
        assert reason_label(code) != code


# --- 3. a reply with no choice, or an error object with HTTP 200 ----------------------------------------------------


@pytest.mark.slow
def test_a_reply_with_no_choice_fails_as_empty_with_its_tokens_counted(demo_server) -> None:
    body = {"id": "c", "object": "chat.completion", "created": 1, "model": "m", "choices": []}
    body["usage"] = {"prompt_tokens": 5, "completion_tokens": 0, "total_tokens": 5}
    with raw_model_server(answering([json.dumps(body).encode()])) as model:
        agent = model_agent(model["base_url"], demo_server, slug="no-choice", retry={"max_attempts": 1})
        run = submit(agent, "박도윤?")

    assert (run.status, run.error_code) == (Run.Status.FAILED, "model:empty")
    assert "IndexError" not in run.error_message
    assert (run.token_usage["input_tokens"], run.token_usage["model_calls"]) == (5, 1)


@pytest.mark.slow
def test_an_error_object_with_http_200_is_retried_as_the_server_error_it_names(demo_server) -> None:
    overloaded = json.dumps({"error": {"message": "model overloaded", "code": 503}}).encode()
    with raw_model_server(answering([overloaded])) as model:
        agent = model_agent(model["base_url"], demo_server, slug="err-200", retry={"max_attempts": 2, "backoff_s": 0})
        run = submit(agent, "박도윤?")
        requests = model["requests"]

    assert (run.status, run.error_code) == (Run.Status.FAILED, "model:unavailable")
    assert requests == 2  # retried by the agent's policy, as a 503 is
    assert "model overloaded" in run.error_message and "ValueError" not in run.error_message


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        ({"code": 503}, "unavailable"),
        ({"code": "502"}, "unavailable"),
        ({"code": 429}, "throttled"),
        ({"code": "rate_limit_exceeded"}, "throttled"),  # OpenAI's own word for a 429
        ({"code": True}, "error"),
        ("overloaded", "error"),
    ],
)
def test_an_error_objects_code_names_the_failures_kind(error: Any, kind: str) -> None:
    assert model_error_kind(ModelErrorAnswer(error)) == kind
