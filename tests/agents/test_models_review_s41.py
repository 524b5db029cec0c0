"""The s41 model review's defects, each through the real providers: Bedrock's client with a raw reply fed through
botocore's own parser (a ``before-send`` hook) or botocore's Stubber, the OpenAI-compatible client against a real
local HTTP server (``ScriptedOpenAIServer``), the demo MCP server over stdio.

1. A reply whose tokens arrived but that langchain could not read is charged: a tool call whose arguments are a
   JSON object (not its text) is the call it writes, one whose arguments are another JSON value is refused as
   ``args:json``; a Converse reply with a content block langchain-aws does not know fails with its usage counted.
2. A context-window overflow refused as an error is ``model:context_window`` (never retried), with its advice.
3. A model turn's token counts are not masked in its event when a count equals a binding's secret value.
4. Under a budget, a Bedrock call that could not connect (connect timeout) is sent again; a read timeout is not.
5. A cancelled run's failed model call is not sent again.
6. A model turn's tool calls past ``PLATFORM_MAX_TOOL_CALLS_PER_TURN`` are refused (``tool:too_many_calls``) and
   audited, never sent.
"""

from __future__ import annotations

import json
from typing import Any

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from botocore.exceptions import ConnectTimeoutError, ReadTimeoutError
from botocore.stub import Stubber
from django.utils import translation

from agents import providers
from agents.budgets import budget_create, budget_reserve, run_spent_usage
from agents.engine import max_tool_calls_per_turn, unfinished_turn_text
from agents.execution import run_execute
from agents.model_texts import model_failure_text
from agents.models import Agent, Run, RunEvent
from agents.services import run_cancel
from audit.models import AuditEvent
from tests.agents.test_bedrock import bedrock_agent, converse_reply, submit
from tests.agents.test_openai_compatible import openai_agent
from tests.conftest import bind_demo_server
from tests.openai_server import ScriptedOpenAIServer

pytestmark = pytest.mark.django_db


class _RawBody:
    def __init__(self, body: bytes) -> None:
        self.body = body

    def stream(self, **kwargs: Any) -> Any:
        yield self.body


