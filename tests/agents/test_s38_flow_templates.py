"""The shipped flow templates (``agents.flows``): what they tell a user about a call that brought nothing, and how
they read a Korean question.

- Every failed call was answered "…지금 가져오지 못했습니다. 잠시 후 다시 시도해 주세요.", also where trying
  again cannot help: a tool out of date (an administrator must publish the agent again), a value the tool refuses,
  a disabled tool. The sentence is now chosen by the failure's reason code, as the rule path chooses it.
- A read tool's own error as a value (``{"error": ..., "fallback": "retry"}``, handed over by the gate as an answer)
  and an answer lacking a key failed the run as ``flow:error`` (KeyError), or printed the raw dict, or said "자산
  0건".
- "몇명", "누구 있어", "김하늘의", "김하늘 팀장님" were misread, and a question naming no one called a tool with ""."""

from __future__ import annotations

import json
import sys
import textwrap
from typing import Any

import pytest

from agents.execution import run_execute
from agents.flows.common import name_in
from agents.models import Agent, Run
from agents.services import agent_version_publish, run_submit
from agents.tools import ToolFailure
from audit.models import AuditEvent
from mcpregistry.models import McpServer, McpTool
from mcpregistry.pool import get_default_pool
from tests.agents.test_flow_defects import flow_agent, in_process, run
from tests.conftest import discover_as_admin, make_agent
from tests.mcp_fixtures.scripts import script_file

EMPLOYEE = {"id": 1, "name": "김하늘", "team": "클라우드운영팀", "role": "팀장"}
ERROR_VALUE = {"error": "인사 시스템 점검 중", "fallback": "retry"}
TRY_AGAIN = "잠시 후 다시 시도해 주세요."

# One failing call per template: (template, question, its answers, the tool that fails).
FAILING = [
    ("sequential", "김하늘 님 프로젝트", {"search_employee": EMPLOYEE}, "list_projects"),
    ("sequential", "김하늘 님 프로젝트", {}, "search_employee"),
    ("parallel", "김하늘 님 자산", {"search_employee": EMPLOYEE}, "get_asset"),
    ("conditional", "김하늘 님 노트북", {}, "get_asset"),
    ("conditional", "클라우드운영팀 몇 명", {}, "list_team_members"),
    ("conditional", "클라우드운영팀 프로젝트", {}, "list_projects"),
    ("conditional", "김하늘 님", {}, "search_employee"),
    ("http_pipeline", "GET /employees/김하늘", {}, "search_employee"),
]


def answer_text(graph: str, answer: str) -> str:
    """What the user reads: the http pipeline's 502 says it as its body's ``message``."""
    return str(json.loads(answer)["body"]["message"]) if graph == "http_pipeline" else answer


# ---- 1. The sentence by the failure's reason code ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "told"),
    [
        ("tool:out_of_date", "관리자가 이 도우미를 업데이트해야 합니다."),
        ("args:type:name", "요청하신 값으로는 조회할 수 없습니다"),
        ("tool:unknown", "다시 시도해도 해결되지 않으니 관리자에게 문의해 주세요."),
        ("mcp:not_loaded:sds-company-data", "다시 시도해도 해결되지 않으니 관리자에게 문의해 주세요."),
        ("result:shape", "다시 시도해도 해결되지 않으니 관리자에게 문의해 주세요."),
    ],
)
@pytest.mark.parametrize(("graph", "query", "answers", "tool"), FAILING)
def test_a_failure_a_retry_cannot_fix_is_not_told_to_try_again(
    graph: str, query: str, answers: dict[str, Any], tool: str, code: str, told: str
) -> None:
    failure = ToolFailure(ok=False, error=code, message="guidance for a model")
    result, _called = in_process(graph, query, {**answers, tool: failure})
    assert result.error_code == "", result
    said = answer_text(graph, result.answer)
    assert "가져오지 못했습니다." in said and told in said, said
    assert TRY_AGAIN not in said and "guidance" not in said, said


@pytest.mark.parametrize("code", ["timeout", "rate_limit", "transport", "circuit:open"])
@pytest.mark.parametrize(("graph", "query", "answers", "tool"), FAILING)
def test_a_failure_a_retry_may_fix_is_told_to_try_again_later(
    graph: str, query: str, answers: dict[str, Any], tool: str, code: str
) -> None:
    result, _called = in_process(graph, query, {**answers, tool: ToolFailure(ok=False, error=code, message="m")})
    said = answer_text(graph, result.answer)
    assert said.endswith(f"지금 가져오지 못했습니다. {TRY_AGAIN}"), said


