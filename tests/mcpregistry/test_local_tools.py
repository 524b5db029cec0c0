"""Local tools (Python functions bound as a ``local`` server) pass every step of the gate, as MCP tools do:
contract, approval, memo, timeout, retries, audit and metrics. Only the model is scripted."""

from __future__ import annotations

import json

import pytest
from django.core.exceptions import ValidationError

from agent_platform.celery import app as celery_app
from agents.approvals import approval_decide
from agents.execution import run_execute
from agents.models import Run
from audit.models import AuditEvent
from auditor.metrics import tool_metrics
from auditor.selectors import AuditEventFilters
from mcpregistry import gate
from mcpregistry.models import McpServer, ToolContract
from tests import local_tool_fixtures as fixtures
from tests.conftest import discover_as_admin, make_agent

pytestmark = pytest.mark.django_db

MODULE = "tests.local_tool_fixtures"


@pytest.fixture(autouse=True)
def allowed_modules(settings):  # type: ignore[no-untyped-def]
    settings.PLATFORM_LOCAL_TOOL_MODULES = ["mcpregistry.builtin_tools", MODULE]
    fixtures.EXECUTED.clear()


def bind_local(paths: list[str], mcp_id: str = "local-test") -> McpServer:
    server = McpServer(mcp_id=mcp_id, name=mcp_id, transport=McpServer.Transport.LOCAL, args=paths, timeout_s=5)
    server.full_clean()
    server.save()
    report = discover_as_admin(server=server)
    assert report.ok, report.error
    # Discovery proposes ``write`` for every tool: this admin marks them ``read``, except the notice sender.
    ToolContract.objects.filter(tool__server=server).exclude(tool__name="send_notice").update(risk="read")
    return server


@pytest.fixture
def local() -> McpServer:
    return bind_local([MODULE])


def call(server: McpServer, tool: str, args, memo=None, **who) -> gate.ToolResult:  # type: ignore[no-untyped-def]
    server = McpServer.objects.prefetch_related("tools__contract").get(pk=server.pk)
    return gate.call(server=server, tool_name=tool, args=args, who=gate.GateCall(source="admin", memo=memo, **who))


def events(tool: str) -> list[tuple]:
    calls = AuditEvent.objects.filter(tool=tool).exclude(action__startswith="config.")
    return list(calls.order_by("id").values_list("ok", "reason", "attempt"))


def contract(server: McpServer, tool: str, **values) -> None:  # type: ignore[no-untyped-def]
    ToolContract.objects.filter(tool__server=server, tool__name=tool).update(**values)


def test_discovery_lists_local_tools_beside_mcp_tools_with_contracts_from_their_signatures(local) -> None:
    tools = {t.name: t for t in local.tools.all()}
    assert set(tools) == {
        "lookup_stock",
        "sleepy",
        "slow_once",
        "explode",
        "flaky_shout",
        "garbled",
        "send_notice",
        "shout",
    }
    assert tools["lookup_stock"].description.startswith("재고 수량을 조회한다")
    assert tools["lookup_stock"].contract.args == {
        "sku": {"required": True, "type": "str"},
        "warehouse": {"required": False, "type": "int"},
    }
    assert tools["send_notice"].contract.risk == "write"
    local.refresh_from_db()
    assert (local.health, local.protocol_version) == ("ok", "local")


def test_a_single_tool_can_be_bound_by_its_dotted_path_also_a_langchain_tool(settings) -> None:
    server = bind_local([f"{MODULE}.shout"], mcp_id="shouter")
    assert list(server.tools.values_list("name", flat=True)) == ["shout"]
    result = call(server, "shout", {"text": "hi"})
    assert (result.ok, result.value) == (True, "HI")


@pytest.mark.parametrize(
    ("paths", "problem"),
    [
        (["os.path"], "PLATFORM_LOCAL_TOOL_MODULES"),
        ([f"{MODULE}.not_a_tool"], "is not a tool"),
        ([f"{MODULE}.missing"], "has no 'missing'"),
        (["tests.local_tool_fixtures_nowhere"], "PLATFORM_LOCAL_TOOL_MODULES"),
        ([], "JSON list of dotted paths"),
    ],
)
def test_a_local_binding_is_validated_on_save(paths, problem) -> None:  # type: ignore[no-untyped-def]
    server = McpServer(mcp_id="bad", name="bad", transport=McpServer.Transport.LOCAL, args=paths)
    with pytest.raises(ValidationError) as caught:
        server.full_clean()
    assert problem in str(caught.value.message_dict["args"])


def test_a_module_that_does_not_import_is_refused_on_save(settings) -> None:
    settings.PLATFORM_LOCAL_TOOL_MODULES = ["tests.no_such_package"]
    server = McpServer(mcp_id="bad", name="bad", transport=McpServer.Transport.LOCAL, args=["tests.no_such_package"])
    with pytest.raises(ValidationError, match="cannot import"):
        server.full_clean()


