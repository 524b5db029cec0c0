"""Defects of the deterministic stage and the rule tester found in review: the tester says what a run would do
(a rule whose tool is gone fails the run; a dry run cannot decide a rule that reads its own tool's answer); a
code rule's parameters that are not JSON are the rule's error, as a value; a regex too big to compile is refused
at the form, not a server error; a condition compares a boolean with a boolean only; a params template's paths
are read composed, as the conditions read them."""

from __future__ import annotations

import datetime
import html
import json
import re
import unicodedata
from typing import Any

import pytest
from pydantic import ValidationError

from agents.deterministic import (
    RuleSpec,
    WhenSpec,
    decide,
    match_conditions,
    placeholder_problems,
    render_answer,
    render_params,
)
from agents.models import DeterministicRule, Run
from agents.rule_tester import RuleTrial, rules_trial, trials_summary
from audit.models import AuditEvent
from mcpregistry.models import McpTool
from tests.agents.test_rule_editor import ledger, rule_post  # noqa: F401
from tests.agents.test_rule_input_forms import run_now
from tests.conftest import make_agent

RULES = "tests.deterministic_defect_rules"
TEAM_QUERY = "클라우드운영팀 인원이 몇 명인지 알려주세요."


def _text(page: str) -> str:
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page)))


def _tester_page(client: Any, agent: Any, query: str, **extra: Any) -> str:
    response = client.post("/admin/agents/rule-tester/", {"agent": agent.pk, "query": query, **extra})
    assert response.status_code == 200
    return _text(response.content.decode())


def _trial(agent: Any, query: str, *, execute: bool = False) -> list[RuleTrial]:
    return rules_trial(agent=agent, query=query, context={}, a2a_data=[], execute=execute, actor="rule-tester:t")


def nfd(text: str) -> str:
    return unicodedata.normalize("NFD", text)


# ---- 1. a rule whose tool is gone: the tester says the run fails -------------------------------------------------


@pytest.mark.django_db
def test_the_tester_page_says_a_run_would_fail_when_a_rules_tool_is_gone(admin_client, demo_agent) -> None:
    McpTool.objects.filter(name="list_team_members", server__in=demo_agent.servers.all()).update(enabled=False)
    run = run_now(demo_agent, TEAM_QUERY)
    assert (run.status, run.error_code) == (Run.Status.FAILED, "deterministic:tool_unknown")
    page = _tester_page(admin_client, demo_agent, TEAM_QUERY)
    assert "A run would fail at rule" in page
    assert "deterministic:tool_unknown" in page
    assert "a run calls" not in page


@pytest.mark.django_db
@pytest.mark.parametrize("execute", [False, True])
def test_a_trial_whose_tool_is_gone_is_a_failure_not_a_match(demo_agent, execute) -> None:
    McpTool.objects.filter(name="list_team_members", server__in=demo_agent.servers.all()).update(enabled=False)
    trials = _trial(demo_agent, TEAM_QUERY, execute=execute)
    last = trials[-1]
    assert last.failed and not last.matched
    assert last.reason.startswith("deterministic:tool_unknown: 확정 호출된 MCP 단계에서 오류가 발생했습니다")
    assert trials_summary(trials).startswith(f"A run would fail at rule {last.name} (deterministic:tool_unknown")


@pytest.mark.slow
@pytest.mark.django_db
def test_the_tester_says_a_run_fails_for_seed_000s_tool_name_typo(admin_client) -> None:
    """Seed 000: the returned tool_name is not on the MCP → a failure. A run fails; the tester says so."""
    from tests.agents.test_deterministic_rules import SEED_SERVERS, seed_server

    agent = make_agent(slug="typo", servers=[seed_server(m, t) for m, t in SEED_SERVERS.items()], with_demo_rules=False)
    DeterministicRule.objects.create(agent=agent, name="typo", code="tests.example_rules.route_to_a_typo")
    run = run_now(agent, "주문 조회")
    assert (run.status, run.error_code) == (Run.Status.FAILED, "deterministic:tool_unknown")
    page = _tester_page(admin_client, agent, "주문 조회")
    assert "A run would fail at rule typo" in page
    assert "a run calls" not in page


# ---- 3. a code rule's params that are not JSON -------------------------------------------------------------------


