"""The flow templates as a reviewer of session 43's change found them, run against real MCP servers (stdio).

- A team written together with 팀장/팀원 whose name begins as a family name does ("백엔드팀장", "신제품팀원") was
  read as a person: the conditional template looked up an employee "백엔드" instead of the team.
- A read tool's own error returned as a value (the gate's ``tool:error_value``) lost its words: the conditional
  template said "try again later", the http pipeline too."""

from __future__ import annotations

import json
import sys
import textwrap
from typing import Any

import pytest

from agents.execution import run_execute
from agents.flows.common import glued_person, name_in, team_in
from agents.models import Agent, Run
from audit.models import AuditEvent
from mcpregistry.models import McpServer
from mcpregistry.pool import get_default_pool
from tests.agents.test_flow_review_s41 import ran
from tests.conftest import discover_as_admin, make_agent
from tests.mcp_fixtures.scripts import script_file

TEAMS = "['물류플랫폼팀', '클라우드운영팀']"

# ---- 1. A team with its lead or members written together with it is a team first ------------------------------------


@pytest.mark.parametrize(
    ("query", "team", "person"),
    [
        ("백엔드팀장 누구야?", "백엔드팀", "백엔드"),
        ("백엔드팀원 몇 명이야?", "백엔드팀", "백엔드"),
        ("신제품팀장 프로젝트", "신제품팀", "신제품"),
        ("유아동팀장 누구야?", "유아동팀", "유아동"),
        ("박도윤팀장 팀원 몇 명이야?", "박도윤팀", "박도윤"),  # the person only where there is no such team
        ("클라우드운영팀장 누구야?", "클라우드운영팀", None),
        ("김하늘팀 프로젝트", "김하늘팀", None),  # no title after it: a team's name only
    ],
)
def test_a_team_written_with_a_title_is_read_as_a_team_and_may_be_a_person(
    query: str, team: str, person: str | None
) -> None:
    assert (team_in(query), glued_person(query, team)) == (team, person)


def test_an_honorific_after_the_title_makes_it_a_person() -> None:
    assert (team_in("김하늘팀장님 프로젝트 알려줘"), name_in("김하늘팀장님 프로젝트 알려줘")) == (None, "김하늘")


# A real stdio server with a team whose name begins as a family name does, and no employee of that name.
TEAM_SERVER = textwrap.dedent(
    """
    import json
    from fastmcp import FastMCP

    mcp = FastMCP("hr-teams")
    READ_ONLY = {"readOnlyHint": True, "destructiveHint": False, "openWorldHint": False}
    TEAMS = {"백엔드팀": [{"name": "한지민", "role": "팀장"}, {"name": "오세훈", "role": "개발자"}]}
    PROJECTS = {"신제품팀": [{"name": "신제품 출시", "team": "신제품팀"}]}

    @mcp.tool(annotations=READ_ONLY)
    def search_employee(name: str) -> str:
        return f"'{name}' 직원을 찾을 수 없습니다."

    @mcp.tool(annotations=READ_ONLY)
    def list_team_members(team: str) -> str:
        rows = TEAMS.get(team)
        if not rows:
            return f"'{team}' 팀을 찾을 수 없습니다."
        return json.dumps({"count": len(rows), "members": rows}, ensure_ascii=False)

    @mcp.tool(annotations=READ_ONLY)
    def list_projects(team: str = "") -> str:
        rows = PROJECTS.get(team)
        if not rows:
            return f"'{team}' 팀의 프로젝트가 없습니다."
        return json.dumps(rows, ensure_ascii=False)

    mcp.run(transport="stdio", show_banner=False)
    """
)


def ran_on(source: str, mcp_id: str, graph: str, query: str) -> tuple[Run, list[tuple[str, Any]]]:
    """The run of ``graph`` on a stdio server running ``source``, and the tool calls it made, in order."""
    server = McpServer.objects.create(
        mcp_id=mcp_id, name=mcp_id, command=sys.executable, args=[script_file(source)], session_scope="shared"
    )
    assert discover_as_admin(server=server).ok
    agent = make_agent(slug=f"{mcp_id}-{graph.replace('_', '-')}", servers=[server], with_demo_rules=False)
    Agent.objects.filter(pk=agent.pk).update(
        mode="flow", flow_graph=f"agents.flows.{graph}.build_graph", model_params={"flow": {"mcp_id": mcp_id}}
    )
    created = Run.objects.create(agent=agent, query=query)
    try:
        run_execute(run_id=str(created.id))
    finally:
        get_default_pool().close(mcp_id)
    created.refresh_from_db()
    made = AuditEvent.objects.filter(run_id=created.id, action="tool.call").order_by("seq")
    return created, [(e.tool, e.args) for e in made]


