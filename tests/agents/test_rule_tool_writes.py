"""A code rule's own tool calls (``ctx.mcp_tools``, seed 000) are numbered in the order the rule makes them
(``rule:<id>:call:<n>``), as a flow's are: a write waiting for a person parks the run (it used to hand the rule
the text "Waiting for a person" and let the run succeed, its approval never carried out); a rule decided again
(resumed, or its run redelivered after its worker died) finds each write under its number and never sends it
twice (a sandboxed eval write had no number: no record, so a redelivered run sent it again).

The server is real (``tests/mcp_fixtures/side_effect_server.py``); its file counts what it really did."""

from __future__ import annotations

import contextlib
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.utils import timezone

from agents.approvals import approval_decide
from agents.execution import run_execute
from agents.models import Approval, DeterministicRule, Run
from agents.services import api_key_create
from agents.tools import DeterministicContext, deterministic_tool
from mcpregistry.models import McpServer
from mcpregistry.pool import get_default_pool
from tests.conftest import discover_as_admin, make_agent

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

MCP_ID = "rule-writes"


@deterministic_tool(mcp_id=MCP_ID)
def read_write_then_decide(ctx: DeterministicContext) -> dict[str, Any] | None:
    tools = {t.name: t for t in ctx.mcp_tools}
    tools["record_read"].invoke({"key": "k"})
    tools["append_line"].invoke({"text": "규칙 기록"})
    return {"tool_name": "record_read", "params": {"key": "after"}}


@deterministic_tool(mcp_id=MCP_ID)
def write_and_swallow_the_wait(ctx: DeterministicContext) -> dict[str, Any] | None:
    tools = {t.name: t for t in ctx.mcp_tools}
    with contextlib.suppress(Exception):  # a rule that goes on as if nothing happened
        tools["append_line"].invoke({"text": "삼킨 기록"})
    with contextlib.suppress(Exception):  # and calls on
        tools["append_line"].invoke({"text": "또 다른 기록"})
        tools["record_read"].invoke({"key": "after-the-wait"})
    return {"tool_name": "record_read", "params": {"key": "went-on"}}


# What the audit held when the rule made its second call (``read_then_read_again``).
AUDITED_BEFORE_SECOND_CALL: list[list[tuple[str, str]]] = []


@deterministic_tool(mcp_id=MCP_ID)
def read_then_read_again(ctx: DeterministicContext) -> dict[str, Any] | None:
    from audit.models import AuditEvent

    tools = {t.name: t for t in ctx.mcp_tools}
    tools["record_read"].invoke({"key": "개인정보"})
    AUDITED_BEFORE_SECOND_CALL.append(
        list(AuditEvent.objects.filter(action="tool.call").values_list("tool", "call_id").order_by("id"))
    )
    tools["record_read"].invoke({"key": "다음"})
    return None


@pytest.fixture
def file(tmp_path: Path) -> Any:
    yield tmp_path / "side-effects.txt"
    get_default_pool().close(MCP_ID)


def lines(file: Path) -> list[str]:
    return file.read_text(encoding="utf-8").splitlines() if file.exists() else []


def rule_agent(file: Path, code: str) -> Any:
    server = McpServer.objects.create(
        mcp_id=MCP_ID,
        name=MCP_ID,
        command=sys.executable,
        args=["-m", "tests.mcp_fixtures.side_effect_server"],
        cwd=str(settings.BASE_DIR),
        env={"SIDE_EFFECT_FILE": str(file), "SIDE_EFFECT_MODE": "ok"},
        public_env=["SIDE_EFFECT_FILE", "SIDE_EFFECT_MODE"],
        session_scope="shared",
    )
    assert discover_as_admin(server=server).ok
    agent = make_agent(slug="rule-writes", servers=[server], provider="offline", with_demo_rules=False)
    rule = DeterministicRule.objects.create(agent=agent, name="writes", order=1, code=f"{__name__}.{code}")
    return agent, rule


def died_mid_run(run: Run) -> None:
    """The run as its worker left it, dying after the stage's calls and before it stored the outcome."""
    Run.objects.filter(pk=run.pk).update(
        status=Run.Status.RUNNING,
        worker="dead-host:42",
        lease_expires_at=timezone.now() - timedelta(seconds=1),
        answer="",
        deterministic_results=[],
        messages=[],
        conversation=[],
        finished_at=None,
    )


