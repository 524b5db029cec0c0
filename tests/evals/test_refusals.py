"""What a set's document, the admin and ``run_eval`` refuse, and how: a 400 (or a form error, or a command error)
that names what is wrong, never a 500. NaN and the infinities (which no JSON column stores), answer checks that
check nothing, limits no score can meet, blank questions, servers that do not exist."""

from __future__ import annotations

import io
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from rest_framework.test import APIClient

from agent_platform.errors import ApplicationError
from agent_platform.json import BoundedJSONDecoder, FiniteJSONDecoder, json_error_text
from agent_platform.json import loads as json_loads
from agents.configuration import config_import
from agents.models import Agent
from agents.services import api_key_create
from evals.labels import check_label
from evals.models import EvalCase, EvalSet
from evals.scoring import case_problems, score_case, threshold_problems
from evals.services import eval_case_create, eval_set_apply, eval_set_create
from mcpregistry.models import McpServer

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_key_client(db: Any) -> APIClient:
    _key, raw = api_key_create(actor="test", via="tests", name="ops", admin=True)
    client = APIClient(raise_request_exception=False)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def _refused(client: APIClient, document: dict[str, Any]) -> str:
    response = client.post("/api/v1/evals/sets", document, format="json")
    assert response.status_code == 400, response.content
    assert not EvalSet.objects.filter(name=document["name"]).exists()
    return str(response.json()["error"]["message"])


# ---- NaN and the infinities -----------------------------------------------------------------------------------


@pytest.mark.parametrize("limit", ["inf", "NaN", "-Infinity", "Infinity"])
def test_a_threshold_that_reads_as_no_finite_number_is_a_400_not_a_500(admin_key_client: APIClient, limit: str) -> None:
    """pydantic reads "inf" and "NaN" as floats; stored, they were an IntegrityError (the JSON column's check)."""
    message = _refused(admin_key_client, {"name": "gate", "thresholds": {"latency_p95_ms": limit}, "cases": []})
    assert "thresholds.latency_p95_ms" in message


@pytest.mark.parametrize("limit", [math.inf, -math.inf, math.nan])
def test_threshold_problems_refuse_numbers_that_are_not_finite(limit: float) -> None:
    assert threshold_problems({"latency_p95_ms": limit}) == ["latency_p95_ms: a number"]
    assert threshold_problems({"recall": limit})  # NaN is not "between 0 and 1" either


def test_a_maximum_below_zero_is_refused_as_no_run_could_meet_it(admin_key_client: APIClient) -> None:
    assert threshold_problems({"forbidden_violations": -1}) == ["forbidden_violations: 0 or more"]
    assert threshold_problems({"latency_p95_ms": -0.5}) == ["latency_p95_ms: 0 or more"]
    assert threshold_problems({"forbidden_violations": 0, "latency_p95_ms": 800}) == []
    message = _refused(admin_key_client, {"name": "gate", "thresholds": {"forbidden_violations": -1}, "cases": []})
    assert "forbidden_violations: 0 or more" in message


def test_import_config_refuses_an_infinite_threshold_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    document = {
        "eval_sets": [{"name": "gate", "thresholds": {"latency_p95_ms": "Infinity"}, "cases": [{"query": "q"}]}]
    }
    path.write_text(json.dumps(document), encoding="utf-8")
    with pytest.raises(CommandError, match=r"thresholds\.latency_p95_ms"):
        call_command("import_config", str(path), stdout=io.StringIO(), stderr=io.StringIO())
    assert not EvalSet.objects.exists()


def test_a_case_whose_json_holds_a_number_that_is_not_finite_is_refused_at_its_field() -> None:
    """What Python's JSON reader lets through (a YAML ``.inf``, ``1e400``, ``NaN``) is refused where it is."""
    document = {
        "name": "gate",
        "cases": [
            {"query": "q", "context": {"n": math.inf}, "expected_tools": [{"name": "t", "args": {"x": math.nan}}]}
        ],
    }
    with pytest.raises(ApplicationError, match="NaN and Infinity are not numbers JSON holds"):
        config_import(document={"eval_sets": [document]}, actor="test", via="tests")
    assert set(
        case_problems(expected_tools=[], forbidden_tools=[], answer_checks=[], alternatives=[], data=[{"a": [1e400]}])
    ) == {"data"}
    assert not EvalSet.objects.exists()


