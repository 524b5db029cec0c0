"""Review s41 of evals: an expected argument that changes only in its JSON type is a change (import and admin); a
case typed single_tool or multi_tool must expect a tool; ``dont_know`` reads more Korean ways of not knowing and not
a confident answer; a full-width comma separates tool names and a name with a space or an invisible character is
refused; a filter given twice is a 400; a set's description is stored composed."""

from __future__ import annotations

import json
import sys
import unicodedata
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from agents.models import Agent
from agents.services import api_key_create
from evals.models import EvalCase, EvalRun, EvalSet
from evals.notation import parse_expected_source
from evals.scoring import answer_check_failures
from evals.services import eval_case_create, eval_set_apply, eval_set_create
from mcpregistry.models import McpServer, McpTool
from tests.evals.conftest import import_seed_set
from tests.evals.test_case_editor import page_of, sent_back

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_key_client() -> APIClient:
    _key, raw = api_key_create(actor="test", via="tests", name="ops", admin=True)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


@pytest.fixture
def tool_set() -> EvalSet:
    """A set whose agent binds a server with the tools its cases name."""
    agent = Agent.objects.create(slug="company-assistant", name="사내 비서")
    server = McpServer.objects.create(mcp_id="company", name="company", command=sys.executable, args=[])
    for name in ("list_projects", "search_employee"):
        McpTool.objects.create(server=server, name=name, discovered_at=timezone.now())
    agent.servers.set([server])
    return eval_set_create(actor="test", via="tests", data={"name": "seed", "agent": agent})


def _document(case: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"name": "s1", "cases": [{"key": "c1", "query": "q", **case}], **fields}


# ---- 1. the import reports a change of JSON type --------------------------------------------------------------


@pytest.mark.parametrize("typed", [True, 1.0])
def test_an_expected_argument_changed_only_in_its_json_type_is_reported_changed(typed: Any) -> None:
    tools = {"type": "single_tool", "expected_tools": [{"name": "list_projects", "args": {"limit": 1, "team": "a"}}]}
    eval_set_apply(document=_document(tools), actor="test", via="tests")
    # The same arguments in another key order are no change.
    reordered = {**tools, "expected_tools": [{"args": {"team": "a", "limit": 1}, "name": "list_projects"}]}
    assert eval_set_apply(document=_document(reordered), actor="test", via="tests").changed == []

    retyped = {**tools, "expected_tools": [{"name": "list_projects", "args": {"limit": typed, "team": "a"}}]}
    result = eval_set_apply(document=_document(retyped), actor="test", via="tests")

    assert result.changed == ["c1"]
    stored = EvalCase.objects.get(key="c1").expected_tools[0]["args"]["limit"]
    assert json.dumps(stored) == json.dumps(typed)


# ---- 2. the admin stores a change of JSON type ------------------------------------------------------------------


@pytest.mark.parametrize(("typed", "stored"), [("true", True), ("1.0", 1.0)])
def test_an_argument_typed_anew_in_another_json_type_is_stored(
    admin_client: Client, tool_set: EvalSet, typed: str, stored: Any
) -> None:
    eval_case_create(
        actor="test",
        via="tests",
        data={
            "eval_set": tool_set,
            "key": "q1",
            "query": "프로젝트?",
            "case_type": "single_tool",
            "expected_tools": [{"name": "list_projects", "args": {"limit": 1}}],
        },
    )
    lines = {"cases-0-expected_tools__lines": f"list_projects\n  limit={typed}"}

    response = admin_client.post(
        f"/admin/evals/evalset/{tool_set.pk}/change/", sent_back(page_of(admin_client, tool_set), **lines)
    )

    assert response.status_code == 302
    limit = EvalCase.objects.get(key="q1").expected_tools[0]["args"]["limit"]
    assert json.dumps(limit) == json.dumps(stored)


# ---- 3. a tool case must expect a tool --------------------------------------------------------------------------


@pytest.mark.parametrize("case_type", ["single_tool", "multi_tool"])
def test_a_tool_case_that_expects_no_tool_is_refused_by_the_api(admin_key_client: APIClient, case_type: str) -> None:
    refused = admin_key_client.post("/api/v1/evals/sets", _document({"type": case_type}), format="json")

    assert refused.status_code == 400
    assert f"a {case_type} case needs the names of its tools" in refused.json()["error"]["message"]
    assert not EvalSet.objects.filter(name="s1").exists()
    listed = _document({"type": case_type, "expected_tools": []})
    assert admin_key_client.post("/api/v1/evals/sets", listed, format="json").status_code == 400


def test_cases_that_need_no_tool_still_import_and_so_does_the_seed_set(admin_key_client: APIClient) -> None:
    document = {
        "name": "s1",
        "cases": [
            {"key": "a", "query": "q", "type": "no_tool", "expected_source": "none"},
            {"key": "b", "query": "q", "type": "no_answer", "expected_source": None},
            {"key": "c", "query": "q", "type": "fact", "expected_source": "docs/leave_policy.md"},
        ],
    }
    assert admin_key_client.post("/api/v1/evals/sets", document, format="json").status_code == 201
    Agent.objects.create(slug="a", name="a")
    assert import_seed_set(agent="a").cases.count() == 5


