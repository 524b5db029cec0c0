"""A run's page, as a reviewer found it with real runs (each test failed before its fix):

1. (the live refresh on a flow's node: ``tests/browser/test_run_live_refresh.py``)
2. a model's failure (an empty answer) ends the timeline: the engine's ``outcome`` note, put first in the trace,
   is not shown at the top (nor twice, where it only repeats the run's error);
3. a resumed flow's approval sits right before the call it let through (not above the whole flow), is titled
   ``server.tool`` as calls are, and shows the value the call gave (or why it failed), never the raw
   ``{ok, reason, value}``;
4. a decided approval is linked from its step and from its call's, for a reader who may view approvals (no link
   otherwise, the pending bar's included); several pending calls of one tool are told apart in the pending bar;
5. a shadow run's page says it is a shadow, which version it ran, and links to its live run, and back, and to
   their comparison;
6. a run taken over from a lost worker marks where the new pass began, counts its model turns again from there,
   does not count a call repeated by the new pass as a retry, and its summary says a worker was lost; a pass
   retried after an error a retry can fix (the worker gave the run back: its ``queued`` event says
   ``retryable``) is no takeover: it reads "retried after an error", not degraded, and the summary counts no
   lost worker;
7. a call the open circuit never let through shows no duration ("0.0 ms").
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.db import OperationalError
from django.utils import timezone

from agents.admin_runs import _in_order
from agents.approvals import approval_decide
from agents.execution import run_execute
from agents.models import Approval, Run, RunEvent, ShadowComparison
from agents.services import agent_version_publish
from audit.services import audit_event_record
from tests.agents.test_admin_runs import an_approval
from tests.agents.test_approvals import WRITES_A_NOTE, eager_tasks, notes, writer  # noqa: F401
from tests.agents.test_budgets_unstored import interleave
from tests.agents.test_flow_writes import flow_run  # noqa: F401
from tests.agents.test_run_timeline_entries import a_run, labels, step_with, timeline
from tests.conftest import logged_in, make_agent
from tests.test_admin_views_access import staff

pytestmark = pytest.mark.django_db


def page(client: Any, run: Run, language: str = "en") -> str:
    client.cookies["django_language"] = language
    response = client.get(f"/admin/agents/run/{run.pk}/change/")
    assert response.status_code == 200
    return str(response.content.decode())


def summary_of(html: str) -> str:
    return html[html.index('class="run-summary"') : html.index('id="run-timeline"')]


def approval_url(approval: Approval) -> str:
    return f"/admin/agents/approval/{approval.pk}/change/"


# ---- 2. a model's failure ends the timeline ------------------------------------------------------------------------


@pytest.mark.parametrize("language", ["en", "ko"])
def test_a_models_empty_answer_reads_after_its_turn_not_as_an_outcome_at_the_top(
    admin_client: Any, demo_server: Any, language: str
) -> None:
    agent = make_agent(
        slug="empty", servers=[demo_server], provider="scripted", with_demo_rules=False, script=[{"content": ""}]
    )
    run = Run.objects.create(agent=agent, query="빈 답")
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert (run.error_code, run.messages[0]["type"]) == ("model:empty", "outcome")  # first in the trace

    found = timeline(admin_client, run, language)

    assert [s[0].split()[0] for s in found] == [
        "step-message",
        "step-message",
        "step-model",
        "step-error",
    ], labels(found)
    assert "model:empty" in found[-1][2]


def test_an_outcome_that_says_more_than_the_error_is_kept_after_the_conversation() -> None:
    entries = [
        {"type": "outcome", "reason": "model:max_tokens", "stop_reason": "max_tokens"},
        {"type": "system", "content": "s"},
        {"type": "human", "content": "q"},
        {"type": "ai", "content": "잘린 답"},
    ]
    assert [e["type"] for e in _in_order(entries, {})] == ["system", "human", "ai", "outcome"]


# ---- 3. and 4. a resumed flow's approval: placed, titled, its result, its link --------------------------------------


def resumed_flow(run: Run) -> Approval:
    run_execute(run_id=str(run.id))
    approval = Run.objects.get(pk=run.pk).approvals.get()
    approval_decide(run=run, approval_id=str(approval.pk), decision="approve", actor="reviewer")
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, (run.error_code, run.error_message)
    return approval


@pytest.mark.slow
@pytest.mark.parametrize("language", ["en", "ko"])
def test_a_resumed_flows_approval_sits_before_the_call_it_let_through(
    admin_client: Any,
    flow_run: Any,  # noqa: F811
    language: str,
) -> None:
    run, _file = flow_run
    approval = resumed_flow(run)

    found = timeline(admin_client, run, language)

    kinds = [s[0].split()[0] for s in found]
    # The finished page shows both passes as the live one does (the first pass's read, its waiting call, where the
    # run resumed), from the run's events.
    assert kinds == [
        "step-message", "step-flow", "step-approval", "step-flow", "step-pass", "step-flow", "step-flow", "step-flow",
        "step-answer",
    ], labels(found)  # fmt: skip
    read, asked, write = found[1], found[2], found[6]
    assert "flow-writes.record_read" in read[2] and "flow-writes.append_line" in write[2]
    assert "flow-writes.append_line" in asked[2]  # titled as the call is
    assert "lines: 3" in asked[2] and '"ok"' not in asked[2] and '"reason"' not in asked[2]
    html = page(admin_client, run, language)
    # The approval's step, the first pass's waiting call and the call it let through.
    assert html.count(f'href="{approval_url(approval)}"') == 3


@pytest.mark.slow
def test_an_approval_whose_call_failed_says_why_in_words(admin_client: Any, flow_run: Any) -> None:  # noqa: F811
    run, _file = flow_run
    approval = resumed_flow(run)
    Approval.objects.filter(pk=approval.pk).update(result={"ok": False, "reason": "tool:error", "value": None})

    asked = next(s for s in timeline(admin_client, run) if "step-approval" in s[0])

    assert "failed:" in asked[2] and "tool:error" in asked[2] and '"ok"' not in asked[2]


@pytest.mark.slow
def test_a_reader_who_may_not_view_approvals_gets_no_link_to_them(flow_run: Any) -> None:  # noqa: F811
    run, _file = flow_run
    approval = resumed_flow(run)
    reader = logged_in(staff("rita", perms=("agents.view_run",)))
    assert approval_url(approval) not in page(reader, run)
    reviewer = logged_in(staff("vera", perms=("agents.view_run", "agents.view_approval")))
    assert approval_url(approval) in page(reviewer, run)


def test_several_pending_calls_of_one_tool_are_told_apart_in_the_pending_bar(admin_client: Any) -> None:
    run = a_run(status=Run.Status.AWAITING_APPROVAL, answer="")
    first, second = an_approval(run, minutes_ago=2), an_approval(run, minutes_ago=1)
    Approval.objects.filter(pk=second.pk).update(args={"text": "두 번째 메모"})
    alone = an_approval(run, tool="delete_note", minutes_ago=0)

    html = page(admin_client, run)
    start = html.index('class="run-pending"')
    bar = re.sub(r"<[^>]+>", " ", html[html.index(">", start) + 1 : html.index("</p>", start)])

    assert "두 번째 메모" in bar and "회의록 저장" in bar
    assert str(first.pk)[:8] in bar and str(second.pk)[:8] in bar
    assert str(alone.pk)[:8] not in bar  # a tool with one pending call needs nothing more
    reader = logged_in(staff("rita", perms=("agents.view_run",)))
    assert approval_url(first) not in page(reader, run) and "notes.append_note" in page(reader, run)


# ---- 5. a shadow run's page -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("language", "shadow_word"), [("en", "shadow"), ("ko", "섀도")])
def test_a_shadow_runs_page_says_so_and_links_to_its_live_run_and_their_comparison(
    admin_client: Any, demo_agent: Any, language: str, shadow_word: str
) -> None:
    live_version = agent_version_publish(agent=demo_agent, actor="test-admin", via="tests")
    candidate = agent_version_publish(agent=demo_agent, actor="test-admin", via="tests", make_live=False)
    live = Run.objects.create(
        agent=demo_agent, query="질문", status=Run.Status.SUCCEEDED, answer="답", version=live_version
    )
    shadow = Run.objects.create(
        agent=demo_agent, query="질문", status=Run.Status.SUCCEEDED, answer="답", version=candidate,
        purpose=Run.Purpose.SHADOW, shadow_of=live,
    )  # fmt: skip
    comparison = ShadowComparison.objects.create(
        live_run=live, shadow_run=shadow, agent=demo_agent, candidate=candidate, agrees=False, same_status=True,
        same_tools=True, same_args=True, answer_similarity=0.4,
    )  # fmt: skip
    comparison_url = f"/admin/agents/shadowcomparison/{comparison.pk}/change/"

    shadows_summary = summary_of(page(admin_client, shadow, language))
    assert 'id="run-purpose"' in shadows_summary and shadow_word in shadows_summary
    assert f"v{candidate.number}" in shadows_summary
    assert f'href="/admin/agents/run/{live.pk}/change/"' in shadows_summary
    assert comparison_url in shadows_summary

    lives_summary = summary_of(page(admin_client, live, language))
    assert 'id="run-purpose"' not in lives_summary and f"v{live_version.number}" in lives_summary
    assert f'href="/admin/agents/run/{shadow.pk}/change/"' in lives_summary
    assert comparison_url in lives_summary


# ---- 6. a run taken over from a lost worker --------------------------------------------------------------------------


def lose_the_worker(run: Run) -> None:
    """The worker's lease lapses: another worker may take the run over, and this one stops at its next step."""
    Run.objects.filter(pk=run.pk).update(worker="dead-host:1", lease_expires_at=timezone.now() - timedelta(seconds=1))


