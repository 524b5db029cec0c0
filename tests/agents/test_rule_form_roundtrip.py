"""The rule editor's round trip: a rule's change page posted back as a browser sends it saves the rule exactly as
stored, with no audit event (keywords with a comma, texts with spaces around them or a line break, a context key
with ``=``, an empty parameter); such values are shown as JSON, which an admin can still edit. And "only when this
tool is available" offers the tools of the rule's own server, the only ones a save takes."""

from __future__ import annotations

import json
import re
import sys
from html.parser import HTMLParser
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from agents.models import Agent, DeterministicRule
from audit.models import AuditEvent
from mcpregistry.models import McpServer, McpTool, ToolContract

pytestmark = pytest.mark.django_db

UPDATE = "config.deterministic_rule.update"


class BrowserForm(HTMLParser):
    """The fields of the rule's change form as a browser submits them: a text area without the line break that
    follows its opening tag, its line breaks sent as CRLF; a select's chosen option (else its first); a checkbox
    only when checked; nothing disabled."""

    def __init__(self) -> None:
        super().__init__()
        self.fields: list[tuple[str, str]] = []
        self._in_form = False
        self._textarea: tuple[str, list[str]] | None = None
        self._select: tuple[str, list[tuple[str, bool]]] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "form" and a.get("id") == "deterministicrule_form":
            self._in_form = True
        if not self._in_form or "disabled" in a:
            return
        name = a.get("name", "")
        if tag == "input" and name:
            kind = a.get("type", "text")
            if kind in ("checkbox", "radio"):
                if "checked" in a:
                    self.fields.append((name, a.get("value") or "on"))
            elif kind not in ("submit", "button", "file", "image", "reset"):
                self.fields.append((name, a.get("value", "")))
        elif tag == "textarea" and name:
            self._textarea = (name, [])
        elif tag == "select" and name:
            self._select = (name, [])
        elif tag == "option" and self._select is not None:
            self._select[1].append((a.get("value", ""), "selected" in a))

    def handle_data(self, data: str) -> None:
        if self._textarea is not None:
            self._textarea[1].append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self._in_form = False
        elif tag == "textarea" and self._textarea is not None:
            name, parts = self._textarea
            text = "".join(parts).replace("\r\n", "\n")
            text = text.removeprefix("\n")  # the line break after the opening tag is no part of the value
            self.fields.append((name, text.replace("\n", "\r\n")))
            self._textarea = None
        elif tag == "select" and self._select is not None:
            name, options = self._select
            chosen = [value for value, selected in options if selected] or [value for value, _ in options[:1]]
            self.fields.extend((name, value) for value in chosen[:1])
            self._select = None


def as_browser_posts(page: str) -> dict[str, list[str]]:
    form = BrowserForm()
    form.feed(page)
    posted: dict[str, list[str]] = {}
    for name, value in form.fields:
        posted.setdefault(name, []).append(value)
    return {**posted, "_save": ["Save"]}


def errors(page: str) -> str:
    return " ".join(re.findall(r'<ul class="errorlist[^>]*>(.*?)</ul>', page, re.S))


@pytest.fixture
def agent() -> Agent:
    """An agent binding two servers: hr (who_is) and rooms (rooms, whose q and floors are optional)."""
    now = timezone.now()
    hr = McpServer.objects.create(mcp_id="hr", name="hr", command=sys.executable, args=[])
    rooms = McpServer.objects.create(mcp_id="rooms", name="rooms", command=sys.executable, args=[])
    McpTool.objects.create(server=hr, name="who_is", input_schema={"type": "object"}, discovered_at=now)
    schema = {"type": "object", "properties": {"q": {"type": "string"}, "floors": {"type": "array"}}}
    tool = McpTool.objects.create(server=rooms, name="rooms", input_schema=schema, discovered_at=now)
    ToolContract.objects.create(tool=tool, args={"q": {"type": "str"}, "floors": {"type": "list"}})
    agent = Agent.objects.create(slug="desk", name="desk")
    agent.servers.set([hr, rooms])
    return agent


