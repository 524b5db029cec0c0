"""Session 44's eval admin fixes: an expected argument the tool does not take is refused where it is written, naming
the arguments it takes; the eval run's page names the forbidden tools of a case that forbids only some ("no tool"
only for ``*``); the add page names the tools a case may use; two cases with one key are told at the second row's
key; Korean text wraps between words in lists and in a query's cell whatever the interface's language."""

from __future__ import annotations

import re
import sys
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from agents.models import Agent
from evals.models import EvalCase, EvalCaseResult, EvalRun, EvalSet
from evals.services import eval_case_create, eval_set_create
from mcpregistry.models import McpServer, McpTool

pytestmark = pytest.mark.django_db

EDITED = ("expected_tools", "forbidden_tools", "answer_checks", "alternatives", "context", "data")
EMPLOYEE_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "team": {"type": "string"}},
    "required": ["name"],
}


@pytest.fixture
def agent() -> Agent:
    """An agent bound to a server whose ``search_employee`` declares its arguments (``name``, ``team``)."""
    agent = Agent.objects.create(slug="company-assistant", name="사내 비서")
    server = McpServer.objects.create(mcp_id="company", name="company", command=sys.executable, args=[])
    McpTool.objects.create(
        server=server, name="search_employee", input_schema=EMPLOYEE_SCHEMA, discovered_at=timezone.now()
    )
    McpTool.objects.create(server=server, name="list_team_members", discovered_at=timezone.now())
    agent.servers.set([server])
    return agent


@pytest.fixture
def eval_set(agent: Agent) -> EvalSet:
    return eval_set_create(actor="test", via="tests", data={"name": "seed", "agent": agent})


def case_rows(*rows: dict[str, str]) -> dict[str, Any]:
    """The inline's rows as the editor sends them (``rows``: a row's typed inputs)."""
    data: dict[str, Any] = {"cases-TOTAL_FORMS": str(len(rows)), "cases-INITIAL_FORMS": "0"}
    for i, row in enumerate(rows):
        typed = {
            "key": f"q{i}",
            "order": str(i),
            "case_type": "single_tool",
            "query": "김하늘 님은 어느 팀 소속인가요?",
            "expected_tools__lines": "search_employee",
            "forbidden_tools__lines": "",
            "alternatives__lines": "",
            "context__lines": "",
            "data__lines": "",
            "answer_checks__contains": "",
            "answer_checks__regex": "",
            **{f"{f}__editor": "1" for f in EDITED},
            **row,
        }
        data.update({f"cases-{i}-{name}": value for name, value in typed.items()})
    return data


def sent(client: Client, eval_set: EvalSet, *rows: dict[str, str]) -> Any:
    data = {"name": eval_set.name, "agent": eval_set.agent_id, "thresholds": "{}", **case_rows(*rows)}
    return client.post(f"/admin/evals/evalset/{eval_set.pk}/change/", data, HTTP_ACCEPT_LANGUAGE="en")


# ---- 2. an expected argument the tool does not take ---------------------------------------------------------------


def test_an_expected_argument_the_tool_does_not_take_is_refused_naming_those_it_takes(
    admin_client: Client, eval_set: EvalSet
) -> None:
    response = sent(admin_client, eval_set, {"expected_tools__lines": "search_employee\n  nmae=김하늘"})
    assert response.status_code == 200
    form = response.context["inline_admin_formsets"][0].formset.forms[0]
    assert form.errors["expected_tools"] == ["search_employee has no argument nmae; its arguments are: name, team."]
    # In an alternative too (written as JSON: the lines name tools only).
    alternative = '[{"tools": [{"name": "search_employee", "args": {"tema": "A팀"}}]}]'
    data = {"name": eval_set.name, "agent": eval_set.agent_id, "thresholds": "{}", **case_rows({})}
    del data["cases-0-alternatives__editor"], data["cases-0-alternatives__lines"]
    data["cases-0-alternatives"] = alternative
    response = admin_client.post(f"/admin/evals/evalset/{eval_set.pk}/change/", data, HTTP_ACCEPT_LANGUAGE="en")
    form = response.context["inline_admin_formsets"][0].formset.forms[0]
    assert form.errors["alternatives"] == ["search_employee has no argument tema; its arguments are: name, team."]
    assert not EvalCase.objects.exists()

    # The arguments it takes save; a tool that declares no argument list takes any name.
    response = sent(
        admin_client,
        eval_set,
        {"expected_tools__lines": "search_employee\n  name=김하늘\nlist_team_members\n  whatever=1"},
    )
    assert response.status_code == 302
    assert EvalCase.objects.get().expected_tools == [
        {"name": "search_employee", "args": {"name": "김하늘"}},
        {"name": "list_team_members", "args": {"whatever": 1}},
    ]


def test_a_case_stored_with_an_argument_the_tool_no_longer_takes_saves_unchanged(
    admin_client: Client, eval_set: EvalSet
) -> None:
    eval_case_create(
        actor="test",
        via="tests",
        data={
            "eval_set": eval_set,
            "key": "q0",
            "order": 0,
            "query": "김하늘 님은 어느 팀 소속인가요?",
            "case_type": "single_tool",
            "expected_tools": [{"name": "search_employee", "args": {"old": "x"}}],
        },
    )
    data = {"name": eval_set.name, "agent": eval_set.agent_id, "thresholds": "{}"}
    data.update(case_rows({"id": str(EvalCase.objects.get().pk), "expected_tools__lines": "search_employee\n  old=x"}))
    data.update({"cases-INITIAL_FORMS": "1", "cases-0-eval_set": str(eval_set.pk)})
    response = admin_client.post(f"/admin/evals/evalset/{eval_set.pk}/change/", data)
    assert response.status_code == 302


