"""What a network model call may reach, resend and pass off as an answer. The defects these tests hold:

1. Full-width and ideographic dots in a model base URL (``127。0。0。1``) got past the address policy (``urlparse``
   reads a name; httpx maps the dots to ASCII and connects), and the model's key was sent to the refused host; the
   refusal named PLATFORM_MCP_ALLOW_PRIVATE_URLS for a model URL.
2. A redirect from an allowed host was followed: the conversation went to an address the policy never saw.
3. A stream that ended early (no finish reason) passed as a finished answer.
4. Tool-call arguments that are JSON but no object (``[1, 2]``) failed the run (``model:error``, tokens lost)
   instead of being refused to the model as ``args:json``: OpenAI-compatible and Bedrock.
5. A budgeted run sent a call again after its stream was cut partway (the provider may have billed it).
6. ``gen_ai.provider.name`` was the platform's own provider name (``bedrock``), not the conventions' value.
"""

from __future__ import annotations

import json
import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from django.core.exceptions import ValidationError

from agents import providers
from agents.models import Agent, Run
from audit.models import AuditEvent
from mcpregistry.binding_policy import url_problem
from mcpregistry.models import McpServer
from tests.agents.test_openai_compatible import MODEL_KEY, openai_agent, submit
from tests.conftest import make_agent
from tests.openai_server import ScriptedOpenAIServer

pytestmark = pytest.mark.django_db

Answer = Callable[[BaseHTTPRequestHandler], None]


@contextmanager
def raw_model_server(answer: Answer) -> Iterator[dict[str, Any]]:
    """A plain HTTP server at ``/v1`` whose every POST is answered by ``answer(handler)`` (raw framing: a
    redirect, a stream cut short); ``requests`` counts the POSTs."""
    state: dict[str, Any] = {"requests": 0}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            return

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            state["requests"] += 1
            try:
                answer(self)
            except (BrokenPipeError, ConnectionResetError):
                return

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    state["base_url"] = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


def sse(payload: dict[str, Any]) -> bytes:
    base = {"id": "chatcmpl-cut", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    return f"data: {json.dumps(base | payload, ensure_ascii=False)}\n\n".encode()


FIRST_CHUNK = sse({"choices": [{"index": 0, "delta": {"role": "assistant", "content": "박도윤 님은 물류"}}]})


def ends_after_a_first_chunk(handler: BaseHTTPRequestHandler) -> None:
    """Connection-close framing: one chunk, then the server closes cleanly (no finish reason, no usage, no [DONE])."""
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream")
    handler.send_header("Connection", "close")
    handler.end_headers()
    handler.wfile.write(FIRST_CHUNK)
    handler.wfile.flush()
    handler.close_connection = True


def dropped_partway(handler: BaseHTTPRequestHandler) -> None:
    """Chunked framing cut inside a chunk: the client reads a protocol error after the provider began answering."""
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream")
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    handler.wfile.write(b"%x\r\n%s\r\n" % (len(FIRST_CHUNK), FIRST_CHUNK))
    handler.wfile.write(b"200\r\ndata: {")
    handler.wfile.flush()
    handler.connection.shutdown(socket.SHUT_RDWR)
    handler.close_connection = True


def model_agent(base_url: str, demo_server: McpServer, *, slug: str, **params: Any) -> Agent:
    with ScriptedOpenAIServer([]).running() as placeholder:
        agent = openai_agent(placeholder, demo_server, slug=slug, **params)
    Agent.objects.filter(pk=agent.pk).update(model_params={**agent.model_params, "base_url": base_url})
    agent.refresh_from_db()
    return agent


# ---- 1. the address policy reads the host as the client does --------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "http://127。0。0。1:8080/v1",  # U+3002 ideographic full stop
        "http://10．0．0．1/v1",  # U+FF0E fullwidth full stop
        "http://169｡254｡169｡254/latest",  # U+FF61 halfwidth ideographic full stop
        "http://localhost。/v1",
        "http://metadata。google。internal/",
    ],
)
def test_a_host_spelled_with_full_width_or_ideographic_dots_is_refused_as_the_address_it_is(url: str) -> None:
    assert url_problem(url, []) is not None
    assert url_problem(url, [], target="model") is not None


def test_the_metadata_address_with_ideographic_dots_is_named_a_metadata_service() -> None:
    assert "metadata" in (url_problem("http://169。254。169。254/latest", []) or "")


def test_an_allowed_host_is_matched_as_the_client_reads_it_and_a_korean_name_is_shown_as_written() -> None:
    assert url_problem("http://127。0。0。1:8080/v1", ["127.0.0.1"]) is None
    assert url_problem("http://127。0。0。1:8080/v1", ["127.0.0.1:8080"]) is None
    assert "'테스트.localhost'" in (url_problem("http://테스트.localhost/v1", [], target="model") or "")