@pytest.mark.django_db
def test_a_flow_call_refused_as_out_of_date_tells_the_user_an_administrator_must_update_it(
    demo_server: McpServer,
) -> None:
    """The README's promise, on the real demo server: the published version froze search_employee's contract; the
    server now takes other arguments, so the gate refuses the flow's call (``tool:out_of_date``)."""
    agent = flow_agent(demo_server, "flow-out-of-date")
    agent_version_publish(agent=agent, actor="tests", via="tests")
    tool = McpTool.objects.get(server=demo_server, name="search_employee")
    schema = {**tool.input_schema, "properties": {"full_name": {"type": "string"}}, "required": ["full_name"]}
    McpTool.objects.filter(pk=tool.pk).update(input_schema=schema)
    submitted = run_submit(agent_slug=agent.slug, query="김하늘 님의 프로젝트", api_key=None).run
    try:
        run_execute(run_id=str(submitted.id))
    finally:
        get_default_pool().close("sds-company-data")
    result = Run.objects.get(pk=submitted.id)
    assert result.status == Run.Status.SUCCEEDED, (result.error_code, result.error_message)
    assert result.answer == (
        "직원 정보를 가져오지 못했습니다. 이 질문에 답하려면 먼저 관리자가 이 도우미를 업데이트해야 합니다."
    )
    assert result.tool_failures == 1


# ---- 2. A tool's own error value, an answer lacking a key ---------------------------------------------------------

UNAVAILABLE = f"지금 가져오지 못했습니다. {TRY_AGAIN}"


def told(tool: str) -> str:
    """A tool's own error report, quoted once after the sentence (the gate's ``tool:error_value``)."""
    return (
        "가져오지 못했습니다: 도구가 오류를 알렸습니다. 요청 내용을 확인하시거나 잠시 후 다시 시도해 주세요. "
        f"{tool} 도구의 답: “인사 시스템 점검 중”"
    )


@pytest.mark.parametrize(
    ("graph", "query", "answers", "expected"),
    [
        ("sequential", "김하늘 님 프로젝트", {"search_employee": ERROR_VALUE}, f"직원 정보를 {UNAVAILABLE}"),
        (
            "sequential",
            "김하늘 님 프로젝트",
            {"search_employee": EMPLOYEE, "list_projects": ERROR_VALUE},
            f"김하늘 님은 클라우드운영팀 소속입니다. 진행 중인 프로젝트 목록을 {UNAVAILABLE}",
        ),
        ("sequential", "김하늘 님 프로젝트", {"search_employee": {"name": "김하늘"}}, "직원 정보를 찾지 못했습니다."),
        (
            "sequential",
            "김하늘 님 프로젝트",
            {"search_employee": EMPLOYEE, "list_projects": {"rows": []}},
            "김하늘 님은 클라우드운영팀 소속입니다. 프로젝트 목록을 찾지 못했습니다.",
        ),
        (
            "parallel",
            "김하늘 님 자산",
            {"search_employee": EMPLOYEE, "get_asset": ERROR_VALUE},
            f"김하늘 님 (클라우드운영팀, 팀장) — 자산 정보를 {UNAVAILABLE}",
        ),
        (
            "parallel",
            "김하늘 님 자산",
            {"search_employee": ERROR_VALUE, "get_asset": ERROR_VALUE},
            f"직원 정보를 {UNAVAILABLE}",
        ),
        # The assets were fetched beside the failed employee call: told, not dropped.
        (
            "parallel",
            "김하늘 님 자산",
            {"search_employee": ERROR_VALUE, "get_asset": {"count": 1, "assets": [{"type": "노트북"}]}},
            f"직원 정보를 {UNAVAILABLE} 김하늘 님 — 자산 1건: 노트북",
        ),
        (
            "parallel",
            "김하늘 님 자산",
            {"search_employee": ERROR_VALUE, "get_asset": "김하늘 님 명의로 등록된 자산이 없습니다."},
            f"직원 정보를 {UNAVAILABLE} 김하늘 님 — 김하늘 님 명의로 등록된 자산이 없습니다.",
        ),
        (
            "parallel",
            "김하늘 님 자산",
            {
                "search_employee": {"name": "김하늘", "team": "클라우드운영팀"},
                "get_asset": {"count": 1, "assets": [{"type": "노트북"}]},
            },
            "김하늘 님 (클라우드운영팀) — 자산 1건: 노트북",
        ),
        (
            "parallel",
            "김하늘 님 자산",
            {"search_employee": EMPLOYEE, "get_asset": {"total": 2}},
            "김하늘 님 (클라우드운영팀, 팀장) — 자산 정보를 찾지 못했습니다.",
        ),
        (
            "parallel",
            "김하늘 님 자산",
            {"search_employee": {"team": "x"}, "get_asset": "없음"},
            "직원 정보를 찾지 못했습니다.",
        ),
        ("conditional", "김하늘 님 노트북", {"get_asset": ERROR_VALUE}, f"김하늘 자산 정보를 {UNAVAILABLE}"),
        ("conditional", "김하늘 님 노트북", {"get_asset": {"assets": []}}, "김하늘 자산 정보를 찾지 못했습니다."),
        (
            "conditional",
            "클라우드운영팀 인원",
            {"list_team_members": ERROR_VALUE},
            f"클라우드운영팀 인원 정보를 {UNAVAILABLE}",
        ),
        (
            "conditional",
            "클라우드운영팀 프로젝트",
            {"list_projects": ERROR_VALUE},
            f"클라우드운영팀 프로젝트 목록을 {UNAVAILABLE}",
        ),
        ("conditional", "김하늘 님", {"search_employee": ERROR_VALUE}, f"직원 정보를 {UNAVAILABLE}"),
        ("conditional", "김하늘 님", {"search_employee": {"team": "x"}}, "직원 정보를 찾지 못했습니다."),
    ],
)
def test_a_tools_own_error_value_is_told_as_unavailable_and_a_missing_key_as_not_found(
    graph: str, query: str, answers: dict[str, Any], expected: str
) -> None:
    result, _called = in_process(graph, query, answers)
    assert (result.error_code, result.answer) == ("", expected), result.error_message


