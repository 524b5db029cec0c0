"""A concurrent batch cut short by the run's soft time limit (fix_batchcut): Celery raises the limit on the run's
thread only, and the batch's threads ran their calls' timeouts, backed off and sent the reads again, audited as
``timeout`` long after the run had failed; none was audited ``time_limit``.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings as dj_settings
from django.db import connection

from agents.execution import run_execute
from agents.models import Run
from agents.parallel_calls import BatchStop
from audit.models import AuditEvent
from mcpregistry import gate
from mcpregistry.models import McpServer, ToolContract
from mcpregistry.pool import get_default_pool
from tests.agents.test_fix_worker_review import soft_time_limit_once
from tests.conftest import discover_as_admin, make_agent

# Batches form outside a transaction only: another connection could not see the run's uncommitted rows.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def hanging_reads(tmp_path: Path, settings: Any) -> Iterator[tuple[McpServer, Path]]:
    """A real stdio server that logs each ``record_read`` it gets and never answers; the read times out after 4 s
    and is retried once on a timeout."""
    settings.PLATFORM_PARALLEL_TOOL_CALLS = 4
    settings.PLATFORM_PARALLEL_TOOL_CALLS_PER_SERVER = 2
    side_effects = tmp_path / "side_effects.txt"
    server = McpServer.objects.create(
        mcp_id="hangs-batch",
        name="hangs-batch",
        command=sys.executable,
        args=["-m", "tests.mcp_fixtures.side_effect_server"],
        cwd=str(dj_settings.BASE_DIR),
        env={"SIDE_EFFECT_FILE": str(side_effects), "SIDE_EFFECT_MODE": "hang"},  # type: ignore[misc]
        session_scope="shared",
        timeout_s=60,
    )
    assert discover_as_admin(server=server).ok
    ToolContract.objects.filter(tool__server=server, tool__name="record_read").update(
        risk="read",
        timeout_s=4,
        retry={"max_attempts": 2, "on": ["timeout"], "backoff_base_s": 0.1, "backoff_cap_s": 0.1},
    )
    try:
        yield server, side_effects
    finally:
        get_default_pool().close("hangs-batch")


def server_got(path: Path, lines: set[str]) -> Callable[[], bool]:
    return lambda: path.exists() and lines <= set(path.read_text(encoding="utf-8").splitlines())


@pytest.mark.slow
def test_a_batch_cut_short_by_the_soft_time_limit_audits_each_read_once_as_time_limit_and_sends_none_again(
    hanging_reads: tuple[McpServer, Path], api_caller: Any, api_client: Any
) -> None:
    server, side_effects = hanging_reads
    agent = make_agent(
        slug="batch-reader",
        servers=[server],
        provider="scripted",
        with_demo_rules=False,
        script=[
            {
                "tool_calls": [
                    {"name": "record_read", "args": {"key": "k1"}, "id": "c1"},
                    {"name": "record_read", "args": {"key": "k2"}, "id": "c2"},
                ]
            },
            {"content": "done"},
        ],
    )
    run = Run.objects.create(agent=agent, api_key=api_caller.key, query="k1, k2")
    with soft_time_limit_once(server_got(side_effects, {"read:k1", "read:k2"})):
        run_execute(run_id=str(run.id))
    # What the run's thread had recorded when it came back: before the calls' own timeouts ended (their threads
    # still wait for them), or these would be their ``timeout`` events.
    at_return = sorted(AuditEvent.objects.filter(run_id=run.id, action="tool.call").values_list("call_id", "reason"))
    # Whatever the batch's threads still do (an audit event, a read sent again) is done once they end.
    for thread in threading.enumerate():
        if thread.name.startswith("tool-call"):
            thread.join(timeout=60)
            assert not thread.is_alive()

    run.refresh_from_db()
    assert (run.status, run.error_code) == (Run.Status.FAILED, "time_limit")
    assert at_return == [("c1", "time_limit"), ("c2", "time_limit")]
    assert sorted(side_effects.read_text(encoding="utf-8").splitlines()) == ["read:k1", "read:k2"]  # each once
    events = AuditEvent.objects.filter(run_id=run.id, action="tool.call").order_by("call_id")
    assert [(e.call_id, e.attempt, e.ok, e.reason, e.result) for e in events] == [
        ("c1", 1, False, "time_limit", {"interrupted": "time_limit", "answered": False}),
        ("c2", 1, False, "time_limit", {"interrupted": "time_limit", "answered": False}),
    ]
    calls = api_client.get(f"/api/v1/runs/{run.id}").json()["tool_calls"]
    assert sorted((c["args"]["key"], c["ok"], c["reason"]) for c in calls) == [
        ("k1", False, "time_limit"),
        ("k2", False, "time_limit"),
    ]


@pytest.mark.slow
def test_a_batch_call_waiting_to_retry_when_the_time_is_up_is_not_sent_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call of a batch backing off after a rate limit: the stop ends its wait, and the retry is not sent."""
    monkeypatch.setattr(gate, "clock", gate.Clock())  # a wait in real time: only the stop can end it early
    side_effects = tmp_path / "side_effects.txt"
    server = McpServer.objects.create(
        mcp_id="limited-batch",
        name="limited-batch",
        command=sys.executable,
        args=["-m", "tests.mcp_fixtures.side_effect_server"],
        cwd=str(dj_settings.BASE_DIR),
        env={"SIDE_EFFECT_FILE": str(side_effects), "SIDE_EFFECT_MODE": "report-rate-limit"},  # type: ignore[misc]
        session_scope="shared",
        timeout_s=60,
    )
    assert discover_as_admin(server=server).ok
    ToolContract.objects.filter(tool__server=server, tool__name="record_read").update(
        risk="read",
        retry={"max_attempts": 2, "on": ["rate_limit"], "backoff_base_s": 600, "backoff_cap_s": 600},
    )
    stop = BatchStop()
    raised: list[BaseException] = []

    def batch_thread() -> None:
        try:
            gate.call(
                server=server,
                tool_name="record_read",
                args={"key": "k1"},
                who=gate.GateCall(source="agent", call_id="c1", stop=stop),
            )
        except BaseException as exc:  # noqa: BLE001 - what the thread met, for the assertion below
            raised.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=batch_thread, daemon=True)
    thread.start()
    try:
        audited = AuditEvent.objects.filter(mcp_id="limited-batch", action="tool.call")
        while not audited.exists() and thread.is_alive():
            thread.join(0.05)  # until the first attempt's rate limit is audited: its backoff (600 s) follows
        stop.cut_short()
        thread.join(timeout=60)  # far less than the backoff: only the stop ends it
        assert not thread.is_alive()
    finally:
        get_default_pool().close("limited-batch")
    assert [type(exc) for exc in raised] == [SoftTimeLimitExceeded]
    assert side_effects.read_text(encoding="utf-8").splitlines() == ["read:k1"]
    assert [(e.attempt, e.reason) for e in audited.order_by("id")] == [(1, "rate_limit")]  # nothing was out
