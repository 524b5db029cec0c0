"""Fixes from a review of the evals app.

- A sandboxed write sent by a delivery whose worker died, and found executed by the delivery after it (the gate
  returns its recorded outcome and writes no audit event), counted as no call at all: ``tools:mismatch`` with
  ``called_tools`` empty although the write was made, once. It counts once, where the run made it.
- A case's ``context`` that is no object and ``data`` that is no list of objects were stored by the admin and by
  ``eval_case_update``, while the import refuses them: the set's export no longer imported.
- An ordered case compared tool names only: ``transfer{step: 1}`` then ``transfer{step: 2}`` passed on the two
  calls made the other way round.
- A call that timed out once and succeeded on its retry was shown (API, the eval run's page) as failed, from its
  first attempt.
"""

from __future__ import annotations

import io
import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.test import Client
from django.utils.translation import override
from rest_framework.test import APIClient

from agent_platform.errors import ApplicationError
from agents.execution import run_execute
from agents.models import Agent, Approval
from agents.services import api_key_create
from audit.services import audit_event_record
from evals.models import EvalCase, EvalRun, EvalSet
from evals.scoring import CaseSpec, ToolCall, score_case
from evals.services import (
    eval_case_update,
    eval_run_refresh,
    eval_run_start,
    eval_set_apply,
    eval_set_document,
    run_tool_calls_for_scoring,
)
from mcpregistry.models import McpServer, ToolContract
from mcpregistry.pool import get_default_pool
from mcpregistry.services import tool_contract_update
from tests.agents.test_rule_tool_writes import died_mid_run
from tests.conftest import discover_as_admin, make_agent
from tests.evals.conftest import bind_stock_server, run_eval, scripted_agent
from tests.evals.test_case_editor import page_of, sent_back

# ---- a write found executed by the delivery after the one that sent it ----------------------------------------

SAVE_MINUTES = {
    "key": "save-minutes",
    "query": "회의록을 저장해줘",
    "ordered": True,
    "expected_tools": [
        {"name": "echo", "args": {"text": "회의"}},
        {"name": "append_note", "args": {"text": "주간 회의록"}},
    ],
}


@pytest.fixture
def minutes(transactional_db: Any, tmp_path: Path) -> Iterator[Path]:
    """An agent whose model reads (``echo``), then writes a note (``append_note``) on the probe server ``notes``,
    a sandbox of the set ``writes``; the notes file, where each execution of the write shows."""
    server = McpServer.objects.create(
        mcp_id="notes", name="notes", command=sys.executable, args=["-m", "tests.mcp_fixtures.probe_server"],
        cwd=str(settings.BASE_DIR), env={"NOTES_FILE": str(tmp_path / "notes.txt")}, session_scope="shared",
    )  # fmt: skip
    assert discover_as_admin(server=server).ok
    script = [
        {"tool_calls": [{"name": "echo", "args": {"text": "회의"}}]},
        {"tool_calls": [{"name": "append_note", "args": {"text": "주간 회의록"}}]},
        {"content": "저장됨"},
    ]
    make_agent(slug="minutes", servers=[server], provider="scripted", script=script, with_demo_rules=False)
    document = {"name": "writes", "sandbox_servers": ["notes"], "cases": [SAVE_MINUTES]}
    eval_set_apply(document=document, actor="test", via="tests")
    yield tmp_path / "notes.txt"
    get_default_pool().close("notes")


def _eval_delivered_twice(*, before_redelivery: Any = None) -> EvalRun:
    """The set ``writes`` run against ``minutes``: its case's run delivered, its worker dying after the calls
    (``before_redelivery`` then changes what it left), delivered again to the end, and scored."""
    eval_run = eval_run_start(
        eval_set=EvalSet.objects.get(name="writes"), agent=Agent.objects.get(slug="minutes"), actor="test"
    )
    run = eval_run.results.get().run
    assert run is not None
    run_execute(run_id=str(run.id))
    died_mid_run(run)
    if before_redelivery is not None:
        before_redelivery(run)
    run_execute(run_id=str(run.id))
    return eval_run_refresh(eval_run=eval_run)


