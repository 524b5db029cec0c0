"""The gate against real MCP servers (the demo server and the probe server over stdio)."""

from __future__ import annotations

import logging
import sys
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.conf import settings
from django.core.cache import cache
from django.utils import timezone

from audit.models import AuditEvent
from mcpregistry import gate
from mcpregistry.models import McpServer, ToolContract
from mcpregistry.pool import get_default_pool
from tests.conftest import DEMO_SECRET, bind_demo_server, discover_as_admin

pytestmark = pytest.mark.django_db


def probe(mcp_id: str = "probe", **env: str) -> McpServer:
    server = McpServer.objects.create(
        mcp_id=mcp_id,
        name=mcp_id,
        command=sys.executable,
        args=["-m", "tests.mcp_fixtures.probe_server"],
        cwd=str(settings.BASE_DIR),
        env=env,
        session_scope="shared",
        timeout_s=10,
    )
    assert discover_as_admin(server=server).ok
    return server


def contract(server: McpServer, tool: str, **values) -> None:  # type: ignore[no-untyped-def]
    ToolContract.objects.filter(tool__server=server, tool__name=tool).update(**values)


def call(server: McpServer, tool: str, args, memo=None, **who) -> gate.ToolResult:  # type: ignore[no-untyped-def]
    server = McpServer.objects.prefetch_related("tools__contract").get(pk=server.pk)
    return gate.call(server=server, tool_name=tool, args=args, who=gate.GateCall(source="admin", memo=memo, **who))


def events(tool: str) -> list[tuple]:
    calls = AuditEvent.objects.filter(tool=tool).exclude(action__startswith="config.")
    return list(calls.order_by("id").values_list("ok", "reason", "attempt"))


@pytest.fixture(scope="module")
def _one_probe_process() -> Iterator[None]:
    """The tests of this module that take ``probe_server`` share one probe process: each test binds it anew (its
    database rows are rolled back), and the pool gives an equal binding the session it keeps (a start of the
    probe is most of such a test's time). The process keeps what its tools count per key: each test uses keys of
    its own (``count_calls``, ``flaky``). Closed after the module's last test."""
    yield
    get_default_pool().close("probe")


@pytest.fixture
def probe_server(db, _one_probe_process: None) -> McpServer:
    return probe()


@pytest.mark.slow
def test_arguments_are_checked_before_the_call_and_the_refusal_is_audited(probe_server) -> None:
    result = call(probe_server, "count_calls", {"key": 5})
    assert (result.ok, result.error, result.attempts) == (False, "args:type:key", 0)
    assert "must be of type str" in result.message and "Fix the argument" in result.message
    assert call(probe_server, "count_calls", {"key": "first"}).value == "first:1"
    assert events("count_calls")[0] == (False, "args:type:key", 0)


@pytest.mark.slow
def test_an_invented_argument_name_is_refused(probe_server) -> None:
    result = call(probe_server, "count_calls", {"key_id": "x"})
    assert result.error == "args:unknown:key_id"


@pytest.mark.slow
def test_a_tool_without_arguments_refuses_an_invented_one_before_sending(db) -> None:
    server = bind_demo_server()  # the suite's demo binding: its pooled session (and process) is shared
    result = call(server, "ping", {"verbose": True})
    assert (result.ok, result.error, result.attempts) == (False, "args:unknown:verbose", 0)
    assert "takes no arguments" in result.message
    assert call(server, "ping", {}).value == "pong"
    assert events("ping") == [(False, "args:unknown:verbose", 0), (True, "", 1)]


@pytest.mark.slow
def test_a_tool_the_server_does_not_have_is_refused(probe_server) -> None:
    result = call(probe_server, "drop_tables", {})
    assert result.error == "tool:unknown"
    assert "count_calls" in result.message


