"""The flow templates as a reviewer found them (session 43), run against real MCP servers (stdio).

- A name written together with a title ("김하늘팀장님", "박도윤팀장") was read as a team ("김하늘팀"): the
  conditional template asked for that team's projects and members.
- "Who is on the team" ("누구 있어", "명단", "팀장 누구야") was answered with the head count alone.
- ``http_pipeline``'s ``GET /assets`` with no owner called ``get_asset`` with an empty one: every employee's assets.
- A read tool's own error words never reached the flow, and the templates said "could not be retrieved" twice."""

from __future__ import annotations

import json
import sys
import textwrap
from typing import Any

import pytest

from agents.execution import run_execute
from agents.flows.common import name_in, team_in
from agents.models import Agent, Run
from audit.models import AuditEvent
from mcpregistry.models import McpServer
from mcpregistry.pool import get_default_pool
from tests.agents.test_flow_review_s41 import ran
from tests.conftest import discover_as_admin, make_agent
from tests.mcp_fixtures.scripts import script_file

KIM_PROJECTS = "클라우드운영팀 프로젝트: 클라우드 비용 최적화, 사내 AI 어시스턴트 도입"
CLOUD_ROSTER = "클라우드운영팀 인원은 3명입니다: 김하늘(팀장), 이서준(인프라 엔지니어), 정하은(데이터 분석가)."


# ---- 1. A name with a title written together with it is a person, not a team ---------------------------------------


@pytest.mark.parametrize(
    ("query", "team", "name"),
    [
        ("김하늘팀장님 프로젝트 알려줘", None, "김하늘"),
        # No honorific: a team first (session 43b: "백엔드팀장" is one), the person where there is no such team.
        ("박도윤팀장 팀원 몇 명이야?", "박도윤팀", "박도윤"),
        ("이서준팀원 자산", "이서준팀", "이서준"),
        ("클라우드운영팀장 누구야?", "클라우드운영팀", None),  # a real team and its lead
        ("개발팀장 프로젝트", "개발팀", None),  # a team of two syllables is no name
        ("서비스팀장 누구야?", "서비스팀", None),  # nor one of three that begins as a family name does
        ("클라우드운영팀 김하늘팀장 자산", "클라우드운영팀", "김하늘"),
        ("김하늘팀 프로젝트", "김하늘팀", None),  # no title after it: a team's name
    ],
)
def test_a_name_written_with_its_title_is_read_as_a_person_and_a_team_with_its_lead_as_the_team(
    query: str, team: str | None, name: str | None
) -> None:
    assert (team_in(query), name_in(query)) == (team, name)


@pytest.mark.slow
@pytest.mark.django_db
@pytest.mark.parametrize(
    ("graph", "query", "expected", "calls"),
    [
        (
            "conditional",
            "김하늘팀장님 프로젝트 알려줘",
            f"김하늘 님은 클라우드운영팀 소속입니다. {KIM_PROJECTS}",
            [("search_employee", {"name": "김하늘"}), ("list_projects", {"team": "클라우드운영팀"})],
        ),
        (
            "conditional",
            "박도윤팀장 팀원 몇 명이야?",
            "박도윤 님은 물류플랫폼팀 소속입니다. 물류플랫폼팀 인원은 2명입니다.",
            [
                ("list_team_members", {"team": "박도윤팀"}),
                ("search_employee", {"name": "박도윤"}),
                ("list_team_members", {"team": "물류플랫폼팀"}),
            ],
        ),
        (
            "conditional",
            "클라우드운영팀장 누구야?",
            "클라우드운영팀 팀장은 김하늘 님입니다.",
            [("list_team_members", {"team": "클라우드운영팀"})],
        ),
        (
            "sequential",
            "김하늘팀장님 프로젝트 알려줘",
            "김하늘 님은 클라우드운영팀 소속이며, 진행 중인 프로젝트는 클라우드 비용 최적화, 사내 AI 어시스턴트 도입입니다.",
            [("search_employee", {"name": "김하늘"}), ("list_projects", {"team": "클라우드운영팀"})],
        ),
        (
            "parallel",
            "이서준팀원 자산",
            "이서준 님 (클라우드운영팀, 인프라 엔지니어) — 자산 2건: 노트북(A-1003), GPU 서버(A-1008)",
            [("search_employee", {"name": "이서준"}), ("get_asset", {"owner": "이서준"})],
        ),
    ],
)
def test_a_template_asks_about_the_person_named_with_a_title_not_a_team_of_that_name(
    demo_server: McpServer, graph: str, query: str, expected: str, calls: list[tuple[str, Any]]
) -> None:
    answer, made = ran(demo_server, graph, query)
    assert answer == expected
    assert sorted(made, key=str) == sorted(calls, key=str)


