"""The run page's review (s39): a failed attempt's answer or message shows under it (collapsed, masked, cut short,
hidden characters written out); the summary's tool time is the model's and is left out where rules did all the
work; an approval's step says when it was requested, decided or expires; the offline provider's turn is no model
turn. Runs are made with the demo server (a real stdio process); only the model is scripted."""

from __future__ import annotations

import html
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone
from django.utils.timezone import localtime

from agents.admin_runs import ATTEMPT_SAID_MAX_CHARS, run_summary
from agents.execution import run_execute
from agents.models import Agent, Approval, Run
from audit.services import audit_event_record
from mcpregistry.models import McpServer
from tests.conftest import bind_demo_server, make_agent

pytestmark = pytest.mark.django_db

ASSET_QUESTION = "A-1001 자산의 현재 상태를 알려주세요."


def executed(agent: Agent, query: str = ASSET_QUESTION) -> Run:
    run = Run.objects.create(agent=agent, query=query)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    return run


def page_of(client: Any, run: Run) -> str:
    response = client.get(f"/admin/agents/run/{run.pk}/change/")
    assert response.status_code == 200
    return str(response.content.decode())


def step_of(page: str, label: str) -> str:
    step = page[page.index(f">{label}<") :]
    return step[: step.index("</li>")]


def step_at(page: str, title: str) -> str:
    step = page[page.index(f'<code class="step-title">{title}</code>') :]
    return step[: step.index("</li>")]


@pytest.mark.slow
def test_a_failed_attempts_wrong_shaped_answer_shows_under_it(admin_client: Any) -> None:
    server = bind_demo_server(mcp_id="bad-shape", failure_mode="bad_schema")
    run = executed(make_agent(slug="bad-shape-page", servers=[server]))
    step = step_of(page_of(admin_client, run), "deterministic call")
    assert "<code>get_asset_status</code>: answer of the wrong shape <code>result:shape</code>" in step
    said = step[step.index('class="attempt-said') :]
    assert "<details>" in said and "what came back (masked)" in said
    assert "사용중인듯" in html.unescape(said)
    # The attempt that worked shows nothing more than its outcome.
    assert step.count('class="attempt-said') == 1


@pytest.mark.slow
def test_each_rate_limited_attempt_shows_the_servers_advice(admin_client: Any) -> None:
    server = bind_demo_server(mcp_id="limited", failure_mode="rate_limit")
    run = executed(make_agent(slug="limited-page", servers=[server]))
    step = html.unescape(step_of(page_of(admin_client, run), "deterministic call"))
    advice = "호출 한도를 초과했습니다. get_asset_status_backup 도구를 사용하세요."
    failed = run.audit_events.filter(action="tool.call", ok=False, attempt__gte=1).count()
    assert failed >= 2
    assert step.count(advice) == failed


def test_a_long_answer_is_cut_and_its_hidden_characters_are_written_out(admin_client: Any) -> None:
    agent = Agent.objects.create(slug="long-said", name="long")
    run = Run.objects.create(
        agent=agent,
        query="q",
        status=Run.Status.SUCCEEDED,
        answer="done",
        messages=[
            {"type": "ai", "content": "", "tool_calls": [{"id": "c1", "name": "lookup", "args": {}}]},
            {"type": "tool", "content": "ok", "tool_call_id": "c1", "name": "lookup", "status": "success"},
        ],
    )
    said = "<b>x</b>\u202e" + "가" * 1000
    for attempt, ok, result in ((1, False, said), (2, True, "fine")):
        audit_event_record(
            source="agent", run_id=run.pk, mcp_id="ledger", tool="lookup", call_id="c1", args={},
            result=result, ok=ok, reason="" if ok else "timeout", attempt=attempt, latency_ms=1.0, actor="local",
        )  # fmt: skip
    step = step_of(page_of(admin_client, run), "tool call")
    shown = step[step.index("<pre>", step.index('class="attempt-said')) + 5 : step.index("</pre>")]
    assert "<b>" not in shown and "&lt;b&gt;x&lt;/b&gt;" in shown  # escaped
    assert "⟦U+202E⟧" in shown and "\u202e" not in shown
    assert shown.endswith("…") and shown.count("가") == ATTEMPT_SAID_MAX_CHARS - len("<b>x</b>\u202e")


