"""A run cancelled while a rule's call was out sent that call's retries and its fallback all the same (the demo
server's ``get_asset_status`` timing out: attempts 2 and 3 and ``get_asset_status_backup`` were sent after the
cancel, and the backup's result streamed after it): the gate stopped for the run's time limit only. Now the call
under way finishes and is audited, and the gate sends nothing more once the run is cancelled: neither a retry (after
the attempt out, or after a backoff) nor the fallback. With the real demo server over stdio; the cancel is patched
in where it lands (as the run's caller would make it, ``run_cancel``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from agent_platform.errors import ApplicationError
from agents.execution import run_execute
from agents.models import Run, RunEvent
from agents.services import run_cancel
from audit.models import AuditEvent
from mcpregistry import gate
from mcpregistry.models import McpServer, ToolContract
from mcpregistry.pool import get_default_pool
from tests.conftest import bind_demo_server, make_agent

QUESTION = "A-1001 자산의 현재 상태를 알려주세요."
SERVERS = ("cancel-timeout", "cancel-once", "cancel-backoff")


@pytest.fixture(autouse=True)
def _close() -> Iterator[None]:
    yield
    for mcp_id in SERVERS:
        get_default_pool().close(mcp_id)


def cancel(run: Run) -> None:
    with contextlib.suppress(ApplicationError):  # cancelled already
        run_cancel(run=Run.objects.get(pk=run.pk), actor="caller", source="api")


def cancel_while_the_first_attempt_is_out(monkeypatch: pytest.MonkeyPatch, run: Run) -> None:
    """The run's caller cancels it while the first attempt of ``get_asset_status`` is out: after the request went
    to the server, before the gate has its answer."""
    pool = get_default_pool()
    real_call_tool = pool.call_tool

    def call_tool(config: dict[str, Any], tool: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return real_call_tool(config, tool, *args, **kwargs)
        finally:
            if tool == "get_asset_status":
                cancel(run)

    monkeypatch.setattr(pool, "call_tool", call_tool)


def tool_events(run: Run) -> list[tuple[str, str, int, str, bool]]:
    """The run's tool events: (action, tool, attempt, reason, sent), ``sent`` where it has a latency."""
    events = AuditEvent.objects.filter(run_id=run.id, action__startswith="tool.").order_by("id")
    return [(e.action, e.tool, e.attempt, e.reason, e.latency_ms is not None) for e in events]


def assert_ended_cancelled_after_one_attempt(run: Run, *, not_sent: str) -> None:
    run.refresh_from_db()
    assert run.status == Run.Status.CANCELLED, (run.status, run.error_code, run.error_message)
    events = tool_events(run)
    # The attempt under way finished and was audited; the gate's decision is audited, never sent.
    assert events[0][:2] == ("tool.call", "get_asset_status") and events[0][2] == 1 and events[0][4]
    assert events[1:] == [("tool.call", "get_asset_status", 0, "cancelled", False)]
    decision = AuditEvent.objects.get(run_id=run.id, reason="cancelled", action="tool.call")
    assert decision.result == {"interrupted": "cancelled", "not_sent": not_sent}
    assert not AuditEvent.objects.filter(action__startswith="tool.", tool="get_asset_status_backup").exists()
    stream = list(RunEvent.objects.filter(run_id=run.id).order_by("seq").values_list("kind", "data"))
    assert stream[-1] == ("status", {"status": "cancelled", "answer": "", "error": "cancelled"})
    assert not any(kind == "deterministic_result" and data.get("ok") for kind, data in stream)


@pytest.mark.slow
@pytest.mark.django_db
def test_a_rules_call_is_neither_retried_nor_handed_to_its_fallback_once_the_run_is_cancelled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = bind_demo_server(mcp_id="cancel-timeout", failure_mode="timeout")  # each attempt times out
    agent = make_agent(slug="cancel-timeout", servers=[server])
    run = Run.objects.create(agent=agent, query=QUESTION)
    cancel_while_the_first_attempt_is_out(monkeypatch, run)

    run_execute(run_id=str(run.id))

    assert_ended_cancelled_after_one_attempt(run, not_sent="retry")


@pytest.mark.slow
@pytest.mark.django_db
def test_a_call_with_no_retry_left_is_not_handed_to_its_fallback_once_the_run_is_cancelled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = bind_demo_server(mcp_id="cancel-once", failure_mode="timeout")
    ToolContract.objects.filter(tool__server=server, tool__name="get_asset_status").update(
        retry={"max_attempts": 1}, fallback_policy="call"
    )
    server = McpServer.objects.get(pk=server.pk)
    agent = make_agent(slug="cancel-once", servers=[server])
    run = Run.objects.create(agent=agent, query=QUESTION)
    cancel_while_the_first_attempt_is_out(monkeypatch, run)

    run_execute(run_id=str(run.id))

    assert_ended_cancelled_after_one_attempt(run, not_sent="fallback")
    assert not AuditEvent.objects.filter(run_id=run.id, action="tool.fallback").exists()


class CancelledDuringTheWait(gate.Clock):
    """The gate's clock (its seam for the backoff): the run is cancelled during the backoff, which is not waited."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.waits: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        cancel(self.run)


@pytest.mark.slow
@pytest.mark.django_db
def test_a_retry_is_not_sent_once_the_run_is_cancelled_during_its_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    server = bind_demo_server(mcp_id="cancel-backoff", failure_mode="rate_limit")  # retried after 2 s or so
    agent = make_agent(slug="cancel-backoff", servers=[server])
    run = Run.objects.create(agent=agent, query=QUESTION)
    clock = CancelledDuringTheWait(run)
    monkeypatch.setattr(gate, "clock", clock)

    run_execute(run_id=str(run.id))

    assert len(clock.waits) == 1 and clock.waits[0] > 0
    assert_ended_cancelled_after_one_attempt(run, not_sent="retry")