def test_the_admin_refuses_a_tool_case_whose_tools_are_taken_out(admin_client: Client, tool_set: EvalSet) -> None:
    eval_case_create(
        actor="test",
        via="tests",
        data={"eval_set": tool_set, "key": "q1", "query": "팀?", "expected_tools": [{"name": "search_employee"}]},
    )
    emptied = sent_back(page_of(admin_client, tool_set), **{"cases-0-expected_tools__lines": ""})

    response = admin_client.post(f"/admin/evals/evalset/{tool_set.pk}/change/", emptied)

    assert response.status_code == 200
    assert "a single_tool case needs the names of its tools" in response.content.decode()
    assert EvalCase.objects.get(key="q1").expected_tools == [{"name": "search_employee"}]
    # Typed as a case that needs no tool, it is taken.
    retyped = sent_back(
        page_of(admin_client, tool_set), **{"cases-0-expected_tools__lines": "", "cases-0-case_type": "no_answer"}
    )
    assert admin_client.post(f"/admin/evals/evalset/{tool_set.pk}/change/", retyped).status_code == 302
    assert EvalCase.objects.get(key="q1").expected_tools == []


# ---- 4. dont_know -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "answer",
    [
        "죄송하지만, 육아휴직에 관한 정보는 제공된 문서에 없습니다.",
        "제공된 문서에는 육아휴직 관련 내용이 없습니다.",
        "육아휴직에 대해서는 답변드리기 어렵습니다.",
        "해당 내용은 규정 문서에 포함되어 있지 않습니다.",
        "육아휴직 관련 정보는 확인되지 않습니다.",
        "육아휴직 정보가 없네요.",
        "해당 정보는 확인이 어렵습니다.",
        "I\u2019m not sure.",
        "관련 정보가 없는 것 같습니다.",
        "확인할 수 없어서 죄송합니다.",  # a reason, and an apology: not knowing, said
    ],
)
def test_more_ways_of_saying_it_does_not_know_pass(answer: str) -> None:
    assert answer_check_failures([{"dont_know": True}], answer) == []
    assert answer_check_failures([{"dont_know": True}], unicodedata.normalize("NFD", answer)) == []


@pytest.mark.parametrize(
    "answer",
    [
        "알 수 없는 오류가 발생했지만 연차는 15일입니다.",
        "자료에 따르면 문제없이 15일입니다.",
        "요청하신 내용은 문제없이 처리되었습니다. 박도윤의 연차는 15일입니다",
        "자료는 빠짐없이 확인했습니다. 연차는 15일입니다",
        "정보는 틀림없이 정확합니다",
        "서버 점검 결과 이상 징후는 확인되지 않았습니다.",
        "연차는 15일입니다. 단, 수습기간은 포함되지 않습니다",
        "계약서에 위약금 조항은 나와 있지 않습니다",
    ],
)
def test_a_confident_answer_does_not_pass_as_not_knowing(answer: str) -> None:
    assert answer_check_failures([{"dont_know": True}], answer) == ["dont_know"]


# ---- 5. tool names ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("comma", ["\uff0c", "\u3001", "\uff0c "])
def test_a_full_width_or_ideographic_comma_separates_tool_names(comma: str) -> None:
    source = parse_expected_source(f"classify_request{comma}calculate", case_type="multi_tool")
    assert source.expected_tools == [{"name": "classify_request"}, {"name": "calculate"}]


@pytest.mark.parametrize("name", ["get\u3000asset", "get\u200basset", "get asset", "\u2060calculate"])
def test_a_tool_name_with_a_space_or_an_invisible_character_is_refused(admin_key_client: APIClient, name: str) -> None:
    for case in (
        {"type": "single_tool", "expected_tools": [name]},
        {"type": "single_tool", "expected_tools": [{"name": name}]},
        {"type": "single_tool", "expected_tools": ["calculate"], "forbidden_tools": [name]},
        {"type": "single_tool", "expected_tools": ["calculate"], "alternatives": [{"tools": [name]}]},
    ):
        refused = admin_key_client.post("/api/v1/evals/sets", _document(case), format="json")
        assert refused.status_code == 400, (case, refused.content)
        assert "is not a tool name" in refused.json()["error"]["message"]
    with pytest.raises(ValueError, match="not a tool name"):
        parse_expected_source(f"classify_request, {name}", case_type="multi_tool")


# ---- 6. a filter given twice ------------------------------------------------------------------------------------


def test_a_filter_given_twice_is_refused_not_read_as_its_last(admin_key_client: APIClient) -> None:
    agent = Agent.objects.create(slug="a", name="a")
    eval_set = eval_set_create(actor="test", via="tests", data={"name": "s1", "agent": agent})
    eval_run = EvalRun.objects.create(eval_set=eval_set, agent=agent, total=0)

    for query in ("set=nope&set=s1", "set=s1&set=nope", "set=s1&set=s1"):
        refused = admin_key_client.get(f"/api/v1/evals/runs?{query}")
        assert refused.status_code == 400, query
        assert "set" in refused.json()["error"]["fields"]
    assert admin_key_client.get("/api/v1/evals/runs?set=s1").status_code == 200
    detail = f"/api/v1/evals/runs/{eval_run.pk}"
    assert admin_key_client.get(f"{detail}?page_size=1&page_size=100").status_code == 400
    assert admin_key_client.get(f"{detail}?page_size=1").status_code == 200


# ---- 7. a set's description composed ----------------------------------------------------------------------------


def test_a_sets_description_sent_decomposed_is_stored_composed(admin_client: Client) -> None:
    decomposed = unicodedata.normalize("NFD", "육아휴직 질문 모음")
    eval_set_apply(document={"name": "s1", "description": decomposed}, actor="test", via="tests")
    assert EvalSet.objects.get(name="s1").description == "육아휴직 질문 모음"

    data = {"name": "s2", "description": decomposed, "thresholds": "{}"}
    data.update({"cases-TOTAL_FORMS": "0", "cases-INITIAL_FORMS": "0"})
    response = admin_client.post("/admin/evals/evalset/add/", data)
    assert response.status_code == 302, response.content.decode()[-2000:]
    assert EvalSet.objects.get(name="s2").description == "육아휴직 질문 모음"
