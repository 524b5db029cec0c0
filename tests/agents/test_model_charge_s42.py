"""A model call whose request was sent but whose answer never came back (a read timeout, a connection cut after the
request) is charged an estimate: its input bound and the ``max_tokens`` it was given, marked estimated, through its
``model_turn`` event as a turn is, so the run and its budget count it; each such attempt, a retried one too. A call
that never reached the provider (the port closed) is charged nothing. Real HTTP against the tests' scripted
OpenAI-compatible server (or a socket that drops the request), the real demo MCP server."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from agents.budgets import budget_create
from agents.execution import run_execute
from agents.models import Agent, BudgetUsage, Run, RunEvent
from agents.services import run_create
from tests.agents.test_openai_compatible import openai_agent
from tests.openai_server import ScriptedOpenAIServer

pytestmark = pytest.mark.django_db

NO_RETRY_WAIT = {"max_attempts": 3, "backoff_s": 0}


def budgeted(agent: Agent) -> None:
    budget_create(
        actor="t",
        via="tests",
        data={"agent": agent, "period": "day", "max_tokens": 100_000, "run_reservation_tokens": 20_000},
    )


def run_of(agent: Agent, query: str) -> Run:
    run = run_create(agent_slug=agent.slug, query=query, api_key=None)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    return run


def turn_events(run: Run) -> list[dict]:
    return list(
        RunEvent.objects.filter(run_id=run.id, kind="model_turn").order_by("seq").values_list("data", flat=True)
    )


def sent_max_tokens(request: dict) -> int:
    body = request["body"]
    return int(body.get("max_completion_tokens") or body.get("max_tokens"))


def prompt_bytes(request: dict) -> int:
    return sum(len(str(m.get("content") or "").encode()) for m in request["body"]["messages"])


def timed_out_run(demo_server) -> tuple[Run, list[dict]]:
    """A budgeted run whose one model call timed out after it was sent, and the requests the server got."""
    with ScriptedOpenAIServer([{"delay_s": 2, "content": "늦은 답변 " * 50}]).running() as server:
        agent = openai_agent(server, demo_server, timeout_s=0.5, retry=NO_RETRY_WAIT)
        budgeted(agent)
        run = run_of(agent, "안녕하세요")
        return run, list(server.requests)


@pytest.mark.slow
def test_a_budgeted_call_that_timed_out_is_charged_its_input_bound_and_max_tokens(demo_server) -> None:
    run, requests = timed_out_run(demo_server)
    assert len(requests) == 1  # a budgeted run sends a timed-out call once
    assert (run.status, run.error_code) == (Run.Status.FAILED, "model:timeout")
    usage = run.token_usage
    assert usage["output_tokens"] == sent_max_tokens(requests[0]) == 512
    # The input bound counts the prompt at a token per byte at least, and the call fit the run's reservation.
    assert prompt_bytes(requests[0]) < usage["input_tokens"] <= 20_000 - 512
    assert usage["total_tokens"] == usage["input_tokens"] + 512
    assert (usage["model_calls"], usage["model_calls_estimated"]) == (1, 1)
    assert run.tokens == usage["input_tokens"] + 512
    [event] = turn_events(run)
    assert event["usage_estimated"] is True and event["unanswered"] == "timeout"
    assert event["usage"]["input_tokens"] == usage["input_tokens"] and event["usage"]["output_tokens"] == 512
    [counter] = BudgetUsage.objects.all()
    assert (counter.used_tokens, counter.reserved_tokens) == (run.tokens, 0)


@pytest.mark.slow
def test_the_run_page_says_a_turn_got_no_answer_and_is_charged_an_estimate(demo_server, admin_client) -> None:
    """The turn was an empty "model turn 1" on the run's page, in both languages."""
    run, _requests = timed_out_run(demo_server)
    english = admin_client.get(f"/admin/agents/run/{run.pk}/change/", HTTP_ACCEPT_LANGUAGE="en").content.decode()
    assert "no answer came back" in english and "It timed out after its request was sent." in english
    assert "charged an estimate" in english
    korean = admin_client.get(f"/admin/agents/run/{run.pk}/change/", HTTP_ACCEPT_LANGUAGE="ko").content.decode()
    assert "응답이 오지 않았습니다" in korean and "추정" in korean


