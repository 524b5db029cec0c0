"""Commands that did what their reader did not ask (review of the configuration and audit commands):

1. ``import_config`` bound an agent to two servers exposing the same tool name (the admin's form refuses it), and
   every run of the agent then failed ``config:tool_name_conflict``;
2. a re-run of ``seed_demo`` (``bin/up`` runs it on every start) set an admin's changes back to the seed's: a tool
   marked ``write`` was ``read`` again, the agent's name, prompt, limits and rules the seed's;
3. ``archive_audit --output`` and ``audit_anchor`` on a path they cannot write ended in a traceback;
4. ``create_api_key --agents ""`` issued a key for every agent;
5. ``agent_version shadow AGENT off`` set the shadow's sample rate to 1;
6. libyaml's words for an unclosed bracket or an escape naming no character reached the reader untranslated.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import translation

from agent_platform.errors import ApplicationError
from agents.configuration import config_import, load_document
from agents.models import Agent, ApiKey, DeterministicRule
from agents.services import (
    agent_create,
    agent_delete,
    agent_shadow_set,
    agent_update,
    agent_version_publish,
    deterministic_rule_delete,
    deterministic_rule_update,
)
from audit.models import AuditCheckpoint, AuditEvent
from audit.services import audit_event_record
from mcpregistry.models import McpServer, RequestCategory, ToolContract
from mcpregistry.services import mcp_server_update, request_category_update, tool_contract_update

pytestmark = pytest.mark.django_db


def config_events_after(mark: int) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(id__gt=mark, action__startswith="config.").order_by("id"))


def last_event_id() -> int:
    return AuditEvent.objects.order_by("-id").values_list("id", flat=True).first() or 0


# ---- 1. import_config and tools of one name ------------------------------------------------------------------


def two_servers_with_ping(**second: Any) -> dict[str, Any]:
    server = {"transport": "stdio", "command": sys.executable, "args": ["-m", "json.tool"]}
    return {
        "servers": [{"mcp_id": "sa", "name": "A", **server}, {"mcp_id": "sb", "name": "B", **server, **second}],
        "contracts": [
            {"mcp_id": "sa", "tool": "ping", "risk": "read"},
            {"mcp_id": "sb", "tool": "ping", "risk": "read"},
        ],
        "agents": [{"slug": "dup", "name": "Dup", "servers": ["sa", "sb"]}],
    }


@pytest.mark.parametrize("dry_run", [False, True])
def test_import_refuses_an_agent_whose_servers_expose_the_same_tool_name(dry_run: bool) -> None:
    with pytest.raises(ApplicationError) as refused:
        config_import(actor="test", document=two_servers_with_ping(), dry_run=dry_run)
    assert "agents[0] (dup): servers: These servers expose the same tool name: ping (sa, sb)." in refused.value.message
    assert not McpServer.objects.exists() and not Agent.objects.exists()


def test_import_config_dry_run_names_the_agent_whose_servers_expose_the_same_tool_name(tmp_path: Path) -> None:
    path = tmp_path / "dup.json"
    path.write_text(json.dumps(two_servers_with_ping()), encoding="utf-8")
    with pytest.raises(CommandError, match=r"agents\[0\] \(dup\): servers: These servers expose the same tool name"):
        call_command("import_config", str(path), "--dry-run", stdout=io.StringIO(), stderr=io.StringIO())


def test_import_takes_the_same_tool_name_behind_a_prefix() -> None:
    config_import(actor="test", document=two_servers_with_ping(tool_prefix="b_"))
    assert list(Agent.objects.get(slug="dup").servers.order_by("mcp_id").values_list("mcp_id", flat=True)) == [
        "sa",
        "sb",
    ]


# ---- 2. seed_demo run again ----------------------------------------------------------------------------------


def seed(*options: str) -> str:
    out = io.StringIO()
    call_command("seed_demo", "--admin-username", "demo-admin", *options, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_seed_demo_run_again_keeps_what_an_admin_changed() -> None:
    seed("--no-discover")
    agent = Agent.objects.get(slug="company-assistant")
    local = McpServer.objects.get(mcp_id="local")
    demo = McpServer.objects.get(mcp_id="sds-company-data")
    calculate = ToolContract.objects.get(tool__server=local, tool__name="calculate")
    tool_contract_update(contract=calculate, actor="admin", via="admin", data={"risk": "write", "timeout_s": 9.0})
    agent_update(
        agent=agent,
        actor="admin",
        via="admin",
        data={"name": "우리 회사 도우미", "system_prompt": "운영자가 고친 프롬프트", "max_iterations": 3},
        servers=[demo, local],
    )
    rule = DeterministicRule.objects.get(agent=agent, name="직원 보유 자산 조회")
    deterministic_rule_update(rule=rule, actor="admin", via="admin", data={"enabled": False, "order": 99})
    deleted = DeterministicRule.objects.get(agent=agent, name="증감 계산")
    deterministic_rule_delete(rule=deleted, actor="admin", via="admin")
    category = RequestCategory.objects.get(department="인사팀")
    request_category_update(category=category, actor="admin", via="admin", data={"keywords": ["휴가"]})
    mcp_server_update(server=demo, actor="admin", via="admin", data={"session_scope": "per_run"})
    mcp_server_update(server=local, actor="admin", via="admin", data={"timeout_s": 3.0})
    mark = last_event_id()

    said = seed("--no-discover")

    assert config_events_after(mark) == []
    agent.refresh_from_db()
    assert (agent.name, agent.system_prompt, agent.max_iterations) == ("우리 회사 도우미", "운영자가 고친 프롬프트", 3)
    rule.refresh_from_db()
    assert (rule.enabled, rule.order) == (False, 99)
    assert not DeterministicRule.objects.filter(agent=agent, name="증감 계산").exists()
    calculate.refresh_from_db()
    assert (calculate.risk, calculate.timeout_s) == ("write", 9.0)
    assert RequestCategory.objects.get(department="인사팀").keywords == ["휴가"]
    assert McpServer.objects.get(mcp_id="sds-company-data").session_scope == "per_run"
    assert McpServer.objects.get(mcp_id="local").timeout_s == 3.0
    assert "kept agent company-assistant with its settings, servers and rules as they are" in said
    assert "kept MCP server sds-company-data and its settings as they are" in said
    assert "local: kept the contracts of 2 tools as they are" in said


def test_seed_demo_run_again_creates_a_missing_agent_with_its_rules() -> None:
    seed("--no-discover")
    agent_delete(agent=Agent.objects.get(slug="company-assistant"), actor="admin", via="admin")

    said = seed("--no-discover")

    agent = Agent.objects.get(slug="company-assistant")
    assert agent.rules.count() == 7
    assert set(agent.servers.values_list("mcp_id", flat=True)) == {"sds-company-data", "local"}
    assert "created agent company-assistant with 7 rules" in said


@pytest.mark.slow
def test_seed_demo_run_again_keeps_a_demo_tool_an_admin_marked_write() -> None:
    said = seed()
    assert "bound MCP server sds-company-data; agent company-assistant with 7 rules" in said
    demo_contracts = ToolContract.objects.filter(tool__server__mcp_id="sds-company-data")
    assert set(demo_contracts.values_list("risk", flat=True)) == {"read"}  # a fresh seed as before
    count = demo_contracts.count()
    get_asset = demo_contracts.get(tool__name="get_asset")
    tool_contract_update(contract=get_asset, actor="admin", via="admin", data={"risk": "write"})
    status = demo_contracts.get(tool__name="get_asset_status")
    tool_contract_update(contract=status, actor="admin", via="admin", data={"timeout_s": 7.0})

    said = seed()

    get_asset.refresh_from_db()
    status.refresh_from_db()
    assert (get_asset.risk, status.timeout_s) == ("write", 7.0)
    assert f"sds-company-data: kept the contracts of {count} tools as they are" in said


# ---- 3. archive_audit and audit_anchor on a path they cannot write ---------------------------------------------


def record_events(count: int) -> None:
    for i in range(count):
        audit_event_record(source="agent", mcp_id="demo", tool="search_employee", args={"i": i}, result={})


@pytest.fixture
def a_file(tmp_path: Path) -> Path:
    path = tmp_path / "a-file"
    path.write_text("not a folder", encoding="utf-8")
    return path


def test_archive_audit_under_a_file_is_refused_naming_the_path_and_nothing_is_deleted(a_file: Path) -> None:
    record_events(3)
    output = a_file / "old.jsonl.gz"
    with pytest.raises(CommandError) as refused:
        call_command("archive_audit", "--older-than-days", "0", "--output", str(output), stderr=io.StringIO())
    assert str(refused.value) == f"cannot write {output}: a part of the path is not a folder"
    assert AuditEvent.objects.count() == 3 and not AuditCheckpoint.objects.exists()


def test_archive_audit_that_cannot_write_its_file_says_why_in_the_readers_language(tmp_path: Path) -> None:
    record_events(3)
    output = tmp_path / "old.jsonl.gz"
    (tmp_path / "old.jsonl.gz.partial").mkdir()  # where the file is written first
    with translation.override("ko"), pytest.raises(CommandError) as refused:
        call_command("archive_audit", "--older-than-days", "0", "--output", str(output), stderr=io.StringIO())
    assert str(refused.value) == f"{output}에 쓸 수 없습니다: 폴더입니다"
    assert AuditEvent.objects.count() == 3 and not AuditCheckpoint.objects.exists()
    assert not output.exists()


@pytest.mark.parametrize(("where", "why"), [("folder", "it is a folder"), ("under a file", "a part of the path")])
def test_audit_anchor_on_a_path_it_cannot_write_is_refused_naming_it(
    settings: Any, tmp_path: Path, a_file: Path, where: str, why: str
) -> None:
    record_events(1)
    anchor_path = tmp_path if where == "folder" else a_file / "anchors.jsonl"
    settings.AUDIT_ANCHOR_PATH, settings.AUDIT_ANCHOR_S3_BUCKET = anchor_path, ""
    with pytest.raises(CommandError) as refused:
        call_command("audit_anchor", stdout=io.StringIO())
    assert str(refused.value).startswith(f"cannot write {anchor_path}: {why}")
    assert a_file.read_text(encoding="utf-8") == "not a folder"


# ---- 4. create_api_key --agents naming none --------------------------------------------------------------------


@pytest.mark.parametrize("given", ["", ",", " , "])
def test_create_api_key_refuses_agents_given_but_naming_none(given: str) -> None:
    with pytest.raises(CommandError, match="--agents names no agent"):
        call_command("create_api_key", "scripted", "--agents", given, stdout=io.StringIO())
    assert not ApiKey.objects.exists()


def test_create_api_key_without_agents_is_a_key_for_every_agent() -> None:
    call_command("create_api_key", "everyone", stdout=io.StringIO())
    assert not ApiKey.objects.get().agents.exists()


def issue(*options: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("create_api_key", *options, stdout=out, stderr=err)
    return out.getvalue().strip(), err.getvalue()


def test_create_api_key_replace_revokes_the_earlier_keys_of_its_name_and_no_other() -> None:
    """./bin/up mints its quickstart key at every start: each earlier one stayed valid."""
    first, _said = issue("quickstart", "--replace")
    other, _said = issue("ops")
    assert ApiKey.objects.get(prefix=first[:12]).revoked_at is None
    mark = last_event_id()
    second, said = issue("quickstart", "--replace")

    assert said.strip() == "revoked 1 earlier key named quickstart"
    valid = set(ApiKey.objects.filter(revoked_at__isnull=True).values_list("prefix", flat=True))
    assert valid == {second[:12], other[:12]}  # the first, valid until now, is revoked
    actions = [(e.action, e.args.get("name") if isinstance(e.args, dict) else None) for e in config_events_after(mark)]
    assert [a for a, _name in actions] == ["config.api_key.create", "config.api_key.revoke"]


def test_create_api_key_without_replace_leaves_the_earlier_keys_valid() -> None:
    issue("quickstart")
    _key, said = issue("quickstart")
    assert said == "" and ApiKey.objects.filter(name="quickstart", revoked_at__isnull=True).count() == 2


def test_bin_up_mints_its_quickstart_key_replacing_the_last_starts() -> None:
    script = (Path(__file__).resolve().parent.parent / "bin" / "up").read_text(encoding="utf-8")
    assert "create_api_key quickstart --replace" in script


# ---- 5. agent_version shadow off -----------------------------------------------------------------------------


@pytest.fixture
def shadowed_agent() -> Agent:
    agent = agent_create(actor="test", via="tests", data={"slug": "shadowed", "name": "shadowed"})
    version = agent_version_publish(agent=agent, actor="test", via="tests", make_live=False)
    return agent_shadow_set(agent=agent, actor="test", via="tests", version=version, rate=0.25)


def test_agent_version_shadow_off_leaves_the_sample_rate_alone(shadowed_agent: Agent) -> None:
    mark = last_event_id()
    out = io.StringIO()
    call_command("agent_version", "shadow", "shadowed", "off", stdout=out)
    shadowed_agent.refresh_from_db()
    assert (shadowed_agent.shadow_version_id, shadowed_agent.shadow_sample_rate) == (None, 0.25)
    assert out.getvalue().strip() == "shadow off"
    [event] = config_events_after(mark)
    assert "shadow_sample_rate" not in event.args


def test_agent_version_shadow_off_refuses_a_rate(shadowed_agent: Agent) -> None:
    with pytest.raises(CommandError, match="'off' takes none"):
        call_command("agent_version", "shadow", "shadowed", "off", "--rate", "0.5", stdout=io.StringIO())
    shadowed_agent.refresh_from_db()
    assert shadowed_agent.shadow_version_id is not None and shadowed_agent.shadow_sample_rate == 0.25


def test_agent_version_shadow_of_a_version_without_a_rate_shadows_every_run(shadowed_agent: Agent) -> None:
    out = io.StringIO()
    call_command("agent_version", "shadow", "shadowed", "1", stdout=out)
    shadowed_agent.refresh_from_db()
    assert shadowed_agent.shadow_sample_rate == 1.0 and out.getvalue().strip() == "shadow v1 at 1"


# ---- 6. libyaml's words, told as the reader's ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("written", "told"),
    [
        ("servers: [\n", "a value was expected here: check the brackets and the commas, at line 2, column 1"),
        ("rules: [a,,b]\n", "a value was expected here: check the brackets and the commas, at line 1, column 11"),
        ('agents:\n- name: "\\ud800"\n', "an escape sequence that names no Unicode character"),
        ('agents:\n- name: "\\x4"\n', "an escape sequence is not valid"),
    ],
)
def test_libyamls_words_for_an_open_bracket_or_a_bad_escape_are_told_as_the_readers(
    tmp_path: Path, written: str, told: str
) -> None:
    path = tmp_path / "platform.yaml"
    path.write_text(written, encoding="utf-8")
    with pytest.raises(ApplicationError) as refused:
        load_document(path)
    assert told in refused.value.message
    assert "did not find" not in refused.value.message and "found invalid" not in refused.value.message


def test_create_api_key_replace_that_finds_no_key_in_use_says_so() -> None:
    """A key revoked (or named otherwise) is no key to replace: the new one, for every agent at the default rate, was
    issued with nothing said."""
    first, _said = issue("리뷰-키", "--replace")
    call_command("revoke_api_key", first[:12], stdout=io.StringIO())
    _second, said = issue("리뷰-키", "--replace")
    assert said.strip() == (
        "no key in use is named 리뷰-키: nothing was replaced, and nothing carried over "
        "(the new key may use every agent, at the default rate)"
    )


def test_create_api_key_replace_of_a_name_never_used_says_nothing_more() -> None:
    _first, said = issue("처음-키", "--replace")  # ./bin/up's first start
    assert said == ""
