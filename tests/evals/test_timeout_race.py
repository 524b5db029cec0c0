"""Two refreshers time out one case at once (every worker refreshes open eval runs): the one that comes second,
with a copy of the run read before the first cancelled it, still scores the case as timed out."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import override_settings
from django.utils import timezone

import evals.services
from agents.models import Agent, Run
from agents.services import run_cancel
from evals.models import EvalCaseResult, EvalRun
from evals.services import TIMED_OUT_ACTOR, eval_case_create, eval_run_refresh, eval_set_create

pytestmark = pytest.mark.django_db


@override_settings(PLATFORM_EVAL_CASE_TIMEOUT_S=60)
def test_the_second_refresher_to_time_a_case_out_still_scores_it_as_timed_out(monkeypatch: Any) -> None:
    agent = Agent.objects.create(slug="a", name="a")
    eval_set = eval_set_create(actor="test", via="tests", data={"name": "s", "agent": agent})
    case = eval_case_create(
        actor="test", via="tests", data={"eval_set": eval_set, "key": "k", "query": "q", "expected_tools": ["x"]}
    )
    run = Run.objects.create(agent=agent, query="q", purpose=Run.Purpose.EVAL)
    eval_run = EvalRun.objects.create(eval_set=eval_set, agent=agent, total=1)
    result = EvalCaseResult.objects.create(eval_run=eval_run, case=case, run=run)

    def first_refresher_cancels_in_between(*, run: Run, actor: str, source: Any) -> Any:
        # Refresher A cancels the run (and has not scored the case yet) after this one read it as still queued.
        run_cancel(run=Run.objects.get(pk=run.pk), actor=TIMED_OUT_ACTOR, source=source)
        monkeypatch.setattr(evals.services, "run_cancel", run_cancel)
        return run_cancel(run=run, actor=actor, source=source)  # this one's stale copy: refused, the run has ended

    monkeypatch.setattr(evals.services, "run_cancel", first_refresher_cancels_in_between)
    eval_run_refresh(eval_run=eval_run, now=timezone.now() + timedelta(seconds=61))

    result.refresh_from_db()
    assert result.scored and not result.passed
    assert result.scores["timed_out"] is True and "eval:timeout" in result.scores["failed_checks"]
