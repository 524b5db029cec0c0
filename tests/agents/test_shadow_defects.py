"""Shadow runs replay their live run's conversation (not earlier shadows of any caller), and a run that ends by its
time limit or a lost worker is shadowed (a live run) or compared (a shadow) as one that stored its outcome."""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from unittest import mock

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from django.utils import timezone

from agents import engine
from agents.execution import conversation_history, run_execute
from agents.models import Agent, ApiKey, Run, ShadowComparison
from agents.reconciler import runs_reconcile
from agents.services import agent_shadow_set, api_key_create, run_create
from agents.tasks import run_agent
from tests.agents.test_shadow import twin_candidate

pytestmark = pytest.mark.django_db

QUESTION = "A-1001 자산의 현재 상태를 알려주세요."


@pytest.fixture(autouse=True)
def _not_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run's task (the reconciler may publish one) is not sent to a broker."""
    monkeypatch.setattr(run_agent, "apply_async", lambda *args, **options: None)


def shadow_everything(agent: Agent, rate: float = 1.0) -> None:
    """The agent published (v1 live) and its live runs shadowed at ``rate`` on a candidate that behaves as v1
    (``twin_candidate``: a run is never shadowed on its own version)."""
    candidate = twin_candidate(agent)
    agent_shadow_set(agent=agent, actor="test-admin", via="tests", version=candidate, rate=rate)


def live_run(agent: Agent, key: ApiKey | None = None, context: dict[str, Any] | None = None) -> Run:
    run = run_create(agent_slug=agent.slug, query=QUESTION, api_key=key, context=context or {})
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    return run


def held_by_a_dead_worker(run: Run, *, delivery: int, started: timedelta) -> None:
    """The run as a worker that claimed it ``started`` ago left it: running, its lease lapsed."""
    now = timezone.now()
    Run.objects.filter(pk=run.pk).update(
        status=Run.Status.RUNNING,
        worker="dead-host:42",
        delivery_count=delivery,
        heartbeat_at=now - started,
        started_at=now - started,
        pass_started_at=now - started,
        lease_expires_at=now - timedelta(seconds=1),
    )


# --- the conversation a shadow replays -------------------------------------------------------------------------


def test_a_shadow_replays_its_live_runs_conversation_not_another_callers(demo_agent: Agent) -> None:
    key_a, _raw = api_key_create(actor="test-admin", via="tests", name="a")
    key_b, _raw = api_key_create(actor="test-admin", via="tests", name="b")
    shadow_everything(demo_agent)
    # Caller A's first turn is shadowed and its shadow finishes; then caller B starts a conversation that happens to
    # use the same contextId.
    a1 = live_run(demo_agent, key_a, {"contextId": "c1"})
    run_execute(run_id=str(Run.objects.get(shadow_of=a1).id))
    b1 = live_run(demo_agent, key_b, {"contextId": "c1"})
    assert conversation_history(b1) == []  # B has no earlier turn
    # Its shadow sees the same (empty) history: not A's turn, nor A's shadow's.
    assert conversation_history(Run.objects.get(shadow_of=b1)) == []


def test_a_shadow_of_a_second_turn_sees_the_first_turn_even_when_that_one_was_not_sampled(demo_agent: Agent) -> None:
    key, _raw = api_key_create(actor="test-admin", via="tests", name="a")
    shadow_everything(demo_agent, rate=0.0)
    first = live_run(demo_agent, key, {"contextId": "c2"})  # not shadowed
    assert first.status == Run.Status.SUCCEEDED and not Run.objects.filter(shadow_of=first).exists()
    demo_agent.refresh_from_db()
    agent_shadow_set(agent=demo_agent, actor="test-admin", via="tests", version=demo_agent.shadow_version, rate=1.0)
    second = live_run(demo_agent, key, {"contextId": "c2"})
    expected = [{"query": first.query, "answer": first.answer}]
    assert conversation_history(second) == expected
    assert conversation_history(Run.objects.get(shadow_of=second)) == expected


