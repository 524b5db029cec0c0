"""Defects of ``import_config``, the settings' path and zone variables and ``agent_version``:

1. A contract entry replaced the whole contract: every key it left out fell back to the entry model's default
   (arguments, retries, fallback and returns emptied, risk ``read``: a write tool's calls stopped asking for an
   approval), and ``--dry-run`` named no field. A key left out now keeps the stored value.
2. ``PLATFORM_VAR_DIR=``, ``AUDIT_CHAIN_KEY_FILE=``, ``AUDIT_ANCHOR_PATH=`` and ``TIME_ZONE=`` were taken as
   given (the current folder, a folder as a key file, no zone): blank is now the default.
3. ``agent_version publish --note`` cut a long note to 500 characters unsaid; its number and rate arguments were
   refused in argparse's English.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command

from agents.configuration import config_export, config_import
from agents.management.commands.agent_version import Command
from agents.models import AgentVersion
from agents.services import agent_version_publish
from audit.models import AuditEvent
from mcpregistry.models import McpServer, ToolContract
from mcpregistry.services import tool_contract_update
from tests.conftest import make_agent
from tests.e2e.harness import _SETUP_VARIABLES, ROOT

TOOL = "get_asset_status"


def stored_contract(server: McpServer, tool: str = TOOL) -> ToolContract:
    return ToolContract.objects.get(tool__server=server, tool__name=tool)


def contract_values(contract: ToolContract) -> dict[str, Any]:
    return {
        name: getattr(contract, name)
        for name in ("args", "returns", "retry", "fallback_tool", "risk", "memo", "correction_cap", "timeout_s")
    }


def write_document(tmp_path: Path, document: dict[str, Any]) -> str:
    path = tmp_path / "platform.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    return str(path)


# ---- 1. a contract entry changes only the keys it gives ------------------------------------------------------


@pytest.mark.django_db
def test_a_contract_entry_giving_only_a_timeout_keeps_the_rest_of_the_contract(demo_server: McpServer) -> None:
    before = contract_values(stored_contract(demo_server))
    assert before["args"] and before["retry"] and before["fallback_tool"]  # the demo's contract, as seeded
    last = AuditEvent.objects.order_by("-id").values_list("id", flat=True).first()

    report = config_import(
        actor="test", document={"contracts": [{"mcp_id": "sds-company-data", "tool": TOOL, "timeout_s": 3}]}
    )

    assert contract_values(stored_contract(demo_server)) == {**before, "timeout_s": 3.0}
    assert report.updated == [f"contract sds-company-data.{TOOL} (timeout_s)"]
    (event,) = AuditEvent.objects.filter(id__gt=last, action="config.tool_contract.update")
    assert event.args == {"timeout_s": [2.0, 3.0]}  # the audited change: nothing else


@pytest.mark.django_db
def test_a_write_contract_stays_write_when_its_entry_leaves_the_risk_out(demo_server: McpServer) -> None:
    contract = stored_contract(demo_server)
    tool_contract_update(contract=contract, actor="test-admin", via="tests", data={"risk": "write"})

    config_import(actor="test", document={"contracts": [{"mcp_id": "sds-company-data", "tool": TOOL, "memo": False}]})

    assert stored_contract(demo_server).risk == ToolContract.Risk.WRITE
    assert stored_contract(demo_server).memo is False


@pytest.mark.django_db
def test_a_contract_made_before_discovery_without_a_risk_is_write_as_discovery_proposes() -> None:
    server = {"mcp_id": "docs", "transport": "streamable_http", "url": "https://docs.example.com/mcp"}

    config_import(
        actor="test", document={"servers": [server], "contracts": [{"mcp_id": "docs", "tool": "search_docs"}]}
    )

    assert stored_contract(McpServer.objects.get(mcp_id="docs"), "search_docs").risk == ToolContract.Risk.WRITE


@pytest.mark.django_db
def test_a_full_contract_entry_still_replaces_the_contract(demo_server: McpServer) -> None:
    tool_contract_update(contract=stored_contract(demo_server), actor="test-admin", via="tests", data={"risk": "write"})
    entry = {
        "mcp_id": "sds-company-data",
        "tool": TOOL,
        "args": {},
        "unknown_args": "drop",
        "returns": {},
        "retry": None,
        "timeout_s": None,
        "fallback": None,
        "fallback_policy": "suggest",
        "risk": "read",
        "memo": True,
        "memo_ttl_s": None,
        "idempotency_arg": "",
        "correction_cap": 1,
    }

    config_import(actor="test", document={"contracts": [entry]})

    contract = stored_contract(demo_server)
    assert (contract.args, contract.retry, contract.fallback_tool, contract.risk) == ({}, {}, "", "read")
    assert (contract.unknown_args, contract.correction_cap) == ("drop", 1)


@pytest.mark.django_db
def test_an_export_imported_again_changes_no_contract(demo_server: McpServer) -> None:
    document = config_export()

    report = config_import(actor="test", document={"contracts": document["contracts"]})

    assert not report.updated and not report.created
    assert len(report.unchanged) == len(document["contracts"]) > 0


@pytest.mark.django_db
def test_a_dry_run_names_the_fields_an_updated_contract_would_change(demo_server: McpServer, tmp_path: Path) -> None:
    entry = {"mcp_id": "sds-company-data", "tool": TOOL, "timeout_s": 3, "correction_cap": 1}
    out = io.StringIO()

    call_command("import_config", write_document(tmp_path, {"contracts": [entry]}), "--dry-run", stdout=out)

    assert f"would be updated: contract sds-company-data.{TOOL} (correction_cap, timeout_s)" in out.getvalue()
    assert stored_contract(demo_server).timeout_s != 3


# ---- 2. a blank path or zone variable is its default ---------------------------------------------------------

# Loads the settings again for each environment given; prints the four settings as text (or the error that
# stopped them loading).
LOAD_EACH = """
import importlib, json, os, sys

