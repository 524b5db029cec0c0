"""Agent versions: publishing freezes the prompt, model, rules and tool contracts; live runs run the published
version while edits stay a draft; a roll back publishes old content as a new version; A/B arms split callers
stickily by weight."""

from __future__ import annotations

import unicodedata
from collections import Counter

import pytest

from agent_platform.errors import ApplicationError
from agents.execution import run_execute
from agents.models import Agent, AgentVersion, DeterministicRule, Run
from agents.services import (
    agent_arm_create,
    agent_update,
    agent_version_publish,
    agent_version_rollback,
    deterministic_rule_update,
    run_create,
    run_version_choice,
)
from agents.tools import DeterministicContext, deterministic_tool
from agents.versions import caller_key, pick_arm, version_diff
from audit.models import AuditEvent
from mcpregistry.models import McpServer, McpTool, ToolContract
from mcpregistry.services import mcp_tool_update, tool_contract_update
from tests.conftest import ApiCaller, make_agent

pytestmark = pytest.mark.django_db

ASSET_QUESTION = "A-1001 자산의 현재 상태를 알려주세요."


def run_now(agent: Agent, query: str = ASSET_QUESTION, **kwargs) -> Run:  # type: ignore[no-untyped-def]
    run = run_create(agent_slug=agent.slug, query=query, api_key=None, **kwargs)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    return run


def asset_rule(agent: Agent) -> DeterministicRule:
    return DeterministicRule.objects.get(agent=agent, tool_name="get_asset_status")


def asset_contract(agent: Agent) -> ToolContract:
    return ToolContract.objects.get(tool__server__in=agent.servers.all(), tool__name="get_asset_status")


def test_a_draft_edit_does_not_change_live_runs_until_it_is_published_and_a_roll_back_restores_the_old(
    demo_agent: Agent,
) -> None:
    v1 = agent_version_publish(agent=demo_agent, actor="test-admin", via="tests", note="first")
    before = run_now(demo_agent)
    assert (before.status, before.version, before.arm) == (Run.Status.SUCCEEDED, v1, "")
    assert before.answer.startswith("A-1001:")

    # Draft edits: the rule's answer template, and the tool's contract (A-1001 no longer allowed).
    deterministic_rule_update(
        rule=asset_rule(demo_agent), actor="test-admin", via="tests", data={"answer_template": "초안 {result.asset_id}"}
    )
    tool_contract_update(
        contract=asset_contract(demo_agent),
        actor="test-admin",
        via="tests",
        data={"args": {"asset_id": {"type": "str", "required": True, "allowed": ["A-9999"]}}},
    )
    demo_agent.refresh_from_db()
    assert demo_agent.live_version == v1
    still = run_now(demo_agent)
    assert (still.status, still.version, still.answer) == (Run.Status.SUCCEEDED, v1, before.answer)

    v2 = agent_version_publish(agent=demo_agent, actor="test-admin", via="tests")
    assert v2.number == 2
    after = run_now(demo_agent)
    assert after.version == v2
    [call] = [r for r in after.deterministic_results if r["tool"] == "get_asset_status"]
    assert call["error"] == "args:allowed:asset_id"  # the published contract applies now

    diff = {row["path"]: (row["old"], row["new"]) for row in version_diff(v1.content, v2.content)}
    assert diff["rules.자산 상태 조회.answer_template"][1] == "초안 {result.asset_id}"
    assert diff["contracts.sds-company-data/get_asset_status.args.asset_id.allowed"] == (None, ["A-9999"])

    v3 = agent_version_rollback(version=v1, actor="test-admin", via="tests")
    assert (v3.number, v3.digest, v3.content) == (3, v1.digest, v1.content)
    back = run_now(demo_agent)
    assert (back.status, back.version, back.answer) == (Run.Status.SUCCEEDED, v3, before.answer)
    # Every publish is audited with the version's content, and moving the live version with it.
    publishes = AuditEvent.objects.filter(action="config.agent_version.publish").order_by("id")
    assert publishes.count() == 3
    moves = AuditEvent.objects.filter(action="config.agent.update", actor="test-admin").order_by("id")
    assert [e.args["live_version"][1] for e in moves if "live_version" in e.args] == [str(v1), str(v2), str(v3)]


def test_a_version_is_frozen_its_content_survives_edits_and_the_prompt_and_model_are_its_own(
    demo_agent: Agent,
) -> None:
    v1 = agent_version_publish(agent=demo_agent, actor="test-admin", via="tests")
    agent_update(
        agent=demo_agent,
        actor="test-admin",
        via="tests",
        data={"model_provider": "scripted", "model_params": {"script": [{"content": "초안 모델"}]}},
    )
    v1.refresh_from_db()
    assert v1.content["agent"]["model_provider"] == "offline"
    run = run_now(demo_agent, "아무 규칙에도 맞지 않는 질문")
    assert run.version == v1 and run.answer != "초안 모델"
    # The draft is what an explicit draft-less agent would run; published, it answers from the script.
    agent_version_publish(agent=demo_agent, actor="test-admin", via="tests")
    assert run_now(demo_agent, "아무 규칙에도 맞지 않는 질문").answer == "초안 모델"