@pytest.mark.slow
def test_a_success_is_memoized_within_a_run_and_the_body_runs_once(probe_server) -> None:
    memo: dict = {}
    first = call(probe_server, "count_calls", {"key": "m"}, memo=memo)
    second = call(probe_server, "count_calls", {"key": "m"}, memo=memo)
    assert first.value == second.value == "m:1"
    assert second.memo_hit
    assert events("count_calls") == [(True, "", 1), (True, "memo:hit", 0)]


@pytest.mark.slow
def test_a_failure_is_never_memoized(probe_server) -> None:
    memo: dict = {}
    first = call(probe_server, "flaky", {"key": "f"}, memo=memo)
    second = call(probe_server, "flaky", {"key": "f"}, memo=memo)
    assert (first.ok, first.error) == (False, "tool:error")
    assert (second.ok, second.value) == (True, "f:ok:2")  # the body ran twice


@pytest.mark.slow
def test_a_read_tool_may_reuse_a_result_across_runs_for_its_ttl(probe_server) -> None:
    cache.clear()
    contract(probe_server, "count_calls", memo_ttl_s=60)
    assert call(probe_server, "count_calls", {"key": "ttl"}, memo={}).value == "ttl:1"
    again = call(probe_server, "count_calls", {"key": "ttl"}, memo={})
    assert (again.value, again.memo_hit) == ("ttl:1", True)


@pytest.mark.slow
def test_a_rate_limit_is_retried_with_exponential_backoff(db, gate_clock) -> None:
    server = bind_demo_server(mcp_id="limited", failure_mode="rate_limit")
    result = call(server, "get_asset_status", {"asset_id": "A-1001"})
    assert (result.ok, result.error, result.attempts) == (False, "rate_limit", 3)
    first, second = gate_clock.slept
    assert 2.0 <= first <= 2.5 and 4.0 <= second <= 5.0  # base 2 s, cap 4 s, up to a quarter more
    assert "get_asset_status_backup" in result.message
    assert [e[2] for e in events("get_asset_status")] == [1, 2, 3]


@pytest.mark.slow
def test_a_mistyped_failure_mode_is_a_tool_error_sent_once_not_a_rate_limit(db, gate_clock) -> None:
    """The demo server refuses a FAILURE_MODE it does not know, naming the modes (rate_limit among them): the
    gate sends it once and says what the server said, instead of three tries and "use the backup"."""
    server = bind_demo_server(mcp_id="typo", failure_mode="rate-limit")
    result = call(server, "get_asset_status", {"asset_id": "A-1001"})
    assert (result.ok, result.error, result.attempts) == (False, "tool:error", 1)
    assert "FAILURE_MODE 'rate-limit' is not one of none, timeout, rate_limit, bad_schema" in result.message
    assert gate_clock.slept == []


@pytest.mark.slow
def test_a_timeout_is_retried_at_once_each_on_a_fresh_session_and_the_server_still_answers(db, gate_clock) -> None:
    server = bind_demo_server(mcp_id="slow", failure_mode="timeout", FAILURE_TIMEOUT_S="5")
    contract(server, "get_asset_status", timeout_s=0.3)
    pool = get_default_pool()

    def session_of_slow() -> object:
        [session] = [p for p in pool._sessions.values() if p.connection.mcp_id == "slow"]
        return session

    assert call(server, "ping", {}).value == "pong"
    first = session_of_slow()
    result = call(server, "get_asset_status", {"asset_id": "A-1001"})
    assert (result.error, result.attempts) == ("timeout", 3)
    assert gate_clock.slept == [0.0, 0.0]
    # The abandoned calls were cancelled and their sessions retired (a request in a state nobody knows): the next
    # call is answered on a fresh session.
    assert call(server, "ping", {}).value == "pong"
    assert session_of_slow() is not first


@pytest.mark.slow
def test_a_bad_schema_is_not_retried_and_points_to_the_fallback(db, gate_clock) -> None:
    server = bind_demo_server(mcp_id="malformed", failure_mode="bad_schema")
    result = call(server, "get_asset_status", {"asset_id": "A-1001"})
    assert (result.error, result.attempts) == ("result:shape", 1)
    assert "get_asset_status_backup" in result.message
    assert gate_clock.slept == []