def test_a_model_url_refusal_names_the_model_setting() -> None:
    for url in ("http://127.0.0.1:8000/v1", "http://localhost:11434/v1"):
        problem = url_problem(url, [], target="model") or ""
        assert "PLATFORM_MODEL_ALLOW_PRIVATE_URLS" in problem and "PLATFORM_MCP_ALLOW_PRIVATE_URLS" not in problem
        assert "PLATFORM_MCP_ALLOW_PRIVATE_URLS" in (url_problem(url, []) or "")


@pytest.mark.slow
def test_a_stored_base_url_with_ideographic_dots_sends_the_model_key_nowhere(
    demo_server: McpServer, settings: Any
) -> None:
    with ScriptedOpenAIServer([{"content": "안녕하세요"}]).running() as server:
        dotted = server.base_url.replace("127.0.0.1", "127。0。0。1")
        agent = model_agent(dotted, demo_server, slug="dotted-url")  # stored before the policy read it so
        settings.PLATFORM_MODEL_ALLOW_PRIVATE_URLS = []
        with pytest.raises(ValidationError) as refused:
            agent.full_clean()
        assert "127.0.0.1" in str(refused.value.message_dict["model_params"])
        run = submit(agent, "안녕")
    assert (run.status, run.error_code) == (Run.Status.FAILED, "model:unavailable")
    assert "PLATFORM_MODEL_ALLOW_PRIVATE_URLS" in run.error_message
    assert server.requests == []  # the key never left


# ---- 2. redirects ----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_redirect_from_the_model_server_is_not_followed_and_fails_the_run_as_validation(
    demo_server: McpServer,
) -> None:
    with ScriptedOpenAIServer([{"content": "from the refused host"}]).running() as elsewhere:

        def redirect(handler: BaseHTTPRequestHandler) -> None:
            handler.send_response(307)
            handler.send_header("Location", f"{elsewhere.base_url}/chat/completions")
            handler.send_header("Content-Length", "0")
            handler.end_headers()

        with raw_model_server(redirect) as redirecting:
            agent = model_agent(redirecting["base_url"], demo_server, slug="redirected")
            run = submit(agent, "박도윤 님 팀?")
        assert elsewhere.requests == []  # neither the key nor the conversation went there
    assert (run.status, run.error_code) == (Run.Status.FAILED, "model:validation")
    assert "307" in run.error_message and f"{elsewhere.base_url}/chat/completions" in run.error_message
    assert "model_params.base_url" in run.error_message  # what to change (the message is in the agent's language)
    assert MODEL_KEY not in run.error_message


# ---- 3. a stream that ends early -------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_stream_that_ends_without_a_finish_reason_is_retried_and_never_passes_as_the_answer(
    demo_server: McpServer,
) -> None:
    with raw_model_server(ends_after_a_first_chunk) as cut:
        agent = model_agent(
            cut["base_url"], demo_server, slug="cut-stream", stream=True, retry={"max_attempts": 3, "backoff_s": 0}
        )
        run = submit(agent, "박도윤 님 팀?")
    assert (run.status, run.error_code) == (Run.Status.FAILED, "model:connection")
    assert run.answer == ""
    assert cut["requests"] == 3  # a connection failure: retried by the agent's policy
    assert "finish_reason" in run.error_message


# ---- 4. arguments that are JSON but no object ------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_tool_arguments_that_are_a_json_list_are_refused_to_the_model_and_the_turns_tokens_kept(
    demo_server: McpServer, stream: bool
) -> None:
    turns: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "search_employee", "raw_arguments": "[1, 2]"}]},
        {"content": "인자를 고쳐야 합니다."},
    ]
    with ScriptedOpenAIServer(turns).running() as server:
        agent = openai_agent(server, demo_server, slug="list-args", stream=stream)
        run = submit(agent, "박도윤 님 팀?")
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    event = AuditEvent.objects.get(run_id=run.id, action="tool.call")
    assert (event.tool, event.ok, event.reason) == ("search_employee", False, "args:json")
    told = [m for m in server.requests[1]["body"]["messages"] if m["role"] == "tool"]
    assert len(told) == 1 and told[0]["content"]  # the model is told why its call did not run
    assert (run.token_usage["model_calls"], run.token_usage["input_tokens"]) == (2, 200)