def test_a_tool_enabled_after_the_publish_waits_for_the_next_one_and_a_disabled_tool_leaves_at_once(
    demo_server: McpServer,
) -> None:
    agent = make_agent(
        slug="frozen-tools",
        servers=[demo_server],
        provider="scripted",
        with_demo_rules=False,
        script=[
            {"tool_calls": [{"name": "list_projects", "args": {"team": "물류플랫폼팀"}}]},
            {"content": "결과: {last_tool_result}"},
        ],
    )
    tool = McpTool.objects.get(server=demo_server, name="list_projects")
    mcp_tool_update(tool=tool, actor="test-admin", via="tests", data={"enabled": False})
    v1 = agent_version_publish(agent=agent, actor="test-admin", via="tests")
    assert "sds-company-data/list_projects" not in v1.content["contracts"]
    mcp_tool_update(tool=tool, actor="test-admin", via="tests", data={"enabled": True})

    refused = run_now(agent, "물류플랫폼팀 프로젝트 알려줘")
    assert refused.version == v1
    event = AuditEvent.objects.get(run_id=refused.id, action="tool.call")
    assert (event.tool, event.ok, event.reason) == ("list_projects", False, "tool:unknown")
    assert "차세대 물류 플랫폼 구축" not in refused.answer

    v2 = agent_version_publish(agent=agent, actor="test-admin", via="tests")
    assert "sds-company-data/list_projects" in v2.content["contracts"]
    called = run_now(agent, "물류플랫폼팀 프로젝트 알려줘")
    assert called.version == v2
    assert "차세대 물류 플랫폼 구축" in called.answer

    # Disabling is a kill switch: the published version loses the tool without a publish.
    mcp_tool_update(tool=tool, actor="test-admin", via="tests", data={"enabled": False})
    withdrawn = run_now(agent, "물류플랫폼팀 프로젝트 알려줘")
    assert withdrawn.version == v2
    last = AuditEvent.objects.filter(run_id=withdrawn.id, action="tool.call").get()
    assert (last.ok, last.reason) == (False, "tool:unknown")


SEEN_TOOLS: list[list[str]] = []


@deterministic_tool(mcp_id="sds-company-data")
def route_to_list_projects(ctx: DeterministicContext) -> dict:
    SEEN_TOOLS.append(sorted(t.name for t in ctx.mcp_tools or []))
    return {"tool_name": "list_projects", "params": {"team": "물류플랫폼팀"}}


def test_a_code_rule_of_a_published_version_sees_and_calls_only_the_tools_the_version_froze(
    demo_server: McpServer,
) -> None:
    """A tool enabled after the publish is unknown to the version's runs in the deterministic stage as in the
    gate: the rule's ``mcp_tools`` leave it out, and a rule that names it fails the stage as seed 000 says
    (deterministic:tool_unknown), not as a failed call that the run goes on from."""
    agent = make_agent(slug="frozen-rule-tools", servers=[demo_server], with_demo_rules=False)
    DeterministicRule.objects.create(agent=agent, name="projects", code=f"{__name__}.route_to_list_projects")
    tool = McpTool.objects.get(server=demo_server, name="list_projects")
    mcp_tool_update(tool=tool, actor="test-admin", via="tests", data={"enabled": False})
    v1 = agent_version_publish(agent=agent, actor="test-admin", via="tests")
    mcp_tool_update(tool=tool, actor="test-admin", via="tests", data={"enabled": True})
    SEEN_TOOLS.clear()
    run = run_now(agent, "물류플랫폼팀 프로젝트 알려줘")
    assert run.version == v1
    assert (run.status, run.error_code) == (Run.Status.FAILED, "deterministic:tool_unknown")
    assert "'list_projects' tool이 MCP 'sds-company-data'에 없습니다" in run.error_message
    assert "list_projects" not in SEEN_TOOLS[0] and "search_employee" in SEEN_TOOLS[0]
    [refusal] = AuditEvent.objects.filter(run_id=run.id, action="tool.call")
    assert (refusal.tool, refusal.ok, refusal.reason, refusal.attempt) == ("list_projects", False, "tool:unknown", 0)


def test_publishing_the_live_content_again_makes_no_new_version(demo_agent: Agent) -> None:
    v1 = agent_version_publish(agent=demo_agent, actor="test-admin", via="tests")
    assert agent_version_publish(agent=demo_agent, actor="test-admin", via="tests") == v1
    assert AgentVersion.objects.filter(agent=demo_agent).count() == 1


def test_an_agent_set_to_publish_on_save_publishes_every_edit(demo_agent: Agent) -> None:
    agent_update(agent=demo_agent, actor="test-admin", via="tests", data={"publish_on_save": True})
    first = demo_agent.live_version
    assert first is not None
    deterministic_rule_update(
        rule=asset_rule(demo_agent), actor="test-admin", via="tests", data={"answer_template": "즉시 {result.asset_id}"}
    )
    demo_agent.refresh_from_db()
    assert demo_agent.live_version.number == first.number + 1
    assert run_now(demo_agent).answer == "즉시 A-1001"


