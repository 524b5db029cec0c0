"""The rule tester in the admin: a dry run shows which rules match, in order, with parameters and contract
verdicts, and calls nothing; asked to, it calls the matched tools through the gate."""

from __future__ import annotations

import json
import re

import pytest
from django.test import Client

from agents.models import DeterministicRule
from audit.models import AuditEvent

pytestmark = pytest.mark.django_db


def test_a_dry_run_lists_the_rules_in_order_and_calls_nothing(admin_client, demo_agent) -> None:
    page = admin_client.post(
        "/admin/agents/rule-tester/",
        {"agent": demo_agent.pk, "query": "클라우드운영팀 인원이 몇 명인지 알려주세요.", "context": "", "a2a_data": ""},
    ).content.decode()
    names = [r.name for r in demo_agent.rules.order_by("order")]
    positions = [page.index(name) for name in names]
    assert positions == sorted(positions)
    assert "matched" in page and "{&quot;team&quot;: &quot;클라우드운영팀&quot;}" in page  # JSON, as the tool is sent
    assert ">ok<" in page
    assert not AuditEvent.objects.filter(action="tool.call").exists()


def test_a_params_template_that_breaks_the_contract_is_flagged(admin_client, demo_agent, demo_server) -> None:
    rule = DeterministicRule.objects.get(agent=demo_agent, tool_name="list_team_members")
    DeterministicRule.objects.filter(pk=rule.pk).update(params={"team": "{match.team}", "size": 3})
    page = admin_client.post(
        "/admin/agents/rule-tester/", {"agent": demo_agent.pk, "query": "클라우드운영팀 인원 몇 명?"}
    ).content.decode()
    assert "args:unknown:size" in page


def test_asked_to_execute_it_calls_through_the_gate(admin_client, demo_agent) -> None:
    page = admin_client.post(
        "/admin/agents/rule-tester/",
        {"agent": demo_agent.pk, "query": "김하늘 님은 어느 팀 소속인가요?", "execute": "on"},
    ).content.decode()
    assert "클라우드운영팀" in page
    assert "&quot;ok&quot;: true" in page and "True" not in page  # the result as JSON, not a Python dict
    # At a glance: the outcome, attempts and latency in words; the value and the whole result folded away.
    assert '<div class="tester-outcome"><b style="color:green">succeeded</b>' in page and "1 attempt · " in page
    assert '<details class="tester-value"><summary>what the tool answered</summary>' in page
    assert '<details class="tester-result"><summary>the whole result (JSON)</summary>' in page
    event = AuditEvent.objects.get(action="tool.call")
    assert (event.source, event.tool, event.actor) == ("admin", "search_employee", "rule-tester:admin")


@pytest.mark.slow
def test_code_rules_are_tried_too(admin_client, db) -> None:
    from tests.agents.test_deterministic_rules import SEED_SERVERS, seed_server
    from tests.conftest import make_agent

    agent = make_agent(slug="seed", servers=[seed_server(m, t) for m, t in SEED_SERVERS.items()], with_demo_rules=False)
    DeterministicRule.objects.create(agent=agent, name="crm", code="tests.example_rules.route_by_chatbot_id")
    DeterministicRule.objects.create(agent=agent, name="boom", order=200, code="tests.example_rules.route_that_raises")
    page = admin_client.post(
        "/admin/agents/rule-tester/",
        {"agent": agent.pk, "query": "등급?", "context": json.dumps({"chatbotId": "premium-support", "userId": "u-9"})},
    ).content.decode()
    assert "get_customer_profile" in page and "u-9" in page
    assert "raised KeyError" in page
    # The rule that raised named no tool: its server alone, not "server." with an empty tool.
    assert "<code>seed-crm.</code>" not in page and not re.search(r"<code>[\w-]+\.</code>", page)


def test_bad_json_is_explained(admin_client, demo_agent) -> None:
    page = admin_client.post(
        "/admin/agents/rule-tester/", {"agent": demo_agent.pk, "query": "q", "context": "{oops"}
    ).content.decode()
    assert "Not valid JSON" in page


def test_the_context_is_written_as_in_the_rule_editor_and_each_bad_field_is_told(admin_client, demo_agent) -> None:
    from agents.rule_tester import RuleTesterForm

    form = RuleTesterForm(
        {"agent": demo_agent.pk, "query": "q", "context": "chatbotId = premium-support\n\ntier=3", "a2a_data": ""}
    )
    assert form.is_valid(), form.errors
    # Text, as callers send context values (a rule's condition tier=3 meets the text "3" as it meets the number).
    assert form.cleaned_data["context"] == {"chatbotId": "premium-support", "tier": "3"}
    both = RuleTesterForm({"agent": demo_agent.pk, "query": "q", "context": "no equals sign", "a2a_data": "[1,2"})
    assert not both.is_valid()
    assert set(both.errors) == {"context", "a2a_data"}  # both told at once
    assert "line 1" in both.errors["context"][0]


