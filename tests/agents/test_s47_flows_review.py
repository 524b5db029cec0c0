"""The flow templates and the flow runner, reviewed in session 47 (on the real demo server; no model runs).

1. The conditional template sent a question that names a team and nobody in it to the employee branch, which can
   only ask for a person's name: "클라우드운영팀 팀장 알려줘", "물류플랫폼팀 팀장?", "클라우드운영팀 직원" were
   answered "이름을 알려 주세요", and "클라우드운영팀 사람들" looked up an employee named "사람들". They are the
   team's members now, its lead where the lead is asked for.
2. Where a team written together with a title ("박도윤팀장") was no team and the lookup of the person of that name
   failed, the conditional template answered the team's "not found" ("'박도윤팀' 팀을 찾을 수 없습니다"): a
   definite no where the call that would have told failed. The failure is told, by its reason.
3. The HTTP pipeline read a full-width method ("ＧＥＴ", a Korean input method's full-width mode) but not the
   full-width path typed with it ("／employees／김하늘"): 404 "no route".
4. A flow whose output was an empty string (or whitespace) succeeded with an empty answer; the ReAct loop fails
   such a last turn (``model:empty``), and a flow without an output fails as ``flow:error``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from agents.execution import run_execute
from agents.flow_runner import flow_run
from agents.flows.common import FlowState
from agents.flows.conditional import route
from agents.models import Run
from agents.services import agent_version_publish, run_submit
from audit.models import AuditEvent
from mcpregistry.models import McpServer, McpTool
from mcpregistry.pool import get_default_pool
from tests.agents.test_flow_defects import flow_agent, one_node, run, settings_for_nothing
from tests.conftest import module_flow_graphs

CLOUD_ROSTER = "클라우드운영팀 인원은 3명입니다: 김하늘(팀장), 이서준(인프라 엔지니어), 정하은(데이터 분석가)."
ASK_AN_ADMIN_TO_UPDATE = "이 질문에 답하려면 먼저 관리자가 이 도우미를 업데이트해야 합니다."


@pytest.fixture(autouse=True)
def _this_module_s_flows_registered(settings: Any) -> None:
    settings.PLATFORM_FLOW_GRAPHS = module_flow_graphs(__name__)


def calls_of(run_id: Any) -> list[tuple[str, Any]]:
    return [(e.tool, e.args) for e in AuditEvent.objects.filter(run_id=run_id, action="tool.call").order_by("id")]


def submitted(agent: Any, query: str) -> Run:
    """``query`` run through the API's own path (its input guarded, the agent's published version if any)."""
    created = run_submit(agent_slug=agent.slug, query=query, api_key=None).run
    try:
        run_execute(run_id=str(created.id))
    finally:
        get_default_pool().close("sds-company-data")
    return Run.objects.get(pk=created.id)


# ---- 1. A team named and nobody in it: its members -----------------------------------------------------------


@pytest.mark.parametrize(
    "query",
    [
        "클라우드운영팀 팀장 알려줘",
        "물류플랫폼팀 팀장?",
        "클라우드운영팀 직원",
        "클라우드운영팀 사람들",
        "클라우드운영팀",
    ],
)
def test_a_question_about_a_team_that_names_no_one_goes_to_the_members(query: str) -> None:
    assert route(FlowState(query=query)) == "members"


@pytest.mark.parametrize(
    ("query", "branch"),
    [
        ("김하늘 님 어느 팀이야?", "employee"),  # a person named: the employee branch, as before
        ("팀이 어디야?", "employee"),  # no team, nobody: asked for a name
        ("클라우드운영팀 프로젝트", "projects"),
        ("클라우드운영팀 김하늘 자산", "assets"),
    ],
)
def test_the_other_branches_are_kept(query: str, branch: str) -> None:
    assert route(FlowState(query=query)) == branch


@pytest.mark.slow
@pytest.mark.django_db
@pytest.mark.parametrize(
    ("query", "team", "expected"),
    [
        ("클라우드운영팀 팀장 알려줘", "클라우드운영팀", "클라우드운영팀 팀장은 김하늘 님입니다."),
        ("클라우드운영팀장은?", "클라우드운영팀", "클라우드운영팀 팀장은 김하늘 님입니다."),
        (
            "물류플랫폼팀 팀장?",
            "물류플랫폼팀",
            "물류플랫폼팀에는 팀장으로 등록된 사람이 없습니다. "
            "물류플랫폼팀 인원은 2명입니다: 박도윤(백엔드), 최민준(프론트엔드).",
        ),
        ("클라우드운영팀 사람들", "클라우드운영팀", CLOUD_ROSTER),
        ("클라우드운영팀 직원 알려줘", "클라우드운영팀", CLOUD_ROSTER),
    ],
)
def test_the_conditional_template_answers_a_teams_lead_or_members_where_nobody_is_named(
    demo_server: McpServer, query: str, team: str, expected: str
) -> None:
    result = run(flow_agent(demo_server, "flow-team-only", "agents.flows.conditional.build_graph"), query)
    assert (result.status, result.answer) == (Run.Status.SUCCEEDED, expected), result.error_message
    assert calls_of(result.id) == [("list_team_members", {"team": team})]


# ---- 2. The person's lookup failed: told, not "no such team" -------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db
@pytest.mark.parametrize(
    ("query", "tool", "told"),
    [
        ("박도윤팀장 팀원 몇 명이야?", "list_team_members", "박도윤팀 인원 정보를"),
        ("박도윤팀장 프로젝트", "list_projects", "박도윤팀 프로젝트 목록을"),
    ],
)
def test_a_failed_lookup_of_the_person_a_team_may_be_is_told_not_that_there_is_no_such_team(
    demo_server: McpServer, query: str, tool: str, told: str
) -> None:
    """The published version froze search_employee's contract; the server now takes other arguments, so the gate
    refuses that one call (``tool:out_of_date``) while the team's lookup goes through."""
    agent = flow_agent(demo_server, "flow-glued-down", "agents.flows.conditional.build_graph")
    agent_version_publish(agent=agent, actor="tests", via="tests")
    employee = McpTool.objects.get(server=demo_server, name="search_employee")
    schema = {**employee.input_schema, "properties": {"full_name": {"type": "string"}}, "required": ["full_name"]}
    McpTool.objects.filter(pk=employee.pk).update(input_schema=schema)
    result = submitted(agent, query)
    assert (result.status, result.error_code) == (Run.Status.SUCCEEDED, ""), result.error_message
    assert result.answer == f"{told} 가져오지 못했습니다. {ASK_AN_ADMIN_TO_UPDATE}"
    assert "찾을 수 없습니다" not in result.answer and "프로젝트가 없습니다" not in result.answer
    made = AuditEvent.objects.filter(run_id=result.id, action="tool.call").order_by("id")
    assert [(e.tool, e.args, e.reason) for e in made] == [
        (tool, {"team": "박도윤팀"}, ""),
        ("search_employee", {"name": "박도윤"}, "tool:out_of_date"),
    ]