@pytest.mark.slow
@pytest.mark.django_db
@pytest.mark.parametrize(
    ("query", "expected", "calls"),
    [
        ("백엔드팀장 누구야?", "백엔드팀 팀장은 한지민 님입니다.", [("list_team_members", {"team": "백엔드팀"})]),
        ("백엔드팀원 몇 명이야?", "백엔드팀 인원은 2명입니다.", [("list_team_members", {"team": "백엔드팀"})]),
        ("신제품팀장 프로젝트", "신제품팀 프로젝트: 신제품 출시", [("list_projects", {"team": "신제품팀"})]),
        (
            "유아동팀장 누구야?",  # no such team, nobody of that name: the team's answer
            "'유아동팀' 팀을 찾을 수 없습니다.",
            [("list_team_members", {"team": "유아동팀"}), ("search_employee", {"name": "유아동"})],
        ),
    ],
)
def test_the_conditional_template_asks_for_a_team_written_with_its_lead_or_members(
    query: str, expected: str, calls: list[tuple[str, Any]]
) -> None:
    created, made = ran_on(TEAM_SERVER, "hr-teams", "conditional", query)
    assert (created.status, created.answer) == (Run.Status.SUCCEEDED, expected), created.error_message
    assert made == calls


@pytest.mark.slow
@pytest.mark.django_db
@pytest.mark.parametrize(
    ("query", "expected", "calls"),
    [
        (
            "김하늘팀장 프로젝트 알려줘",  # no honorific: no team 김하늘팀, so the person's
            "김하늘 님은 클라우드운영팀 소속입니다. "
            "클라우드운영팀 프로젝트: 클라우드 비용 최적화, 사내 AI 어시스턴트 도입",
            [
                ("list_projects", {"team": "김하늘팀"}),
                ("search_employee", {"name": "김하늘"}),
                ("list_projects", {"team": "클라우드운영팀"}),
            ],
        ),
        (
            "박도윤팀장 팀원 몇 명이야?",
            "박도윤 님은 물류플랫폼팀 소속입니다. 물류플랫폼팀 인원은 2명입니다.",
            [
                ("list_team_members", {"team": "박도윤팀"}),
                ("search_employee", {"name": "박도윤"}),
                ("list_team_members", {"team": "물류플랫폼팀"}),
            ],
        ),
        (
            "김하늘팀장님 프로젝트 알려줘",  # the honorific: the person, no team asked for
            "김하늘 님은 클라우드운영팀 소속입니다. "
            "클라우드운영팀 프로젝트: 클라우드 비용 최적화, 사내 AI 어시스턴트 도입",
            [("search_employee", {"name": "김하늘"}), ("list_projects", {"team": "클라우드운영팀"})],
        ),
        (
            "백엔드팀장 누구야?",
            f"'백엔드팀' 팀을 찾을 수 없습니다. 등록된 팀: {TEAMS}",
            [("list_team_members", {"team": "백엔드팀"}), ("search_employee", {"name": "백엔드"})],
        ),
    ],
)
def test_where_there_is_no_such_team_the_conditional_template_asks_for_the_person(
    demo_server: McpServer, query: str, expected: str, calls: list[tuple[str, Any]]
) -> None:
    answer, made = ran(demo_server, "conditional", query)
    assert (answer, made) == (expected, calls)


# ---- 2. A read tool's own error as a value, said with its words -----------------------------------------------------

VALUE_SERVER = textwrap.dedent(
    """
    from fastmcp import FastMCP

    mcp = FastMCP("hr-value")
    READ_ONLY = {"readOnlyHint": True, "destructiveHint": False, "openWorldHint": False}

    @mcp.tool(annotations=READ_ONLY)
    def search_employee(name: str) -> dict:
        return {"error": "등록되지 않은 직원입니다 (등록된 직원: 김하늘, 박도윤)"}

    mcp.run(transport="stdio", show_banner=False)
    """
)
TOLD = (
    "직원 정보를 가져오지 못했습니다: 도구가 오류를 알렸습니다. 요청 내용을 확인하시거나 잠시 후 다시 시도해 주세요. "
    "search_employee 도구의 답: “등록되지 않은 직원입니다 (등록된 직원: 김하늘, 박도윤)”"
)


@pytest.mark.slow
@pytest.mark.django_db
@pytest.mark.parametrize(
    ("graph", "query", "expected"),
    [
        ("conditional", "김하늘 님은 어느 팀이야?", TOLD),
        ("sequential", "김하늘 님의 프로젝트", TOLD),
        (
            "http_pipeline",
            "GET /employees/김하늘",
            json.dumps(
                {
                    "status": 502,
                    "body": {"error": "tool:error_value", "message": TOLD.replace("직원 정보를", "요청한 정보를")},
                },
                ensure_ascii=False,
            ),
        ),
    ],
)
def test_a_read_tools_own_error_value_is_told_once_with_its_words(graph: str, query: str, expected: str) -> None:
    created, made = ran_on(VALUE_SERVER, "hr-value", graph, query)
    assert (created.status, created.error_code) == (Run.Status.SUCCEEDED, ""), created.error_message
    assert created.answer == expected
    assert made == [("search_employee", {"name": "김하늘"})]
    assert AuditEvent.objects.filter(run_id=created.id, action="tool.call", reason="tool:error_value").exists()