@pytest.mark.django_db
def test_the_tester_survives_a_code_rule_whose_params_hold_a_date(admin_client, demo_server) -> None:
    agent = make_agent(slug="dates", servers=[demo_server], with_demo_rules=False)
    DeterministicRule.objects.create(agent=agent, name="dated", code=f"{RULES}.route_with_a_date")
    page = _tester_page(admin_client, agent, "프로젝트 알려줘")
    assert "A run would fail at rule dated (deterministic:rule_error" in page


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("route", "why"),
    [
        ("route_with_a_set", "set"),
        ("route_with_a_date", "date"),
        ("route_with_nan", "float"),
        # JSON wrote the key 1 as "1"; the gate's hint then crashed on it (the tester's page was a 500).
        ("route_with_a_number_as_a_name", "an argument's name is not text"),
    ],
)
def test_a_code_rule_returning_params_that_are_not_json_fails_as_a_rule_error(demo_server, route, why) -> None:
    agent = make_agent(slug="notjson", servers=[demo_server], with_demo_rules=False)
    DeterministicRule.objects.create(agent=agent, name="odd", code=f"{RULES}.{route}")
    run = run_now(agent, "프로젝트 알려줘")
    assert (run.status, run.error_code) == (Run.Status.FAILED, "deterministic:rule_error")
    assert run.error_message.startswith("확정 호출된 MCP 단계에서 오류가 발생했습니다: odd returned params")
    assert why in run.error_message
    [only] = _trial(agent, "프로젝트 알려줘")
    assert only.failed and only.reason.startswith("deterministic:rule_error: ")


def test_a_trials_params_display_reads_any_value() -> None:
    trial = RuleTrial(1, "r", "code", "m", "t", True, "matched", params={"since": datetime.date(2026, 1, 1)})
    assert trial.params_json == '{"since": "2026-01-01"}'


# ---- 4. a dry run cannot decide a rule that reads its own tool's answer ------------------------------------------


@pytest.mark.django_db
def test_a_dry_run_of_a_rule_that_reads_its_own_tool_agrees_with_a_run(admin_client, demo_server) -> None:
    agent = make_agent(slug="reader", servers=[demo_server], with_demo_rules=False)
    DeterministicRule.objects.create(agent=agent, name="reader", code=f"{RULES}.route_reading_its_tool")
    run = run_now(agent, "우리 팀 프로젝트")
    assert run.status == Run.Status.SUCCEEDED
    page = _tester_page(admin_client, agent, "우리 팀 프로젝트")
    assert "A run would fail" not in page
    assert "not decidable in a dry run" in page
    trials = _trial(agent, "우리 팀 프로젝트")
    [only] = trials
    assert not only.failed and not only.matched
    assert only.reason == "not decidable in a dry run"
    assert any("It called search_employee, which a dry run does not call" in n for n in only.notes)
    summary = trials_summary(trials)
    assert summary.startswith("A dry run cannot tell whether a run calls a tool first: reader could not be decided")
    assert "also call the matched tools through the gate" in summary
    assert summary in page
    # Through the gate, the rule is decided as a run decides it.
    [called] = _trial(agent, "우리 팀 프로젝트", execute=True)
    assert called.matched and called.tool == "list_projects" and called.result and called.result["ok"]


@pytest.mark.django_db
def test_a_dry_run_still_fails_a_rule_that_raises_without_calling_its_tools(demo_server) -> None:
    agent = make_agent(slug="raiser", servers=[demo_server], with_demo_rules=False)
    DeterministicRule.objects.create(agent=agent, name="raiser", code=f"{RULES}.route_that_raises_without_calling")
    trials = _trial(agent, "아무 질문")
    assert trials[-1].failed and trials[-1].reason.startswith("deterministic:rule_error: ")
    assert trials_summary(trials).startswith("A run would fail at rule raiser")


# ---- 5. a regex too big to compile -------------------------------------------------------------------------------


@pytest.mark.parametrize("pattern", ["a{99999999999}", r"x{4294967296}", "(" * 5000 + ")" * 5000])
def test_a_regex_that_overflows_or_nests_too_deep_is_not_valid(pattern) -> None:
    with pytest.raises(ValidationError, match="not a valid regular expression"):
        WhenSpec.model_validate({"regex": pattern})
    assert placeholder_problems({"regex": pattern}, {"name": "{match.name}"}, "") == {}


