"""Configuration as code keeps its promises (an export re-imports unchanged, the text is the same after any round
trip, all-or-nothing, every error names its entry and key) where it did not:

2. a ``tools[]`` or ``contracts[]`` entry naming a tool a discovered server did not list is refused, naming its
   tools (registered, it was offered to the model); a name given before discovery is checked as discovery checks
   a listed one;
3. two rules of one name for an agent (the admin allows them) re-import as themselves: keyed by occurrence,
   ranked in the document as the stored rules are (``order``, then place), so two listed out of ``order`` do not
   trade contents on every import;
4. a contract's arguments and limits are stored as written: no ``"required": false`` added, 1 not made 1.0;
5. an environment name no process takes (``""``, ``A=B``, a NUL) is refused, naming it;
6. whether a fallback the gate calls is a write no longer depends on the order of the contracts in a document;
7. an unquoted YAML ``on:`` key is the text ``on``; a YAML error and a number past Python's digit limit are told in
   the reader's language with their line and column.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ValidationError

from agent_platform.errors import ApplicationError
from agents.configuration import config_export, config_import, load_document
from agents.models import Agent, DeterministicRule
from agents.services import deterministic_rule_update
from audit.models import AuditEvent
from mcpregistry.models import McpServer, McpTool, ToolContract
from mcpregistry.services import mcp_server_update, mcp_tool_create, tool_contract_update
from tests.agents.test_configuration import document
from tests.agents.test_configuration_versions import emptied, with_secrets

pytestmark = pytest.mark.django_db

DEMO = "sds-company-data"


@pytest.fixture(autouse=True)
def _docs_token_may_be_passed_through(settings) -> None:  # type: ignore[no-untyped-def]
    settings.PLATFORM_MCP_ENV_PASSTHROUGH = ["DOCS_TOKEN"]


def refused(doc: dict[str, Any]) -> str:
    """The import's message for ``doc``; it must have changed nothing."""
    before = AuditEvent.objects.count()
    with pytest.raises(ApplicationError) as failure:
        config_import(actor="t", document=doc)
    assert AuditEvent.objects.count() == before
    return failure.value.message


def text(doc: dict[str, Any]) -> str:
    return json.dumps(doc, ensure_ascii=False, indent=2)


def re_imports_unchanged(exported: dict[str, Any]) -> None:
    before = AuditEvent.objects.count()
    report = config_import(actor="t", document=exported)
    assert not report.created and not report.updated and not report.deleted
    assert AuditEvent.objects.count() == before


# --- 2. a tool the server does not have -----------------------------------------------------------------------


def test_a_tool_a_discovered_server_did_not_list_is_refused_naming_its_tools(demo_server: McpServer) -> None:
    tools = McpTool.objects.count()
    message = refused(
        {
            "tools": [{"mcp_id": DEMO, "tool": "get asset status!", "tags": ["자산"]}],
            "contracts": [{"mcp_id": DEMO, "tool": "get_asset_statsu", "risk": "read"}],
        }
    )
    assert "tools[0] (sds-company-data.get asset status!): tool: 'get asset status!' is not a tool of this " in message
    assert "contracts[0] (sds-company-data.get_asset_statsu): tool: 'get_asset_statsu' is not a tool of " in message
    assert "its tools are: " in message and "get_asset_status, get_asset_status_backup" in message
    assert McpTool.objects.count() == tools


def test_a_name_given_before_discovery_is_checked_as_discovery_checks_a_listed_one() -> None:
    doc = document()
    doc["tools"] = [{"mcp_id": "company", "tool": "get\x07asset", "tags": ["x"]}]
    doc["contracts"][0]["tool"] = "get_asset\nstatus"
    message = refused(doc)
    assert "tools[0] (company.get\x07asset): tool: a name with control characters" in message
    assert "contracts[0] (company.get_asset\nstatus): tool: a name with control characters" in message
    # What the service registers, whoever calls it.
    config_import(actor="t", document=document())
    with pytest.raises(ValidationError, match="control characters"):
        mcp_tool_create(server=McpServer.objects.get(mcp_id="company"), name="a\x1bb", actor="t", via="tests")


# --- 3. two rules of one name ---------------------------------------------------------------------------------


