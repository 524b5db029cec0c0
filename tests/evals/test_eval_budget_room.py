"""An eval's case refused because the runs in flight hold what is left of the agent's budget stays pending and is
submitted at a later refresh, once they have ended (it was scored failed, ``eval:not_submitted:budget_exceeded``);
a case refused because the budget is spent still fails."""

from __future__ import annotations

import pytest

from agents.budgets import budget_create
from agents.execution import run_execute
from agents.models import Agent, BudgetUsage, Run
from evals.models import EvalCaseResult, EvalRun
from evals.services import eval_run_refresh, eval_run_start, eval_set_apply
from tests.agents.test_budgets import scripted_agent

pytestmark = pytest.mark.django_db


def four_case_eval(agent: Agent) -> EvalRun:
    cases = [{"key": f"c{i}", "query": f"질문 {i}", "type": "no_tool", "forbidden_tools": ["*"]} for i in range(4)]
    document = {"name": "budgeted-set", "agent": agent.slug, "cases": cases}
    eval_set = eval_set_apply(document=document, actor="test", via="tests").eval_set
    return eval_run_start(eval_set=eval_set, agent=agent, actor="test", window=4)


def run_queued() -> None:
    for run_id in Run.objects.filter(status=Run.Status.QUEUED).values_list("id", flat=True):
        run_execute(run_id=str(run_id))


def test_cases_the_runs_in_flight_leave_no_room_for_wait_and_are_submitted_when_they_end() -> None:
    agent = scripted_agent()
    budget_create(
        actor="test-admin",
        via="tests",
        data={"agent": agent, "period": "day", "max_tokens": 1000, "run_reservation_tokens": 500},
    )
    eval_run = four_case_eval(agent)
    results = EvalCaseResult.objects.filter(eval_run=eval_run).order_by("pk")
    # Two runs hold the budget; the other two cases wait, neither scored nor submitted.
    assert [(r.run_id is not None, r.scored) for r in results] == [(True, False)] * 2 + [(False, False)] * 2
    for _round in range(4):  # each refresh submits what the runs that ended gave back room for
        run_queued()
        eval_run = eval_run_refresh(eval_run=eval_run)
    assert eval_run.status == EvalRun.Status.FINISHED
    assert eval_run.summary["passed"] == 4


def test_a_case_refused_by_a_spent_budget_is_scored_as_not_submitted() -> None:
    agent = scripted_agent()
    budget = budget_create(
        actor="test-admin",
        via="tests",
        data={"agent": agent, "period": "day", "max_tokens": 1000, "run_reservation_tokens": 500},
    )
    eval_run = four_case_eval(agent)
    run_queued()
    BudgetUsage.objects.filter(budget=budget).update(used_tokens=600)  # the two runs settled; more was spent
    eval_run = eval_run_refresh(eval_run=eval_run)
    refused = EvalCaseResult.objects.filter(eval_run=eval_run, run__isnull=True)
    assert refused.count() == 2
    assert all(r.scored and "eval:not_submitted:budget_exceeded" in r.scores["failed_checks"] for r in refused)
    assert eval_run.status == EvalRun.Status.FINISHED