def test_a_tools_own_error_names_the_fallback_only_for_when_the_input_was_right(db) -> None:
    """An unknown asset id is the tool's own error: the backup would not know it either, so the model is told to
    correct the id (the tool lists the known ones) and to use the backup only for any other error."""
    server = bind_demo_server()  # the suite's demo binding: its pooled session (and process) is shared
    result = call(server, "get_asset_status", {"asset_id": "A-9999"})
    assert (result.error, result.attempts) == ("tool:error", 1)
    assert "'A-9999' 자산을 찾을 수 없습니다. 등록된 자산: A-1001" in result.message
    assert "correct them or tell the user, and do not use the fallback; otherwise use the fallback tool" in (
        result.message
    )
    assert "get_asset_status_backup" in result.message


@pytest.mark.slow
def test_the_gate_can_call_the_fallback_itself(db) -> None:
    server = bind_demo_server(mcp_id="fallback", failure_mode="bad_schema")
    contract(server, "get_asset_status", fallback_policy="call")
    result = call(server, "get_asset_status", {"asset_id": "A-1001"})
    assert result.ok and result.tool == "get_asset_status_backup"
    assert result.fallback_for == "get_asset_status"
    assert "백업 스냅샷 기준" in result.for_model()
    assert events("get_asset_status_backup") == [(True, "", 1)]
    # The record says why the backup was called: the first tool's failure, handed over by the contract's policy.
    handed = AuditEvent.objects.get(action="tool.fallback")
    assert (handed.tool, handed.ok, handed.reason, handed.attempt) == ("get_asset_status", False, "result:shape", 0)
    assert handed.result == {"fallback_tool": "get_asset_status_backup", "policy": "call"}
    calls = AuditEvent.objects.filter(action__startswith="tool.").order_by("id").values_list("action", "tool")
    assert list(calls) == [
        ("tool.call", "get_asset_status"),
        ("tool.fallback", "get_asset_status"),
        ("tool.call", "get_asset_status_backup"),
    ]


@pytest.mark.slow
def test_a_fallback_the_gate_called_that_failed_too_is_not_suggested_again(db) -> None:
    server = bind_demo_server(mcp_id="fallback-fails", failure_mode="bad_schema")
    contract(server, "get_asset_status", fallback_policy="call")
    contract(server, "get_asset_status_backup", returns={"type": "dict"})  # it answers text: result:shape
    result = call(server, "get_asset_status", {"asset_id": "A-1001"})
    assert (result.ok, result.tool, result.error) == (False, "get_asset_status", "result:shape")
    assert "The fallback tool 'get_asset_status_backup' failed too [result:shape]." in result.message
    assert "Use the fallback tool" not in result.message


@pytest.mark.slow
def test_the_circuit_opens_after_repeated_failures_then_half_opens_and_closes(db) -> None:
    server = probe("breaker", PROBE_MODE="exit_on_call")
    McpServer.objects.filter(pk=server.pk).update(breaker_threshold=2, breaker_cooldown_s=30)
    contract(server, "echo", retry={"max_attempts": 1})
    assert call(server, "echo", {"text": "a"}).error == "transport"
    assert call(server, "echo", {"text": "b"}).error == "transport"
    server.refresh_from_db()
    assert server.breaker_state == "open"
    refused = call(server, "echo", {"text": "c"})
    assert refused.error == "circuit:open"
    assert AuditEvent.objects.filter(tool="echo", reason="circuit:open").count() == 1
    # After the cool-down one trial goes through; its success closes the circuit.
    McpServer.objects.filter(pk=server.pk).update(breaker_opened_at=timezone.now() - timedelta(seconds=31))
    assert call(server, "environment_names", {}).ok
    server.refresh_from_db()
    assert (server.breaker_state, server.breaker_failures) == ("closed", 0)
    get_default_pool().close("breaker")