@pytest.mark.slow
def test_a_flow_taken_over_marks_its_new_pass_and_its_repeated_call_is_no_retry(
    admin_client: Any,
    flow_run: Any,  # noqa: F811
    monkeypatch: Any,
) -> None:
    run, _file = flow_run
    interleave(monkeypatch, "tool_call", lambda: lose_the_worker(run))  # after the flow's first call
    run_execute(run_id=str(run.id))
    monkeypatch.undo()
    run_execute(run_id=str(run.id))  # the second delivery takes the run over; it parks at the write
    run.refresh_from_db()
    assert (run.status, run.delivery_count) == (Run.Status.AWAITING_APPROVAL, 2)

    found = timeline(admin_client, run)

    kinds = [s[0].split()[0] for s in found]
    marker = kinds.index("step-pass")
    assert kinds[:marker] == ["step-message", "step-flow"] and "status-degraded" in found[marker][0]  # the query first
    assert "taken over: the worker was lost" in found[marker][2]
    reads = [s for s in found if "flow-writes.record_read" in s[2] and "step-flow" in s[0]]
    assert len(reads) == 2
    for read in reads:  # each pass's call: one attempt, not a retry
        assert "status-ok" in read[0] and "1 attempt(s)" in read[2], read


@pytest.mark.slow
def test_a_model_run_taken_over_counts_its_turns_again_and_says_a_worker_was_lost(
    writer: Any,  # noqa: F811
    admin_client: Any,
    monkeypatch: Any,
) -> None:
    run, _client = writer
    interleave(monkeypatch, "model_turn", lambda: lose_the_worker(run))
    run_execute(run_id=str(run.id))
    monkeypatch.undo()
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert (run.status, run.delivery_count) == (Run.Status.AWAITING_APPROVAL, 2)

    order = labels(timeline(admin_client, run))

    marker = order.index("pass 2")
    assert order[marker - 1] == "model turn 1" and order[marker + 1] == "model turn 1", order
    assert "model turn 2" not in order
    assert "taken over 1 time(s): a worker was lost" in summary_of(page(admin_client, run))


