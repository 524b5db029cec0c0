"""A provider's partial usage report and a final answer charged its whole cap (the flows and budgets review).

A turn whose provider reported its output but no input (Ollama's ``prompt_tokens: 0`` for a cached prompt) was
charged its output alone: every later call was given nearly the whole reservation and the budget recorded a
fraction of the spend. And a complete answer from a server that reports no usage, charged its call's cap (one
token per UTF-8 byte: Korean passes it soon), spent the reservation exactly and was thrown away as
``budget:run_ceiling`` although the call was allowed and finished."""

from __future__ import annotations

import pytest

from agents.budgets import budget_create, budget_reserve
from agents.execution import run_execute
from agents.models import Agent, BudgetUsage, Run
from tests.agents.test_budget_review_fixes import TWO_SEARCHES, NoUsageServer
from tests.agents.test_openai_compatible import openai_agent
from tests.openai_server import ScriptedOpenAIServer

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

RESERVATION = 6_000


def budgeted_run(running: ScriptedOpenAIServer, demo_server: object, query: str) -> Run:
    agent = openai_agent(running, demo_server, max_tokens=None)
    budget_create(
        actor="test-admin",
        via="tests",
        data={"agent": agent, "period": "day", "max_tokens": RESERVATION, "run_reservation_tokens": RESERVATION},
    )
    run = Run.objects.create(agent=Agent.objects.get(pk=agent.pk), query=query)
    budget_reserve(run=run, agent=run.agent, api_key=None)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    return run


@pytest.mark.parametrize(
    "usage",
    [{"prompt_tokens": 0, "completion_tokens": 0}, {"prompt_tokens": 0, "completion_tokens": 10}],
    ids=["none", "output-only"],
)
def test_a_turn_reporting_no_input_is_charged_its_input_bound(demo_server, usage) -> None:  # type: ignore[no-untyped-def]
    with ScriptedOpenAIServer(TWO_SEARCHES, usage=usage).running() as running:
        run = budgeted_run(running, demo_server, "박도윤 님 팀?")
        calls = len(running.requests)
    # The first call read the system prompt and the tool specs: charged their bound, the run cannot afford the
    # second call within its reservation (it was given all three, and charged 30 tokens for them, before).
    assert (run.status, run.error_code, calls) == (Run.Status.FAILED, "budget:run_ceiling", 1)
    assert BudgetUsage.objects.get().used_tokens > 3_000
    first = next(entry for entry in run.messages if entry.get("type") == "ai")
    assert first["usage_estimated"] is True


def test_a_final_answer_charged_its_whole_cap_is_kept(demo_server) -> None:  # type: ignore[no-untyped-def]
    answer = "김하늘 님은 클라우드운영팀 팀장입니다. " * 60  # ~3,600 UTF-8 bytes: more than the call's cap
    with NoUsageServer([{"content": answer}]).running() as running:
        run = budgeted_run(running, demo_server, "김하늘 님 소개")
        cap = running.requests[0]["body"]["max_completion_tokens"]
    assert cap < len(answer.encode())
    assert (run.status, run.error_code, run.answer) == (Run.Status.SUCCEEDED, "", answer)
    assert BudgetUsage.objects.get().used_tokens == RESERVATION  # charged its bound: the reservation, not more
