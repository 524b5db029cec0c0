"""What a run costs the database: the demo question, end to end in the worker (claim, rules, one tool call
through the gate, audit, events, outcome), within a fixed number of queries. A change that adds a query per
rule, per event or per tool (an N+1) fails here."""

from __future__ import annotations

from typing import Any

import pytest

from agents.execution import run_execute
from agents.models import Agent, Run

QUESTION = "김하늘 님은 어느 팀 소속인가요?"
# The demo agent's rules are evaluated in turn (one matches: one tool call); its answer comes from the offline
# model. 23 measured, of which 17 statements and 6 savepoints (this test runs in a transaction; a worker commits
# instead): the claim (2: the run's row with its agent's time limit, the configuration's generation and the
# run's token ceiling, then the compare-and-swap; the run goes on with what the claim read: the agent, its
# version, its servers, tools, contracts and rules are this process's cached copy after the first run; no
# reservation: nothing to settle; no token used: no price read), the run's events (5 inserts, numbered from 0
# without a read on a first delivery), the audit (6: two turns on the chain head of three statements each,
# SQLite chaining inline — the rule decision before the call, then the call's own event with the decisions
# after it, written with the call's result event: the gate hands a read call's audit event to the stage), the
# cancellation checks (2: before the rule's call, as before each step of the loop: a run cancelled, out of time or
# taken over sends no rule call, an approved write included), the gate's read of the called tool's state (1: an
# admin's change since the run loaded its configuration applies to its next call) and the outcome (1). A query per
# rule, per event or per tool more (an N+1) fails here.
MAX_QUERIES_PER_RUN = 23


def _run(agent: Agent) -> Run:
    run = Run.objects.create(agent=agent, query=QUESTION)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    return run


@pytest.mark.django_db
def test_a_run_of_the_demo_question_stays_within_its_query_budget(
    demo_agent: Agent, django_assert_max_num_queries: Any
) -> None:
    assert _run(demo_agent).status == Run.Status.SUCCEEDED  # the MCP session is open from here on
    run = Run.objects.create(agent=demo_agent, query=QUESTION)
    with django_assert_max_num_queries(MAX_QUERIES_PER_RUN):
        run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert "김하늘" in run.answer
    assert [r["tool"] for r in run.deterministic_results] == ["search_employee"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("question", "answer"),
    [
        ("클라우드운영팀의 프로젝트는 무엇인가요?", "클라우드운영팀의 진행 중인 프로젝트: 클라우드 비용 최적화"),
        ("김하늘 님의 자산 알려줘", "김하늘 님의 자산은 "),
    ],
)
def test_the_demo_answers_read_as_sentences_not_json(demo_agent: Agent, question: str, answer: str) -> None:
    run = Run.objects.create(agent=demo_agent, query=question)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED
    assert answer in run.answer
    assert "{" not in run.answer and "[" not in run.answer, run.answer