@pytest.mark.slow
def test_a_sandboxed_write_found_executed_by_the_next_delivery_counts_once_where_it_was_made(minutes: Path) -> None:
    eval_run = _eval_delivered_twice()

    result = eval_run.results.get()
    assert minutes.read_text(encoding="utf-8").splitlines() == ["주간 회의록\t"]  # sent once
    assert [(c["name"], c["ok"]) for c in result.called_tools] == [("echo", True), ("append_note", True)]
    assert result.passed, result.scores["failed_checks"]  # in the order the run made them: no tools:order


@pytest.mark.slow
def test_a_write_whose_outcome_the_next_delivery_could_not_know_counts_once(minutes: Path) -> None:
    def died_mid_call(run: Any) -> None:  # the write was claimed, and no outcome recorded
        Approval.objects.filter(run=run).update(status=Approval.Status.EXECUTING, result=None)

    eval_run = _eval_delivered_twice(before_redelivery=died_mid_call)

    calls = eval_run.results.get().called_tools
    assert [c["name"] for c in calls].count("append_note") == 1
    assert minutes.read_text(encoding="utf-8").splitlines() == ["주간 회의록\t"]


# ---- a case's context and data: the import's rule, wherever the case is written -------------------------------


@pytest.fixture
def stored_case(db: Any) -> EvalCase:
    eval_set_apply(document={"name": "s1", "cases": [{"key": "k", "query": "질문"}]}, actor="test", via="tests")
    return EvalCase.objects.get()


BAD_INPUTS = [
    ("context", "hello", "context: 객체여야 합니다"),
    ("context", [1, 2], "context: 객체여야 합니다"),
    ("data", {"a": 1}, "data: 목록이어야 합니다"),
    ("data", ["x"], "data.0: 객체여야 합니다"),
]


def _import_refusal(field: str, value: Any) -> str:
    document = {"name": "imported", "cases": [{"query": "질문", field: value}]}
    with override("ko"), pytest.raises(ApplicationError) as refusal:
        eval_set_apply(document=document, actor="test", via="tests")
    return str(refusal.value.message)


@pytest.mark.parametrize(("field", "value", "problem"), BAD_INPUTS)
def test_the_admin_refuses_a_context_or_data_the_import_refuses_in_its_words(
    admin_client: Client, stored_case: EvalCase, field: str, value: Any, problem: str
) -> None:
    data = sent_back(page_of(admin_client, stored_case.eval_set))
    for name in (f"cases-0-{field}__editor", f"cases-0-{field}__lines"):
        data.pop(name, None)
    data[f"cases-0-{field}"] = [json.dumps(value)]  # typed into the JSON box

    response = admin_client.post(
        f"/admin/evals/evalset/{stored_case.eval_set.pk}/change/", data, HTTP_ACCEPT_LANGUAGE="ko"
    )

    assert response.status_code == 200
    assert problem in response.context["inline_admin_formsets"][0].formset.forms[0].errors[field]
    assert problem in _import_refusal(field, value)  # one rule, one wording
    stored_case.refresh_from_db()
    assert (stored_case.context, stored_case.data) == ({}, [])


@pytest.mark.parametrize(("field", "value", "problem"), BAD_INPUTS)
def test_the_service_refuses_a_context_or_data_the_import_refuses(
    stored_case: EvalCase, field: str, value: Any, problem: str
) -> None:
    with override("ko"), pytest.raises(ValidationError) as refusal:
        eval_case_update(case=stored_case, actor="test", via="tests", data={field: value})

    assert refusal.value.message_dict[field] == [problem]
    stored_case.refresh_from_db()
    assert (stored_case.context, stored_case.data) == ({}, [])


def test_a_set_with_a_context_and_data_exports_and_imports_again_unchanged(
    db: Any, stored_case: EvalCase, tmp_path: Path
) -> None:
    context, data = {"userId": "E-001", "contextId": "c-1"}, [{"asset_id": "A-1001"}, {"order": {"id": 7}}]
    eval_case_update(case=stored_case, actor="test", via="tests", data={"context": context, "data": data})
    exported = tmp_path / "config.json"
    call_command("export_config", "--output", str(exported), stdout=io.StringIO())

    out = io.StringIO()
    call_command("import_config", str(exported), stdout=out)

    assert "unchanged: eval set s1" in out.getvalue()
    [case] = eval_set_document(EvalSet.objects.get(name="s1"))["cases"]
    assert (case["context"], case["data"]) == (context, data)


