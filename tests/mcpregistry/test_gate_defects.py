"""The gate's confirmed defects, each pinned: a keyed write whose send went out unanswered ends outcome unknown
(never "not done", never handed to a fallback); a write's fallback is never called; a remembered success is checked
against the contract that applies now; FastMCP's wrapped values are the tool's values; a tool's own error returned
as a value is never remembered; a number outside every range (NaN) or that is no number is refused; seed 001's
backoff."""

from __future__ import annotations

import json
import random
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.cache import cache
from django.core.exceptions import ValidationError

from agents.execution import run_execute
from agents.models import Approval
from audit.models import AuditEvent
from audit.visible import tool_data_block
from mcpregistry import gate
from mcpregistry.contracts import DEFAULT_RETRY, backoff_delay, check_args, check_result
from mcpregistry.models import McpServer, ToolContract
from mcpregistry.pool import get_default_pool
from tests.conftest import discover_as_admin
from tests.mcp_fixtures.scripts import script_file
from tests.mcpregistry.test_at_most_once import approved_run, lines, side_effect_server
from tests.mcpregistry.test_gate import call, contract, probe

SERVERS = (
    "keyed-once",
    "keyed-not-on",
    "keyed-run",
    "keyed-breaker",
    "write-429-call",
    "write-429-suggest",
    "write-unreachable",
    "memo-now",
    "memo-in-run",
    "list-server",
    "error-dict",
)


@pytest.fixture
def file(tmp_path: Path) -> Path:
    return tmp_path / "side-effects.txt"


@pytest.fixture(autouse=True)
def _close() -> Any:
    yield
    for mcp_id in SERVERS:
        get_default_pool().close(mcp_id)


def sandboxed(server: McpServer) -> gate.GateCall:
    return gate.GateCall(
        source="eval", run_id=uuid.uuid4(), call_id="c1", writes_blocked=True, write_sandbox=frozenset({server.mcp_id})
    )


def reloaded(server: McpServer) -> McpServer:
    return McpServer.objects.prefetch_related("tools__contract").get(pk=server.pk)


# ---- 1. a keyed write sent and unanswered -------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("mcp_id", "retry"),
    [("keyed-once", {"max_attempts": 1}), ("keyed-not-on", {"max_attempts": 3, "on": ["rate_limit"]})],
)
@pytest.mark.slow
def test_a_keyed_write_sent_and_unanswered_is_outcome_unknown_and_never_handed_to_its_fallback(
    file: Path, mcp_id: str, retry: dict[str, Any]
) -> None:
    # Its one allowed send (the cap, or a transport error its contract does not retry) goes out and the server dies
    # before answering.
    server = side_effect_server(mcp_id, file, mode="exit")
    ToolContract.objects.filter(tool__server=server, tool__name="append_line").update(
        idempotency_arg="idempotency_key",
        retry=retry,
        fallback_tool="append_line_backup",
        fallback_policy=ToolContract.FallbackPolicy.CALL,  # a row stored before the contract check refused it
    )

    result = gate.call(server=reloaded(server), tool_name="append_line", args={"text": "송금"}, who=sandboxed(server))

    assert len(lines(file)) == 1, lines(file)  # the backup never wrote it a second time
    assert result.error == "approval:outcome_unknown", result.error
    assert "may or may not have taken effect" in result.message
    assert not AuditEvent.objects.filter(tool="append_line_backup", action="tool.call").exists()
    assert not AuditEvent.objects.filter(action="tool.fallback").exists()


@pytest.mark.django_db
@pytest.mark.slow
def test_a_keyed_write_sent_and_unanswered_in_a_run_ends_its_approval_outcome_unknown(file: Path) -> None:
    server = side_effect_server("keyed-run", file, mode="exit")
    ToolContract.objects.filter(tool__server=server, tool__name="append_line").update(
        idempotency_arg="idempotency_key", retry={"max_attempts": 1}, fallback_tool="append_line_backup"
    )
    run, approval = approved_run(server)

    run_execute(run_id=str(run.id))

    assert len(lines(file)) == 1  # the write happened
    approval.refresh_from_db()
    assert approval.status == Approval.Status.OUTCOME_UNKNOWN, (approval.status, approval.result)
    run.refresh_from_db()
    [tool_message] = [m for m in run.messages if m["type"] == "tool"]
    assert "append_line_backup" not in tool_message["content"]  # no fallback suggested for it
    assert "반영 여부를 알 수 없습니다" in run.answer  # "may or may not have taken effect", in the agent's language


