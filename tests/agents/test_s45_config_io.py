"""Configuration as code, review of session 45:

1. an eval case given in the seed's notation without a ``type`` is stored with the type the notation implies, and
   every case an import accepts exports as an entry that imports again into a fresh installation;
2. an eval set's ``pass_rate`` threshold is shown in its audit events, not masked as a password;
3. ``{"set": false}`` in a secret map is refused, naming its place, not taken for ``{"set": true}``;
4. the report names what changed of an updated server or agent (a secret map by its entries' names);
5. a frozen version's rule with an unknown key names that key;
6. a file in UTF-16 (Windows PowerShell 5.1's ``>``) or CP949 is told to be saved as UTF-8.
"""

from __future__ import annotations

import codecs
import io
import json
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from agent_platform.errors import ApplicationError
from agents.configuration import config_export, config_import
from agents.models import Agent
from agents.versions import AGENT_FIELDS
from audit.models import AuditEvent
from evals.models import EvalCase, EvalSet
from evals.services import eval_case_create, eval_set_apply, eval_set_delete
from mcpregistry.models import McpServer

pytestmark = pytest.mark.django_db

NEW_SECRET = "sk-live-rotated-key-0f1e2d3c4b5a6978"


def exported(tmp_path: Path, name: str = "export.json") -> Path:
    path = tmp_path / name
    call_command("export_config", "-o", str(path), stderr=io.StringIO())
    return path


def imported(path: Path) -> str:
    out = io.StringIO()
    call_command("import_config", str(path), stdout=out, stderr=io.StringIO())
    return out.getvalue()


def refusal(document: dict[str, Any]) -> str:
    before = AuditEvent.objects.count()
    with pytest.raises(ApplicationError) as refused:
        config_import(actor="t", document=document)
    assert AuditEvent.objects.count() == before
    return refused.value.message


# --- 1. an eval case's type, and every case's round trip -----------------------------------------------------

CASES: list[dict[str, Any]] = [
    # The seed's notation with no type: the type is the notation's.
    {"key": "rag", "question": "연차 이월은 며칠까지 가능한가요?", "expected_source": "docs/leave_policy.md"},
    {"key": "unknown", "question": "육아휴직은 얼마나 쓸 수 있나요?", "expected_source": None},
    {"key": "chat", "question": "어떤 일을 도와줄 수 있어?", "expected_source": "none"},
    {"key": "one", "question": "김하늘 님은 어느 팀 소속인가요?", "expected_source": "search_employee"},
    {"key": "two", "question": "이서준 님 팀의 프로젝트는?", "expected_source": "search_employee,list_projects"},
    # Every type, given.
    {"key": "t-single", "query": "q", "type": "single_tool", "expected_tools": ["search_employee"]},
    {"key": "t-multi", "query": "q", "type": "multi_tool", "expected_tools": ["search_employee", "list_projects"]},
    {"key": "t-none", "query": "q", "type": "no_tool", "expected_source": "none"},
    {"key": "t-unknown", "query": "q", "type": "no_answer", "expected_source": None},
    {"key": "t-guard", "query": "q", "type": "guardrail", "answer_checks": [{"contains": "드릴 수 없습니다"}]},
    {"key": "t-fact", "query": "q", "type": "fact", "expected_source": "docs/travel_policy.md"},
    # Neither a type nor a tool: single_tool expecting none, as sets have always given it.
    {"key": "bare", "query": "q"},
]


def test_a_case_in_the_seeds_notation_takes_the_type_it_implies() -> None:
    eval_set_apply(document={"name": "rag", "cases": CASES}, actor="t", via="tests")
    types = dict(EvalCase.objects.values_list("key", "case_type"))
    assert (types["rag"], types["unknown"], types["chat"], types["one"], types["two"]) == (
        "rag",
        "no_answer",
        "no_tool",
        "single_tool",
        "multi_tool",
    )
    assert types["bare"] == "single_tool" and types["t-fact"] == "fact"


def test_an_export_of_every_accepted_case_imports_into_a_fresh_installation(tmp_path: Path) -> None:
    eval_set_apply(document={"name": "rag", "cases": CASES}, actor="t", via="tests")
    # A row the old import stored from a path without a type: single_tool, expecting no tool.
    eval_case_create(
        actor="t",
        via="tests",
        data={
            "eval_set": EvalSet.objects.get(),
            "key": "legacy",
            "order": 1000,
            "case_type": "single_tool",
            "query": "해외 출장 식비 한도는 하루 얼마인가요?",
            "note": "expected_source: docs/travel_policy.md",
        },
    )
    path = exported(tmp_path)
    first = json.loads(path.read_text(encoding="utf-8"))["eval_sets"]
    stored = {c.key: (c.case_type, c.expected_tools) for c in EvalCase.objects.all()}
    eval_set_delete(eval_set=EvalSet.objects.get(), actor="t", via="tests")

    assert "created: eval set rag" in imported(path)

    assert {c.key: (c.case_type, c.expected_tools) for c in EvalCase.objects.all()} == stored
    assert json.loads(exported(tmp_path, "again.json").read_text(encoding="utf-8"))["eval_sets"] == first
    assert "unchanged: eval set rag" in imported(path)


# --- 2. a pass rate is no password -------------------------------------------------------------------------


