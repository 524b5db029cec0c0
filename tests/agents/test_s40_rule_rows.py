"""The agent page's rules table, opened before someone else saved a rule: saving the page put the rule's old order,
name and switch back over the newer save (the row's posted values differed from the stored ones, so the row read
as changed). An untouched row is now untouched; a row edited over a newer save is refused, naming what changed."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from django.test import Client

from agents.models import Agent, DeterministicRule
from mcpregistry.models import McpServer
from tests.agents.test_rule_form_roundtrip import BrowserForm, errors
from tests.agents.test_rule_summary import rule

pytestmark = pytest.mark.django_db


@pytest.fixture
def crm() -> McpServer:
    return McpServer.objects.create(mcp_id="crm", name="crm", command=sys.executable, args=[])


@pytest.fixture
def agent() -> Agent:
    return Agent.objects.create(slug="ledger", name="장부 도우미")


def page_url(agent: Agent) -> str:
    return f"/admin/agents/agent/{agent.pk}/change/"


class AgentPageForm(BrowserForm):
    """The agent's change form as a browser submits it (its rules table included)."""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "form" and dict(attrs).get("id") == "agent_form":
            self._in_form = True
        super().handle_starttag(tag, attrs)


def as_browser_posts(page: str) -> dict[str, list[str]]:
    form = AgentPageForm()
    form.feed(page)
    posted: dict[str, list[str]] = {}
    for name, value in form.fields:
        posted.setdefault(name, []).append(value)
    return {**posted, "_save": ["Save"]}


def stale_page(admin_client: Client, agent: Agent, stored: DeterministicRule) -> dict[str, list[str]]:
    posted = as_browser_posts(admin_client.get(page_url(agent)).content.decode())
    # Another tab saves the rule meanwhile.
    DeterministicRule.objects.filter(pk=stored.pk).update(name="새 이름", order=7, enabled=False)
    return posted


def test_an_untouched_row_of_a_stale_page_keeps_the_newer_save(
    admin_client: Client, agent: Agent, crm: McpServer
) -> None:
    stored = rule(agent, crm, name="옛 이름", order=1, when={"any_keywords": ["소속"]}, params={"name": "{query}"})
    posted: dict[str, Any] = stale_page(admin_client, agent, stored)
    response = admin_client.post(page_url(agent), posted)
    assert response.status_code == 302, errors(response.content.decode())
    stored.refresh_from_db()
    assert (stored.name, stored.order, stored.enabled) == ("새 이름", 7, False)


def test_a_row_edited_over_a_newer_save_is_refused_naming_what_changed(
    admin_client: Client,
    agent: Agent,
    crm: McpServer,
) -> None:
    stored = rule(agent, crm, name="옛 이름", order=1, when={"any_keywords": ["소속"]}, params={"name": "{query}"})
    posted: dict[str, Any] = stale_page(admin_client, agent, stored)
    posted["rules-0-order"] = ["3"]
    response = admin_client.post(page_url(agent), posted)
    assert response.status_code == 200
    said = errors(response.content.decode())
    assert "saved elsewhere after this page was loaded" in said and "name" in said.lower()
    stored.refresh_from_db()
    assert (stored.name, stored.order, stored.enabled) == ("새 이름", 7, False)


def test_a_row_edited_on_a_fresh_page_saves(admin_client: Client, agent: Agent, crm: McpServer) -> None:
    stored = rule(agent, crm, name="옛 이름", order=1, when={"any_keywords": ["소속"]}, params={"name": "{query}"})
    posted = as_browser_posts(admin_client.get(page_url(agent)).content.decode())
    posted["rules-0-order"] = ["3"]
    posted["rules-0-name"] = ["바뀐 이름"]
    response = admin_client.post(page_url(agent), posted)
    assert response.status_code == 302, errors(response.content.decode())
    stored.refresh_from_db()
    assert (stored.name, stored.order) == ("바뀐 이름", 3)
