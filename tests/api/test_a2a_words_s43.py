"""An A2A text answer decides with "거부", the word the Korean screens reject with ("거부…", "예, 거부합니다"), as it
does with "거절": it gave ``decision_missing`` (-32602). The words a text answer decides with, named in the error
of an answer that decides nothing, name it too."""

from __future__ import annotations

from typing import Any

import pytest

from agents.api.a2a_server import decision_of
from agents.models import Agent, Approval, Run
from tests.agents import test_s40_a2a_mcp
from tests.agents.test_s40_a2a_mcp import a2a, parked_with
from tests.conftest import ApiCaller

pytestmark = pytest.mark.django_db

quiet = test_s40_a2a_mcp.quiet  # the agent "quiet", without servers: its run's rows are written as a worker writes them


def answered_with(caller: ApiCaller, agent: Agent, text: str) -> tuple[Any, Approval]:
    run = Run.objects.create(agent=agent, api_key=caller.key, query="q", status=Run.Status.AWAITING_APPROVAL)
    approval = parked_with(run, {"title": "회의록"})
    message = {"messageId": "m-1", "taskId": str(run.pk), "parts": [{"text": text}]}
    answer = a2a(caller, "SendMessage", {"message": message, "configuration": {"returnImmediately": True}})
    approval.refresh_from_db()
    return answer.json(), approval


@pytest.mark.parametrize("reply", ["거부", "거부합니다", " 거부합니다. ", "거부!", "거부합니다。"])
def test_a_text_answer_of_geobu_rejects(api_caller: ApiCaller, quiet: Agent, reply: str) -> None:
    answer, approval = answered_with(api_caller, quiet, reply)
    assert "error" not in answer, answer
    assert approval.status == Approval.Status.REJECTED


def test_geobu_is_read_as_reject_and_named_among_the_words(api_caller: ApiCaller, quiet: Agent) -> None:
    assert [decision_of([{"text": t}]) for t in ("거부", "거부합니다")] == [decision_of([{"text": "reject"}])] * 2
    assert decision_of([{"text": "거부 안 함"}]) is None  # the whole text, never a part of it
    answer, approval = answered_with(api_caller, quiet, "글쎄요")
    assert answer["error"]["data"][0]["metadata"]["code"] == "decision_missing"
    assert approval.status == Approval.Status.PENDING
    assert "거부" in answer["error"]["message"] and "거부합니다" in answer["error"]["message"]