def a_database_hiccup() -> None:
    raise OperationalError("server closed the connection unexpectedly")


@pytest.mark.slow
def test_a_flow_retried_after_a_database_hiccup_is_no_takeover(
    admin_client: Any,
    flow_run: Any,  # noqa: F811
    monkeypatch: Any,
) -> None:
    run, _file = flow_run
    interleave(monkeypatch, "tool_call", a_database_hiccup)  # after the flow's first call
    with pytest.raises(OperationalError):
        run_execute(run_id=str(run.id))  # the worker gives the run back; the task's retry claims it again
    monkeypatch.undo()
    statuses = list(RunEvent.objects.filter(run=run, kind="status").order_by("seq").values_list("data", flat=True))
    assert statuses[-1] == {"status": "queued", "reason": "retryable"}
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert (run.status, run.delivery_count) == (Run.Status.AWAITING_APPROVAL, 2)

    found = timeline(admin_client, run)

    marker = [s[0].split()[0] for s in found].index("step-pass")
    assert "retried after an error" in found[marker][2] and "status-degraded" not in found[marker][0]
    assert "taken over" not in " ".join(s[2] for s in found)
    assert "taken over" not in summary_of(page(admin_client, run))
    reads = [s for s in found if "flow-writes.record_read" in s[2] and "step-flow" in s[0]]
    assert len(reads) == 2 and all("1 attempt(s)" in read[2] for read in reads)  # each pass's call: no retry


