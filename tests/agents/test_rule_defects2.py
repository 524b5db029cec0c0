"""Rule defects, second round (``agents/deterministic.py``, ``agents/rule_tester.py``):

2. a placeholder in a list's item or an object's member of the params (``floors = 3F, {match.flor}``,
   ``filter = {"floor": "{match.flor}"}``) was never checked: saved, then skipped on every query (or sent as
   written); now refused as a top-level one is, naming where it is (``floors[1]``, ``filter.floor``);
3. ``{params.NAME}`` in an answer template was never checked: a NAME the rule does not send made every answer the
   tool's raw output; now refused, naming the parameters the rule sends — where the params or the answer template
   change (``named_params``): a rule stored before the check still saves, and its export imports, as it is;
4. a context condition read a flat key (``context.get("user.tier")``) while ``{context.user.tier}`` followed the
   dots: neither shape of context both matched and filled the params; both read the exact key first, then the
   dotted path (as data conditions do);
5. the rule tester could not be given what runs get: files (``ctx.a2a_files``), an empty query beside data, and it
   took a query longer than the API takes and data parts that are no objects;
6a. the tester's summary said "a run calls X before the model" where X is a write a run parks on for approval.
"""

from __future__ import annotations

import html
import json
import re
import sys
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from agents.configuration import config_export, config_import
from agents.deterministic import RuleSpec, decide, match_conditions, placeholder_problems, render_answer
from agents.models import Agent, DeterministicRule, Run
from agents.rule_tester import RuleTesterForm, rules_trial, trials_summary
from agents.services import deterministic_rule_update
from agents.tools import DeterministicContext, deterministic_tool
from mcpregistry.models import McpServer, McpTool, ToolContract
from tests.agents.test_rule_input_forms import run_now
from tests.conftest import make_agent

TEAM_QUERY = "클라우드운영팀 인원이 몇 명인지 알려주세요."
FLOOR_WHEN = {"regex": r"(?P<floor>\d+)층"}


def _text(page: str) -> str:
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page)))


# ---- 2. placeholders inside lists and objects -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        (
            {"floors": ["3F", "{match.flor}"]},
            "floors[1]: {match.flor}: the regex has no named group 'flor' (its groups: floor)",
        ),
        (
            {"filter": {"floor": "{match.flor}"}},
            "filter.floor: {match.flor}: the regex has no named group 'flor' (its groups: floor)",
        ),
        (
            {"filter": {"floors": [{"at": "{match.flor}층"}]}},
            "filter.floors[0].at: {match.flor}: the regex has no named group 'flor'",
        ),
        ({"floors": ["3F", "{mach.floor}"]}, "floors[1]: {mach.floor}: use {query}, {context.KEY}"),
        ({"filter": {"floor": "{match.floor"}}, "filter.floor: {match.floor: use {query}"),
    ],
)
def test_a_placeholder_inside_a_list_or_an_object_is_checked_naming_where_it_is(params, expected) -> None:
    problems = placeholder_problems(FLOOR_WHEN, params, "")
    assert any(expected in problem for problem in problems.get("params", [])), problems


def test_a_top_level_problem_names_its_argument_too_and_good_nested_placeholders_pass() -> None:
    problems = placeholder_problems(FLOOR_WHEN, {"floor": "{match.flor}"}, "")
    assert problems["params"][0].startswith("floor: {match.flor}: the regex has no named group 'flor'")
    good = {"floors": ["3F", "{match.floor}"], "filter": {"floor": "{match.floor}", "q": "{query}"}}
    assert placeholder_problems(FLOOR_WHEN, good, "") == {}


@pytest.fixture
def floors_server(db: Any) -> McpServer:
    server = McpServer.objects.create(mcp_id="rooms", name="rooms", command=sys.executable, args=[])
    schema = {
        "type": "object",
        "properties": {"floors": {"type": "array", "items": {"type": "string"}}, "filter": {"type": "object"}},
    }
    McpTool.objects.create(server=server, name="find_rooms", input_schema=schema, discovered_at=timezone.now())
    return server


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("params", "where"),
    [({"floors": ["3F", "{match.flor}"]}, "floors[1]"), ({"filter": {"floor": "{match.flor}"}}, "filter.floor")],
)
def test_a_rule_with_a_nested_placeholder_no_run_can_fill_is_not_saved(floors_server, params, where) -> None:
    agent = Agent.objects.create(slug="rooms", name="rooms")
    agent.servers.set([floors_server])
    rule = DeterministicRule(
        agent=agent, name="층", server=floors_server, tool_name="find_rooms", when=FLOOR_WHEN, params=params
    )
    with pytest.raises(ValidationError) as caught:
        rule.full_clean()
    assert any(m.startswith(f"{where}: {{match.flor}}") for m in caught.value.message_dict["params"])


# ---- 3. {params.NAME} in the answer template ------------------------------------------------------------------


