"""Several tool calls in one model turn (seed 002 §1): independent read calls run concurrently through the
gate, bounded per run and per server, answered in the order asked; memo, breaker and audit behave as they do
for calls made one by one. Local tools are real Python functions bound as a server, and a real stdio MCP server
(``tests/mcp_fixtures/gather_server.py``) counts the calls it holds at once; only the model is scripted.

The calls run on their own database connections, as in production: these tests commit their data
(``transaction=True``).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest
from django.conf import settings as django_settings

from agents.execution import run_execute
from agents.models import Approval, Run
from agents.services import agent_version_publish, run_create
from audit.models import AuditEvent
from mcpregistry import gate
from mcpregistry.models import McpServer, ToolContract
from mcpregistry.services import tool_contract_update
from tests import local_tool_fixtures as fixtures
from tests import parallel_tool_fixtures as parallel_fixtures
from tests.conftest import discover_as_admin, make_agent

pytestmark = pytest.mark.django_db(transaction=True)

MODULE = "tests.local_tool_fixtures"
PARALLEL_MODULE = "tests.parallel_tool_fixtures"


@pytest.fixture(autouse=True)
def allowed_modules(settings):
    settings.PLATFORM_LOCAL_TOOL_MODULES = ["mcpregistry.builtin_tools", MODULE, PARALLEL_MODULE]
    settings.PLATFORM_PARALLEL_TOOL_CALLS = 4
    settings.PLATFORM_PARALLEL_TOOL_CALLS_PER_SERVER = 2
    fixtures.EXECUTED.clear()
    parallel_fixtures.RENDEZVOUS.reset()


def bind_local(mcp_id: str = "local-test", **fields) -> McpServer:
    server = McpServer(
        mcp_id=mcp_id,
        name=mcp_id,
        transport=McpServer.Transport.LOCAL,
        args=[MODULE, PARALLEL_MODULE],
        timeout_s=10,
        **fields,
    )
    server.full_clean()
    server.save()
    report = discover_as_admin(server=server)
    assert report.ok, report.error
    ToolContract.objects.filter(tool__server=server).exclude(tool__name="send_notice").update(risk="read")
    return server


def run_turn(server: McpServer, calls: list[dict], then: list[dict] | None = None) -> Run:
    agent = make_agent(
        slug="parallel",
        servers=[server],
        provider="scripted",
        with_demo_rules=False,
        script=[{"tool_calls": calls}, *(then or []), {"content": "done"}],
    )
    run = Run.objects.create(agent=agent, query="q")
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    return run


def tool_messages(run: Run) -> list[dict]:
    return [m for m in run.conversation if m["type"] == "tool"]


def data_of(content: str) -> Any:
    """A tool answer as the model read it: the value inside its ``<tool_data>`` block."""
    assert content.startswith("<tool_data>\n") and content.endswith("\n</tool_data>"), content
    return json.loads(content.removeprefix("<tool_data>\n").removesuffix("\n</tool_data>"))


def batches(run: Run) -> list[dict]:
    return [m for m in run.messages if m.get("type") == "parallel_calls"]


def test_two_read_calls_of_one_turn_overlap_and_come_back_in_the_order_asked() -> None:
    server = bind_local()
    run = run_turn(
        server,
        [
            {"id": "c-1", "name": "rendezvous", "args": {"label": "first"}},
            {"id": "c-2", "name": "rendezvous", "args": {"label": "second"}},
        ],
    )
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    # Each call waited at the barrier for the other: they were in flight together.
    answers = [(m["data"]["tool_call_id"], data_of(m["data"]["content"])) for m in tool_messages(run)]
    assert answers == [("c-1", "met first"), ("c-2", "met second")]
    (batch,) = batches(run)
    assert batch["max_overlap"] == 2
    assert [c["call_id"] for c in batch["calls"]] == ["c-1", "c-2"]
    events = AuditEvent.objects.filter(run_id=run.id, action="tool.call").order_by("id")
    assert sorted(events.values_list("call_id", "ok", "attempt")) == [("c-1", True, 1), ("c-2", True, 1)]


@pytest.mark.slow
def test_with_parallel_calls_off_the_same_turn_runs_one_by_one(settings) -> None:
    settings.PLATFORM_PARALLEL_TOOL_CALLS = 1
    server = bind_local()
    run = run_turn(
        server,
        [
            {"id": "c-1", "name": "rendezvous", "args": {"label": "first"}},
            {"id": "c-2", "name": "rendezvous", "args": {"label": "second"}},
        ],
    )
    assert batches(run) == []
    # Alone at the barrier, each call times out there: proof the barrier test above can fail.
    assert [m["data"]["status"] for m in tool_messages(run)] == ["error", "error"]


def test_the_per_server_bound_holds_calls_to_one_server_to_that_many_at_once(settings) -> None:
    settings.PLATFORM_PARALLEL_TOOL_CALLS_PER_SERVER = 1
    server = bind_local()
    run = run_turn(
        server,
        [
            {"id": "s-1", "name": "sleepy", "args": {"seconds": 0.2}},
            {"id": "s-2", "name": "sleepy", "args": {"seconds": 0.3}},
        ],
    )
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    (batch,) = batches(run)
    assert batch["max_overlap"] == 1


def test_a_repeated_call_in_the_same_turn_is_answered_by_the_memo_not_run_twice() -> None:
    server = bind_local()
    run = run_turn(
        server,
        [
            {"id": "m-1", "name": "lookup_stock", "args": {"sku": "X-1"}},
            {"id": "m-2", "name": "lookup_stock", "args": {"sku": "X-2"}},
            {"id": "m-3", "name": "lookup_stock", "args": {"sku": "X-1"}},
        ],
    )
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert sorted(a["sku"] for a in fixtures.EXECUTED["lookup_stock"]) == ["X-1", "X-2"]
    memo = AuditEvent.objects.get(run_id=run.id, call_id="m-3")
    assert (memo.reason, memo.ok) == ("memo:hit", True)
    assert [m["data"]["tool_call_id"] for m in tool_messages(run)] == ["m-1", "m-2", "m-3"]
    assert [c["call_id"] for c in batches(run)[0]["calls"]] == ["m-1", "m-2"]


def test_concurrent_failures_open_the_breaker_as_sequential_ones_do() -> None:
    server = bind_local(breaker_threshold=2, breaker_cooldown_s=600)
    ToolContract.objects.filter(tool__server=server, tool__name="sleepy").update(
        timeout_s=0.3, retry={"max_attempts": 1}
    )
    run = run_turn(
        server,
        [
            {"id": "t-1", "name": "sleepy", "args": {"seconds": 1.0}},
            {"id": "t-2", "name": "sleepy", "args": {"seconds": 1.1}},
        ],
        then=[{"tool_calls": [{"id": "t-3", "name": "sleepy", "args": {"seconds": 0.01}}]}],
    )
    assert batches(run)[0]["max_overlap"] == 2
    server.refresh_from_db()
    assert (server.breaker_state, server.breaker_failures) == (McpServer.BreakerState.OPEN, 2)
    reasons = dict(AuditEvent.objects.filter(run_id=run.id, action="tool.call").values_list("call_id", "reason"))
    assert reasons == {"t-1": "timeout", "t-2": "timeout", "t-3": "circuit:open"}


def test_a_write_call_stays_sequential_and_parks_the_run_after_the_reads_before_it() -> None:
    server = bind_local()
    run = run_turn(
        server,
        [
            {"id": "r-1", "name": "lookup_stock", "args": {"sku": "A"}},
            {"id": "r-2", "name": "lookup_stock", "args": {"sku": "B"}},
            {"id": "w-1", "name": "send_notice", "args": {"team": "ops", "text": "hi"}},
            {"id": "r-3", "name": "lookup_stock", "args": {"sku": "C"}},
        ],
    )
    assert run.status == Run.Status.AWAITING_APPROVAL
    assert [c["call_id"] for c in batches(run)[0]["calls"]] == ["r-1", "r-2"]
    assert fixtures.EXECUTED["send_notice"] == []
    assert sorted(a["sku"] for a in fixtures.EXECUTED["lookup_stock"]) == ["A", "B"]


def run_published_version_with_a_draft_read_write() -> tuple[Run, McpServer]:
    """A published version froze send_notice as a write; the draft then made it a read. The run (of the version)
    asks for a read and send_notice in one turn."""
    server = bind_local()
    agent = make_agent(
        slug="parallel-version",
        servers=[server],
        provider="scripted",
        with_demo_rules=False,
        script=[
            {
                "tool_calls": [
                    {"id": "r-1", "name": "lookup_stock", "args": {"sku": "A"}},
                    {"id": "w-1", "name": "send_notice", "args": {"team": "ops", "text": "hi"}},
                ]
            },
            {"content": "done"},
        ],
    )
    agent_version_publish(agent=agent, actor="test-admin", via="tests")
    notice = ToolContract.objects.get(tool__server=server, tool__name="send_notice")
    tool_contract_update(contract=notice, actor="test-admin", via="tests", data={"risk": "read"})
    run = run_create(agent_slug=agent.slug, query="q", api_key=None)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    return run, server


def assert_parked_on_the_write(run: Run) -> None:
    assert run.status == Run.Status.AWAITING_APPROVAL, run.error_message
    approval = Approval.objects.get(run=run)
    assert (approval.tool, approval.status) == ("send_notice", Approval.Status.PENDING)
    assert fixtures.EXECUTED["send_notice"] == []
    assert [m["data"]["tool_call_id"] for m in tool_messages(run)] == ["r-1"]


def test_a_write_frozen_in_the_published_version_stays_sequential_though_the_draft_calls_it_read() -> None:
    run, _server = run_published_version_with_a_draft_read_write()
    assert_parked_on_the_write(run)
    assert batches(run) == []  # the write was not batched with the read


def test_a_batched_call_the_gate_parks_parks_the_run_and_its_approval_is_not_lost(monkeypatch) -> None:
    # The batch check and the gate disagree (the check reads the draft's contract, as it once did): the write
    # slips into the batch, and the gate, applying the frozen contract, parks it.
    monkeypatch.setattr(gate, "contract_applied", lambda *, who, server, tool: gate.contract_for(tool))
    run, _server = run_published_version_with_a_draft_read_write()
    assert [c["call_id"] for c in batches(run)[0]["calls"]] == ["r-1", "w-1"]
    assert_parked_on_the_write(run)


# ---- through a real MCP transport --------------------------------------------------------------------------------

GATHER_SERVER = "tests.mcp_fixtures.gather_server"


def bind_gather_server() -> McpServer:
    """The stdio fixture server that records how many calls it held at once (one process per run)."""
    server = McpServer.objects.create(
        mcp_id="gather",
        name="gather",
        command=sys.executable,
        args=["-m", GATHER_SERVER],
        cwd=str(django_settings.BASE_DIR),
        timeout_s=10,
    )
    report = discover_as_admin(server=server)
    assert report.ok, report.error
    return server


def gather_calls(count: int, *, parties: int, wait_s: float) -> list[dict]:
    return [
        {"id": f"g-{n}", "name": "gather", "args": {"label": f"call {n}", "parties": parties, "wait_s": wait_s}}
        for n in range(1, count + 1)
    ]


def gathered(run: Run) -> list[dict]:
    return [_parsed(data_of(m["data"]["content"])) for m in tool_messages(run)]


def _parsed(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


@pytest.mark.slow
def test_read_calls_to_a_stdio_server_are_in_flight_there_together_and_come_back_in_the_order_asked() -> None:
    run = run_turn(bind_gather_server(), gather_calls(2, parties=2, wait_s=5))
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    # The server saw both calls at once: each waited for the other and met it.
    assert gathered(run) == [
        {"label": "call 1", "met": True, "peak": 2},
        {"label": "call 2", "met": True, "peak": 2},
    ]
    assert [m["data"]["tool_call_id"] for m in tool_messages(run)] == ["g-1", "g-2"]
    assert batches(run)[0]["max_overlap"] == 2
    events = AuditEvent.objects.filter(run_id=run.id, action="tool.call", tool="gather")
    assert sorted(events.values_list("call_id", "ok")) == [("g-1", True), ("g-2", True)]


@pytest.mark.slow
def test_one_by_one_the_stdio_server_never_holds_two_calls_at_once(settings) -> None:
    settings.PLATFORM_PARALLEL_TOOL_CALLS = 1
    run = run_turn(bind_gather_server(), gather_calls(2, parties=2, wait_s=0.5))
    # Proof the test above can fail: sent one after another, neither call meets the other.
    assert [(a["met"], a["peak"]) for a in gathered(run)] == [(False, 1), (False, 1)]


@pytest.mark.slow
def test_a_batch_larger_than_the_per_run_bound_has_at_most_that_many_calls_in_flight(settings) -> None:
    settings.PLATFORM_PARALLEL_TOOL_CALLS = 2
    settings.PLATFORM_PARALLEL_TOOL_CALLS_PER_SERVER = 4
    run = run_turn(bind_gather_server(), gather_calls(3, parties=3, wait_s=1))
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    answers = gathered(run)
    # Three calls in one batch, never three at the server at once; the first two waited there together.
    assert [c["call_id"] for c in batches(run)[0]["calls"]] == ["g-1", "g-2", "g-3"]
    assert [a["label"] for a in answers] == ["call 1", "call 2", "call 3"]
    assert not any(a["met"] for a in answers)
    assert [a["peak"] for a in answers] == [2, 2, 2]
    assert batches(run)[0]["max_overlap"] == 2


def test_a_batch_holds_no_more_calls_of_a_tool_than_its_correction_cap_leaves() -> None:
    server = bind_local()
    tool_contract_update(
        contract=ToolContract.objects.get(tool__server=server, tool__name="lookup_stock"),
        actor="admin",
        via="tests",
        data={"correction_cap": 2},
    )
    run = run_turn(
        server,
        [
            {"id": "b-1", "name": "lookup_stock", "args": {"warehouse": 1}},
            {"id": "b-2", "name": "lookup_stock", "args": {"warehouse": 2}},
            {"id": "b-3", "name": "lookup_stock", "args": {"sku": "X-1"}},
        ],
    )
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    # Two argument errors reach the cap: the third call, beyond it, is refused as it would be one by one.
    reasons = dict(AuditEvent.objects.filter(run_id=run.id).values_list("call_id", "reason"))
    assert reasons == {"b-1": "args:missing:sku", "b-2": "args:missing:sku", "b-3": "tool:withdrawn"}
    assert fixtures.EXECUTED.get("lookup_stock", []) == []
    assert [c["call_id"] for c in batches(run)[0]["calls"]] == ["b-1", "b-2"]
    assert [m for m in run.messages if m.get("type") == "tool_withdrawn"] == [
        {"type": "tool_withdrawn", "tool": "lookup_stock", "corrections": 2}
    ]


def test_a_fan_out_of_well_formed_calls_to_one_tool_stays_one_batch_whatever_its_cap() -> None:
    server = bind_local()
    tool_contract_update(
        contract=ToolContract.objects.get(tool__server=server, tool__name="lookup_stock"),
        actor="admin",
        via="tests",
        data={"correction_cap": 2},
    )
    calls = [{"id": f"f-{n}", "name": "lookup_stock", "args": {"sku": f"X-{n}"}} for n in range(1, 5)]
    run = run_turn(server, calls)
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert [c["call_id"] for c in batches(run)[0]["calls"]] == ["f-1", "f-2", "f-3", "f-4"]


def test_the_gate_spans_of_a_batch_belong_to_the_runs_trace(spans) -> None:
    server = bind_local()
    run = run_turn(
        server,
        [
            {"id": "c-1", "name": "rendezvous", "args": {"label": "first"}},
            {"id": "c-2", "name": "rendezvous", "args": {"label": "second"}},
        ],
    )
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert batches(run)[0]["max_overlap"] == 2
    finished = spans.get_finished_spans()
    (invoke,) = [s for s in finished if s.name == "invoke_agent parallel"]
    calls = [s for s in finished if s.name == "execute_tool rendezvous"]
    assert len(calls) == 2
    assert all(c.context.trace_id == invoke.context.trace_id for c in calls)
    assert all(c.parent is not None and c.parent.span_id == invoke.context.span_id for c in calls)
