"""The deterministic stage stops where its run stops, as the ReAct loop does before each step: a run resumed after
its rule's write was approved, and then cancelled, taken over by another worker, or out of time before the stage
reaches that write, used to send it all the same (the approval ended ``executed`` on a cancelled run; a worker
that had lost the run carried out the write its new worker was to make). Now the stage checks before each call,
an admin rule's and a code rule's own (``ctx.mcp_tools``, also where the rule catches the stop), and the run ends
as a ReAct run stopped there does: cancelled, its outcome discarded (lost), or failed ``time_limit``.

The server is real (``tests/mcp_fixtures/probe_server.py``); its notes file says what it really wrote."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import pytest
from django.db.models import F

from agents import execution
from agents.approvals import approval_decide
from agents.deterministic import RuleSpec
from agents.deterministic_stage import StageInput, deterministic_stage
from agents.errors import RunCancelled
from agents.execution import run_execute
from agents.models import Approval, DeterministicRule, Run
from agents.run_state import RunEventWriter
from agents.services import run_cancel
from agents.tools import DeterministicContext, deterministic_tool
from mcpregistry import gate
from tests.agents.test_approvals import (  # noqa: F401  (fixtures)
    a_rule_that_saves_the_notes,
    eager_tasks,
    lines,
    notes,
    park,
    writer,
)

pytestmark = pytest.mark.django_db(transaction=False)


@deterministic_tool(mcp_id="notes")
def saves_the_notes_whatever_happens(ctx: DeterministicContext) -> dict[str, Any] | None:
    """A code rule that writes with its own tool and goes on whatever the call raised."""
    append_note = next(t for t in ctx.mcp_tools if t.name == "append_note")
    with contextlib.suppress(Exception):
        append_note.invoke({"text": "규칙이 직접 저장"})
    with contextlib.suppress(Exception):
        append_note.invoke({"text": "또 저장"})
    return None


def a_code_rule_that_saves_the_notes(run: Run) -> None:
    DeterministicRule.objects.create(
        agent=run.agent, name="직접 저장", order=1, code=f"{__name__}.saves_the_notes_whatever_happens"
    )


def cancel(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    run_cancel(run=Run.objects.get(pk=run.pk), actor="admin:x")


def take_over(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    Run.objects.filter(pk=run.pk).update(worker="other-host:1", delivery_count=F("delivery_count") + 1)


def run_out_of_time(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(execution, "clock", lambda: 1e12)


def resume_and_stop(run: Run, monkeypatch: pytest.MonkeyPatch, stop: Callable[..., None]) -> Approval:
    """Park the run on its rule's write, approve it, and resume it: right as the pass starts (its ``running``
    event), before the stage reaches the write, ``stop`` happens."""
    approval = park(run)
    approval_decide(run=run, approval_id=str(approval.pk), decision="approve", actor="reviewer")
    emit = RunEventWriter.emit

    def emit_then_stop(self: RunEventWriter, kind: str, data: dict[str, Any]) -> Any:
        emitted = emit(self, kind, data)
        if kind == "status" and data.get("status") == "running":
            stop(run, monkeypatch)
        return emitted

    monkeypatch.setattr(RunEventWriter, "emit", emit_then_stop)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    approval.refresh_from_db()
    return approval


RULES = {"admin rule": a_rule_that_saves_the_notes, "code rule": a_code_rule_that_saves_the_notes}


@pytest.mark.slow
@pytest.mark.parametrize("make_rule", RULES.values(), ids=RULES.keys())
def test_an_approved_rule_write_is_not_sent_once_the_run_is_cancelled(
    writer: Any,  # noqa: F811 - the fixture
    notes: Any,  # noqa: F811 - the fixture
    monkeypatch: pytest.MonkeyPatch,
    make_rule: Callable[[Run], None],
) -> None:
    run, _client = writer
    make_rule(run)

    approval = resume_and_stop(run, monkeypatch, cancel)

    assert lines(notes) == []
    assert (run.status, run.error_code) == (Run.Status.CANCELLED, "cancelled")
    assert approval.status == Approval.Status.EXPIRED  # never carried out, and reads so
    assert run.events.filter(kind="status", data__status="cancelled").count() == 1


@pytest.mark.slow
@pytest.mark.parametrize("make_rule", RULES.values(), ids=RULES.keys())
def test_a_worker_that_lost_its_run_does_not_send_the_approved_rule_write(
    writer: Any,  # noqa: F811 - the fixture
    notes: Any,  # noqa: F811 - the fixture
    monkeypatch: pytest.MonkeyPatch,
    make_rule: Callable[[Run], None],
) -> None:
    run, _client = writer
    make_rule(run)

    approval = resume_and_stop(run, monkeypatch, take_over)

    assert lines(notes) == []
    # The run is the other worker's: this one's outcome is discarded, and the approval left for it to carry out.
    assert (run.status, run.worker) == (Run.Status.RUNNING, "other-host:1")
    assert approval.status == Approval.Status.APPROVED


@pytest.mark.slow
@pytest.mark.parametrize("make_rule", RULES.values(), ids=RULES.keys())
def test_an_approved_rule_write_is_not_sent_once_the_run_is_out_of_time(
    writer: Any,  # noqa: F811 - the fixture
    notes: Any,  # noqa: F811 - the fixture
    monkeypatch: pytest.MonkeyPatch,
    make_rule: Callable[[Run], None],
) -> None:
    run, _client = writer
    make_rule(run)

    approval = resume_and_stop(run, monkeypatch, run_out_of_time)

    assert lines(notes) == []
    assert (run.status, run.error_code) == (Run.Status.FAILED, "time_limit")
    assert approval.status == Approval.Status.EXPIRED


@pytest.mark.slow
def test_a_code_rule_that_catches_its_runs_stop_calls_nothing_more_and_the_stage_stops(
    writer: Any,  # noqa: F811 - the fixture
) -> None:
    """The stop is recorded where the rule's call raised it: even a check that says so once (the run's row read
    once) stops the rule's later calls and the rules after it."""
    run, _client = writer
    server = run.agent.servers.get()
    checks: list[int] = []

    def stops_once() -> None:
        checks.append(1)
        if len(checks) == 1:
            raise RunCancelled()

    asked: list[str] = []

    def who(call_id: str) -> gate.GateCall:
        asked.append(call_id)
        return gate.GateCall(source="deterministic", call_id=call_id)

    rules = [
        RuleSpec(rule_id=1, name="code", mcp_id="", tool_name="", code=f"{__name__}.saves_the_notes_whatever_happens"),
        RuleSpec(rule_id=2, name="after", mcp_id="notes", tool_name="echo", params={"text": "x"}),
    ]
    trace: list[dict[str, Any]] = []
    stage = StageInput(
        query="q", context={}, a2a_data=[], a2a_files=[], servers=[server], rules=rules, trace=trace, check=stops_once
    )

    with pytest.raises(RunCancelled):
        deterministic_stage(stage, mode="execute", who=who)

    assert asked == [""]  # the rule's tools were offered; no call of its own was numbered, nor the next rule's
    assert trace == []  # nor was the next rule decided
