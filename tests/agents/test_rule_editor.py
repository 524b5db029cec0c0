"""The structured rule editor: conditions and params as fields read back into the rule's JSON; the tool is a
choice among the enabled tools of the agent's servers; errors name the field and the valid keys or values."""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from agents.configuration import config_export
from agents.models import Agent, DeterministicRule
from mcpregistry.models import McpServer, McpTool, ToolContract

pytestmark = pytest.mark.django_db


@pytest.fixture
def ledger() -> Agent:
    server = McpServer.objects.create(mcp_id="Ledger-Data", name="ledger", command=sys.executable, args=[])
    other = McpServer.objects.create(mcp_id="other", name="other", command=sys.executable, args=[])
    now = timezone.now()
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "limit": {"type": "integer"}}}
    tool = McpTool.objects.create(server=server, name="lookup", input_schema=schema, discovered_at=now)
    ToolContract.objects.create(tool=tool, args={"name": {"type": "str", "required": True}, "limit": {"type": "int"}})
    McpTool.objects.create(server=server, name="erase", input_schema=schema, discovered_at=now, enabled=False)
    McpTool.objects.create(server=other, name="elsewhere", input_schema=schema, discovered_at=now)
    agent = Agent.objects.create(slug="ledger", name="ledger")
    agent.servers.set([server])
    return agent


def rule_post(agent: Agent, **changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "agent": str(agent.pk),
        "name": "이름 조회",
        "order": "10",
        "enabled": "on",
        "server": str(agent.servers.get().pk),
        "tool_name": "lookup",
        "code": "",
        "when__editor": "1",
        "when__all_keywords": "",
        "when__any_keywords": "소속, 팀",
        "when__regex": r"(?P<name>[가-힣]{2,4}) 님",
        "when__context": "chatbotId=premium-support\ntier=3",
        "when__data": "order.id=*",
        "when__tool_available": "",
        "params__editor": "1",
        "params__names": ["name", "limit"],
        "params__value__name": "{match.name}",
        "params__value__limit": "5",
        "answer_template": "",
    }
    data.update(changes)
    return data


def errors(page: str) -> str:
    return " ".join(re.findall(r'<ul class="errorlist[^>]*>(.*?)</ul>', page, re.S))


def test_the_fields_become_the_rules_json(admin_client: Client, ledger: Agent) -> None:
    response = admin_client.post("/admin/agents/deterministicrule/add/", rule_post(ledger))
    assert response.status_code == 302, errors(response.content.decode())
    rule = DeterministicRule.objects.get()
    assert rule.when == {
        "any_keywords": ["소속", "팀"],
        "regex": r"(?P<name>[가-힣]{2,4}) 님",
        "context": {"chatbotId": "premium-support", "tier": 3},
        "data": {"order.id": "*"},
    }
    assert rule.params == {"name": "{match.name}", "limit": 5}
    page = admin_client.get(f"/admin/agents/deterministicrule/{rule.pk}/change/").content.decode()
    assert "tier=3" in page and 'value="{match.name}"' in page
    assert 'id="rule-tool-catalogue"' in page and "agents/rule_editor.js" in page


def test_the_tool_choice_holds_only_enabled_tools_of_the_agents_servers(admin_client: Client, ledger) -> None:
    rule = DeterministicRule.objects.create(agent=ledger, name="r", server=ledger.servers.get(), tool_name="lookup")
    page = admin_client.get(f"/admin/agents/deterministicrule/{rule.pk}/change/").content.decode()
    tools = re.search(r'<select name="tool_name".*?</select>', page, re.S).group(0)
    assert '<optgroup label="Ledger-Data">' in tools and "lookup" in tools
    assert "erase" not in tools and "elsewhere" not in tools


