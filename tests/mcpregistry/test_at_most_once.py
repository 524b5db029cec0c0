"""At most once for writes: a call whose outcome is unknown (its request went out and no answer came) is never
sent again for a ``write`` tool, by the gate's retries, the pool's reconnect or a redelivered run, unless its
contract names an idempotency argument; every send is one audited attempt; the approval ends
``outcome_unknown``.

The server is real and hostile (``tests/mcp_fixtures/side_effect_server.py``): it appends a line to a file (the
side effect), then dies or hangs. The file counts what the server really did."""

from __future__ import annotations

import sys
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.utils import timezone
from rest_framework.test import APIClient

from agents.approvals import approval_decide
from agents.execution import run_execute
from agents.models import Approval, Run
from agents.reconciler import runs_reconcile
from agents.services import api_key_create
from audit.models import AuditEvent
from audit.visible import tool_data_block
from mcpregistry import gate
from mcpregistry.models import McpServer, ToolContract
from mcpregistry.pool import McpSessionPool, McpTransportError, get_default_pool
from tests.conftest import discover_as_admin, make_agent

# Marked slow: out of the fast loop (several seconds of real servers, processes or timeouts per test); the full
# suite runs it.
pytestmark = [pytest.mark.django_db, pytest.mark.slow]

SIDE_EFFECT_SERVER = "tests.mcp_fixtures.side_effect_server"
WRITES_A_LINE = [
    {"tool_calls": [{"name": "append_line", "args": {"text": "송금 1건"}, "id": "call_write"}]},
    {"content": "결과: {last_tool_result}"},
]


def side_effect_server(mcp_id: str, file: Path, *, mode: str, timeout_s: float = 10) -> McpServer:
    server = McpServer.objects.create(
        mcp_id=mcp_id,
        name=mcp_id,
        command=sys.executable,
        args=["-m", SIDE_EFFECT_SERVER],
        cwd=str(settings.BASE_DIR),
        env={"SIDE_EFFECT_FILE": str(file), "SIDE_EFFECT_MODE": mode},
        public_env=["SIDE_EFFECT_FILE", "SIDE_EFFECT_MODE"],  # the fixture's settings, not secrets
        session_scope="shared",
        timeout_s=timeout_s,
    )
    assert discover_as_admin(server=server).ok
    return server


def lines(file: Path) -> list[str]:
    return file.read_text(encoding="utf-8").splitlines() if file.exists() else []


def taken_over_mid_call(approval: Approval) -> None:
    """The run as a worker leaves it that claimed the approved call's execution (and perhaps sent it), then died:
    the approval executing, the run running under a lapsed lease, for the redelivered task to take over."""
    Approval.objects.filter(pk=approval.pk).update(status=Approval.Status.EXECUTING)
    Run.objects.filter(pk=approval.run_id).update(
        status=Run.Status.RUNNING,
        worker="dead-host:42",
        delivery_count=1,
        lease_expires_at=timezone.now() - timedelta(seconds=1),
    )


def attempts(run_id: Any, tool: str) -> list[tuple[int, bool, str]]:
    rows = AuditEvent.objects.filter(run_id=run_id, tool=tool, action="tool.call").order_by("id")
    return [(e.attempt, e.ok, e.reason) for e in rows]


def approved_run(server: McpServer) -> tuple[Run, Approval]:
    """A run whose model asks for the write, parked; then a person approves it (the task is not sent here: the
    test delivers it with ``run_execute``, as a worker would)."""
    key, _raw = api_key_create(actor="test", via="tests", name=f"caller-{server.mcp_id}")
    agent = make_agent(
        slug=f"writes-{server.mcp_id}",
        servers=[server],
        provider="scripted",
        script=WRITES_A_LINE,
        with_demo_rules=False,
    )
    run = Run.objects.create(agent=agent, api_key=key, query="송금해줘")
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert run.status == Run.Status.AWAITING_APPROVAL
    approval = run.approvals.get()
    approval_decide(run=run, approval_id=str(approval.pk), decision="approve", actor="test")
    return run, approval


