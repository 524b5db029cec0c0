"""Earlier turns of a conversation left out to fit a run's token reservation are said in its trace and on its
page: the model was not given them, and a reader of the run could not tell why it did not know what was said."""

from __future__ import annotations

import pytest

from agents.admin_runs import run_timeline
from agents.budgets import budget_create, budget_reserve
from agents.execution import conversation_history, run_execute
from agents.models import Run
from tests.agents.test_openai_compatible import openai_agent
from tests.agents.test_s38_models import ANSWER, earlier, sent_texts
from tests.openai_server import ScriptedOpenAIServer

pytestmark = pytest.mark.django_db


def test_turns_left_out_to_fit_the_reservation_are_in_the_trace_and_on_the_run_page(demo_server, admin_client) -> None:
    with ScriptedOpenAIServer([{"content": "답"}]).running() as server:
        agent = openai_agent(server, demo_server, slug="history-left-out")
        budget_create(actor="t", via="tests", data={"agent": agent, "period": "day", "max_tokens": 10_000_000})
        earlier(agent, "c-left", [f"{i}번 답: {ANSWER}" for i in range(10)])
        run = Run.objects.create(agent=agent, query="다음", context={"contextId": "c-left"})
        budget_reserve(run=run, agent=agent, api_key=None)
        run_execute(run_id=str(run.id))
        run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    given = sum(1 for role, _text in sent_texts(server)[:-1] if role == "assistant")
    (note,) = [e for e in run.messages if e.get("type") == "history_left_out"]
    offered = len(conversation_history(run))  # those within the conversation's own bounds
    assert 0 < given < offered and note["kept"] == given and note["turns"] + given == offered
    assert isinstance(note["token_ceiling"], int) and note["token_ceiling"] > 0

    (step,) = [s for s in run_timeline(run) if s.label == "earlier turns left out"]
    assert step.status == "skipped" and f"{offered - given} earlier turn(s) not given to the model" == step.status_text
    assert f"the newest {given} turn(s) were given" in step.note
    page = admin_client.get(f"/admin/agents/run/{run.pk}/change/").content.decode()
    assert "earlier turns left out" in page and "not given to the model" in page


def test_a_conversation_given_whole_says_nothing_was_left_out(demo_server) -> None:
    with ScriptedOpenAIServer([{"content": "답"}]).running() as server:
        agent = openai_agent(server, demo_server, slug="history-whole")
        budget_create(actor="t", via="tests", data={"agent": agent, "period": "day", "max_tokens": 10_000_000})
        earlier(agent, "c-whole", ["짧은 답"])
        run = Run.objects.create(agent=agent, query="다음", context={"contextId": "c-whole"})
        budget_reserve(run=run, agent=agent, api_key=None)
        run_execute(run_id=str(run.id))
        run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert sent_texts(server)[:-1] == [("user", "질문 0"), ("assistant", "짧은 답")]
    assert not [e for e in run.messages if e.get("type") == "history_left_out"]
    assert not [s for s in run_timeline(run) if s.label == "earlier turns left out"]
