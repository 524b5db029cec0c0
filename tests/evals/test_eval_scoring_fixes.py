"""What a case expects of a call's arguments is what the audit record can show: an argument the record masks is
refused when a case is saved (and a stored one is met by its presence), JSON types are compared strictly, a call
the gate refused for its arguments meets nothing, the admin's editor keeps a bare number text where the tool
takes text, and ``POST /evals/runs`` takes its version as a JSON number only."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ValidationError
from rest_framework.test import APIClient

from agent_platform.errors import ApplicationError
from agents.services import api_key_create
from audit.masking import mask_value
from evals.case_editor import ToolLinesWidget
from evals.models import EvalCase, EvalRun, EvalSet
from evals.scoring import CaseSpec, ToolCall, json_equal, score_case
from evals.services import eval_case_create, eval_set_apply, eval_set_create
from mcpregistry.local_tools import local_tool
from mcpregistry.models import McpServer, ToolContract
from tests.conftest import discover_as_admin
from tests.evals.conftest import bind_stock_server, run_eval, scripted_agent

THIS_MODULE = __name__


@local_tool
def chat_history(session_id: str) -> str:
    """A chat session's history, by the session's id (an argument name the audit masks)."""
    return f"history of {session_id}"


def _score(expected: list[dict[str, Any]], calls: list[ToolCall]) -> Any:
    return score_case(CaseSpec(expected_tools=expected), calls=calls, answer="", run_succeeded=True)


# ---- an expected argument the audit masks ------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("entry", "where"),
    [
        ({"expected_tools": [{"name": "chat_history", "args": {"session_id": "S-77"}}]}, "session_id"),
        (
            {
                "expected_tools": ["search"],
                "alternatives": [{"tools": [{"name": "login", "args": {"password": "pw"}}]}],
            },
            "password",
        ),
    ],
)
def test_an_expected_argument_the_audit_masks_is_refused_naming_it(entry: dict[str, Any], where: str) -> None:
    with pytest.raises(ApplicationError) as refused:
        eval_set_apply(
            document={"name": "masked", "cases": [{"key": "c", "query": "기록 보여줘", **entry}]},
            actor="test",
            via="tests",
        )
    assert f".args.{where}: the audit record" in refused.value.message
    assert "leave the argument out" in refused.value.message
    assert not EvalCase.objects.exists()


@pytest.mark.django_db
def test_the_shared_case_validation_refuses_it_and_keeps_an_argument_the_record_shows() -> None:
    eval_set = eval_set_create(actor="test", via="tests", data={"name": "masked"})
    data = {"eval_set": eval_set, "key": "c", "query": "기록 보여줘"}
    with pytest.raises(ValidationError) as refused:
        eval_case_create(
            actor="test", via="tests", data={**data, "expected_tools": [{"name": "t", "args": {"api_token": "x1"}}]}
        )
    assert "expected_tools" in refused.value.message_dict
    kept = eval_case_create(
        actor="test",
        via="tests",
        data={**data, "expected_tools": [{"name": "t", "args": {"max_tokens": 5, "author": "김하늘"}}]},
    )
    assert kept.expected_tools == [{"name": "t", "args": {"max_tokens": 5, "author": "김하늘"}}]


def test_a_stored_masked_argument_is_met_by_a_call_that_gave_it_and_missed_by_one_that_did_not() -> None:
    expected = [{"name": "chat_history", "args": {"session_id": "S-77"}}]
    recorded = mask_value({"session_id": "S-77"})  # what the audit record holds of the call
    assert recorded == {"session_id": "***"}
    given = _score(expected, [ToolCall(name="chat_history", args=recorded, ok=True)])
    assert given.passed and given.argument_match == 1.0
    left_out = _score(expected, [ToolCall(name="chat_history", args={}, ok=True)])
    assert not left_out.passed and left_out.failed_checks == ["tools:args"]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_case_stored_before_the_refusal_passes_the_run_that_called_the_tool_with_it(settings: Any) -> None:
    settings.PLATFORM_LOCAL_TOOL_MODULES = ["mcpregistry.builtin_tools", THIS_MODULE]
    server = McpServer(
        mcp_id="sessions", name="sessions", transport=McpServer.Transport.LOCAL, args=[f"{THIS_MODULE}.chat_history"]
    )
    server.full_clean()
    server.save()
    assert discover_as_admin(server=server).ok
    ToolContract.objects.filter(tool__server=server).update(risk="read")
    scripted_agent(
        slug="sessions-agent",
        server=server,
        script=[{"tool_calls": [{"name": "chat_history", "args": {"session_id": "S-77"}}]}, {"content": "기록입니다"}],
    )
    eval_set_apply(
        document={"name": "sessions", "cases": [{"key": "history", "query": "S-77 기록", "expected_tools": []}]},
        actor="test",
        via="tests",
    )
    # Stored as a case saved before such arguments were refused.
    EvalCase.objects.filter(key="history").update(
        expected_tools=[{"name": "chat_history", "args": {"session_id": "S-77"}}]
    )

    status, out, err = run_eval("sessions-agent", "sessions")

    result = EvalRun.objects.get().results.get()
    assert result.called_tools[0]["args"] == {"session_id": "***"}  # the record masks it
    assert status == 0 and result.passed, (out, err, result.scores)
    assert result.scores["argument_match"] == 1.0


# ---- JSON types, and a call refused for its arguments -------------------------------------------------------


@pytest.mark.parametrize(
    ("one", "other", "equal"),
    [
        (1, True, False),
        (0, False, False),
        (1, 1.0, True),
        ("1", 1, False),
        ({"a": [1, True]}, {"a": [1, True]}, True),
        ({"a": [1, 1]}, {"a": [1, True]}, False),
        (None, None, True),
        ("김하늘", "김하늘", True),
    ],
)
def test_json_values_compare_with_their_types(one: Any, other: Any, equal: bool) -> None:
    assert json_equal(one, other) is equal and json_equal(other, one) is equal


def test_a_boolean_does_not_meet_an_expected_number() -> None:
    expected = [{"name": "lookup_stock", "args": {"warehouse": 1}}]
    assert not _score(expected, [ToolCall(name="lookup_stock", args={"warehouse": True}, ok=True)]).passed
    assert _score(expected, [ToolCall(name="lookup_stock", args={"warehouse": 1.0}, ok=True)]).passed


def test_a_call_refused_for_its_arguments_meets_no_expected_tool_but_counts_as_tried() -> None:
    refused = ToolCall(name="lookup_stock", args={"warehouse": 1}, ok=False, reason="args:type:warehouse")
    alone = _score([{"name": "lookup_stock", "args": {"warehouse": 1}}], [refused])
    assert not alone.passed and alone.recall == 0.0 and alone.argument_match == 0.0
    assert "tools:mismatch" in alone.failed_checks and "tools:args" in alone.failed_checks

    corrected = [refused, ToolCall(name="lookup_stock", args={"warehouse": 1}, ok=True)]
    assert _score([{"name": "lookup_stock", "args": {"warehouse": 1}}], corrected).passed  # tried again, right

    wrong_tool = _score(
        ["lookup_stock"], [ToolCall(name="explode", args={}, ok=False, reason="args:json"), corrected[1]]
    )
    assert wrong_tool.precision == 0.5 and not wrong_tool.passed
    forbidden = score_case(
        CaseSpec(expected_tools=[], forbidden_tools=["explode"]),
        calls=[ToolCall(name="explode", args={}, ok=False, reason="args:missing:reason")],
        answer="",
        run_succeeded=True,
    )
    assert forbidden.forbidden_violations == 1 and not forbidden.passed
    # A write the eval blocked ran its arguments' checks: it still meets the expected tool (the attempted call).
    blocked = ToolCall(name="send_notice", args={"team": "A"}, ok=False, reason="eval:write_blocked")
    assert _score([{"name": "send_notice", "args": {"team": "A"}}], [blocked]).passed


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_arguments_typed_in_the_editor_and_a_refused_call_score_as_the_run_called(settings: Any) -> None:
    server = bind_stock_server(settings)
    scripted_agent(
        slug="stock-agent",
        server=server,
        script=[
            {"tool_calls": [{"name": "lookup_stock", "args": {"sku": "1001", "warehouse": True}}]},  # args:type
            {"tool_calls": [{"name": "lookup_stock", "args": {"sku": "1001"}}]},
            {"content": "재고 5개"},
        ],
    )
    typed = ToolLinesWidget().from_lines("lookup_stock\n  sku=1001")
    assert typed == [{"name": "lookup_stock", "args": {"sku": "1001"}}]  # the tool takes sku as text
    eval_set_apply(
        document={
            "name": "stock",
            "cases": [
                {"key": "typed-in-admin", "query": "1001 재고?", "expected_tools": typed},
                {"key": "refused-call", "query": "1001 재고?", "expected_tools": [{"name": "lookup_stock", "args": {"warehouse": 1}}]},
            ],
        },
        actor="test",
        via="tests",
    )  # fmt: skip

    run_eval("stock-agent", "stock")

    results = {r.case.key: r for r in EvalRun.objects.get().results.select_related("case")}
    assert [c["reason"] for c in results["typed-in-admin"].called_tools] == ["args:type:warehouse", ""]
    assert results["typed-in-admin"].passed, results["typed-in-admin"].scores
    assert not results["refused-call"].passed
    assert results["refused-call"].scores["failed_checks"] == ["tools:args"]


# ---- the admin's editor --------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_editor_keeps_a_bare_number_text_only_where_the_tool_takes_text(settings: Any) -> None:
    bind_stock_server(settings)  # lookup_stock(sku: str, warehouse: int)
    widget = ToolLinesWidget()
    assert widget.from_lines("lookup_stock\n  sku=1001\n  warehouse=2") == [
        {"name": "lookup_stock", "args": {"sku": "1001", "warehouse": 2}}
    ]
    assert widget.from_lines('lookup_stock\n  sku="1001"') == [{"name": "lookup_stock", "args": {"sku": "1001"}}]
    assert widget.from_lines("unknown_tool\n  sku=1001") == [{"name": "unknown_tool", "args": {"sku": 1001}}]
    # Shown as lines, a stored text reads back as itself; a stored number under sku could not: shown as JSON.
    assert widget.as_lines([{"name": "lookup_stock", "args": {"sku": "1001"}}]) == 'lookup_stock\n  sku="1001"'
    assert widget.as_lines([{"name": "lookup_stock", "args": {"sku": 1001}}]) is None
    assert widget.as_lines([{"name": "lookup_stock", "args": {"warehouse": 2}}]) == "lookup_stock\n  warehouse=2"


# ---- POST /evals/runs ----------------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("version", ["1", True, 1.5])
def test_a_version_of_the_wrong_json_type_is_a_400_naming_it(version: Any) -> None:
    _key, raw = api_key_create(actor="test", via="tests", name="ops", admin=True)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    EvalSet.objects.create(name="any")

    refused = client.post("/api/v1/evals/runs", {"set": "any", "version": version}, format="json")

    assert refused.status_code == 400, refused.content
    assert "version" in refused.json()["error"].get("fields", {})
    assert not EvalRun.objects.exists()


@pytest.mark.parametrize("reason", ["tool:not_offered", "tool:unknown", "tool:withdrawn"])
def test_a_call_refused_as_not_callable_then_meets_no_expected_tool_but_counts_as_tried(reason: str) -> None:
    """A tool top-K selection did not offer (or one withdrawn, or a name no server has) never ran: the model
    guessing its name is no call made (it met the expected tool, recall 1, the case passed)."""
    guessed = ToolCall(name="lookup_stock", args={"sku": "1001"}, ok=False, reason=reason)
    alone = _score([{"name": "lookup_stock", "args": {"sku": "1001"}}], [guessed])
    assert not alone.passed and alone.recall == 0.0 and alone.argument_match == 0.0
    assert _score(["lookup_stock"], [guessed, ToolCall(name="lookup_stock", args={}, ok=True)]).passed