def http_reply(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> AWSResponse:
    """A raw HTTP reply, read by botocore's own parser as one from Bedrock would be."""
    return AWSResponse(
        "https://bedrock-runtime.us-east-1.amazonaws.com",
        status,
        {"Content-Type": "application/json", **(headers or {})},
        _RawBody(json.dumps(body).encode()),
    )


def answer(text: str = "안녕하세요", usage: tuple[int, int] = (100, 10)) -> AWSResponse:
    return http_reply(
        200,
        {
            "output": {"message": {"role": "assistant", "content": [{"text": text}]}},
            "stopReason": "end_turn",
            "usage": {"inputTokens": usage[0], "outputTokens": usage[1], "totalTokens": sum(usage)},
            "metrics": {"latencyMs": 5},
        },
    )


def throttled() -> AWSResponse:
    return http_reply(429, {"message": "slow down"}, {"x-amzn-ErrorType": "ThrottlingException:http://internal/"})


@pytest.fixture
def wire(monkeypatch: pytest.MonkeyPatch) -> tuple[list[Any], list[Any]]:
    """The real Bedrock client, whose requests are answered (or failed) in turn by ``plan``'s steps before they
    leave: an AWSResponse, an exception to raise, or a function giving either. ``sent``: the requests made."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    plan: list[Any] = []
    sent: list[Any] = []
    real = providers.bedrock_runtime_client

    def make(*, region_name: str | None, timeout_s: float) -> Any:
        client = real(region_name=region_name, timeout_s=timeout_s)

        def before_send(request: Any, **kwargs: Any) -> Any:
            sent.append(request)
            step = plan.pop(0)
            if callable(step):
                step = step()
            if isinstance(step, Exception):
                raise step
            return step

        client.meta.events.register("before-send.bedrock-runtime.Converse", before_send)
        return client

    monkeypatch.setattr(providers, "bedrock_runtime_client", make)
    return plan, sent


@pytest.fixture
def stubbed(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    client = boto3.client("bedrock-runtime", region_name="us-east-1")
    stubber = Stubber(client)
    monkeypatch.setattr(providers, "bedrock_runtime_client", lambda *, region_name, timeout_s: client)
    sent: list[dict[str, Any]] = []
    client.meta.events.register(
        "provide-client-params.bedrock-runtime.Converse",
        lambda params, **kwargs: sent.append(json.loads(json.dumps(params, default=str))),
    )
    stubber.sent = sent  # type: ignore[attr-defined]
    with stubber:
        yield stubber


@pytest.fixture
def local_models(settings: Any) -> None:
    settings.PLATFORM_MODEL_ALLOW_PRIVATE_URLS = ["127.0.0.1"]


def budgeted(agent: Agent) -> Run:
    budget_create(
        actor="test-admin",
        via="tests",
        data={"agent": agent, "period": "day", "max_tokens": 1_000_000, "run_reservation_tokens": 20_000},
    )
    run = Run.objects.create(agent=agent, query="안녕")
    budget_reserve(run=run, agent=agent, api_key=None)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    return run


def said_as_context_window(run: Run) -> bool:
    """Whether the run's error message is the context window's advice (in the agent's language), not the
    validation failure's."""
    with translation.override(run.agent.language):
        advice, validation = unfinished_turn_text("model:context_window"), model_failure_text("validation")
    return run.error_message.startswith(advice) and validation not in run.error_message


def turn_usages(run: Run) -> list[Any]:
    return [
        data.get("usage") for data in RunEvent.objects.filter(run=run, kind="model_turn").values_list("data", flat=True)
    ]


# --- 1. a reply that arrived is charged -----------------------------------------------------------------------


def test_tool_call_arguments_sent_as_a_json_object_are_the_call_and_another_json_value_is_refused(
    demo_server: Any, local_models: None
) -> None:
    turns = [
        {
            "tool_calls": [
                {"name": "search_employee", "raw_arguments": {"name": "박도윤"}},
                {"name": "search_employee", "raw_arguments": [1, 2]},
            ]
        },
        {"content": "끝"},
    ]
    with ScriptedOpenAIServer(turns).running() as server:
        run = submit(openai_agent(server, demo_server, slug="object-args"), "박도윤")
        requests = len(server.requests)
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert requests == 2
    calls = AuditEvent.objects.filter(run_id=run.id, action="tool.call").order_by("seq")
    assert [(e.tool, e.ok, e.reason) for e in calls] == [
        ("search_employee", True, ""),
        ("search_employee", False, "args:json"),
    ]
    assert calls[0].args == {"name": "박도윤"}
    assert run.token_usage["model_calls"] == 2 and run.token_usage["input_tokens"] == 200
    assert [u["input_tokens"] for u in turn_usages(run)] == [100, 100]


@pytest.mark.parametrize(
    "block",
    [{"futureBlock": {"x": 1}}, {"searchResult": {"source": "s", "title": "t", "content": [{"text": "x"}]}}],
    ids=["unknown-member", "search-result"],
)
def test_a_converse_reply_langchain_cannot_read_fails_with_its_tokens_counted(
    demo_server: Any, wire: Any, block: dict[str, Any]
) -> None:
    plan, sent = wire
    plan.append(
        http_reply(
            200,
            {
                "output": {"message": {"role": "assistant", "content": [{"text": "안녕"}, block]}},
                "stopReason": "end_turn",
                "usage": {"inputTokens": 900, "outputTokens": 90, "totalTokens": 990},
                "metrics": {"latencyMs": 5},
            },
        )
    )
    run = submit(bedrock_agent(demo_server, slug="unread-block", retry={"max_attempts": 3, "backoff_s": 0}), "안녕")
    assert (run.status, run.error_code) == (Run.Status.FAILED, "model:error")
    assert len(sent) == 1  # the reply arrived: not asked for again
    assert (run.token_usage["input_tokens"], run.token_usage["output_tokens"]) == (900, 90)
    assert run.token_usage["model_calls"] == 1
    assert [u["input_tokens"] for u in turn_usages(run)] == [900]
    spent = run_spent_usage(run_id=run.id)
    assert (spent["input_tokens"], spent["output_tokens"]) == (900, 90)


# --- 2. a context-window overflow told as an error ------------------------------------------------------------


@pytest.mark.slow
def test_a_bedrock_input_too_long_is_model_context_window_and_never_retried(demo_server: Any, stubbed: Any) -> None:
    for _ in range(3):
        stubbed.add_client_error(
            "converse",
            service_error_code="ValidationException",
            service_message="Input is too long for requested model.",
            http_status_code=400,
        )
    agent = bedrock_agent(
        demo_server, slug="too-long", retry={"max_attempts": 3, "backoff_s": 0, "on": ["validation", "error"]}
    )
    run = submit(agent, "안녕")
    assert (run.status, run.error_code) == (Run.Status.FAILED, "model:context_window")
    assert len(stubbed.sent) == 1
    assert said_as_context_window(run)
    assert "Input is too long" in run.error_message


def test_an_openai_compatible_maximum_context_length_refusal_is_model_context_window(
    demo_server: Any, local_models: None
) -> None:
    refusal = "This model's maximum context length is 8192 tokens. However, you requested 9000 tokens."
    with ScriptedOpenAIServer([{"status": 400, "error": refusal}] * 3).running() as server:
        agent = openai_agent(
            server, demo_server, slug="ctx", retry={"max_attempts": 3, "backoff_s": 0, "on": ["validation"]}
        )
        run = submit(agent, "박도윤")
        requests = len(server.requests)
    assert (run.status, run.error_code) == (Run.Status.FAILED, "model:context_window")
    assert requests == 1
    assert said_as_context_window(run)


# --- 3. token counts are no secret ----------------------------------------------------------------------------


@pytest.mark.slow
def test_a_turns_token_counts_equal_to_a_bindings_secret_value_are_kept_in_its_event(stubbed: Any) -> None:
    server = bind_demo_server(PAGE_SIZE="1024")
    server.public_env = [name for name in server.public_env if name != "PAGE_SIZE"]
    server.save()
    reply = converse_reply([{"text": "안녕하세요 1024"}], "end_turn")
    reply["usage"] = {"inputTokens": 1024, "outputTokens": 7, "totalTokens": 1031}
    stubbed.add_response("converse", reply)
    run = submit(bedrock_agent(server, slug="usage-1024"), "안녕")
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    [event] = RunEvent.objects.filter(run=run, kind="model_turn")
    assert event.data["usage"]["input_tokens"] == 1024
    assert "1024" not in json.dumps(event.data["content"], ensure_ascii=False)  # the rest is still masked
    assert run_spent_usage(run_id=run.id)["input_tokens"] == 1024


# --- 4. under a budget, only a call that could not connect is sent again --------------------------------------


def test_a_budgeted_bedrock_connect_timeout_is_sent_again(demo_server: Any, wire: Any) -> None:
    plan, sent = wire
    plan += [ConnectTimeoutError(endpoint_url="https://bedrock"), answer()]
    run = budgeted(bedrock_agent(demo_server, slug="connect-timeout"))
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert len(sent) == 2


def test_a_budgeted_bedrock_read_timeout_is_not_sent_again(demo_server: Any, wire: Any) -> None:
    plan, sent = wire
    plan += [ReadTimeoutError(endpoint_url="https://bedrock"), answer()]
    run = budgeted(bedrock_agent(demo_server, slug="read-timeout"))
    assert (run.status, run.error_code) == (Run.Status.FAILED, "model:timeout")
    assert len(sent) == 1


# --- 5. a cancelled run sends no call again -------------------------------------------------------------------


def test_a_run_cancelled_during_its_model_calls_retries_is_not_sent_again(demo_server: Any, wire: Any) -> None:
    plan, sent = wire
    agent = bedrock_agent(demo_server, slug="cancel-retry", retry={"max_attempts": 5, "backoff_s": 0})
    run = Run.objects.create(agent=agent, query="안녕")

    def cancel_then_throttle() -> AWSResponse:
        run_cancel(run=Run.objects.get(pk=run.pk), actor="test-admin")
        return throttled()

    plan += [cancel_then_throttle, throttled(), throttled(), throttled(), throttled()]
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert run.status == Run.Status.CANCELLED
    assert len(sent) == 1


# --- 6. a cap on one turn's tool calls ------------------------------------------------------------------------


@pytest.mark.slow
def test_a_turns_tool_calls_past_the_cap_are_refused_audited_and_never_sent(
    demo_server: Any, stubbed: Any, settings: Any
) -> None:
    settings.PLATFORM_MAX_TOOL_CALLS_PER_TURN = 3
    names = ["박도윤", "김민준", "이서연", "최지우", "정하늘"]
    calls = [
        {"toolUse": {"toolUseId": f"tu-{i}", "name": "search_employee", "input": {"name": name}}}
        for i, name in enumerate(names)
    ]
    stubbed.add_response("converse", converse_reply(calls, "tool_use"))
    stubbed.add_response("converse", converse_reply([{"text": "끝"}], "end_turn"))
    run = submit(bedrock_agent(demo_server, slug="many-calls"), "직원들")
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    events = AuditEvent.objects.filter(run_id=run.id, action="tool.call").order_by("seq")
    by_call = {e.call_id: (e.reason, e.attempt) for e in events}
    assert sorted(by_call) == [f"tu-{i}" for i in range(5)]
    assert all(by_call[f"tu-{i}"][0] != "tool:too_many_calls" for i in range(3))  # sent through the gate
    assert [by_call[f"tu-{i}"] for i in (3, 4)] == [("tool:too_many_calls", 0)] * 2
    results = [b["toolResult"] for m in stubbed.sent[1]["messages"] for b in m["content"] if "toolResult" in b]
    assert [r["toolUseId"] for r in results] == [f"tu-{i}" for i in range(5)]
    refused = [r for r in results if r["status"] == "error"]
    assert [r["toolUseId"] for r in refused] == ["tu-3", "tu-4"]
    told = json.dumps(refused[0]["content"], ensure_ascii=False)  # in the agent's language (Korean here)
    assert "at most 3 tool calls" in told or "최대 3개" in told, told


def test_the_tool_call_cap_defaults_to_20(settings: Any) -> None:
    assert max_tool_calls_per_turn() == 20
    settings.PLATFORM_MAX_TOOL_CALLS_PER_TURN = 3
    assert max_tool_calls_per_turn() == 3
