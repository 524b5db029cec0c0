"""The agent form's structured editors of ``tool_selection`` and ``mcp_context``: every key is a named input,
the choices are the agent's own tools, servers, resources and prompts, the JSON is still accepted, and errors
name the valid keys or values next to the field. Real demo server (and server-everything for resources and
prompts); saved through the audited service."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
from django.test import Client

from agents.models import Agent
from audit.models import AuditEvent
from mcpregistry.models import McpServer, McpTool
from mcpregistry.pool import get_default_pool
from mcpregistry.services import mcp_tool_update
from tests.conftest import discover_as_admin, make_agent

if TYPE_CHECKING:
    from tests.thirdparty import EverythingServer

pytest_plugins = ["tests.thirdparty"]
pytestmark = pytest.mark.django_db

DEMO_TOOLS = [
    "get_asset",
    "get_asset_status",
    "get_asset_status_backup",
    "list_projects",
    "list_team_members",
    "ping",
    "search_employee",
]


@pytest.fixture
def picker(demo_server: McpServer) -> Agent:
    return make_agent(slug="picker", servers=[demo_server], provider="scripted", script=[], with_demo_rules=False)


def post_data(agent: Agent, **fields: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "slug": agent.slug,
        "name": agent.name,
        "enabled": "on",
        "mode": "react",
        "flow_graph": "",
        "system_prompt": agent.system_prompt,
        "deterministic_instruction": agent.deterministic_instruction,
        "answer_template": "",
        "no_match_answer": "",
        "language": agent.language,
        "model_provider": agent.model_provider,
        "model_id": agent.model_id,
        "model_params": json.dumps(agent.model_params, ensure_ascii=False),
        "servers": [str(pk) for pk in agent.servers.values_list("pk", flat=True)],
        "max_iterations": str(agent.max_iterations),
        "time_limit_s": str(agent.time_limit_s),
        "rules-TOTAL_FORMS": "0",
        "rules-INITIAL_FORMS": "0",
        "rules-MIN_NUM_FORMS": "0",
        "rules-MAX_NUM_FORMS": "1000",
    }
    data.update(fields)
    return data


def selection_inputs(**fields: Any) -> dict[str, Any]:
    """The tool selection editor as a browser posts it (its defaults, then ``fields``)."""
    data: dict[str, Any] = {
        "tool_selection__editor": "1",
        "tool_selection__top_k": "5",
        "tool_selection__ranker": "lexical",
        "tool_selection__tags": "",
        "tool_selection__force_first_tool": "",
        "tool_selection__widen_step": "3",
        "tool_selection__max_widenings": "2",
    }
    data.update({f"tool_selection__{k}": v for k, v in fields.items()})
    return data


def field_errors(page: str, field: str) -> str:
    """The error list rendered in the field's own row."""
    row = re.search(
        rf'<div class="form-row[^"]*field-{field}[^"]*">(.*?)(?=<div class="form-row|</fieldset>)', page, re.S
    )
    assert row, f"no row for {field}"
    return html.unescape(" ".join(re.findall(r'<ul class="errorlist[^>]*>(.*?)</ul>', row.group(1), re.S)))


def change_url(agent: Agent) -> str:
    return f"/admin/agents/agent/{agent.pk}/change/"


def test_the_page_names_every_key_and_offers_the_agents_own_tools(admin_client: Client, picker: Agent) -> None:
    page = admin_client.get(change_url(picker)).content.decode()
    for key in ("enabled", "top_k", "ranker", "servers", "tags", "pinned", "force_first_tool", "widen_step"):
        assert f'name="tool_selection__{key}"' in page, key
    assert '<option value="embedding"' in page
    force = re.search(r'name="tool_selection__force_first_tool">(.*?)</select>', page, re.S)
    assert force is not None
    assert re.findall(r'<option value="([^"]*)"', force.group(1)) == ["", "any", *DEMO_TOOLS]
    pinned = re.search(r'name="tool_selection__pinned">(.*?)</select>', page, re.S)
    assert pinned is not None and re.findall(r'<option value="([^"]*)"', pinned.group(1)) == DEMO_TOOLS
    assert 'name="tool_selection__servers" value="sds-company-data"' in page
    assert "The agent's servers list no resources" in page
    for key in ("read_resource_tool", "prompt", "prompt_arguments", "json"):
        assert f'name="mcp_context__{key}"' in page, key
    # The help under the editors says what each setting does, not the JSON of configuration as code.
    assert "Offer the model only the tools that fit each question" in page
    assert "What the bound servers give the model besides tools" in page
    assert "{&quot;enabled&quot;: true" not in page and '{"enabled": true' not in page
    assert "{&quot;resources&quot;" not in page


