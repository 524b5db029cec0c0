"""An eval run is scored and finished in the background (what each worker's timer does), whether or not anyone
loads its page; a case whose run never finishes is timed out, so that the eval run always ends."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from agents.execution import run_execute
from agents.models import Run
from audit.models import AuditEvent
from evals.models import EvalCaseResult, EvalRun
from evals.services import eval_run_start, eval_runs_refresh_open
from tests.evals.conftest import company_assistant, import_seed_set

pytestmark = pytest.mark.django_db(transaction=True)


def _start() -> EvalRun:
    agent = company_assistant()
    eval_set = import_seed_set()
    return eval_run_start(eval_set=eval_set, agent=agent, actor="admin", window=5)  # every case in flight


@pytest.mark.slow
def test_the_background_pass_scores_finished_cases_and_finishes_the_eval_run() -> None:
    eval_run = _start()
    runs = list(Run.objects.filter(eval_results__eval_run=eval_run).order_by("created_at"))
    assert len(runs) == 5 and all(r.status == Run.Status.QUEUED for r in runs)

    assert eval_runs_refresh_open() == 0  # nothing finished yet: nothing scored
    assert EvalCaseResult.objects.filter(eval_run=eval_run, scored=True).count() == 0

    run_execute(run_id=str(runs[0].id))
    assert eval_runs_refresh_open() == 0
    eval_run.refresh_from_db()
    assert (eval_run.status, eval_run.done) == (EvalRun.Status.RUNNING, 1)

    for run in runs[1:]:  # what the workers do with the others
        run_execute(run_id=str(run.id))
    assert eval_runs_refresh_open() == 1
    eval_run.refresh_from_db()
    assert (eval_run.status, eval_run.done) == (EvalRun.Status.FINISHED, 5)
    assert eval_run.summary["passed"] == 4 and eval_run.finished_at is not None
    assert eval_runs_refresh_open() == 0  # a finished eval run is left alone


@pytest.mark.slow
@override_settings(PLATFORM_EVAL_CASE_TIMEOUT_S=60)
def test_a_case_whose_run_never_finishes_is_cancelled_and_scored_as_timed_out() -> None:
    eval_run = _start()
    runs = list(Run.objects.filter(eval_results__eval_run=eval_run))
    stuck, *others = runs
    for run in others:
        run_execute(run_id=str(run.id))

    assert eval_runs_refresh_open() == 0  # within the timeout: the eval run waits for its last case
    eval_run.refresh_from_db()
    assert (eval_run.status, eval_run.done) == (EvalRun.Status.RUNNING, 4)

    assert eval_runs_refresh_open(now=timezone.now() + timedelta(seconds=61)) == 1
    eval_run.refresh_from_db()
    assert (eval_run.status, eval_run.done) == (EvalRun.Status.FINISHED, 5)
    stuck.refresh_from_db()
    assert stuck.status == Run.Status.CANCELLED and stuck.error_message == "cancelled by eval:timeout"
    # The eval cancelled it, not an admin: the audit's source says so (it said "admin").
    cancel = AuditEvent.objects.get(run_id=stuck.id, action="run.cancel")
    assert (cancel.source, cancel.actor) == ("eval", "eval:timeout")
    result = EvalCaseResult.objects.get(eval_run=eval_run, run=stuck)
    assert result.scored and not result.passed and result.scores["timed_out"] is True
    assert "eval:timeout" in result.scores["failed_checks"]  # shown on the eval run's page
    # The other cases were scored as they ran, none of them timed out.
    assert not EvalCaseResult.objects.filter(eval_run=eval_run, scores__timed_out=True).exclude(run=stuck).exists()
    run_execute(run_id=str(stuck.id))  # a late delivery of the cancelled run does nothing
    stuck.refresh_from_db()
    assert stuck.status == Run.Status.CANCELLED


@override_settings(PLATFORM_EVAL_CASE_TIMEOUT_S=60)
def test_cases_left_unsubmitted_by_a_stopped_run_eval_are_submitted_within_its_window() -> None:
    agent = company_assistant()
    eval_set = import_seed_set()
    eval_run = eval_run_start(eval_set=eval_set, agent=agent, actor="admin", window=2)  # run_eval --workers 2
    in_flight = list(Run.objects.filter(eval_results__eval_run=eval_run))
    assert len(in_flight) == 2

    assert eval_runs_refresh_open() == 0  # two in flight: the background pass submits nothing
    assert Run.objects.filter(eval_results__eval_run=eval_run).count() == 2
    run_execute(run_id=str(in_flight[0].id))
    # The command is gone: each pass scores what finished and tops the cases in flight up to its window.
    for expected in (2, 2, 2):
        eval_runs_refresh_open()
        queued = list(Run.objects.filter(eval_results__eval_run=eval_run, status=Run.Status.QUEUED))
        assert len(queued) == expected
        run_execute(run_id=str(queued[0].id))
    for run in Run.objects.filter(eval_results__eval_run=eval_run, status=Run.Status.QUEUED):
        run_execute(run_id=str(run.id))
    assert eval_runs_refresh_open() == 1
    eval_run.refresh_from_db()
    assert (eval_run.status, eval_run.done, eval_run.summary["passed"]) == (EvalRun.Status.FINISHED, 5, 4)
