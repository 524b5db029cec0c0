"""Local tools: fixes of the s38 review.

1. One pool of 8 threads served every local binding of the process: two bindings' hung functions held them all,
   and the shipped ``calculate`` of a third timed out without ever starting, against its own breaker. A binding now
   has a few calls in flight at most; a call past them is not started (``local:busy``: not counted by the breaker,
   a write known not done).
2. A value no JSON can hold (a tuple key, a circular reference) was ``unexpected``, a write ``outcome_unknown``
   though the function had finished: it is ``result:shape``, a write carried out.
3. A ``BaseTool`` subclass bound by its dotted path was silently left out when its module was bound.
4. ``calculate`` refused ``1,000 * 2`` naming an AST class ("not Tuple"), and × and ÷.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from agents.approvals import approval_decide
from agents.execution import run_execute
from agents.models import Approval, Run
from audit.models import AuditEvent
from mcpregistry import gate
from mcpregistry.builtin_tools import calculate
from mcpregistry.local_tools import load_local_tools
from mcpregistry.models import McpServer, ToolContract
from tests import local_tool_s38_fixtures as fixtures
from tests.conftest import discover_as_admin, make_agent

MODULE = "tests.local_tool_s38_fixtures"


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def allowed(settings: Any) -> Iterator[None]:
    settings.PLATFORM_LOCAL_TOOL_MODULES = ["mcpregistry.builtin_tools", MODULE]
    fixtures.STARTED.clear()
    fixtures.FINISHED.clear()
    fixtures.EXECUTED.clear()
    fixtures.RELEASE.clear()
    yield
    # The process's runner outlives the test: its hung threads are let go, and waited for.
    fixtures.RELEASE.set()
    assert wait_for(lambda: len(fixtures.FINISHED) == len(fixtures.STARTED))


def bind(paths: list[str], mcp_id: str) -> McpServer:
    server = McpServer(mcp_id=mcp_id, name=mcp_id, transport=McpServer.Transport.LOCAL, args=paths, timeout_s=5)
    server.full_clean()
    server.save()
    report = discover_as_admin(server=server)
    assert report.ok, report.error
    ToolContract.objects.filter(tool__server=server).exclude(tool__name="hang_write").update(risk="read")
    return server


def call(server: McpServer, tool: str, args: dict[str, Any]) -> gate.ToolResult:
    server = McpServer.objects.prefetch_related("tools__contract").get(pk=server.pk)
    return gate.call(server=server, tool_name=tool, args=args, who=gate.GateCall(source="admin"))


def approved_write(server: McpServer, tool: str, args: dict[str, Any]) -> tuple[Run, Approval]:
    """A scripted model's run that asked for ``tool`` (a write), approved, then resumed."""
    agent = make_agent(
        slug=f"{server.mcp_id}-writer",
        servers=[server],
        provider="scripted",
        with_demo_rules=False,
        script=[{"tool_calls": [{"name": tool, "args": args}]}, {"content": "done"}],
    )
    run = Run.objects.create(agent=agent, query="기록해 줘")
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert run.status == Run.Status.AWAITING_APPROVAL
    approval = run.approvals.get()
    approval_decide(run=run, approval_id=str(approval.pk), decision="approve", actor="reviewer")
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    approval.refresh_from_db()
    return run, approval


# --- 1. hung tools of two bindings leave threads for a third -------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db
def test_two_bindings_hung_tools_do_not_stop_a_third_bindings_calculate(allowed: None) -> None:
    hung = [bind([MODULE + ".hang"], "hung-a"), bind([MODULE + ".hang"], "hung-c")]
    healthy = bind(["mcpregistry.builtin_tools"], "healthy-b")
    ToolContract.objects.filter(tool__server__in=hung).update(timeout_s=0.2)
    ToolContract.objects.filter(tool__server=healthy).update(timeout_s=2)
    for server in hung:
        for i in range(3):
            call(server, "hang", {"key": f"{server.mcp_id}-{i}"})
    # Each hung binding holds a few threads, no more: its third call was not started at all.
    for server in hung:
        started = [key for key in fixtures.STARTED if key.startswith(server.mcp_id)]
        assert 1 <= len(started) < 9
        assert f"{server.mcp_id}-2" not in started

    result = call(healthy, "calculate", {"expression": "48 * 1.12"})

    assert (result.ok, result.value, result.attempts) == (True, "53.76", 1), result.message
    assert not AuditEvent.objects.filter(tool="calculate", ok=False).exists()
    healthy.refresh_from_db()
    assert healthy.breaker_failures == 0