def assert_ended_outcome_unknown(run: Run, approval: Approval) -> None:
    """The approval ended ``outcome_unknown`` and the run's answer says the write may or may not have happened."""
    approval.refresh_from_db()
    assert approval.status == Approval.Status.OUTCOME_UNKNOWN
    run.refresh_from_db()
    assert "반영 여부를 알 수 없습니다" in run.answer  # "may or may not have taken effect", in the agent's language


@pytest.fixture
def file(tmp_path: Path) -> Path:
    return tmp_path / "side-effects.txt"


@pytest.fixture(autouse=True)
def _close_sessions() -> Any:
    yield
    for mcp_id in (
        "dies",
        "hangs",
        "dies-keyed",
        "dies-read",
        "dies-pool",
        "taken-over",
        "lost",
        "reports-timeout",
        "sandbox-keyed",
        "reports-429",
        "echoes-429",
        "bad-answer",
        "not-json",
        "same-id",
        "sandbox-once",
        "sandbox-twice",
    ):
        get_default_pool().close(mcp_id)


def test_a_write_whose_server_dies_after_the_side_effect_is_sent_once_and_ends_outcome_unknown(file: Path) -> None:
    server = side_effect_server("dies", file, mode="exit")
    assert ToolContract.objects.get(tool__server=server, tool__name="append_line").risk == "write"
    run, approval = approved_run(server)

    run_execute(run_id=str(run.id))

    # The gate's retry policy (three attempts on transport errors) does not apply: the request went out.
    assert lines(file) == ["송금 1건\t"]
    assert attempts(run.id, "append_line") == [(1, False, "transport")]
    approval.refresh_from_db()
    assert approval.status == Approval.Status.OUTCOME_UNKNOWN
    assert approval.result["outcome_unknown"] is True
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED
    assert "반영 여부를 알 수 없습니다" in run.answer  # "may or may not have taken effect", in the agent's language
    [tool_message] = [m for m in run.messages if m["type"] == "tool"]
    assert "다시 호출하지 말고" in tool_message["content"]  # "Do not repeat it"
    assert AuditEvent.objects.filter(
        run_id=run.id, action="approval.outcome_unknown", reason="approval:outcome_unknown"
    ).exists()

    # A redelivered task (the message came again after the run finished) changes nothing, nor does the run
    # being put back in the queue and replayed.
    run_execute(run_id=str(run.id))
    Run.objects.filter(pk=run.pk).update(status=Run.Status.QUEUED, delivery_count=0)
    run_execute(run_id=str(run.id))
    assert lines(file) == ["송금 1건\t"]
    approval.refresh_from_db()
    assert approval.status == Approval.Status.OUTCOME_UNKNOWN


def test_the_api_shows_an_approval_whose_outcome_is_unknown(file: Path) -> None:
    server = side_effect_server("dies", file, mode="exit")
    run, _approval = approved_run(server)
    run_execute(run_id=str(run.id))
    client = APIClient()
    _key, raw = api_key_create(actor="test", via="tests", name="reader")
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    Run.objects.filter(pk=run.pk).update(api_key=_key)
    body = client.get(f"/api/v1/runs/{run.id}").json()
    assert [a["status"] for a in body["approvals"]] == ["outcome_unknown"]


def test_a_write_that_hangs_after_the_side_effect_times_out_once_and_ends_outcome_unknown(file: Path) -> None:
    server = side_effect_server("hangs", file, mode="hang", timeout_s=1)
    run, approval = approved_run(server)

    run_execute(run_id=str(run.id))

    assert lines(file) == ["송금 1건\t"]
    assert attempts(run.id, "append_line") == [(1, False, "timeout")]
    assert_ended_outcome_unknown(run, approval)


def test_a_write_with_an_idempotency_argument_is_sent_again_with_the_same_key(file: Path) -> None:
    server = side_effect_server("dies-keyed", file, mode="exit")
    ToolContract.objects.filter(tool__server=server, tool__name="append_line").update(idempotency_arg="idempotency_key")
    run, approval = approved_run(server)

    run_execute(run_id=str(run.id))

    key = f"{run.id}:{approval.pk}"  # the approval's: the same write finds it on every pass
    # Two sends, both audited, with one key: the server carried it out once and recognised the repeat.
    assert lines(file) == [f"송금 1건\t{key}"]
    assert attempts(run.id, "append_line") == [(1, False, "transport"), (2, True, "")]
    approval.refresh_from_db()
    assert approval.status == Approval.Status.EXECUTED
    run.refresh_from_db()
    assert run.answer == "결과: " + tool_data_block(f"already done: {key}")