def test_a_code_rule_write_parks_the_run_and_once_approved_is_carried_out_once(file: Path) -> None:
    agent, rule = rule_agent(file, "read_write_then_decide")
    key, _raw = api_key_create(actor="test", via="tests", name="rule-writes-caller")
    run = Run.objects.create(agent=agent, api_key=key, query="기록해줘")

    run_execute(run_id=str(run.id))

    run.refresh_from_db()
    assert run.status == Run.Status.AWAITING_APPROVAL, (run.status, run.error_code, run.answer)
    approval = run.approvals.get()
    assert (approval.status, approval.call_id, approval.args) == (
        Approval.Status.PENDING,
        f"rule:{rule.pk}:call:2",
        {"text": "규칙 기록"},
    )
    assert lines(file) == ["read:k"]  # the write was not sent, nor the rule's decision

    approval_decide(run=run, approval_id=str(approval.pk), decision="approve", actor="reviewer")
    run_execute(run_id=str(run.id))

    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, (run.error_code, run.error_message)
    # The rule was decided again: its read again, its write once (the approved one), then its decision's call.
    assert lines(file) == ["read:k", "read:k", "규칙 기록\t", "read:after"]
    approval.refresh_from_db()
    assert approval.status == Approval.Status.EXECUTED

    # Delivered again after its worker died before it stored the outcome: the write is found executed, not sent.
    died_mid_run(run)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED
    assert lines(file) == ["read:k", "read:k", "규칙 기록\t", "read:after", "read:k", "read:after"]


def test_a_rule_that_swallows_the_wait_still_parks_the_run(file: Path) -> None:
    agent, _rule = rule_agent(file, "write_and_swallow_the_wait")
    run = Run.objects.create(agent=agent, query="기록해줘")

    run_execute(run_id=str(run.id))

    run.refresh_from_db()
    assert run.status == Run.Status.AWAITING_APPROVAL
    assert lines(file) == []  # neither the write, nor what it called on to, nor its decision
    assert run.approvals.count() == 1  # the one it waits for: no second write asked for meanwhile


def test_a_sandboxed_eval_write_of_a_code_rule_is_not_sent_again_by_a_redelivered_run(file: Path) -> None:
    agent, rule = rule_agent(file, "read_write_then_decide")
    run = Run.objects.create(agent=agent, query="평가", purpose="eval", write_sandbox=[MCP_ID])

    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, (run.error_code, run.error_message)
    assert lines(file) == ["read:k", "규칙 기록\t", "read:after"]
    approval = run.approvals.get()
    assert (approval.call_id, approval.status, approval.decided_by) == (
        f"rule:{rule.pk}:call:2",
        Approval.Status.EXECUTED,
        "sandbox:eval",
    )

    # Its worker died after the stage's calls, before it stored the outcome (the run as it was while it ran); the
    # message is delivered again.
    died_mid_run(run)
    run_execute(run_id=str(run.id))

    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED
    assert lines(file) == ["read:k", "규칙 기록\t", "read:after", "read:k", "read:after"]  # the reads again only


@deterministic_tool(mcp_id=MCP_ID)
def write_a(ctx: DeterministicContext) -> dict[str, Any] | None:
    next(t for t in ctx.mcp_tools if t.name == "append_line").invoke({"text": "A"})
    return None


@deterministic_tool(mcp_id=MCP_ID)
def write_b(ctx: DeterministicContext) -> dict[str, Any] | None:
    next(t for t in ctx.mcp_tools if t.name == "append_line").invoke({"text": "B"})
    return None


def test_the_code_rules_of_an_imported_version_keep_their_calls_apart(file: Path) -> None:
    """A version imported from another installation whose rules have no namesake here has no row ids: its rules
    all shared ``rule:None:call:1``, so the second rule's write was refused as another call's (or, with the same
    arguments, told the first one's outcome) and never sent."""
    import copy

    from agents.services import agent_version_import, agent_version_publish

    agent, _rule = rule_agent(file, "write_a")
    DeterministicRule.objects.create(agent=agent, name="writes-b", order=2, code=f"{__name__}.write_b")
    published = agent_version_publish(agent=agent, actor="test", via="tests", make_live=False)
    content = copy.deepcopy(published.content)
    for frozen in content["rules"]:
        frozen.pop("rule_id", None)
        frozen["name"] = "promoted " + frozen["name"]  # no rule of that name here
    imported = agent_version_import(agent=agent, number=99, content=content, note="", actor="test", via="tests")
    assert [r["rule_id"] for r in imported.content["rules"]] == [None, None]
    run = Run.objects.create(agent=agent, version=imported, query="평가", purpose="eval", write_sandbox=[MCP_ID])

    run_execute(run_id=str(run.id))

    run.refresh_from_db()
    assert lines(file) == ["A\t", "B\t"]
    assert sorted(run.approvals.values_list("call_id", flat=True)) == ["rule:-1:call:1", "rule:-2:call:1"]


# Whether ``write_then_think_better`` writes: it does the first time it is decided, not once resumed.
_WRITE_ON_FIRST_DECISION: list[bool] = []


@deterministic_tool(mcp_id=MCP_ID)
def write_then_think_better(ctx: DeterministicContext) -> dict[str, Any] | None:
    if not _WRITE_ON_FIRST_DECISION:
        _WRITE_ON_FIRST_DECISION.append(True)
        next(t for t in ctx.mcp_tools if t.name == "append_line").invoke({"text": "처음 생각"})
    return {"tool_name": "record_read", "params": {"key": "other-branch"}}