# ---- 2. Who is on the team: the members by name -----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db
@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("클라우드운영팀 누구 있어?", CLOUD_ROSTER),
        ("클라우드운영팀 명단 알려줘", CLOUD_ROSTER),
        ("클라우드운영팀 구성원 알려줘", CLOUD_ROSTER),
        ("클라우드운영팀 팀장 누구야?", "클라우드운영팀 팀장은 김하늘 님입니다."),
        (
            "물류플랫폼팀 팀장 누구야?",
            "물류플랫폼팀에는 팀장으로 등록된 사람이 없습니다. "
            "물류플랫폼팀 인원은 2명입니다: 박도윤(백엔드), 최민준(프론트엔드).",
        ),
        ("클라우드운영팀 몇 명이야?", "클라우드운영팀 인원은 3명입니다."),  # the count where only it is asked
        ("클라우드운영팀 인원", "클라우드운영팀 인원은 3명입니다."),
    ],
)
def test_the_conditional_template_names_the_members_where_the_question_asks_who(
    demo_server: McpServer, query: str, expected: str
) -> None:
    team = team_in(query)
    answer, made = ran(demo_server, "conditional", query)
    assert answer == expected
    assert made == [("list_team_members", {"team": team})]


# ---- 3. The http pipeline asks for an owner ---------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db
@pytest.mark.parametrize(
    ("request_line", "arg", "example"),
    [
        ("GET /assets", "owner", "GET /assets?owner=김하늘"),
        ("GET /assets?owner=", "owner", "GET /assets?owner=김하늘"),
        ("GET /assets?owner=%20", "owner", "GET /assets?owner=김하늘"),
        ("GET /assets?owner=%E3%80%80", "owner", "GET /assets?owner=김하늘"),  # an ideographic space
        ("GET /employees/%20", "name", "GET /employees/김하늘"),
    ],
)
def test_the_http_pipeline_answers_400_for_a_request_that_names_no_one_and_calls_no_tool(
    demo_server: McpServer, request_line: str, arg: str, example: str
) -> None:
    answer, made = ran(demo_server, "http_pipeline", request_line)
    assert json.loads(answer) == {
        "status": 400,
        "body": {"error": f"{arg} is required", "message": f"이름을 알려 주세요. (예: {example})"},
    }
    assert made == []


# ---- 4. A read tool's own error words, said once ------------------------------------------------------------------

# A real stdio server whose lookup raises its own error (``isError``: the gate's ``tool:error``, its text kept).
FAILING_SERVER = textwrap.dedent(
    """
    from fastmcp import FastMCP
    from fastmcp.exceptions import ToolError

    mcp = FastMCP("hr-broken")
    READ_ONLY = {"readOnlyHint": True, "destructiveHint": False, "openWorldHint": False}

    @mcp.tool(annotations=READ_ONLY)
    def search_employee(name: str) -> str:
        raise ToolError("인사 DB 연결 끊김")

    mcp.run(transport="stdio", show_banner=False)
    """
)
TOLD = (
    "직원 정보를 가져오지 못했습니다: 도구가 오류를 알렸습니다. 요청 내용을 확인하시거나 잠시 후 다시 시도해 주세요. "
    "search_employee 도구의 답: “인사 DB 연결 끊김”"
)


@pytest.mark.slow
@pytest.mark.django_db
@pytest.mark.parametrize(
    ("graph", "query", "expected"),
    [
        ("sequential", "김하늘 님의 프로젝트", TOLD),
        ("conditional", "김하늘 님은 어느 팀이야?", TOLD),
        (
            "http_pipeline",
            "GET /employees/김하늘",
            json.dumps(
                {
                    "status": 502,
                    "body": {"error": "tool:error", "message": TOLD.replace("직원 정보를", "요청한 정보를")},
                },
                ensure_ascii=False,
            ),
        ),
    ],
)
def test_a_read_tools_own_error_is_told_once_with_its_words(graph: str, query: str, expected: str) -> None:
    server = McpServer.objects.create(
        mcp_id="hr-broken",
        name="hr-broken",
        command=sys.executable,
        args=[script_file(FAILING_SERVER)],
        session_scope="shared",
    )
    assert discover_as_admin(server=server).ok
    agent = make_agent(slug=f"hr-broken-{graph.replace('_', '-')}", servers=[server], with_demo_rules=False)
    Agent.objects.filter(pk=agent.pk).update(
        mode="flow", flow_graph=f"agents.flows.{graph}.build_graph", model_params={"flow": {"mcp_id": "hr-broken"}}
    )
    created = Run.objects.create(agent=agent, query=query)
    try:
        run_execute(run_id=str(created.id))
    finally:
        get_default_pool().close("hr-broken")
    created.refresh_from_db()
    assert (created.status, created.error_code) == (Run.Status.SUCCEEDED, ""), created.error_message
    assert created.answer == expected
    assert AuditEvent.objects.filter(run_id=created.id, action="tool.call", reason="tool:error").exists()