def test_an_answer_template_naming_a_parameter_the_rule_does_not_send_is_refused() -> None:
    problems = placeholder_problems({}, {"q": "{query}", "limit": 3}, "{params.qq}층 회의실: {result.rooms}")
    assert problems == {"answer_template": ["{params.qq}: the rule sends no parameter 'qq' (its parameters: limit, q)"]}
    assert placeholder_problems({}, {}, "{params.q}")["answer_template"] == [
        "{params.q}: the rule sends no parameter 'q' (its parameters: none)"
    ]
    assert placeholder_problems({}, {"q": "{query}"}, "{params.q}층: {result.rooms}") == {}
    assert placeholder_problems({}, {"filter": {"floor": 3}}, "{params.filter.floor}층") == {}


def test_a_parameter_the_rule_does_not_send_is_not_checked_where_neither_params_nor_template_changed() -> None:
    assert placeholder_problems({}, {}, "{params.q} 방을 찾았습니다", named_params=False) == {}
    assert placeholder_problems({}, {}, "{params.q} 방을 찾았습니다")["answer_template"] == [
        "{params.q}: the rule sends no parameter 'q' (its parameters: none)"
    ]
    # Only that check: a placeholder of no known source is refused still.
    assert "answer_template" in placeholder_problems({}, {}, "{bogus.q}", named_params=False)


@pytest.mark.django_db
def test_a_rule_stored_before_the_params_check_saves_and_imports_as_it_is(floors_server) -> None:
    agent = Agent.objects.create(slug="rooms", name="rooms")
    agent.servers.set([floors_server])
    rule = DeterministicRule(
        agent=agent,
        name="방",
        server=floors_server,
        tool_name="find_rooms",
        when=FLOOR_WHEN,
        params={},
        answer_template="{params.q} 방을 찾았습니다",
    )
    rule.save()  # stored before the check (test code may write rows directly)

    rule.name = "방 찾기"
    deterministic_rule_update(rule=rule, actor="test", via="tests")
    config_import(document=json.loads(json.dumps(config_export())), actor="test", via="tests")

    rule.answer_template = "{params.qq} 방을 찾았습니다"
    with pytest.raises(ValidationError) as refused:
        deterministic_rule_update(rule=rule, actor="test", via="tests")
    assert refused.value.message_dict["answer_template"] == [
        "{params.qq}: the rule sends no parameter 'qq' (its parameters: none)"
    ]


# ---- 4. context conditions and {context.…} read the same paths ----------------------------------------------------


@pytest.mark.parametrize("context", [{"user": {"tier": "gold"}}, {"user.tier": "gold"}])
def test_a_dotted_context_condition_and_placeholder_read_either_shape_of_context(context) -> None:
    rule = RuleSpec(
        rule_id=1,
        name="tier",
        mcp_id="m",
        tool_name="t",
        when={"context": {"user.tier": "gold"}},
        params={"q": "{context.user.tier}"},
    )
    decision = decide(rule, query="등급", context=context, a2a_data=None, available_tools={"t"})
    assert (decision.matched, decision.params) == (True, {"q": "gold"})


def test_the_exact_key_is_read_before_the_path_and_absent_is_still_null() -> None:
    both = {"user.tier": "gold", "user": {"tier": "silver"}}
    when = {"context": {"user.tier": "gold"}}
    assert match_conditions(when, query="", context=both, a2a_data=None, available_tools=set())[0]
    silver = {"context": {"user.tier": "silver"}}
    assert not match_conditions(silver, query="", context=both, a2a_data=None, available_tools=set())[0]
    absent = {"context": {"user.tier": None}}
    assert match_conditions(absent, query="", context={}, a2a_data=None, available_tools=set())[0]


# ---- 5. the tester takes what runs get --------------------------------------------------------------------------


@deterministic_tool(mcp_id="sds-company-data")
def route_on_a_pdf(ctx: DeterministicContext) -> dict[str, Any] | None:
    """Looks up the employee a PDF is named after (a code rule routing on ``ctx.a2a_files``)."""
    for file in ctx.a2a_files or []:
        if file.get("mimeType") == "application/pdf":
            return {"tool_name": "search_employee", "params": {"name": file["name"].removesuffix(".pdf")}}
    return None


@pytest.mark.django_db
def test_the_tester_hands_files_to_a_code_rule_as_a_run_does(admin_client, demo_server) -> None:
    agent = make_agent(slug="files", servers=[demo_server], with_demo_rules=False)
    DeterministicRule.objects.create(agent=agent, name="pdf", code=f"{__name__}.route_on_a_pdf")
    files = [{"name": "김하늘.pdf", "mimeType": "application/pdf", "uri": "https://files.example/1"}]
    run = run_now(agent, "첨부 확인", a2a_files=files)
    assert [r["tool"] for r in run.deterministic_results] == ["search_employee"]
    lines = "name=김하늘.pdf\nmimeType=application/pdf\nuri=https://files.example/1"
    for typed in (lines, json.dumps(files, ensure_ascii=False)):
        response = admin_client.post(
            "/admin/agents/rule-tester/", {"agent": agent.pk, "query": "첨부 확인", "a2a_files": typed}
        )
        page = _text(response.content.decode())
        assert "1 of 1 rules matched: a run calls sds-company-data.search_employee before the model." in page
        assert '{"name": "김하늘"}' in page