def stored_rule(agent: Agent, *, when: dict[str, Any], params: dict[str, Any]) -> DeterministicRule:
    """A rule as import_config or the page's JSON view may store it (no form in between)."""
    server = McpServer.objects.get(mcp_id="rooms")
    return DeterministicRule.objects.create(
        agent=agent, name="방 찾기", server=server, tool_name="rooms", when=when, params=params
    )


def as_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def change_url(rule: DeterministicRule) -> str:
    return f"/admin/agents/deterministicrule/{rule.pk}/change/"


@pytest.mark.parametrize(
    ("when", "params"),
    [
        ({"any_keywords": ["1,000원", "팀"]}, {}),  # was ['1', '000원', '팀']
        ({"all_keywords": [" 팀장"]}, {}),  # was ['팀장']
        ({"context": {"k": " x "}}, {}),  # was 'x'
        ({"any_keywords": ["방"]}, {"q": " x "}),  # was 'x'
        ({"context": {"a=b": "x"}}, {}),  # was {'a': 'b=x'}
        ({"context": {"k": "x\ny"}}, {}),  # was refused: "context, line 2: write KEY=value."
        ({"any_keywords": ["방"]}, {"q": ""}),  # was dropped
        ({"data": {"order.id": " 1", "memo": "a\nb"}}, {"q": "a\nb", "floors": ["3F", " 4F"]}),
        ({"any_keywords": [], "context": {}, "regex": None, "tool_available": None}, {}),  # empty parts stay
        ({"regex": " 님$", "any_keywords": ["[회의실]", "방"]}, {}),
        ({"regex": "(?x) (?P<floor>\\d+)\n 층"}, {"q": "{match.floor}"}),  # a regex of several lines
        ({"tool_available": "rooms", "context": {"tier": "3", "vip": True}}, {"q": "5", "floors": [3, "3F", True]}),
    ],
)
def test_a_rule_posted_back_unchanged_is_saved_as_stored_with_no_audit_event(
    admin_client: Client, agent: Agent, when: dict[str, Any], params: dict[str, Any]
) -> None:
    rule = stored_rule(agent, when=when, params=params)
    page = admin_client.get(change_url(rule)).content.decode()
    response = admin_client.post(change_url(rule), as_browser_posts(page))
    assert response.status_code == 302, errors(response.content.decode())
    rule.refresh_from_db()
    assert (rule.when, rule.params) == (when, params)
    assert as_json(rule.when) == as_json(when) and as_json(rule.params) == as_json(params)  # 1, "1" and true differ
    assert not AuditEvent.objects.filter(action=UPDATE).exists()


def test_values_the_fields_cannot_carry_are_shown_as_json(admin_client: Client, agent: Agent) -> None:
    rule = stored_rule(
        agent,
        when={"any_keywords": ["1,000원", "팀"], "context": {"a=b": "x"}},
        params={"q": "", "floors": [" 4F"]},
    )
    posted = as_browser_posts(admin_client.get(change_url(rule)).content.decode())
    assert posted["when__any_keywords"] == ['["1,000원", "팀"]']
    assert posted["when__context"] == ['{"a=b": "x"}']
    assert posted["params__value__q"] == ['""']
    assert posted["params__value__floors"] == ['[" 4F"]']