def test_a2a_data_is_written_as_the_rule_editor_writes_data_conditions(demo_agent) -> None:
    """PATH=value lines (a blank line between parts): order.id=7 is {"order": {"id": 7}}, which a rule's data
    condition order.id meets; a JSON list is read too."""
    from agents.rule_tester import RuleTesterForm

    lines = "order.id=7\norder.channel=web\n\nasset_id=A-1001"
    form = RuleTesterForm({"agent": demo_agent.pk, "query": "q", "context": "", "a2a_data": lines})
    assert form.is_valid(), form.errors
    assert form.cleaned_data["a2a_data"] == [{"order": {"id": 7, "channel": "web"}}, {"asset_id": "A-1001"}]
    twice = RuleTesterForm({"agent": demo_agent.pk, "query": "q", "context": "", "a2a_data": "a=1\na.b=2"})
    assert not twice.is_valid() and "line 2" in twice.errors["a2a_data"][0]


def test_only_admins_who_may_change_rules_can_use_it(outsider_client, demo_agent) -> None:
    assert outsider_client.get("/admin/agents/rule-tester/").status_code == 403
    assert Client().get("/admin/agents/rule-tester/").status_code == 302  # to the login page


def test_the_tester_opens_on_the_rules_agent_or_the_only_one(admin_client, demo_agent) -> None:
    from agents.models import Agent

    rule = demo_agent.rules.order_by("order").first()
    page = admin_client.get(f"/admin/agents/deterministicrule/{rule.pk}/change/").content.decode()
    assert f'href="/admin/agents/rule-tester/?agent={demo_agent.slug}&amp;tested=stored"' in page
    form = admin_client.get("/admin/agents/rule-tester/").context["form"]
    assert form["agent"].value() == demo_agent.pk  # the only agent
    other = Agent.objects.create(slug="other", name="다른 에이전트")
    assert admin_client.get("/admin/agents/rule-tester/").context["form"]["agent"].value() is None  # two: none
    chosen = admin_client.get("/admin/agents/rule-tester/?agent=other").context["form"]["agent"].value()
    assert chosen == other.pk


@pytest.mark.slow
def test_a_failed_call_is_named_in_words_with_its_code(admin_client, demo_agent) -> None:
    """The demo's rule for an asset's status, with the demo server's contract refusing the ID's shape: the call
    fails before the tool; the tester says so in the reader's language, with the reason's code."""
    from mcpregistry.models import McpTool
    from mcpregistry.services import tool_contract_update

    tool = McpTool.objects.get(name="get_asset_status", server__in=demo_agent.servers.all())
    contract = tool.contract
    args = {**contract.args, "asset_id": {**contract.args.get("asset_id", {}), "pattern": "^B-[0-9]{4}$"}}
    tool_contract_update(contract=contract, actor="test", via="tests", data={"args": args})
    page = admin_client.post(
        "/admin/agents/rule-tester/",
        {"agent": demo_agent.pk, "query": "A-1001 자산의 현재 상태를 알려주세요.", "execute": "on"},
        HTTP_ACCEPT_LANGUAGE="ko",
    ).content.decode()
    assert '<b style="color:#ba2121">실패</b>' in page and "args:pattern:asset_id" in page


@pytest.mark.slow
def test_the_tester_follows_a_suggested_fallback_for_an_offline_agent_as_its_runs_do(admin_client, db) -> None:
    from tests.conftest import bind_demo_server, make_agent

    agent = make_agent(slug="offline-assets", servers=[bind_demo_server(mcp_id="broken", failure_mode="bad_schema")])
    page = admin_client.post(
        "/admin/agents/rule-tester/",
        {"agent": agent.pk, "query": "A-1001 자산의 현재 상태를 알려주세요.", "execute": "on"},
    ).content.decode()
    assert "백업 스냅샷 기준" in page
    calls = AuditEvent.objects.filter(action="tool.call").order_by("id").values_list("tool", "reason")
    assert list(calls) == [("get_asset_status", "result:shape"), ("get_asset_status_backup", "")]


def test_json_nested_too_deeply_is_explained_not_a_server_error(admin_client, demo_agent) -> None:
    response = admin_client.post(
        "/admin/agents/rule-tester/",
        {"agent": demo_agent.pk, "query": "q", "context": '{"a":' * 5000 + "1" + "}" * 5000},
    )
    assert response.status_code == 200 and "JSON nested deeper than 32 levels." in response.content.decode()
