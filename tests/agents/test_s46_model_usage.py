"""A streamed reply's token usage is the stream's total, counted once: a server may report it on more than one
chunk (on the chunk that finishes the choice and again on OpenAI's usage chunk, or on every chunk as vLLM's
continuous usage does), each time as the total so far; langchain adds up every chunk's usage, so the run was charged
twice (or once per chunk). Only the model is scripted: a real local HTTP server speaking the OpenAI API."""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

from agents.models import Run
from tests.agents.test_openai_compatible import submit
from tests.agents.test_provider_boundaries import model_agent, raw_model_server, sse
from tests.agents.test_s45_model_providers import streamed

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