def test_a_write_whose_idempotency_argument_its_tool_does_not_take_is_sent_once(file: Path) -> None:
    """A contract's save refuses an idempotency argument the tool does not take; a version's frozen contract could
    hold one (imported from another installation, or frozen before the server changed its arguments), and every
    unanswered send of the write was sent again under a key its server never read: each a new write. The gate
    sends such a write at most once."""
    server = side_effect_server("dies-untaken-key", file, mode="exit")
    ToolContract.objects.filter(tool__server=server, tool__name="append_line").update(idempotency_arg="request_ref")
    run, approval = approved_run(server)

    run_execute(run_id=str(run.id))

    assert lines(file) == ["송금 1건\t"]
    assert attempts(run.id, "append_line") == [(1, False, "transport")]
    assert_ended_outcome_unknown(run, approval)


def test_a_write_whose_tool_reports_its_backend_timed_out_is_neither_repeated_nor_handed_to_its_fallback(
    file: Path,
) -> None:
    server = side_effect_server("reports-timeout", file, mode="report-timeout")
    ToolContract.objects.filter(tool__server=server, tool__name="append_line").update(
        fallback_tool="append_line_backup", fallback_policy=ToolContract.FallbackPolicy.CALL
    )
    run, approval = approved_run(server)

    run_execute(run_id=str(run.id))

    assert lines(file) == ["송금 1건\t"]  # the backup never ran: it might have done the same again
    assert attempts(run.id, "append_line") == [(1, False, "timeout")]
    assert attempts(run.id, "append_line_backup") == []
    assert_ended_outcome_unknown(run, approval)


def test_a_sandboxed_eval_write_with_an_idempotency_argument_sends_one_key_each_time(file: Path) -> None:
    server = side_effect_server("sandbox-keyed", file, mode="exit")
    ToolContract.objects.filter(tool__server=server, tool__name="append_line").update(idempotency_arg="idempotency_key")
    server = McpServer.objects.prefetch_related("tools__contract").get(pk=server.pk)
    run_id = uuid.uuid4()
    who = gate.GateCall(
        source="eval", run_id=run_id, call_id="c1", writes_blocked=True, write_sandbox=frozenset({server.mcp_id})
    )

    result = gate.call(server=server, tool_name="append_line", args={"text": "샌드박스"}, who=who)

    key = f"{run_id}:c1"
    assert (result.ok, result.value) == (True, f"already done: {key}")
    assert lines(file) == [f"샌드박스\t{key}"]  # sent twice, with one key: carried out once
    calls = AuditEvent.objects.filter(tool="append_line", action="tool.call").order_by("id")
    assert [(e.attempt, e.ok, e.reason) for e in calls] == [(1, False, "transport"), (2, True, "")]


def test_every_send_of_a_read_call_is_one_audited_attempt(file: Path) -> None:
    server = side_effect_server("dies-read", file, mode="exit")
    ToolContract.objects.filter(tool__server=server, tool__name="record_read").update(
        retry={"max_attempts": 3, "on": ["transport"], "backoff_base_s": 0.01}
    )
    server = McpServer.objects.prefetch_related("tools__contract").get(pk=server.pk)
    result = gate.call(server=server, tool_name="record_read", args={"key": "k"}, who=gate.GateCall(source="admin"))
    assert (result.ok, result.error, result.attempts) == (False, "transport", 3)
    # Each send reached the server (three lines), and each is an audited attempt: none is hidden in the pool.
    assert lines(file) == ["read:k", "read:k", "read:k"]
    audited = AuditEvent.objects.filter(tool="record_read", action="tool.call").order_by("id")
    assert [(e.attempt, e.reason) for e in audited] == [(1, "transport"), (2, "transport"), (3, "transport")]


