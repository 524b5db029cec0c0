"""What a case is scored on: every call its run made, in the order the run made them.

Defect 1: on PostgreSQL's deferred audit chain a finished run's events may still wait as pending rows; the scoring
read the chained events only, so such a case was scored with no calls, for good (``tools:mismatch``). Shown here
on SQLite with the chain deferred and no chainer run yet.

Defect 6: calls were ordered by when their audit events were written, so in a parallel batch a slow first call
came after a quick second one and an ordered case failed ``tools:order``.
"""

from __future__ import annotations

from typing import Any

import pytest

from agents.execution import run_execute
from agents.models import Run
from audit import services as audit_services
from audit.models import AuditEvent, AuditPendingEvent
from evals.models import EvalCaseResult
from evals.services import eval_run_refresh, eval_run_start, eval_set_apply, run_tool_calls_for_scoring
from tests.evals.conftest import bind_stock_server, scripted_agent

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_case_whose_runs_audit_events_still_wait_to_be_chained_is_scored_on_them(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.AUDIT_CHAIN_MODE = "deferred"
    # No chainer has run since the run's events were committed (a worker's chainer thread holds off while its
    # run executes, up to AUDIT_CHAIN_HOLD_OFF_S): they wait as pending rows when the case is scored.
    monkeypatch.setattr(audit_services, "_chain_after_commit", lambda using: None)
    server = bind_stock_server(settings)
    agent = scripted_agent(
        slug="stock-agent",
        server=server,
        script=[{"tool_calls": [{"name": "lookup_stock", "args": {"sku": "X-1"}}]}, {"content": "7개"}],
    )
    document = {"name": "stock", "cases": [{"key": "one", "query": "X-1 재고?", "expected_tools": ["lookup_stock"]}]}
    eval_set = eval_set_apply(document=document, actor="test", via="tests").eval_set
    eval_run = eval_run_start(eval_set=eval_set, agent=agent, actor="test")
    result = EvalCaseResult.objects.get(eval_run=eval_run)
    assert result.run is not None
    run_execute(run_id=str(result.run_id))
    assert AuditPendingEvent.objects.filter(run_id=result.run_id, action="tool.call").exists()
    assert not AuditEvent.objects.filter(run_id=result.run_id, action="tool.call").exists()

    eval_run_refresh(eval_run=eval_run)

    result.refresh_from_db()
    assert result.scored
    assert [c["name"] for c in result.called_tools] == ["lookup_stock"]
    assert result.passed, result.scores["failed_checks"]


def test_an_ordered_case_is_scored_on_the_order_the_model_asked_not_the_order_the_calls_finished(
    settings: Any,
) -> None:
    settings.PLATFORM_PARALLEL_TOOL_CALLS = 4
    settings.PLATFORM_PARALLEL_TOOL_CALLS_PER_SERVER = 2
    server = bind_stock_server(settings)
    batch = [
        {"id": "call-b", "name": "sleepy", "args": {"seconds": 0.4}},  # asked first, finishes last
        {"id": "call-a", "name": "lookup_stock", "args": {"sku": "X-1"}},
    ]
    agent = scripted_agent(slug="stock-agent", server=server, script=[{"tool_calls": batch}, {"content": "done"}])
    document = {
        "name": "stock",
        "cases": [
            {
                "key": "ordered",
                "query": "wait, then look up X-1",
                "expected_tools": ["sleepy", "lookup_stock"],
                "ordered": True,
            }
        ],
    }
    eval_set = eval_set_apply(document=document, actor="test", via="tests").eval_set
    eval_run = eval_run_start(eval_set=eval_set, agent=agent, actor="test")
    result = EvalCaseResult.objects.get(eval_run=eval_run)
    run_execute(run_id=str(result.run_id))
    run = Run.objects.get(pk=result.run_id)
    assert [m["type"] for m in run.messages if m.get("type") == "parallel_calls"] == ["parallel_calls"]
    finished = AuditEvent.objects.filter(run_id=run.pk, action="tool.call").order_by("id")
    assert list(finished.values_list("tool", flat=True)) == ["lookup_stock", "sleepy"]  # completion order

    assert [c.name for c in run_tool_calls_for_scoring(run.pk)] == ["sleepy", "lookup_stock"]
    eval_run_refresh(eval_run=eval_run)
    result.refresh_from_db()
    assert [c["name"] for c in result.called_tools] == ["sleepy", "lookup_stock"]
    assert result.passed, result.scores["failed_checks"]
