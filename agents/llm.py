"""Chat models an agent can use: ``offline`` and ``scripted`` here; ``bedrock`` and ``openai_compatible`` in
``agents.providers``.

``offline`` needs no network: it answers from the run's deterministic results, phrased by the rules' and the
agent's answer templates, and never asks for a tool. ``scripted`` replays model turns given in the agent's
model parameters (``{"script": [...]}``) so tests and demos can drive the ReAct loop with exact tool calls:

    {"script": [
        {"tool_calls": [{"name": "get_asset_status", "args": {"asset_id": "A-1001"}}]},
        {"if_last_tool_result_contains": "backup", "tool_calls": [{"name": "get_asset_status_backup", ...}]},
        {"content": "Answer: {last_tool_result}"}
    ]}

A turn with ``if_last_tool_result_contains`` is skipped unless the latest tool result contains that text. The
model counts a quarter token per character of what it reads and writes; a turn's ``"usage": {"output_tokens": N}``
reports N output tokens instead (a long answer), and a call's ``max_tokens`` caps them, as a real model stops there.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from functools import cached_property
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool

from agents.graph import is_history_answer


class _PlatformChatModel(BaseChatModel):
    """A chat model of ours, handed to langchain's callbacks as its class, without the ``repr`` ``dumpd`` adds."""

    @cached_property
    def _serialized(self) -> dict[str, Any]:
        """``dumpd``'s form of a model that is not serializable (``to_json_not_implemented``), without its
        ``repr``: pydantic writes that by inspecting every field's default factory (87 µs a run here, timed around
        ``dumpd``), and ours are made per run (the offline one holds the run's answer, which the ``repr`` would
        copy into every callback). No callback of ours reads it; langchain reads it only to key its cache, which
        it does for serializable models alone."""
        cls = type(self)
        return {"lc": 1, "type": "not_implemented", "id": [*cls.__module__.split("."), cls.__name__], "repr": None}


class _NoToolBinding(_PlatformChatModel):
    """Accepts ``bind_tools`` (the ReAct loop binds its tools) and keeps its own behaviour."""

    def bind_tools(
        self, tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool], **kwargs: Any
    ) -> Runnable[Any, BaseMessage]:
        return self


class OfflineChatModel(_NoToolBinding):
    """Answers with a text composed beforehand from the deterministic results; never calls a tool."""

    answer: str

    @property
    def _llm_type(self) -> str:
        return "offline"

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=self.answer))])


class ScriptedChatModel(_PlatformChatModel):
    """Replays the turns of a script, one per model call, in order.

    Stateless: its place in the script is worked out from the conversation it is given (how many model turns
    it holds, and what each turn's preceding tool result said), so a run resumed on another worker, or after
    an approval, continues where it stopped.
    """

    script: list[dict[str, Any]]
    # A fixed delay per call, to stand in for a real model's latency in benchmarks.
    latency_s: float = 0.0
    # What ``bind_tools`` was given (the names offered and the tool_choice), reported in each reply's
    # ``response_metadata`` so a test sees what the model was offered and whether it was forced.
    bound_tools: list[str] = []
    tool_choice: str | None = None

    def bind_tools(
        self, tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool], **kwargs: Any
    ) -> Runnable[Any, BaseMessage]:
        names = [t["function"]["name"] for t in tools if isinstance(t, dict) and "function" in t]
        choice = kwargs.get("tool_choice")
        return self.model_copy(update={"bound_tools": names, "tool_choice": choice})

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def _turn_for(self, tool_results_before_each_turn: list[str]) -> dict[str, Any] | None:
        """Walk the script: each model turn takes the next turn whose condition holds for the tool result
        that preceded it. Returns the turn for the last entry, or None when the script is used up."""
        cursor = 0
        chosen: dict[str, Any] | None = None
        for last_text in tool_results_before_each_turn:
            chosen = None
            while cursor < len(self.script):
                turn = self.script[cursor]
                cursor += 1
                condition = turn.get("if_last_tool_result_contains")
                if condition is None or str(condition) in last_text:
                    chosen = turn
                    break
        return chosen

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        if self.latency_s:
            time.sleep(self.latency_s)
        before_each_turn: list[str] = []
        last_text = ""
        for message in messages:
            if isinstance(message, AIMessage) and not is_history_answer(message):  # an earlier turn's: not the run's
                before_each_turn.append(last_text)
            elif isinstance(message, ToolMessage):
                last_text = str(message.content)
        before_each_turn.append(last_text)
        chosen = self._turn_for(before_each_turn) or {"content": last_text}
        tool_calls = [
            {
                "name": c["name"],
                "args": c.get("args", {}),
                "id": c.get("id") or f"call_{uuid.uuid4().hex[:12]}",
                "type": "tool_call",
            }
            for c in chosen.get("tool_calls", [])
        ]
        content = str(chosen.get("content", "")).replace("{last_tool_result}", last_text)
        prompt_chars = sum(len(str(m.content)) for m in messages)
        output_tokens = int(chosen.get("usage", {}).get("output_tokens", len(content) // 4))
        if kwargs.get("max_tokens") is not None:
            output_tokens = min(output_tokens, int(kwargs["max_tokens"]))
        usage = {"input_tokens": prompt_chars // 4, "output_tokens": output_tokens}
        usage["total_tokens"] = usage["input_tokens"] + usage["output_tokens"]
        metadata = {"bound_tools": list(self.bound_tools), "tool_choice": self.tool_choice}
        message = AIMessage(
            content=content,
            tool_calls=tool_calls,  # type: ignore[arg-type]
            usage_metadata=usage,  # type: ignore[arg-type]
            response_metadata=metadata,
        )
        return ChatResult(generations=[ChatGeneration(message=message)])


def build_chat_model(
    *,
    provider: str,
    model_id: str,
    params: dict[str, Any],
    offline_answer: str,
    api_key: str | None = None,
    retry_sent_requests: bool = True,
    check_cancelled: Callable[[], None] | None = None,
    on_unanswered_call: Callable[[str], None] | None = None,
) -> BaseChatModel:
    """The chat model for an agent. The network providers (``bedrock``, ``openai_compatible``) are built in
    ``agents.providers``; ``api_key`` is the agent's decrypted model secret (never from ``params``), and AWS
    credentials for Bedrock come from the standard chain, never from the database. ``retry_sent_requests=False``
    (a budgeted run): a network model retries a connection failure only where its request never reached the
    provider (``agents.providers.request_never_sent``). ``check_cancelled``: the run's check, made before each retry
    of a failed call (the offline and scripted models make none). ``on_unanswered_call``: told (with the failure's
    kind) of each call of a network model that timed out or was cut after its request was, or may have been, sent
    (``agents.providers.unanswered_after_sending``)."""
    if provider == "offline":
        return OfflineChatModel(answer=offline_answer)
    if provider == "scripted":
        from django.conf import settings

        if not getattr(settings, "PLATFORM_ALLOW_SCRIPTED_MODEL", False):
            raise ValueError("the scripted model provider is not allowed here (PLATFORM_ALLOW_SCRIPTED_MODEL)")
        return ScriptedChatModel(script=list(params.get("script") or []), latency_s=float(params.get("latency_s") or 0))
    if provider in {"bedrock", "openai_compatible"}:
        from agents.providers import build_provider_model

        model: BaseChatModel = build_provider_model(
            provider=provider,
            model_id=model_id,
            params=params,
            api_key=api_key,
            retry_sent_requests=retry_sent_requests,
            check_cancelled=check_cancelled,
            on_unanswered_call=on_unanswered_call,
        )
        return model
    raise ValueError(f"unknown model provider {provider!r}")