@pytest.mark.django_db
@pytest.mark.slow
def test_a_keyed_write_whose_retry_meets_an_open_circuit_is_outcome_unknown(file: Path) -> None:
    # A live run's approved write: its own first failure opens the breaker (an eval's or a shadow's never does).
    server = side_effect_server("keyed-breaker", file, mode="exit")
    McpServer.objects.filter(pk=server.pk).update(breaker_threshold=1, breaker_cooldown_s=600)
    ToolContract.objects.filter(tool__server=server, tool__name="append_line").update(
        idempotency_arg="idempotency_key", retry={"max_attempts": 3, "backoff_base_s": 0.01}
    )
    run, approval = approved_run(server)

    run_execute(run_id=str(run.id))

    assert len(lines(file)) == 1
    # Not "the server failed repeatedly and is paused": the first send's effect is not forgotten.
    approval.refresh_from_db()
    assert approval.status == Approval.Status.OUTCOME_UNKNOWN, (approval.status, approval.result)
    calls = AuditEvent.objects.filter(tool="append_line", action="tool.call").order_by("id")
    assert [(e.attempt, e.reason) for e in calls] == [(1, "transport"), (2, "circuit:open")]


# ---- 2. a write's fallback ----------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db
def test_a_write_answered_with_its_own_error_is_not_written_again_by_a_called_fallback(file: Path) -> None:
    # The gate refuses to resend append_line (its 429 may come after the work was done): no other write tool does it.
    server = side_effect_server("write-429-call", file, mode="report-rate-limit")
    ToolContract.objects.filter(tool__server=server, tool__name="append_line").update(
        fallback_tool="append_line_backup", fallback_policy=ToolContract.FallbackPolicy.CALL
    )

    result = gate.call(server=reloaded(server), tool_name="append_line", args={"text": "송금"}, who=sandboxed(server))

    assert lines(file) == ["송금\t"]  # the backup never ran
    assert result.error == "rate_limit"
    assert "append_line_backup" not in result.message
    assert not AuditEvent.objects.filter(action="tool.fallback").exists()


@pytest.mark.slow
@pytest.mark.django_db
def test_a_write_that_reached_its_tool_is_not_suggested_a_fallback(file: Path) -> None:
    server = side_effect_server("write-429-suggest", file, mode="report-rate-limit")
    ToolContract.objects.filter(tool__server=server, tool__name="append_line").update(
        fallback_tool="append_line_backup"
    )

    result = gate.call(server=reloaded(server), tool_name="append_line", args={"text": "송금"}, who=sandboxed(server))

    assert (result.ok, result.error) == (False, "rate_limit")
    assert "append_line_backup" not in result.message  # the model is not told to write it again elsewhere


@pytest.mark.slow
@pytest.mark.django_db
def test_a_write_whose_server_could_not_be_reached_may_be_suggested_its_fallback(file: Path) -> None:
    # Nothing was sent (the server's process does not start): nothing was done, and the model may ask for the
    # fallback (with its own approval); the gate itself never calls it.
    server = side_effect_server("write-unreachable", file, mode="ok")
    ToolContract.objects.filter(tool__server=server, tool__name="append_line").update(
        fallback_tool="append_line_backup", retry={"max_attempts": 2, "backoff_base_s": 0.01}
    )
    get_default_pool().close(server.mcp_id)
    McpServer.objects.filter(pk=server.pk).update(args=[script_file("import sys; sys.exit(3)")])

    result = gate.call(server=reloaded(server), tool_name="append_line", args={"text": "송금"}, who=sandboxed(server))

    assert (result.ok, result.error) == (False, "transport"), (result.error, result.message)
    assert "append_line_backup" in result.message
    assert lines(file) == []
    assert not AuditEvent.objects.filter(action="tool.fallback").exists()