def test_eval_and_ab_runs_keep_their_own_conversations(demo_agent: Agent) -> None:
    key, _raw = api_key_create(actor="test-admin", via="tests", name="a")
    context = {"contextId": "c3"}

    def turn(purpose: str, answer: str, arm: str = "") -> Run:
        return Run.objects.create(
            agent=demo_agent,
            api_key=key if purpose == Run.Purpose.LIVE else None,
            query=QUESTION,
            answer=answer,
            context=context,
            purpose=purpose,
            arm=arm,
            status=Run.Status.SUCCEEDED,
        )

    turn(Run.Purpose.LIVE, "live 1", arm="a")
    turn(Run.Purpose.EVAL, "eval 1")
    live_now, eval_now = turn(Run.Purpose.LIVE, "live 2", arm="b"), turn(Run.Purpose.EVAL, "eval 2")
    # An A/B run sees the caller's earlier live turns, whichever arm ran them; an eval run none of them, nor other
    # eval runs' turns: only the earlier cases of its own eval run (tests/evals/test_eval_isolation.py).
    assert [t["answer"] for t in conversation_history(live_now)] == ["live 1"]
    assert conversation_history(eval_now) == []


# --- runs ended by their time limit or a lost worker ---------------------------------------------------------


def test_a_shadow_stopped_by_celerys_soft_time_limit_is_still_compared(demo_agent: Agent) -> None:
    shadow_everything(demo_agent)
    live = live_run(demo_agent)
    shadow = Run.objects.get(shadow_of=live)
    with mock.patch.object(engine, "execute", side_effect=SoftTimeLimitExceeded()):
        run_execute(run_id=str(shadow.id))
    shadow.refresh_from_db()
    assert (shadow.status, shadow.error_code) == (Run.Status.FAILED, "time_limit")
    # The candidate timed out where the live version answered: the disagreement that matters most.
    comparison = ShadowComparison.objects.get(live_run=live)
    assert (comparison.shadow_run_id, comparison.same_status, comparison.agrees) == (shadow.id, False, False)


def test_a_shadow_failed_by_the_reconciler_is_compared(demo_agent: Agent, settings) -> None:  # type: ignore[no-untyped-def]
    settings.PLATFORM_RUN_MAX_DELIVERIES = 3
    shadow_everything(demo_agent)
    timed_out_live, lost_live = live_run(demo_agent), live_run(demo_agent)
    timed_out, lost = Run.objects.get(shadow_of=timed_out_live), Run.objects.get(shadow_of=lost_live)
    held_by_a_dead_worker(timed_out, delivery=1, started=timedelta(days=1))  # past its time limit
    held_by_a_dead_worker(lost, delivery=3, started=timedelta(seconds=1))  # its last delivery's worker is gone
    report = runs_reconcile()
    assert (report.timed_out, report.worker_lost) == (1, 1)
    compared = {c.shadow_run_id: c.same_status for c in ShadowComparison.objects.all()}
    assert compared == {timed_out.id: False, lost.id: False}


def test_a_live_run_ended_by_its_time_limit_or_a_lost_worker_is_shadowed(demo_agent: Agent, settings) -> None:  # type: ignore[no-untyped-def]
    settings.PLATFORM_RUN_MAX_DELIVERIES = 3
    shadow_everything(demo_agent)
    # Celery's soft time limit in the worker.
    cut_off = run_create(agent_slug=demo_agent.slug, query=QUESTION, api_key=None)
    with mock.patch.object(engine, "execute", side_effect=SoftTimeLimitExceeded()):
        run_execute(run_id=str(cut_off.id))
    # The reconciler: past the time limit; the last delivery's worker lost.
    overdue = run_create(agent_slug=demo_agent.slug, query=QUESTION, api_key=None)
    lost = run_create(agent_slug=demo_agent.slug, query=QUESTION, api_key=None)
    held_by_a_dead_worker(overdue, delivery=1, started=timedelta(days=1))
    held_by_a_dead_worker(lost, delivery=3, started=timedelta(seconds=1))
    runs_reconcile()
    ended = {run.id: run.error_code for run in Run.objects.filter(pk__in=[cut_off.pk, overdue.pk, lost.pk])}
    assert ended == {cut_off.id: "time_limit", overdue.id: "time_limit", lost.id: "worker_lost"}
    shadows = Run.objects.filter(purpose=Run.Purpose.SHADOW, shadow_of__in=[cut_off.pk, overdue.pk, lost.pk])
    assert sorted(str(s.shadow_of_id) for s in shadows) == sorted(str(r) for r in ended)
    assert {s.status for s in shadows} == {Run.Status.QUEUED}
