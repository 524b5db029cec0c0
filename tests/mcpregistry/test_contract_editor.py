"""The structured contract editor on a tool's admin page: rows read back into the same JSON, an unchanged page
records no change, the JSON view round-trips with export_config, and errors name the field and valid keys."""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from agents.configuration import config_export
from audit.models import AuditEvent
from mcpregistry.models import McpServer, McpTool, ToolContract

pytestmark = pytest.mark.django_db


@pytest.fixture
def lookup(admin_client: Client) -> McpTool:
    server = McpServer.objects.create(mcp_id="Ledger-Data", name="ledger", command=sys.executable, args=[])
    now = timezone.now()
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "description": "who"}, "limit": {"type": "integer"}},
        "required": ["name"],
    }
    tool = McpTool.objects.create(server=server, name="lookup", input_schema=schema, discovered_at=now)
    ToolContract.objects.create(tool=tool, args={"name": {"type": "str", "required": True}, "limit": {"type": "int"}})
    backup = McpTool.objects.create(
        server=server, name="lookup_backup", input_schema={"type": "object", "required": ["name"]}, discovered_at=now
    )
    McpTool.objects.create(
        server=server, name="report", input_schema={"type": "object", "required": ["period"]}, discovered_at=now
    )
    ToolContract.objects.create(tool=backup, args={"name": {"type": "str", "required": True}})
    return tool


def editor_post(tool: McpTool, **changes: Any) -> dict[str, Any]:
    """What the browser posts for the page as shown (every structured input), with ``changes``."""
    contract = tool.contract
    data: dict[str, Any] = {
        "enabled": "on",
        "contract-TOTAL_FORMS": "1",
        "contract-INITIAL_FORMS": "1",
        "contract-MIN_NUM_FORMS": "0",
        "contract-MAX_NUM_FORMS": "1",
        "contract-0-id": str(contract.pk),
        "contract-0-tool": str(tool.pk),
        "contract-0-risk": contract.risk,
        "contract-0-unknown_args": contract.unknown_args,
        "contract-0-args__editor": "1",
        "contract-0-args__rows": ["0", "1"],
        "contract-0-args__0__name": "name",
        "contract-0-args__0__type": "str",
        "contract-0-args__0__required": "on",
        "contract-0-args__1__name": "limit",
        "contract-0-args__1__type": "int",
        "contract-0-returns__editor": "1",
        "contract-0-retry__editor": "1",
        "contract-0-retry__max_attempts": "3",
        "contract-0-retry__on": ["rate_limit", "timeout", "transport"],
        "contract-0-retry__backoff_base_s": "2.0",  # the default (seed 001: 2 s, then 4 s)
        "contract-0-retry__backoff_cap_s": "8.0",
        "contract-0-retry__honor_retry_after": "on",
        "contract-0-timeout_s": "",
        "contract-0-fallback_tool": "",
        "contract-0-fallback_policy": contract.fallback_policy,
        "contract-0-memo": "on",
        "contract-0-memo_ttl_s": "",
        "contract-0-idempotency_arg": "",
    }
    data.update(changes)
    return {k: v for k, v in data.items() if v is not None}


def post(client: Client, tool: McpTool, **changes: Any) -> tuple[int, str]:
    response = client.post(f"/admin/mcpregistry/mcptool/{tool.pk}/change/", editor_post(tool, **changes))
    return response.status_code, response.content.decode()


def errors(page: str) -> list[str]:
    return [re.sub(r"<[^>]+>", " ", e) for e in re.findall(r'<ul class="errorlist[^>]*>(.*?)</ul>', page, re.S)]


def test_the_editor_shows_one_row_per_argument_and_the_fallback_choices(admin_client, lookup) -> None:
    page = admin_client.get(f"/admin/mcpregistry/mcptool/{lookup.pk}/change/").content.decode()
    assert 'id="contract-0-args-row-name"' in page and 'id="contract-0-args-row-limit"' in page
    assert 'name="contract-0-retry__on" value="timeout" checked' in page
    fallback = re.search(r'<select name="contract-0-fallback_tool".*?</select>', page, re.S).group(0)
    assert "lookup_backup" in fallback
    assert ">lookup<" not in fallback and "report" not in fallback  # never itself; report needs 'period'
    assert "&quot;mcp_id&quot;: &quot;Ledger-Data&quot;" in page  # the JSON view, as export_config writes it


def test_an_unchanged_page_records_no_change(admin_client, lookup) -> None:
    status, page = post(admin_client, lookup)
    assert status == 302, errors(page)
    assert not AuditEvent.objects.filter(action="config.tool_contract.update").exists()


