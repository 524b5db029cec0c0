"""An eval run's page names every expected tool, however it was stored, and the comparison of two eval runs
shows a case not scored yet as running or waiting, never as failed, and does not count it as changed."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from rest_framework.test import APIClient

from agents.models import Agent, Run
from agents.services import api_key_create
from evals.models import EvalCase, EvalCaseResult, EvalRun, EvalSet
from evals.services import eval_case_create, eval_run_compare, eval_set_create
from mcpregistry.models import McpServer, McpTool

pytestmark = pytest.mark.django_db


@pytest.fixture
def eval_set() -> EvalSet:
    agent = Agent.objects.create(slug="a", name="a")
    return eval_set_create(actor="test", via="tests", data={"name": "s", "agent": agent})


def _cases_table(html: str) -> str:
    start = html.find('class="eval-cases')
    return re.sub(
        r"<wbr>|\s+", lambda m: "" if m.group() == "<wbr>" else " ", html[start : html.find("</table>", start)]
    )


def test_expected_tools_written_in_the_admin_are_stored_as_objects_and_all_shown(
    admin_client: Client, eval_set: EvalSet
) -> None:
    server = McpServer.objects.create(mcp_id="sds", name="sds", transport="stdio", command="python3")
    for name in ("search_employee", "get_asset"):
        McpTool.objects.create(server=server, name=name)
    data = {
        "name": "s", "agent": eval_set.agent_id, "thresholds": "{}", "cases-TOTAL_FORMS": "1", "cases-INITIAL_FORMS": "0",
        "cases-0-key": "q1", "cases-0-order": "1", "cases-0-case_type": "multi_tool", "cases-0-query": "김하늘 팀?",
        "cases-0-expected_tools__lines": "search_employee\nget_asset\n  asset_id=A-1",
        "cases-0-forbidden_tools__lines": "", "cases-0-alternatives__lines": "", "cases-0-context__lines": "",
        "cases-0-data__lines": "", "cases-0-answer_checks__contains": "", "cases-0-answer_checks__regex": "",
        **{f"cases-0-{f}__editor": "1" for f in ("expected_tools", "forbidden_tools", "answer_checks", "alternatives", "context", "data")},
    }  # fmt: skip
    assert admin_client.post(f"/admin/evals/evalset/{eval_set.pk}/change/", data).status_code == 302
    case = EvalCase.objects.get(eval_set=eval_set)
    assert case.expected_tools == [{"name": "search_employee"}, {"name": "get_asset", "args": {"asset_id": "A-1"}}]
    eval_run = EvalRun.objects.create(eval_set=eval_set, agent=eval_set.agent, total=1)
    EvalCaseResult.objects.create(eval_run=eval_run, case=case)
    table = _cases_table(admin_client.get(f"/admin/evals/evalrun/{eval_run.pk}/change/").content.decode())
    assert "search_employee, get_asset" in table


def test_the_run_page_names_expected_tools_stored_as_bare_names(admin_client: Client, eval_set: EvalSet) -> None:
    """What the admin stored before its tools were objects."""
    case = eval_case_create(actor="test", via="tests", data={"eval_set": eval_set, "key": "k", "query": "q"})
    EvalCase.objects.filter(pk=case.pk).update(expected_tools=["search_employee", {"name": "get_asset"}])
    eval_run = EvalRun.objects.create(eval_set=eval_set, agent=eval_set.agent, total=1)
    EvalCaseResult.objects.create(eval_run=eval_run, case=case)
    table = _cases_table(admin_client.get(f"/admin/evals/evalrun/{eval_run.pk}/change/").content.decode())
    assert "search_employee, get_asset" in table


def _two_runs(eval_set: EvalSet) -> tuple[EvalRun, EvalRun]:
    agent = eval_set.agent
    assert agent is not None
    running = eval_case_create(actor="test", via="tests", data={"eval_set": eval_set, "key": "running", "query": "q"})
    waiting = eval_case_create(actor="test", via="tests", data={"eval_set": eval_set, "key": "waiting", "query": "q"})
    a = EvalRun.objects.create(eval_set=eval_set, agent=agent, total=2)
    b = EvalRun.objects.create(eval_set=eval_set, agent=agent, total=2)
    run = Run.objects.create(agent=agent, query="q", purpose=Run.Purpose.EVAL)
    EvalCaseResult.objects.create(eval_run=a, case=running, run=run)
    EvalCaseResult.objects.create(eval_run=a, case=waiting)
    for case in (running, waiting):
        EvalCaseResult.objects.create(eval_run=b, case=case, scored=True, passed=True, scores={"failed_checks": []})
    return a, b


def test_a_case_not_scored_yet_is_not_counted_as_changed(eval_set: EvalSet) -> None:
    a, b = _two_runs(eval_set)
    assert [row.changed for row in eval_run_compare(a=a, b=b)] == [False, False]
    _key, raw = api_key_create(actor="test", via="tests", name="ops", admin=True)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    body = client.get(f"/api/v1/evals/runs/{a.pk}/compare/{b.pk}").json()
    assert body["changed"] == 0
    assert [(c["a"]["scored"], c["a"]["passed"]) for c in body["cases"]] == [(False, None), (False, None)]


def test_the_comparison_page_shows_a_case_not_scored_yet_as_running_or_waiting(
    admin_client: Client, eval_set: EvalSet
) -> None:
    a, b = _two_runs(eval_set)
    html = admin_client.get(f"/admin/evals/evalrun/compare/?a={a.pk}&b={b.pk}").content.decode()
    table = re.sub(r"\s+", " ", html[html.find("eval-compare eval-cases") :])
    assert "0 cases changed" in html
    rows = table.split("<tr class=")[2:]  # the heading of the unchanged cases, then one row per case
    running, waiting = (row[: row.find("</tr>")] for row in rows)
    assert "<td>running </td>" in running and "eval-fail" not in running
    assert "<td>waiting </td>" in waiting and "eval-fail" not in waiting
