"""The agent page saved as it renders changes nothing (defects C and D of the tool-selection review).

- C: a prompt argument whose template has a line break (set through JSON, an import or the API) was shown as
  ``NAME=template`` lines; its second line came back as an argument of its own, without a template, and every save
  of the page was refused ("prompt.arguments.존댓말로: must be text"). Such arguments are now shown as JSON.
- D: the pinned tools, the servers filter and the resources came back in the page's order (the tools', the
  servers'), not the stored one: an unchanged save reordered them and recorded a ``config.agent.update``. The
  stored order is kept, new choices after.

Each page is posted back as a browser would send it: every field the page renders, as rendered.
"""

from __future__ import annotations

import json
from html.parser import HTMLParser
from typing import Any

import pytest
from django.test import Client

from agents.models import Agent
from agents.services import agent_update
from audit.models import AuditEvent
from mcpregistry.models import McpServer
from tests.agents.test_agent_settings_editor import change_url, field_errors
from tests.conftest import make_agent

pytestmark = pytest.mark.django_db

RESOURCES = [
    {"uri": "demo://handbook/a", "name": "A handbook"},
    {"uri": "demo://handbook/b", "name": "B handbook"},
]
PROMPTS = [{"name": "tone", "arguments": [{"name": "style"}, {"name": "city"}]}]


class _Form(HTMLParser):
    """The values a browser posts for the page's form: inputs (checked boxes only), selected options, text
    areas (less the first line break, which a browser drops)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.fields: list[tuple[str, str]] = []
        self._select: str | None = None
        self._option: dict[str, Any] | None = None
        self._textarea: str | None = None
        self._text = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "input" and a.get("name") and a.get("type") not in ("submit", "button", "file"):
            if a.get("type") in ("checkbox", "radio") and "checked" not in a:
                return
            self.fields.append((a["name"], a.get("value", "on" if a.get("type") == "checkbox" else "")))
        elif tag == "select":
            self._select = a.get("name")
        elif tag == "option" and self._select:
            self._option = {"value": a.get("value"), "selected": "selected" in a, "text": ""}
        elif tag == "textarea":
            self._textarea, self._text = a.get("name"), ""

    def handle_data(self, data: str) -> None:
        if self._textarea is not None:
            self._text += data
        elif self._option is not None:
            self._option["text"] += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "option" and self._option is not None and self._select:
            if self._option["selected"]:
                value = self._option["value"]
                self.fields.append((self._select, value if value is not None else self._option["text"]))
            self._option = None
        elif tag == "select":
            self._select = None
        elif tag == "textarea" and self._textarea:
            self.fields.append((self._textarea, self._text[1:] if self._text.startswith("\n") else self._text))
            self._textarea = None


def page_as_posted(page: str) -> dict[str, Any]:
    parser = _Form()
    parser.feed(page)
    posted: dict[str, Any] = {}
    for name, value in parser.fields:
        if name in posted:
            posted[name] = [*(posted[name] if isinstance(posted[name], list) else [posted[name]]), value]
        else:
            posted[name] = value
    posted.pop("csrfmiddlewaretoken", None)
    return posted


def updates() -> int:
    return AuditEvent.objects.filter(action="config.agent.update").count()


@pytest.fixture
def reader(demo_server: McpServer) -> Agent:
    """An agent on the demo server, which lists two resources and a prompt (as discovery would store them)."""
    McpServer.objects.filter(pk=demo_server.pk).update(resources=RESOURCES, prompts=PROMPTS)
    return make_agent(slug="reader", servers=[demo_server], provider="scripted", script=[], with_demo_rules=False)


def saved_unchanged(admin_client: Client, agent: Agent) -> str:
    """Post the page as it renders; returns the page of a refused save ("" when it was saved)."""
    posted = page_as_posted(admin_client.get(change_url(agent)).content.decode())
    response = admin_client.post(change_url(agent), posted)
    return "" if response.status_code == 302 else response.content.decode()


def test_a_prompt_argument_with_a_line_break_survives_a_save_of_the_page_unchanged(
    admin_client: Client, reader: Agent
) -> None:
    context = {
        "prompt": {
            "mcp_id": "sds-company-data",
            "name": "tone",
            "arguments": {"style": "짧게\n존댓말로", "city": "{context.city}"},
        }
    }
    agent_update(agent=reader, actor="admin", via="tests", data={"mcp_context": context})
    before = updates()
    refused = saved_unchanged(admin_client, reader)
    assert not refused, field_errors(refused, "mcp_context")
    reader.refresh_from_db()
    assert reader.mcp_context == context
    assert updates() == before
    # Arguments the lines carry are still lines.
    plain = {"prompt": {"mcp_id": "sds-company-data", "name": "tone", "arguments": {"city": "{context.city}"}}}
    agent_update(agent=reader, actor="admin", via="tests", data={"mcp_context": plain})
    page = admin_client.get(change_url(reader)).content.decode()
    assert ">city={context.city}</textarea>" in page


def test_an_argument_edited_as_json_in_its_text_area_is_read(admin_client: Client, reader: Agent) -> None:
    posted = page_as_posted(admin_client.get(change_url(reader)).content.decode())
    posted["mcp_context__prompt"] = json.dumps({"mcp_id": "sds-company-data", "name": "tone"})
    posted["mcp_context__prompt_arguments"] = json.dumps({"style": "짧게\n존댓말로"}, ensure_ascii=False)
    response = admin_client.post(change_url(reader), posted)
    assert response.status_code == 302, field_errors(response.content.decode(), "mcp_context")
    reader.refresh_from_db()
    assert reader.mcp_context["prompt"]["arguments"] == {"style": "짧게\n존댓말로"}


def test_saving_the_page_unchanged_keeps_the_stored_order_and_records_no_change(
    admin_client: Client, reader: Agent
) -> None:
    selection = {"enabled": True, "top_k": 3, "pinned": ["ping", "get_asset"]}
    context = {
        "resources": [
            {"mcp_id": "sds-company-data", "uri": "demo://handbook/b"},
            {"mcp_id": "sds-company-data", "uri": "demo://handbook/a"},
        ]
    }
    agent_update(agent=reader, actor="admin", via="tests", data={"tool_selection": selection, "mcp_context": context})
    before = updates()
    refused = saved_unchanged(admin_client, reader)
    assert not refused, field_errors(refused, "tool_selection") + field_errors(refused, "mcp_context")
    reader.refresh_from_db()
    assert (reader.tool_selection, reader.mcp_context) == (selection, context)
    assert updates() == before


def test_a_newly_chosen_pinned_tool_comes_after_the_stored_ones(admin_client: Client, reader: Agent) -> None:
    agent_update(
        agent=reader, actor="admin", via="tests", data={"tool_selection": {"enabled": True, "pinned": ["ping"]}}
    )
    posted = page_as_posted(admin_client.get(change_url(reader)).content.decode())
    posted["tool_selection__pinned"] = ["get_asset", "ping"]  # the page's order
    response = admin_client.post(change_url(reader), posted)
    assert response.status_code == 302, field_errors(response.content.decode(), "tool_selection")
    reader.refresh_from_db()
    assert reader.tool_selection["pinned"] == ["ping", "get_asset"]
