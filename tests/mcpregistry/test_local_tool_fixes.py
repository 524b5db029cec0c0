"""Local tools: fixes of the reviewer's findings on local tools and ``calculate``.

1. A local tool that raised ``SystemExit`` or ``KeyboardInterrupt`` (argparse on bad input, ``sys.exit()``) escaped
   the gate: the run stayed ``running`` with no audit event, the worker's process ended and the tool ran again on
   every redelivery; an approved write that did its side effect, then exited, had no ``tool.call`` event. What the
   tool's own code raises is its ``tool:error``; what interrupts the caller while it waits is still raised.
2. ``calculate`` truncated ``//`` and ``%`` toward zero (``-7 // 2`` gave -3): it reads Python syntax, so it floors.
3. A ``local`` binding's "arguments are a JSON list" refusal did not go through gettext.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from celery.exceptions import WorkerShutdown

from agent_platform.celery import app as celery_app
from agents.approvals import approval_decide
from agents.execution import run_execute
from agents.models import Approval, Run
from audit.models import AuditEvent
from mcpregistry import gate, local_tools
from mcpregistry.builtin_tools import calculate
from mcpregistry.local_tools import LocalToolRunner
from mcpregistry.models import McpServer, ToolContract
from tests import local_tool_exit_fixtures as fixtures
from tests.conftest import discover_as_admin, make_agent

MODULE = "tests.local_tool_exit_fixtures"


@pytest.fixture(autouse=True)
def allowed_modules(settings: Any) -> None:
    settings.PLATFORM_LOCAL_TOOL_MODULES = [MODULE]
    fixtures.EXECUTED.clear()


@pytest.fixture
def runner() -> Iterator[LocalToolRunner]:
    runner = LocalToolRunner(max_workers=2)
    yield runner
    runner._executor.shutdown(wait=True)


@pytest.fixture
def eager_tasks() -> Iterator[None]:
    celery_app.conf.task_always_eager = True
    yield
    celery_app.conf.task_always_eager = False


def bind_exit_tools() -> McpServer:
    server = McpServer(mcp_id="exit-local", name="exit-local", transport="local", args=[MODULE], timeout_s=5)
    server.full_clean()
    server.save()
    assert discover_as_admin(server=server).ok
    ToolContract.objects.filter(tool__server=server).exclude(tool__name="post_notice").update(risk="read")
    return McpServer.objects.prefetch_related("tools__contract").get(pk=server.pk)


def gate_call(server: McpServer, tool: str, args: dict[str, Any]) -> gate.ToolResult:
    """The gate's call; what escapes it fails the test (a ``KeyboardInterrupt`` would end the test session)."""
    try:
        return gate.call(server=server, tool_name=tool, args=args, who=gate.GateCall(source="admin"))
    except BaseException as escaped:  # noqa: BLE001 - the defect: reported as the test's failure
        pytest.fail(f"{type(escaped).__name__}({escaped}) escaped the gate")


@contextmanager
def raised_in_the_caller_after(seconds: float, interruption: type[BaseException]) -> Iterator[None]:
    """``interruption`` raised from a signal handler in the waiting caller's thread, as a worker's shutdown is."""

    def interrupt(signum: int, frame: Any) -> None:
        raise interruption()

    old = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# --- 1. SystemExit and KeyboardInterrupt from a local tool --------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("tool", "args", "message"),
    [
        ("parse_count", {"line": "--count abc"}, "SystemExit: 2"),
        ("exit_with", {"code": 3}, "SystemExit: 3"),
        ("interrupted", {}, "KeyboardInterrupt"),
        ("async_exit_with", {"code": 4}, "SystemExit: 4"),
    ],
)
def test_a_local_tool_that_exits_or_is_interrupted_by_its_own_code_is_a_tool_error_and_audited(
    tool: str, args: dict[str, Any], message: str
) -> None:
    server = bind_exit_tools()
    result = gate_call(server, tool, args)
    assert (result.ok, result.error, result.attempts) == (False, "tool:error", 1)
    assert message in result.message
    assert len(fixtures.EXECUTED[tool]) == 1  # not retried: the tool's own error
    events = AuditEvent.objects.filter(tool=tool, action="tool.call")
    assert list(events.values_list("ok", "reason", "attempt")) == [(False, "tool:error", 1)]


