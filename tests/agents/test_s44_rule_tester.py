"""The rule tester (review s44): a single data part written as a JSON object is read, as the rule editor's data
field reads it, and a line that does not read is told in the field's own words (PATH=value, not KEY=value); the
"Rule tester" link on a rule's page tests the rules as stored (the rule just edited), not the live version."""

from __future__ import annotations

import re
from html import unescape

import pytest
from django.test import Client

from agents.models import Agent, DeterministicRule
from agents.rule_tester import RuleTesterForm
from agents.services import agent_version_publish

pytestmark = pytest.mark.django_db


def test_one_data_part_written_as_a_json_object_is_read(demo_agent: Agent) -> None:
    form = RuleTesterForm({"agent": demo_agent.pk, "query": "q", "a2a_data": '{"order": {"assetId": "A-1004"}}'})
    assert form.is_valid(), form.errors
    assert form.cleaned_data["a2a_data"] == [{"order": {"assetId": "A-1004"}}]
    listed = RuleTesterForm({"agent": demo_agent.pk, "query": "q", "a2a_data": '[{"order": 1}, {"asset": 2}]'})
    assert listed.is_valid() and listed.cleaned_data["a2a_data"] == [{"order": 1}, {"asset": 2}]


def test_a_data_line_that_does_not_read_is_told_in_the_fields_words(demo_agent: Agent) -> None:
    form = RuleTesterForm({"agent": demo_agent.pk, "query": "q", "a2a_data": "order.assetId=A-1\nno equals sign"})
    assert not form.is_valid()
    assert form.errors["a2a_data"] == ["line 2: write PATH=value lines, or a JSON object, or a JSON list of objects"]
    # The lines' other refusals keep their words (a path given twice names its line).
    twice = RuleTesterForm({"agent": demo_agent.pk, "query": "q", "a2a_data": "a=1\na.b=2"})
    assert not twice.is_valid() and "line 2" in twice.errors["a2a_data"][0]


@pytest.mark.slow  # the demo MCP server: a real stdio process
def test_the_rule_pages_tester_link_tests_the_rule_as_just_edited(admin_client: Client, demo_agent: Agent) -> None:
    """Published (v1 live), then a rule disabled (a draft): the link on the rule's page opens the tester on the
    agent as stored, and its trial no longer matches the disabled rule, which v1 still does."""
    agent_version_publish(agent=demo_agent, actor="test-admin", via="tests")
    rule = DeterministicRule.objects.get(agent=demo_agent, tool_name="search_employee")
    DeterministicRule.objects.filter(pk=rule.pk).update(enabled=False)
    page = admin_client.get(f"/admin/agents/deterministicrule/{rule.pk}/change/").content.decode()
    found = re.search(r'href="(/admin/agents/rule-tester/\?[^"]*)"', page)
    assert found is not None
    link = unescape(found.group(1))
    assert link == f"/admin/agents/rule-tester/?agent={demo_agent.slug}&tested=stored"
    form = admin_client.get(link).context["form"]
    assert (form["agent"].value(), form["tested"].value()) == (demo_agent.pk, "stored")

    # Posted as the page offers it: the agent as stored, the disabled rule left out.
    query = "김하늘 님은 어느 팀 소속인가요?"
    posted = {"agent": demo_agent.pk, "query": query, "tested": form["tested"].value()}
    tested = admin_client.post("/admin/agents/rule-tester/", posted).content.decode()
    assert f"Tested: the rules, servers and contracts of {demo_agent.slug} as stored." in unescape(tested)
    assert "search_employee</code>" not in tested
    live = admin_client.post("/admin/agents/rule-tester/", {**posted, "tested": "live"}).content.decode()
    assert f"{demo_agent.slug} v1 (live)" in live and "search_employee</code>" in live


def test_the_tester_opens_on_the_version_a_link_names(admin_client: Client, demo_agent: Agent) -> None:
    form = admin_client.get(f"/admin/agents/rule-tester/?agent={demo_agent.slug}&version=2").context["form"]
    assert (form["tested"].value(), form["version"].value()) == ("version", 2)
    nothing = admin_client.get(f"/admin/agents/rule-tester/?agent={demo_agent.slug}&tested=bogus&version=x")
    assert (nothing.context["form"]["tested"].value(), nothing.context["form"]["version"].value()) == ("live", None)