def test_the_inputs_are_saved_as_the_settings_json_through_the_audited_service(
    admin_client: Client, picker: Agent
) -> None:
    # The tags filter names tags the agent's tools have, and the pinned and forced tools pass it.
    for name, tags in (("ping", ["asset"]), ("get_asset_status", ["자산"])):
        tool = McpTool.objects.get(server__mcp_id="sds-company-data", name=name)
        mcp_tool_update(tool=tool, actor="admin", via="tests", data={"tags": tags})
    data = post_data(
        picker,
        **selection_inputs(
            enabled="on", top_k="3", pinned=["ping"], tags="자산, asset", force_first_tool="get_asset_status"
        ),
    )
    response = admin_client.post(change_url(picker), data)
    assert response.status_code == 302, response.content.decode()[:3000]
    picker.refresh_from_db()
    assert picker.tool_selection == {
        "enabled": True,
        "top_k": 3,
        "pinned": ["ping"],
        "tags": ["자산", "asset"],
        "force_first_tool": "get_asset_status",
    }
    event = AuditEvent.objects.filter(action="config.agent.update").latest("id")
    assert event.args["tool_selection"] == [{}, picker.tool_selection]
    assert event.actor == "admin" and event.source == "admin"

    # The page as it now renders, posted unchanged, changes nothing (defaults stay absent).
    page = admin_client.get(change_url(picker)).content.decode()
    assert re.search(r'<option value="ping" selected>', page)
    count = AuditEvent.objects.filter(action="config.agent.update").count()
    again = post_data(
        picker,
        **selection_inputs(
            enabled="on", top_k="3", pinned=["ping"], tags="자산, asset", force_first_tool="get_asset_status"
        ),
    )
    assert admin_client.post(change_url(picker), again).status_code == 302
    assert AuditEvent.objects.filter(action="config.agent.update").count() == count


def test_names_outside_the_agent_are_refused_next_to_the_field_listing_the_valid_ones(
    admin_client: Client, picker: Agent
) -> None:
    shown = json.dumps({}, ensure_ascii=False)
    edited = json.dumps({"pinned": ["send_mail"], "force_first_tool": "drop_table"})
    data = post_data(picker, **selection_inputs(json=edited, json_shown=shown), **{"mcp_context__editor": "1"})
    page = admin_client.post(change_url(picker), data).content.decode()
    errors = field_errors(page, "tool_selection")
    assert "pinned: send_mail is not a tool of this agent" in errors
    assert "search_employee" in errors
    assert 'force_first_tool: "drop_table" is not a tool of this agent' in errors
    picker.refresh_from_db()
    assert picker.tool_selection == {}


@pytest.mark.slow
def test_a_key_the_settings_do_not_have_is_named_with_the_valid_keys(admin_client: Client, picker: Agent) -> None:
    data = post_data(picker, tool_selection=json.dumps({"topk": 3}))  # a script posting the JSON itself
    page = admin_client.post(change_url(picker), data).content.decode()
    errors = field_errors(page, "tool_selection")
    assert "'topk' is not a valid key (did you mean 'top_k'?)" in errors
    assert "enabled, top_k, ranker, pinned, servers, tags, widen_step, max_widenings, force_first_tool" in errors

    data = post_data(
        picker,
        **{"mcp_context__editor": "1", "mcp_context__json": '{"resource": []}', "mcp_context__json_shown": "{}"},
    )
    page = admin_client.post(change_url(picker), data).content.decode()
    errors = field_errors(page, "mcp_context")
    assert "'resource' is not a valid key (did you mean 'resources'?)" in errors


def test_the_json_posted_by_a_script_is_still_accepted(admin_client: Client, picker: Agent) -> None:
    selection = {"enabled": True, "top_k": 2, "servers": ["sds-company-data"], "ranker": "lexical"}
    response = admin_client.post(change_url(picker), post_data(picker, tool_selection=json.dumps(selection)))
    assert response.status_code == 302
    picker.refresh_from_db()
    assert picker.tool_selection == selection


