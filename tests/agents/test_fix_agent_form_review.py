"""What an agent's page and an API key's page were a 500 on, now refused at the field that holds it.

- ``null`` (and ``[]``) typed into the JSON of the tool selection, the MCP context or the model parameters: the
  column holds no NULL, and a list was stored where every reader takes an object.
- A NUL or another control character in a model parameter's value (PostgreSQL's jsonb refuses a NUL).
- An id past 64 bits in a multi-select (the agent's servers, an API key's agents): SQLite's ``OverflowError``.
- A ``PATH=value`` line naming more keys than JSON may nest (``PLATFORM_API_MAX_JSON_DEPTH``).
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from django.contrib.auth.models import Group
from django.core.validators import ProhibitNullCharactersValidator
from django.test import Client

from agents.agent_settings_form import agent_settings_problems
from agents.models import Agent, ApiKey
from mcpregistry.list_fields import data_parts_from_text, object_from_path_lines, path_lines
from mcpregistry.models import McpServer
from tests.agents.test_agent_settings_editor import change_url, field_errors, post_data, selection_inputs
from tests.conftest import make_agent
from tests.postgres import PostgresMissing, manage, private_postgres

pytestmark = pytest.mark.django_db

NUL_REFUSED = str(ProhibitNullCharactersValidator.message)
HUGE_ID = "9" * 20  # past 64 bits
NOT_AN_OBJECT = {
    "tool_selection": "(root): must be a JSON object",
    "mcp_context": "(root): must be a JSON object",
    "model_params": "Enter a JSON object: parameter name → its value.",
}


@pytest.fixture
def picker(demo_server: McpServer) -> Agent:
    return make_agent(slug="picker", servers=[demo_server], provider="scripted", script=[], with_demo_rules=False)


def json_typed(field: str, text: str) -> dict[str, Any]:
    """The post of ``text`` typed into the field's JSON: the settings' JSON view, the model parameters' JSON box."""
    if field == "tool_selection":
        return selection_inputs(json=text, json_shown="{}")
    if field == "mcp_context":
        return {"mcp_context__editor": "1", "mcp_context__json": text, "mcp_context__json_shown": "{}"}
    return {"model_params": text}


def lines_typed(agent: Agent, lines: str) -> dict[str, Any]:
    """The agent's page with the model parameters typed as ``KEY=value`` lines."""
    data = post_data(agent, model_params__editor="1", model_params__lines=lines)
    del data["model_params"]
    return data


@pytest.mark.parametrize("field", ["tool_selection", "mcp_context", "model_params"])
@pytest.mark.parametrize("text", ["null", "[]", "0"])
def test_json_that_is_no_object_is_refused_at_its_field(
    admin_client: Client, picker: Agent, field: str, text: str
) -> None:
    before = {name: getattr(picker, name) for name in NOT_AN_OBJECT}
    response = admin_client.post(change_url(picker), post_data(picker, **json_typed(field, text)))
    assert response.status_code == 200
    assert NOT_AN_OBJECT[field] in field_errors(response.content.decode(), field)
    picker.refresh_from_db()
    assert {name: getattr(picker, name) for name in NOT_AN_OBJECT} == before


def test_the_settings_checks_a_service_makes_refuse_a_list_as_they_refuse_a_number(demo_server: McpServer) -> None:
    """``config_import`` and ``agent_update`` check the settings so too: ``[]`` was read as the defaults, and stored."""
    problems = agent_settings_problems(tool_selection=[], mcp_context=0, servers=[demo_server])
    assert problems == {
        "tool_selection": [NOT_AN_OBJECT["tool_selection"]],
        "mcp_context": [NOT_AN_OBJECT["mcp_context"]],
    }
    assert agent_settings_problems(tool_selection=None, mcp_context={}, servers=[demo_server]) == {}


def test_a_post_that_leaves_the_settings_out_keeps_them(admin_client: Client, picker: Agent) -> None:
    Agent.objects.filter(pk=picker.pk).update(tool_selection={"top_k": 3})
    data = post_data(picker, name="renamed")
    del data["model_params"]
    assert admin_client.post(change_url(picker), data).status_code == 302
    picker.refresh_from_db()
    assert (picker.name, picker.tool_selection, picker.model_params) == ("renamed", {"top_k": 3}, {"script": []})


