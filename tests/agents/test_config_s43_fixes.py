"""``import_config`` after the s43 review: a partial rule or tool entry keeps what it leaves out; an imported
version whose rule calls a tool its discovered server does not list is named in a warning; a version's model
base URL is exported as written; new tools are matched to their rows without reading every row of the server for
each; the file's format is read case-insensitively from its name, given with ``--format``, or told from the text;
a secret in a server's folder or a rule's context condition is refused."""

from __future__ import annotations

import copy
import io
import json
import sys
import unicodedata
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.conf import settings
from django.core.management import call_command
from django.db.models.signals import post_init

from agent_platform.errors import ApplicationError
from agents.configuration import config_export, config_import, load_document
from agents.models import Agent, AgentVersion, DeterministicRule
from agents.services import agent_version_publish, deterministic_rule_update
from mcpregistry.models import McpServer, McpTool
from mcpregistry.services import mcp_tool_update

pytestmark = pytest.mark.django_db

KEY = "sk-live-abcdefghijklmnopqrstuvwx1234"


def asset_rule(agent: Agent) -> DeterministicRule:
    return DeterministicRule.objects.get(agent=agent, tool_name="get_asset_status")


# ---- 1. a partial rule or tool entry --------------------------------------------------------------------------


def test_a_partial_rule_entry_keeps_what_it_leaves_out(demo_agent: Agent) -> None:
    rule = asset_rule(demo_agent)
    deterministic_rule_update(rule=rule, actor="t", via="tests", data={"enabled": False, "order": 7})
    stored = {f: getattr(rule, f) for f in ("code", "when", "params", "force_first_tool", "server_id", "tool_name")}
    entry = {"agent": demo_agent.slug, "name": rule.name, "answer_template": "자산 {result.asset_id}"}
    report = config_import(actor="t", document={"rules": [entry]})
    rule.refresh_from_db()
    assert (rule.enabled, rule.order, rule.answer_template) == (False, 7, "자산 {result.asset_id}")
    assert {f: getattr(rule, f) for f in stored} == stored
    # The report line names the keys that changed, as a contract's does.
    assert report.updated == [f"rule {demo_agent.slug}.{rule.name} (answer_template)"]
    again = config_import(actor="t", document={"rules": [entry]})
    assert again.updated == [] and again.unchanged == [f"rule {demo_agent.slug}.{rule.name}"]


def test_a_new_rule_still_takes_the_defaults(demo_agent: Agent) -> None:
    entry = {"agent": demo_agent.slug, "name": "새 규칙", "mcp_id": "sds-company-data", "tool": "get_asset_status"}
    entry["when"] = {"any_keywords": ["새자산"]}
    entry["params"] = {"asset_id": "A-1001"}
    config_import(actor="t", document={"rules": [entry]})
    rule = DeterministicRule.objects.get(agent=demo_agent, name="새 규칙")
    assert (rule.enabled, rule.order, rule.code, rule.force_first_tool) == (True, 100, "", "")


def test_a_partial_tool_entry_keeps_its_tags_and_examples(demo_server: McpServer) -> None:
    tool = McpTool.objects.get(server=demo_server, name="get_asset_status")
    data = {"tags": ["자산"], "example_queries": ["A-1001 상태"], "enabled": False}
    mcp_tool_update(tool=tool, actor="t", via="tests", data=data)
    report = config_import(
        actor="t", document={"tools": [{"mcp_id": "sds-company-data", "tool": "get_asset_status", "enabled": True}]}
    )
    tool.refresh_from_db()
    assert (tool.tags, tool.example_queries, tool.enabled) == (["자산"], ["A-1001 상태"], True)
    assert report.updated == ["tool sds-company-data.get_asset_status"]


# ---- 2. a version's rule calling a tool its server does not list ---------------------------------------------


def test_a_version_calling_an_unlisted_tool_is_named_in_a_warning(demo_agent: Agent) -> None:
    agent_version_publish(agent=demo_agent, actor="t", via="tests")
    entry = next(a for a in config_export()["agents"] if a["slug"] == demo_agent.slug)
    version = copy.deepcopy(entry["versions"][0])
    version["number"] = 5
    for rule in version["content"]["rules"]:
        if rule["tool_name"] == "get_asset_status":
            rule["tool_name"] = "nope"
    report = config_import(actor="t", document={"agents": [{"slug": demo_agent.slug, "versions": [version]}]})
    assert AgentVersion.objects.filter(agent=demo_agent, number=5).exists()  # a warning, not a refusal
    [warning] = [w for w in report.warnings if "'nope'" in w]
    assert f"version {demo_agent.slug} v5" in warning and "sds-company-data" in warning
    assert "get_asset_status" in warning and "deterministic:tool_unknown" in warning
    # The unchanged version warns of nothing.
    assert not any("'nope'" in w or "does not list" in w for w in config_import(actor="t", document={}).warnings)


# ---- 3. a version's model base URL, as written -------------------------------------------------------------------


def test_a_versions_base_url_is_exported_as_written() -> None:
    url = "https://api.example.com/" + unicodedata.normalize("NFD", "경로") + "/v1"
    model = {"provider": "openai_compatible", "model_id": "gpt-x", "params": {"base_url": url}}
    config_import(actor="t", document={"agents": [{"slug": "m", "model": model, "publish_on_save": True}]})
    config_import(actor="t", document={"agents": [{"slug": "m", "publish_on_save": False, "system_prompt": "바뀜"}]})
    agent = Agent.objects.get(slug="m")
    assert agent.live_version is not None and agent.live_version.content["agent"]["model_params"]["base_url"] == url
    entry = config_export()["agents"][0]
    assert entry["model"]["params"]["base_url"] == url
    assert entry["versions"][0]["content"]["agent"]["model_params"]["base_url"] == url
    # Re-imported, the version is the same one (its content as written).
    assert not config_import(actor="t", document=config_export()).updated