def test_two_rules_of_one_name_re_import_as_themselves_and_round_trip(demo_agent: Agent) -> None:
    for order, asset in ((40, "A-1001"), (50, "A-1002")):
        rule = DeterministicRule(
            agent=demo_agent,
            server=demo_agent.servers.get(),
            name="자산 조회",
            order=order,
            tool_name="get_asset_status",
            when={"any_keywords": [asset]},
            params={"asset_id": asset},
        )
        deterministic_rule_update(rule=rule, actor="t", via="tests")
    exported = config_export()
    assert [r["params"] for r in exported["rules"] if r["name"] == "자산 조회"] == [
        {"asset_id": "A-1001"},
        {"asset_id": "A-1002"},
    ]
    re_imports_unchanged(exported)

    emptied()
    config_import(actor="t", document=with_secrets(exported))
    assert DeterministicRule.objects.filter(name="자산 조회").count() == 2
    assert text(config_export()) == text(exported)


def test_two_rules_of_one_name_listed_out_of_order_import_once_and_then_unchanged(demo_agent: Agent) -> None:
    def rule(order: int, asset: str) -> dict[str, Any]:
        return {
            "agent": demo_agent.slug,
            "name": "자산 조회",
            "order": order,
            "mcp_id": DEMO,
            "tool": "get_asset_status",
            "when": {"any_keywords": [asset]},
            "params": {"asset_id": asset},
        }

    doc = {"rules": [rule(50, "A-1001"), rule(40, "A-1002")]}
    first = config_import(actor="t", document=doc)
    assert len(first.created) == 2
    rows = DeterministicRule.objects.filter(name="자산 조회").order_by("id")
    stored = list(rows.values_list("id", "order", "params"))
    assert sorted((order, params["asset_id"]) for _id, order, params in stored) == [(40, "A-1002"), (50, "A-1001")]
    for _again in range(2):
        re_imports_unchanged(doc)  # the rows keep their contents: none is updated, no audit event is written
        assert list(rows.values_list("id", "order", "params")) == stored


# --- 4. a contract as written ---------------------------------------------------------------------------------


def test_a_contracts_arguments_and_limits_are_stored_as_written_and_round_trip_as_text() -> None:
    doc = document()
    doc["contracts"][0].update(
        args={
            "asset_id": {"type": "str", "pattern": "^A-[0-9]{4}$"},
            "limit": {"type": "int", "min": 1, "max": 10, "allowed": None},
        },
        returns={"required": ["status"], "fields": {"count": {"type": "int", "min": 0, "max": 5}}},
        retry={"max_attempts": 2, "backoff_base_s": 1, "backoff_cap_s": 4},
    )
    config_import(actor="t", document=doc)
    contract = ToolContract.objects.get()
    # Left out stays out (no "required": false); a null is no limit; 1 stays 1.
    assert text(contract.args) == text(
        {"asset_id": {"type": "str", "pattern": "^A-[0-9]{4}$"}, "limit": {"type": "int", "min": 1, "max": 10}}
    )
    assert text(contract.returns) == text(
        {"required": ["status"], "fields": {"count": {"type": "int", "min": 0, "max": 5}}}
    )
    assert text(contract.retry) == text({"max_attempts": 2, "backoff_base_s": 1, "backoff_cap_s": 4})
    exported = config_export()
    re_imports_unchanged(exported)

    emptied()
    config_import(actor="t", document=with_values(exported))
    assert text(config_export()) == text(exported)


def with_values(exported: dict[str, Any]) -> dict[str, Any]:
    """The export with each stored secret given, as an operator importing it elsewhere would."""
    doc: dict[str, Any] = json.loads(text(exported))
    for server in doc["servers"]:
        server["env"] = {
            name: {"value": f"given-{name}"} if spec == {"set": True} else spec for name, spec in server["env"].items()
        }
    return doc


# --- 5. environment names -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["A=B", ""])
def test_an_environment_name_no_process_takes_is_refused_by_import(name: str) -> None:
    doc = document()
    doc["servers"][0]["env"][name] = {"value": "x"}
    message = refused(doc)
    assert (
        f"servers[0] (company): env: Environment variable {json.dumps(name)}: a name may not be empty or hold '=' "
        "or a NUL character." in message
    )


def test_the_model_refuses_an_environment_name_with_a_nul_and_keeps_one_stored_before() -> None:
    config_import(actor="t", document=document())
    server = McpServer.objects.get(mcp_id="company")
    with pytest.raises(ValidationError) as refusal:
        mcp_server_update(server=server, actor="t", via="tests", data={"env": {**server.env, "A\x00B": "x"}})
    assert refusal.value.message_dict["env"] == [
        "Environment variable \"A\\u0000B\": a name may not be empty or hold '=' or a NUL character."
    ]
    # A server stored before the check still saves where the name stays.
    McpServer.objects.filter(pk=server.pk).update(env={**server.env, "A=B": "x"})
    server = McpServer.objects.get(pk=server.pk)
    mcp_server_update(server=server, actor="t", via="tests", data={"timeout_s": 20})