def test_the_fields_become_the_contract(admin_client, lookup) -> None:
    status, page = post(
        admin_client,
        lookup,
        **{
            "contract-0-args__1__min": "1",
            "contract-0-args__1__max": "50",
            "contract-0-args__0__allowed": "김하늘, 이서준",
            "contract-0-args__0__max_length": "20",
            "contract-0-retry__on": ["timeout"],
            "contract-0-retry__max_attempts": "2",
            "contract-0-returns__required": "name, team",
            "contract-0-returns__non_empty": "on",
            "contract-0-timeout_s": "5",
            "contract-0-fallback_tool": "lookup_backup",
        },
    )
    assert status == 302, errors(page)
    contract = ToolContract.objects.get(tool=lookup)
    assert contract.args == {
        "name": {"type": "str", "required": True, "allowed": ["김하늘", "이서준"], "max_length": 20},
        "limit": {"type": "int", "min": 1, "max": 50},
    }
    assert contract.retry == {"max_attempts": 2, "on": ["timeout"]}
    assert contract.returns == {"required": ["name", "team"], "non_empty": True}
    assert (contract.timeout_s, contract.fallback_tool) == (5.0, "lookup_backup")


@pytest.mark.parametrize("timeout", ["-1", "0"])
def test_a_timeout_that_is_not_positive_is_refused_at_its_field(admin_client, lookup, timeout: str) -> None:
    status, page = post(admin_client, lookup, **{"contract-0-timeout_s": timeout})
    assert status == 200
    assert any("more than 0 and at most 3600 seconds" in e for e in errors(page))
    assert re.search(r"field-timeout_s[^>]*>\s*<div>\s*<ul class=\"errorlist", page) or "errors field-timeout_s" in page


def test_an_unknown_key_in_the_json_view_names_the_valid_keys(admin_client, lookup) -> None:
    document = {"args": {"name": {"type": "str", "max_len": 5}}}
    status, page = post(admin_client, lookup, **{"contract-0-contract_json": json.dumps(document)})
    assert status == 200
    [message] = [e for e in errors(page) if "max_len" in e]
    assert "did you mean &#x27;max_length&#x27;?" in message or "did you mean 'max_length'?" in message
    assert "type, required, allowed, min, max, max_length, pattern" in message


def test_a_self_fallback_from_the_json_view_is_refused_at_the_fallback_field(admin_client, lookup) -> None:
    status, page = post(admin_client, lookup, **{"contract-0-contract_json": json.dumps({"fallback": "lookup"})})
    assert status == 200
    assert "errors field-fallback_tool" in page and "cannot be its own fallback" in page


def test_the_json_view_round_trips_with_export_config(admin_client, lookup) -> None:
    [entry] = [c for c in config_export()["contracts"] if c["tool"] == "lookup"]
    args = {"name": {"type": "str", "required": True}, "limit": {"type": "int", "required": False, "max": 9}}
    entry = {**entry, "args": args, "timeout_s": 7.5, "retry": {"max_attempts": 4}, "returns": {"type": "dict"}}
    status, page = post(admin_client, lookup, **{"contract-0-contract_json": json.dumps(entry, ensure_ascii=False)})
    assert status == 302, errors(page)
    [exported] = [c for c in config_export()["contracts"] if c["tool"] == "lookup"]
    assert exported == entry


def test_unticking_a_box_is_saved_and_ticking_it_again_restores_the_default(admin_client, lookup) -> None:
    status, page = post(
        admin_client,
        lookup,
        **{"contract-0-retry__honor_retry_after": None, "contract-0-returns__non_empty": "on"},
    )
    assert status == 302, errors(page)
    contract = ToolContract.objects.get(tool=lookup)
    assert contract.retry == {"honor_retry_after": False} and contract.returns == {"non_empty": True}
    status, page = post(admin_client, contract.tool)
    assert status == 302, errors(page)
    contract.refresh_from_db()
    assert contract.retry == {"honor_retry_after": True} and contract.returns == {}


def field_rows(*rows: dict[str, str], name: str = "contract-0-returns") -> dict[str, Any]:
    """The per-field table as the browser posts it: each row's inputs, then the blank rows it offers."""
    data: dict[str, Any] = {f"{name}__fields__rows": [str(i) for i in range(len(rows) + 2)]}
    for index, row in enumerate(rows):
        data.update({f"{name}__fields__{index}__{key}": value for key, value in row.items()})
    return data


