"""The tool and server pages refuse what no column stores, and show back neither a secret nor an unsaved contract.

- A NUL (PostgreSQL's jsonb refuses it: the save was a 500) or another control character typed anywhere into a
  tool contract (a pattern, an allowed value, a required key, a per-field key, the JSON view, a posted JSON) is
  refused at its field, as tags and keywords refuse it; a contract stored with one saves unchanged.
- ``returns`` or ``retry`` posted as ``null`` (a script, the JSON view) is refused at its field, not a 500.
- A server page refused for another field shows the header values typed into it as empty, as it does the
  environment values.
- A tool page refused for its contract shows the contract as saved in "as the model is shown it".
"""

from __future__ import annotations

import html
import json
import re
from typing import Any

import pytest
from django.core.validators import ProhibitNullCharactersValidator
from django.test import Client

from mcpregistry.models import McpServer, McpTool
from tests.mcpregistry.test_contract_editor import editor_post, lookup  # noqa: F401
from tests.mcpregistry.test_registry import post_server_form
from tests.postgres import manage, migrated_postgres_url, postgres_url  # noqa: F401 - fixtures

NUL_REFUSED = str(ProhibitNullCharactersValidator.message)


def post_contract(client: Client, tool: McpTool, **changes: Any) -> Any:
    data = editor_post(tool, **{f"contract-0-{key}": value for key, value in changes.items()})
    return client.post(f"/admin/mcpregistry/mcptool/{tool.pk}/change/", data)


def contract_errors(response: Any) -> dict[str, list[str]]:
    """The contract form's errors by field (the page was refused: a 200 with the form)."""
    assert response.status_code == 200, response.status_code
    form = response.context["inline_admin_formsets"][0].formset.forms[0]
    return {field: list(messages) for field, messages in form.errors.items()}


def stored_contract(tool: McpTool) -> tuple[Any, Any, Any]:
    tool.contract.refresh_from_db()
    return tool.contract.args, tool.contract.returns, tool.contract.retry


# --- 1. a NUL or another control character -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("typed", "field", "entry"),
    [
        ({"args__0__pattern": "^a\x00"}, "args", "name"),
        ({"args__0__allowed": "kim, l\x00ee"}, "args", "name"),
        ({"args": json.dumps({"name": {"type": "str", "allowed": ["a\x00"]}})}, "args", "name"),
        ({"returns__required": "id, na\x00me"}, "returns", "required"),
        ({"returns__fields__rows": ["0"], "returns__fields__0__key": "k\x00"}, "returns", "fields"),
        ({"retry": json.dumps({"on": ["timeout\x00"]})}, "retry", "on"),
    ],
)
def test_a_nul_typed_into_the_contract_is_refused_at_its_field_naming_the_entry(
    admin_client: Client,
    lookup: McpTool,  # noqa: F811
    typed: dict[str, Any],
    field: str,
    entry: str,
) -> None:
    before = stored_contract(lookup)
    response = post_contract(admin_client, lookup, **typed)
    assert contract_errors(response) == {field: [f"{entry}: {NUL_REFUSED}"]}
    assert stored_contract(lookup) == before


def test_a_nul_in_the_json_view_is_refused_there(admin_client: Client, lookup: McpTool) -> None:  # noqa: F811
    before = stored_contract(lookup)
    document = {"args": {"name": {"type": "str", "pattern": "x\x00"}}, "returns": {"required": ["i\x00d"]}}
    response = post_contract(admin_client, lookup, contract_json=json.dumps(document))
    assert contract_errors(response) == {
        "contract_json": [f"args.name: {NUL_REFUSED}", f"returns.required: {NUL_REFUSED}"]
    }
    assert stored_contract(lookup) == before


def test_an_argument_named_with_a_nul_is_refused_naming_it_visibly(
    admin_client: Client,
    lookup: McpTool,  # noqa: F811
) -> None:
    response = post_contract(admin_client, lookup, args=json.dumps({"na\x00me": {"type": "str"}}))
    assert contract_errors(response) == {"args": [f"na⟦U+0000⟧me: {NUL_REFUSED}"]}


