"""A binding's secret never reaches what is stored, shown and exported in clear:

* a server that lists the secret as a value in a tool's input schema (``tenant: Literal[TOKEN, "public-demo"]``:
  an ``enum``, a ``const``) had it stored in the tool's schema and pre-filled into its contract's allowed values,
  whence ``export_config``, the tool's page and the schema offered to the model copied it in clear; it is stored
  masked, the mask is no allowed value, and the tool waits for a review;
* an environment *setting* (``public_env``: shown, exported, never masked) named like a secret (``API_TOKEN``) or
  holding one (``sk-live-…``) was accepted by the server form, the services and ``import_config``; it is refused,
  naming the variable, while a setting stored before the check still saves as it is.
"""

from __future__ import annotations

import io
import json
import re
import sys
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command

from agent_platform.errors import ApplicationError
from agents.configuration import config_import
from audit.masking import clear_registered_secrets
from mcpregistry import services
from mcpregistry.contracts import schema_with_contract
from mcpregistry.models import McpServer, McpTool, ToolContract
from mcpregistry.pool import ServerListing, get_default_pool
from mcpregistry.services import _listing_without_secrets, mcp_server_create, mcp_server_discover, mcp_server_update
from tests.mcp_fixtures.scripts import script_file
from tests.mcpregistry.test_registry import post_server_form

pytestmark = pytest.mark.django_db

TENANT_KEY = "Tn7Qx2Lw9Kp4Zr8Vb"

# A server that takes its binding's secret as an argument's value: the SDK lists it in the tool's input schema.
TENANT_SERVER = """
import os
from typing import Literal
from fastmcp import FastMCP

mcp = FastMCP("tenants")
TOKEN = os.environ["TENANT_KEY"]

@mcp.tool(annotations={"readOnlyHint": True})
def lookup(tenant: Literal[TOKEN, "public-demo"], q: str = "") -> str:
    return "ok"

@mcp.tool(annotations={"readOnlyHint": True})
def own_tenant(tenant: Literal[TOKEN]) -> str:
    return "ok"

@mcp.tool(annotations={"readOnlyHint": True})
def echo(text: str) -> str:
    return text

mcp.run(transport="stdio", show_banner=False)
"""


@pytest.fixture
def tenant_server(db: Any) -> Any:
    server = McpServer.objects.create(
        mcp_id="tenants",
        name="tenants",
        command=sys.executable,
        args=[script_file(TENANT_SERVER)],
        cwd=str(settings.BASE_DIR),
        env={"TENANT_KEY": TENANT_KEY},
        session_scope="shared",
    )
    yield server
    get_default_pool().close("tenants")


@pytest.mark.slow
def test_a_secret_a_server_lists_as_an_allowed_value_is_stored_masked_and_is_no_allowed_value(
    tenant_server: McpServer,
) -> None:
    report = mcp_server_discover(server=tenant_server, actor="admin", via="tests")

    assert report.ok, report.error
    lookup = McpTool.objects.get(server=tenant_server, name="lookup")
    assert lookup.input_schema["properties"]["tenant"]["enum"] == ["***", "public-demo"]
    assert ToolContract.objects.get(tool=lookup).args["tenant"]["allowed"] == ["public-demo"]
    own = McpTool.objects.get(server=tenant_server, name="own_tenant")  # Literal[TOKEN]: a const
    assert own.input_schema["properties"]["tenant"]["const"] == "***"
    # Reviewed first, even on the binding's first discovery; a tool that quoted nothing is enabled as before.
    assert sorted(report.secrets_masked) == ["lookup", "own_tenant"]
    assert (lookup.enabled, lookup.review_required) == (False, True)
    echo = McpTool.objects.get(server=tenant_server, name="echo")
    assert (echo.enabled, echo.review_required) == (True, False)
    # The next discovery lists the same: nothing changed, nothing to review again.
    assert mcp_server_discover(server=tenant_server, actor="admin", via="tests").updated == []


@pytest.mark.slow
def test_no_copy_of_the_tool_holds_the_secret(tenant_server: McpServer, admin_client: Any) -> None:
    assert mcp_server_discover(server=tenant_server, actor="admin", via="tests").ok
    clear_registered_secrets()  # the web process, or another worker, has not seen the binding's secrets
    tool = McpTool.objects.get(server=tenant_server, name="lookup")
    contract = ToolContract.objects.get(tool=tool)

    exported = io.StringIO()
    call_command("export_config", stdout=exported)
    page = admin_client.get(f"/admin/mcpregistry/mcptool/{tool.pk}/change/")

    assert page.status_code == 200
    assert TENANT_KEY not in exported.getvalue()
    assert TENANT_KEY not in page.content.decode()
    offered = schema_with_contract(tool.input_schema, contract.args)
    assert offered["properties"]["tenant"]["enum"] == ["public-demo"]  # neither the secret nor its mask


def test_every_value_of_a_listing_is_masked_and_its_names_are_kept() -> None:
    schema = {
        "type": "object",
        "properties": {
            "tenant": {"const": TENANT_KEY, "type": "string"},
            "options": {"type": "object", "default": {"name": TENANT_KEY}},
            "code": {"type": "string", "pattern": f"^(?:{TENANT_KEY}|demo)$"},
            "pin": {"type": "integer", "examples": [48291357]},
        },
        "required": ["tenant"],
    }
    listing = ServerListing(
        tools=[{"name": TENANT_KEY, "description": f"key {TENANT_KEY}", "inputSchema": schema}],
        resources=[],
        prompts=[],
        server_info={"name": "s", "version": TENANT_KEY},
        protocol_version="2025-06-18",
    )

    masked = _listing_without_secrets(listing, [TENANT_KEY, "48291357"])

    tool = masked.tools[0]
    assert tool["name"] == TENANT_KEY  # a name, not a value: a secret that happens to be one does not rename it
    assert TENANT_KEY not in json.dumps([tool["description"], tool["inputSchema"], masked.server_info])
    properties = tool["inputSchema"]["properties"]
    assert properties["tenant"]["const"] == "***"
    assert properties["options"]["default"] == {"name": "***"}
    assert properties["pin"]["examples"] == ["***"]
    assert re.fullmatch(properties["code"]["pattern"], "demo")  # still a regular expression
    assert not re.fullmatch(properties["code"]["pattern"], TENANT_KEY)