def test_the_pool_never_sends_a_call_again_after_its_session_dropped(file: Path) -> None:
    server = side_effect_server("dies-pool", file, mode="exit")
    pool = McpSessionPool()
    try:
        with pytest.raises(McpTransportError) as raised:
            pool.call_tool(server.connection_config(), "append_line", {"text": "once"}, timeout_s=10)
        assert raised.value.sent is True
        assert lines(file) == ["once\t"]
    finally:
        pool.shutdown()


def test_a_run_taken_over_from_a_dead_worker_ends_the_approval_it_had_claimed_outcome_unknown(file: Path) -> None:
    server = side_effect_server("taken-over", file, mode="ok")
    run, approval = approved_run(server)
    taken_over_mid_call(approval)

    run_execute(run_id=str(run.id))  # the redelivered task takes the run over

    approval.refresh_from_db()
    assert approval.status == Approval.Status.OUTCOME_UNKNOWN
    assert lines(file) == []  # never sent again
    run.refresh_from_db()
    assert (run.status, run.delivery_count) == (Run.Status.SUCCEEDED, 2)
    assert "반영 여부를 알 수 없습니다" in run.answer  # "may or may not have taken effect", in the agent's language
    assert AuditEvent.objects.filter(run_id=run.id, action="approval.outcome_unknown", actor="reconciler").exists()


def test_a_run_failed_as_worker_lost_never_leaves_its_approval_executing(file: Path, settings: Any) -> None:
    settings.PLATFORM_RUN_MAX_DELIVERIES = 1
    server = side_effect_server("lost", file, mode="ok")
    run, approval = approved_run(server)
    Approval.objects.filter(pk=approval.pk).update(status=Approval.Status.EXECUTING)
    Run.objects.filter(pk=run.pk).update(
        status=Run.Status.RUNNING,
        worker="dead-host:42",
        delivery_count=1,
        lease_expires_at=timezone.now() - timedelta(seconds=1),
    )

    assert runs_reconcile().worker_lost == 1

    run.refresh_from_db()
    assert (run.status, run.error_code) == (Run.Status.FAILED, "worker_lost")
    approval.refresh_from_db()
    assert approval.status == Approval.Status.OUTCOME_UNKNOWN
    assert lines(file) == []


def test_a_write_whose_tool_reports_a_rate_limit_after_the_work_is_not_sent_again(file: Path) -> None:
    server = side_effect_server("reports-429", file, mode="report-rate-limit")
    ToolContract.objects.filter(tool__server=server, tool__name="append_line").update(
        retry={"max_attempts": 3, "on": ["rate_limit", "timeout", "transport"], "backoff_base_s": 0.01}
    )
    run, approval = approved_run(server)

    run_execute(run_id=str(run.id))

    # Its own error was answered after the work: the contract's retries on rate_limit do not apply to a write.
    assert lines(file) == ["송금 1건\t"]
    assert attempts(run.id, "append_line") == [(1, False, "rate_limit")]
    approval.refresh_from_db()
    assert (approval.status, approval.result["reason"]) == (Approval.Status.EXECUTED, "rate_limit")


def test_a_write_error_that_quotes_a_429_and_says_a_backend_timed_out_ends_outcome_unknown(file: Path) -> None:
    server = side_effect_server("echoes-429", file, mode="report-echo")
    ToolContract.objects.filter(tool__server=server, tool__name="append_line").update(
        retry={"max_attempts": 3, "on": ["rate_limit", "timeout"], "backoff_base_s": 0.01}
    )
    script = [
        {"tool_calls": [{"name": "append_line", "args": {"text": "invoice 429"}, "id": "call_write"}]},
        {"content": "결과: {last_tool_result}"},
    ]
    key, _raw = api_key_create(actor="test", via="tests", name="caller-echo")
    agent = make_agent(slug="writes-echo", servers=[server], provider="scripted", script=script, with_demo_rules=False)
    run = Run.objects.create(agent=agent, api_key=key, query="송금해줘")
    run_execute(run_id=str(run.id))
    approval = Run.objects.get(pk=run.pk).approvals.get()
    approval_decide(run=run, approval_id=str(approval.pk), decision="approve", actor="test")

    run_execute(run_id=str(run.id))

    assert lines(file) == ["invoice 429\t"]
    assert attempts(run.id, "append_line") == [(1, False, "timeout")]
    assert_ended_outcome_unknown(run, approval)