@pytest.mark.django_db
@pytest.mark.parametrize("pattern", [r"(?P<name>[가-힣]{2,99999999999}) 님", r"x{4294967296}"])
def test_a_huge_repeat_count_in_the_rule_form_is_refused_not_a_server_error(admin_client, ledger, pattern) -> None:  # noqa: F811
    response = admin_client.post("/admin/agents/deterministicrule/add/", rule_post(ledger, when__regex=pattern))
    assert response.status_code == 200
    assert "not a valid regular expression" in response.content.decode()


@pytest.mark.django_db
def test_a_huge_repeat_count_in_the_rule_json_is_refused_not_a_server_error(admin_client, ledger) -> None:  # noqa: F811
    doc = {
        "name": "x",
        "agent": "ledger",
        "mcp_id": "Ledger-Data",
        "tool": "lookup",
        "when": {"regex": "a{99999999999}"},
        "params": {"name": "x"},
    }
    response = admin_client.post("/admin/agents/deterministicrule/add/", rule_post(ledger, rule_json=json.dumps(doc)))
    assert response.status_code == 200
    assert not DeterministicRule.objects.exists()


# ---- 6. a boolean is not a number --------------------------------------------------------------------------------


@pytest.mark.parametrize(("expected", "given"), [(True, 1), (1, True), (False, 0), (0, False), (1.0, True)])
def test_a_boolean_condition_does_not_match_a_number(expected, given) -> None:
    for when in ({"context": {"tier": expected}}, {"data": {"vip": expected}}):
        matched, reason, _groups = match_conditions(
            when, query="q", context={"tier": given}, a2a_data=[{"vip": given}], available_tools=set()
        )
        assert not matched, (when, given)
        assert reason.endswith(f"is not {expected!r}"), reason


@pytest.mark.parametrize(
    ("expected", "given"),
    [([True], [1]), ({"a": 1}, {"a": True}), ([{"x": False}], [{"x": 0}])],
)
def test_a_boolean_nested_in_a_condition_does_not_match_a_number(expected, given) -> None:
    matched, _reason, _groups = match_conditions(
        {"context": {"k": expected}}, query="q", context={"k": given}, a2a_data=None, available_tools=set()
    )
    assert not matched


@pytest.mark.parametrize(
    ("expected", "given"),
    [(True, True), (False, False), (3, 3), (3, 3.0), (3.0, 3), ("3", "3"), (None, None), ([1, True], [1.0, True])],
)
def test_values_of_the_same_kind_still_match(expected, given) -> None:
    matched, reason, _groups = match_conditions(
        {"context": {"k": expected}, "data": {"k": expected}},
        query="q",
        context={"k": given},
        a2a_data=[{"k": given}],
        available_tools=set(),
    )
    assert matched, reason


# ---- 7. a decomposed path in the params template -----------------------------------------------------------------


def test_a_decomposed_data_path_renders_as_its_condition_matches() -> None:
    path = nfd("고객.등급")
    rule = RuleSpec(
        rule_id=1,
        name="r",
        mcp_id="m",
        tool_name="t",
        when={"data": {path: "*"}, "context": {nfd("팀"): "클라우드운영팀"}, "regex": nfd(r"(?P<이름>[가-힣]+) 님")},
        params={
            "grade": "{data." + path + "}",
            "team": "{context." + nfd("팀") + "}",
            "name": "{match." + nfd("이름") + "}",
            "text": "{data." + path + "} 고객",
        },
    )
    decision = decide(
        rule,
        query="김하늘 님 등급 조회",
        context={"팀": "클라우드운영팀"},  # stored composed (run_input_guarded)
        a2a_data=[{"고객": {"등급": "우수"}}],
        available_tools={"t"},
    )
    assert decision.matched, decision.reason
    assert decision.params == {"grade": "우수", "team": "클라우드운영팀", "name": "김하늘", "text": "우수 고객"}


def test_a_decomposed_match_name_renders_in_the_answer_and_is_no_problem() -> None:
    when = {"regex": r"(?P<이름>[가-힣]+) 님"}
    name = "{match." + nfd("이름") + "}"
    assert placeholder_problems(when, {"name": name}, f"{name}: {{result}}") == {}
    assert render_answer(f"{name}: {{result}}", query="q", match={"이름": "김하늘"}, params={}, value="ok") == (
        "김하늘: ok"
    )
    assert render_params({"n": name}, query="q", context={}, a2a_data=None, match={"이름": "김하늘"}) == {"n": "김하늘"}