# ---- 4. many new tools ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_new_tools_are_matched_without_reading_the_server_for_each(tmp_path: Path) -> None:
    count = 120
    server = {
        "mcp_id": "fresh",
        "transport": "stdio",
        "command": sys.executable,
        "args": ["-m", settings.PLATFORM_DEMO_SERVER_MODULE],
    }
    tools = [{"mcp_id": "fresh", "tool": f"tool_{i:04}", "tags": ["t"]} for i in range(count)]
    read = []

    def counted(sender: Any, instance: McpTool, **kwargs: Any) -> None:
        read.append(instance)

    post_init.connect(counted, sender=McpTool)
    try:
        config_import(actor="t", document={"servers": [server], "tools": tools})
    finally:
        post_init.disconnect(counted, sender=McpTool)
    assert McpTool.objects.filter(server__mcp_id="fresh").count() == count
    assert len(read) < 10 * count  # a few per new tool; read row by row, count * count / 2 more (7,140 here)
    # import_config tells how far a large section is.
    path = tmp_path / "tools.json"
    path.write_text(json.dumps({"tools": [{**t, "tags": ["u"]} for t in tools]}), encoding="utf-8")
    stderr = io.StringIO()
    call_command("import_config", str(path), "--progress-every", "50", stdout=io.StringIO(), stderr=stderr)
    assert stderr.getvalue().split() == ["tools:", "50/120", "tools:", "100/120", "tools:", "120/120"]


# ---- 5. the file's format ----------------------------------------------------------------------------------------


def test_the_format_is_read_from_the_name_in_any_case_or_the_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    document = {"agents": [{"slug": "yaml-agent", "system_prompt": "안녕"}]}
    text = yaml.safe_dump(document, allow_unicode=True)
    upper = tmp_path / "config.YAML"
    upper.write_text(text, encoding="utf-8")
    assert load_document(upper) == document
    piped = tmp_path / "stdin"  # a name that says neither, as /dev/stdin
    piped.write_text(text, encoding="utf-8")
    assert load_document(piped) == document
    # Text that begins as JSON is read as JSON, and its problem told as one.
    broken = tmp_path / "broken"
    broken.write_text('{"agents": [}', encoding="utf-8")
    with pytest.raises(ApplicationError, match="not valid JSON"):
        load_document(broken)
    # --format names it; - reads the standard input.
    odd = tmp_path / "config.txt"
    odd.write_text(text, encoding="utf-8")
    call_command("import_config", str(odd), "--format", "yaml", "--dry-run", stdout=io.StringIO())
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode("utf-8"))))
    call_command("import_config", "-", stdout=io.StringIO())
    assert Agent.objects.get(slug="yaml-agent").system_prompt == "안녕"


# ---- 6. a secret in a server's folder or a rule's context -------------------------------------------------------


def test_a_secret_in_a_servers_folder_is_refused() -> None:
    server = {"mcp_id": "s", "command": sys.executable, "args": ["-m", settings.PLATFORM_DEMO_SERVER_MODULE]}
    with pytest.raises(ApplicationError, match=r"cwd: This holds a secret") as exc:
        config_import(actor="t", document={"servers": [{**server, "cwd": "/tmp/" + KEY}]})
    assert KEY not in exc.value.message
    config_import(actor="t", document={"servers": [{**server, "cwd": "/tmp"}]})
    assert McpServer.objects.get(mcp_id="s").cwd == "/tmp"


def test_a_secret_in_a_rules_context_condition_is_refused(demo_agent: Agent) -> None:
    entry = {
        "agent": demo_agent.slug,
        "name": "비밀",
        "mcp_id": "sds-company-data",
        "tool": "get_asset_status",
        "when": {"any_keywords": ["자산"], "context": {"token": KEY}},
        "params": {"asset_id": "A-1001"},
    }
    with pytest.raises(ApplicationError, match=r"when: context: this holds a secret"):
        config_import(actor="t", document={"rules": [entry]})
    entry["when"]["context"] = {"region": "kr"}
    config_import(actor="t", document={"rules": [entry]})
    assert DeterministicRule.objects.filter(agent=demo_agent, name="비밀").exists()


def test_a_secret_in_a_versions_rule_context_is_refused(demo_agent: Agent) -> None:
    agent_version_publish(agent=demo_agent, actor="t", via="tests")
    entry = next(a for a in config_export()["agents"] if a["slug"] == demo_agent.slug)
    version = copy.deepcopy(entry["versions"][0])
    version["number"] = 5
    version["content"]["rules"][0]["when"]["context"] = {"token": KEY}
    with pytest.raises(ApplicationError, match=r"when: context: this holds a secret"):
        config_import(actor="t", document={"agents": [{"slug": demo_agent.slug, "versions": [version]}]})


def test_the_models_refuse_a_secret_folder_and_context_whatever_the_path(demo_agent: Agent) -> None:
    # The admin, the API and the services save through the models' checks: not the import alone.
    from django.core.exceptions import ValidationError

    server = McpServer(mcp_id="t", command=sys.executable, args=["-m", "x"], cwd="/srv/" + KEY)
    with pytest.raises(ValidationError) as refused:
        server.full_clean()
    assert "cwd" in refused.value.message_dict and KEY not in str(refused.value)
    rule = asset_rule(demo_agent)
    rule.when = {"any_keywords": ["자산"], "context": {"token": KEY}}
    with pytest.raises(ValidationError) as refused:
        rule.full_clean()
    assert "when" in refused.value.message_dict and KEY not in str(refused.value)