def test_another_control_character_is_refused_but_a_stored_one_saves_unchanged(
    admin_client: Client,
    lookup: McpTool,  # noqa: F811
) -> None:
    bell = post_contract(admin_client, lookup, args__0__pattern="^a\x07")
    assert list(contract_errors(bell)) == ["args"]

    # As import_config may store it (it refuses a NUL only): saving the page with another change keeps it.
    lookup.contract.args = {**lookup.contract.args, "name": {"type": "str", "required": True, "pattern": "^\x1b"}}
    lookup.contract.save()
    saved = post_contract(admin_client, lookup, args__0__pattern="^\x1b", timeout_s="5")
    assert saved.status_code == 302, contract_errors(saved)
    lookup.contract.refresh_from_db()
    assert lookup.contract.args["name"]["pattern"] == "^\x1b" and lookup.contract.timeout_s == 5


@pytest.mark.parametrize("field", ["fallback_tool", "idempotency_arg"])
def test_a_name_with_a_nul_the_page_does_not_offer_is_refused_at_its_field(
    admin_client: Client,
    lookup: McpTool,  # noqa: F811
    field: str,
) -> None:
    response = post_contract(admin_client, lookup, **{field: "lookup_backup\x00"})
    assert contract_errors(response) == {field: [NUL_REFUSED]}
    lookup.contract.refresh_from_db()
    assert getattr(lookup.contract, field) == ""


# --- 2. null for a JSON field ------------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["returns", "retry"])
@pytest.mark.parametrize("posted", ["null", ""])
def test_no_object_posted_for_the_result_or_the_retry_policy_is_refused(
    admin_client: Client,
    lookup: McpTool,  # noqa: F811
    field: str,
    posted: str,
) -> None:
    before = stored_contract(lookup)
    response = post_contract(admin_client, lookup, **{field: posted})
    assert contract_errors(response) == {field: ["Enter a JSON object."]}
    assert stored_contract(lookup) == before


def test_a_page_that_leaves_the_result_out_keeps_it_as_stored(admin_client: Client, lookup: McpTool) -> None:  # noqa: F811
    lookup.contract.returns = {"type": "dict", "required": ["id"]}
    lookup.contract.save()
    response = post_contract(admin_client, lookup, returns__editor=None, timeout_s="5")
    assert response.status_code == 302
    lookup.contract.refresh_from_db()
    assert lookup.contract.returns == {"type": "dict", "required": ["id"]}


# --- 3. header values on a refused server page -------------------------------------------------------------------

HEADER_SECRET = "Bearer sk-live-Header-Secret-9876543210"


def new_headers_box(response: Any) -> str:
    assert response.status_code == 200
    return str(re.search(r'<textarea name="new_headers".*?</textarea>', response.content.decode(), re.S).group(0))


def test_a_refused_server_page_shows_the_typed_header_values_empty(admin_client: Client, settings: Any) -> None:
    settings.PLATFORM_MCP_ALLOW_PRIVATE_URLS = ["example.com"]
    http = {"transport": "streamable_http", "command": "", "args": "", "url": "https://example.com/mcp"}
    typed = {"new_headers": f"Authorization={HEADER_SECRET}", "timeout_s": "0"}  # refused for its timeout

    added = post_server_form(admin_client, None, mcp_id="headers-add", **http, **typed)
    server = McpServer.objects.create(
        mcp_id="headers-change", name="h", transport="streamable_http", url="https://example.com/mcp"
    )
    changed = post_server_form(admin_client, server, **http, **typed)

    for response in (added, changed):
        assert "timeout_s" in response.context["adminform"].form.errors
        box = new_headers_box(response)
        assert re.search(r">\s*</textarea>$", box), box  # empty, as the environment values' box
        assert 'placeholder="Authorization=Bearer …"' in box and 'rows="3"' in box and 'autocomplete="off"' in box
        assert "sk-live-Header-Secret" not in response.content.decode()
    assert not McpServer.objects.filter(mcp_id="headers-add").exists()


