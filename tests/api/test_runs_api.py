"""The runs API: 202 on submit, and a clear 4xx JSON error for every bad input — never a 500."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from agents.models import Run

pytestmark = pytest.mark.django_db

URL = "/api/v1/runs"


def error_of(response) -> dict:
    body = response.json()
    assert set(body) == {"error"}, body
    assert {"code", "message"} <= set(body["error"])
    return body["error"]


def test_a_valid_submission_is_accepted_with_202_and_queued(api_client, demo_agent) -> None:
    response = api_client.post(
        URL, {"agent": "company-assistant", "query": "김하늘 님은 어느 팀 소속인가요?"}, format="json"
    )
    assert response.status_code == 202
    body = response.json()
    assert body["status"] == "queued"
    assert Run.objects.get(id=body["id"]).query == "김하늘 님은 어느 팀 소속인가요?"


def test_korean_text_comes_back_unescaped(api_client, demo_agent) -> None:
    response = api_client.post(URL, {"agent": "company-assistant", "query": "팀 인원"}, format="json")
    assert "팀 인원".encode() in response.content


def test_a_missing_query_is_a_400_naming_the_field(api_client, demo_agent) -> None:
    response = api_client.post(URL, {"agent": "company-assistant"}, format="json")
    assert response.status_code == 400
    assert "query" in error_of(response)["fields"]


def test_a_query_of_the_wrong_type_is_a_400(api_client, demo_agent) -> None:
    response = api_client.post(URL, {"agent": "company-assistant", "query": 123}, format="json")
    assert response.status_code == 400
    assert "query" in error_of(response)["fields"]


def test_context_of_the_wrong_type_is_a_400(api_client, demo_agent) -> None:
    response = api_client.post(URL, {"agent": "company-assistant", "query": "q", "context": "x"}, format="json")
    assert response.status_code == 400
    assert "context" in error_of(response)["fields"]


def test_a_body_that_is_not_json_is_a_400(api_client, demo_agent) -> None:
    response = api_client.post(URL, data="{not json", content_type="application/json")
    assert response.status_code == 400
    assert error_of(response)["code"] == "invalid_json"


def test_a_json_body_that_is_not_an_object_is_a_400(api_client, demo_agent) -> None:
    response = api_client.post(URL, data="[1, 2]", content_type="application/json")
    assert response.status_code == 400
    assert error_of(response)["code"] == "invalid_input"


def test_a_form_encoded_body_is_a_415(api_client, demo_agent) -> None:
    response = api_client.post(URL, data="agent=x&query=y", content_type="application/x-www-form-urlencoded")
    assert response.status_code == 415
    assert error_of(response)["code"] == "unsupported_media_type"


def test_an_unknown_agent_is_a_404(api_client, demo_agent) -> None:
    response = api_client.post(URL, {"agent": "nobody", "query": "hi"}, format="json")
    assert response.status_code == 404
    assert error_of(response)["code"] == "agent_not_found"


def test_a_disabled_agent_is_a_409(api_client, demo_agent) -> None:
    demo_agent.enabled = False
    demo_agent.save()
    response = api_client.post(URL, {"agent": "company-assistant", "query": "hi"}, format="json")
    assert response.status_code == 409


def test_an_overlong_query_is_a_413(api_client, demo_agent, settings) -> None:
    settings.PLATFORM_RUN_QUERY_MAX_CHARS = 10
    response = api_client.post(URL, {"agent": "company-assistant", "query": "가" * 11}, format="json")
    assert response.status_code == 413


def test_a_missing_key_is_a_401_with_a_bearer_challenge(db) -> None:
    response = APIClient().post(URL, {"agent": "company-assistant", "query": "hi"}, format="json")
    assert response.status_code == 401
    assert error_of(response)["code"] == "not_authenticated"
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_a_wrong_key_is_a_401(db) -> None:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer apk_not-a-real-key")
    response = client.get(f"{URL}/00000000-0000-0000-0000-000000000000")
    assert response.status_code == 401
    assert error_of(response)["code"] == "authentication_failed"


def test_a_malformed_authorization_header_is_a_401(db) -> None:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token abc")
    assert client.get(f"{URL}/x").status_code == 401


def test_a_revoked_key_is_a_401(api_client, api_caller) -> None:
    from django.utils import timezone

    key, _raw = api_caller
    key.revoked_at = timezone.now()
    key.save()
    assert api_client.get(f"{URL}/00000000-0000-0000-0000-000000000000").status_code == 401


def test_a_malformed_run_id_is_a_404(api_client) -> None:
    response = api_client.get(f"{URL}/not-a-uuid")
    assert response.status_code == 404
    assert error_of(response)["code"] == "run_not_found"


def test_another_callers_run_is_a_404(api_client, demo_agent, other_caller) -> None:
    run_id = api_client.post(URL, {"agent": "company-assistant", "query": "hi"}, format="json").json()["id"]
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Bearer {other_caller.raw_key}")
    assert other.get(f"{URL}/{run_id}").status_code == 404
    assert api_client.get(f"{URL}/{run_id}").status_code == 200


def test_a_key_scoped_to_other_agents_cannot_use_this_one(demo_agent) -> None:
    from agents.models import Agent
    from agents.services import api_key_create

    other = Agent.objects.create(slug="other", name="other")
    _key, raw = api_key_create(actor="test", via="tests", name="scoped", agents=[other])
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    response = client.post(URL, {"agent": "company-assistant", "query": "hi"}, format="json")
    assert response.status_code == 404


def test_an_unknown_api_path_is_a_json_404(api_client) -> None:
    response = api_client.get("/api/v1/nothing-here")
    assert response.status_code == 404
    assert error_of(response)["code"] == "not_found"


def test_a_wrong_method_is_a_405(api_client) -> None:
    response = api_client.delete(URL)
    assert response.status_code == 405
    assert error_of(response)["code"] == "method_not_allowed"


# --- strict validation of POST /runs ------------------------------------------------------------------------


def test_an_unknown_top_level_field_is_a_400_naming_it(api_client, demo_agent) -> None:
    response = api_client.post(
        URL, {"agent": "company-assistant", "query": "hi", "qurey": "typo", "priority": 1}, format="json"
    )
    assert response.status_code == 400
    fields = error_of(response)["fields"]
    assert set(fields) == {"qurey", "priority"}
    assert Run.objects.count() == 0


def test_an_unknown_field_is_named_together_with_other_errors(api_client, demo_agent) -> None:
    response = api_client.post(URL, {"agent": "company-assistant", "query": 5, "extra": True}, format="json")
    assert response.status_code == 400
    assert {"query", "extra"} <= set(error_of(response)["fields"])


def test_an_agent_of_the_wrong_type_is_a_400(api_client, demo_agent) -> None:
    response = api_client.post(URL, {"agent": ["company-assistant"], "query": "hi"}, format="json")
    assert response.status_code == 400
    assert "agent" in error_of(response)["fields"]


def test_data_that_is_not_a_list_of_objects_is_a_400(api_client, demo_agent) -> None:
    for data in ({"a": 1}, ["x"], "x"):
        response = api_client.post(URL, {"agent": "company-assistant", "query": "q", "data": data}, format="json")
        assert response.status_code == 400, data
        assert "data" in error_of(response)["fields"]


def test_a_blank_query_is_a_400(api_client, demo_agent) -> None:
    response = api_client.post(URL, {"agent": "company-assistant", "query": "   "}, format="json")
    assert response.status_code == 400
    assert "query" in error_of(response)["fields"]


def test_query_and_message_together_are_a_400_naming_both(api_client, demo_agent) -> None:
    message = {"role": "user", "parts": [{"kind": "text", "text": "hi"}]}
    response = api_client.post(URL, {"agent": "company-assistant", "query": "hi", "message": message}, format="json")
    assert response.status_code == 400
    assert {"query", "message"} <= set(error_of(response)["fields"])


def test_a_wait_that_is_not_a_number_in_range_is_a_400(api_client, demo_agent) -> None:
    for wait in ("soon", "-1", "61", "nan", "1_0", "1e1", "%201", "inf", "."):
        response = api_client.post(f"{URL}?wait={wait}", {"agent": "company-assistant", "query": "hi"}, format="json")
        assert response.status_code == 400, wait
        assert "wait" in error_of(response)["fields"]


def test_a_body_larger_than_the_limit_is_a_413(api_client, demo_agent, settings) -> None:
    settings.PLATFORM_API_MAX_BODY_BYTES = 1000
    response = api_client.post(
        URL, {"agent": "company-assistant", "query": "hi", "context": {"pad": "x" * 2000}}, format="json"
    )
    assert response.status_code == 413
    assert error_of(response)["code"] == "body_too_large"


def test_a_run_created_through_the_api_keeps_the_plain_data_and_file_metadata(api_client, demo_agent) -> None:
    response = api_client.post(
        URL,
        {
            "agent": "company-assistant",
            "query": "q",
            "context": {"userId": "u-1"},
            "data": [{"order": {"id": "O-1"}}],
            "files": [{"name": "a.txt", "mimeType": "text/plain", "bytes": "aGVsbG8="}],
        },
        format="json",
    )
    assert response.status_code == 202
    run = Run.objects.get(id=response.json()["id"])
    assert run.context == {"userId": "u-1"}
    assert run.a2a_data == [{"order": {"id": "O-1"}}]
    assert run.a2a_files == [{"name": "a.txt", "mimeType": "text/plain", "size": 5}]


# --- GET /runs --------------------------------------------------------------------------------------------


def submit(client: APIClient, query: str = "hi", agent: str = "company-assistant") -> str:
    response = client.post(URL, {"agent": agent, "query": query}, format="json")
    assert response.status_code == 202, response.content
    return response.json()["id"]


def test_the_list_holds_the_callers_runs_only_newest_first(api_client, demo_agent, other_caller) -> None:
    first, second = submit(api_client, "one"), submit(api_client, "two")
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Bearer {other_caller.raw_key}")
    submit(other, "someone else's")
    body = api_client.get(URL).json()
    assert [r["id"] for r in body["results"]] == [second, first]
    assert body["next"] is None
    assert body["previous"] is None
    assert set(body["results"][0]) >= {"id", "agent", "status", "query", "answer", "error", "created_at"}


def test_the_list_filters_by_agent_and_status(api_client, demo_agent) -> None:
    from tests.conftest import make_agent

    make_agent(slug="second", servers=list(demo_agent.servers.all()), with_demo_rules=False)
    mine = submit(api_client, agent="company-assistant")
    theirs = submit(api_client, agent="second")
    Run.objects.filter(id=theirs).update(status=Run.Status.FAILED)
    assert [r["id"] for r in api_client.get(f"{URL}?agent=second").json()["results"]] == [theirs]
    assert [r["id"] for r in api_client.get(f"{URL}?status=queued").json()["results"]] == [mine]
    assert api_client.get(f"{URL}?agent=second&status=queued").json()["results"] == []
    assert api_client.get(f"{URL}?agent=nobody").json()["results"] == []


def test_the_list_is_paginated_with_a_cursor(api_client, demo_agent) -> None:
    from datetime import timedelta

    from django.utils import timezone

    ids = [submit(api_client, f"q{i}") for i in range(5)]
    base = timezone.now()
    for i, run_id in enumerate(ids):  # distinct creation times, oldest first
        Run.objects.filter(id=run_id).update(created_at=base - timedelta(minutes=10 - i))
    seen: list[str] = []
    url = f"{URL}?page_size=2"
    pages = 0
    while url:
        body = api_client.get(url).json()
        seen += [r["id"] for r in body["results"]]
        url = body["next"]
        pages += 1
    assert seen == list(reversed(ids))
    assert pages == 3


def test_bad_list_parameters_are_a_400_naming_them(api_client, demo_agent) -> None:
    for query, field in (
        ("status=done", "status"),
        ("page_size=0", "page_size"),
        ("page_size=many", "page_size"),
        ("cursor=not-a-cursor", "cursor"),
        ("colour=blue", "colour"),
    ):
        response = api_client.get(f"{URL}?{query}")
        assert response.status_code == 400, query
        assert field in error_of(response)["fields"], query


def test_listing_needs_a_key(db) -> None:
    assert APIClient().get(URL).status_code == 401


# --- API keys: revocation ----------------------------------------------------------------------------------


def test_revoking_a_key_by_its_prefix_makes_its_next_request_a_401(api_client, api_caller, demo_agent) -> None:
    from io import StringIO

    from django.core.management import call_command

    from audit.models import AuditEvent

    key, _raw = api_caller
    assert api_client.get(URL).status_code == 200
    out = StringIO()
    call_command("revoke_api_key", key.prefix, stdout=out)
    assert f"revoked {key.prefix}" in out.getvalue()
    key.refresh_from_db()
    assert key.revoked_at is not None
    assert api_client.get(URL).status_code == 401
    event = AuditEvent.objects.get(action="config.api_key.revoke")
    assert (event.actor, event.result["via"], event.result["name"]) == (
        "system:revoke_api_key",
        "revoke_api_key",
        str(key),
    )
    assert list(event.args) == ["revoked_at"]


def test_revoking_a_revoked_key_changes_nothing(api_caller) -> None:
    from io import StringIO

    from django.core.management import call_command

    key, _raw = api_caller
    call_command("revoke_api_key", "caller", stdout=StringIO())
    key.refresh_from_db()
    first = key.revoked_at
    out = StringIO()
    call_command("revoke_api_key", "caller", stdout=out)
    assert "already revoked" in out.getvalue()
    key.refresh_from_db()
    assert key.revoked_at == first


def test_a_name_shared_by_live_keys_needs_a_prefix_or_all(db) -> None:
    from io import StringIO

    from django.core.management import call_command
    from django.core.management.base import CommandError

    from agents.models import ApiKey
    from agents.services import api_key_create

    api_key_create(actor="test", via="tests", name="ci")
    api_key_create(actor="test", via="tests", name="ci")
    with pytest.raises(CommandError, match="2 live keys"):
        call_command("revoke_api_key", "ci", stdout=StringIO())
    call_command("revoke_api_key", "ci", "--all", stdout=StringIO())
    assert ApiKey.objects.filter(name="ci", revoked_at__isnull=True).count() == 0


def test_an_unknown_key_is_a_command_error(db) -> None:
    from django.core.management import call_command
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="no API key"):
        call_command("revoke_api_key", "apk_nothing")


def test_a_key_can_be_revoked_by_its_whole_value(api_caller) -> None:
    from io import StringIO

    from django.core.management import call_command

    key, raw = api_caller
    call_command("revoke_api_key", raw, stdout=StringIO())
    key.refresh_from_db()
    assert key.revoked_at is not None


def test_a_request_records_the_keys_last_use(api_client, api_caller) -> None:
    key, _raw = api_caller
    assert key.last_used_at is None
    api_client.get(URL)
    key.refresh_from_db()
    assert key.last_used_at is not None


@pytest.mark.parametrize("body", ["", "null", "{}"])
def test_an_empty_body_is_a_400(api_client, demo_agent, body) -> None:
    response = api_client.post(URL, data=body, content_type="application/json")
    assert response.status_code == 400
    assert error_of(response)["code"] in {"invalid_input", "invalid_json"}


@pytest.mark.django_db
def test_the_run_answer_s_fields_built_once_are_never_bound_and_each_answer_is_its_own(demo_agent) -> None:
    """``RunOutputSerializer`` copies its fields, built once per process, for each answer: answers of different
    runs, also from threads at once, are each their own run's, and the kept fields stay unbound."""
    from concurrent.futures import ThreadPoolExecutor

    from agents.api.serializers import BuiltOnceFields, RunOutputSerializer, RunSummarySerializer

    runs = [Run.objects.create(agent=demo_agent, query=f"질문 {i}") for i in range(12)]
    with ThreadPoolExecutor(max_workers=4) as pool:
        answers = list(pool.map(lambda run: dict(RunOutputSerializer(run).data), runs))
    assert [(a["id"], a["query"], a["agent"]) for a in answers] == [(str(r.id), r.query, demo_agent.slug) for r in runs]
    assert [s["query"] for s in RunSummarySerializer(runs, many=True).data] == [r.query for r in runs]
    for kept in (
        BuiltOnceFields._built_fields[RunOutputSerializer],
        BuiltOnceFields._built_fields[RunSummarySerializer],
    ):
        assert all(
            getattr(field, "field_name", None) is None and getattr(field, "parent", None) is None
            for field in kept.values()
        )


