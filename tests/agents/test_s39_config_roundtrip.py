"""An export, edited or not, imports as what it says (review s39, configio):

1. an exported and edited document publishes a publish-on-save agent: naming the version already live (what an
   export writes) is no choice of a live version; naming another one still is;
2. text stored decomposed (NFD, typed on macOS) is exported composed and re-imports unchanged, and an export
   imported into an empty installation exports the same; what an entry passes to the OS as written stays so;
3. an eval set's whole-number thresholds stay whole numbers, and a set that differs in nothing is not written;
4. a tool's tags and example queries are stored without surrounding spaces, so its export re-imports unchanged;
5. a version refused, or a missing one named, is one problem, without follow-ups about the live version.
"""

from __future__ import annotations

import json
import unicodedata
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from agent_platform.errors import ApplicationError
from agents.configuration import config_export, config_import
from agents.models import Agent, AgentVersion, DeterministicRule
from agents.services import agent_update, agent_version_publish, deterministic_rule_update
from audit.models import AuditEvent
from evals.models import EvalSet
from evals.services import eval_set_update
from mcpregistry.models import McpServer, McpTool
from mcpregistry.services import mcp_server_update, mcp_tool_update
from tests.agents.test_configuration_versions import agent_entry, emptied, with_secrets

pytestmark = pytest.mark.django_db

DEMO = "sds-company-data"


def nfd(text: str) -> str:
    return unicodedata.normalize("NFD", text)


def exported_to(path: Path) -> dict[str, Any]:
    call_command("export_config", "-o", str(path))
    document: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return document


def imported(path: Path, document: dict[str, Any], *options: str) -> str:
    path.write_text(json.dumps(document, ensure_ascii=False), encoding="utf-8")
    out = StringIO()
    call_command("import_config", str(path), *options, stdout=out)
    return out.getvalue()


def re_imports_unchanged(document: dict[str, Any]) -> None:
    events = AuditEvent.objects.count()
    report = config_import(actor="t", document=document)
    assert (report.created, report.updated, report.deleted) == ([], [], [])
    assert AuditEvent.objects.count() == events


# --- 1. an edited export publishes a publish-on-save agent ----------------------------------------------------


def _prompt_edited(document: dict[str, Any]) -> None:
    agent_entry(document)["system_prompt"] = "수정된 프롬프트: 항상 존댓말로 답하세요."


def _timeout_edited(document: dict[str, Any]) -> None:
    next(c for c in document["contracts"] if c["tool"] == "get_asset_status")["timeout_s"] = 3.0


@pytest.mark.slow
@pytest.mark.parametrize("edit", [_prompt_edited, _timeout_edited], ids=["system_prompt", "contract timeout_s"])
def test_an_edited_export_publishes_an_agent_that_publishes_on_save(
    demo_agent: Agent, tmp_path: Path, edit: Any
) -> None:
    agent_update(agent=demo_agent, actor="t", via="tests", data={"publish_on_save": True})
    demo_agent.refresh_from_db()
    assert demo_agent.live_version is not None and demo_agent.live_version.number == 1
    path = tmp_path / "config.json"
    document = exported_to(path)
    assert agent_entry(document)["live_version"] is None  # its draft published on save: no choice to export
    edit(document)

    # A dry run writes nothing, the publish included.
    events = AuditEvent.objects.count()
    imported(path, document, "--dry-run")
    assert AuditEvent.objects.count() == events
    assert AgentVersion.objects.filter(agent=demo_agent).count() == 1

    out = imported(path, document)
    demo_agent.refresh_from_db()
    assert "version company-assistant v2" in out
    assert demo_agent.live_version is not None and demo_agent.live_version.number == 2
    live = demo_agent.live_version.content
    if edit is _prompt_edited:
        assert live["agent"]["system_prompt"] == "수정된 프롬프트: 항상 존댓말로 답하세요."
    else:
        assert live["contracts"][f"{DEMO}/get_asset_status"]["timeout_s"] == 3.0

    # The new export (live v2, the versions it names) re-imports unchanged: nothing published again.
    re_imports_unchanged(exported_to(path))
    assert AgentVersion.objects.filter(agent=demo_agent).count() == 2


def test_an_unedited_export_of_a_publish_on_save_agent_publishes_nothing(demo_agent: Agent) -> None:
    agent_update(agent=demo_agent, actor="t", via="tests", data={"publish_on_save": True})
    re_imports_unchanged(config_export())
    assert AgentVersion.objects.filter(agent=demo_agent).count() == 1


