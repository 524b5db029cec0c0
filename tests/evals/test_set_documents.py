"""A set as a document and back: ``export_config`` then ``import_config`` changes nothing (case order included),
and Korean typed decomposed (NFD) is stored composed (NFC), whichever way a case is written."""

from __future__ import annotations

import unicodedata

import pytest

from agent_platform.errors import ApplicationError
from agents.configuration import config_export, config_import
from agents.models import Agent
from audit.models import AuditEvent
from evals.models import EvalCase, EvalSet
from evals.services import eval_case_create, eval_case_update, eval_set_apply, eval_set_create

pytestmark = pytest.mark.django_db

NFD_NAME = unicodedata.normalize("NFD", "김하늘")


def test_export_then_import_changes_nothing_and_keeps_each_cases_order() -> None:
    agent = Agent.objects.create(slug="a", name="a")
    eval_set = eval_set_create(
        actor="test", via="tests", data={"name": "s", "agent": agent, "thresholds": {"recall": 0.5}}
    )
    eval_case_create(actor="test", via="tests", data={"eval_set": eval_set, "key": "k1", "order": 1, "query": "q1"})
    eval_case_create(actor="test", via="tests", data={"eval_set": eval_set, "key": "k2", "order": 2, "query": "q2"})
    exported = config_export()["eval_sets"]
    assert [c["order"] for c in exported[0]["cases"]] == [1, 2]
    before = AuditEvent.objects.count()
    report = config_import(document={"eval_sets": exported}, actor="test", via="tests")
    assert report.unchanged == ["eval set s"] and not report.updated
    assert AuditEvent.objects.count() == before  # no case's order rewritten, nothing audited
    assert list(EvalCase.objects.order_by("order").values_list("key", "order")) == [("k1", 1), ("k2", 2)]


def test_a_document_without_orders_gets_them_from_its_list() -> None:
    applied = eval_set_apply(
        document={"name": "s", "cases": [{"key": "a", "query": "q"}, {"key": "b", "query": "q", "order": 5}]},
        actor="test",
        via="tests",
    )
    assert list(applied.eval_set.cases.order_by("key").values_list("key", "order")) == [("a", 10), ("b", 5)]


def test_a_case_imported_decomposed_is_stored_composed() -> None:
    applied = eval_set_apply(
        document={
            "name": "n",
            "cases": [
                {
                    "key": f"{NFD_NAME}-team",
                    "query": f"{NFD_NAME} 팀?",
                    "context": {"사용자": NFD_NAME},
                    "answer_checks": [{"contains": NFD_NAME}],
                    "expected_tools": [{"name": "search_employee", "args": {"name": NFD_NAME}}],
                    "note": NFD_NAME,
                }
            ],
        },
        actor="test",
        via="tests",
    )
    case = applied.eval_set.cases.get()
    assert case.key == "김하늘-team" and case.query == "김하늘 팀?" and case.note == "김하늘"
    assert case.context == {"사용자": "김하늘"} and case.answer_checks == [{"contains": "김하늘"}]
    assert case.expected_tools == [{"name": "search_employee", "args": {"name": "김하늘"}}]
    # The same document again is no change (compared composed).
    assert not eval_set_apply(
        document={"name": "n", "cases": [{"key": "김하늘-team", "query": f"{NFD_NAME} 팀?", "context": {"사용자": "김하늘"},
                  "answer_checks": [{"contains": "김하늘"}], "note": "김하늘",
                  "expected_tools": [{"name": "search_employee", "args": {"name": "김하늘"}}]}]},
        actor="test",
        via="tests",
    ).changed  # fmt: skip


def test_a_case_written_decomposed_through_the_services_is_stored_composed() -> None:
    """What the admin's forms call: ``eval_case_create`` with the form's data, ``eval_case_update`` with the
    form's instance."""
    eval_set = eval_set_create(actor="test", via="tests", data={"name": "s"})
    case = eval_case_create(
        actor="test", via="tests", data={"eval_set": eval_set, "key": "k", "query": f"{NFD_NAME} 팀?"}
    )
    assert EvalCase.objects.get(pk=case.pk).query == "김하늘 팀?"
    case.answer_checks = [{"contains": NFD_NAME}]
    case.data = [{"이름": NFD_NAME}]
    eval_case_update(case=case, actor="test", via="tests")
    stored = EvalCase.objects.get(pk=case.pk)
    assert stored.answer_checks == [{"contains": "김하늘"}] and stored.data == [{"이름": "김하늘"}]


def test_a_sets_free_form_objects_are_exported_with_their_keys_sorted(db) -> None:
    from evals.services import eval_set_apply, eval_set_document

    document = {
        "name": "sorted",
        "thresholds": {"recall": 0.5, "argument_match": 0.5},
        "cases": [{"key": "k", "query": "질문", "context": {"userId": "u", "chatbotId": "c", "a": {"z": 1, "b": 2}}}],
    }
    applied = eval_set_apply(document=document, actor="test", via="tests")
    exported = eval_set_document(applied.eval_set)
    assert list(exported["thresholds"]) == ["argument_match", "recall"]
    assert list(exported["cases"][0]["context"]) == ["a", "chatbotId", "userId"]
    assert list(exported["cases"][0]["context"]["a"]) == ["b", "z"]


def test_a_case_the_columns_refuse_is_named_by_its_place_in_the_document_and_its_documents_keys() -> None:
    """Defect 9: the columns' refusals named the model's fields (``case_type``) and not the case."""
    document = {
        "name": "s",
        "cases": [
            {"key": "fine", "query": "q"},
            {"key": "long-type", "query": "q", "type": "t" * 41},
            {"key": "k" * 101, "query": "q"},
        ],
    }
    with pytest.raises(ApplicationError) as refused:
        eval_set_apply(document=document, actor="test", via="tests")
    message = refused.value.message
    assert "cases[1].type: " in message and "case_type" not in message, message
    assert "cases[2].key: " in message, message
    assert "cases[0]" not in message
    assert not EvalSet.objects.exists()  # nothing written


def test_a_cases_tools_and_alternatives_are_exported_in_one_key_order_whatever_the_database_kept(db) -> None:
    """PostgreSQL's jsonb returned ``{"args": …, "name": …}`` and ``{"note": …, "tools": …}``: an export from a
    SQLite installation and one from PostgreSQL differed in text."""
    from evals.models import EvalCase
    from evals.services import eval_set_apply, eval_set_document

    document = {"name": "order", "cases": [{"key": "k", "query": "질문"}]}
    applied = eval_set_apply(document=document, actor="test", via="tests")
    EvalCase.objects.filter(eval_set=applied.eval_set).update(  # as jsonb hands them back
        expected_tools=[{"args": {"team": "물류", "a": 1}, "name": "search_docs"}],
        alternatives=[{"note": "백업", "ordered": True, "tools": ["b", "a"]}],
    )
    (case,) = eval_set_document(applied.eval_set)["cases"]
    assert [list(t) for t in case["expected_tools"]] == [["name", "args"]]
    assert list(case["expected_tools"][0]["args"]) == ["a", "team"]
    assert [list(a) for a in case["alternatives"]] == [["tools", "note", "ordered"]]
    assert case["alternatives"][0]["tools"] == ["b", "a"]  # lists keep their order