def test_a_disabled_tool_or_an_unbound_server_is_refused_naming_the_valid_ones(admin_client, ledger) -> None:
    page = admin_client.post("/admin/agents/deterministicrule/add/", rule_post(ledger, tool_name="erase")).content
    assert "is not an enabled tool of Ledger-Data; its enabled tools are: lookup" in errors(page.decode())
    other = McpServer.objects.get(mcp_id="other")
    page = admin_client.post(
        "/admin/agents/deterministicrule/add/", rule_post(ledger, server=str(other.pk), tool_name="elsewhere")
    ).content.decode()
    assert "ledger does not bind other; its servers are: Ledger-Data" in errors(page)


def test_a_bad_regex_and_a_bad_params_value_name_their_fields(admin_client: Client, ledger: Agent) -> None:
    page = admin_client.post(
        "/admin/agents/deterministicrule/add/",
        rule_post(ledger, when__regex="(?P<name>[가-힣", params__value__limit="many"),
    ).content.decode()
    found = errors(page)
    assert "regex: not a valid regular expression" in found
    assert "args:type:limit" in found


def test_the_json_view_round_trips_with_export_config(admin_client: Client, ledger: Agent) -> None:
    rule = DeterministicRule.objects.create(agent=ledger, name="r", server=ledger.servers.get(), tool_name="lookup")
    [entry] = config_export()["rules"]
    entry = {**entry, "when": {"all_keywords": ["팀"]}, "params": {"name": "{query}"}, "order": 7}
    data = rule_post(ledger, name="r", rule_json=json.dumps(entry, ensure_ascii=False))
    response = admin_client.post(f"/admin/agents/deterministicrule/{rule.pk}/change/", data)
    assert response.status_code == 302, errors(response.content.decode())
    assert config_export()["rules"] == [entry]


def test_an_unknown_key_in_the_json_view_names_the_valid_keys(admin_client: Client, ledger: Agent) -> None:
    data = rule_post(ledger, rule_json=json.dumps({"name": "r", "conditions": {}}))
    page = admin_client.post("/admin/agents/deterministicrule/add/", data).content.decode()
    assert "&#x27;conditions&#x27; is not a valid key" in errors(page)
    assert "agent, name, order, enabled, mcp_id, tool, code, when, params, answer_template" in errors(page)


def test_emptying_every_condition_is_saved(admin_client: Client, ledger: Agent) -> None:
    rule = DeterministicRule.objects.create(
        agent=ledger, name="r", server=ledger.servers.get(), tool_name="lookup", when={"any_keywords": ["팀"]}
    )
    data = rule_post(ledger, name="r", when__any_keywords="", when__regex="", when__context="", when__data="")
    data["params__value__name"] = "{query}"
    response = admin_client.post(f"/admin/agents/deterministicrule/{rule.pk}/change/", data)
    assert response.status_code == 302, errors(response.content.decode())
    rule.refresh_from_db()
    assert rule.when == {}


@pytest.mark.parametrize("field", ["when__context", "when__data"])
def test_a_matcher_line_without_an_equals_sign_is_refused_with_its_line_and_shown_again(
    admin_client: Client, ledger: Agent, field: str
) -> None:
    response = admin_client.post(
        "/admin/agents/deterministicrule/add/", rule_post(ledger, **{field: "tier=3\nchatbotId premium"})
    )
    assert response.status_code == 200
    page = response.content.decode()
    said = {
        "when__context": "context equals, line 2: write KEY=value lines",
        "when__data": "A2A data, line 2: write PATH=value lines",
    }
    assert said[field] in errors(page)  # the part by its label on the page, and how its lines are written
    assert "tier=3\nchatbotId premium</textarea>" in page  # what was typed, to correct
    assert not DeterministicRule.objects.exists()