def test_a_write_carried_out_whose_answer_fails_the_check_is_not_handed_to_its_fallback(file: Path) -> None:
    server = side_effect_server("bad-answer", file, mode="ok")
    ToolContract.objects.filter(tool__server=server, tool__name="append_line").update(
        returns={"type": "dict"},
        fallback_tool="append_line_backup",
        fallback_policy=ToolContract.FallbackPolicy.CALL,
    )
    run, approval = approved_run(server)

    run_execute(run_id=str(run.id))

    assert lines(file) == ["송금 1건\t"]  # the backup never ran: it would have written again
    assert attempts(run.id, "append_line") == [(1, False, "result:shape")]
    assert attempts(run.id, "append_line_backup") == []
    approval.refresh_from_db()
    assert (approval.status, approval.result["reason"]) == (Approval.Status.EXECUTED, "result:shape")
    run.refresh_from_db()
    [tool_message] = [m for m in run.messages if m["type"] == "tool"]
    assert "쓰기를 수행했지만" in tool_message["content"]  # "carried out the write", in the agent's language
    assert "fallback" not in tool_message["content"]


def test_a_sandboxed_write_whose_answer_fails_the_check_is_not_written_again_by_its_fallback(file: Path) -> None:
    server = side_effect_server("bad-answer", file, mode="ok")
    ToolContract.objects.filter(tool__server=server, tool__name="append_line").update(
        returns={"type": "dict"},
        fallback_tool="append_line_backup",
        fallback_policy=ToolContract.FallbackPolicy.CALL,
    )
    server = McpServer.objects.prefetch_related("tools__contract").get(pk=server.pk)
    who = gate.GateCall(
        source="eval", run_id=uuid.uuid4(), call_id="c1", writes_blocked=True, write_sandbox=frozenset({"bad-answer"})
    )

    result = gate.call(server=server, tool_name="append_line", args={"text": "샌드박스"}, who=who)

    assert (result.ok, result.error) == (False, "result:shape")
    assert lines(file) == ["샌드박스\t"]
    assert "carried out the write" in result.message


def test_a_result_with_nan_is_kept_as_text_and_audited(file: Path) -> None:
    server = side_effect_server("not-json", file, mode="ok")
    server = McpServer.objects.prefetch_related("tools__contract").get(pk=server.pk)

    result = gate.call(server=server, tool_name="not_json_read", args={"key": "k"}, who=gate.GateCall(source="admin"))

    assert result.ok
    assert result.value == '{"key": "k", "ratio": NaN, "limit": Infinity}'  # text: not JSON
    [event] = AuditEvent.objects.filter(tool="not_json_read", action="tool.call")
    assert event.ok and "NaN" in str(event.result)


