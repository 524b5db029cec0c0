"""An agent's tool-selection filters (servers, tags) hold wherever a tool is named against them.

Defects held here:

- A: a rule could force a tool outside the agent's servers and tags (the rule form and
  ``deterministic_rule_update`` checked only that it was one of the agent's tools); the run then dropped the forcing
  with nothing in its trace. Now both refuse it, naming the tool and the filters, and a run that cannot force a
  rule's tool (a rule stored before the check) says so in its trace (``forced_dropped``).
- B: tags were compared as typed, while the ranker reads them composed (NFC): a tag typed decomposed (macOS) on a
  tool or in the filter was "not a tag of this agent's tools" and a stored filter offered no tool at all. Now the
  filter and the form's check compare composed text and the agent editor saves the tags composed (the tools' own
  tags: ``tests/mcpregistry/test_tool_tags_nfc.py``). Tags stored decomposed before are left as they are (no data
  migration: a change no audit event would record) and match all the same.

Real demo server; only the model is scripted.
"""

from __future__ import annotations

import re
import sys
import unicodedata
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.test import Client
from django.utils import timezone

from agents.agent_settings_form import agent_settings_problems
from agents.execution import run_execute
from agents.models import Agent, DeterministicRule, Run
from agents.services import agent_update, deterministic_rule_update
from agents.tool_selection import LexicalRanker, ToolDoc, ToolSelectionSettings, select_tools
from mcpregistry.models import McpServer, McpTool
from mcpregistry.services import mcp_tool_update
from tests.agents.test_agent_settings_editor import change_url, post_data, selection_inputs
from tests.agents.test_rule_editor import errors, rule_post
from tests.conftest import make_agent

pytestmark = pytest.mark.django_db

ASSET = "자산"
ASSET_NFD = unicodedata.normalize("NFD", ASSET)


def run_query(agent: Agent, query: str) -> Run:
    run = Run.objects.create(agent=agent, query=query)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    return run


def first_selection(run: Run) -> dict[str, Any]:
    return next(m for m in run.messages if m.get("type") == "tool_selection")


def first_tool_choice(run: Run) -> Any:
    turn = next(m for m in run.conversation if m["type"] == "ai")
    return turn["data"]["response_metadata"]["tool_choice"]


@pytest.fixture
def asset_agent(demo_server: McpServer) -> Agent:
    """The reviewer's setup: get_asset and get_asset_status tagged asset, the agent's selection keeping only
    that tag, the demo rules (``직원 소속 조회`` matches "박도윤 님 소속")."""
    for name in ("get_asset", "get_asset_status"):
        mcp_tool_update(tool=demo_server.tools.get(name=name), actor="admin", via="tests", data={"tags": ["asset"]})
    agent = make_agent(
        slug="picker", servers=[demo_server], provider="scripted", script=[{"content": "done"}], with_demo_rules=True
    )
    agent_update(
        agent=agent,
        actor="admin",
        via="tests",
        data={"tool_selection": {"enabled": True, "top_k": 5, "tags": ["asset"]}},
    )
    return Agent.objects.get(pk=agent.pk)


# ---- A: a rule's forced tool against the agent's filters ----------------------------------------------------------


def test_the_rule_service_refuses_to_force_a_tool_outside_the_agents_servers_and_tags(asset_agent: Agent) -> None:
    rule = asset_agent.rules.get(name="직원 소속 조회")
    with pytest.raises(ValidationError) as caught:
        deterministic_rule_update(rule=rule, actor="admin", via="tests", data={"force_first_tool": "list_projects"})
    assert caught.value.message_dict["force_first_tool"] == [
        "'list_projects' is outside the servers and tags the agent's tool selection chooses (servers: —; tags: "
        "asset), so the model would never be offered it; widen the agent's filters or choose another tool"
    ]
    assert DeterministicRule.objects.get(pk=rule.pk).force_first_tool == ""
    # A tool the filters keep is forced, and "any" is always fine.
    for forced in ("get_asset", "any"):
        rule = DeterministicRule.objects.get(pk=rule.pk)
        deterministic_rule_update(rule=rule, actor="admin", via="tests", data={"force_first_tool": forced})
        assert DeterministicRule.objects.get(pk=rule.pk).force_first_tool == forced


def test_with_selection_off_the_filters_do_not_apply_and_the_rule_may_force_any_of_the_agents_tools(
    asset_agent: Agent,
) -> None:
    agent_update(
        agent=asset_agent, actor="admin", via="tests", data={"tool_selection": {"enabled": False, "tags": ["asset"]}}
    )
    rule = DeterministicRule.objects.get(agent=asset_agent, name="직원 소속 조회")
    deterministic_rule_update(rule=rule, actor="admin", via="tests", data={"force_first_tool": "list_projects"})
    run = run_query(Agent.objects.get(pk=asset_agent.pk), "박도윤 님 소속 팀의 프로젝트")
    assert first_tool_choice(run) == "list_projects"


@pytest.fixture
def ledger() -> Agent:
    """An agent whose selection keeps the tag 장부: lookup has it, audit_log has not."""
    server = McpServer.objects.create(mcp_id="Ledger-Data", name="ledger", command=sys.executable, args=[])
    now = timezone.now()
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "limit": {"type": "integer"}}}
    McpTool.objects.create(server=server, name="lookup", input_schema=schema, discovered_at=now, tags=["장부"])
    McpTool.objects.create(server=server, name="audit_log", input_schema=schema, discovered_at=now)
    agent = Agent.objects.create(
        slug="ledger", name="ledger", model_provider="scripted", tool_selection={"enabled": True, "tags": ["장부"]}
    )
    agent.servers.set([server])
    return agent