@pytest.mark.django_db
def test_files_are_kept_as_a_run_keeps_them_and_checked_as_the_api_checks_them(demo_agent) -> None:
    def form(files: str) -> RuleTesterForm:
        return RuleTesterForm({"agent": demo_agent.pk, "query": "q", "a2a_files": files})

    kept = form("name=a.txt\nbytes=aGVsbG8=\n\nuri=https://x.example/b\nmimeType=text/plain")
    assert kept.is_valid(), kept.errors
    assert kept.cleaned_data["a2a_files"] == [
        {"name": "a.txt", "size": 5},  # the bytes counted, never kept
        {"uri": "https://x.example/b", "mimeType": "text/plain"},
    ]
    unknown = form("name=a.txt\nsize=5")
    assert not unknown.is_valid()
    assert unknown.errors["a2a_files"] == ["file 1: size: a file holds only name, mimeType, uri, bytes"]
    both = form('[{"uri": "https://x.example/a", "bytes": "aGVsbG8="}, 3]')
    assert not both.is_valid() and "Each entry must be a JSON object; these are not: 2." in both.errors["a2a_files"]
    twice = form('[{"uri": "https://x.example/a", "bytes": "aGVsbG8="}]')
    assert twice.errors["a2a_files"] == ["file 1: uri: Give exactly one of 'uri' and 'bytes'."]
    assert "line 1" in form("no equals sign").errors["a2a_files"][0]


@pytest.mark.django_db
def test_an_empty_query_is_taken_beside_data_or_files_as_a_message_of_only_those_runs(demo_agent) -> None:
    with_data = RuleTesterForm({"agent": demo_agent.pk, "query": "", "a2a_data": "order.id=7"})
    assert with_data.is_valid(), with_data.errors
    assert with_data.cleaned_data["query"] == ""
    with_file = RuleTesterForm({"agent": demo_agent.pk, "query": "", "a2a_files": "uri=https://x.example/a"})
    assert with_file.is_valid(), with_file.errors
    nothing = RuleTesterForm({"agent": demo_agent.pk, "query": "  "})
    assert not nothing.is_valid()
    assert nothing.errors["query"][0].startswith("Enter a query, or give data parts or files")


@pytest.mark.django_db
def test_a_query_longer_than_a_run_takes_is_a_form_error(admin_client, demo_agent, settings) -> None:
    settings.PLATFORM_RUN_QUERY_MAX_CHARS = 10
    form = RuleTesterForm({"agent": demo_agent.pk, "query": "가" * 11})
    assert not form.is_valid()
    assert form.errors["query"] == ["The query is longer than 10 characters."]
    response = admin_client.post("/admin/agents/rule-tester/", {"agent": demo_agent.pk, "query": "가" * 11})
    assert response.status_code == 200 and "The query is longer than 10 characters." in response.content.decode()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("parts", "kept"),
    [("[1]", [{"value": 1}]), ('["x"]', [{"value": "x"}]), ('[{"a": 1}, [2]]', [{"a": 1}, {"value": [2]}])],
)
def test_data_parts_that_are_not_objects_are_kept_as_the_api_keeps_them(demo_agent, parts, kept) -> None:
    """As an A2A data part that is no object is kept by the API (``{"value": …}``, s47): they were refused here."""
    form = RuleTesterForm({"agent": demo_agent.pk, "query": "q", "a2a_data": parts})
    assert form.is_valid(), form.errors
    assert form.cleaned_data["a2a_data"] == kept


# ---- 6a. a write tool waits for approval ------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_summary_says_a_run_waits_for_approval_of_a_matched_write(demo_agent) -> None:
    tool = McpTool.objects.get(name="list_team_members", server__in=demo_agent.servers.all())
    ToolContract.objects.update_or_create(tool=tool, defaults={"risk": ToolContract.Risk.WRITE})
    run = run_now(demo_agent, TEAM_QUERY)
    assert run.status == Run.Status.AWAITING_APPROVAL
    trials = rules_trial(
        agent=demo_agent, query=TEAM_QUERY, context={}, a2a_data=[], execute=False, actor="rule-tester:t"
    )
    [matched] = [t for t in trials if t.matched]
    assert matched.waits_for_approval
    summary = trials_summary(trials)
    assert "waits for a person to approve each write first (sds-company-data.list_team_members)" in summary
    assert not [
        t
        for t in rules_trial(
            agent=demo_agent, query="김하늘 님은 어느 팀 소속인가요?", context={}, a2a_data=[], execute=False, actor="t"
        )
        if t.waits_for_approval
    ]  # a read: no wait


def test_an_answer_template_with_a_known_parameter_still_renders() -> None:
    answer = render_answer(
        "{params.q}층 회의실: {result.rooms}", query="", match={}, params={"q": "3"}, value={"rooms": ["301"]}
    )
    assert answer == "3층 회의실: 301"