def test_an_approval_the_run_ends_without_using_expires_and_is_audited(file: Path) -> None:
    """A code rule decided again after its approval takes another branch: the run succeeds without the write. Its
    approval used to stay "approved" for good, a write that read as allowed and was never made."""
    from audit.models import AuditEvent

    _WRITE_ON_FIRST_DECISION.clear()
    agent, rule = rule_agent(file, "write_then_think_better")
    run = Run.objects.create(agent=agent, query="기록해줘")
    run_execute(run_id=str(run.id))
    approval = Approval.objects.get(run=run)
    assert approval.status == Approval.Status.PENDING
    approval_decide(run=run, approval_id=str(approval.pk), decision="approve", actor="reviewer")

    run_execute(run_id=str(run.id))

    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, (run.error_code, run.error_message)
    assert lines(file) == ["read:other-branch"]  # the write was never sent
    approval.refresh_from_db()
    assert (approval.status, approval.reason) == (Approval.Status.EXPIRED, "the run ended without making this call")
    unused = AuditEvent.objects.get(run_id=run.pk, action="approval.unused")
    assert (unused.call_id, unused.reason, unused.ok) == (f"rule:{rule.pk}:call:1", "approval:unused", False)
    assert unused.source == "deterministic"  # the rule asked for it, not the model
    assert unused.result["was"] == "approved" and unused.args == {"text": "처음 생각"}


def test_an_approved_write_whose_run_is_lost_before_making_it_expires(file: Path) -> None:
    """The approved run's workers keep dying before they claim the call: the run fails ``worker_lost`` and its
    approval, never carried out, expires with it (it used to read "approved" for good)."""
    from agents.dispatch import lifecycle_setting

    _WRITE_ON_FIRST_DECISION.clear()
    agent, _rule = rule_agent(file, "write_then_think_better")
    run = Run.objects.create(agent=agent, query="기록해줘")
    run_execute(run_id=str(run.id))
    approval = Approval.objects.get(run=run)
    approval_decide(run=run, approval_id=str(approval.pk), decision="approve", actor="reviewer")
    died_mid_run(run)
    Run.objects.filter(pk=run.pk).update(delivery_count=int(lifecycle_setting("PLATFORM_RUN_MAX_DELIVERIES")))

    run_execute(run_id=str(run.id))

    run.refresh_from_db()
    assert (run.status, run.error_code) == (Run.Status.FAILED, "worker_lost")
    approval.refresh_from_db()
    assert approval.status == Approval.Status.EXPIRED
    assert lines(file) == []


def test_an_unused_approval_reads_in_the_admins_language_with_why_it_ended(file: Path, admin_client) -> None:
    """Its reason was stored in the worker's language ("the run ended without making this call" on Korean pages),
    and its page said "expires at" a time to come for an approval that had ended."""
    _WRITE_ON_FIRST_DECISION.clear()
    agent, _rule = rule_agent(file, "write_then_think_better")
    run = Run.objects.create(agent=agent, query="기록해줘")
    run_execute(run_id=str(run.id))
    approval = Approval.objects.get(run=run)
    approval_decide(run=run, approval_id=str(approval.pk), decision="approve", actor="reviewer")
    run_execute(run_id=str(run.id))

    listed = admin_client.get("/admin/agents/approval/", HTTP_ACCEPT_LANGUAGE="ko").content.decode()
    assert "실행이 이 호출을 하지 않고 끝났습니다" in listed
    assert '<td class="field-expires">—</td>' in listed  # no time to come for an ended approval
    page = admin_client.get(f"/admin/agents/approval/{approval.pk}/change/", HTTP_ACCEPT_LANGUAGE="ko").content
    assert "실행이 이 호출을 하지 않고 끝났습니다" in page.decode() and "만료됩니다" not in page.decode()


def test_a_code_rules_read_is_audited_before_its_next_call_goes_out(file: Path) -> None:
    """A code rule's reads went to the stage's collected record, written only before a decision's call or when the
    stage ended: a worker killed during the rule's next call (seconds, on a slow tool) took with it the record of
    a read that had returned personal data. Now each is written as its call returns, as the model's loop does."""
    from mcpregistry.models import ToolContract

    AUDITED_BEFORE_SECOND_CALL.clear()
    agent, rule = rule_agent(file, "read_then_read_again")
    ToolContract.objects.filter(tool__server__mcp_id=MCP_ID, tool__name="record_read").update(risk="read")
    run = Run.objects.create(agent=agent, query="조회해줘")

    run_execute(run_id=str(run.id))

    assert lines(file) == ["read:개인정보", "read:다음"]
    [audited] = AUDITED_BEFORE_SECOND_CALL
    assert audited == [("record_read", f"rule:{rule.pk}:call:1")]