NAMES = ("VAR_DIR", "AUDIT_CHAIN_KEY_FILE", "AUDIT_ANCHOR_PATH", "TIME_ZONE")


def load(env):
    for name in ("agent_platform.settings", "agent_platform.settings_api", "agent_platform.settings_deploy"):
        sys.modules.pop(name, None)
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        module = importlib.import_module("agent_platform.settings")
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return {name: str(getattr(module, name)) for name in NAMES}


print(json.dumps({label: load(env) for label, env in json.loads(sys.argv[1]).items()}))
"""
PATH_AND_ZONE_VARIABLES = ("PLATFORM_VAR_DIR", "AUDIT_CHAIN_KEY_FILE", "AUDIT_ANCHOR_PATH", "TIME_ZONE")


@pytest.fixture(scope="module")
def settings_loaded(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    """Each variable blank and only spaces, loaded in a fresh process run in an empty folder (a blank
    ``PLATFORM_VAR_DIR`` made that folder the platform's). Returns the settings by case, and the folder."""
    folder = tmp_path_factory.mktemp("cwd")
    var_dir = tmp_path_factory.mktemp("paths") / "var"
    cases = {"unset": {}} | {
        f"{name}={value!r}": {name: value} for name in PATH_AND_ZONE_VARIABLES for value in ("", "  ")
    }
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(_SETUP_VARIABLES)},
        "PLATFORM_VAR_DIR": str(var_dir),
        "PYTHONPATH": str(ROOT),
    }
    for name in PATH_AND_ZONE_VARIABLES[1:]:
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, "-c", LOAD_EACH, json.dumps(cases)],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1]), folder


@pytest.mark.parametrize("name", PATH_AND_ZONE_VARIABLES)
def test_a_path_or_zone_variable_left_blank_is_its_default(
    settings_loaded: tuple[dict[str, Any], Path], name: str
) -> None:
    loaded, _folder = settings_loaded
    if name == "PLATFORM_VAR_DIR":
        # Its default is the checkout's var/, and the files under it follow.
        default = {
            **loaded["unset"],
            "VAR_DIR": str(ROOT / "var"),
            "AUDIT_CHAIN_KEY_FILE": str(ROOT / "var" / "audit_chain_key"),
            "AUDIT_ANCHOR_PATH": str(ROOT / "var" / "audit_anchors.jsonl"),
        }
    else:
        default = loaded["unset"]
    assert loaded[f"{name}=''"] == default
    assert loaded[f"{name}='  '"] == default


def test_a_blank_var_dir_writes_nothing_in_the_current_folder(settings_loaded: tuple[dict[str, Any], Path]) -> None:
    _loaded, folder = settings_loaded
    assert list(folder.iterdir()) == []


# ---- 3. agent_version --------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_publishing_a_note_longer_than_a_version_keeps_is_refused() -> None:
    agent = make_agent(slug="versioned", servers=[], with_demo_rules=False)

    with pytest.raises(ValidationError) as refused:
        agent_version_publish(agent=agent, actor="test", via="tests", note="n" * 501)

    assert refused.value.message_dict == {"note": ["A version's note has at most 500 characters; this one has 501."]}
    assert not AgentVersion.objects.exists()


@pytest.mark.django_db
def test_agent_version_publish_refuses_a_long_note_and_keeps_one_that_fits() -> None:
    make_agent(slug="versioned", servers=[], with_demo_rules=False)

    with pytest.raises(CommandError, match="at most 500 characters; this one has 5000"):
        call_command("agent_version", "publish", "versioned", "--note", "n" * 5000, stdout=io.StringIO())
    assert not AgentVersion.objects.exists()

    call_command("agent_version", "publish", "versioned", "--note", "n" * 500, stdout=io.StringIO())
    assert AgentVersion.objects.get().note == "n" * 500


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("args", "refusal"),
    [
        (["rollback", "versioned", "one"], "argument number: a whole number, e.g. 2"),
        (["rollback", "versioned", "0"], "argument number: a whole number, 1 or more"),
        (["diff", "versioned", "1", "x"], "argument new: a whole number, e.g. 2"),
        (["shadow", "versioned", "1", "--rate", "often"], "argument --rate: a share from 0 to 1, e.g. 0.1"),
        (["shadow", "versioned", "1", "--rate", "nan"], "argument --rate: a share from 0 to 1, e.g. 0.1"),
        (["shadow", "versioned", "1", "--rate", "2"], "argument --rate: a share from 0 to 1, e.g. 0.1"),
    ],
)
def test_agent_version_refuses_a_number_in_the_platforms_words(args: list[str], refusal: str) -> None:
    make_agent(slug="versioned", servers=[], with_demo_rules=False)

    with pytest.raises(CommandError) as refused:
        call_command("agent_version", *args, stdout=io.StringIO())

    assert refusal in str(refused.value)
    assert "invalid" not in str(refused.value)


def test_agent_version_options_say_what_they_take() -> None:
    parser = Command().create_parser("manage.py", "agent_version")
    actions = next(action for action in parser._actions if action.dest == "action").choices
    helps = {
        option: action.help
        for name in ("publish", "shadow")
        for action in actions[name]._actions
        for option in action.option_strings
    }
    assert helps["--note"] and helps["--rate"]
