"""A span per model call (``chat <model>``), with the GenAI semantic conventions' attributes: the provider, the
requested model, the tokens used and the finish reasons (the provider's own stop reason where it gave one).
Given to the ReAct graph as a LangChain callback handler (``agents.engine``), so it sees every call of every
provider. The messages themselves are never recorded."""

from __future__ import annotations

import threading
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import LLMResult
from opentelemetry import context as otel_context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

import agent_platform.telemetry as telemetry
from agents.providers import stop_reason


class ModelCallTracer(BaseCallbackHandler):
    """Starts a client span when a chat model is called and ends it with the usage when it answers (or fails).
    The span's parent is the context current where the handler was made (the run's span). ``provider`` is the
    platform's name (``Agent.model_provider``); the span names it as the conventions do
    (``telemetry.gen_ai_provider_name``: ``aws.bedrock``, ``openai``)."""

    def __init__(self, *, provider: str, model: str) -> None:
        self.provider = provider
        self.model = model
        self.parent = otel_context.get_current()
        self._spans: dict[UUID, Span] = {}
        self._lock = threading.Lock()

    def on_chat_model_start(
        self, serialized: dict[str, Any], messages: list[list[BaseMessage]], *, run_id: UUID, **kwargs: Any
    ) -> None:
        provider_name = telemetry.gen_ai_provider_name(self.provider)
        name = f"chat {self.model}" if self.model else f"chat {provider_name}"
        started = telemetry.tracer().start_span(
            name,
            context=self.parent,
            kind=SpanKind.CLIENT,
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": provider_name,
                "gen_ai.request.model": self.model or self.provider,
            },
        )
        with self._lock:
            self._spans[run_id] = started

    def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        with self._lock:
            started = self._spans.pop(run_id, None)
        if started is None:
            return
        input_tokens = output_tokens = 0
        finish_reasons: list[str] = []
        for generations in response.generations:
            for generation in generations:
                message = getattr(generation, "message", None)
                if isinstance(message, AIMessage):
                    usage: dict[str, Any] = dict(message.usage_metadata or {})
                    input_tokens += int(usage.get("input_tokens", 0) or 0)
                    output_tokens += int(usage.get("output_tokens", 0) or 0)
                    # The provider's own reason where it gave one (``max_tokens``/``length``: the turn was cut short).
                    reported = stop_reason(message.response_metadata or {})
                    finish_reasons.append(reported or ("tool_calls" if message.tool_calls else "stop"))
        started.set_attribute("gen_ai.usage.input_tokens", input_tokens)
        started.set_attribute("gen_ai.usage.output_tokens", output_tokens)
        if finish_reasons:
            started.set_attribute("gen_ai.response.finish_reasons", finish_reasons)
        started.end()

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        with self._lock:
            started = self._spans.pop(run_id, None)
        if started is None:
            return
        started.set_status(Status(StatusCode.ERROR, type(error).__name__))
        started.set_attribute("error.type", type(error).__name__)
        started.end()