@pytest.mark.django_db
def test_a_run_whose_tool_exits_ends_and_the_tool_ran_once() -> None:
    server = bind_exit_tools()
    agent = make_agent(
        slug="flag-reader",
        servers=[server],
        provider="scripted",
        with_demo_rules=False,
        script=[
            {"tool_calls": [{"name": "parse_count", "args": {"line": "--count abc"}}]},
            {"content": "결과: {last_tool_result}"},
        ],
    )
    run = Run.objects.create(agent=agent, query="플래그를 읽어줘")
    try:
        run_execute(run_id=str(run.id))
    except BaseException as escaped:  # noqa: BLE001 - the defect: reported as the test's failure
        pytest.fail(f"{type(escaped).__name__}({escaped}) escaped the run")
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert "SystemExit: 2" in run.answer
    assert fixtures.EXECUTED["parse_count"] == ["--count abc"]
    calls = AuditEvent.objects.filter(run_id=run.id, tool="parse_count", action="tool.call")
    assert list(calls.values_list("ok", "reason", "attempt")) == [(False, "tool:error", 1)]


@pytest.mark.django_db
def test_an_approved_write_that_exits_after_its_side_effect_has_its_call_audited(
    eager_tasks: None, django_capture_on_commit_callbacks: Any
) -> None:
    server = bind_exit_tools()
    agent = make_agent(
        slug="notice-poster",
        servers=[server],
        provider="scripted",
        with_demo_rules=False,
        script=[
            {"tool_calls": [{"name": "post_notice", "args": {"text": "점검 공지"}}]},
            {"content": "결과: {last_tool_result}"},
        ],
    )
    run = Run.objects.create(agent=agent, query="공지 올려줘")
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert run.status == Run.Status.AWAITING_APPROVAL
    try:
        with django_capture_on_commit_callbacks(execute=True):
            approval_decide(run=run, approval_id=str(run.approvals.get().id), decision="approve", actor="reviewer")
    except BaseException as escaped:  # noqa: BLE001 - the defect: reported as the test's failure
        pytest.fail(f"{type(escaped).__name__}({escaped}) escaped the approved run")
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error_message  # the model was told the write failed
    approval = run.approvals.get()
    assert (approval.status, approval.result["reason"], approval.result["value"]) == (
        Approval.Status.EXECUTED,
        "tool:error",
        "SystemExit: 0",
    )
    assert fixtures.EXECUTED["post_notice"] == ["점검 공지"]  # done once, not again
    calls = AuditEvent.objects.filter(run_id=run.id, tool="post_notice", action="tool.call", attempt__gte=1)
    assert list(calls.values_list("ok", "reason")) == [(False, "tool:error")]


def test_the_callers_own_interruption_while_it_waits_is_still_raised_and_cancels_the_tool(
    runner: LocalToolRunner,
) -> None:
    """A worker's shutdown is a ``SystemExit`` raised in the caller's thread: the caller's, never the tool's."""
    with raised_in_the_caller_after(0.2, WorkerShutdown), pytest.raises(WorkerShutdown):
        runner.call_tool({"args": [MODULE]}, "async_wait", {"seconds": 10}, timeout_s=10)
    runner._executor.shutdown(wait=True)  # returns once the coroutine is cancelled at its await
    assert fixtures.EXECUTED["async_wait"] == ["started"]


# --- 2. calculate's // and % are Python's ---------------------------------------------------------------------------


def calc(expression: str) -> str:
    return str(calculate.invoke({"expression": expression}))


@pytest.mark.parametrize(
    ("expression", "python"),
    [
        ("-7 // 2", "-4"),
        ("-7 % 2", "1"),
        ("-5 % 3", "1"),
        ("-7.5 // 2", "-4"),
        ("7 // -2", "-4"),
        ("7 % -2", "-1"),
        ("-7.5 % 2", "0.5"),
        ("-4 % 2", "0"),
        ("-4 // 2", "-2"),
    ],
)
def test_floor_division_and_remainder_with_a_negative_operand_are_pythons(expression: str, python: str) -> None:
    assert calc(expression) == python


@pytest.mark.parametrize(
    ("expression", "python"),
    [("7 // 2", "3"), ("7 % 2", "1"), ("7.5 // 2", "3"), ("7.5 % 2", "1.5"), ("10**30 % 7", "1"), ("-7 // -2", "3")],
)
def test_floor_division_and_remainder_of_same_signs_are_unchanged(expression: str, python: str) -> None:
    assert calc(expression) == python


@pytest.mark.parametrize("expression", ["-7 // 0", "-7 % 0", "7 // 0", "0 % 0"])
def test_a_zero_divisor_of_floor_division_is_still_division_by_zero(expression: str) -> None:
    with pytest.raises(ValueError, match=r"^division by zero$"):
        calc(expression)


# --- 3. the refusal of a local binding's arguments is translated -----------------------------------------------------


@pytest.mark.parametrize("paths", [[], "tests.local_tool_exit_fixtures", [MODULE, 3]])
def test_the_refusal_of_arguments_that_are_no_list_of_paths_goes_through_gettext(
    paths: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local_tools, "_", lambda message: f"«{message}»")
    problem = local_tools.local_paths_problem(paths)
    assert (
        problem == '«a local binding\'s arguments are a JSON list of dotted paths, e.g. ["mcpregistry.builtin_tools"]»'
    )
