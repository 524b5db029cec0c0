"""An eval run delivered again after its worker died is scored on the calls of the delivery that finished: the
lost delivery's reads (made again by the next one) used to count twice, so a case expecting one call failed
``tools:order`` only because a worker had died."""

from __future__ import annotations

import pytest

from agents.execution import run_execute
from agents.models import Run
from evals.scoring import CaseSpec, score_case
from evals.services import run_tool_calls_for_scoring
from tests.agents.test_rule_tool_writes import died_mid_run

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

QUESTION = "김하늘 님은 어느 팀 소속인가요?"


def test_a_redelivered_eval_run_is_scored_on_the_calls_of_the_delivery_that_finished(demo_agent) -> None:
    run = Run.objects.create(agent=demo_agent, query=QUESTION, purpose="eval")
    run_execute(run_id=str(run.id))
    first = run_tool_calls_for_scoring(run.pk)
    assert [c.name for c in first] == ["search_employee"]
    expected = CaseSpec(expected_tools=[{"name": "search_employee"}])

    died_mid_run(run)  # its worker died after the calls, before storing the outcome; the message comes again
    run_execute(run_id=str(run.id))

    run.refresh_from_db()
    calls = run_tool_calls_for_scoring(run.pk)
    assert [c.name for c in calls] == ["search_employee"]
    score = score_case(expected, calls=calls, answer=run.answer, run_succeeded=run.status == Run.Status.SUCCEEDED)
    assert score.passed, score.failed_checks