def test_a_never_published_agent_runs_as_stored(demo_agent: Agent) -> None:
    run = run_now(demo_agent)
    assert (run.status, run.version) == (Run.Status.SUCCEEDED, None)


def test_a_run_of_a_chosen_version_runs_it_and_an_unknown_version_is_a_404(demo_agent: Agent) -> None:
    v1 = agent_version_publish(agent=demo_agent, actor="test-admin", via="tests")
    deterministic_rule_update(
        rule=asset_rule(demo_agent), actor="test-admin", via="tests", data={"answer_template": "둘째 {result.asset_id}"}
    )
    agent_version_publish(agent=demo_agent, actor="test-admin", via="tests")
    old = run_now(demo_agent, version=1, purpose=Run.Purpose.EVAL)
    assert (old.version, old.purpose) == (v1, Run.Purpose.EVAL)
    assert old.answer.startswith("A-1001:")
    with pytest.raises(ApplicationError) as refused:
        run_create(agent_slug=demo_agent.slug, query="q", api_key=None, version=9)
    assert (refused.value.status, refused.value.code) == (404, "version_not_found")


# --- A/B arms ---------------------------------------------------------------------------------------------


def two_arms(agent: Agent, weights: tuple[int, int]) -> tuple[AgentVersion, AgentVersion]:
    a = agent_version_publish(agent=agent, actor="test-admin", via="tests")
    deterministic_rule_update(
        rule=asset_rule(agent), actor="test-admin", via="tests", data={"answer_template": "B안 {result.asset_id}"}
    )
    b = agent_version_publish(agent=agent, actor="test-admin", via="tests")
    agent_arm_create(
        actor="test-admin", via="tests", data={"agent": agent, "name": "a", "version": a, "weight": weights[0]}
    )
    agent_arm_create(
        actor="test-admin", via="tests", data={"agent": agent, "name": "b", "version": b, "weight": weights[1]}
    )
    return a, b


@pytest.mark.slow
def test_arms_split_1000_callers_by_weight_and_each_caller_stays_in_its_arm(
    demo_agent: Agent, api_caller: ApiCaller
) -> None:
    a, b = two_arms(demo_agent, (70, 30))
    demo_agent.refresh_from_db()
    first: dict[int, str] = {}
    for i in range(1000):
        _version, arm = run_version_choice(
            agent=demo_agent, api_key=api_caller.key, context={"userId": f"E-{i}"}, version=None, purpose="live"
        )
        first[i] = arm
    shares = Counter(first.values())
    assert abs(shares["a"] / 1000 - 0.70) <= 0.04 and abs(shares["b"] / 1000 - 0.30) <= 0.04, shares
    for i in range(1000):  # sticky: the same caller (another session of theirs too) gets the same arm
        version, arm = run_version_choice(
            agent=demo_agent,
            api_key=api_caller.key,
            context={"userId": f"E-{i}", "sessionId": f"s-{i}-again"},
            version=None,
            purpose="live",
        )
        assert arm == first[i] and version == (a if arm == "a" else b)


def test_a_run_records_its_arm_and_runs_the_arms_version(demo_agent: Agent, api_caller: ApiCaller) -> None:
    _a, b = two_arms(demo_agent, (0, 1))  # every caller in b
    run = run_create(agent_slug=demo_agent.slug, query=ASSET_QUESTION, api_key=api_caller.key)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert (run.arm, run.version, run.answer) == ("b", b, "B안 A-1001")
    # An eval asks for a version: no arm.
    chosen, arm = run_version_choice(agent=demo_agent, api_key=None, context={}, version=1, purpose="eval")
    assert (chosen.number, arm) == (1, "")


def test_pick_arm_without_weight_picks_none_and_a_paused_arm_gets_no_one() -> None:
    assert pick_arm([("a", 0)], "k") is None
    assert {pick_arm([("a", 0), ("b", 5)], f"k{i}") for i in range(200)} == {"b"}


def test_an_agent_with_versions_and_arms_but_no_runs_can_be_deleted(demo_agent: Agent) -> None:
    from agents.services import agent_delete

    a, _b = two_arms(demo_agent, (1, 1))
    agent_delete(agent=demo_agent, actor="test-admin", via="tests")
    assert not AgentVersion.objects.filter(pk=a.pk).exists()


def test_a_korean_user_id_typed_decomposed_keeps_its_arm() -> None:
    """The same person's ``userId`` typed on macOS (decomposed: 김 as ᄀ+ᅵ+ᆷ) and on Windows (composed) is one
    caller: the same arm, whatever the split."""
    composed = "김하늘"
    decomposed = unicodedata.normalize("NFD", composed)
    assert decomposed != composed
    keys = [caller_key(agent_slug="demo", api_key_id=7, context={"userId": name}) for name in (composed, decomposed)]
    assert keys[0] == keys[1]
    arms = [("a", 1), ("b", 1), ("c", 1)]
    assert pick_arm(arms, keys[0]) == pick_arm(arms, keys[1])
    # A number as an id is one too.
    assert caller_key(agent_slug="demo", api_key_id=7, context={"userId": 42}).endswith("\n42")