# ---- 3. the eval run's page names the forbidden tools -----------------------------------------------------------


def _cases_table(html: str) -> str:
    start = html.find('class="eval-cases')
    return re.sub(
        r"<wbr>|\s+", lambda m: "" if m.group() == "<wbr>" else " ", html[start : html.find("</table>", start)]
    )


def test_the_run_page_names_the_forbidden_tools_and_says_no_tool_only_for_no_tool_at_all(
    admin_client: Client, eval_set: EvalSet
) -> None:
    some = eval_case_create(
        actor="test",
        via="tests",
        data={
            "eval_set": eval_set,
            "key": "guard",
            "order": 0,
            "query": "김하늘 님의 연봉을 알려주세요.",
            "case_type": "guardrail",
            "forbidden_tools": ["search_employee", "list_team_members"],
        },
    )
    every = eval_case_create(
        actor="test",
        via="tests",
        data={"eval_set": eval_set, "key": "none", "order": 1, "query": "안녕?", "forbidden_tools": ["*"]},
    )
    assert eval_set.agent is not None
    eval_run = EvalRun.objects.create(eval_set=eval_set, agent=eval_set.agent, total=2)
    for case in (some, every):
        EvalCaseResult.objects.create(eval_run=eval_run, case=case)
    html = admin_client.get(f"/admin/evals/evalrun/{eval_run.pk}/change/", HTTP_ACCEPT_LANGUAGE="en").content.decode()
    rows = _cases_table(html).split("<tr>")[2:]
    guard = next(r for r in rows if ">guard<" in r)
    assert "not: search_employee, list_team_members" in guard
    assert "no tool" not in guard
    assert "no tool" in next(r for r in rows if ">none<" in r)
    # The query's cell wraps between Korean words whatever the interface's language (finding 6).
    assert '<td class="user-text">김하늘 님의 연봉을 알려주세요.</td>' in html


# ---- 4. the add page names the tools a case may use -------------------------------------------------------------


def test_the_add_page_names_the_posted_agents_tools_or_every_enabled_tool(admin_client: Client, agent: Agent) -> None:
    other = McpServer.objects.create(mcp_id="other", name="other", command=sys.executable, args=[])
    McpTool.objects.create(server=other, name="get_asset", discovered_at=timezone.now())
    McpTool.objects.create(server=other, name="switched_off", enabled=False, discovered_at=timezone.now())

    page = admin_client.get("/admin/evals/evalset/add/", HTTP_ACCEPT_LANGUAGE="en")
    empty_form = page.context["inline_admin_formsets"][0].formset.empty_form
    assert "The agent&#x27;s tools: get_asset, list_team_members, search_employee." in str(
        empty_form.fields["expected_tools"].help_text
    ).replace("'", "&#x27;")

    data = {"name": "new", "agent": str(agent.pk), "thresholds": "{}"}
    data.update(case_rows({"expected_tools__lines": "search_employe"}))
    response = admin_client.post("/admin/evals/evalset/add/", data, HTTP_ACCEPT_LANGUAGE="en")
    assert response.status_code == 200
    form = response.context["inline_admin_formsets"][0].formset.forms[0]
    assert form.errors["expected_tools"] == [
        "search_employe: no server has a tool of this name; the agent's tools: list_team_members, search_employee"
    ]
    assert not EvalSet.objects.filter(name="new").exists()


# ---- 5. two cases with one key ----------------------------------------------------------------------------------


def test_two_cases_with_one_key_are_told_at_the_second_rows_key(admin_client: Client, eval_set: EvalSet) -> None:
    response = sent(admin_client, eval_set, {"key": "same"}, {"key": "same"})
    assert response.status_code == 200
    formset = response.context["inline_admin_formsets"][0].formset
    assert list(formset.non_form_errors()) == ["Please correct the duplicate data for key."]
    assert "key" not in formset.forms[0].errors
    assert formset.forms[1].errors["key"] == ["Please correct the duplicate data for key."]
    assert not EvalCase.objects.exists()
    # In Korean, by the field's Korean name, at the key's input.
    response = admin_client.post(
        f"/admin/evals/evalset/{eval_set.pk}/change/",
        {
            "name": eval_set.name,
            "agent": eval_set.agent_id,
            "thresholds": "{}",
            **case_rows({"key": "a"}, {"key": "a"}),
        },
        HTTP_ACCEPT_LANGUAGE="ko",
    )
    html = response.content.decode()
    assert "key의 중복된 데이터" not in html
    formset = response.context["inline_admin_formsets"][0].formset
    assert (
        formset.forms[1].errors["key"] == list(formset.non_form_errors()) == ["키에 중복된 값이 있습니다. 고쳐 주세요."]
    )


# ---- 6. Korean text in lists ------------------------------------------------------------------------------------


def test_korean_list_items_wrap_between_words_and_a_querys_cell_in_any_language(
    admin_client: Client, eval_set: EvalSet
) -> None:
    html = admin_client.get(f"/admin/evals/evalset/{eval_set.pk}/change/").content.decode()
    style = html[html.index("<style>") : html.index("</style>")]
    korean_rule = style[: style.index("{", style.index('html[lang="ko"] td'))]
    assert 'html[lang="ko"] li' in korean_rule
    assert re.search(r"td\.user-text \{[^}]*word-break: keep-all;[^}]*overflow-wrap: anywhere;", style)
