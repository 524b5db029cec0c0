"""A case naming a tool no server has is refused where it is written through the API and ``import_config``, as the
admin's case form refuses it: such a case failed on every run. A name a stored case already holds (its tool removed
since) still reads, exports and imports again."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from agent_platform.errors import ApplicationError
from agents.configuration import config_import
from agents.models import Agent
from agents.services import api_key_create
from audit.models import AuditEvent
from evals.models import EvalSet
from evals.services import eval_case_create, eval_set_apply, eval_set_create, eval_set_document

pytestmark = [pytest.mark.django_db, pytest.mark.slow]


@pytest.fixture
def admin_key_client(db: Any) -> APIClient:
    _key, raw = api_key_create(actor="test", via="tests", name="ops", admin=True)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def _set(agent: str | None, **case: Any) -> dict[str, Any]:
    return {
        "name": "typo",
        "agent": agent,
        "cases": [{"key": "team", "query": "김하늘 님은 어느 팀 소속인가요?", "type": "single_tool", **case}],
    }


@pytest.mark.parametrize(
    ("case", "where", "name"),
    [
        ({"expected_tools": ["search_employe"]}, "cases[0].expected_tools", "search_employe"),
        ({"expected_source": "search_employee, list_projectz"}, "cases[0].expected_tools", "list_projectz"),
        (
            {"expected_tools": ["search_employee"], "alternatives": [{"tools": ["search_employee", "직원_검색"]}]},
            "cases[0].alternatives",
            "직원_검색",
        ),
        (
            {"expected_tools": ["search_employee"], "forbidden_tools": ["get_salary"]},
            "cases[0].forbidden_tools",
            "get_salary",
        ),
    ],
)
def test_an_api_set_naming_a_tool_no_server_has_is_a_400_naming_it(
    admin_key_client: APIClient, demo_agent: Agent, case: dict[str, Any], where: str, name: str
) -> None:
    response = admin_key_client.post("/api/v1/evals/sets", _set(demo_agent.slug, **case), format="json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid_eval_set"
    assert f"{where}: {name}: no server has a tool of this name" in error["message"]
    assert "search_employee" in error["message"]  # the agent's tools are named, to pick the right one
    assert not EvalSet.objects.filter(name="typo").exists()
    assert not AuditEvent.objects.filter(action__startswith="config.eval").exists()


def test_import_config_refuses_a_case_naming_a_tool_no_server_has_and_imports_nothing(demo_agent: Agent) -> None:
    document = {"eval_sets": [_set(demo_agent.slug, expected_source="search_employe")]}
    with pytest.raises(ApplicationError) as refused:
        config_import(document=document, actor="ops", via="import_config")
    assert "cases[0].expected_tools: search_employe: no server has a tool of this name" in refused.value.message
    assert not EvalSet.objects.filter(name="typo").exists()


def test_a_set_naming_the_servers_tools_is_accepted(admin_key_client: APIClient, demo_agent: Agent) -> None:
    response = admin_key_client.post(
        "/api/v1/evals/sets", _set(None, expected_source="search_employee,list_projects"), format="json"
    )
    assert response.status_code == 201, response.content
    assert [t["name"] for t in response.json()["cases"][0]["expected_tools"]] == ["search_employee", "list_projects"]


def test_a_stored_case_whose_tool_is_gone_still_reads_and_imports_again(
    admin_key_client: APIClient, demo_agent: Agent
) -> None:
    eval_set = eval_set_create(actor="test", via="tests", data={"name": "old", "agent": demo_agent})
    # Stored while a server still had the tool (or before the check): no server has it now.
    eval_case_create(
        actor="test",
        via="tests",
        data={"eval_set": eval_set, "key": "gone", "query": "예전 도구", "expected_tools": [{"name": "retired_tool"}]},
    )
    read = admin_key_client.get("/api/v1/evals/sets/old")
    assert read.status_code == 200
    document = read.json()
    assert document == eval_set_document(eval_set)
    again = admin_key_client.post("/api/v1/evals/sets", document, format="json")
    assert again.status_code == 200, again.content
    assert eval_set_apply(document=document, actor="ops", via="import_config").changed == []
    # A new case naming it is still refused: only what the case already held passes.
    added = {**document, "cases": [*document["cases"], {**document["cases"][0], "key": "new"}]}
    refused = admin_key_client.post("/api/v1/evals/sets", added, format="json")
    assert refused.status_code == 400
    assert "cases[1].expected_tools: retired_tool" in refused.json()["error"]["message"]