def test_a_bad_argument_is_refused_before_the_function_runs_and_audited(local) -> None:
    result = call(local, "lookup_stock", {"sku": "A-1", "warehouse": True})
    assert (result.ok, result.error) == (False, "args:type:warehouse")
    contract(local, "lookup_stock", args={"sku": {"type": "str", "required": True}, "warehouse": {"max": 9}})
    assert call(local, "lookup_stock", {"sku": "A-1", "warehouse": 12}).error == "args:range:warehouse"
    assert fixtures.EXECUTED["lookup_stock"] == []
    assert events("lookup_stock") == [(False, "args:type:warehouse", 0), (False, "args:range:warehouse", 0)]


def test_a_local_call_runs_once_and_is_audited_once_per_attempt(local) -> None:
    result = call(local, "lookup_stock", {"sku": "A-1"})
    assert (result.ok, result.value, result.attempts) == (True, {"sku": "A-1", "warehouse": 1, "count": 7}, 1)
    assert fixtures.EXECUTED["lookup_stock"] == [{"sku": "A-1", "warehouse": 1}]
    event = AuditEvent.objects.get(tool="lookup_stock", action="tool.call")
    assert (event.mcp_id, event.ok, event.attempt, event.args) == ("local-test", True, 1, {"sku": "A-1"})
    assert event.latency_ms is not None


def test_a_success_is_memoized_within_the_run_and_the_function_is_not_run_again(local) -> None:
    memo: dict = {}
    first = call(local, "lookup_stock", {"sku": "A-1"}, memo=memo)
    second = call(local, "lookup_stock", {"sku": "A-1"}, memo=memo)
    assert (first.memo_hit, second.memo_hit, second.value) == (False, True, first.value)
    assert len(fixtures.EXECUTED["lookup_stock"]) == 1
    assert events("lookup_stock") == [(True, "", 1), (True, "memo:hit", 0)]


def test_a_function_past_its_timeout_is_a_timeout_and_is_not_waited_for(local) -> None:
    contract(local, "sleepy", timeout_s=0.2, retry={"max_attempts": 1})
    result = call(local, "sleepy", {"seconds": 1.0})
    assert (result.ok, result.error) == (False, "timeout")
    assert result.latency_ms < 900
    assert events("sleepy") == [(False, "timeout", 1)]


def test_a_timeout_is_retried_and_the_retry_succeeds(local) -> None:
    contract(local, "slow_once", timeout_s=0.3, retry={"max_attempts": 3, "on": ["timeout"]})
    result = call(local, "slow_once", {"key": "k"})
    assert (result.ok, result.value, result.attempts) == (True, "answer 2", 2)
    assert events("slow_once") == [(False, "timeout", 1), (True, "", 2)]


def test_a_function_that_raises_is_a_failure_value_with_a_reason_and_is_not_retried(local) -> None:
    result = call(local, "explode", {"reason": "disk full"})
    assert (result.ok, result.error, result.attempts) == (False, "tool:error", 1)
    assert "RuntimeError: backend exploded: disk full" in result.message
    assert len(fixtures.EXECUTED["explode"]) == 1
    assert events("explode") == [(False, "tool:error", 1)]


def test_a_failed_local_tool_can_fall_back_to_another_local_tool(local) -> None:
    contract(local, "flaky_shout", fallback_tool="shout", fallback_policy="call")
    result = call(local, "flaky_shout", {"text": "plan b"})
    assert (result.ok, result.value, result.tool, result.fallback_for) == (True, "PLAN B", "shout", "flaky_shout")


def test_where_no_model_reads_a_suggestion_a_tools_own_error_is_not_handed_to_its_fallback(local) -> None:
    """A tool's own error may be about its input (seed 004: give up on what asking again cannot fix): with no model
    to read "use the fallback only if the input was right", the tool's answer stands; the contract's "call"
    policy, an admin's explicit choice, hands it over."""
    contract(local, "flaky_shout", fallback_tool="shout")  # the policy stays "suggest"
    result = call(local, "flaky_shout", {"text": "plan b"}, follow_fallback=True)
    assert (result.ok, result.error, result.fallback_for) == (False, "tool:error", None)
    assert "RuntimeError: backend down" in result.message
    assert "otherwise use the fallback tool 'shout'" in result.message  # as a model would be told
    assert "shout" not in fixtures.EXECUTED
    assert not AuditEvent.objects.filter(action="tool.fallback").exists()


def test_an_empty_answer_is_never_handed_to_the_fallback_nor_suggested(local) -> None:
    """Seed 004: an empty answer is the same empty answer from a backup; the model is told to say nothing was
    found, even where the contract has a fallback and its policy is "call"."""
    contract(local, "shout", returns={"type": "str", "non_empty": True}, fallback_tool="flaky_shout")
    contract(local, "shout", fallback_policy="call")
    for follow in (False, True):
        result = call(local, "shout", {"text": ""}, follow_fallback=follow)
        assert (result.ok, result.error, result.fallback_for) == (False, "result:empty", None)
        assert "say that nothing was found" in result.message and "flaky_shout" not in result.message
    assert "flaky_shout" not in fixtures.EXECUTED
    assert not AuditEvent.objects.filter(action="tool.fallback").exists()


