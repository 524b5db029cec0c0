"""A streamed reply's token usage is the stream's total, counted once: a server may report it on more than one
chunk (on the chunk that finishes the choice and again on OpenAI's usage chunk, or on every chunk as vLLM's
continuous usage does), each time as the total so far; langchain adds up every chunk's usage, so the run was charged
twice (or once per chunk). A run cancelled while its model call waits out a backoff ends then. Only the model is scripted: a real local HTTP server speaking the OpenAI API."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

from agents.models import Run
from tests.agents.test_openai_compatible import submit
from tests.agents.test_provider_boundaries import model_agent, raw_model_server, sse
from tests.agents.test_s45_model_providers import answered, streamed

pytestmark = pytest.mark.django_db


def usage(prompt: int, completion: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


ROLE = sse({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})


def text(part: str, **extra: Any) -> bytes:
    return sse({"choices": [{"index": 0, "delta": {"content": part}}], **extra})


def finish(**extra: Any) -> bytes:
    return sse({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], **extra})


TWICE = [ROLE, text("박도윤 님은 "), text("물류플랫폼팀입니다."), finish(usage=usage(120, 30))]
TWICE += [sse({"choices": [], "usage": usage(120, 30)}), b"data: [DONE]\n\n"]
# vLLM's ``continuous_usage_stats``: every chunk carries the usage so far.
EVERY_CHUNK = [text("박도윤 님은 ", usage=usage(120, 3)), text("물류플랫폼팀입니다.", usage=usage(120, 9))]
EVERY_CHUNK += [finish(usage=usage(120, 30)), sse({"choices": [], "usage": usage(120, 30)}), b"data: [DONE]\n\n"]
ONCE = [ROLE, text("박도윤 님은 물류플랫폼팀입니다."), finish(), sse({"choices": [], "usage": usage(120, 30)})]
ONCE += [b"data: [DONE]\n\n"]


@pytest.mark.slow
@pytest.mark.parametrize("events", [TWICE, EVERY_CHUNK, ONCE], ids=["finish-and-usage-chunk", "every-chunk", "once"])
def test_a_streamed_replys_usage_is_charged_once_however_often_the_server_reports_it(
    demo_server, events: list[bytes]
) -> None:
    def answer(handler: BaseHTTPRequestHandler) -> None:
        streamed(handler, events)

    with raw_model_server(answer) as server:
        agent = model_agent(server["base_url"], demo_server, slug="usage-once", stream=True)
        run = submit(agent, "박도윤 님 팀?")

    assert (run.status, run.answer) == (Run.Status.SUCCEEDED, "박도윤 님은 물류플랫폼팀입니다."), run.error_message
    assert (run.token_usage["model_calls"], run.token_usage["input_tokens"]) == (1, 120)
    assert run.token_usage["output_tokens"] == 30


# --- a cancel during a model call's backoff -----------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_run_cancelled_while_its_model_call_waits_to_be_sent_again_ends_then_not_when_the_wait_is_over(
    demo_server,
) -> None:
    """A 429 asking for 30 s (the policy allows waiting that long): the run is cancelled during the wait; it ends
    within a few seconds, the call not sent again (it waited out the whole backoff, up to two minutes)."""
    from django.db import connection

    from agents.execution import run_execute
    from agents.services import run_cancel, run_create

    asked = threading.Event()

    def throttled(handler: BaseHTTPRequestHandler) -> None:
        answered(handler, 429, b'{"error": {"message": "Rate limit reached"}}', "application/json", Retry_After="30")
        asked.set()

    def execute(run_id: str) -> None:
        try:
            run_execute(run_id=run_id)
        finally:
            connection.close()

    with raw_model_server(throttled) as server:
        retry = {"max_attempts": 3, "backoff_s": 0.01, "max_backoff_s": 60}
        agent = model_agent(server["base_url"], demo_server, slug="cancel-in-backoff", retry=retry)
        run = run_create(agent_slug=agent.slug, query="안녕하세요", api_key=None)
        worker = threading.Thread(target=execute, args=(str(run.id),), daemon=True)
        worker.start()
        assert asked.wait(30)
        run_cancel(run=Run.objects.get(pk=run.pk), actor="tester")
        worker.join(15)  # half the wait asked for: a run that waited it out is still in it
        ended = not worker.is_alive()
        worker.join(60)
        requests = server["requests"]

    run.refresh_from_db()
    assert ended, "the run went on waiting out its backoff after it was cancelled"
    assert (run.status, requests) == (Run.Status.CANCELLED, 1)