def test_per_field_result_constraints_are_rows_not_json(admin_client, lookup) -> None:
    rows = field_rows(
        {"key": "total", "type": "int", "min": "0", "max": "500"},
        {"key": "직원", "type": "list", "non_empty": "on", "max_items": "20"},
    )
    status, page = post(admin_client, lookup, **rows)
    assert status == 302, errors(page)
    contract = ToolContract.objects.get(tool=lookup)
    assert contract.returns == {
        "fields": {
            "total": {"type": "int", "min": 0, "max": 500},
            "직원": {"type": "list", "non_empty": True, "max_items": 20},
        }
    }
    page = admin_client.get(f"/admin/mcpregistry/mcptool/{lookup.pk}/change/").content.decode()
    assert 'name="contract-0-returns__fields__0__key" value="total"' in page
    assert 'name="contract-0-returns__fields__1__key" value="직원"' in page
    assert page.count('name="contract-0-returns__fields__rows"') == 4  # two keys, two blank rows
    assert "per-field constraints (JSON" not in page and 'name="contract-0-returns__fields"' not in page

    # The page as shown, saved again, changes nothing; a key cleared drops its row's constraints.
    updates = AuditEvent.objects.filter(action="config.tool_contract.update").count()
    assert post(admin_client, lookup, **rows)[0] == 302
    assert AuditEvent.objects.filter(action="config.tool_contract.update").count() == updates
    status, page = post(admin_client, lookup, **field_rows({"key": ""}, {"key": "total", "type": "int", "min": "0"}))
    assert status == 302, errors(page)
    contract.refresh_from_db()
    assert contract.returns == {"fields": {"total": {"type": "int", "min": 0}}}
    status, page = post(admin_client, lookup, **field_rows({"key": "total"}))
    assert status == 302, errors(page)
    contract.refresh_from_db()
    assert contract.returns == {"fields": {"total": {}}}


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (({"key": "total", "type": "int"}, {"key": "total", "min": "1"}), "total is on two rows; keep one."),
        (({"key": "total", "min": "many"},), "returns.fields.total.min"),
        (({"key": "total", "min": "5", "max": "1"},), "returns.fields.total"),
    ],
)
def test_a_per_field_row_that_cannot_be_kept_is_refused_naming_it(admin_client, lookup, rows, message) -> None:
    status, page = post(admin_client, lookup, **field_rows(*rows))
    assert status == 200
    assert any(message in e for e in errors(page)), errors(page)
    assert ToolContract.objects.get(tool=lookup).returns == {}


def test_the_idempotency_argument_is_chosen_among_the_tools_arguments(admin_client, lookup) -> None:
    page = admin_client.get(f"/admin/mcpregistry/mcptool/{lookup.pk}/change/").content.decode()
    select = re.search(r'<select name="contract-0-idempotency_arg".*?</select>', page, re.S).group(0)
    assert re.findall(r'<option value="([^"]*)"', select) == ["", "limit", "name"]
    status, page = post(admin_client, lookup, **{"contract-0-risk": "write", "contract-0-idempotency_arg": "name"})
    assert status == 302, errors(page)
    assert ToolContract.objects.get(tool=lookup).idempotency_arg == "name"
    # A name the tool does not take would be sent unnoticed (the gate adds it after the checks): refused.
    status, page = post(admin_client, lookup, **{"contract-0-idempotency_arg": "request_id"})
    assert status == 200
    assert any(
        "&#x27;request_id&#x27; is not an argument of lookup; choose one of: limit, name." in e for e in errors(page)
    )
    assert ToolContract.objects.get(tool=lookup).idempotency_arg == "name"


@pytest.mark.parametrize("typed", ["nan", "inf", "-Infinity", "1e400", "1" + "0" * 5000])
def test_a_limit_that_is_no_finite_number_is_refused_at_its_field_not_a_server_error(
    admin_client, lookup, typed: str
) -> None:
    """NaN and the infinities are no limit, and no JSON column stores them: the save used to be a 500 (the
    database's JSON check refused the row)."""
    status, page = post(admin_client, lookup, **{"contract-0-args__1__min": typed})
    assert status == 200
    assert any("limit.min: must be a finite number" in e for e in errors(page)), errors(page)
    status, page = post(admin_client, lookup, **field_rows({"key": "total", "type": "int", "max": typed}))
    assert status == 200
    assert any("returns.fields.total.max: must be a finite number" in e for e in errors(page)), errors(page)
    assert ToolContract.objects.get(tool=lookup).args.get("limit", {}).get("min") is None


def test_json_nested_past_any_contract_is_refused_not_a_server_error(admin_client, lookup) -> None:
    status, page = post(admin_client, lookup, **{"contract-0-contract_json": "[" * 5000 + "]" * 5000})
    assert status == 200
    assert any("nested too deeply" in e for e in errors(page)), errors(page)


def test_an_argument_the_tools_input_schema_does_not_have_is_refused(admin_client, lookup) -> None:
    """It used to be saved and shown to the model beside the real ones; every call that used it was the server's
    refusal."""
    document = {"args": {"teamz": {"type": "str"}}}
    status, page = post(admin_client, lookup, **{"contract-0-contract_json": json.dumps(document)})
    assert status == 200
    assert any(
        "teamz: the tool&#x27;s input schema has no such argument (its arguments: limit, name)" in e
        for e in errors(page)
    ), errors(page)


@pytest.mark.parametrize("field", ["args", "returns", "retry"])
def test_a_contract_field_posted_as_json_nested_too_deeply_is_refused_not_a_server_error(
    admin_client, lookup, field: str
) -> None:
    """As a script posts it: the field's JSON itself, without the editor's inputs (the inline's fields were
    Django's JSON field, which lets the RecursionError through)."""
    data = {k: v for k, v in editor_post(lookup).items() if not k.startswith(f"contract-0-{field}__")}
    data[f"contract-0-{field}"] = "[" * 5000 + "]" * 5000
    response = admin_client.post(f"/admin/mcpregistry/mcptool/{lookup.pk}/change/", data)
    assert response.status_code == 200
    assert any("nested too deeply" in e for e in errors(response.content.decode())), errors(response.content.decode())
