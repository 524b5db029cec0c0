"""A rule at a glance: the agent's page and the rules list say what each rule calls, when and with what, in the
reader's language (the rule editor changes them; the agent's page links to it to add one, for that agent)."""

from __future__ import annotations

import html
import re
import sys

import pytest
from django.test import Client
from django.utils import translation

from agents.models import Agent, DeterministicRule
from agents.rule_summary import conditions_html, parameters_html, target_html
from mcpregistry.models import McpServer

pytestmark = pytest.mark.django_db


def text(fragment: str) -> str:
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", fragment))).strip()


@pytest.fixture
def crm() -> McpServer:
    return McpServer.objects.create(mcp_id="crm", name="crm", command=sys.executable, args=[])


@pytest.fixture
def agent() -> Agent:
    return Agent.objects.create(slug="ledger", name="장부 도우미")


def rule(agent: Agent, server: McpServer | None, **fields: object) -> DeterministicRule:
    defaults: dict[str, object] = {"agent": agent, "name": "직원 조회", "server": server, "tool_name": "lookup"}
    return DeterministicRule.objects.create(**{**defaults, **fields})


def test_each_condition_is_named_as_the_rule_editor_names_it(agent: Agent, crm: McpServer) -> None:
    full = rule(
        agent,
        crm,
        when={
            "all_keywords": ["직원", "팀"],
            "any_keywords": ["소속", "부서"],
            "regex": r"(?P<name>[가-힣]{2,4})\s*님",
            "context": {"tier": 3, "channel": "web"},
            "data": {"order.id": "*"},
            "tool_available": "lookup",
            "later_key": [1, 2],
        },
        params={"name": "{match.name}", "limit": 5},
        answer_template="{result.name} 님은 {result.team} 소속입니다.",
    )
    with translation.override("ko"):
        assert text(target_html(full)) == "crm · lookup"
        assert text(conditions_html(full)) == (
            r"모든 키워드: 직원, 팀 키워드 중 하나: 소속, 부서 정규식: (?P<name>[가-힣]{2,4})\s*님 "
            "컨텍스트 일치: tier = 3, channel = web A2A 데이터: order.id = * 이 도구를 쓸 수 있을 때만: lookup "
            "later_key: [1, 2]"
        )
        assert text(parameters_html(full)) == (
            "name = {match.name} limit = 5 답변: {result.name} 님은 {result.team} 소속입니다."
        )
    with translation.override("en"):
        assert text(conditions_html(full)).startswith("all of these keywords: 직원, 팀 any of these keywords:")


def test_a_rule_without_conditions_always_holds_and_a_code_rule_says_so(agent: Agent, crm: McpServer) -> None:
    always = rule(agent, crm, name="항상", when={}, params={})
    coded = rule(agent, None, name="코드", tool_name="", code="tests.example_rules.vip_rule")
    with translation.override("ko"):
        assert text(conditions_html(always)) == "항상 (조건 없음)"
        assert text(parameters_html(always)) == "—"
        assert text(target_html(coded)) == "코드 규칙 tests.example_rules.vip_rule"
        assert text(conditions_html(coded)) == "코드 규칙이 판단"


def test_the_agents_page_lists_its_rules_in_words_and_links_to_the_editor(
    admin_client: Client, agent: Agent, crm: McpServer
) -> None:
    listed = rule(agent, crm, when={"any_keywords": ["소속"]}, params={"name": "{query}"})

    page = admin_client.get(f"/admin/agents/agent/{agent.pk}/change/", HTTP_ACCEPT_LANGUAGE="ko").content.decode()

    group = page[page.index('id="rules-group"') : page.index('class="rule-add"')]
    assert "키워드 중 하나: 소속" in text(group) and "name = {query}" in text(group) and "crm · lookup" in text(group)
    assert 'name="rules-0-when"' not in page and 'name="rules-0-params"' not in page  # no JSON to edit here
    assert 'name="rules-0-order"' in page and 'name="rules-0-enabled"' in page  # order and switch still are
    assert f'href="/admin/agents/deterministicrule/{listed.pk}/change/' in group  # each row opens the editor
    assert 'id="rules-empty"' not in page  # no blank row to add a rule as JSON
    assert f'href="/admin/agents/deterministicrule/add/?agent={agent.pk}"' in page
    assert "규칙 편집기에서 이 에이전트의 규칙 추가" in page


def test_a_new_agents_page_says_to_save_it_before_adding_rules(admin_client: Client) -> None:
    page = admin_client.get("/admin/agents/agent/add/", HTTP_ACCEPT_LANGUAGE="ko").content.decode()
    assert "에이전트를 먼저 저장한 뒤" in page and "deterministicrule/add/?agent=" not in page


def test_the_rule_editor_opened_from_an_agent_has_that_agent_chosen(admin_client: Client, agent: Agent) -> None:
    page = admin_client.get(f"/admin/agents/deterministicrule/add/?agent={agent.pk}").content.decode()
    assert re.search(rf'<option value="{agent.pk}" selected>', page)


def test_the_rules_list_says_what_each_rule_calls_and_when(admin_client: Client, agent: Agent, crm: McpServer) -> None:
    rule(agent, crm, when={"regex": "A-\\d{4}"}, params={"name": "{query}"})
    page = admin_client.get("/admin/agents/deterministicrule/", HTTP_ACCEPT_LANGUAGE="ko").content.decode()
    rows = text(page[page.index('id="result_list"') :])
    assert "직원 조회 ledger crm · lookup 정규식: A-\\d{4}" in rows


def test_keywords_stored_as_no_list_are_shown_not_a_500(admin_client: Client, agent: Agent, crm: McpServer) -> None:
    rule(agent, crm, when={"all_keywords": 5, "any_keywords": True}, params={})
    for url in ("/admin/agents/deterministicrule/", f"/admin/agents/agent/{agent.pk}/change/"):
        page = admin_client.get(url, HTTP_ACCEPT_LANGUAGE="ko").content.decode()
        assert "모든 키워드: 5" in text(page) and "키워드 중 하나: true" in text(page), url