def test_where_no_model_reads_a_suggestion_a_fallback_that_writes_is_not_called(local) -> None:
    contract(local, "flaky_shout", fallback_tool="shout")
    contract(local, "shout", risk="write")
    result = call(local, "flaky_shout", {"text": "plan d"}, follow_fallback=True)
    assert (result.ok, result.error) == (False, "tool:error")
    assert "use the fallback tool 'shout'" in result.message  # suggested, as to a model; not done
    assert events("shout") == []  # not even asked for (no approval left behind)


def test_an_offline_runs_approved_write_that_fails_never_calls_its_fallback_implicitly(local) -> None:
    """A write's fallback might do the write again: where no model reads the suggestion, it is not followed."""
    from agents.approvals import approval_decide
    from agents.execution import run_execute
    from agents.models import DeterministicRule, Run
    from tests.conftest import make_agent

    contract(local, "flaky_shout", fallback_tool="shout", risk="write")
    agent = make_agent(slug="offline-writer", servers=[local], with_demo_rules=False)
    DeterministicRule.objects.create(
        agent=agent, name="외치기", server=local, tool_name="flaky_shout", params={"text": "{query}"}
    )
    run = Run.objects.create(agent=agent, query="plan c")
    run_execute(run_id=str(run.id))
    approval = Run.objects.get(pk=run.pk).approvals.get()
    approval_decide(run=run, approval_id=str(approval.pk), decision="approve", actor="reviewer")
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert fixtures.EXECUTED["flaky_shout"] == [{"text": "plan c"}]
    assert "shout" not in fixtures.EXECUTED
    assert (run.status, run.error_code) == (Run.Status.FAILED, "deterministic:tool_failed")


@pytest.fixture
def eager_tasks():  # type: ignore[no-untyped-def]
    celery_app.conf.task_always_eager = True
    yield
    celery_app.conf.task_always_eager = False


def test_a_write_local_tool_waits_for_approval_and_then_runs_exactly_once(
    local, eager_tasks, django_capture_on_commit_callbacks
) -> None:
    agent = make_agent(
        slug="notifier",
        servers=[local],
        provider="scripted",
        with_demo_rules=False,
        script=[
            {"tool_calls": [{"name": "send_notice", "args": {"team": "IT지원팀", "text": "점검 공지"}}]},
            {"content": "결과: {last_tool_result}"},
        ],
    )
    run = Run.objects.create(agent=agent, query="IT지원팀에 점검 공지를 보내줘")
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert run.status == Run.Status.AWAITING_APPROVAL
    assert fixtures.EXECUTED["send_notice"] == []

    with django_capture_on_commit_callbacks(execute=True):
        approval_decide(run=run, approval_id=str(run.approvals.get().id), decision="approve", actor="admin:reviewer")
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert "sent to IT지원팀" in run.answer
    assert fixtures.EXECUTED["send_notice"] == [{"team": "IT지원팀", "text": "점검 공지"}]
    calls = AuditEvent.objects.filter(tool="send_notice", action="tool.call", attempt__gte=1)
    assert list(calls.values_list("ok", flat=True)) == [True]


def test_local_tool_calls_count_in_the_tool_metrics(local) -> None:
    call(local, "lookup_stock", {"sku": "A-1"})
    call(local, "explode", {"reason": "x"})
    report = tool_metrics(filters=AuditEventFilters(source="admin"))  # called as an admin's trial: asked for by source
    by_tool = {(m.mcp_id, m.tool): m for m in report.tools}
    assert by_tool[("local-test", "lookup_stock")].calls == 1
    assert by_tool[("local-test", "explode")].errors_by_reason == {"tool:error": 1}


def test_a_result_with_text_no_database_stores_is_stored_and_shown_with_replacement_characters(local) -> None:
    agent = make_agent(
        slug="garbled-reader",
        servers=[local],
        provider="scripted",
        with_demo_rules=False,
        script=[
            {"tool_calls": [{"name": "garbled", "args": {"what": "팀\x00"}}]},
            {"content": "결과: {last_tool_result}"},
        ],
    )
    run = Run.objects.create(agent=agent, query="김하늘 님 소속은?")
    run_execute(run_id=str(run.id))  # SQLite refuses an unpaired surrogate, PostgreSQL a NUL as well
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert fixtures.EXECUTED["garbled"] == [{"what": "팀\x00"}]  # the tool got its arguments as the model sent them
    assert "클라우드\ufffd운영팀" in run.answer
    stored = [
        *AuditEvent.objects.filter(tool="garbled").values_list("args", "result"),
        *run.events.values_list("data", flat=True),
        run.answer,
    ]
    text = json.dumps(stored, ensure_ascii=False)
    assert "\\u0000" not in text and "\x00" not in text
    assert text.encode("utf-8")  # no unpaired surrogate left anywhere
    call = AuditEvent.objects.get(tool="garbled", action="tool.call")
    assert call.args == {"what": "팀\ufffd"}
    assert call.result == {
        "name\ufffd": "김\ufffd하늘 팀\ufffd",
        "team": "클라우드\ufffd운영팀",
        "note": "backend said: \ufffd\ufffd",
    }