# ---- an ordered case: its arguments in order too ----------------------------------------------------------------


def _ordered(*steps: int) -> CaseSpec:
    return CaseSpec(expected_tools=[{"name": "transfer", "args": {"step": s}} for s in steps], ordered=True)


def _transfers(*steps: int) -> list[ToolCall]:
    return [ToolCall("transfer", {"step": s}, True) for s in steps]


def test_an_ordered_case_fails_on_its_calls_made_the_other_way_round_as_an_order() -> None:
    score = score_case(_ordered(1, 2), calls=_transfers(2, 1), answer="", run_succeeded=True)

    assert not score.passed and score.failed_checks == ["tools:order"]
    assert (score.sequence_match, score.argument_match) == (False, 1.0)


def test_an_ordered_case_passes_on_its_calls_in_order() -> None:
    score = score_case(_ordered(1, 2), calls=_transfers(1, 2), answer="", run_succeeded=True)

    assert score.passed and score.sequence_match


def test_an_ordered_case_whose_arguments_no_order_would_meet_fails_on_its_arguments_not_its_order() -> None:
    score = score_case(_ordered(1, 2), calls=_transfers(1, 1), answer="", run_succeeded=True)

    assert score.failed_checks == ["tools:args"]
    assert (score.sequence_match, score.argument_match) == (True, 0.5)


# ---- a call retried: shown as its final attempt ended ----------------------------------------------------------


@pytest.mark.django_db
def test_a_retried_call_is_shown_as_its_final_attempt_ended_with_its_attempts_counted() -> None:
    run_id = uuid.uuid4()

    def attempt(tool: str, call_id: str, attempt: int, ok: bool, reason: str = "") -> None:
        audit_event_record(
            source="eval", run_id=run_id, mcp_id="stock", tool=tool, call_id=call_id, args={"key": "k"},
            ok=ok, reason=reason, attempt=attempt,
        )  # fmt: skip

    attempt("slow_once", "c1", 1, False, "timeout")
    attempt("lookup_stock", "c2", 1, False, "timeout")  # a parallel call's attempts, between the first's
    attempt("slow_once", "c1", 2, True)
    attempt("lookup_stock", "c2", 2, False, "timeout")
    attempt("lookup_stock", "c2", 3, False, "rate_limited")

    calls = run_tool_calls_for_scoring(run_id)

    assert [(c.name, c.ok, c.reason, c.attempts) for c in calls] == [
        ("slow_once", True, "", 2),
        ("lookup_stock", False, "rate_limited", 3),
    ]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_call_that_succeeded_on_its_retry_shows_as_succeeded_in_the_api_and_on_the_eval_runs_page(
    settings: Any, admin_client: Client
) -> None:
    server = bind_stock_server(settings)
    contract = ToolContract.objects.get(tool__server=server, tool__name="slow_once")
    retry = {"timeout_s": 0.5, "retry": {"max_attempts": 2, "on": ["timeout"]}}
    tool_contract_update(contract=contract, actor="test", via="tests", data=retry)
    script = [{"tool_calls": [{"name": "slow_once", "args": {"key": "k"}}]}, {"content": "done"}]
    scripted_agent(slug="s", server=server, script=script)
    document = {"name": "r", "cases": [{"key": "c", "query": "q", "expected_tools": ["slow_once"]}]}
    eval_set_apply(document=document, actor="test", via="tests")

    run_eval("s", "r")

    eval_run = EvalRun.objects.get()
    _key, raw = api_key_create(actor="test", via="tests", name="ops", admin=True)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    [shown] = api.get(f"/api/v1/evals/runs/{eval_run.pk}").json()["cases"][0]["called_tools"]
    assert (shown["ok"], shown["reason"], shown.get("attempts")) == (True, "", 2)
    page = admin_client.get(f"/admin/evals/evalrun/{eval_run.pk}/change/").content.decode()
    assert 'class="eval-call-ok"' in page and 'class="eval-call-failed"' not in page
    assert eval_run.results.get().passed