@pytest.mark.slow
def test_a_model_run_retried_counts_its_turns_again_and_a_later_lost_worker_is_still_a_takeover(
    writer: Any,  # noqa: F811
    admin_client: Any,
    monkeypatch: Any,
) -> None:
    run, _client = writer
    interleave(monkeypatch, "model_turn", a_database_hiccup)
    with pytest.raises(OperationalError):
        run_execute(run_id=str(run.id))
    monkeypatch.undo()
    interleave(monkeypatch, "model_turn", lambda: lose_the_worker(run))
    run_execute(run_id=str(run.id))  # the retry: its worker is lost after its first turn
    monkeypatch.undo()
    run_execute(run_id=str(run.id))  # the third delivery takes the run over
    run.refresh_from_db()
    assert (run.status, run.delivery_count) == (Run.Status.AWAITING_APPROVAL, 3)

    order = labels(timeline(admin_client, run))

    assert order.count("model turn 1") == 3 and "model turn 2" not in order, order
    assert order.index("pass 2") < order.index("pass 3")
    assert "taken over 1 time(s): a worker was lost" in summary_of(page(admin_client, run))


# ---- 7. a call never let through has no duration ---------------------------------------------------------------------


def test_a_call_the_open_circuit_never_let_through_shows_no_duration(admin_client: Any) -> None:
    run = a_run(
        messages=[
            {"type": "ai", "content": "", "tool_calls": [{"id": "c1", "name": "team", "args": {}}]},
            {"type": "tool", "content": "잠시 멈춤", "tool_call_id": "c1", "name": "team", "status": "error",
             "error": "circuit:open"},
        ]
    )  # fmt: skip
    audit_event_record(
        source="agent", action="tool.call", run_id=run.pk, mcp_id="sds", tool="team", call_id="c1", ok=False,
        reason="circuit:open", attempt=1, latency_ms=None, actor="local",
    )  # fmt: skip

    call = step_with(timeline(admin_client, run), "잠시 멈춤")

    assert "status-failed" in call[0] and "circuit:open" in call[2]
    assert " ms" not in call[2].split("attempt outcome")[0], call[2]
