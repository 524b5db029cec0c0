"""The importer reads seed 001's four expected-source notations; sets are audited configuration."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command

from agent_platform.errors import ApplicationError
from agents.configuration import config_import
from audit.models import AuditEvent
from evals.models import EvalSet
from evals.notation import NO_TOOL, parse_expected_source
from tests.evals.conftest import SEED_SET


def test_a_document_path_expects_no_tool_and_keeps_the_path() -> None:
    source = parse_expected_source("docs/leave_policy.md", case_type="fact")
    assert (source.expected_tools, source.forbidden_tools, source.document) == ([], [], "docs/leave_policy.md")


def test_null_means_no_source_and_an_answer_that_says_it_does_not_know() -> None:
    source = parse_expected_source(None, case_type="no_answer")
    assert source.expected_tools == [] and source.answer_checks == [{"dont_know": True}]


def test_the_string_none_forbids_every_tool() -> None:
    assert parse_expected_source("none", case_type="no_tool").forbidden_tools == [NO_TOOL]
    assert parse_expected_source(" None ", case_type="no_tool").forbidden_tools == [NO_TOOL]


@pytest.mark.parametrize(
    "cell", ["classify_request, calculate", "classify_request,calculate", " classify_request ,  calculate "]
)
def test_comma_separated_names_are_split_with_or_without_spaces(cell: str) -> None:
    source = parse_expected_source(cell, case_type="multi_tool")
    assert source.expected_tools == [{"name": "classify_request"}, {"name": "calculate"}]


@pytest.mark.parametrize("cell", [42, ["search_employee", 3], "search_employee,,calculate", ""])
def test_a_cell_of_no_known_notation_is_refused(cell: object) -> None:
    with pytest.raises(ValueError):
        parse_expected_source(cell, case_type="single_tool")


def _seed_document(agent: str | None = None) -> dict:
    document = json.loads(SEED_SET.read_text(encoding="utf-8"))
    document["eval_sets"][0]["agent"] = agent
    return document


@pytest.mark.django_db
def test_the_shipped_set_imports_idempotently_and_every_change_is_audited() -> None:
    report = config_import(document=_seed_document(), actor="ops", via="import_config")
    assert report.created == ["eval set seed-001-tools"]
    eval_set = EvalSet.objects.get(name="seed-001-tools")
    cases = {c.key: c for c in eval_set.cases.all()}
    assert [c.case_type for c in cases.values()] == [
        "single_tool",
        "multi_tool",
        "no_tool",
        "multi_tool",
        "single_tool",
    ]
    assert cases["what-can-you-do"].forbidden_tools == [NO_TOOL]
    assert [t["name"] for t in cases["team-projects"].expected_tools] == ["search_employee", "list_projects"]
    assert cases["asset-status"].alternatives[0]["tools"] == ["get_asset_status", "get_asset_status_backup"]
    actions = list(AuditEvent.objects.filter(action__startswith="config.eval").values_list("action", "actor"))
    assert ("config.eval_set.create", "ops") in actions
    assert actions.count(("config.eval_case.create", "ops")) == 5

    again = config_import(document=_seed_document(), actor="ops", via="import_config")
    assert again.unchanged == ["eval set seed-001-tools"]
    assert AuditEvent.objects.filter(action__startswith="config.eval").count() == len(actions)


@pytest.mark.django_db
def test_an_invalid_case_names_its_entry_and_imports_nothing() -> None:
    document = _seed_document()
    document["eval_sets"][0]["cases"][2]["expected_source"] = 7
    document["eval_sets"][0]["thresholds"] = {"recal": 0.5}
    with pytest.raises(ApplicationError) as caught:
        config_import(document=document, actor="ops")
    assert "cases[2]" in caught.value.message
    assert not EvalSet.objects.exists()
    document = _seed_document()
    document["eval_sets"][0]["thresholds"] = {"recal": 0.5}
    with pytest.raises(ApplicationError) as caught:
        config_import(document=document, actor="ops")
    assert "recal: not a score" in caught.value.message
    assert not EvalSet.objects.exists()


@pytest.mark.django_db
def test_export_writes_the_sets_back_in_a_form_import_reads() -> None:
    config_import(document=_seed_document(), actor="ops")
    out = io.StringIO()
    call_command("export_config", stdout=out)
    exported = json.loads(out.getvalue())
    assert [s["name"] for s in exported["eval_sets"]] == ["seed-001-tools"]
    report = config_import(document=exported, actor="ops")
    assert report.unchanged[-1] == "eval set seed-001-tools"
    # Korean written as it is, never as \u escapes.
    assert "\\uc9c8" not in out.getvalue() and "김하늘 님은 어느 팀 소속인가요?" in out.getvalue()
