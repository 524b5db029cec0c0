"""Top-K selection against a server that writes its tools' descriptions to be picked: text the platform does not
control (a description listing common request words, repeated) must not outweigh what an admin curated (a tool's
tags and example queries). The demo server is real (stdio, discovered); the wordy server's tools are rows made
through the audited services, as the bench makes its generated servers; only the model is scripted."""

from __future__ import annotations

import pytest

from agents.execution import run_execute
from agents.models import Agent, Run
from agents.tool_selection import LexicalRanker, ToolDoc
from mcpregistry.models import McpServer
from mcpregistry.services import mcp_server_create, mcp_tool_create, mcp_tool_update
from tests.conftest import make_agent

pytestmark = pytest.mark.django_db

# What a server wrote about itself to be offered for every question: the common request words, and a few domain
# words, repeated.
STUFFED = " ".join(["우리 팀 현황, 인원, 조회, 검색, 확인해서 알려줘, 정보, 목록 좀 보여줘."] * 3)
# A question of common words only, as an admin wrote it for the team tool: the wordy server's text has each of them.
QUERY = "우리 팀 인원 현황 좀 확인해서 알려줘"


def wordy_server() -> McpServer:
    server = mcp_server_create(
        actor="test-admin",
        via="tests",
        data={
            "mcp_id": "wordy-hub",
            "name": "wordy-hub",
            "transport": "streamable_http",
            "url": "https://tools.example.com/wordy-hub/mcp",
        },
    )
    for name in ("find_documents", "find_mail", "find_notices"):
        mcp_tool_create(
            server=server,
            name=name,
            actor="test-admin",
            via="tests",
            data={"description": f"{name.replace('_', ' ')}: {STUFFED}", "input_schema": {"type": "object"}},
        )
    return server


def offered(run: Run) -> list[str]:
    entries = [m for m in run.messages if m.get("type") == "tool_selection"]
    return [o["name"] for o in entries[0]["offered"]]


def test_an_admins_example_query_matched_word_for_word_keeps_its_slot_against_a_stuffed_server(
    demo_server: McpServer,
) -> None:
    mcp_tool_update(
        tool=demo_server.tools.get(name="list_team_members"),
        actor="test-admin",
        via="tests",
        data={"example_queries": [QUERY]},
    )
    wordy = wordy_server()
    agent = make_agent(
        slug="picker",
        servers=[demo_server, wordy],
        provider="scripted",
        script=[{"content": "ok"}],
        with_demo_rules=False,
    )
    Agent.objects.filter(pk=agent.pk).update(tool_selection={"enabled": True, "top_k": 3})
    run = Run.objects.create(agent=agent, query=QUERY)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()

    assert run.status == Run.Status.SUCCEEDED, run.error_message
    names = offered(run)
    assert len(names) == 3
    assert "list_team_members" in names, names


def test_an_exact_example_query_ranks_its_tool_above_every_tool_matched_by_server_text_alone() -> None:
    docs = [
        ToolDoc(name=f"wordy_{i}", mcp_id="wordy", description=f"{topic} {STUFFED}")
        for i, topic in enumerate(["문서", "메일", "공지"])
    ]
    docs.append(
        ToolDoc(name="list_team_members", mcp_id="demo", description="팀의 구성원 목록", example_queries=(QUERY,))
    )
    scores = LexicalRanker(docs).score(QUERY)
    assert max(scores, key=scores.__getitem__) == "list_team_members", scores


def test_repeating_words_over_and_over_in_a_description_wins_a_tool_nothing_over_saying_them_once() -> None:
    once = ToolDoc(name="once", description="팀 인원 조회해서 알려줘")
    repeated = ToolDoc(name="repeated", description=" ".join(["팀 인원 조회해서 알려줘"] * 4))
    others = [
        ToolDoc(name=f"other_{i}", description=f"{topic} 관리") for i, topic in enumerate(["예산", "계약", "배송"])
    ]
    scores = LexicalRanker([once, repeated, *others]).score("우리 팀 인원 알려줘")
    assert scores["repeated"] <= scores["once"], scores


def test_a_tag_an_admin_gave_outweighs_the_same_word_in_another_tools_description() -> None:
    tagged = ToolDoc(name="tagged", description="Remaining leave days", tags=("연차",))
    described = ToolDoc(name="described", description="연차 연차 연차 휴가 현황")
    others = [
        ToolDoc(name=f"other_{i}", description=f"{topic} 관리") for i, topic in enumerate(["예산", "계약", "배송"])
    ]
    scores = LexicalRanker([tagged, described, *others]).score("연차")
    assert scores["tagged"] > scores["described"], scores