def test_a_run_the_rules_answered_shows_its_calls_time_within_the_deterministic_stage(demo_server: McpServer) -> None:
    run = executed(make_agent(slug="rules-only", servers=[demo_server]))
    assert run.timings["tools_ms"] == 0.0 and run.status == Run.Status.SUCCEEDED
    called = sum(e["latency_ms"] for e in run.messages if e["type"] == "deterministic_call")
    assert called > 0
    summary = " ".join(run_summary(run))
    # A part of the stage's time, never a part of its own beside it: the parts added up to more than the whole
    # (the stage's time holds its calls'). No "tools 0 ms" for the model's calls, which it did not make.
    assert "tools " not in summary.replace("(its tool calls", "")
    shown = float(summary.split("(its tool calls ")[1].split(" ms")[0].replace(",", ""))
    assert shown == pytest.approx(called, abs=0.01)
    stage = float(summary.split("deterministic ")[1].split(" ms")[0].replace(",", ""))
    assert shown <= stage
    # The offline provider's answer is no model's: said so, and no "model calls: 1".
    assert "answer without a model " in summary and "model calls" not in summary and "· model " not in summary
    assert "tokens:" not in summary  # none were read or written: no "tokens: 0 in, 0 out"


def test_a_run_without_a_tool_call_shows_no_tool_time() -> None:
    run = Run(timings={"deterministic_ms": 1.5, "model_ms": 0.0, "tools_ms": 0.0}, messages=[{"type": "rule"}])
    assert "tools" not in " ".join(run_summary(run))


def test_an_approvals_step_says_when_it_was_requested_decided_and_expires(admin_client: Any) -> None:
    agent = Agent.objects.create(slug="approved", name="approved")
    run = Run.objects.create(agent=agent, query="q", status=Run.Status.SUCCEEDED, answer="done")
    now = timezone.now().replace(microsecond=0)
    times = {
        "pending": (now - timedelta(minutes=5), None, now + timedelta(hours=1)),
        "approved": (now - timedelta(minutes=30), now - timedelta(minutes=20), now + timedelta(minutes=30)),
    }
    for status, (created, decided, expires) in times.items():
        approval = Approval.objects.create(
            run=run, mcp_id="notes", tool=f"append_{status}", args={}, call_hash=status.ljust(64, "0"),
            status=status, decided_at=decided, decided_by="alice" if decided else "", expires_at=expires,
        )  # fmt: skip
        Approval.objects.filter(pk=approval.pk).update(created_at=created)
    page = page_of(admin_client, run)

    def at(moment: datetime) -> str:
        return f"{localtime(moment):%Y-%m-%d %H:%M:%S} KST"

    pending = step_at(page, "notes.append_pending")
    created, _, expires = times["pending"]
    assert f"requested {at(created)} · expires {at(expires)}" in pending
    approved = step_at(page, "notes.append_approved")
    created, decided, _ = times["approved"]
    assert decided is not None
    assert f"requested {at(created)} · decided {at(decided)}" in approved and "expires" not in approved


def test_the_offline_providers_turn_is_no_model_turn(admin_client: Any, demo_server: McpServer) -> None:
    run = executed(make_agent(slug="offline-turn", servers=[demo_server]))
    page = page_of(admin_client, run)
    assert "answer without a model (offline provider)" in page
    assert "model turn" not in page


def test_an_approval_a_cancelled_run_leaves_says_it_ended_then_not_at_its_later_expiry(admin_client: Any) -> None:
    from agents.services import run_cancel

    agent = Agent.objects.create(slug="cancelled-approval", name="cancelled-approval")
    run = Run.objects.create(agent=agent, query="q", status=Run.Status.AWAITING_APPROVAL)
    later = timezone.now() + timedelta(hours=1)
    decided = timezone.now() - timedelta(minutes=1)
    for status in ("pending", "approved"):
        Approval.objects.create(
            run=run, mcp_id="notes", tool=f"append_{status}", args={}, call_hash=status.ljust(64, "0"),
            status=status, expires_at=later, decided_at=decided if status == "approved" else None,
            decided_by="alice" if status == "approved" else "",
        )  # fmt: skip
    before = timezone.now()
    run_cancel(run=run, actor="admin")
    ended = {a.tool: a for a in Approval.objects.filter(run=run)}
    assert {a.status for a in ended.values()} == {Approval.Status.EXPIRED}
    # It lapsed when the run was cancelled: "expired" an hour from now was a time still to come.
    assert all(before <= a.expires_at <= timezone.now() for a in ended.values())
    page = page_of(admin_client, run)
    approved = step_at(page, "notes.append_approved")
    at = f"{localtime(decided):%Y-%m-%d %H:%M:%S} KST"
    assert f"decided {at}" in approved and "expired " in approved
    assert f"{localtime(later):%Y-%m-%d %H:%M}" not in page