def test_naming_another_live_version_is_a_choice_that_publish_on_save_keeps(demo_agent: Agent) -> None:
    agent_version_publish(agent=demo_agent, actor="t", via="tests")
    agent_update(agent=demo_agent, actor="t", via="tests", data={"system_prompt": "두 번째"})
    agent_update(agent=demo_agent, actor="t", via="tests", data={"publish_on_save": True})
    demo_agent.refresh_from_db()
    assert demo_agent.live_version is not None and demo_agent.live_version.number == 2
    document = config_export()
    entry = agent_entry(document)
    v1 = AgentVersion.objects.get(agent=demo_agent, number=1)
    entry["versions"] = [{"number": 1, "note": v1.note, "content": config_export_version(v1)}]
    entry["live_version"] = 1
    entry["system_prompt"] = "세 번째"
    config_import(actor="t", document=document)
    demo_agent.refresh_from_db()
    assert demo_agent.live_version is not None and demo_agent.live_version.number == 1
    assert AgentVersion.objects.filter(agent=demo_agent).count() == 2  # the draft stays a draft


def config_export_version(version: AgentVersion) -> dict[str, Any]:
    from agents.versions import version_content_portable

    return dict(version_content_portable(version.content))


def test_a_fresh_installation_takes_the_named_live_version_without_publishing(demo_agent: Agent) -> None:
    agent_update(agent=demo_agent, actor="t", via="tests", data={"publish_on_save": True})
    document = with_secrets(config_export())
    emptied()
    report = config_import(actor="t", document=document)
    agent = Agent.objects.get(slug="company-assistant")
    assert agent.live_version is not None and agent.live_version.number == 1
    assert list(AgentVersion.objects.filter(agent=agent).values_list("number", flat=True)) == [1]
    assert "version company-assistant v2" not in report.created


# --- 2. text stored decomposed ------------------------------------------------------------------------------


def test_text_stored_decomposed_is_exported_composed_and_round_trips(demo_agent: Agent, tmp_path: Path) -> None:
    agent_update(
        agent=demo_agent,
        actor="t",
        via="tests",
        data={"name": nfd("회사 도우미"), "no_match_answer": nfd("죄송합니다. 답을 찾지 못했습니다.")},
    )
    tool = McpTool.objects.get(server__mcp_id=DEMO, name="get_asset")
    tool.example_queries = [nfd("노트북 자산 조회")]
    mcp_tool_update(tool=tool, actor="t", via="tests")
    rule = DeterministicRule.objects.filter(agent=demo_agent).order_by("order", "id").first()
    assert rule is not None
    deterministic_rule_update(rule=rule, actor="t", via="tests", data={"answer_template": nfd("결과: {result}")})
    server = McpServer.objects.get(mcp_id=DEMO)
    server.env = {**server.env, "FAILURE_MODE": nfd("없음")}  # a setting passed to the process as written
    mcp_server_update(server=server, actor="t", via="tests")
    demo_agent.refresh_from_db()
    assert not unicodedata.is_normalized("NFC", demo_agent.name)

    path = tmp_path / "a.json"
    exported = exported_to(path)
    as_written = exported["servers"][0]["env"].pop("FAILURE_MODE")
    assert as_written == {"value": nfd("없음")}
    assert unicodedata.is_normalized("NFC", json.dumps(exported, ensure_ascii=False))
    assert agent_entry(exported)["name"] == "회사 도우미"

    exported = exported_to(path)
    re_imports_unchanged(exported)
    demo_agent.refresh_from_db()
    assert demo_agent.name == nfd("회사 도우미")  # kept as stored: nothing was written

    # A's export imported into an empty B exports the same.
    emptied()
    config_import(actor="t", document=with_secrets(exported))
    assert config_export() == exported


# --- 3. eval-set thresholds ---------------------------------------------------------------------------------


def _eval_set_document(thresholds: dict[str, Any]) -> dict[str, Any]:
    return {
        "eval_sets": [
            {
                "name": "regression-ko",
                "cases": [{"key": "c1", "query": "A-1001 자산 상태", "expected_tools": ["get_asset_status"]}],
                "thresholds": thresholds,
            }
        ]
    }


