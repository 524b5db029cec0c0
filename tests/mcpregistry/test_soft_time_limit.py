"""The run's soft time limit while a tool call is out (defects s29 cancel 1 and 2).

Celery raises ``SoftTimeLimitExceeded`` (an ``Exception``) in the worker's thread while it waits for a tool call:

1. a local tool's call took it for the tool's own error (``tool:error``): an approved write that ran was recorded
   executed and failed, and a call still queued behind busy threads ran after the
   run had ended. It is the run's interruption: the write's outcome is unknown.
2. a pooled MCP call went on on the pool's loop: a write whose session was still opening was sent seconds after
   the run had failed and its approval was recorded ``outcome_unknown``, with no audit event.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings as dj_settings

from agents.approvals import approval_decide
from agents.execution import run_execute
from agents.models import Approval, Run
from audit.models import AuditEvent
from mcpregistry.local_tools import LocalToolRunner
from mcpregistry.models import McpServer, ToolContract
from mcpregistry.pool import McpSessionPool, get_default_pool
from tests import local_tool_fixtures as fixtures
from tests.conftest import discover_as_admin, make_agent
from tests.mcp_fixtures.scripts import script_file


@pytest.fixture
def caller_key(api_caller):  # type: ignore[no-untyped-def]
    return api_caller[0]


@contextmanager
def soft_time_limit_in(seconds: float) -> Iterator[None]:
    """Celery's soft time limit, as its worker raises it: from a signal handler, in the thread that runs the task."""

    def soft_limit(signum: int, frame: Any) -> None:
        raise SoftTimeLimitExceeded()

    old = signal.signal(signal.SIGALRM, soft_limit)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@contextmanager
def soft_time_limit_once(started: Callable[[], bool], after_s: float = 0.05) -> Iterator[None]:
    """Celery's soft time limit as :func:`soft_time_limit_in` raises it, ``after_s`` after ``started()`` holds (a
    tool's thread has begun): a thread waits for it and sets the timer; the signal's handler runs in the main
    thread, the task's."""

    def soft_limit(signum: int, frame: Any) -> None:
        raise SoftTimeLimitExceeded()

    done = threading.Event()

    def arm() -> None:
        while not done.is_set():
            if started():
                signal.setitimer(signal.ITIMER_REAL, after_s)
                return
            time.sleep(0.01)

    old = signal.signal(signal.SIGALRM, soft_limit)
    watcher = threading.Thread(target=arm, daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def parked_write(server: McpServer, tool: str, args: dict[str, Any], caller_key: Any) -> tuple[Run, Approval]:
    """A run of a scripted model that asked for ``tool`` (a write), approved by a reviewer, queued to resume."""
    agent = make_agent(
        slug=f"{server.mcp_id}-writer",
        servers=[server],
        provider="scripted",
        with_demo_rules=False,
        script=[{"tool_calls": [{"name": tool, "args": args}]}, {"content": "done"}],
    )
    run = Run.objects.create(agent=agent, api_key=caller_key, query="메모 남겨줘")
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert run.status == Run.Status.AWAITING_APPROVAL
    approval = run.approvals.get()
    approval_decide(run=run, approval_id=str(approval.pk), decision="approve", actor="reviewer")
    return run, approval


# --- 1. local tools -------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_soft_time_limit_while_a_local_tool_runs_is_raised_not_the_tools_error() -> None:
    runner = LocalToolRunner(max_workers=1)
    config = {"args": ["tests.local_tool_fixtures"]}
    try:
        with (
            pytest.MonkeyPatch.context() as patch,
            soft_time_limit_in(0.3),
            pytest.raises(SoftTimeLimitExceeded),
        ):
            patch.setattr(dj_settings, "PLATFORM_LOCAL_TOOL_MODULES", ["tests.local_tool_fixtures"])
            runner.call_tool(config, "sleepy", {"seconds": 1}, timeout_s=10)
    finally:
        runner._executor.shutdown(wait=True)


@pytest.mark.slow
def test_a_local_call_still_queued_when_the_soft_time_limit_comes_never_runs() -> None:
    runner = LocalToolRunner(max_workers=1)
    config = {"args": ["tests.local_tool_fixtures"]}
    fixtures.EXECUTED.clear()
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(dj_settings, "PLATFORM_LOCAL_TOOL_MODULES", ["tests.local_tool_fixtures"])
            busy = threading.Thread(
                target=runner.call_tool, args=(config, "sleepy", {"seconds": 1}), kwargs={"timeout_s": 10}
            )
            busy.start()
            assert wait_for(lambda: len(fixtures.EXECUTED["sleepy"]) == 1)  # the only thread is taken
            with soft_time_limit_in(0.2), pytest.raises(SoftTimeLimitExceeded):
                runner.call_tool(config, "sleepy", {"seconds": 0.1}, timeout_s=10)  # queued behind it
            busy.join()
    finally:
        runner._executor.shutdown(wait=True)
    assert fixtures.EXECUTED["sleepy"] == [{"seconds": 1}]


def test_a_local_tool_that_raises_is_still_its_own_error() -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dj_settings, "PLATFORM_LOCAL_TOOL_MODULES", ["tests.local_tool_fixtures"])
        outcome = LocalToolRunner(max_workers=1).call_tool(
            {"args": ["tests.local_tool_fixtures"]}, "explode", {"reason": "디스크 가득"}, timeout_s=5
        )
    assert (outcome.is_error, outcome.text) == (True, "RuntimeError: backend exploded: 디스크 가득")


