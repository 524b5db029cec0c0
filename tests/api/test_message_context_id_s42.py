"""A REST message's ``contextId`` is kept exactly as sent, as A2A and ``context.contextId`` keep it: DRF trimmed it,
so " conv " from a REST message was another conversation than the same id sent elsewhere, and said to differ from
the same value in ``context``. A blank one names no conversation, as at every door."""

from __future__ import annotations

import pytest

from agents.models import Run

pytestmark = pytest.mark.django_db


def message(context_id: str) -> dict:
    return {"role": "user", "parts": [{"kind": "text", "text": "김하늘 님 팀 알려줘"}], "contextId": context_id}


def test_a_message_context_id_is_kept_as_sent_and_agrees_with_the_same_context_id(api_client, demo_agent) -> None:
    alone = api_client.post("/api/v1/runs", {"agent": demo_agent.slug, "message": message(" conv ")}, format="json")
    assert alone.status_code == 202, alone.json()
    assert Run.objects.get(pk=alone.json()["id"]).context == {"contextId": " conv "}
    both = api_client.post(
        "/api/v1/runs",
        {"agent": demo_agent.slug, "message": message(" conv "), "context": {"contextId": " conv "}},
        format="json",
    )
    assert both.status_code == 202, both.json()


def test_a_blank_message_context_id_is_refused(api_client, demo_agent) -> None:
    refused = api_client.post("/api/v1/runs", {"agent": demo_agent.slug, "message": message("   ")}, format="json")
    assert refused.status_code == 400
    assert "message.contextId" in str(refused.json()["error"]["fields"])