@pytest.mark.django_db
def test_a_call_its_binding_has_no_thread_for_fails_at_once_not_started_and_not_counted(allowed: None) -> None:
    server = bind([MODULE + ".hang"], "hung-a")
    ToolContract.objects.filter(tool__server=server).update(timeout_s=0.2)
    while len(fixtures.STARTED) < 20 and call(server, "hang", {"key": str(len(fixtures.STARTED))}).error == "timeout":
        pass
    server.refresh_from_db()
    failures, held = server.breaker_failures, len(fixtures.STARTED)
    ToolContract.objects.filter(tool__server=server).update(timeout_s=5)  # a call that waited would take 5 s

    began = time.monotonic()
    result = call(server, "hang", {"key": "one more"})

    assert time.monotonic() - began < 2.5  # no wait for a thread, no retry
    assert (result.ok, result.error, result.attempts) == (False, "local:busy", 1)
    assert "was not started" in result.message and "[local:busy]" in result.message
    assert len(fixtures.STARTED) == held  # the function never ran
    event = AuditEvent.objects.filter(tool="hang", action="tool.call").order_by("-id").first()
    assert event is not None and (event.ok, event.reason) == (False, "local:busy")
    server.refresh_from_db()
    assert server.breaker_failures == failures  # a busy binding is not a failing one


@pytest.mark.slow
@pytest.mark.django_db
def test_an_approved_write_its_binding_has_no_thread_for_is_known_not_done(allowed: None) -> None:
    server = bind([MODULE + ".hang", MODULE + ".hang_write"], "hung-writer")
    ToolContract.objects.filter(tool__server=server).update(timeout_s=0.2)
    for i in range(3):
        call(server, "hang", {"key": f"read-{i}"})
    held = len(fixtures.STARTED)

    _run, approval = approved_write(server, "hang_write", {"key": "write"})

    assert "write" not in fixtures.STARTED and len(fixtures.STARTED) == held
    assert approval.status == Approval.Status.EXECUTED
    assert approval.result is not None and approval.result["reason"] == "local:busy"


# --- 2. a value no JSON can hold -----------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("tool", ["tuple_keys", "circular"])
def test_a_value_json_cannot_hold_is_a_result_shape_not_unexpected(allowed: None, tool: str) -> None:
    server = bind([MODULE], "odd-values")
    result = call(server, tool, {"key": "x"})
    assert (result.ok, result.error, result.attempts) == (False, "result:shape", 1)
    assert "cannot be written as JSON" in result.message
    assert fixtures.EXECUTED == ["x"]
    reasons = AuditEvent.objects.filter(tool=tool, action="tool.call").values_list("reason", flat=True)
    assert list(reasons) == ["result:shape"]


@pytest.mark.django_db
def test_an_approved_write_whose_value_json_cannot_hold_was_carried_out_not_unknown(allowed: None) -> None:
    server = bind([MODULE], "odd-writer")
    ToolContract.objects.filter(tool__server=server, tool__name="tuple_keys").update(risk="write")

    run, approval = approved_write(server, "tuple_keys", {"key": "ordered"})

    assert fixtures.EXECUTED == ["ordered"]
    assert approval.status == Approval.Status.EXECUTED
    assert approval.result is not None and approval.result["reason"] == "result:shape"
    assert not AuditEvent.objects.filter(run_id=run.id, action="approval.outcome_unknown").exists()


# --- 3. a BaseTool subclass is found in its module -------------------------------------------------------------------


def test_a_basetool_subclass_is_bound_with_its_module_as_by_its_path(allowed: None) -> None:
    assert set(load_local_tools([MODULE + ".echo_cls"])) == {"echo_cls"}
    tools = load_local_tools([MODULE])
    assert "echo_cls" in tools
    assert tools["echo_cls"].invoke({"text": "그대로"}) == "그대로"


# --- 4. calculate reads amounts as people write them -----------------------------------------------------------------


def calc(expression: str) -> str:
    return str(calculate.invoke({"expression": expression}))


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("1,000 * 2", "2000"),
        ("１,０００ * 2", "2000"),
        ("１，０００ ＊ ２", "2000"),
        ("1,200,000 * 0.1", "120000"),
        ("-1,000 + 1,000,000", "999000"),
        ("(1,000)", "1000"),
        ("1,000.5 + 1", "1001.5"),
        ("6 × 7", "42"),
        ("10 ÷ 4", "2.5"),
        ("1,000원 * 3", "3000"),
        ("１,２００원 × ３", "3600"),
    ],
)
def test_digit_group_commas_times_divide_and_won_are_read(expression: str, value: str) -> None:
    assert calc(expression) == value


@pytest.mark.parametrize(
    "expression", ["1,2", "1,0000", "12345,678", "0x1,000", "1.5,000", "1 ,000", "(1, 2)", "2 | 3", "abs(1)", "[1]"]
)
def test_what_is_not_arithmetic_is_refused_in_a_plain_sentence(expression: str) -> None:
    with pytest.raises(ValueError) as refused:
        calc(expression)
    message = str(refused.value)
    assert message.startswith("only numbers, the operators + - * / // % ** (× and ÷ too) and parentheses")
    for ast_name in ("Tuple", "BitOr", "Call", "List", "Name"):
        assert ast_name not in message