def test_the_http_pipeline_answers_a_tools_own_error_value_502() -> None:
    result, _called = in_process("http_pipeline", "GET /employees/김하늘", {"search_employee": ERROR_VALUE})
    assert json.loads(result.answer) == {
        "status": 502,
        "body": {"error": "tool:error", "message": f"요청한 정보를 {UNAVAILABLE}"},
    }


# A real stdio server whose lookups all answer their own error as a value (the gate hands a read's to its caller).
DOWN_SERVER = textwrap.dedent(
    """
    import json
    from fastmcp import FastMCP

    mcp = FastMCP("hr-down")
    READ_ONLY = {"readOnlyHint": True, "destructiveHint": False, "openWorldHint": False}
    DOWN = json.dumps({"error": "인사 시스템 점검 중", "fallback": "retry"}, ensure_ascii=False)

    @mcp.tool(annotations=READ_ONLY)
    def search_employee(name: str) -> str:
        return DOWN

    @mcp.tool(annotations=READ_ONLY)
    def get_asset(owner: str = "") -> str:
        return DOWN

    mcp.run(transport="stdio", show_banner=False)
    """
)


@pytest.mark.slow
@pytest.mark.django_db
@pytest.mark.parametrize(
    ("graph", "query", "expected"),
    [
        ("sequential", "김하늘 님의 프로젝트", f"직원 정보를 {told('search_employee')}"),
        ("parallel", "김하늘 님의 자산", f"직원 정보를 {told('search_employee')}"),
        ("conditional", "김하늘의 노트북", f"김하늘 자산 정보를 {told('get_asset')}"),
        (
            "http_pipeline",
            "GET /employees/김하늘",
            json.dumps(
                {
                    "status": 502,
                    "body": {"error": "tool:error_value", "message": f"요청한 정보를 {told('search_employee')}"},
                },
                ensure_ascii=False,
            ),
        ),
    ],
)
def test_a_real_servers_error_value_is_told_as_unavailable(graph: str, query: str, expected: str) -> None:
    server = McpServer.objects.create(
        mcp_id="hr-down",
        name="hr-down",
        command=sys.executable,
        args=[script_file(DOWN_SERVER)],
        session_scope="shared",
    )
    assert discover_as_admin(server=server).ok
    agent = make_agent(slug=f"hr-down-{graph.replace('_', '-')}", servers=[server], with_demo_rules=False)
    Agent.objects.filter(pk=agent.pk).update(
        mode="flow", flow_graph=f"agents.flows.{graph}.build_graph", model_params={"flow": {"mcp_id": "hr-down"}}
    )
    agent.refresh_from_db()
    created = Run.objects.create(agent=agent, query=query)
    try:
        run_execute(run_id=str(created.id))
    finally:
        get_default_pool().close("hr-down")
    created.refresh_from_db()
    assert (created.status, created.error_code) == (Run.Status.SUCCEEDED, ""), created.error_message
    assert created.answer == expected


