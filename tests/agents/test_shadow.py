"""Shadow runs: a sampled live run is repeated on the candidate version only after the caller's answer is stored
(it never waits for, nor changes, that answer), never executes a write, and the pair is compared with the
disagreements listed first."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from django.conf import settings

from agents.execution import run_execute
from agents.models import Agent, AgentVersion, Approval, DeterministicRule, Run, ShadowComparison
from agents.services import (
    agent_shadow_set,
    agent_update,
    agent_version_publish,
    agent_version_rollback,
    deterministic_rule_create,
    deterministic_rule_update,
    run_create,
)
from agents.shadow import shadow_after_live
from audit.models import AuditEvent
from mcpregistry.models import McpServer, McpTool
from mcpregistry.pool import get_default_pool
from mcpregistry.services import tool_contract_update
from tests.conftest import ApiCaller, discover_as_admin

pytestmark = pytest.mark.django_db

ASSET_QUESTION = "A-1001 자산의 현재 상태를 알려주세요."


def twin_candidate(agent: Agent) -> AgentVersion:
    """The agent published (v1 live) and a candidate that behaves as v1 does (its system prompt, which the offline
    model never reads, written otherwise): a live run is never shadowed on its own version, which agrees with itself
    by construction and spent a second run."""
    agent_version_publish(agent=agent, actor="test-admin", via="tests")
    agent.refresh_from_db()
    agent_update(agent=agent, actor="test-admin", via="tests", data={"system_prompt": agent.system_prompt + " "})
    return agent_version_publish(agent=agent, actor="test-admin", via="tests", make_live=False)


def live_run(agent: Agent, caller: ApiCaller | None = None, query: str = ASSET_QUESTION) -> Run:
    run = run_create(agent_slug=agent.slug, query=query, api_key=caller.key if caller else None)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    return run


def with_candidate(agent: Agent, template: str) -> None:
    """v1 live; a candidate v2 whose asset rule answers with ``template``; every live run shadowed on v2."""
    agent_version_publish(agent=agent, actor="test-admin", via="tests")
    rule = DeterministicRule.objects.get(agent=agent, tool_name="get_asset_status")
    deterministic_rule_update(rule=rule, actor="test-admin", via="tests", data={"answer_template": template})
    candidate = agent_version_publish(agent=agent, actor="test-admin", via="tests", make_live=False)
    agent.refresh_from_db()
    agent_shadow_set(agent=agent, actor="test-admin", via="tests", version=candidate, rate=1.0)


def test_the_callers_run_finishes_before_its_shadow_starts_and_its_answer_is_unchanged(
    demo_agent: Agent, api_caller: ApiCaller, api_client
) -> None:  # type: ignore[no-untyped-def]
    unshadowed = live_run(demo_agent, api_caller)
    with_candidate(demo_agent, "후보 {result.asset_id}")
    run = live_run(demo_agent, api_caller)
    assert (run.status, run.answer, run.version.number) == (Run.Status.SUCCEEDED, unshadowed.answer, 1)
    # When the caller's run was stored, its shadow had not started: it is still queued, on the candidate.
    shadow = Run.objects.get(shadow_of=run)
    assert (shadow.status, shadow.purpose, shadow.version.number, shadow.api_key) == (
        Run.Status.QUEUED,
        Run.Purpose.SHADOW,
        2,
        None,
    )
    # The caller never sees the shadow among their runs.
    listed = api_client.get("/api/v1/runs").json()["results"]
    assert str(shadow.id) not in {r["id"] for r in listed}

    run_execute(run_id=str(shadow.id))
    shadow.refresh_from_db()
    assert (shadow.status, shadow.answer) == (Run.Status.SUCCEEDED, "후보 A-1001")
    run.refresh_from_db()
    assert run.answer == unshadowed.answer  # the caller's answer is untouched
    # Its calls are audited under its purpose.
    assert set(AuditEvent.objects.filter(run_id=shadow.id, action="tool.call").values_list("source", flat=True)) == {
        "shadow"
    }
    comparison = ShadowComparison.objects.get(live_run=run)
    assert (comparison.shadow_run, comparison.same_tools, comparison.same_args, comparison.same_status) == (
        shadow,
        True,
        True,
        True,
    )
    assert comparison.answer_similarity < 0.8 and comparison.agrees is False
    assert comparison.live_tools == comparison.shadow_tools == ["sds-company-data.get_asset_status"]


def test_a_run_is_not_shadowed_at_sample_rate_zero(demo_agent: Agent) -> None:
    with_candidate(demo_agent, "후보 {result.asset_id}")
    demo_agent.refresh_from_db()
    agent_shadow_set(agent=demo_agent, actor="test-admin", via="tests", version=demo_agent.shadow_version, rate=0.0)
    live_run(demo_agent)
    assert not Run.objects.filter(purpose=Run.Purpose.SHADOW).exists()


def test_a_shadow_run_is_never_shadowed_itself_even_at_sample_rate_one(demo_agent: Agent) -> None:
    with_candidate(demo_agent, "후보 {result.asset_id}")  # every live run sampled
    run = live_run(demo_agent)
    shadow = Run.objects.get(shadow_of=run)
    run_execute(run_id=str(shadow.id))  # finished, as a live run would be shadowed then
    shadow.refresh_from_db()
    assert shadow.status == Run.Status.SUCCEEDED
    assert ShadowComparison.objects.get(live_run=run).shadow_run == shadow
    assert list(Run.objects.filter(purpose=Run.Purpose.SHADOW)) == [shadow]
    assert not Run.objects.filter(shadow_of__purpose=Run.Purpose.SHADOW).exists()
    # Asked directly too: the execution path asks only for a live run's shadow, so this guard stands alone here.
    assert shadow_after_live(run_id=shadow.id) is None
    assert list(Run.objects.filter(purpose=Run.Purpose.SHADOW)) == [shadow]


def test_an_identical_candidate_agrees(demo_agent: Agent) -> None:
    candidate = twin_candidate(demo_agent)
    agent_shadow_set(agent=demo_agent, actor="test-admin", via="tests", version=candidate, rate=1.0)
    run = live_run(demo_agent)
    shadow = Run.objects.get(shadow_of=run)
    run_execute(run_id=str(shadow.id))
    comparison = ShadowComparison.objects.get(live_run=run)
    assert (comparison.agrees, comparison.answer_similarity) == (True, 1.0)
    assert not Run.objects.filter(shadow_of=shadow).exists()


@pytest.fixture
def notes_server(db, tmp_path: Path):  # type: ignore[no-untyped-def]
    server = McpServer.objects.create(
        mcp_id="notes",
        name="notes",
        command=sys.executable,
        args=["-m", "tests.mcp_fixtures.probe_server"],
        cwd=str(settings.BASE_DIR),
        env={"NOTES_FILE": str(tmp_path / "notes.txt")},
        session_scope="shared",
        timeout_s=10,
    )
    assert discover_as_admin(server=server).ok
    yield server
    get_default_pool().close("notes")


@pytest.mark.slow
def test_a_shadow_never_executes_a_write_and_its_disagreement_is_listed_first(
    demo_agent: Agent, notes_server: McpServer, tmp_path: Path
) -> None:
    demo_agent.servers.add(notes_server)
    agreeing = demo_agent
    # An identical shadow first (it agrees), then a candidate that writes a note for every question.
    twin = twin_candidate(agreeing)
    agent_shadow_set(agent=agreeing, actor="test-admin", via="tests", version=twin, rate=1.0)
    first = live_run(agreeing)
    run_execute(run_id=str(Run.objects.get(shadow_of=first).id))

    deterministic_rule_create(
        actor="test-admin",
        via="tests",
        data={
            "agent": demo_agent,
            "name": "메모 남기기",
            "order": 5,
            "server": notes_server,
            "tool_name": "append_note",
            "when": {"any_keywords": ["자산"]},
            "params": {"text": "{query}"},
        },
    )
    candidate = agent_version_publish(agent=demo_agent, actor="test-admin", via="tests", make_live=False)
    demo_agent.refresh_from_db()
    agent_shadow_set(agent=demo_agent, actor="test-admin", via="tests", version=candidate, rate=1.0)
    run = live_run(demo_agent)
    assert run.status == Run.Status.SUCCEEDED
    shadow = Run.objects.get(shadow_of=run)
    run_execute(run_id=str(shadow.id))
    shadow.refresh_from_db()

    assert not (tmp_path / "notes.txt").exists()  # never sent
    blocked = AuditEvent.objects.get(run_id=shadow.id, tool="append_note", action="tool.call")
    assert (blocked.source, blocked.reason, blocked.ok) == ("shadow", "eval:write_blocked", False)
    assert not Approval.objects.filter(run=shadow).exists()
    comparison = ShadowComparison.objects.get(live_run=run)
    assert (comparison.same_tools, comparison.agrees) == (False, False)
    assert "notes.append_note" in comparison.shadow_tools
    assert [c.live_run_id for c in ShadowComparison.objects.all()] == [run.id, first.id]


@pytest.mark.slow
def test_a_tool_marked_write_after_versions_froze_it_as_read_is_a_write_for_them_too(
    demo_agent: Agent, notes_server: McpServer, tmp_path: Path
) -> None:
    """An admin marked the note tool ``read`` by mistake, published a candidate that calls it, and corrected the
    risk: the candidate, frozen in between, sent the write from its shadow runs (which must never write) and, rolled
    back to, from live runs without approval."""
    demo_agent.servers.add(notes_server)
    contract = McpTool.objects.get(server=notes_server, name="append_note").contract
    tool_contract_update(contract=contract, actor="test-admin", via="tests", data={"risk": "read"})
    agent_version_publish(agent=demo_agent, actor="test-admin", via="tests")
    deterministic_rule_create(
        actor="test-admin",
        via="tests",
        data={
            "agent": demo_agent,
            "name": "메모 남기기",
            "order": 5,
            "server": notes_server,
            "tool_name": "append_note",
            "when": {"any_keywords": ["자산"]},
            "params": {"text": "{query}"},
        },
    )
    candidate = agent_version_publish(agent=demo_agent, actor="test-admin", via="tests", make_live=False)
    contract.refresh_from_db()
    tool_contract_update(contract=contract, actor="test-admin", via="tests", data={"risk": "write"})
    demo_agent.refresh_from_db()
    agent_shadow_set(agent=demo_agent, actor="test-admin", via="tests", version=candidate, rate=1.0)

    run = live_run(demo_agent)
    assert run.status == Run.Status.SUCCEEDED
    shadow = Run.objects.get(shadow_of=run)
    run_execute(run_id=str(shadow.id))
    blocked = AuditEvent.objects.get(run_id=shadow.id, tool="append_note", action="tool.call")
    assert (blocked.source, blocked.reason, blocked.ok) == ("shadow", "eval:write_blocked", False)

    agent_shadow_set(agent=demo_agent, actor="test-admin", via="tests", version=None, rate=0.0)
    agent_version_rollback(version=candidate, actor="test-admin", via="tests")
    run = live_run(demo_agent)
    assert run.status == Run.Status.AWAITING_APPROVAL  # asked before it writes
    assert Approval.objects.get(run=run).tool == "append_note"
    assert not (tmp_path / "notes.txt").exists()  # sent by neither


def test_a_shadow_reserves_its_share_of_the_agents_budget_and_is_skipped_when_it_is_spent(demo_agent: Agent) -> None:
    """A shadow spends the agent's tokens on the candidate: it used to be made with no reservation, so it ran on
    whatever was left of the agent's budget, or none."""
    from agents.budgets import budget_create
    from agents.models import BudgetReservation, BudgetUsage
    from agents.shadow import shadow_after_live

    candidate = twin_candidate(demo_agent)
    agent_shadow_set(agent=demo_agent, actor="test-admin", via="tests", version=candidate, rate=1.0)
    budget = budget_create(
        actor="test-admin",
        via="tests",
        data={"agent": demo_agent, "period": "day", "max_tokens": 25_000, "run_reservation_tokens": 10_000},
    )

    first = live_run(demo_agent)
    shadow = Run.objects.get(shadow_of=first)
    assert BudgetReservation.objects.get(run=shadow).tokens == 10_000
    assert BudgetUsage.objects.get(budget=budget).reserved_tokens == 10_000  # the shadow's: the live run settled

    BudgetUsage.objects.filter(budget=budget).update(used_tokens=20_000)  # the day's tokens spent elsewhere
    assert shadow_after_live(run_id=first.id) is None
    assert Run.objects.filter(shadow_of=first).count() == 1  # no second shadow, not even a row of one