def test_a_bedrock_tool_use_whose_input_is_a_list_is_refused_to_the_model_and_its_tokens_kept(
    demo_server: McpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    client = boto3.client("bedrock-runtime", region_name="us-east-1")
    monkeypatch.setattr(providers, "bedrock_runtime_client", lambda *, region_name, timeout_s: client)
    usage = {"inputTokens": 120, "outputTokens": 12, "totalTokens": 132}
    tool_use = {"toolUse": {"toolUseId": "tu-1", "name": "search_employee", "input": [1, 2]}}
    answer = {"text": "인자를 고쳐야 합니다."}
    with Stubber(client) as stubber:
        for content, stop in (([tool_use], "tool_use"), ([answer], "end_turn")):
            stubber.add_response(
                "converse",
                {
                    "output": {"message": {"role": "assistant", "content": content}},
                    "stopReason": stop,
                    "usage": usage,
                    "metrics": {"latencyMs": 50},
                },
            )
        agent = make_agent(slug="bedrock-list", servers=[demo_server], provider="bedrock", with_demo_rules=False)
        agent.model_id = "anthropic.claude-3-haiku-20240307-v1:0"
        agent.model_params = {"region_name": "us-east-1"}
        agent.save()
        run = submit(agent, "박도윤 님 팀?")
        stubber.assert_no_pending_responses()
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    event = AuditEvent.objects.get(run_id=run.id, action="tool.call")
    assert (event.tool, event.ok, event.reason) == ("search_employee", False, "args:json")
    assert (run.token_usage["model_calls"], run.token_usage["input_tokens"]) == (2, 240)


# ---- 5. what a budgeted run sends again ------------------------------------------------------------------------


def budgeted(agent: Agent) -> Run:
    from agents.budgets import budget_create
    from agents.execution import run_execute
    from agents.services import run_create

    budget_create(
        actor="test-admin",
        via="tests",
        data={"agent": agent, "period": "day", "max_tokens": 100_000, "run_reservation_tokens": 20_000},
    )
    run = run_create(agent_slug=agent.slug, query="안녕하세요", api_key=None)  # reserves its share
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    return run


@pytest.mark.slow
@pytest.mark.parametrize("cut", [dropped_partway, ends_after_a_first_chunk], ids=["dropped", "ended"])
def test_a_budgeted_run_does_not_send_a_call_cut_after_the_provider_began_again(
    demo_server: McpServer, cut: Answer
) -> None:
    with raw_model_server(cut) as server:
        agent = model_agent(
            server["base_url"], demo_server, slug="budget-cut", stream=True, retry={"max_attempts": 3, "backoff_s": 0}
        )
        run = budgeted(agent)
        requests = server["requests"]
    assert (run.status, run.error_code) == (Run.Status.FAILED, "model:connection")
    assert requests == 1


@pytest.mark.slow
def test_without_a_budget_a_dropped_stream_is_retried_by_the_agents_policy(demo_server: McpServer) -> None:
    with raw_model_server(dropped_partway) as server:
        agent = model_agent(
            server["base_url"],
            demo_server,
            slug="unbudgeted-cut",
            stream=True,
            retry={"max_attempts": 2, "backoff_s": 0},
        )
        run = submit(agent, "안녕")
    assert (run.status, run.error_code) == (Run.Status.FAILED, "model:connection")
    assert server["requests"] == 2


def test_a_budgeted_model_still_retries_a_call_that_could_not_connect() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    model = providers.build_provider_model(
        provider="openai_compatible",
        model_id="m",
        params={"base_url": f"http://127.0.0.1:{port}/v1", "retry": {"max_attempts": 2, "backoff_s": 0}},
        api_key=None,
        retry_sent_requests=False,
    )
    with pytest.raises(providers.ModelCallFailed) as failed:
        model.invoke("안녕")
    assert (failed.value.code, failed.value.attempts) == ("model:connection", 2)


def test_a_bedrock_endpoint_not_reached_was_never_sent_and_a_closed_connection_may_have_been() -> None:
    import botocore.exceptions as boto

    assert providers.request_never_sent(boto.EndpointConnectionError(endpoint_url="https://bedrock"))
    assert not providers.request_never_sent(boto.ConnectionClosedError(endpoint_url="https://bedrock"))
    assert not providers.request_never_sent(providers.ModelStreamCutShort("cut"))


# ---- 6. gen_ai.provider.name -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("provider", "expected"), [("bedrock", "aws.bedrock"), ("openai_compatible", "openai"), ("offline", "offline")]
)
def test_spans_name_the_provider_as_the_genai_conventions_do(spans: Any, provider: str, expected: str) -> None:
    from langchain_core.outputs import LLMResult

    import agent_platform.telemetry as telemetry
    from agents.model_tracing import ModelCallTracer

    with telemetry.run_span(run_id="run-1", agent="a", provider=provider, model="m"):
        tracer = ModelCallTracer(provider=provider, model="m")
        call = uuid.uuid4()
        tracer.on_chat_model_start({}, [[]], run_id=call)
        tracer.on_llm_end(LLMResult(generations=[]), run_id=call)
    names = {s.name: s.attributes.get("gen_ai.provider.name") for s in spans.get_finished_spans()}
    assert names == {"invoke_agent a": expected, "chat m": expected}