def test_the_finite_decoder_refuses_nan_and_infinity_saying_where() -> None:
    for text, token in [
        ('{"a": NaN}', "NaN}"),
        ('[1, "NaN, Infinity", -Infinity]', "-Infinity]"),
        ('{"s": "\\"1e400", "n": 1e400}', "1e400}"),
    ]:
        with pytest.raises(json.JSONDecodeError) as refused:
            json.loads(text, cls=FiniteJSONDecoder)
        assert text[refused.value.pos :] == token, text
        assert json_error_text(refused.value).startswith("a number is not finite (NaN and Infinity are not JSON)")
    assert json.loads('{"n": 1.5e3, "s": "NaN"}', cls=FiniteJSONDecoder) == {"n": 1500.0, "s": "NaN"}
    # The default decoder is unchanged: its callers (a tool's answer, the contract editor) pass their own hooks.
    assert math.isinf(json.loads("[Infinity]", cls=BoundedJSONDecoder)[0]) and math.isinf(json_loads("[1e400]")[0])


def _superuser_client() -> Client:
    from django.contrib.auth import get_user_model

    client = Client(raise_request_exception=False)
    client.force_login(get_user_model().objects.create_superuser("root", "root@example.com", "pw-123-long-Enough"))
    return client


@pytest.mark.parametrize("which", ["thresholds", "case_context"])
def test_the_admin_refuses_nan_and_infinity_in_a_raw_json_box_at_its_field(which: str) -> None:
    client = _superuser_client()
    agent = Agent.objects.create(slug="a", name="a")
    eval_set = eval_set_create(actor="test", via="tests", data={"name": "s", "agent": agent})
    data = {"name": "s", "agent": agent.pk, "thresholds": "{}", "cases-TOTAL_FORMS": "0", "cases-INITIAL_FORMS": "0"}
    if which == "thresholds":
        data["thresholds"] = '{"latency_p95_ms": Infinity}'
    else:
        data.update({
            "cases-TOTAL_FORMS": "1", "cases-0-key": "q1", "cases-0-order": "1", "cases-0-case_type": "single_tool",
            "cases-0-query": "질문", "cases-0-expected_tools": "[]", "cases-0-forbidden_tools": "[]",
            "cases-0-answer_checks": "[]", "cases-0-alternatives": "[]", "cases-0-context": '{"n": NaN}',
            "cases-0-data": "[]",
        })  # fmt: skip
    response = client.post(f"/admin/evals/evalset/{eval_set.pk}/change/", data)
    assert response.status_code == 200  # the form again, not a 500
    assert "a number is not finite" in response.content.decode()
    eval_set.refresh_from_db()
    assert eval_set.thresholds == {} and not EvalCase.objects.exists()


# ---- answer checks, queries, sandbox servers -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("check", "problem"),
    [
        ({"contains": None}, "[0]: contains takes a text that is not empty"),
        ({"contains": "  "}, "[0]: contains takes a text that is not empty"),
        ({"regex": ""}, "[0]: regex takes a text that is not empty"),
        ({"dont_know": "yes"}, "[0]: dont_know takes true (or leave the check out)"),
        ({"dont_know": False}, "[0]: dont_know takes true (or leave the check out)"),
    ],
)
def test_an_answer_check_that_checks_nothing_or_something_else_is_refused(
    admin_key_client: APIClient, check: dict[str, Any], problem: str
) -> None:
    """``{"contains": null}`` used to check for the text "None"; ``{"dont_know": "yes"}`` read as true."""
    message = _refused(admin_key_client, {"name": "checks", "cases": [{"query": "q", "answer_checks": [check]}]})
    assert problem in message


