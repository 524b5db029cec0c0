"""The flow templates as a reviewer found them, run against the real demo MCP server (stdio).

- ``conditional`` looked for its keywords anywhere in the question: a team named with one ("모니터링팀",
  "자산관리팀", "프로젝트관리팀") was routed by it, and "모니터링팀 몇 명이야?" answered "전체 자산 9건".
- A question word ("누가", "무슨", "어떻게", "언제", "왜") was read as a person's name: "누가 김하늘이야?" looked
  up 누가.
- ``conditional`` answered projects and assets for everyone where a person was named ("김하늘님의 프로젝트",
  "나 김하늘인데 내 자산") or none ("클라우드운영팀 노트북"): it called the tools with an empty filter.
- ``http_pipeline`` sent a percent-encoded decomposed (NFD) name to the tool as it was (404 for 김하늘), and read a
  full-width method, or a tab or an ideographic space after it, as a method not allowed (405)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agents.flows.common import name_in
from agents.models import Run
from audit.models import AuditEvent
from mcpregistry.models import McpServer
from tests.agents.test_flow_defects import flow_agent, run

KIM = {
    "id": 1,
    "name": "김하늘",
    "team": "클라우드운영팀",
    "role": "팀장",
    "email": "haneul.kim@samsungsds.example.com",
}
TEAMS = "['물류플랫폼팀', '클라우드운영팀']"


def ran(demo_server: McpServer, graph: str, query: str) -> tuple[str, list[tuple[str, Any]]]:
    """The answer of ``graph`` to ``query`` and the tool calls it made (tool, arguments), in order."""
    result = run(
        flow_agent(demo_server, f"flow-s41-{graph.replace('_', '-')}", f"agents.flows.{graph}.build_graph"), query
    )
    assert result.status == Run.Status.SUCCEEDED, result.error_message
    made = AuditEvent.objects.filter(run_id=result.id, action="tool.call").order_by("seq")
    return result.answer, [(e.tool, e.args) for e in made]


@pytest.mark.slow
@pytest.mark.django_db
@pytest.mark.parametrize(
    ("query", "expected", "calls"),
    [
        # 1. A keyword inside a team's name does not pick the branch.
        (
            "모니터링팀 몇 명이야?",
            f"'모니터링팀' 팀을 찾을 수 없습니다. 등록된 팀: {TEAMS}",
            [("list_team_members", {"team": "모니터링팀"})],
        ),
        (
            "자산관리팀 누구 있어?",
            f"'자산관리팀' 팀을 찾을 수 없습니다. 등록된 팀: {TEAMS}",
            [("list_team_members", {"team": "자산관리팀"})],
        ),
        (
            "클라우드모니터링팀 프로젝트 알려줘",
            "'클라우드모니터링팀' 팀의 프로젝트가 없습니다.",
            [("list_projects", {"team": "클라우드모니터링팀"})],
        ),
        (
            "프로젝트관리팀 인원",
            f"'프로젝트관리팀' 팀을 찾을 수 없습니다. 등록된 팀: {TEAMS}",
            [("list_team_members", {"team": "프로젝트관리팀"})],
        ),
        # 2. A question word is no name.
        ("누가 김하늘이야?", "김하늘 님은 클라우드운영팀 소속입니다.", [("search_employee", {"name": "김하늘"})]),
        # 3. A person's projects are their team's; a person's assets theirs; no one's assets: ask for a name.
        (
            "김하늘님의 프로젝트",
            "김하늘 님은 클라우드운영팀 소속입니다. 클라우드운영팀 프로젝트: 클라우드 비용 최적화, 사내 AI 어시스턴트 도입",
            [("search_employee", {"name": "김하늘"}), ("list_projects", {"team": "클라우드운영팀"})],
        ),
        (
            "박도윤 프로젝트 알려줘",
            "박도윤 님은 물류플랫폼팀 소속입니다. 물류플랫폼팀 프로젝트: 차세대 물류 플랫폼 구축, 물류 관제 대시보드 고도화",
            [("search_employee", {"name": "박도윤"}), ("list_projects", {"team": "물류플랫폼팀"})],
        ),
        (
            "없는사람 프로젝트",
            "'없는사람' 직원을 찾을 수 없습니다. 등록된 직원: 김하늘, 박도윤, 이서준, 최민준, 정하은",
            [("search_employee", {"name": "없는사람"})],
        ),
        ("프로젝트 알려줘", "ALL", [("list_projects", {"team": ""})]),
        ("전체 프로젝트 보여줘", "ALL", [("list_projects", {"team": ""})]),
        ("올해 프로젝트 알려줘", "ALL", [("list_projects", {"team": ""})]),
        ("신규 프로젝트 누가 해?", "ALL", [("list_projects", {"team": ""})]),
        ("클라우드운영팀 노트북 몇 대야?", "이름을 알려 주세요. (예: 김하늘 님의 자산)", []),
        (
            "나 김하늘인데 내 자산 알려줘",
            "김하늘 님의 자산 2건: 노트북(A-1001), 모니터(A-1006)",
            [("get_asset", {"owner": "김하늘"})],
        ),
    ],
)
def test_the_conditional_template_routes_by_what_is_asked_and_calls_with_who_is_named(
    demo_server: McpServer, query: str, expected: str, calls: list[tuple[str, Any]]
) -> None:
    answer, made = ran(demo_server, "conditional", query)
    if expected == "ALL":  # every team's projects, as the tool lists them
        assert answer.startswith("전체 프로젝트: ") and "차세대 물류 플랫폼 구축" in answer, answer
    else:
        assert answer == expected
    assert made == calls


@pytest.mark.parametrize(
    ("query", "name"),
    [
        ("누가 김하늘이야?", "김하늘"),
        ("누구가 박도윤이야?", "박도윤"),
        ("무슨 프로젝트 해?", None),
        ("어떤 노트북 있어?", None),
        ("어떻게 알려줘", None),
        ("언제 입사했어?", None),
        ("왜 없어?", None),
        ("어디 팀이야?", None),
        ("나 김하늘인데 내 자산 알려줘", "김하늘"),
    ],
)
def test_a_question_word_is_no_name(query: str, name: str | None) -> None:
    assert name_in(query) == name


@pytest.mark.slow
@pytest.mark.django_db
@pytest.mark.parametrize(
    ("query", "calls"),
    [
        # 4. 김하늘 decomposed (NFD: ᄀ+ᅵ+ᆷ ...) and percent-encoded, as macOS would send it.
        (
            "GET /employees/%E1%84%80%E1%85%B5%E1%86%B7%E1%84%92%E1%85%A1%E1%84%82%E1%85%B3%E1%86%AF",
            [("search_employee", {"name": "김하늘"})],
        ),
        # 5. A full-width method; a tab or an ideographic space after the method.
        ("ＧＥＴ /employees/김하늘", [("search_employee", {"name": "김하늘"})]),
        ("GET\u3000/employees/김하늘", [("search_employee", {"name": "김하늘"})]),
        ("GET\t/employees/김하늘", [("search_employee", {"name": "김하늘"})]),
    ],
)
def test_the_http_pipeline_reads_a_decomposed_name_and_a_method_however_typed(
    demo_server: McpServer, query: str, calls: list[tuple[str, Any]]
) -> None:
    answer, made = ran(demo_server, "http_pipeline", query)
    assert (json.loads(answer), made) == ({"status": 200, "body": KIM}, calls)


@pytest.mark.slow
@pytest.mark.django_db
def test_the_http_pipeline_composes_a_decomposed_owner_in_the_query_string(demo_server: McpServer) -> None:
    answer, made = ran(
        demo_server,
        "http_pipeline",
        "GET /assets?owner=%E1%84%8C%E1%85%A5%E1%86%BC%E1%84%92%E1%85%A1%E1%84%8B%E1%85%B3%E1%86%AB",
    )
    assert made == [("get_asset", {"owner": "정하은"})]
    assert json.loads(answer)["status"] == 200