@contextmanager
def dropping_server() -> Iterator[tuple[str, list[bytes]]]:
    """A server that reads each request whole and closes the connection without a word: sent, never answered."""
    listener = socket.create_server(("127.0.0.1", 0))
    received: list[bytes] = []
    stopped = threading.Event()

    def serve() -> None:
        while not stopped.is_set():
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            with connection:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += connection.recv(65536)
                head, _, body = data.partition(b"\r\n\r\n")
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                while len(body) < length:
                    body += connection.recv(65536)
                received.append(body)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1", received
    finally:
        stopped.set()
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)  # wakes the accept (a close alone leaves it waiting)
        listener.close()
        thread.join(timeout=5)


def test_a_budgeted_call_cut_after_its_request_was_sent_is_charged_the_estimate(demo_server) -> None:
    with ScriptedOpenAIServer([]).running() as server, dropping_server() as (base_url, received):
        agent = openai_agent(server, demo_server, retry=NO_RETRY_WAIT)
        agent.model_params = {**agent.model_params, "base_url": base_url}
        agent.save()
        budgeted(agent)
        run = run_of(agent, "안녕하세요")
    assert len(received) == 1  # reached the provider: not sent again
    assert (run.status, run.error_code) == (Run.Status.FAILED, "model:connection")
    assert run.token_usage["output_tokens"] == 512 and run.token_usage["input_tokens"] > 0
    assert run.token_usage["model_calls_estimated"] == 1
    [event] = turn_events(run)
    assert event["usage_estimated"] is True and event["unanswered"] == "connection"
    [counter] = BudgetUsage.objects.all()
    assert (counter.used_tokens, counter.reserved_tokens) == (run.tokens, 0) and run.tokens > 512


@pytest.mark.slow
def test_a_retried_timed_out_attempt_of_a_run_without_a_budget_is_charged_beside_the_answered_one(
    demo_server,
) -> None:
    turns = [{"delay_s": 2, "content": "늦은 답변"}, {"content": "안녕하세요, 무엇을 도와드릴까요?"}]
    with ScriptedOpenAIServer(turns, usage={"prompt_tokens": 100, "completion_tokens": 10}).running() as server:
        agent = openai_agent(server, demo_server, timeout_s=0.5, retry=NO_RETRY_WAIT)
        run = run_of(agent, "안녕하세요")
        requests = list(server.requests)
    assert len(requests) == 2  # sent again without a budget
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    lost, answered = turn_events(run)
    assert lost["usage_estimated"] is True and lost["unanswered"] == "timeout"
    assert lost["usage"]["output_tokens"] == 512 and lost["usage"]["input_tokens"] > prompt_bytes(requests[0])
    assert "usage_estimated" not in answered and answered["usage"]["input_tokens"] == 100
    usage = run.token_usage
    assert usage["input_tokens"] == lost["usage"]["input_tokens"] + 100
    assert usage["output_tokens"] == 512 + 10
    assert (usage["model_calls"], usage["model_calls_estimated"]) == (2, 1)
    assert run.tokens == usage["input_tokens"] + usage["output_tokens"]


def test_a_call_that_never_reached_the_provider_is_charged_nothing(demo_server) -> None:
    with ScriptedOpenAIServer([]).running() as server:
        agent = openai_agent(server, demo_server, retry=NO_RETRY_WAIT)
    # The server is gone, its port closed: every attempt is refused at connect, sent again, and costs nothing.
    budgeted(agent)
    run = run_of(agent, "안녕하세요")
    assert (run.status, run.error_code) == (Run.Status.FAILED, "model:connection")
    assert run.tokens == 0 and run.token_usage["model_calls"] == 0
    assert "model_calls_estimated" not in run.token_usage
    assert turn_events(run) == []
    [counter] = BudgetUsage.objects.all()
    assert (counter.used_tokens, counter.reserved_tokens) == (0, 0)