def test_an_argument_whose_every_value_was_a_secret_keeps_the_mask_as_its_one_value() -> None:
    """Not an empty list: it allows nothing at the gate, but the contract editor shows it as an empty box, which a
    save reads as no limit at all."""
    schema = {
        "type": "object",
        "properties": {"tenant": {"type": "string", "enum": ["***", "tenant-***"]}, "region": {"enum": ["kr"]}},
    }

    contract = services._first_contract(schema, {}, secret_masked=True)

    assert contract["args"]["tenant"]["allowed"] == ["***"]
    assert contract["args"]["region"]["allowed"] == ["kr"]
    assert services._first_contract(schema, {}, secret_masked=False)["args"]["tenant"]["allowed"] == [
        "***",
        "tenant-***",
    ]


# ---- settings that are secrets -------------------------------------------------------------------------------

API_TOKEN = "sk-live-Zq9xLm2PwR7tYb4KfQ"
DB_PASSWORD = "Zq9xLm2PwR7tYb4KfQ0"


@pytest.mark.parametrize(
    ("line", "name"),
    [
        (f"API_TOKEN={API_TOKEN}", "API_TOKEN"),
        (f"DB_PASSWORD={DB_PASSWORD}", "DB_PASSWORD"),
        (f"UPSTREAM={API_TOKEN}", "UPSTREAM"),  # a plain name, a value shaped as a key
    ],
)
def test_the_settings_box_refuses_a_secret_naming_it(admin_client: Any, line: str, name: str) -> None:
    response = post_server_form(admin_client, None, env_settings=f"FAILURE_MODE=none\n{line}")

    assert response.status_code == 200  # the form again, with its error
    errors = response.context["adminform"].form.errors
    assert name in " ".join(errors["env_settings"]) and "secret environment value" in " ".join(errors["env_settings"])
    assert not McpServer.objects.filter(mcp_id="new-server").exists()


def test_a_setting_that_is_not_a_secret_is_still_a_setting(admin_client: Any) -> None:
    response = post_server_form(admin_client, None, env_settings="FAILURE_MODE=none\nREGION=ap-northeast-2")

    assert response.status_code == 302
    server = McpServer.objects.get(mcp_id="new-server")
    assert server.public_env == ["FAILURE_MODE", "REGION"]


def stdio_binding(**changes: Any) -> dict[str, Any]:
    return {"mcp_id": "x", "name": "x", "transport": "stdio", "command": sys.executable, "args": ["-V"], **changes}


@pytest.mark.parametrize(
    ("name", "value"), [("DB_PASSWORD", DB_PASSWORD), ("API_TOKEN", "none"), ("UPSTREAM", API_TOKEN)]
)
def test_import_refuses_a_setting_that_is_a_secret(name: str, value: str) -> None:
    document = {"servers": [stdio_binding(env={name: {"value": value}}, public_env=[name])]}

    with pytest.raises(ApplicationError) as refused:
        config_import(actor="t", document=document)

    assert f"servers[0] (x): public_env: {name}:" in str(refused.value.message)
    assert not McpServer.objects.filter(mcp_id="x").exists()


def test_the_service_refuses_a_setting_that_is_a_secret() -> None:
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError) as refused:
        mcp_server_create(
            actor="t", via="tests", data=stdio_binding(env={"API_TOKEN": API_TOKEN}, public_env=["API_TOKEN"])
        )

    assert "API_TOKEN" in " ".join(refused.value.message_dict["public_env"])


def test_a_secret_given_as_a_secret_is_accepted(admin_client: Any) -> None:
    response = post_server_form(admin_client, None, env_settings="FAILURE_MODE=none", new_env=f"API_TOKEN={API_TOKEN}")

    assert response.status_code == 302
    server = McpServer.objects.get(mcp_id="new-server")
    assert server.public_env == ["FAILURE_MODE"] and server.secret_values() == [API_TOKEN]


def test_a_setting_stored_before_the_check_still_saves_until_it_is_changed(admin_client: Any) -> None:
    from django.core.exceptions import ValidationError

    server = McpServer.objects.create(
        mcp_id="legacy",
        name="legacy",
        command=sys.executable,
        env={"API_TOKEN": "legacy-value-1234567890", "FAILURE_MODE": "none"},
        public_env=["API_TOKEN", "FAILURE_MODE"],
    )

    mcp_server_update(server=server, actor="t", via="tests", data={"name": "renamed"})
    kept = post_server_form(
        admin_client, server, env_settings="API_TOKEN=legacy-value-1234567890\nFAILURE_MODE=slow", name="again"
    )
    assert kept.status_code == 302
    server.refresh_from_db()
    assert (server.name, server.env["FAILURE_MODE"]) == ("again", "slow")

    with pytest.raises(ValidationError):
        mcp_server_update(server=server, actor="t", via="tests", data={"env": {**server.env, "API_TOKEN": "changed"}})