# --- 4. the model's view on a refused tool page ------------------------------------------------------------------


def model_view_text(response: Any) -> str:
    shown = re.search(r"field-model_view.*?</details>", response.content.decode(), re.S)
    assert shown is not None
    return html.unescape(shown.group(0))


def test_a_refused_contract_leaves_the_model_view_on_the_saved_limits(
    admin_client: Client,
    lookup: McpTool,  # noqa: F811
) -> None:
    lookup.contract.args = {**lookup.contract.args, "limit": {"type": "int", "max": 5}}
    lookup.contract.save()
    refused = post_contract(admin_client, lookup, args__1__max="7", timeout_s="99999")
    assert list(contract_errors(refused)) == ["timeout_s"]
    shown = model_view_text(refused)
    assert '"maximum": 5' in shown and '"maximum": 7' not in shown
    lookup.contract.refresh_from_db()
    assert lookup.contract.args["limit"] == {"type": "int", "max": 5}


# --- on PostgreSQL, where these were 500s ------------------------------------------------------------------------

ON_POSTGRES = r"""
import io, json
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client
from mcpregistry.models import ToolContract
from tests.mcpregistry.test_contract_editor_roundtrip import page_as_posted
# The demo's first contract (seeded through the services; nothing started).
call_command("seed_demo", "--no-discover", stdout=io.StringIO())
contract = ToolContract.objects.select_related("tool").order_by("pk").first()
tool = contract.tool
argument = next(iter(contract.args))
before = [contract.args, contract.returns, contract.retry]
client = Client(SERVER_NAME="localhost", raise_request_exception=False)
client.force_login(get_user_model().objects.get(username="admin"))
url = f"/admin/mcpregistry/mcptool/{tool.pk}/change/"
page = client.get(url).content.decode()
print("RESULT unchanged", client.post(url, page_as_posted(page)).status_code)  # the page as posted saves
for field, typed in [
    ("args__0__pattern", "^a\x00"),
    ("args__0__allowed", "a\x00, b"),
    ("returns__required", "i\x00d"),
    ("returns__fields__0__key", "k\x00"),
    ("contract_json", json.dumps({"args": {argument: {"type": "str", "allowed": ["a\x00"]}}})),
    ("args", json.dumps({argument: {"type": "str", "pattern": "x\x00"}})),
    ("fallback_tool", "a\x00"),
    ("idempotency_arg", "a\x00"),
    ("returns", "null"),
    ("retry", "null"),
]:
    response = client.post(url, page_as_posted(page, **{f"contract-0-{field}": typed}))
    print("RESULT", field, response.status_code)
contract.refresh_from_db()
print("RESULT stored as before", [contract.args, contract.returns, contract.retry] == before)
"""


@pytest.mark.postgres
def test_a_nul_or_a_null_in_a_contract_is_refused_not_a_500_on_postgres(migrated_postgres_url: str) -> None:  # noqa: F811
    # A database of its own, as a fresh migrate leaves it (seed_demo needs one), in the session's cluster: a cluster
    # and a migrate of its own took most of this test's time. (The fixture fails in CI without PostgreSQL.)
    done = manage("shell", "-c", ON_POSTGRES, database_url=migrated_postgres_url, timeout=500)
    assert done.returncode == 0, done.stderr[-3000:]
    results = [line.removeprefix("RESULT ") for line in done.stdout.splitlines() if line.startswith("RESULT")]
    assert results == [
        "unchanged 302",
        "args__0__pattern 200",
        "args__0__allowed 200",
        "returns__required 200",
        "returns__fields__0__key 200",
        "contract_json 200",
        "args 200",
        "fallback_tool 200",
        "idempotency_arg 200",
        "returns 200",
        "retry 200",
        "stored as before True",
    ], done.stdout[-3000:] + done.stderr[-3000:]
