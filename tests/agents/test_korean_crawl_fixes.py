"""The Korean crawl of the admin: a budget named in its reader's words (the record names it in none); rolling back
to the content the live version holds says nothing was published."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import translation

from agents.budgets import budget_create
from agents.models import AgentVersion
from agents.services import agent_version_publish, api_key_create
from audit.models import AuditEvent
from tests.conftest import make_agent

pytestmark = pytest.mark.django_db


def test_a_budget_is_named_in_its_readers_words_and_recorded_in_none(admin_client: Any) -> None:
    key, _raw = api_key_create(actor="test", via="tests", name="데모 키")
    budget = budget_create(actor="test", via="tests", data={"api_key": key, "period": "day", "max_tokens": 100_000})
    page = admin_client.get(f"/admin/agents/budget/{budget.pk}/change/", HTTP_ACCEPT_LANGUAGE="ko").content.decode()
    with translation.override("ko"):
        shown = str(budget)
    assert shown.startswith("API 키 데모 키") and shown.endswith(" / 일") and shown in page
    assert "key 데모 키" not in page
    recorded = AuditEvent.objects.get(action="config.budget.create").result["name"]
    assert recorded.startswith("API key 데모 키") and recorded.endswith(" / day")


def test_rolling_back_to_the_live_version_says_nothing_was_published(admin_client: Any) -> None:
    agent = make_agent(slug="rolling", servers=[], with_demo_rules=False)
    live = agent_version_publish(agent=agent, actor="test", via="tests")
    events = AuditEvent.objects.count()

    response = admin_client.post(
        "/admin/agents/agentversion/", {"action": "rollback", "_selected_action": [live.pk]}, follow=True
    )

    said = [str(m) for m in response.context["messages"]]
    assert AgentVersion.objects.filter(agent=agent).count() == 1 and AuditEvent.objects.count() == events
    assert said == ["Agent rolling: v1 is already the live version; nothing was published."]
