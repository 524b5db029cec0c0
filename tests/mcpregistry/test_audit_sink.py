"""A caller's audit sink (``GateCall.audit_sink``, the deterministic stage's): the gate hands it a read call's audit
events, exactly the events it would have written, and writes everything else itself, after flushing the sink,
so the record keeps the order of what happened."""

from __future__ import annotations

from typing import Any

import pytest

from audit.models import AuditEvent
from audit.services import audit_events_record
from mcpregistry import gate
from mcpregistry.models import McpServer
from tests import local_tool_fixtures as fixtures
from tests.mcpregistry.test_local_tools import MODULE, bind_local, contract

pytestmark = pytest.mark.django_db

ROW = ("source", "action", "mcp_id", "tool", "call_id", "args", "result", "ok", "reason", "attempt", "actor")


class Sink:
    """A sink that writes what it collected when flushed, as the deterministic stage's does, and notes each step
    (and how many audit events were stored at each flush)."""

    def __init__(self) -> None:
        self.collected: list[dict[str, Any]] = []
        self.steps: list[str] = []

    def add(self, event: dict[str, Any]) -> None:
        self.steps.append(f"add {event['action']} {event['reason'] or 'ok'}")
        self.collected.append(event)

    def flush(self) -> None:
        if self.collected:  # (an empty flush writes nothing: not noted)
            self.steps.append(f"flush {len(self.collected)}")
        audit_events_record(self.collected)
        self.collected = []


@pytest.fixture(autouse=True)
def allowed_modules(settings):  # type: ignore[no-untyped-def]
    settings.PLATFORM_LOCAL_TOOL_MODULES = ["mcpregistry.builtin_tools", MODULE]
    fixtures.EXECUTED.clear()


@pytest.fixture
def local() -> McpServer:
    return bind_local([MODULE])


def call(server: McpServer, tool: str, args: Any, *, sink: Sink | None, **who: Any) -> gate.ToolResult:
    server = McpServer.objects.prefetch_related("tools__contract").get(pk=server.pk)
    caller = gate.GateCall(source="deterministic", actor="tester", call_id="rule:1", audit_sink=sink, **who)
    return gate.call(server=server, tool_name=tool, args=args, who=caller)


def rows() -> list[tuple[Any, ...]]:
    return list(AuditEvent.objects.exclude(action__startswith="config.").order_by("seq").values_list(*ROW))


def test_a_read_calls_audit_events_go_to_the_sink_as_the_gate_would_write_them(local) -> None:
    contract(local, "explode", retry={"max_attempts": 2, "on": ["tool:error"], "base_delay_s": 0})
    for tool, args in [("lookup_stock", {"sku": "A-1"}), ("explode", {"reason": "비밀 토큰 sk-abcdefghijklmnop"})]:
        call(local, tool, args, sink=None)
    written = rows()
    sink = Sink()
    for tool, args in [("lookup_stock", {"sku": "A-1"}), ("explode", {"reason": "비밀 토큰 sk-abcdefghijklmnop"})]:
        result = call(local, tool, args, sink=sink)
    assert not result.ok
    assert rows() == written  # nothing written by the gate itself
    assert sink.steps == ["add tool.call ok", "add tool.call tool:error", "add tool.call tool:error"]
    sink.flush()
    assert rows() == written + written  # the same events, masked the same way, in the same order
    assert all("sk-abcdefghijklmnop" not in str(row) for row in rows())


def test_a_memo_hit_goes_to_the_sink_too(local) -> None:
    contract(local, "lookup_stock", memo=True)
    sink, memo = Sink(), {}
    call(local, "lookup_stock", {"sku": "A-1"}, sink=sink, memo=memo)
    call(local, "lookup_stock", {"sku": "A-1"}, sink=sink, memo=memo)
    assert sink.steps == ["add tool.call ok", "add tool.call memo:hit"]
    assert fixtures.EXECUTED["lookup_stock"] == [{"sku": "A-1", "warehouse": 1}]


def test_a_write_call_flushes_the_sink_first_and_writes_its_own_events(local) -> None:
    sink = Sink()
    call(local, "lookup_stock", {"sku": "A-1"}, sink=sink)
    result = call(local, "send_notice", {"team": "운영", "text": "점검"}, sink=sink)
    assert result.error == "approval:unavailable"  # no approver here: refused, never sent
    assert sink.steps == ["add tool.call ok", "flush 1"]
    assert [(r[3], r[8]) for r in rows()] == [("lookup_stock", ""), ("send_notice", "approval:unavailable")]
    assert "send_notice" not in fixtures.EXECUTED


@pytest.mark.parametrize(
    ("tool", "args", "reason"),
    [("no_such_tool", {}, "tool:unknown"), ("lookup_stock", {"sku": 3}, "args:type:sku")],
)
def test_a_refusal_before_the_call_is_written_after_what_the_sink_holds(local, tool, args, reason) -> None:
    sink = Sink()
    call(local, "lookup_stock", {"sku": "A-1"}, sink=sink)
    call(local, tool, args, sink=sink)
    if reason == "tool:unknown":  # the tool is not known: written at once, after the flush
        assert sink.steps == ["add tool.call ok", "flush 1"]
        assert [r[8] for r in rows()] == ["", reason]
    else:  # a read tool's refusal goes to the sink, after the call before it
        assert sink.steps == ["add tool.call ok", f"add tool.call {reason}"]
        sink.flush()
        assert [r[8] for r in rows()] == ["", reason]


def test_a_write_fallback_is_never_called_and_the_failed_read_attempt_stays_in_the_sink(local) -> None:
    # A row stored before the contract check refused "call" for a write fallback: the gate leaves the write to a
    # model (none here) and writes nothing itself.
    contract(local, "explode", fallback_tool="send_notice", fallback_policy="call", args={})
    sink = Sink()
    result = call(local, "explode", {"reason": "x"}, sink=sink)
    assert not result.ok
    assert sink.steps == ["add tool.call tool:error"]
    assert "send_notice" not in fixtures.EXECUTED
    assert rows() == []


def test_a_refusal_of_a_models_call_is_written_after_what_the_sink_holds(local) -> None:
    sink = Sink()
    call(local, "lookup_stock", {"sku": "A-1"}, sink=sink)
    who = gate.GateCall(source="agent", actor="tester", call_id="c1", audit_sink=sink)
    gate.refuse_unknown(tool_name="invented", args={}, who=who, offered=["lookup_stock"])
    assert sink.steps == ["add tool.call ok", "flush 1"]
    assert [(r[3], r[8]) for r in rows()] == [("lookup_stock", ""), ("invented", "tool:unknown")]