def test_every_unreadable_part_of_when_and_a_bad_pattern_are_said_at_once(admin_client: Client, ledger: Agent) -> None:
    """One at a time, an admin fixed the context, saved, and only then learned the data and the pattern were wrong
    too (the pattern's check is the model's, which does not run once ``when`` has an error)."""
    response = admin_client.post(
        "/admin/agents/deterministicrule/add/",
        rule_post(ledger, when__context="nokey", when__data="x", when__regex="(?P<name>[가-힣"),
    )
    assert response.status_code == 200
    said = errors(response.content.decode())
    assert "context equals, line 1: write KEY=value lines, or a JSON object." in said
    assert "A2A data, line 1: write PATH=value lines (PATH=* for present), or a JSON object." in said
    assert "regex" in said.split("A2A data, line 1")[1]
    assert not DeterministicRule.objects.exists()


@pytest.mark.parametrize("field", ["when__context", "when__data"])
def test_a_matcher_key_given_twice_is_refused_not_silently_overwritten(
    admin_client: Client, ledger: Agent, field: str
) -> None:
    response = admin_client.post("/admin/agents/deterministicrule/add/", rule_post(ledger, **{field: "tier=3\ntier=4"}))
    assert response.status_code == 200
    label = {"when__context": "context equals", "when__data": "A2A data"}[field]
    assert f"{label}, line 2: tier is given twice." in errors(response.content.decode())
    assert not DeterministicRule.objects.exists()


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        (
            {"params__value__name": "{match.nope}"},
            "{match.nope}: the regex has no named group &#x27;nope&#x27; (its groups: name)",
        ),
        (
            {"answer_template": "{match.who} 님은 {result.team}"},
            "{match.who}: the regex has no named group &#x27;who&#x27; (its groups: name)",
        ),
        ({"answer_template": "{result.name 님은"}, "a brace that opens or closes no placeholder"),
        # Sent to the tool as written: "{match.name" (its brace left open), a source that does not exist.
        ({"params__value__name": "{match.name"}, "{match.name: use {query}, {context.KEY}, {data.KEY} or {match.NAME}"),
        ({"params__value__name": "{bogus.x}"}, "{bogus.x}: use {query}, {context.KEY}"),
        ({"answer_template": "{answer}"}, "{answer}: use {query}, {result}, {result.KEY}"),
        (
            {"when__tool_available": "no_such_tool"},
            "only when this tool is available: &#x27;no_such_tool&#x27; is not a tool of this server; its tools are: "
            "erase, lookup",
        ),
    ],
)
def test_a_rule_that_could_never_fill_its_placeholders_or_fire_is_refused(
    admin_client: Client, ledger: Agent, changes: dict[str, str], expected: str
) -> None:
    page = admin_client.post("/admin/agents/deterministicrule/add/", rule_post(ledger, **changes)).content.decode()
    assert expected in errors(page), errors(page)
    assert not DeterministicRule.objects.exists()


def test_a_rule_whose_placeholders_all_have_a_source_is_saved(admin_client: Client, ledger: Agent) -> None:
    data = rule_post(ledger, answer_template="{match.name} 님: {result.team} ({params.limit}건, {query})")
    data["when__tool_available"] = "lookup"
    response = admin_client.post("/admin/agents/deterministicrule/add/", data)
    assert response.status_code == 302, errors(response.content.decode())


def test_the_forced_first_tool_is_chosen_among_the_tools_the_agents_model_sees(
    admin_client: Client, ledger: Agent
) -> None:
    ledger.model_provider = "scripted"  # a provider with tool_choice
    ledger.save()
    response = admin_client.post(
        "/admin/agents/deterministicrule/add/", rule_post(ledger, force_first_tool="elsewhere")
    )
    assert response.status_code == 200
    assert "&#x27;elsewhere&#x27; is no tool the model sees; choose any, or one of: lookup" in errors(
        response.content.decode()
    )
    response = admin_client.post("/admin/agents/deterministicrule/add/", rule_post(ledger, force_first_tool="lookup"))
    assert response.status_code == 302, errors(response.content.decode())
    rule = DeterministicRule.objects.get()
    assert rule.force_first_tool == "lookup"
    page = admin_client.get(f"/admin/agents/deterministicrule/{rule.pk}/change/").content.decode()
    select = re.search(r'<select name="force_first_tool".*?</select>', page, re.S)
    assert select is not None
    assert re.findall(r'<option value="([^"]*)"', select.group(0)) == ["", "any", "lookup"]


