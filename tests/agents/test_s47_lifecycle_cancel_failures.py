"""A failed call that lands after the cancel recorded the run's end (s47, h7, suspicion 2; fixed in h14).

The caller cancels a run whose worker's lease has lapsed (its process was paused while its call was out): no live
worker holds it, so the cancel records the run's end at once, counting the failed calls it finds (none yet). The
worker wakes, its call fails; its event is appended (``RunClaim.may_append``: the run was cancelled while this
worker held it), and the worker, stopping, finds the end recorded (``emit_cancelled``). The run's ``tool_failures``
read 0 while its audit showed the failed call: the writer now counts a failed call it appends after the end
(``RunEventWriter._write_counting_late``), once, however often the end is recorded again.

With the real demo server over stdio; the pause and the cancel are patched in where they land, as in
``tests/agents/test_cancel_stops_calls_s43.py``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from agent_platform.errors import ApplicationError
from agents.execution import run_execute
from agents.models import Run, RunEvent
from agents.run_state import RunEventWriter
from agents.services import run_cancel
from audit.models import AuditEvent
from mcpregistry.pool import get_default_pool
from tests.conftest import bind_demo_server, make_agent

pytestmark = pytest.mark.django_db

QUESTION = "A-1001 자산의 현재 상태를 알려주세요."
MCP_ID = "s47-late-failure"


@pytest.fixture
def _close() -> Iterator[None]:
    yield
    get_default_pool().close(MCP_ID)


def paused_past_its_lease_and_cancelled_while_the_call_is_out(monkeypatch: pytest.MonkeyPatch, run: Run) -> None:
    pool = get_default_pool()
    real_call_tool = pool.call_tool

    def call_tool(config: dict[str, Any], tool: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return real_call_tool(config, tool, *args, **kwargs)
        finally:
            if tool == "get_asset_status":
                Run.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
                with contextlib.suppress(ApplicationError):
                    run_cancel(run=Run.objects.get(pk=run.pk), actor="caller", source="api")

    monkeypatch.setattr(pool, "call_tool", call_tool)


def late_failure_after_a_recorded_end(monkeypatch: pytest.MonkeyPatch, settings: Any) -> Run:
    settings.PLATFORM_RUN_LEASE_S = 600  # no heartbeat renews the lease the test lapses
    server = bind_demo_server(mcp_id=MCP_ID, failure_mode="timeout")  # each attempt times out
    run = Run.objects.create(agent=make_agent(slug="s47-late", servers=[server]), query=QUESTION)
    paused_past_its_lease_and_cancelled_while_the_call_is_out(monkeypatch, run)
    run_execute(run_id=str(run.id))
    return run


@pytest.mark.slow
@pytest.mark.usefixtures("_close")
def test_a_failed_call_that_lands_after_the_cancel_recorded_the_end_is_counted(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    run = late_failure_after_a_recorded_end(monkeypatch, settings)

    run.refresh_from_db()
    assert run.status == Run.Status.CANCELLED
    calls = AuditEvent.objects.filter(run_id=run.id, action="tool.call", latency_ms__isnull=False)
    assert [call.ok for call in calls] == [False]
    kinds = list(RunEvent.objects.filter(run=run).order_by("seq").values_list("kind", "data__status"))
    call = next(i for i, (kind, _) in enumerate(kinds) if kind in {"deterministic_result", "tool_call"})
    assert kinds.index(("status", "cancelled")) < call  # recorded by the cancel, before the call's event
    assert run.tool_failures == 1


@pytest.mark.slow
@pytest.mark.usefixtures("_close")
def test_the_late_failure_is_counted_once_however_often_the_end_is_recorded_again(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    run = late_failure_after_a_recorded_end(monkeypatch, settings)
    ends = RunEvent.objects.filter(run=run, kind="status", data__status="cancelled").count()

    for _ in range(2):  # the worker's fault path, and the reconciler, end it again
        RunEventWriter(run_id=run.pk, secrets=[]).emit_cancelled()

    run.refresh_from_db()
    assert run.tool_failures == 1
    assert RunEvent.objects.filter(run=run, kind="status", data__status="cancelled").count() == ends == 1
