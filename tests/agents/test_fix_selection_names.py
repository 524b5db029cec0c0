"""The lexical ranker reads a tool's own name and folds the width of what it reads (defects: a tool the model knows
by an alias, ``직원.검색`` offered as ``tool_66dde059``, was indexed by the alias alone and never ranked by its name;
full-width "ＶＰＮ" and "３월", typed in a Korean IME's full-width mode, matched nothing written half-width)."""

from __future__ import annotations

import sys
import unicodedata

import pytest

from agents.engine import model_tool_names
from agents.execution import run_execute
from agents.models import Run
from agents.tool_offer import tool_doc
from agents.tool_selection import LexicalRanker, ToolDoc, ToolSelectionSettings, select_tools, tokens
from mcpregistry.models import McpServer, McpTool, ToolContract
from mcpregistry.services import mcp_server_discover
from tests.conftest import make_agent

# ---- a tool's own name ------------------------------------------------------------------------------------------


def test_a_tool_named_in_korean_ranks_by_its_own_name_and_is_offered_by_its_alias() -> None:
    server = McpServer(mcp_id="hr")
    tools = [
        McpTool(server=server, name=name, description=description, input_schema={"properties": {}})
        for name, description in [
            ("직원_검색", "Looks up a person by name."),
            ("자산_조회", "Returns the record."),
            ("list_projects", "Lists projects."),
        ]
    ]
    names = model_tool_names([t.exposed_name for t in tools])
    assert names["직원_검색"] != "직원_검색"  # an alias: the providers refuse Hangul in a tool name
    docs = [tool_doc(names[t.exposed_name], server, t) for t in tools]
    settings = ToolSelectionSettings(enabled=True, top_k=1)

    for query, tool in [("직원 검색해줘", "직원_검색"), ("자산 조회", "자산_조회")]:
        selection = select_tools(ranker=LexicalRanker(docs), text=query, candidates=docs, settings=settings)
        assert selection.offered == [names[tool]], (query, selection.scores)


@pytest.mark.slow
@pytest.mark.django_db
def test_a_run_offers_the_korean_named_tool_its_query_names() -> None:
    server = McpServer.objects.create(
        mcp_id="dotted",
        name="dotted",
        transport=McpServer.Transport.STDIO,
        command=sys.executable,
        args=["-m", "tests.agents.mcp_dotted_tools_server"],
        timeout_s=10,
    )
    report = mcp_server_discover(server=server, actor="test", via="tests")
    assert report.ok, report.error
    ToolContract.objects.filter(tool__server=server).update(risk="read")
    alias = model_tool_names(["projects.list", "직원.검색"])["직원.검색"]
    agent = make_agent(
        slug="korean-names", servers=[server], provider="scripted", script=[{"content": "done"}], with_demo_rules=False
    )
    agent.tool_selection = {"enabled": True, "top_k": 1}
    agent.save()

    run = Run.objects.create(agent=agent, query="직원 검색: 김하늘")
    run_execute(run_id=str(run.id))
    run.refresh_from_db()

    assert run.status == Run.Status.SUCCEEDED, run.error_message
    selection = next(m for m in run.messages if m.get("type") == "tool_selection")
    assert [o["name"] for o in selection["offered"]] == [alias], selection
    assert selection["offered"][0]["score"] > 0
    bound = next(m for m in run.conversation if m["type"] == "ai")["data"]["response_metadata"]["bound_tools"]
    assert bound == [alias]


# ---- width ------------------------------------------------------------------------------------------------------


def test_full_width_letters_and_digits_are_the_half_width_ones() -> None:
    assert tokens("ＶＰＮ이 안돼요") == tokens("VPN이 안돼요")
    assert tokens("３월매출") == tokens("3월매출")
    docs = [
        ToolDoc(name="vpn_status", description="VPN 연결 상태"),
        ToolDoc(name="sales_report", description="３월 매출 보고서"),  # a full-width tool's text meets a query too
        ToolDoc(name="other", description="기타 도구"),
    ]
    ranker = LexicalRanker(docs)
    assert ranker.score("ＶＰＮ") == ranker.score("vpn") != {}
    assert ranker.score("３월") == ranker.score("3월") != {}
    assert set(ranker.score("3월")) == {"sales_report"}


def test_folding_keeps_korean_as_it_was_tokenised() -> None:
    assert tokens("자산의 상태") == ["자", "산", "의", "자산", "산의", "상", "태", "상태"]
    assert tokens(unicodedata.normalize("NFD", "팀을 알려줘")) == tokens("팀을 알려줘")
    # Compatibility jamo (ㅋㅋ, a chat's laugh) are folded alike on both sides: a tool's text still meets the query.
    ranker = LexicalRanker([ToolDoc(name="laugh", description="ㅋㅋ 반응"), ToolDoc(name="other", description="기타")])
    assert set(ranker.score("ㅋㅋ")) == {"laugh"}