@pytest.mark.django_db
def test_a_write_contract_refuses_the_call_fallback_policy() -> None:
    server = McpServer.objects.create(
        mcp_id="contract-check",
        name="contract-check",
        command=sys.executable,
        args=["-m", "tests.mcp_fixtures.side_effect_server"],
        cwd=str(settings.BASE_DIR),
    )
    tool = server.tools.create(
        name="append_line", input_schema={"type": "object", "properties": {"text": {"type": "string"}}}
    )
    server.tools.create(
        name="append_line_backup", input_schema={"type": "object", "properties": {"text": {"type": "string"}}}
    )
    written = ToolContract(tool=tool, risk="write", fallback_tool="append_line_backup", fallback_policy="call")
    with pytest.raises(ValidationError) as refused:
        written.clean()
    assert "fallback_policy" in refused.value.message_dict
    assert "never called" in refused.value.message_dict["fallback_policy"][0]
    ToolContract(tool=tool, risk="write", fallback_tool="append_line_backup", fallback_policy="suggest").clean()
    ToolContract(tool=tool, risk="read", fallback_tool="append_line_backup", fallback_policy="call").clean()


# ---- 3. a memo hit is checked against the contract that applies now ------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db
def test_a_memo_hit_across_runs_is_checked_against_the_contract_that_applies_now() -> None:
    server = probe("memo-now")
    cache.clear()
    contract(server, "count_calls", risk="read", memo_ttl_s=600)
    assert call(server, "count_calls", {"key": "k"}, memo={}).value == "k:1"
    # The admin tightens the result check (or a published version froze a stricter one): a dict is required.
    contract(server, "count_calls", returns={"type": "dict"})
    again = call(server, "count_calls", {"key": "k"}, memo={})
    assert (again.ok, again.error, again.memo_hit) == (False, "result:shape", False)
    # Its size cap too.
    contract(server, "count_calls", returns={"max_chars": 2})
    capped = call(server, "count_calls", {"key": "k"}, memo={})
    assert (capped.error, capped.memo_hit) == ("result:too_big", False)


@pytest.mark.slow
@pytest.mark.django_db
def test_a_memo_hit_in_a_run_is_checked_against_the_contract_that_applies_now() -> None:
    server = probe("memo-in-run")
    contract(server, "count_calls", risk="read")
    memo: dict[str, gate.ToolResult] = {}
    assert call(server, "count_calls", {"key": "k"}, memo=memo).value == "k:1"
    assert call(server, "count_calls", {"key": "k"}, memo=memo).memo_hit
    contract(server, "count_calls", returns={"type": "dict"})
    again = call(server, "count_calls", {"key": "k"}, memo=memo)
    assert (again.ok, again.error, again.memo_hit) == (False, "result:shape", False)


# ---- 4. FastMCP's wrapped values, 5. a tool's own error as a value -------------------------------------------------


@pytest.fixture
def list_server(db) -> McpServer:  # type: ignore[no-untyped-def]
    server = McpServer.objects.create(
        mcp_id="list-server",
        name="list-server",
        command=sys.executable,
        args=["-m", "tests.mcp_fixtures.list_server"],
        cwd=str(settings.BASE_DIR),
        session_scope="shared",
        timeout_s=10,
    )
    assert discover_as_admin(server=server).ok
    ToolContract.objects.filter(tool__server=server).update(risk="read")
    return reloaded(server)


@pytest.mark.slow
def test_an_empty_list_result_is_empty_and_a_list_is_a_list(list_server: McpServer) -> None:
    who = gate.GateCall(source="admin")
    contract(list_server, "stock_rows", returns={"non_empty": True})
    server = reloaded(list_server)
    one = gate.call(server=server, tool_name="stock_rows", args={"sku": "A", "n": 1}, who=who)
    none = gate.call(server=server, tool_name="stock_rows", args={"sku": "A", "n": 0}, who=who)
    assert one.ok and one.value == [{"region": "seoul", "qty": 3}]
    # FastMCP sends [] as no content block and {"result": []}: the tool's value is [], an empty answer.
    assert (none.ok, none.error) == (False, "result:empty"), (none.ok, none.error, none.value)

    contract(list_server, "stock_rows", returns={"type": "list"})
    empty = gate.call(server=reloaded(list_server), tool_name="stock_rows", args={"sku": "A", "n": 0}, who=who)
    assert (empty.ok, empty.value) == (True, [])


@pytest.mark.slow
def test_an_empty_string_result_is_the_empty_string(list_server: McpServer) -> None:
    who = gate.GateCall(source="admin")
    assert gate.call(server=list_server, tool_name="note_text", args={"n": 2}, who=who).value == "가가"
    empty = gate.call(server=list_server, tool_name="note_text", args={"n": 0}, who=who)
    assert (empty.ok, empty.value) == (True, "")
    contract(list_server, "note_text", returns={"non_empty": True})
    refused = gate.call(server=reloaded(list_server), tool_name="note_text", args={"n": 0}, who=who)
    assert refused.error == "result:empty"


