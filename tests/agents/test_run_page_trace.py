"""A finished run's page shows the trace its live page showed, as a reviewer found it with real runs (each test
failed before its fix):

1. a run resumed after an approval keeps, once finished, the mark where it resumed and its earlier pass (a flow's
   first read, a rule decided again), the same steps as its live view and one attempt shown per audited send; a
   rule's approved write notes its approval on the deterministic call, as a model's and a flow's call do;
2. an approved write whose outcome is unknown reads "outcome unknown" on its call, never "failed";
3. a failure's details, a JSON string in a ``<tool_data>`` block with ``<``, ``>`` and ``&`` escaped for the
   model, read with those characters (on the call and in the system message), hidden characters still written out;
   what was stored and what the model read stay as they were.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.utils import translation

from agents.admin_runs import run_timeline
from agents.approvals import approval_decide
from agents.execution import run_execute
from agents.models import Approval, DeterministicRule, Run
from audit.models import AuditEvent
from mcpregistry.models import McpServer
from mcpregistry.pool import get_default_pool
from tests.agents.test_approvals import notes, writer  # noqa: F401
from tests.agents.test_flow_writes import flow_run  # noqa: F401
from tests.agents.test_run_timeline_entries import labels, step_with, timeline
from tests.conftest import discover_as_admin, make_agent

pytestmark = pytest.mark.django_db


def approve_and_finish(run: Run, reason: str = "") -> Approval:
    """The run parks on its write; a person approves it; the next delivery finishes the run."""
    run_execute(run_id=str(run.id))
    approval = Run.objects.get(pk=run.pk).approvals.get()
    approval_decide(run=run, approval_id=str(approval.pk), decision="approve", actor="admin:reviewer", reason=reason)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, (run.error_code, run.error_message)
    return approval


def as_shown(run: Run) -> list[tuple[str, str, str, str, int]]:
    """Each step but the last (the answer, whose status is the run's) as a reader tells it apart."""
    return [(s.kind, s.label, s.title, s.status, len(s.attempts)) for s in run_timeline(run)[:-1]]


def live_view_of(run: Run) -> list[tuple[str, str, str, str, int]]:
    """The steps the run's live page showed (built from its events while it ran)."""
    running = Run.objects.get(pk=run.pk)
    running.status = Run.Status.RUNNING
    return as_shown(running)


def audited_sends(run: Run) -> int:
    return AuditEvent.objects.filter(run_id=run.pk, action="tool.call", attempt__gte=1).count()


# ---- 1. a resumed run's passes ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_finished_flow_keeps_its_first_pass_and_where_it_resumed(admin_client: Any, flow_run: Any) -> None:  # noqa: F811
    run, _file = flow_run
    approve_and_finish(run)

    found = timeline(admin_client, run)

    order = labels(found)
    marker = order.index("pass 2")
    assert "resumed after the approval it waited for" in found[marker][2]
    reads = [i for i, s in enumerate(found) if "flow-writes.record_read" in s[2] and "step-flow" in s[0]]
    assert len(reads) == 2 and reads[0] < marker < reads[1], order  # the flow read in both passes
    assert sum(len(s.attempts) for s in run_timeline(run)) == audited_sends(run) == 3
    assert as_shown(run) == live_view_of(run)


@pytest.mark.slow
def test_a_finished_model_run_marks_where_it_resumed_after_its_approval(writer: Any, admin_client: Any) -> None:  # noqa: F811
    run, _client = writer
    approve_and_finish(run)

    order = labels(timeline(admin_client, run))

    assert order.index("approval requested") < order.index("pass 2") < order.index("tool call"), order
    assert as_shown(run) == live_view_of(run)


@pytest.fixture
def rule_writes_a_note(writer: Any) -> Run:  # noqa: F811
    """A run of an agent without a model whose rule calls the write tool ``append_note``."""
    run, _client = writer
    server = run.agent.servers.get()
    agent = make_agent(slug="rule-writes", servers=[server], with_demo_rules=False)
    DeterministicRule.objects.create(
        agent=agent, server=server, name="메모 저장", tool_name="append_note", when={"any_keywords": ["메모"]},
        params={"text": "{query}"}, answer_template="저장: {result}",
    )  # fmt: skip
    return Run.objects.create(agent=agent, query="메모: 내일 10시 회의")


@pytest.mark.slow
@pytest.mark.parametrize("language", ["en", "ko"])
def test_a_rules_approved_write_says_why_it_was_decided_twice_and_notes_its_approval(
    admin_client: Any, rule_writes_a_note: Run, language: str
) -> None:
    run = rule_writes_a_note
    approval = approve_and_finish(run)

    found = timeline(admin_client, run, language)

    kinds = [s[0].split()[0] for s in found]
    rules = [i for i, kind in enumerate(kinds) if kind == "step-rule"]
    assert len(rules) == 2 and kinds[rules[0] : rules[1] + 2] == [
        "step-rule",
        "step-approval",
        "step-pass",
        "step-rule",
        "step-deterministic",
    ], kinds
    call = run_timeline(run)[rules[1] + 1]
    assert (call.kind, call.approval_id) == ("deterministic", str(approval.pk))
    assert ("reviewer (관리자)" if language == "ko" else "reviewer (admin)") in found[rules[1] + 1][2]
    page = admin_client.get(f"/admin/agents/run/{run.pk}/change/").content.decode()
    assert page.count(f'href="/admin/agents/approval/{approval.pk}/change/"') == 2  # the approval's step and its call's
    assert as_shown(run) == live_view_of(run)


# ---- 2. an approved write whose outcome is unknown -----------------------------------------------------------------


@pytest.fixture
def write_that_drops_its_session(tmp_path: Path) -> Any:
    """A model's write to a server that carries it out and dies before it answers."""
    server = McpServer.objects.create(
        mcp_id="ledger-exit", name="ledger", command=sys.executable,
        args=["-m", "tests.mcp_fixtures.side_effect_server"], cwd=str(settings.BASE_DIR),
        env={"SIDE_EFFECT_FILE": str(tmp_path / "ledger.txt"), "SIDE_EFFECT_MODE": "exit"},
        public_env=["SIDE_EFFECT_FILE", "SIDE_EFFECT_MODE"], session_scope="shared",
    )  # fmt: skip
    assert discover_as_admin(server=server).ok
    script = [
        {"tool_calls": [{"name": "append_line", "args": {"text": "장부 기록 100만원"}}]},
        {"content": "결과: {last_tool_result}"},
    ]
    agent = make_agent(slug="ledger-react", servers=[server], provider="scripted", script=script, with_demo_rules=False)
    yield Run.objects.create(agent=agent, query="장부에 기록해줘")
    get_default_pool().close("ledger-exit")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("language", "unknown", "failed"), [("en", "outcome unknown", "failed"), ("ko", "결과 알 수 없음", "실패")]
)
def test_an_approved_write_whose_outcome_is_unknown_is_never_said_to_have_failed(
    write_that_drops_its_session: Run, language: str, unknown: str, failed: str
) -> None:
    run = write_that_drops_its_session
    approval = approve_and_finish(run)
    assert Approval.objects.get(pk=approval.pk).status == Approval.Status.OUTCOME_UNKNOWN

    with translation.override(language):
        call = next(step for step in run_timeline(run) if step.kind == "tool")

    assert call.status == "degraded" and call.status_text.startswith(unknown), call.status_text
    assert failed not in call.status_text
    assert "transport" in call.note  # what is known of how the call ended, as its approval says
    assert call.approval_id == str(approval.pk)