def test_a_number_to_contain_is_still_taken_as_written(admin_key_client: APIClient) -> None:
    """Sets written before the checks were tightened hold ``{"contains": 1001}``: still the text "1001"."""
    document = {"name": "numbers", "cases": [{"query": "q", "answer_checks": [{"contains": 1001}]}]}
    assert admin_key_client.post("/api/v1/evals/sets", document, format="json").status_code == 201
    case = EvalCase.objects.get(eval_set__name="numbers")
    assert score_case(eval_set_spec(case), calls=[], answer="자산 1001번", run_succeeded=True).passed
    assert not score_case(eval_set_spec(case), calls=[], answer="자산 1002번", run_succeeded=True).passed


def test_an_answer_regex_is_validated_by_the_module_that_matches_it(admin_key_client: APIClient) -> None:
    """``\\p{Hangul}`` and a variable-length lookbehind are the ``regex`` module's, which the scoring uses."""
    document = {"name": "hangul", "cases": [{"query": "q", "answer_checks": [{"regex": "\\p{Hangul}+팀"}]}]}
    assert admin_key_client.post("/api/v1/evals/sets", document, format="json").status_code == 201
    case = EvalCase.objects.get(eval_set__name="hangul")
    assert score_case(eval_set_spec(case), calls=[], answer="플랫폼팀입니다", run_succeeded=True).passed
    message = _refused(admin_key_client, {"name": "bad", "cases": [{"query": "q", "answer_checks": [{"regex": "(a"}]}]})
    assert "(a: not a valid regular expression: a ( is not closed with )" in message


def eval_set_spec(case: EvalCase) -> Any:
    from evals.scoring import CaseSpec

    return CaseSpec(expected_tools=case.expected_tools, answer_checks=case.answer_checks)


def test_a_blank_query_is_refused_in_a_document_and_in_the_model(admin_key_client: APIClient) -> None:
    message = _refused(admin_key_client, {"name": "blank", "cases": [{"query": " \n "}]})
    assert "cases[0]: query: must not be empty" in message
    eval_set = eval_set_create(actor="test", via="tests", data={"name": "s"})
    with pytest.raises(ValidationError, match="The query is empty"):
        eval_case_create(actor="test", via="tests", data={"eval_set": eval_set, "key": "k", "query": "   "})


def test_a_sandbox_server_that_does_not_exist_is_refused_and_one_that_does_is_taken(
    admin_key_client: APIClient,
) -> None:
    message = _refused(admin_key_client, {"name": "sandbox", "sandbox_servers": ["nope"], "cases": [{"query": "q"}]})
    assert "sandbox_servers: no MCP server nope" in message
    McpServer.objects.create(mcp_id="notes", name="notes", transport="stdio", command="python3")
    document = {"name": "sandbox", "sandbox_servers": ["notes"], "cases": [{"query": "q"}]}
    assert admin_key_client.post("/api/v1/evals/sets", document, format="json").status_code == 201


def test_a_sandbox_server_deleted_since_does_not_block_the_set_it_is_stored_in() -> None:
    server = McpServer.objects.create(mcp_id="notes", name="notes", transport="stdio", command="python3")
    document = {"name": "sandbox", "sandbox_servers": ["notes"], "cases": [{"query": "q"}]}
    eval_set_apply(document=document, actor="test", via="tests")
    server.delete()
    assert not eval_set_apply(document=document, actor="test", via="tests").changed


# ---- messages in words ---------------------------------------------------------------------------------------


def test_a_documents_field_problems_are_the_platforms_words_not_pydantics(admin_key_client: APIClient) -> None:
    """Each in a msgid of ours (``evals.documents._pydantic_problem``), so each is translated as any other."""
    message = _refused(admin_key_client, {"name": "words", "owner": "x"})
    assert "owner: not a known field" in message
    message = _refused(admin_key_client, {"name": "words", "cases": [{"question_text": "q"}]})
    assert "cases[0]: query: required" in message and "question_text: not a known field" in message
    assert "Field required" not in message and "Extra inputs are not permitted" not in message
    assert "name: must not be empty" in _refused(admin_key_client, {"name": ""})
    message = _refused(admin_key_client, {"name": "words", "cases": [{"query": "q", "ordered": "maybe"}]})
    assert "cases[0]: ordered: must be true or false" in message