def drf_answers(run: Run) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(the answer as the serializers write it, field by field as DRF's own ``Serializer.to_representation``
    writes it with the fields DRF builds and binds for each answer), for the run's detail and summary."""
    from rest_framework import serializers

    from agents.api.serializers import BuiltOnceFields, RunOutputSerializer, RunSummarySerializer

    pairs = []
    for serializer_class in (RunOutputSerializer, RunSummarySerializer):
        ours = BuiltOnceFields.to_representation(serializer_class(run), run)
        drf = serializers.Serializer.to_representation(serializer_class(run), run)
        pairs.append((ours, drf))
    return pairs


@pytest.mark.django_db
def test_the_run_answer_written_by_fields_bound_once_is_drf_s_own_for_runs_in_every_state(
    api_client, demo_agent
) -> None:
    from agents.execution import run_execute

    queued = Run.objects.create(agent=demo_agent, query="김하늘 님은 어느 팀 소속인가요?", context={"팀": "운영"})
    submitted = api_client.post(
        URL, {"agent": demo_agent.slug, "query": "김하늘 님은 어느 팀 소속인가요?"}, format="json"
    )
    assert submitted.status_code == 202, submitted.content
    finished = Run.objects.get(id=submitted.json()["id"])
    run_execute(run_id=str(finished.id))
    failed = Run.objects.create(
        agent=demo_agent, query="실패", status=Run.Status.FAILED, error_code="time_limit", error_message="시간 초과"
    )
    answered = api_client.post(f"{URL}/{finished.id}/feedback", {"score": 1, "comment": "좋아요"}, format="json")
    assert answered.status_code in (200, 201), answered.content
    finished.refresh_from_db()
    assert finished.status == Run.Status.SUCCEEDED and finished.feedback_at is not None
    for run in (queued, finished, failed):
        for ours, drf in drf_answers(run):
            assert ours == drf
            assert list(ours) == list(drf)  # the same keys in the same order
    detail = drf_answers(finished)[0][0]
    assert detail["tool_calls"] and detail["tool_calls"][0]["name"] == "search_employee"
    assert detail["feedback"]["comment"] == "좋아요" and detail["error"] is None
    assert drf_answers(failed)[0][0]["error"] == {"code": "time_limit", "message": "시간 초과"}


@pytest.mark.django_db
def test_a_run_whose_stored_results_are_not_all_objects_is_still_answered(api_client, api_caller, demo_agent) -> None:
    # Stored by an older version, or by hand: the run is read as it is, never a 500.
    run = Run.objects.create(
        agent=demo_agent, api_key=api_caller.key, query="q", deterministic_results=["text", {"tool": "t"}]
    )
    response = api_client.get(f"/api/v1/runs/{run.id}")
    assert response.status_code == 200, response.content
    assert response.json()["deterministic_results"] == ["text", {"tool": "t"}]
