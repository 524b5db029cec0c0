"""The rule tester says what a run does where a matched rule's call is refused by its contract (the run fails
``deterministic:tool_failed`` where every call is refused and no model reads the failures; it goes on with the
other calls where some succeed), and its page wraps a long parameter; a query typed in a full-width input mode
meets a regex rule written half-width, in the tester as in a run, and so do context and data values."""

from __future__ import annotations

import html
import re
from typing import Any

import pytest
from django.utils import translation

from agents.deterministic import match_conditions
from agents.models import Agent, DeterministicRule, Run
from agents.rule_tester import RuleTrial, rules_trial, trials_summary
from mcpregistry.models import McpServer, ToolContract
from mcpregistry.services import tool_contract_update
from tests.agents.test_rule_input_forms import run_now
from tests.conftest import make_agent

pytestmark = pytest.mark.django_db

# 205 characters: past the 200 the contract allows the argument the rule sends the query in.
LONG_QUERY = "검색해 " + "가" * 201
# The same, also asking for an asset's state: the demo's 자산 상태 조회 rule matches too, and its call succeeds.
LONG_QUERY_WITH_ASSET = "검색해 A-1004 상태 " + "가" * 195
FULL_WIDTH_QUERY = "Ａ-１００４ 상태 알려줘"


def _query_rule(agent: Agent, server: McpServer) -> None:
    """A rule that sends the whole query as ``name``, whose contract allows at most 200 characters."""
    DeterministicRule.objects.create(
        agent=agent,
        server=server,
        name="프리미엄 고객 자산 검색",
        order=5,
        tool_name="search_employee",
        when={"all_keywords": ["검색해"]},
        params={"name": "{query}"},
    )
    contract = ToolContract.objects.get(tool__server=server, tool__name="search_employee")
    args = {**contract.args, "name": {**contract.args.get("name", {}), "type": "str", "max_length": 200}}
    tool_contract_update(contract=contract, actor="test-admin", via="tests", data={"args": args})


def _trial(agent: Agent, query: str) -> list[RuleTrial]:
    return rules_trial(agent=agent, query=query, context={}, a2a_data=[], execute=False, actor="rule-tester:t")


def _text(page: str) -> str:
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page)))


# ---- 1. a matched call its contract refuses ----------------------------------------------------------------------


@pytest.mark.slow  # the demo MCP server: a real stdio process
def test_the_tester_says_a_refused_call_fails_the_run_as_the_run_does(demo_agent, demo_server) -> None:
    _query_rule(demo_agent, demo_server)
    assert len(LONG_QUERY) == 205

    summary = trials_summary(_trial(demo_agent, LONG_QUERY))

    assert "a run calls" not in summary
    assert summary.startswith("1 of 6 rules matched.")
    assert (
        "Its contract refuses the call of sds-company-data.search_employee (argument name out of range · "
        "args:range:name): a run does not send it."
    ) in summary
    assert "the run fails with deterministic:tool_failed (every deterministic call failed)" in summary
    run = run_now(demo_agent, LONG_QUERY)
    assert (run.status, run.error_code) == (Run.Status.FAILED, "deterministic:tool_failed")
    assert [r["error"] for r in run.deterministic_results] == ["args:range:name"]


@pytest.mark.slow  # the demo MCP server: a real stdio process
def test_the_refusal_is_told_in_korean_with_its_reason_in_words(demo_agent, demo_server) -> None:
    _query_rule(demo_agent, demo_server)
    with translation.override("ko"):
        summary = trials_summary(_trial(demo_agent, LONG_QUERY))

    assert "인자 name 범위 초과 · args:range:name" in summary
    assert "deterministic:tool_failed (확정 호출이 모두 실패함)" in summary
    assert "먼저" not in summary  # not "실행은 모델보다 먼저 …을(를) 호출합니다"


@pytest.mark.slow  # the demo MCP server: a real stdio process
def test_where_another_call_succeeds_the_tester_says_the_run_goes_on_as_it_does(demo_agent, demo_server) -> None:
    _query_rule(demo_agent, demo_server)

    summary = trials_summary(_trial(demo_agent, LONG_QUERY_WITH_ASSET))

    assert summary.startswith("2 of 6 rules matched: a run calls sds-company-data.get_asset_status before the model.")
    assert "Its contract refuses the call of sds-company-data.search_employee" in summary
    assert "A run goes on with the other calls: its answer says which tools could not answer." in summary
    assert "deterministic:tool_failed" not in summary
    run = run_now(demo_agent, LONG_QUERY_WITH_ASSET)
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert [(r["tool"], r["ok"], r["error"]) for r in run.deterministic_results] == [
        ("search_employee", False, "args:range:name"),
        ("get_asset_status", True, None),
    ]