def test_a_second_write_the_model_gives_an_id_it_used_before_is_asked_for_and_sent_not_taken_for_the_first(
    file: Path,
) -> None:
    server = side_effect_server("same-id", file, mode="ok")
    script = [  # a model that numbers its calls per turn: call_0 each time
        {"tool_calls": [{"name": "append_line", "args": {"text": "A"}, "id": "call_0"}]},
        {"tool_calls": [{"name": "append_line", "args": {"text": "B"}, "id": "call_0"}]},
        {"content": "결과: {last_tool_result}"},
    ]
    key, _raw = api_key_create(actor="test", via="tests", name="caller-same-id")
    agent = make_agent(
        slug="writes-same-id", servers=[server], provider="scripted", script=script, with_demo_rules=False
    )
    run = Run.objects.create(agent=agent, api_key=key, query="두 건 기록해줘")

    for text in ("A", "B"):
        run_execute(run_id=str(run.id))
        run.refresh_from_db()
        assert run.status == Run.Status.AWAITING_APPROVAL, text
        pending = run.approvals.get(status=Approval.Status.PENDING)
        assert pending.args == {"text": text}
        approval_decide(run=run, approval_id=str(pending.pk), decision="approve", actor="test")
    run_execute(run_id=str(run.id))

    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED
    assert lines(file) == ["A\t", "B\t"]  # each sent once, the second not answered with the first's outcome
    assert sorted(run.approvals.values_list("call_id", flat=True)) == ["call_0", "call_0_r2"]
    tool_messages = [m for m in run.messages if m["type"] == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == ["call_0", "call_0_r2"]


def test_a_sandboxed_eval_write_is_recorded_and_a_redelivered_run_never_sends_it_again(file: Path) -> None:
    from agents.approvals import RunApprovals

    server = side_effect_server("sandbox-once", file, mode="ok")
    agent = make_agent(slug="evals-sandbox", servers=[server], provider="scripted", script=[], with_demo_rules=False)
    run = Run.objects.create(agent=agent, query="평가", purpose="eval", write_sandbox=["sandbox-once"])
    server = McpServer.objects.prefetch_related("tools__contract").get(pk=server.pk)

    def deliver() -> gate.ToolResult:
        who = gate.GateCall(
            source="eval",
            run_id=run.id,
            call_id="call_1",
            writes_blocked=True,
            write_sandbox=frozenset({"sandbox-once"}),
            approvals=RunApprovals(run_id=run.id, actor="eval", secrets=[]),
        )
        return gate.call(server=server, tool_name="append_line", args={"text": "평가 기록"}, who=who)

    first = deliver()
    again = deliver()  # the same call of the same run, delivered again

    assert first.ok and again.ok and again.value == first.value
    assert lines(file) == ["평가 기록\t"]  # sent once
    approval = run.approvals.get()
    assert (approval.status, approval.decided_by) == (Approval.Status.EXECUTED, "sandbox:eval")

    Approval.objects.filter(pk=approval.pk).update(status=Approval.Status.EXECUTING)  # a worker died mid-call
    unknown = deliver()
    assert unknown.error == "approval:outcome_unknown" and lines(file) == ["평가 기록\t"]


def test_a_write_asked_for_twice_is_two_writes_never_the_first_ones_memo(file: Path) -> None:
    """The run's memo (on by default) answers a repeated read; a write asked for again under another call id is
    another write: sent, and its approval carried through (a memo hit used to leave it claimed, ``executing``, and
    tell the caller it was done)."""
    from agents.approvals import RunApprovals

    server = side_effect_server("sandbox-twice", file, mode="ok")
    agent = make_agent(slug="evals-twice", servers=[server], provider="scripted", script=[], with_demo_rules=False)
    run = Run.objects.create(agent=agent, query="평가", purpose="eval", write_sandbox=["sandbox-twice"])
    server = McpServer.objects.prefetch_related("tools__contract").get(pk=server.pk)
    assert ToolContract.objects.get(tool__server=server, tool__name="append_line").memo
    memo: dict[str, Any] = {}
    approvals = RunApprovals(run_id=run.id, actor="eval", secrets=[])  # one pass's

    def who(call_id: str) -> gate.GateCall:
        return gate.GateCall(
            source="eval",
            run_id=run.id,
            call_id=call_id,
            memo=memo,
            writes_blocked=True,
            write_sandbox=frozenset({"sandbox-twice"}),
            approvals=approvals,
        )

    first = gate.call(server=server, tool_name="append_line", args={"text": "x"}, who=who("call_1"))
    second = gate.call(server=server, tool_name="append_line", args={"text": "x"}, who=who("call_2"))

    assert (first.ok, second.ok, second.memo_hit) == (True, True, False)
    assert lines(file) == ["x\t", "x\t"]
    statuses = dict(run.approvals.values_list("call_id", "status"))
    assert statuses == {"call_1": Approval.Status.EXECUTED, "call_2": Approval.Status.EXECUTED}

    # The pass made again (a retry): the model names both calls anew; each is found done, neither sent again.
    approvals, memo = RunApprovals(run_id=run.id, actor="eval", secrets=[]), {}
    again = [
        gate.call(server=server, tool_name="append_line", args={"text": "x"}, who=who(f"call_{n}")) for n in (3, 4)
    ]
    assert [r.ok for r in again] == [True, True]
    assert lines(file) == ["x\t", "x\t"]
    assert run.approvals.count() == 2
