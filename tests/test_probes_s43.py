"""``platform_pending_approvals`` counts only the approvals still waiting: one past its expiry that the sweep has
not marked yet is expired, as the dashboard, the approvals list, the API and A2A say, and was counted."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from agents.models import Agent, Approval, Run
from tests.test_probes import scrape

pytestmark = pytest.mark.django_db


def test_pending_approvals_leaves_out_one_past_its_expiry(client: Client, demo_agent: Agent) -> None:
    run = Run.objects.create(agent=demo_agent, query="메모 남겨줘", status=Run.Status.AWAITING_APPROVAL)
    now = timezone.now()
    for n, expires_at in enumerate((now + timedelta(hours=1), now - timedelta(minutes=5))):
        Approval.objects.create(
            run=run, mcp_id="notes", tool="append_note", args={}, call_hash=f"h{n}", expires_at=expires_at
        )
    assert Approval.objects.filter(status=Approval.Status.PENDING).count() == 2  # the sweep has not run
    assert scrape(client)[("platform_pending_approvals", ())] == 1
