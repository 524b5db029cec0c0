"""Our chat models (offline, scripted) are made per run; what langchain hands the callbacks as the model is its
class, not ``dumpd``'s ``repr`` of it (which pydantic writes by inspecting every field's default factory, and
which for the offline model would carry the run's answer into every callback)."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.language_models import chat_models
from langchain_core.messages import BaseMessage, HumanMessage

from agents.llm import OfflineChatModel, ScriptedChatModel


class _Seen(BaseCallbackHandler):
    def __init__(self) -> None:
        self.serialized: list[dict[str, Any]] = []

    def on_chat_model_start(
        self, serialized: dict[str, Any], messages: list[list[BaseMessage]], *, run_id: UUID, **kwargs: Any
    ) -> None:
        self.serialized.append(serialized)


@pytest.mark.parametrize(
    ("model", "name"),
    [
        (
            OfflineChatModel(answer="김하늘 님은 클라우드운영팀 소속입니다. sk-live-abcdefgh12345678"),
            "OfflineChatModel",
        ),
        (ScriptedChatModel(script=[{"content": "답변"}]), "ScriptedChatModel"),
    ],
)
def test_a_model_of_ours_is_handed_to_callbacks_as_its_class_without_dumpd(
    monkeypatch: pytest.MonkeyPatch, model: Any, name: str
) -> None:
    def refused(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("dumpd called for a model of ours")

    monkeypatch.setattr(chat_models, "dumpd", refused)
    seen = _Seen()

    answer = model.invoke([HumanMessage(content="김하늘 님은 어느 팀 소속인가요?")], config={"callbacks": [seen]})

    assert answer.content
    assert seen.serialized == [{"lc": 1, "type": "not_implemented", "id": ["agents", "llm", name], "repr": None}]
    assert "sk-live" not in str(seen.serialized) and "김하늘" not in str(seen.serialized)