@pytest.mark.parametrize(
    ("lines", "entry"),
    [
        ("region_name=ap\x00ne", "region_name"),
        ("guardrail.id=a\x00b", "guardrail"),
        ("base_url=http://h\x00/v1", "base_url"),
        ("flow.mcp_id=sds\x00", "flow"),
    ],
)
def test_a_nul_in_a_model_parameter_line_is_refused_naming_the_parameter(
    admin_client: Client, picker: Agent, lines: str, entry: str
) -> None:
    response = admin_client.post(change_url(picker), lines_typed(picker, lines))
    assert response.status_code == 200
    assert f"{entry}: {NUL_REFUSED}" in field_errors(response.content.decode(), "model_params")
    picker.refresh_from_db()
    assert picker.model_params == {"script": []}


@pytest.mark.parametrize(
    "params",
    [
        {"base_url": "http://h\x00/v1"},
        {"flow": {"mcp_id": "sds\x00"}},
        {"script": [{"content": "a\x00"}]},
        {"region_name": "ap\x1bne"},  # an escape, no one types it either
    ],
)
def test_a_control_character_in_the_model_parameters_json_is_refused(
    admin_client: Client, picker: Agent, params: dict[str, Any]
) -> None:
    response = admin_client.post(change_url(picker), post_data(picker, model_params=json.dumps(params)))
    assert response.status_code == 200
    errors = field_errors(response.content.decode(), "model_params")
    assert NUL_REFUSED in errors or "Control characters other than tab and line breaks are not allowed." in errors
    picker.refresh_from_db()
    assert picker.model_params == {"script": []}


def test_a_control_character_stored_before_saves_unchanged(admin_client: Client, picker: Agent) -> None:
    stored = {"script": [], "region_name": "ap\x1bne"}
    Agent.objects.filter(pk=picker.pk).update(model_params=stored)
    picker.refresh_from_db()
    response = admin_client.post(change_url(picker), post_data(picker, model_params=json.dumps(stored)))
    assert response.status_code == 302
    picker.refresh_from_db()
    assert picker.model_params == stored


def test_a_nul_in_a_prompt_argument_of_the_mcp_context_is_refused(admin_client: Client, picker: Agent) -> None:
    context = {"prompt": {"mcp_id": "sds-company-data", "name": "p", "arguments": {"a": "b\x00"}}}
    response = admin_client.post(
        change_url(picker), post_data(picker, **json_typed("mcp_context", json.dumps(context)))
    )
    assert f"prompt: {NUL_REFUSED}" in field_errors(response.content.decode(), "mcp_context")
    picker.refresh_from_db()
    assert picker.mcp_context == {}


@pytest.mark.parametrize("server_id", [HUGE_ID, f"-{HUGE_ID}"])
def test_a_server_id_past_the_databases_integers_is_an_invalid_choice(
    admin_client: Client, picker: Agent, server_id: str
) -> None:
    response = admin_client.post(change_url(picker), post_data(picker, servers=[server_id]))
    assert response.status_code == 200
    expected = f"Select a valid choice. {server_id} is not one of the available choices."
    assert expected in field_errors(response.content.decode(), "servers")
    assert list(picker.servers.values_list("mcp_id", flat=True)) == ["sds-company-data"]


def test_a_server_id_with_a_digit_that_is_no_number_is_refused(admin_client: Client, picker: Agent) -> None:
    response = admin_client.post(change_url(picker), post_data(picker, servers=["²"]))
    assert response.status_code == 200
    assert "“²” is not a valid value." in field_errors(response.content.decode(), "servers")


def test_an_api_keys_agent_id_past_the_databases_integers_is_an_invalid_choice(
    admin_client: Client, picker: Agent
) -> None:
    response = admin_client.post("/admin/agents/apikey/add/", {"name": "k", "agents": [HUGE_ID], "rate": ""})
    assert response.status_code == 200
    assert f"Select a valid choice. {HUGE_ID} is not one of the available choices." in field_errors(
        response.content.decode(), "agents"
    )
    assert not ApiKey.objects.exists()


def test_ids_in_range_are_still_chosen(admin_client: Client, picker: Agent) -> None:
    response = admin_client.post("/admin/agents/apikey/add/", {"name": "k", "agents": [str(picker.pk)], "rate": ""})
    assert response.status_code == 200 and "Select a valid choice" not in response.content.decode()
    assert list(ApiKey.objects.get().agents.all()) == [picker]


def test_a_model_parameter_path_deeper_than_json_may_nest_is_refused_naming_the_line(
    admin_client: Client, picker: Agent, settings: Any
) -> None:
    lines = "temperature=0.2\nflow" + ".a" * 900 + "=1"
    response = admin_client.post(change_url(picker), lines_typed(picker, lines))
    assert response.status_code == 200
    limit = settings.PLATFORM_API_MAX_JSON_DEPTH
    assert f"line 2: a path may name at most {limit} keys" in field_errors(response.content.decode(), "model_params")
    picker.refresh_from_db()
    assert picker.model_params == {"script": []}