# ---- 3. The HTTP pipeline's full-width path ------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db
@pytest.mark.parametrize(
    ("query", "tool", "args"),
    [
        ("ＧＥＴ　／ｅｍｐｌｏｙｅｅｓ／김하늘", "search_employee", {"name": "김하늘"}),
        ("GET ／teams／클라우드운영팀／members", "list_team_members", {"team": "클라우드운영팀"}),
    ],
)
def test_the_http_pipeline_reads_a_path_typed_in_full_width(
    demo_server: McpServer, query: str, tool: str, args: dict[str, str]
) -> None:
    agent = flow_agent(demo_server, "flow-http-wide", "agents.flows.http_pipeline.build_graph")
    result = submitted(agent, query)
    assert result.status == Run.Status.SUCCEEDED, result.error_message
    assert json.loads(result.answer)["status"] == 200, result.answer
    assert calls_of(result.id) == [(tool, args)]


# ---- 4. An empty output --------------------------------------------------------------------------------------


async def answers_blank(state: FlowState) -> dict[str, Any]:
    return {"output": " \n"}


async def answers_empty(state: FlowState) -> dict[str, Any]:
    return {"output": ""}


build_answers_blank = one_node(answers_blank)
build_answers_empty = one_node(answers_empty)


@pytest.mark.parametrize("build", ["build_answers_blank", "build_answers_empty"])
def test_a_flow_whose_output_is_empty_is_a_flow_error_not_an_empty_answer(build: str) -> None:
    result = flow_run(
        flow_graph=f"{__name__}.{build}", settings=settings_for_nothing(), trace=[], emit=lambda k, d: None
    )
    assert (result.error_code, result.error_message, result.answer) == (
        "flow:error",
        "The flow ended with an empty output.",
        "",
    )


@pytest.mark.slow
@pytest.mark.django_db
def test_a_flow_run_with_an_empty_output_fails(demo_server: McpServer) -> None:
    result = run(flow_agent(demo_server, "flow-empty-output", f"{__name__}.build_answers_empty"), "q")
    assert (result.status, result.error_code, result.answer) == (Run.Status.FAILED, "flow:error", "")


@pytest.mark.parametrize(
    ("data", "status", "error"),
    [
        ([{"request": {"method": "POST", "path": "/employees/김하늘"}}], 405, "only GET is supported"),
        ([{"request": {"method": "GET", "path": None}}], 400, "malformed path"),
        ([{"request": {"method": "GET", "path": ["/employees"]}}], 400, "malformed path"),
        ([{"request": {"path": "/assets"}}], 400, "owner is required"),  # no method: a GET, asking for an owner
        (["not an object", {"request": {"path": "/nowhere"}}], 404, "no route for /nowhere"),
    ],
)
def test_the_http_pipeline_answers_an_odd_request_with_its_status_not_a_flow_error(
    data: list[Any], status: int, error: str
) -> None:
    """A data part that is not an object was an AttributeError (the run's ``flow:error``), a null path 404 "no
    route for None", a request without a method 405; none of these calls a tool."""
    import asyncio

    from agents.flows.http_pipeline import dispatch, parse_request

    state: Any = {"query": "", "a2a_data": data}
    request = asyncio.run(parse_request(state))
    response = asyncio.run(dispatch({**state, **request}))["response"]
    assert (response["status"], response["body"]["error"]) == (status, error)