@pytest.mark.slow
def test_a_seed_002_error_dict_is_handed_to_the_model_and_never_memoized(list_server: McpServer) -> None:
    cache.clear()
    contract(list_server, "classify_domain_group", memo_ttl_s=600)
    server = reloaded(list_server)
    memo: dict[str, gate.ToolResult] = {}
    who = gate.GateCall(source="agent", memo=memo)
    args = {"term_korean": "환자식별번호"}
    first = gate.call(server=server, tool_name="classify_domain_group", args=args, who=who)
    # The tool's own words reach the model as it wrote them (seed 002 §8: it decides to skip, retry or use another
    # tool), as the data of a failed call (s43: ``tool:error_value``); the retry it asks for reaches the tool.
    assert (first.ok, first.error) == (False, "tool:error_value")
    assert first.for_model().endswith(
        tool_data_block('{"error": "domain_classifier_unavailable", "fallback": "retry"}')
    )
    assert memo == {}
    again = gate.call(server=server, tool_name="classify_domain_group", args=args, who=who)
    assert not again.memo_hit and again.value == {"group": "환자정보", "confidence": 0.87}, again.as_dict()
    third = gate.call(server=server, tool_name="classify_domain_group", args=args, who=gate.GateCall(source="agent"))
    assert third.memo_hit and third.value == again.value  # the success is remembered, across runs too


def test_a_remembered_error_dict_is_a_miss() -> None:
    assert not gate._memo_fits(ToolContract(), {"error": "backend down", "fallback": "retry"})
    assert gate._memo_fits(ToolContract(), {"error": None, "rows": [1]})
    assert gate._memo_fits(ToolContract(), {"errors": 3})


# ---- 6. numbers outside every range -------------------------------------------------------------------------------


def test_a_result_range_is_not_bypassed_by_a_numeric_string_or_a_bool() -> None:
    returns = {"fields": {"days": {"min": 1, "max": 14}}}
    assert check_result(returns, {"days": 720}).reason == "result:range"
    assert check_result(returns, {"days": 7}) is None
    assert check_result(returns, {"days": 7.5}) is None
    assert check_result(returns, {"other": 1}) is None  # absent: not checked
    for wrong in ("720", "7", True, [7], {"v": 7}):
        verdict = check_result(returns, {"days": wrong})
        assert verdict is not None and verdict.reason == "result:shape", wrong


def test_nan_and_infinity_are_inside_no_range() -> None:
    spec = {"limit": {"type": "float", "required": True, "min": 1, "max": 2}}
    # A model's tool call parsed by json.loads (langchain-openai does) may carry NaN.
    _args, verdict = check_args(spec, json.loads('{"limit": NaN}'))
    assert verdict is not None and verdict.reason == "args:type:limit"
    _args, verdict = check_args({"limit": {"type": "float", "min": 1}}, json.loads('{"limit": Infinity}'))
    assert verdict is not None and verdict.reason == "args:type:limit"
    _args, verdict = check_args({"limit": {"type": "float"}}, {"limit": float("nan")})
    assert verdict is not None and verdict.reason == "args:type:limit"
    assert check_args(spec, {"limit": 1.5}) == ({"limit": 1.5}, None)
    for wrong in (float("nan"), float("inf"), float("-inf")):
        verdict = check_result({"fields": {"ratio": {"min": 0, "max": 1}}}, {"ratio": wrong})
        assert verdict is not None and verdict.reason == "result:shape", wrong


# ---- 8. seed 001's backoff ----------------------------------------------------------------------------------------


def test_the_default_backoff_waits_about_2_then_4_seconds_like_seed_001() -> None:
    assert DEFAULT_RETRY["backoff_base_s"] == 2.0
    rng = random.Random(7)
    first = backoff_delay(reason="rate_limit", attempt=1, retry={}, retry_after_s=None, rng=rng)
    second = backoff_delay(reason="rate_limit", attempt=2, retry={}, retry_after_s=None, rng=rng)
    assert 2.0 <= first <= 2.5 and 4.0 <= second <= 5.0  # at least 2 s, then 4 s; jitter only lengthens