def test_a_path_reads_up_to_the_limit_and_deeper_objects_are_shown_as_json(settings: Any) -> None:
    settings.PLATFORM_API_MAX_JSON_DEPTH = 3
    assert object_from_path_lines("a.b.c=1") == {"a": {"b": {"c": 1}}}
    with pytest.raises(ValueError, match="line 2: a path may name at most 3 keys"):
        object_from_path_lines("x=1\na.b.c.d=1")
    with pytest.raises(ValueError, match="line 1: a path may name at most 3 keys"):
        data_parts_from_text("order.item.sku.id=7")  # the rule tester's and eval cases' data parts
    # Lines that could not read back are not offered: the JSON box shows it (saved unchanged, it stays so).
    assert path_lines({"a": {"b": {"c": 1}}}) == "a.b.c=1"
    assert path_lines({"a": {"b": {"c": {"d": 1}}}}) is None


def test_the_servers_the_page_offers_come_from_the_ids_that_read(admin_client: Client, picker: Agent) -> None:
    """The editors offer the posted servers' tools even beside an id that overflows (it is refused, not a 500)."""
    demo = McpServer.objects.get(mcp_id="sds-company-data")
    response = admin_client.post(change_url(picker), post_data(picker, servers=[str(demo.pk), HUGE_ID]))
    assert response.status_code == 200
    assert 'name="tool_selection__servers" value="sds-company-data"' in response.content.decode()


# --- on PostgreSQL, where the NUL was a DataError ---------------------------------------------------------------

ON_POSTGRES = r"""
import io, json
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client
from agents.models import Agent
from tests.agents.test_agent_settings_editor import post_data, selection_inputs
call_command("seed_demo", "--no-discover", stdout=io.StringIO())
client = Client(SERVER_NAME="localhost", raise_request_exception=False)
client.force_login(get_user_model().objects.get(username="admin"))
agent = Agent.objects.get(slug="company-assistant")
url = f"/admin/agents/agent/{agent.pk}/change/"
def lines(text):
    data = post_data(agent, model_params__editor="1", model_params__lines=text)
    del data["model_params"]
    return data
posts = {
    "lines NUL": lines("region_name=ap\x00ne"),
    "lines deep": lines("flow" + ".a" * 900 + "=1"),
    "json NUL": post_data(agent, model_params=json.dumps({"base_url": "http://h\x00/v1"})),
    "json null": post_data(agent, model_params="null"),
    "selection null": post_data(agent, **selection_inputs(json="null", json_shown="{}")),
    "servers huge": post_data(agent, servers=["9" * 20]),
}
for label, data in posts.items():
    print("RESULT", label, client.post(url, data).status_code)
print("RESULT api key", client.post("/admin/agents/apikey/add/", {"name": "k", "agents": ["9" * 20]}).status_code)
print("RESULT stored", json.dumps(Agent.objects.get(pk=agent.pk).model_params == agent.model_params))
"""


@pytest.mark.postgres
def test_the_agent_and_api_key_pages_refuse_these_on_postgres() -> None:
    try:
        with private_postgres() as database_url:
            migrated = manage("migrate", "--noinput", database_url=database_url)
            assert migrated.returncode == 0, migrated.stderr
            done = manage("shell", "-c", ON_POSTGRES, database_url=database_url, timeout=600)
    except PostgresMissing as exc:
        if os.environ.get("CI"):
            pytest.fail(f"PostgreSQL is needed in CI (.ci/run installs it): {exc}")
        pytest.skip(str(exc))
    assert done.returncode == 0, done.stderr[-3000:]
    results = [line.removeprefix("RESULT ") for line in done.stdout.splitlines() if line.startswith("RESULT")]
    assert results == [
        "lines NUL 200",
        "lines deep 200",
        "json NUL 200",
        "json null 200",
        "selection null 200",
        "servers huge 200",
        "api key 200",
        "stored true",
    ], done.stdout[-3000:] + done.stderr[-3000:]


@pytest.mark.django_db
def test_a_group_or_user_given_an_id_past_the_integer_range_is_refused_not_a_500(admin_client: Any) -> None:
    huge = "99999999999999999999"
    group = admin_client.post("/admin/auth/group/add/", {"name": "운영", "permissions": [huge]})
    assert group.status_code == 200 and "is not one of the available choices" in group.content.decode()
    assert not Group.objects.filter(name="운영").exists()
