"""An approval's reason in the REST API's caller's language (``GET /runs/{id}``, the decide response).

The defect: the reasons the platform writes itself (a cancelled run, a call the run did not make, a run made
again) are stored in stable English and were shown to API callers only that way, while the admin showed them
translated. An approval now carries ``reason_text``, the reason in the request's language (``Accept-Language``),
beside the unchanged ``reason``; a person's own reason passes through as written. The schema declares it.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from agents.decision_reasons import ASKED_AGAIN_APPROVAL, CANCELLED_APPROVAL, UNUSED_APPROVAL
from agents.models import Agent, ApiKey, Approval, Run
from tests.conftest import ApiCaller

pytestmark = pytest.mark.django_db

RUNS = "/api/v1/runs"


def parked_run(agent: Agent, key: ApiKey) -> tuple[Run, Approval]:
    """A run waiting for a person's decision on one write call (no worker runs it here)."""
    run = Run.objects.create(
        agent=agent,
        api_key=key,
        query="메모 남겨줘",
        status=Run.Status.AWAITING_APPROVAL,
        started_at=timezone.now(),
    )
    approval = Approval.objects.create(
        run=run,
        mcp_id="notes",
        tool="append_note",
        args={"text": "회의록"},
        call_hash="h" * 64,
        expires_at=timezone.now() + dt.timedelta(hours=1),
    )
    return run, approval


def approval_read(client: APIClient, run: Run, language: str) -> dict[str, Any]:
    response = client.get(f"{RUNS}/{run.id}", HTTP_ACCEPT_LANGUAGE=language)
    assert response.status_code == 200, response.content
    [approval] = response.json()["approvals"]
    return approval  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("language", "text"), [("ko", "실행이 취소되었습니다"), ("en", "the run was cancelled")], ids=["ko", "en"]
)
def test_a_cancelled_runs_approval_reads_its_reason_in_the_callers_language(
    api_client: APIClient, api_caller: ApiCaller, demo_agent: Agent, language: str, text: str
) -> None:
    run, _approval = parked_run(demo_agent, api_caller.key)
    cancelled = api_client.post(f"{RUNS}/{run.id}/cancel", HTTP_ACCEPT_LANGUAGE=language)
    assert cancelled.status_code == 200, cancelled.content
    assert cancelled.json()["approvals"][0]["reason_text"] == text
    approval = approval_read(api_client, run, language)
    assert approval["status"] == "expired"
    assert approval["reason"] == CANCELLED_APPROVAL  # the stable value, unchanged, for programs
    assert approval["reason_text"] == text


@pytest.mark.parametrize(
    ("reason", "korean"),
    [
        (UNUSED_APPROVAL, "실행이 이 호출을 하지 않고 끝났습니다"),
        (ASKED_AGAIN_APPROVAL, "실행을 다시 수행했고 이 호출은 다시 요청되지 않았습니다"),
    ],
    ids=["unused", "asked_again"],
)
def test_every_reason_the_platform_writes_is_translated(
    api_client: APIClient, api_caller: ApiCaller, demo_agent: Agent, reason: str, korean: str
) -> None:
    run, approval = parked_run(demo_agent, api_caller.key)
    Approval.objects.filter(pk=approval.pk).update(status=Approval.Status.EXPIRED, reason=reason)
    Run.objects.filter(pk=run.pk).update(status=Run.Status.SUCCEEDED, finished_at=timezone.now())
    korean_answer = approval_read(api_client, run, "ko")
    assert (korean_answer["reason"], korean_answer["reason_text"]) == (reason, korean)
    english_answer = approval_read(api_client, run, "en")
    assert (english_answer["reason"], english_answer["reason_text"]) == (reason, reason)


@pytest.mark.parametrize("language", ["ko", "en"])
def test_a_persons_own_reason_passes_through_as_written(
    api_client: APIClient, api_caller: ApiCaller, demo_agent: Agent, language: str
) -> None:
    run, approval = parked_run(demo_agent, api_caller.key)
    words = "형식이 맞지 않아요: 제목을 먼저 적어 주세요"
    decided = api_client.post(
        f"{RUNS}/{run.id}/approvals/{approval.id}",
        {"decision": "reject", "reason": words},
        format="json",
        HTTP_ACCEPT_LANGUAGE=language,
    )
    assert decided.status_code == 200, decided.content
    assert (decided.json()["reason"], decided.json()["reason_text"]) == (words, words)
    read = approval_read(api_client, run, language)
    assert (read["reason"], read["reason_text"]) == (words, words)


def test_a_pending_approvals_reason_text_is_empty(
    api_client: APIClient, api_caller: ApiCaller, demo_agent: Agent
) -> None:
    run, _approval = parked_run(demo_agent, api_caller.key)
    read = approval_read(api_client, run, "ko")
    assert (read["status"], read["reason"], read["reason_text"]) == ("pending", "", "")


def test_the_schema_declares_reason_text_in_every_approval() -> None:
    response = APIClient().get("/api/v1/schema/?format=json")
    assert response.status_code == 200, response.content
    approval = response.json()["components"]["schemas"]["Approval"]
    assert approval["properties"]["reason_text"]["type"] == "string"
    assert "Accept-Language" in approval["properties"]["reason_text"]["description"]
    assert {"reason", "reason_text"} <= set(approval["required"])