# ---- 3. a failure's details, as the reader reads them --------------------------------------------------------------


def test_a_failures_details_read_with_the_characters_the_model_was_given_escaped(
    admin_client: Any, demo_server: McpServer
) -> None:
    asset = "A-9<R&D>\u200b"
    script = [{"tool_calls": [{"name": "get_asset_status", "args": {"asset_id": asset}}]}, {"content": "끝"}]
    agent = make_agent(slug="amp", servers=[demo_server], provider="scripted", script=script, with_demo_rules=False)
    run = Run.objects.create(agent=agent, query="A-9 자산 상태")
    run_execute(run_id=str(run.id))
    run.refresh_from_db()

    call = next(step for step in timeline(admin_client, run) if step[1] == "tool call")

    assert "'A-9<R&D>⟦U+200B⟧' 자산을 찾을 수 없습니다" in call[2], call
    assert "\\u003c" not in call[2] and "\\u0026" not in call[2]
    stored = next(m for m in run.messages if m.get("type") == "tool")
    assert "'A-9\\u003cR\\u0026D\\u003e⟦U+200B⟧'" in stored["content"]  # what the model read, unchanged


def test_the_system_messages_tool_data_reads_with_its_characters(admin_client: Any, demo_server: McpServer) -> None:
    agent = make_agent(
        slug="amp-rule", servers=[demo_server], provider="scripted", script=[{"content": "끝"}], with_demo_rules=False
    )
    DeterministicRule.objects.create(
        agent=agent, server=demo_server, name="직원", tool_name="search_employee", when={"any_keywords": ["직원"]},
        params={"name": "R&D<팀장>"},
    )  # fmt: skip
    run = Run.objects.create(agent=agent, query="직원 찾기")
    run_execute(run_id=str(run.id))
    run.refresh_from_db()

    system = step_with(timeline(admin_client, run), "system message")

    assert "'R&D<팀장>' 직원을 찾을 수 없습니다" in system[2] and "\\u003c" not in system[2], system
    stored = next(m for m in run.messages if m.get("type") == "system")
    assert "'R\\u0026D\\u003c팀장\\u003e'" in stored["content"]