# --- 6. a fallback the gate calls, whatever the order -----------------------------------------------------------


def fallback_pair(*, caller_first: bool, policy: str = "call", risk: str = "write") -> dict[str, Any]:
    caller = {"mcp_id": "company", "tool": "lookup", "fallback": "backup", "fallback_policy": policy, "risk": "read"}
    backup = {"mcp_id": "company", "tool": "backup", "risk": risk}
    doc = document()
    doc["contracts"] = [caller, backup] if caller_first else [backup, caller]
    return doc


def test_a_call_fallback_that_is_a_write_is_refused_in_either_order() -> None:
    message = refused(fallback_pair(caller_first=True))
    assert "contracts[1] (company.backup): risk: The gate calls this tool as the fallback of 'lookup'" in message
    message = refused(fallback_pair(caller_first=False))
    assert "contracts[1] (company.lookup): fallback_policy: The fallback tool 'backup' writes" in message
    assert not ToolContract.objects.exists()


def test_what_a_document_leaves_is_checked_not_the_order_it_applies_in() -> None:
    config_import(actor="t", document=fallback_pair(caller_first=True, policy="suggest"))
    # The backup becomes a read as the caller starts calling it: refused, entry by entry, for the stored write.
    config_import(actor="t", document=fallback_pair(caller_first=True, risk="read"))
    assert ToolContract.objects.get(tool__name="lookup").fallback_policy == "call"
    # And back: the caller stops calling it as the backup becomes a write, in the order that checked the write first.
    config_import(actor="t", document=fallback_pair(caller_first=False, policy="suggest"))
    assert ToolContract.objects.get(tool__name="backup").risk == "write"


def test_a_contract_called_as_a_fallback_cannot_become_a_write_through_the_service() -> None:
    config_import(actor="t", document=fallback_pair(caller_first=True, risk="read"))
    backup = ToolContract.objects.get(tool__name="backup")
    with pytest.raises(ValidationError) as refusal:
        tool_contract_update(contract=backup, actor="t", via="tests", data={"risk": "write"})
    assert "the fallback of 'lookup'" in refusal.value.message_dict["risk"][0]


# --- 7. YAML as written, errors as the reader reads them ------------------------------------------------------


def test_an_unquoted_on_key_is_the_text_on(tmp_path: Path) -> None:
    path = tmp_path / "platform.yaml"
    path.write_text(
        f"servers:\n- mcp_id: company\n  command: {sys.executable}\n  args: [-m, json.tool]\n"
        "contracts:\n- mcp_id: company\n  tool: lookup\n  retry:\n    on: [timeout]\n    max_attempts: 2\n",
        encoding="utf-8",
    )
    loaded = load_document(path)
    assert loaded["contracts"][0]["retry"] == {"on": ["timeout"], "max_attempts": 2}
    config_import(actor="t", document=loaded)
    assert ToolContract.objects.get().retry == {"on": ["timeout"], "max_attempts": 2}


@pytest.mark.parametrize(
    ("name", "written", "told"),
    [
        ("flow.yaml", "servers: [1, 2\n", "a comma or ']' was expected, at line 2, column 1"),
        ("colon.yaml", "agents:\n- slug: a: b\n", "a colon where no value may start (quote a text that holds ': ')"),
        ("quote.yaml", 'agents:\n- slug: "a\n', "a quoted text is not closed, at line 2, column 9"),
        ("tab.yaml", "agents:\n\t- slug: a\n", "a tab where YAML takes none (indent with spaces), at line 2, column 1"),
        ("digits.yaml", "rules:\n- order: " + "1" * 5000 + "\n", "a number with more than 4300 digits, at line 2, column 10"),
        ("digits.json", '{"rules": [{"name": "' + "7" * 5000 + '", "order": ' + "1" * 5000 + "}]}",
         "a number with more than 4300 digits, at line 1, column 5034"),
        # libyaml's own limit, past which it said "exceeded maximum nesting depth" in English in a Korean message
        ("deep.yaml", "servers: " + "[" * 5000, "nested too deeply, at line 1, column"),
    ],
)  # fmt: skip
def test_a_parse_error_is_told_in_the_readers_words_with_its_line_and_column(
    tmp_path: Path, name: str, written: str, told: str
) -> None:
    path = tmp_path / name
    path.write_text(written, encoding="utf-8")
    with pytest.raises(ApplicationError) as refusal:
        load_document(path)
    assert told in refusal.value.message
    assert "<unicode string>" not in refusal.value.message
    assert "set_int_max_str_digits" not in refusal.value.message
