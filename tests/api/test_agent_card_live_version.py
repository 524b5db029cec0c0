"""The A2A cards describe what live traffic runs. Defect held here: once an agent was published, its card (and
the directory card) described the draft: rules renamed but not yet published, the tools of a server bound only
in the draft, the draft prompt's first line. A card now reads the live version's prompt, rules and frozen tools;
an agent never published is described as stored. The MCP server's ``tools/list`` had the same defect (the tool's
description from the draft prompt); it now reads the live version's prompt too."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from agents.management.commands.seed_demo import SYSTEM_PROMPT
from agents.models import Agent, DeterministicRule
from agents.services import agent_update, agent_version_publish, deterministic_rule_update
from mcpregistry.models import McpServer, McpTool
from tests.conftest import ApiCaller, make_agent

pytestmark = pytest.mark.django_db

LIVE_RULE = "직원 소속 조회"
DRAFT_RULE = "초안: 새 규칙 이름"
DRAFT_KEYWORD = "초안키워드"
DRAFT_PROMPT = "DRAFT: secret new persona"
LIVE_LINE = SYSTEM_PROMPT.strip().splitlines()[0][:500]


def draft_edits(agent: Agent) -> None:
    """Edit ``agent`` as an admin would, through the services, without publishing: rename a rule and give it a
    keyword, prefix the prompt, and bind a second server with a tool of its own."""
    rule = DeterministicRule.objects.get(agent=agent, name=LIVE_RULE)
    when = {**rule.when, "any_keywords": [*rule.when.get("any_keywords", []), DRAFT_KEYWORD]}
    deterministic_rule_update(rule=rule, actor="test-admin", via="tests", data={"name": DRAFT_RULE, "when": when})
    leave = McpServer.objects.create(
        mcp_id="hr-leave", name="HR leave", transport=McpServer.Transport.STREAMABLE_HTTP, url="http://hr.invalid/mcp"
    )
    McpTool.objects.create(server=leave, name="approve_leave", description="Approve a leave request.")
    agent_update(
        agent=agent,
        actor="test-admin",
        via="tests",
        data={"system_prompt": f"{DRAFT_PROMPT}\n{agent.system_prompt}"},
        servers=[*agent.servers.all(), leave],
    )


def card_of(caller: ApiCaller, slug: str) -> dict[str, Any]:
    response = Client(HTTP_AUTHORIZATION=f"Bearer {caller.raw_key}").get(f"/a2a/{slug}/.well-known/agent-card.json")
    assert response.status_code == 200, response.content
    card: dict[str, Any] = response.json()
    return card


def directory_of(caller: ApiCaller) -> dict[str, Any]:
    response = Client(HTTP_AUTHORIZATION=f"Bearer {caller.raw_key}").get("/.well-known/agent-card.json")
    assert response.status_code == 200, response.content
    card: dict[str, Any] = response.json()
    return card


def test_a_published_agents_card_shows_its_live_version_not_the_unpublished_draft(
    api_caller: ApiCaller, demo_agent: Agent
) -> None:
    agent_version_publish(agent=demo_agent, actor="test-admin", via="tests", note="v1")
    before = card_of(api_caller, demo_agent.slug)
    draft_edits(demo_agent)

    card = card_of(api_caller, demo_agent.slug)
    assert card["description"] == LIVE_LINE
    names = {skill["name"] for skill in card["skills"]}
    assert LIVE_RULE in names and DRAFT_RULE not in names
    assert "search_employee" in names  # a tool the live version froze
    assert "approve_leave" not in names  # a tool of a server bound only in the draft
    assert card["skills"] == before["skills"]
    text = json.dumps(card, ensure_ascii=False)
    assert DRAFT_PROMPT not in text and DRAFT_KEYWORD not in text

    # The directory card says the same, for one agent (its card) and for several (one skill each).
    assert directory_of(api_caller)["skills"] == card["skills"]
    make_agent(slug="other", servers=list(demo_agent.servers.all()), with_demo_rules=False)
    [skill] = [s for s in directory_of(api_caller)["skills"] if s["id"] == demo_agent.slug]
    assert skill["description"] == LIVE_LINE

    # Published, the draft is what live traffic runs: the card follows.
    agent_version_publish(agent=demo_agent, actor="test-admin", via="tests", note="v2")
    published = card_of(api_caller, demo_agent.slug)
    assert published["description"] == DRAFT_PROMPT
    names = {skill["name"] for skill in published["skills"]}
    assert DRAFT_RULE in names and LIVE_RULE not in names and "approve_leave" in names


def test_an_agent_never_published_is_described_as_stored(api_caller: ApiCaller, demo_agent: Agent) -> None:
    draft_edits(demo_agent)

    card = card_of(api_caller, demo_agent.slug)
    assert card["description"] == DRAFT_PROMPT
    names = {skill["name"] for skill in card["skills"]}
    assert DRAFT_RULE in names and LIVE_RULE not in names
    assert {"search_employee", "approve_leave"} <= names
    [rule] = [skill for skill in card["skills"] if skill["name"] == DRAFT_RULE]
    assert DRAFT_KEYWORD in rule["tags"]


def mcp_tool_of(caller: ApiCaller, slug: str) -> dict[str, Any]:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    client = Client(HTTP_AUTHORIZATION=f"Bearer {caller.raw_key}")
    response = client.post("/mcp/", body, content_type="application/json", headers={"Accept": "application/json"})
    assert response.status_code == 200, response.content
    [tool] = [t for t in response.json()["result"]["tools"] if t["name"] == f"ask_{slug}"]
    described: dict[str, Any] = tool
    return described


def test_a_published_agents_mcp_tool_is_described_by_its_live_prompt_not_the_draft(
    api_caller: ApiCaller, demo_agent: Agent
) -> None:
    agent_version_publish(agent=demo_agent, actor="test-admin", via="tests", note="v1")
    draft_edits(demo_agent)

    description = mcp_tool_of(api_caller, demo_agent.slug)["description"]
    assert LIVE_LINE[:300] in description and DRAFT_PROMPT not in description

    agent_version_publish(agent=demo_agent, actor="test-admin", via="tests", note="v2")
    assert DRAFT_PROMPT in mcp_tool_of(api_caller, demo_agent.slug)["description"]


def test_mcp_tools_list_reads_the_live_prompts_in_one_query_whatever_the_number_of_agents(
    api_caller: ApiCaller, demo_agent: Agent
) -> None:
    """Each published agent's live version (every contract it froze) was read whole, one query per agent."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            mcp_tool_of(api_caller, demo_agent.slug)
        return len(captured.captured_queries)

    agent_version_publish(agent=demo_agent, actor="test-admin", via="tests")
    queries()  # the key's and the configuration's caches filled
    one = queries()
    for n in range(3):
        extra = make_agent(slug=f"extra-{n}", servers=[], provider="offline", script=None, with_demo_rules=False)
        agent_version_publish(agent=extra, actor="test-admin", via="tests")
    queries()
    assert queries() == one