# ---- 3. Reading a Korean question, on the real demo server ----------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db
@pytest.mark.parametrize(
    ("graph", "query", "expected", "calls"),
    [
        (
            "sequential",
            "김하늘의 프로젝트 알려줘",
            "김하늘 님은 클라우드운영팀 소속이며, 진행 중인 프로젝트는 클라우드 비용 최적화, 사내 AI 어시스턴트 도입입니다.",
            [("search_employee", {"name": "김하늘"}), ("list_projects", {"team": "클라우드운영팀"})],
        ),
        ("sequential", "프로젝트 알려줘", "이름을 알려 주세요. (예: 김하늘 님의 프로젝트)", []),
        (
            "parallel",
            "김하늘의 자산",
            "김하늘 님 (클라우드운영팀, 팀장) — 자산 2건: 노트북(A-1001), 모니터(A-1006)",
            [("search_employee", {"name": "김하늘"}), ("get_asset", {"owner": "김하늘"})],
        ),
        (
            "parallel",
            "정하은 님 자산",
            "정하은 님 (클라우드운영팀, 데이터 분석가) — 자산 1건: 모니터(A-1007)",
            [("search_employee", {"name": "정하은"}), ("get_asset", {"owner": "정하은"})],
        ),
        ("parallel", "자산 보여줘", "이름을 알려 주세요. (예: 김하늘 님의 자산)", []),
        (
            "conditional",
            "클라우드운영팀 몇명이야?",
            "클라우드운영팀 인원은 3명입니다.",
            [("list_team_members", {"team": "클라우드운영팀"})],
        ),
        (
            "conditional",
            "물류플랫폼팀에 누구 있어?",
            "물류플랫폼팀 인원은 2명입니다: 박도윤(백엔드), 최민준(프론트엔드).",
            [("list_team_members", {"team": "물류플랫폼팀"})],
        ),
        # The assets of the kind asked for, listed (a bare "김하늘 자산 2건" read like two laptops).
        (
            "conditional",
            "김하늘의 노트북",
            "김하늘 님의 노트북 1건: 노트북(A-1001)",
            [("get_asset", {"owner": "김하늘"})],
        ),
        (
            "conditional",
            "김하늘 팀장님 노트북",
            "김하늘 님의 노트북 1건: 노트북(A-1001)",
            [("get_asset", {"owner": "김하늘"})],
        ),
        (
            "conditional",
            "박도윤은 어느 팀이야?",
            "박도윤 님은 물류플랫폼팀 소속입니다.",
            [("search_employee", {"name": "박도윤"})],
        ),
        ("conditional", "팀이 어디야?", "이름을 알려 주세요. (예: 김하늘 님은 어느 팀이야?)", []),
        ("conditional", "몇 명이야?", "팀 이름을 알려 주세요. (예: 클라우드운영팀 몇 명이야?)", []),
        (
            "http_pipeline",
            "GET /employees/이서준",
            json.dumps(
                {
                    "status": 200,
                    "body": {
                        "id": 3,
                        "name": "이서준",
                        "team": "클라우드운영팀",
                        "role": "인프라 엔지니어",
                        "email": "seojun.lee@samsungsds.example.com",
                    },
                },
                ensure_ascii=False,
            ),
            [("search_employee", {"name": "이서준"})],
        ),
    ],
)
def test_a_template_reads_the_name_or_team_of_a_korean_question_or_asks_for_one(
    demo_server: McpServer, graph: str, query: str, expected: str, calls: list[tuple[str, dict[str, str]]]
) -> None:
    result = run(
        flow_agent(demo_server, f"flow-ko-{graph.replace('_', '-')}", f"agents.flows.{graph}.build_graph"), query
    )
    assert (result.status, result.answer) == (Run.Status.SUCCEEDED, expected), result.error_message
    made = AuditEvent.objects.filter(run_id=result.id, action="tool.call").order_by("seq")
    assert sorted((e.tool, e.args) for e in made) == sorted(calls)


@pytest.mark.parametrize(
    ("query", "name"),
    [
        ("오늘 김하늘 자산 알려줘", "김하늘"),  # a word before what is asked about, not the first word
        ("혹시 김하늘 팀 알려줘", "김하늘"),
        ("어제 입사한 김하늘 팀", "김하늘"),
        ("노트북 가진 사람 누구?", None),  # a modifier is no name
        ("김하늘이랑 같은 팀 누구야?", "김하늘"),
        ("김하늘에 대해 알려줘", "김하늘"),
        ("김하늘과 박도윤 프로젝트", "김하늘"),
        ("김하늘한테 노트북 있어?", "김하늘"),
        ("김영이 자산", "김영이"),  # a one-syllable particle is taken off only where three syllables are left
        ("이서준 자산", "이서준"),
    ],
)
def test_a_name_is_read_past_the_particles_times_and_modifiers_of_a_question(query: str, name: str | None) -> None:
    assert name_in(query) == name