@pytest.mark.slow  # the demo MCP server: a real stdio process
def test_with_a_model_the_tester_says_the_model_reads_the_refusal_as_the_run_does(demo_server) -> None:
    agent = make_agent(
        slug="with-model", servers=[demo_server], provider="scripted", script=[{"content": "확인하지 못했습니다."}]
    )
    _query_rule(agent, demo_server)

    summary = trials_summary(_trial(agent, LONG_QUERY))

    assert "Its contract refuses the call of sds-company-data.search_employee" in summary
    assert "Every call a run would make fails: the model reads the failures and answers without them." in summary
    run = run_now(agent, LONG_QUERY)
    assert (run.status, run.answer) == (Run.Status.SUCCEEDED, "확인하지 못했습니다.")
    assert [r["error"] for r in run.deterministic_results] == ["args:range:name"]


@pytest.mark.slow  # the demo MCP server: a real stdio process
def test_the_tester_page_says_so_and_wraps_a_long_parameter(admin_client, demo_agent, demo_server) -> None:
    _query_rule(demo_agent, demo_server)
    response = admin_client.post("/admin/agents/rule-tester/", {"agent": demo_agent.pk, "query": LONG_QUERY})
    assert response.status_code == 200
    page = response.content.decode()

    assert "the run fails with deterministic:tool_failed" in _text(page)
    # The parameters cell wraps a value with no spaces; a Korean rule name breaks between words only.
    assert re.search(r'<td style="[^"]*overflow-wrap:anywhere[^"]*"><code>\{&quot;name&quot;', page)
    assert re.search(r'<td style="[^"]*word-break:keep-all[^"]*">프리미엄 고객 자산 검색</td>', page)


# ---- 2. text typed in a full-width input mode ----------------------------------------------------------------------


@pytest.mark.slow  # the demo MCP server: a real stdio process
def test_a_full_width_asset_id_meets_the_regex_rule_in_the_tester_and_in_a_run(demo_agent) -> None:
    trials = _trial(demo_agent, FULL_WIDTH_QUERY)
    matched = [(t.name, t.params, t.verdict) for t in trials if t.matched]
    assert matched == [("자산 상태 조회", {"asset_id": "A-1004"}, "ok")]
    assert "a run calls sds-company-data.get_asset_status before the model" in trials_summary(trials)

    run = run_now(demo_agent, FULL_WIDTH_QUERY)
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert [(r["tool"], r["args"], r["ok"]) for r in run.deterministic_results] == [
        ("get_asset_status", {"asset_id": "A-1004"}, True)
    ]


def _matched(when: dict[str, Any], query: str = "", **given: Any) -> tuple[bool, str, dict[str, str]]:
    return match_conditions(
        when,
        query=query,
        context=given.get("context", {}),
        a2a_data=given.get("a2a_data"),
        available_tools=set(),
    )


@pytest.mark.parametrize(
    ("pattern", "query", "groups"),
    [
        (r"(?P<asset_id>A-\d{4})", "Ａ-１００４ 상태", {"asset_id": "A-1004"}),  # full-width letter and digits
        (r"(?P<asset_id>A-\d{4})", "A-1004 상태", {"asset_id": "A-1004"}),
        (r"(?P<code>Ａ-\d+)", "Ａ-1004", {"code": "A-1004"}),  # a pattern naming a full-width letter still meets it
    ],
)
def test_a_regex_meets_the_query_as_typed_or_compatibility_composed(pattern, query, groups) -> None:
    assert _matched({"regex": pattern}, query) == (True, "matched", groups)


def test_a_context_or_data_value_typed_full_width_meets_the_condition() -> None:
    when = {"context": {"tier": "VIP", "chatbotId": 1234}, "data": {"고객.등급": "GOLD"}}
    context = {"tier": "ＶＩＰ", "chatbotId": "１２３４"}
    assert _matched(when, context=context, a2a_data=[{"고객": {"등급": "ＧＯＬＤ"}}]) == (True, "matched", {})
    # Still compared by kind: a full-width "ｔｒｕｅ" is text, never the boolean true.
    assert _matched({"context": {"flag": True}}, context={"flag": "ｔｒｕｅ"})[0] is False


@pytest.mark.parametrize(
    ("when", "query", "context"),
    [
        ({"regex": r"(?P<n>\d{3})"}, "면적 10² 이상", {}),  # NFKC read "10²" as "102"
        ({"regex": r"(?P<w>[가-힣]{2})"}, "ㄱㅏㄴㅏ", {}),  # compatibility jamo composed to "가나"
        ({"context": {"grade": "1"}}, "q", {"grade": "①"}),
        ({"context": {"plan": "IV"}}, "q", {"plan": "Ⅳ"}),
    ],
)
def test_only_the_width_is_folded_not_every_compatibility_form(
    when: dict[str, Any], query: str, context: dict[str, Any]
) -> None:
    # A review of the first version (full NFKC) found these matched: a rule sent a value the caller never meant.
    matched, _reason, _groups = match_conditions(
        when, query=query, context=context, a2a_data=None, available_tools=set()
    )
    assert not matched