@pytest.mark.slow
def test_a_failed_trial_reopens_the_circuit(db) -> None:
    server = probe("breaker2", PROBE_MODE="exit_on_call")
    McpServer.objects.filter(pk=server.pk).update(
        breaker_state="open", breaker_opened_at=timezone.now() - timedelta(seconds=60), breaker_threshold=5
    )
    contract(server, "echo", retry={"max_attempts": 1})
    assert call(server, "echo", {"text": "trial"}).error == "transport"
    server.refresh_from_db()
    assert server.breaker_state == "open"
    get_default_pool().close("breaker2")


@pytest.mark.slow
def test_an_unexpected_error_is_not_retried_and_is_logged_masked(probe_server, monkeypatch, caplog) -> None:
    class Exploding:
        def call_tool(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            raise RuntimeError(f"backend said token={DEMO_SECRET}")

    monkeypatch.setattr(gate, "get_default_pool", lambda: Exploding())
    with caplog.at_level(logging.ERROR, logger="mcpregistry.gate"):
        result = call(probe_server, "count_calls", {"key": "boom"})
    assert (result.error, result.attempts) == ("unexpected", 1)
    record = next(r for r in caplog.records if r.name == "mcpregistry.gate")
    # The traceback is kept (masked by the logging filter every handler carries).
    assert "Traceback" in (record.exc_text or "")
    assert DEMO_SECRET not in caplog.text
    assert "Stop and explain" in result.message or "unexpected" in result.message


@pytest.mark.slow
def test_a_write_tool_without_an_approver_is_refused(probe_server, tmp_path) -> None:
    result = call(probe_server, "append_note", {"text": "x"})
    assert result.error == "approval:unavailable"


@pytest.mark.slow
def test_an_eval_run_never_sends_a_write_and_audits_the_attempt_under_its_purpose(db, tmp_path) -> None:
    notes = tmp_path / "notes.txt"
    server = probe("probe_eval", NOTES_FILE=str(notes))
    try:
        blocked = call(server, "append_note", {"text": "평가"}, writes_blocked=True, run_id=None)
        assert blocked.error == "eval:write_blocked"
        assert "append_note" in blocked.message
        assert not notes.exists()  # never sent
        event = AuditEvent.objects.get(tool="append_note", reason="eval:write_blocked")
        assert (event.ok, event.attempt, event.args) == (False, 0, {"text": "평가"})
        # A read tool still runs in an eval.
        assert call(server, "echo", {"text": "읽기"}, writes_blocked=True).ok
        # A sandbox server named by the eval set executes the write, without a person's approval.
        sandboxed = call(
            server, "append_note", {"text": "모래상자"}, writes_blocked=True, write_sandbox=frozenset({"probe_eval"})
        )
        assert sandboxed.ok, sandboxed.message
        assert notes.read_text(encoding="utf-8").startswith("모래상자")
    finally:
        get_default_pool().close("probe_eval")


@pytest.mark.slow
def test_a_trial_the_server_answers_with_its_own_error_closes_the_circuit(probe_server) -> None:
    """The server is there: its tool's own error is no failure of the server. The trial used to leave the circuit
    half open, one call let through per cool-down for as long as trials ended in a tool's error."""
    from mcpregistry import breaker

    McpServer.objects.filter(pk=probe_server.pk).update(
        breaker_state="open", breaker_opened_at=timezone.now() - timedelta(seconds=60), breaker_failures=5
    )
    breaker._seen_closed.clear()  # as another worker opened it: this process has not seen it closed since
    result = call(probe_server, "flaky", {"key": f"first-call-fails-{uuid.uuid4()}"})
    assert (result.ok, result.error) == (False, "tool:error")
    probe_server.refresh_from_db()
    assert (probe_server.breaker_state, probe_server.breaker_failures) == ("closed", 0)