def test_an_admin_edits_such_values_in_their_json_or_leaves_them_while_editing_others(
    admin_client: Client, agent: Agent
) -> None:
    rule = stored_rule(agent, when={"any_keywords": ["1,000원", "팀"], "context": {"k": " x "}}, params={"q": ""})
    posted = as_browser_posts(admin_client.get(change_url(rule)).content.decode())
    # Another field edited: the keywords and the context stay as stored.
    response = admin_client.post(change_url(rule), {**posted, "when__regex": "(?P<floor>\\d+)층"})
    assert response.status_code == 302, errors(response.content.decode())
    rule.refresh_from_db()
    assert rule.when == {"any_keywords": ["1,000원", "팀"], "regex": "(?P<floor>\\d+)층", "context": {"k": " x "}}
    assert rule.params == {"q": ""}
    # The JSON shown, edited.
    posted = as_browser_posts(admin_client.get(change_url(rule)).content.decode())
    edits = {
        "when__any_keywords": '["1,000원", "2,000원"]',
        "when__context": '{"k": " y ", "a=b": 1}',
        "params__value__q": '" 회의실 "',
    }
    response = admin_client.post(change_url(rule), {**posted, **edits})
    assert response.status_code == 302, errors(response.content.decode())
    rule.refresh_from_db()
    assert rule.when == {
        "any_keywords": ["1,000원", "2,000원"],
        "regex": "(?P<floor>\\d+)층",
        "context": {"k": " y ", "a=b": 1},
    }
    assert rule.params == {"q": " 회의실 "}
    # Emptied: gone, as before.
    posted = as_browser_posts(admin_client.get(change_url(rule)).content.decode())
    response = admin_client.post(
        change_url(rule), {**posted, "when__any_keywords": "방", "when__context": "", "params__value__q": ""}
    )
    assert response.status_code == 302, errors(response.content.decode())
    rule.refresh_from_db()
    assert (rule.when, rule.params) == ({"any_keywords": ["방"], "regex": "(?P<floor>\\d+)층"}, {})


@pytest.mark.parametrize(
    ("field", "typed", "expected"),
    [
        (
            "when__any_keywords",
            '["1,000원", ',
            "any of these keywords: write the words separated by commas, or a JSON list",
        ),
        ("when__context", '{"k": 1', "context equals: write KEY=value lines, or a JSON object."),
        ("when__data", "[1]", "A2A data, line 1: write PATH=value lines (PATH=* for present), or a JSON object."),
    ],
)
def test_json_that_does_not_read_is_refused_naming_its_part(
    admin_client: Client, agent: Agent, field: str, typed: str, expected: str
) -> None:
    rule = stored_rule(agent, when={"any_keywords": ["방"]}, params={})
    posted = as_browser_posts(admin_client.get(change_url(rule)).content.decode())
    response = admin_client.post(change_url(rule), {**posted, field: typed})
    assert response.status_code == 200
    assert expected in errors(response.content.decode())
    rule.refresh_from_db()
    assert rule.when == {"any_keywords": ["방"]}


def tool_available_choices(page: str) -> list[str]:
    select = re.search(r'<select name="when__tool_available">.*?</select>', page, re.S)
    assert select is not None
    return re.findall(r'<option value="([^"]*)"', select.group(0))


def test_only_the_rules_servers_tools_are_offered_as_tool_available(admin_client: Client, agent: Agent) -> None:
    rule = stored_rule(agent, when={"any_keywords": ["방"]}, params={})
    page = admin_client.get(change_url(rule)).content.decode()
    assert tool_available_choices(page) == ["", "rooms"]  # not hr's who_is, which a save refuses
    # Every server's tools are on the page for the script, which narrows the list when the server changes.
    found = re.search(r'data-server-tools="([^"]*)"', page)
    assert found is not None
    assert json.loads(found.group(1).replace("&quot;", '"')) == {"hr": ["who_is"], "rooms": ["rooms"]}
    # Without the script, a tool of another server is still refused, naming the valid ones.
    posted = as_browser_posts(page)
    response = admin_client.post(change_url(rule), {**posted, "when__tool_available": "who_is"})
    assert "&#x27;who_is&#x27; is not a tool of this server; its tools are: rooms" in errors(response.content.decode())
    # A stored name the server lacks is shown (its own group) so that the page tells what is stored.
    DeterministicRule.objects.filter(pk=rule.pk).update(when={"tool_available": "who_is"})
    assert tool_available_choices(admin_client.get(change_url(rule)).content.decode()) == ["", "rooms", "who_is"]


def test_a_new_rule_is_offered_every_bound_servers_tools_until_a_server_is_chosen(
    admin_client: Client, agent: Agent
) -> None:
    page = admin_client.get("/admin/agents/deterministicrule/add/").content.decode()
    assert tool_available_choices(page) == ["", "who_is", "rooms"]