@pytest.mark.django_db
def test_an_approved_local_write_cut_short_by_the_soft_time_limit_ends_outcome_unknown(
    settings: Any, caller_key: Any
) -> None:
    settings.PLATFORM_LOCAL_TOOL_MODULES = ["mcpregistry.builtin_tools", "tests.local_tool_fixtures"]
    fixtures.EXECUTED.clear()
    server = McpServer(
        mcp_id="loc", name="loc", transport=McpServer.Transport.LOCAL, args=["tests.local_tool_fixtures"], timeout_s=10
    )
    server.full_clean()
    server.save()
    assert discover_as_admin(server=server).ok
    ToolContract.objects.filter(tool__server=server, tool__name="sleepy").update(risk="write")
    run, approval = parked_write(server, "sleepy", {"seconds": 1}, caller_key)
    # The limit comes once the write has started (on a loaded machine a fixed 0.3 s could end the run before its
    # approved call began: the approval then expired, another case).
    with soft_time_limit_once(lambda: bool(fixtures.EXECUTED.get("sleepy"))):
        run_execute(run_id=str(run.id))
    run.refresh_from_db()
    approval.refresh_from_db()
    assert (run.status, run.error_code) == (Run.Status.FAILED, "time_limit")
    # It ran (and its thread runs on): not "executed" with the run's own interruption as the tool's error.
    assert approval.status == Approval.Status.OUTCOME_UNKNOWN
    assert not AuditEvent.objects.filter(run_id=run.id, action="tool.call", reason="tool:error").exists()
    assert AuditEvent.objects.filter(run_id=run.id, action="approval.outcome_unknown").count() == 1
    assert wait_for(lambda: fixtures.EXECUTED["sleepy"] == [{"seconds": 1}], timeout=5)


# --- 2. the session pool --------------------------------------------------------------------------------------


def test_a_caller_stopped_while_it_waits_cancels_its_coroutine_on_the_pools_loop() -> None:
    pool = McpSessionPool()
    cancelled = threading.Event()
    finished = threading.Event()

    async def slow_send() -> None:
        try:
            await asyncio.sleep(2)
            finished.set()  # what a call would have sent after the caller was gone
        except asyncio.CancelledError:
            cancelled.set()
            raise

    try:
        with soft_time_limit_in(0.2), pytest.raises(SoftTimeLimitExceeded):
            pool.submit(slow_send(), timeout=10)
        assert cancelled.wait(5)
        assert not finished.is_set()
    finally:
        pool.shutdown()


@pytest.mark.django_db
@pytest.mark.slow
def test_an_approved_write_whose_session_was_opening_at_the_soft_time_limit_is_never_sent(
    caller_key: Any, tmp_path: Path
) -> None:
    notes = tmp_path / "notes.txt"
    server = McpServer.objects.create(
        mcp_id="slowstart",
        name="slowstart",
        command=sys.executable,
        args=["-m", "tests.mcp_fixtures.probe_server"],
        cwd=str(dj_settings.BASE_DIR),
        env={"NOTES_FILE": str(notes)},  # type: ignore[misc]
        session_scope="shared",
        timeout_s=20,
    )
    assert discover_as_admin(server=server).ok
    # From now on the server takes 2 s to start: the write's session is the one that must be opening (discovered
    # before the wait was put in: it would only have made the discovery wait too).
    slow_start = script_file(f"sleep 2; exec {sys.executable} -m tests.mcp_fixtures.probe_server\n", ".sh")
    McpServer.objects.filter(pk=server.pk).update(command="/bin/sh", args=[slow_start])
    server.refresh_from_db()
    pool = get_default_pool()
    try:
        run, approval = parked_write(server, "append_note", {"text": "x"}, caller_key)
        pool.close("slowstart")  # this worker's session is gone (reaped when idle): the write opens a new one
        before = set(pool.child_process_ids())
        with soft_time_limit_in(0.5):
            run_execute(run_id=str(run.id))
        run.refresh_from_db()
        approval.refresh_from_db()
        assert (run.status, run.error_code) == (Run.Status.FAILED, "time_limit")
        assert approval.status == Approval.Status.OUTCOME_UNKNOWN
        # The session would have been open within 2 s and the write sent at once (it was, 3 s on, before). Its
        # process is the only writer of the notes: once it has ended, nothing can send the write any more. (Had the
        # session gone on opening, the wait would last its 10 s, and the write would be in the notes by then.)
        closed = wait_for(lambda: not set(pool.child_process_ids()) - before)
        assert not notes.exists()
        # The gate cannot tell a session still opening from a request on its way: the attempt is recorded as one
        # that may have gone out, its outcome unknown (never sent again); the server got nothing.
        [cut] = AuditEvent.objects.filter(run_id=run.id, action="tool.call")
        assert (cut.reason, cut.result["outcome_unknown"]) == ("time_limit", True)
        # The half-open session was closed, not left running with nobody to close it.
        assert closed
    finally:
        pool.close("slowstart")