def test_a_lowered_pass_rate_is_shown_in_the_audit_event() -> None:
    eval_set_apply(document={"name": "gate", "thresholds": {"pass_rate": 0.9}}, actor="t", via="tests")
    eval_set_apply(document={"name": "gate", "thresholds": {"pass_rate": 0.5}}, actor="t", via="tests")
    event = AuditEvent.objects.filter(action="config.eval_set.update").latest("seq")
    written = json.dumps(event.args)
    assert "0.5" in written and "0.9" in written and "***" not in written


# --- 3. {"set": false} -------------------------------------------------------------------------------------


def http_server(**headers: Any) -> dict[str, Any]:
    return {
        "mcp_id": "docs",
        "transport": "streamable_http",
        "url": "http://127.0.0.1:9000/mcp",
        "headers": headers,
    }


def test_set_false_is_refused_naming_its_place_and_keeps_nothing_silently() -> None:
    config_import(actor="t", document={"servers": [http_server(Authorization={"value": "Bearer stored-123456"})]})
    message = refusal({"servers": [http_server(Authorization={"set": False})]})
    assert "servers[0] (docs).headers.Authorization:" in message
    assert "leave the name out of the map to delete its value" in message
    assert McpServer.objects.get().headers == {"Authorization": "Bearer stored-123456"}


def test_set_false_for_a_models_key_is_refused_too() -> None:
    message = refusal({"agents": [{"slug": "a", "model": {"secrets": {"api_key": {"set": False}}}}]})
    assert "agents[0] (a).model.secrets.api_key:" in message
    assert "leave the name out of the map to delete its value" in message


def test_set_true_with_nothing_stored_names_the_map_and_the_entry() -> None:
    message = refusal({"servers": [http_server(Authorization={"set": True})]})
    assert 'servers[0] (docs): headers.Authorization: {"set": true} keeps the stored value, but no value is stored' in (
        message
    )


# --- 4. what changed, named ----------------------------------------------------------------------------------


def test_the_report_names_what_changed_of_a_server_and_an_agent(demo_agent: Agent, tmp_path: Path) -> None:
    document = config_export()
    [server] = document["servers"]
    server["env"]["INTERNAL_API_KEY"] = {"value": NEW_SECRET}
    server["timeout_s"] = 12
    [agent] = document["agents"]
    agent["max_iterations"] = 3
    agent["model"]["params"] = {"temperature": 0.1}
    path = tmp_path / "changed.json"
    path.write_text(json.dumps(document, ensure_ascii=False), encoding="utf-8")

    said = imported(path)

    assert "updated: server sds-company-data (env.INTERNAL_API_KEY, timeout_s)" in said
    assert "updated: agent company-assistant (max_iterations, model.params)" in said
    assert NEW_SECRET not in said


# --- 5. a frozen rule's unknown key ------------------------------------------------------------------------


def test_a_frozen_rule_with_an_unknown_key_names_it() -> None:
    rule = {"name": "r", "mcp_id": "s", "tool_name": "t", "order": 1}
    content = {"agent": dict.fromkeys(AGENT_FIELDS), "servers": [], "rules": [rule], "contracts": {}}
    message = refusal({"agents": [{"slug": "a", "versions": [{"number": 1, "content": content}]}]})
    assert "rules[0]: 'order' is not a valid key" in message


# --- 6. UTF-16 and CP949 files ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (codecs.BOM_UTF16_LE + '{"agents": []}'.encode("utf-16-le"), "the file is UTF-16: save it as UTF-8"),
        (codecs.BOM_UTF16_BE + '{"agents": []}'.encode("utf-16-be"), "the file is UTF-16: save it as UTF-8"),
        ('{"agents": [{"slug": "a", "name": "회사"}]}'.encode("cp949"), "not UTF-8 text (byte 38): save it as UTF-8"),
    ],
    ids=["utf-16-le", "utf-16-be", "cp949"],
)
def test_a_file_in_another_encoding_is_told_to_be_saved_as_utf8(tmp_path: Path, content: bytes, said: str) -> None:
    path = tmp_path / "platform.json"
    path.write_bytes(content)
    with pytest.raises(CommandError) as refused:
        call_command("import_config", str(path), stdout=io.StringIO())
    assert said in str(refused.value)


# --- 7. a multi-line text in the YAML export ------------------------------------------------------------------


def test_a_multi_line_prompt_is_a_literal_block_in_yaml_and_comes_back_as_itself(tmp_path: Path) -> None:
    prompt = "당신은 회사 정보를 답합니다.\n- 모르면 모른다고 말하세요.\n😀 끝\n"
    tabbed = "첫 줄\n\t탭으로 시작하는 줄"  # a block cannot hold a tab as it is: double-quoted, as before
    config_import(actor="t", document={"agents": [{"slug": "ml", "system_prompt": prompt}]})
    config_import(actor="t", document={"agents": [{"slug": "tab", "system_prompt": tabbed}]})
    path = tmp_path / "export.yaml"
    call_command("export_config", "--format", "yaml", "-o", str(path), stderr=io.StringIO())
    text = path.read_text(encoding="utf-8")

    assert "system_prompt: |\n    당신은 회사 정보를 답합니다.\n    - 모르면 모른다고 말하세요.\n    😀 끝\n" in text
    assert "\\U0001F600" not in text
    out = io.StringIO()
    call_command("import_config", str(path), "--format", "yaml", stdout=out, stderr=io.StringIO())
    assert Agent.objects.get(slug="ml").system_prompt == prompt
    assert Agent.objects.get(slug="tab").system_prompt == tabbed
    assert out.getvalue().endswith("created 0, updated 0, unchanged 2\n")