def test_only_when_a_tool_is_available_is_a_choice_of_the_servers_tools(admin_client: Client, ledger: Agent) -> None:
    response = admin_client.post(
        "/admin/agents/deterministicrule/add/", rule_post(ledger, when__tool_available="erase")
    )
    assert response.status_code == 302, errors(response.content.decode())
    rule = DeterministicRule.objects.get()
    assert rule.when["tool_available"] == "erase"  # a disabled tool too: the rule waits until it is available
    page = admin_client.get(f"/admin/agents/deterministicrule/{rule.pk}/change/").content.decode()
    select = re.search(r'<select name="when__tool_available">.*?</select>', page, re.S)
    assert select is not None
    assert re.findall(r'<optgroup label="([^"]+)">', select.group(0)) == ["Ledger-Data"]
    assert re.findall(r'<option value="([^"]*)"', select.group(0)) == ["", "erase", "lookup"]
    assert '<option value="erase" selected>' in select.group(0)


def test_a_list_argument_takes_its_items_comma_separated(admin_client: Client, ledger: Agent) -> None:
    server = ledger.servers.get()
    schema = {"type": "object", "properties": {"floors": {"type": "array", "items": {"type": "string"}}}}
    McpTool.objects.create(server=server, name="rooms", input_schema=schema, discovered_at=timezone.now())

    def post(value: str, url: str = "/admin/agents/deterministicrule/add/"):  # type: ignore[no-untyped-def]
        return admin_client.post(
            url,
            rule_post(
                ledger,
                tool_name="rooms",
                when__regex=r"(?P<floor>\d+)층",
                params__names=["floors"],
                params__value__floors=value,
            ),
        )

    assert post("3F, {match.floor}, 12").status_code == 302
    rule = DeterministicRule.objects.get()
    assert rule.params == {"floors": ["3F", "{match.floor}", 12]}
    page = admin_client.get(f"/admin/agents/deterministicrule/{rule.pk}/change/").content.decode()
    assert 'value="3F, {match.floor}, 12"' in page  # shown back as typed
    url = f"/admin/agents/deterministicrule/{rule.pk}/change/"
    # A JSON list is still read; one placeholder keeps the value's own type (a list from the A2A data).
    assert post('["a,b", "c"]', url).status_code == 302
    rule.refresh_from_db()
    assert rule.params == {"floors": ["a,b", "c"]}
    assert 'value="[&quot;a,b&quot;, &quot;c&quot;]"' in admin_client.get(url).content.decode()  # a comma: JSON
    # Items that would read back as something else are shown as JSON: one placeholder, a leading bracket.
    for items in (["{match.floor}"], ["[x", "b"]):
        DeterministicRule.objects.filter(pk=rule.pk).update(params={"floors": items})
        shown = re.search(r'name="params__value__floors" value="([^"]*)"', admin_client.get(url).content.decode())
        assert shown is not None and shown.group(1).startswith("[&quot;"), shown
    assert post("{data.floors}", url).status_code == 302
    rule.refresh_from_db()
    assert rule.params == {"floors": "{data.floors}"}


@pytest.mark.parametrize("field", ["when", "params"])
def test_json_nested_too_deeply_is_refused_not_a_server_error(admin_client: Client, ledger: Agent, field: str) -> None:
    deep = "[" * 5000 + "]" * 5000
    data = {k: v for k, v in rule_post(ledger).items() if not k.startswith(f"{field}__")}  # a script's post
    response = admin_client.post("/admin/agents/deterministicrule/add/", {**data, field: deep})
    assert response.status_code == 200
    assert "nested too deeply" in errors(response.content.decode())
    assert not DeterministicRule.objects.exists()