def test_the_rule_form_refuses_a_forced_tool_outside_the_filters_naming_them_and_offers_only_those_inside(
    admin_client: Client, ledger: Agent
) -> None:
    response = admin_client.post(
        "/admin/agents/deterministicrule/add/", rule_post(ledger, force_first_tool="audit_log")
    )
    assert response.status_code == 200
    refusal = (
        "&#x27;audit_log&#x27; is outside the servers and tags the agent&#x27;s tool selection chooses (servers: —; "
        "tags: 장부), so the model would never be offered it"
    )
    assert errors(response.content.decode()).count(refusal) == 1
    assert not DeterministicRule.objects.exists()
    response = admin_client.post("/admin/agents/deterministicrule/add/", rule_post(ledger, force_first_tool="lookup"))
    assert response.status_code == 302, errors(response.content.decode())
    rule = DeterministicRule.objects.get()
    page = admin_client.get(f"/admin/agents/deterministicrule/{rule.pk}/change/").content.decode()
    select = re.search(r'<select name="force_first_tool".*?</select>', page, re.S)
    assert select is not None
    assert re.findall(r'<option value="([^"]*)"', select.group(0)) == ["", "any", "lookup"]


def test_a_run_that_cannot_force_a_stored_rules_tool_says_so_in_its_trace(
    asset_agent: Agent, admin_client: Client
) -> None:
    # A rule stored before the check (written here as an older release let it be written).
    DeterministicRule.objects.filter(agent=asset_agent, name="직원 소속 조회").update(force_first_tool="list_projects")
    run = run_query(asset_agent, "박도윤 님 소속 팀의 프로젝트")
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert first_tool_choice(run) is None
    selection = first_selection(run)
    assert sorted(o["name"] for o in selection["offered"]) == ["get_asset", "get_asset_status"]
    assert selection["forced_dropped"] == {"tool": "list_projects", "why": "filtered_out"}
    page = admin_client.get(f"/admin/agents/run/{run.pk}/change/").content.decode()
    assert "could not force list_projects: outside the agent&#x27;s tool selection filters" in page


def test_with_selection_off_a_rules_forced_tool_the_run_does_not_have_is_noted_in_the_trace(
    demo_server: McpServer,
) -> None:
    agent = make_agent(
        slug="plain", servers=[demo_server], provider="scripted", script=[{"content": "done"}], with_demo_rules=True
    )
    DeterministicRule.objects.filter(agent=agent, name="직원 소속 조회").update(force_first_tool="retired_tool")
    run = run_query(agent, "박도윤 님 소속 팀의 프로젝트")
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert first_tool_choice(run) is None
    selection = first_selection(run)
    assert selection["forced_dropped"] == {"tool": "retired_tool", "why": "not_a_tool"}
    assert len(selection["offered"]) == len(demo_server.tools.filter(enabled=True, available=True))


# ---- B: tags compared composed -------------------------------------------------------------------------------------


def test_a_tag_typed_decomposed_on_either_side_still_filters_to_its_tools() -> None:
    docs = [
        ToolDoc(name="get_asset", tags=(ASSET_NFD,)),
        ToolDoc(name="get_asset_status", tags=(ASSET,)),
        ToolDoc(name="ping"),
    ]
    ranker = LexicalRanker(docs)
    for tags in ([ASSET], [ASSET_NFD]):
        selection = select_tools(
            ranker=ranker,
            text="A-1001 자산 상태",
            candidates=docs,
            settings=ToolSelectionSettings(enabled=True, tags=tags),
        )
        assert sorted(selection.offered) == ["get_asset", "get_asset_status"], tags


def test_the_settings_check_knows_a_tag_its_tool_holds_decomposed(demo_server: McpServer) -> None:
    # A tool's tags as an older release stored them, decomposed.
    McpTool.objects.filter(server=demo_server, name="get_asset").update(tags=[ASSET_NFD])
    problems = agent_settings_problems(
        tool_selection={"enabled": True, "tags": [ASSET], "pinned": ["get_asset"]},
        mcp_context={},
        servers=[demo_server],
    )
    assert problems == {}


def test_a_stored_filter_with_a_decomposed_tag_still_offers_its_tools(demo_server: McpServer) -> None:
    mcp_tool_update(
        tool=demo_server.tools.get(name="get_asset_status"), actor="admin", via="tests", data={"tags": [ASSET]}
    )
    agent = make_agent(
        slug="picker", servers=[demo_server], provider="scripted", script=[{"content": "done"}], with_demo_rules=False
    )
    Agent.objects.filter(pk=agent.pk).update(tool_selection={"enabled": True, "tags": [ASSET_NFD]})
    run = run_query(Agent.objects.get(pk=agent.pk), "A-1001 자산 상태")
    assert [o["name"] for o in first_selection(run)["offered"]] == ["get_asset_status"]


def test_the_agent_editor_saves_the_tags_composed(admin_client: Client, demo_server: McpServer) -> None:
    for name, tags in (("get_asset", [ASSET]), ("ping", ["asset"])):
        mcp_tool_update(tool=demo_server.tools.get(name=name), actor="admin", via="tests", data={"tags": tags})
    agent = make_agent(slug="picker", servers=[demo_server], provider="scripted", script=[], with_demo_rules=False)
    response = admin_client.post(
        change_url(agent), post_data(agent, **selection_inputs(enabled="on", tags=f"{ASSET_NFD}, asset"))
    )
    assert response.status_code == 302, errors(response.content.decode())
    agent.refresh_from_db()
    assert agent.tool_selection["tags"] == [ASSET, "asset"]