@pytest.mark.django_db
@pytest.mark.parametrize("route", ["route_if_the_lookup_says", "route_by_the_team_found"])
def test_a_dry_run_of_a_rule_that_decides_on_its_tools_answer_without_raising_is_not_decided(
    demo_server, route
) -> None:
    """The tester said "no rule matched" of a rule whose run calls two tools (it returned None on the stand-in),
    or showed parameters (물류플랫폼팀) that no run sends (클라우드운영팀)."""
    agent = make_agent(slug="decider", servers=[demo_server], with_demo_rules=False)
    DeterministicRule.objects.create(agent=agent, name="decider", code=f"{RULES}.{route}")
    run = run_now(agent, "김하늘 프로젝트")
    assert run.status == Run.Status.SUCCEEDED
    sent = AuditEvent.objects.filter(run_id=run.id, source="deterministic").values_list("tool", "args")
    assert ("list_projects", {"team": "클라우드운영팀"}) in list(sent)

    trials = _trial(agent, "김하늘 프로젝트")
    [only] = trials
    assert (only.matched, only.failed, only.reason) == (False, False, "not decidable in a dry run")
    assert only.params is None
    assert any("It called search_employee, which a dry run does not call" in n for n in only.notes)
    assert trials_summary(trials).startswith("A dry run cannot tell whether a run calls a tool first")
    [called] = _trial(agent, "김하늘 프로젝트", execute=True)
    assert called.matched and called.params == {"team": "클라우드운영팀"}


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("field", "value"),
    [("context", '{"tier": "gold", "n": NaN}'), ("context", '{"n": 1e999}'), ("a2a_data", '[{"n": -Infinity}]')],
)
def test_the_tester_refuses_numbers_no_run_can_be_given(admin_client, demo_server, field, value) -> None:
    """The API answers 400 to NaN and Infinity; the tester took them and showed a match with ``{'name': nan}``."""
    agent = make_agent(slug="finite", servers=[demo_server])
    response = admin_client.post(
        "/admin/agents/rule-tester/", {"agent": agent.pk, "query": "김하늘 님은 어느 팀인가요?", field: value}
    )
    assert response.status_code == 200
    assert field in response.context["form"].errors
    assert "NaN and Infinity are not JSON" in str(response.context["form"].errors[field])


def test_a_number_past_pythons_digit_limit_is_told_in_the_readers_words() -> None:
    """The rule tester's JSON fields said Python's "use sys.set_int_max_str_digits() to increase the limit"."""
    import json as std_json
    import sys

    from django.utils import translation

    from agent_platform.json import json_error_text

    with pytest.raises(ValueError) as refused:
        std_json.loads('{"a": ' + "9" * (sys.get_int_max_str_digits() + 1) + "}")
    with translation.override("ko"):
        told = json_error_text(refused.value)
    assert "set_int_max_str_digits" not in told and str(sys.get_int_max_str_digits()) in told


@pytest.mark.django_db
def test_a_rules_literal_typed_decomposed_is_stored_composed(demo_server) -> None:
    """A name typed on macOS (NFD) was stored and sent so: the tool found no such employee, and the run
    "succeeded" with that answer. Stored composed now, as import_config stores it."""
    import unicodedata

    from agents.services import deterministic_rule_create

    agent = make_agent(slug="literal", servers=[demo_server], with_demo_rules=False)
    decomposed = unicodedata.normalize("NFD", "김하늘")
    rule = deterministic_rule_create(
        actor="admin",
        via="tests",
        data={
            "agent": agent,
            "name": "lit",
            "order": 1,
            "server": demo_server,
            "tool_name": "search_employee",
            "when": {"any_keywords": ["소속"]},
            "params": {"name": decomposed},
        },
    )
    assert DeterministicRule.objects.get(pk=rule.pk).params == {"name": "김하늘"}
    run = run_now(agent, "김하늘 소속?")
    assert run.status == Run.Status.SUCCEEDED and "클라우드운영팀" in run.answer