def test_a_case_that_could_not_become_a_run_names_its_reason_in_words() -> None:
    assert check_label("eval:not_submitted:query_too_long") == "the case could not become a run (query_too_long)"
    assert check_label("eval:not_submitted:") == "eval:not_submitted:"


def test_run_eval_refuses_a_label_longer_than_its_column_clearly() -> None:
    agent = Agent.objects.create(slug="a", name="a")
    eval_set = eval_set_create(actor="test", via="tests", data={"name": "s", "agent": agent})
    eval_case_create(actor="test", via="tests", data={"eval_set": eval_set, "key": "k", "query": "q"})
    with pytest.raises(CommandError, match="The label is longer than 200 characters"):
        call_command(
            "run_eval", "a", "s", "--label", "x" * 201, "--timeout", "1", stdout=io.StringIO(), stderr=io.StringIO()
        )
    assert not eval_set.runs.exists()


def test_a_documents_field_problems_follow_the_readers_language(admin_key_client: APIClient) -> None:
    """Under ``Accept-Language: ko`` pydantic's English ("Field required", "Input should be a number") used to
    stay in the message. (The text "NaN" is no number: refused as any text where a number belongs is.)"""
    document = {"name": "ko", "thresholds": {"recall": "NaN"}, "cases": []}
    response = admin_key_client.post("/api/v1/evals/sets", document, format="json", HTTP_ACCEPT_LANGUAGE="ko")
    assert response.status_code == 400
    assert response.json()["error"]["message"] == "평가 세트가 올바르지 않습니다: thresholds.recall: 숫자여야 합니다"
    document = {"name": "ko", "cases": [{"key": "k", "ordered": "maybe"}]}
    response = admin_key_client.post("/api/v1/evals/sets", document, format="json", HTTP_ACCEPT_LANGUAGE="ko")
    message = response.json()["error"]["message"]
    assert "query: 필수" in message and "ordered: true 또는 false여야 합니다" in message, message


# ---- values of the wrong JSON type (strict, as the admin's form is) ------------------------------------------


@pytest.mark.parametrize(
    ("document", "named"),
    [
        ({"thresholds": {"recall": True}}, "thresholds.recall: must be a number"),  # was stored as 1.0
        ({"thresholds": {"recall": "0.5"}}, "thresholds.recall: must be a number"),  # was stored as 0.5
        ({"cases": [{"query": "q", "ordered": "yes"}]}, "cases[0]: ordered: must be true or false"),  # was true
        ({"cases": [{"query": "q", "order": True}]}, "cases[0]: order: must be a whole number"),  # was 1
        (
            {"cases": [{"query": "q", "alternatives": [{"tools": ["t"], "ordered": 1}]}]},
            "cases[0]: alternatives.0.ordered: must be true or false",
        ),
    ],
)
def test_a_value_of_the_wrong_json_type_is_refused_naming_its_field_not_converted(
    admin_key_client: APIClient, document: dict[str, Any], named: str
) -> None:
    """The API and ``import_config`` converted what the admin's form refuses: each such POST was a 201."""
    message = _refused(admin_key_client, {"name": "loose", **document})
    assert named in message, message
    with pytest.raises(ApplicationError, match=re.escape(named)):
        config_import(document={"eval_sets": [{"name": "loose", **document}]}, actor="test", via="tests")
    assert not EvalSet.objects.exists()


def test_a_whole_number_is_still_a_threshold(admin_key_client: APIClient) -> None:
    response = admin_key_client.post(
        "/api/v1/evals/sets", {"name": "whole", "thresholds": {"recall": 1, "latency_p95_ms": 800}}, format="json"
    )
    assert response.status_code == 201, response.content
    assert EvalSet.objects.get(name="whole").thresholds == {"recall": 1.0, "latency_p95_ms": 800.0}
