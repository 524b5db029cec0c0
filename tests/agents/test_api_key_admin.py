"""An admin issues an API key from the admin: recorded like every change (never the key), shown once on the page
that follows the save and never again (not in the key's page, the list, a message or the record)."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from agents.models import Agent, ApiKey
from agents.services import api_key_digest
from audit.models import AuditEvent


@pytest.mark.django_db
def test_an_admin_issues_a_key_that_is_shown_once(admin_client: Client) -> None:
    agent = Agent.objects.create(slug="company-assistant", name="사내 비서")
    response = admin_client.post(
        "/admin/agents/apikey/add/",
        {"name": "정산 시스템", "agents": [agent.pk], "rate": "60/min"},
        HTTP_ACCEPT_LANGUAGE="ko",
    )
    assert response.status_code == 200 and "no-store" in response["Cache-Control"]
    page = response.content.decode()
    [raw] = re.findall(r'id="raw-key" readonly value="(apk_[A-Za-z0-9_-]{43})"', page)
    assert "이번 한 번만" in page
    key = ApiKey.objects.get()
    assert (key.name, key.rate, key.prefix, key.digest) == ("정산 시스템", "60/min", raw[:12], api_key_digest(raw))
    assert list(key.agents.all()) == [agent]
    event = AuditEvent.objects.get(action="config.api_key.create")
    assert event.actor == "admin" and event.result["via"] == "admin"
    assert raw not in str(event.args) and raw not in str(event.result)
    for later in ("/admin/agents/apikey/", f"/admin/agents/apikey/{key.pk}/change/", "/admin/"):
        assert raw not in admin_client.get(later).content.decode()

    answered = Client().get("/api/v1/usage", HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert answered.status_code == 200  # the key works


@pytest.mark.django_db
def test_a_bad_rate_is_refused_at_its_field_and_issues_nothing(admin_client: Client) -> None:
    response = admin_client.post("/admin/agents/apikey/add/", {"name": "x", "rate": "lots"})
    assert response.status_code == 200
    assert "rate" in response.context["adminform"].form.errors
    assert not ApiKey.objects.exists() and not AuditEvent.objects.filter(action="config.api_key.create").exists()


@pytest.mark.django_db
def test_a_budgets_page_offers_no_pop_up_to_issue_a_key(admin_client: Client) -> None:
    """A pop-up would close over the key it shows once: keys are issued on their own page."""
    page = admin_client.get("/admin/agents/budget/add/").content.decode()
    assert 'name="api_key"' in page and 'id="add_id_api_key"' not in page
