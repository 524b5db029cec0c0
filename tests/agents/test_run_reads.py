"""The reads behind ``GET /runs/{id}`` (``agents.selectors``), made once instead of compiled per request: the caller's
run with its agent and version as ``select_related`` gives them, and nobody else's; its tool calls from the audit
record and its approvals, oldest first."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agent_platform.errors import ApplicationError
from agents.models import Agent, Approval, Run
from agents.selectors import run_approvals, run_get, run_tool_calls
from agents.services import agent_version_publish
from audit.services import audit_event_record

pytestmark = pytest.mark.django_db


def same_row(ours: Any, theirs: Any) -> None:
    assert type(ours) is type(theirs) and ours._state.db == theirs._state.db == "default"
    for field in type(theirs)._meta.concrete_fields:
        assert getattr(ours, field.attname) == getattr(theirs, field.attname), field.name


@pytest.mark.parametrize("published", [False, True], ids=["agent as stored", "published version"])
def test_the_callers_run_comes_with_its_agent_and_version_in_one_statement(
    demo_agent: Agent, api_caller: Any, published: bool
) -> None:
    version = agent_version_publish(agent=demo_agent, actor="t", via="tests", note="첫 버전") if published else None
    run = Run.objects.create(
        agent=demo_agent, version=version, api_key=api_caller.key, query="김하늘 님은 어느 팀 소속인가요?"
    )
    theirs = Run.objects.select_related("agent", "version").get(pk=run.pk)

    with CaptureQueriesContext(connection) as queries:
        ours = run_get(run_id=str(run.pk), api_key=api_caller.key)
        agent, got_version = ours.agent, ours.version  # cached: no query of their own

    assert len(queries) == 1
    same_row(ours, theirs)
    same_row(agent, theirs.agent)
    if published:
        same_row(got_version, theirs.version)
        assert got_version.number == version.number
    else:
        assert got_version is None
    assert ours.query == "김하늘 님은 어느 팀 소속인가요?" and agent.slug == "company-assistant"


def test_a_run_of_another_key_or_an_unknown_or_malformed_id_is_not_found(
    demo_agent: Agent, api_caller: Any, other_caller: Any
) -> None:
    run = Run.objects.create(agent=demo_agent, api_key=api_caller.key, query="q")
    for run_id, key in [(str(run.pk), other_caller.key), (str(uuid.uuid4()), api_caller.key), ("x", api_caller.key)]:
        with pytest.raises(ApplicationError) as raised:
            run_get(run_id=run_id, api_key=key)
        assert (raised.value.code, raised.value.status) == ("run_not_found", 404)


def test_tool_calls_and_approvals_come_in_order_and_only_the_runs_own(demo_agent: Agent) -> None:
    run, other = (Run.objects.create(agent=demo_agent, query="q") for _ in "ab")
    for run_id, tool, action in [
        (run.pk, "search_employee", "tool.call"),
        (other.pk, "get_team", "tool.call"),
        (run.pk, "", "rule.matched"),
        (run.pk, "list_assets", "tool.call"),
    ]:
        audit_event_record(
            source="agent", action=action, run_id=run_id, mcp_id="sds", tool=tool, args={"name": "김하늘"},
            latency_ms=2.5, reason="" if tool != "list_assets" else "args:allowed:region", ok=tool != "list_assets",
        )  # fmt: skip
    expires = timezone.now() + timedelta(hours=1)
    for minute, (run_of, tool) in enumerate([(run, "update_asset"), (other, "delete_asset"), (run, "delete_asset")]):
        approval = Approval.objects.create(
            run=run_of, mcp_id="sds", tool=tool, call_id=f"call-{tool}", args={"asset": "노트북"}, call_hash=tool,
            expires_at=expires,
        )  # fmt: skip
        # Each requested before the one made before it (created_at is set on insert, so it is moved after).
        Approval.objects.filter(pk=approval.pk).update(created_at=expires - timedelta(hours=2, minutes=minute))

    calls = run_tool_calls(run=run)

    assert calls == [
        {
            "source": "agent", "mcp_id": "sds", "name": "search_employee", "args": {"name": "김하늘"}, "ok": True,
            "reason": "", "attempt": 1, "latency_ms": 2.5,
        },
        {
            "source": "agent", "mcp_id": "sds", "name": "list_assets", "args": {"name": "김하늘"}, "ok": False,
            "reason": "args:allowed:region", "attempt": 1, "latency_ms": 2.5,
        },
    ]  # fmt: skip
    assert [approval.tool for approval in run_approvals(run=run)] == ["delete_asset", "update_asset"]
    assert run_approvals(run=run) == list(run.approvals.order_by("created_at", "pk"))