def test_whole_number_thresholds_stay_whole_and_an_unchanged_set_is_not_written(tmp_path: Path) -> None:
    path = tmp_path / "sets.json"
    imported(path, _eval_set_document({"latency_p95_ms": 5000, "pass_rate": 1}))
    stored = EvalSet.objects.get(name="regression-ko")
    assert json.dumps(stored.thresholds, sort_keys=True) == '{"latency_p95_ms": 5000, "pass_rate": 1}'
    exported = exported_to(path)
    assert exported["eval_sets"][0]["thresholds"] == {"latency_p95_ms": 5000, "pass_rate": 1}
    re_imports_unchanged(exported)

    # A threshold stored as 5000.0 is the document's 5000: unchanged, and not rewritten without an event.
    eval_set_update(eval_set=stored, actor="t", via="tests", data={"thresholds": {"latency_p95_ms": 5000.0}})
    events = AuditEvent.objects.count()
    report = config_import(actor="t", document=_eval_set_document({"latency_p95_ms": 5000}))
    assert "eval set regression-ko" in report.unchanged
    assert AuditEvent.objects.count() == events
    stored.refresh_from_db()
    assert json.dumps(stored.thresholds) == '{"latency_p95_ms": 5000.0}'


def test_a_boolean_or_text_threshold_is_refused_naming_it(tmp_path: Path) -> None:
    for value in (True, "0.9"):
        with pytest.raises(ApplicationError) as failure:
            config_import(actor="t", document=_eval_set_document({"pass_rate": value}))
        assert "thresholds.pass_rate: must be a number" in failure.value.message
    assert not EvalSet.objects.exists()


# --- 4. tags with surrounding spaces ------------------------------------------------------------------------


def test_tags_and_example_queries_are_stored_stripped_and_round_trip(demo_server: McpServer) -> None:
    tool = McpTool.objects.get(server=demo_server, name="ping")
    tool.tags, tool.example_queries = ["자산 ", " 상태"], [" 핑 확인 "]
    mcp_tool_update(tool=tool, actor="t", via="tests")
    tool.refresh_from_db()
    assert (tool.tags, tool.example_queries) == (["자산", "상태"], ["핑 확인"])
    re_imports_unchanged(config_export())


# --- 5. no follow-ups for a refused or missing version ------------------------------------------------------


def _refused_message(path: Path, document: dict[str, Any]) -> str:
    path.write_text(json.dumps(document, ensure_ascii=False), encoding="utf-8")
    with pytest.raises(CommandError) as failure:
        call_command("import_config", str(path), stdout=StringIO())
    return str(failure.value)


def test_a_refused_version_is_named_once_without_follow_ups(demo_agent: Agent, tmp_path: Path) -> None:
    agent_version_publish(agent=demo_agent, actor="t", via="tests")
    document = with_secrets(config_export())
    emptied()
    entry = agent_entry(document)
    entry["versions"][0]["content"]["agent"]["max_iterations"] = "5"
    entry["shadow"] = {"version": 1, "sample_rate": 0.5}
    entry["arms"] = [{"name": "a", "version": 1}]
    message = _refused_message(tmp_path / "config.json", document)
    assert "versions: v1: agent.max_iterations" in message
    assert "no version 1" not in message
    assert "Without a live version" not in message


def test_a_missing_live_version_is_named_without_the_live_version_follow_up(demo_agent: Agent, tmp_path: Path) -> None:
    agent_version_publish(agent=demo_agent, actor="t", via="tests")
    document = config_export()
    agent_entry(document)["live_version"] = 7
    message = _refused_message(tmp_path / "config.json", document)
    assert "live_version: no version 7 (give it in versions)" in message
    assert "Without a live version" not in message


def test_an_import_whose_agent_cannot_publish_its_draft_saves_it_as_a_draft_and_says_why(
    demo_agent: Agent, tmp_path: Path
) -> None:
    """Publish on save refuses a draft that cannot run (a code rule whose function is gone): the import's edit is
    kept as a draft, as an admin's is, and the report says why; it was an uncaught ValidationError."""
    agent_update(agent=demo_agent, actor="t", via="tests", data={"publish_on_save": True})
    path = tmp_path / "config.json"
    document = exported_to(path)
    DeterministicRule.objects.create(agent=demo_agent, name="gone", code="tests.example_rules.route_order_lookup")
    DeterministicRule.objects.filter(agent=demo_agent, name="gone").update(code="tests.example_rules.no_such_rule")
    _prompt_edited(document)

    out = imported(path, document)

    demo_agent.refresh_from_db()
    assert demo_agent.system_prompt == "수정된 프롬프트: 항상 존댓말로 답하세요."
    assert demo_agent.live_version is not None and demo_agent.live_version.number == 1
    assert "Agent company-assistant was not published on save:" in out and "no_such_rule" in out, out