def test_a_prompt_or_resource_the_servers_do_not_list_is_refused(admin_client: Client, picker: Agent) -> None:
    data = post_data(
        picker,
        **{
            "mcp_context__editor": "1",
            "mcp_context__prompt": json.dumps({"mcp_id": "sds-company-data", "name": "greeting"}),
            "mcp_context__prompt_arguments": "",
        },
    )
    page = admin_client.post(change_url(picker), data).content.decode()
    assert "prompt: sds-company-data has no prompt greeting; its prompts are: —" in field_errors(page, "mcp_context")
    data = post_data(picker, mcp_context=json.dumps({"resources": [{"mcp_id": "ghost", "uri": "demo://x"}]}))
    page = admin_client.post(change_url(picker), data).content.decode()
    assert "resources: ghost is not bound to this agent; its servers are: sds-company-data" in field_errors(
        page, "mcp_context"
    )


# ---- resources and prompts of a third-party server ---------------------------------------------------------------

ARCHITECTURE = "demo://resource/static/document/architecture.md"


@pytest.fixture
def everything(everything_server: EverythingServer) -> Iterator[McpServer]:
    command = everything_server.stdio()
    server = McpServer.objects.create(
        mcp_id="everything",
        name="everything",
        transport=McpServer.Transport.STDIO,
        command=command.command,
        args=command.args,
        timeout_s=20,
    )
    report = discover_as_admin(server=server)
    assert report.ok, report.error
    server.refresh_from_db()
    yield server
    get_default_pool().close("everything")


@pytest.mark.thirdparty
def test_the_context_editor_offers_server_everythings_resources_and_prompts(
    admin_client: Client, everything: McpServer
) -> None:
    agent = make_agent(slug="ctx", servers=[everything], provider="scripted", script=[], with_demo_rules=False)
    page = admin_client.get(change_url(agent)).content.decode()
    resource_value = json.dumps({"mcp_id": "everything", "uri": ARCHITECTURE})
    assert f'value="{resource_value.replace(chr(34), "&quot;")}"' in page
    prompt_names = [p["name"] for p in everything.prompts]
    assert prompt_names and all(f"everything: {name}" in page for name in prompt_names)
    prompt = next(p for p in everything.prompts if p.get("arguments"))
    argument = prompt["arguments"][0]["name"]

    data = post_data(
        agent,
        **{
            "mcp_context__editor": "1",
            "mcp_context__resources": [resource_value],
            "mcp_context__read_resource_tool": "on",
            "mcp_context__prompt": json.dumps({"mcp_id": "everything", "name": prompt["name"]}),
            "mcp_context__prompt_arguments": f"{argument}={{context.city}}\n",
        },
    )
    response = admin_client.post(change_url(agent), data)
    assert response.status_code == 302, field_errors(response.content.decode(), "mcp_context")
    agent.refresh_from_db()
    assert agent.mcp_context == {
        "resources": [{"mcp_id": "everything", "uri": ARCHITECTURE}],
        "read_resource_tool": True,
        "prompt": {"mcp_id": "everything", "name": prompt["name"], "arguments": {argument: "{context.city}"}},
    }
    page = admin_client.get(change_url(agent)).content.decode()
    assert f"{argument}={{context.city}}" in page


def test_text_that_is_no_json_in_the_json_view_is_refused_and_shown_back(admin_client: Client, picker: Agent) -> None:
    data = post_data(picker, **selection_inputs(json='{"top_k": 3,', json_shown="{}"))
    page = admin_client.post(change_url(picker), data).content.decode()
    assert "Not valid JSON: a key in double quotes was expected, at line 1, column 13" in field_errors(
        page, "tool_selection"
    )
    assert "{&quot;top_k&quot;: 3,</textarea>" in page
    picker.refresh_from_db()
    assert picker.tool_selection == {}


DEEP = "[" * 5000 + "]" * 5000


@pytest.mark.parametrize("field", ["tool_selection", "model_params"])
def test_json_nested_too_deeply_is_refused_at_its_field_not_a_server_error(
    admin_client: Client, picker: Agent, field: str
) -> None:
    page = admin_client.post(change_url(picker), post_data(picker, **{field: DEEP})).content.decode()
    assert "the JSON is nested too deeply" in field_errors(page, field)
