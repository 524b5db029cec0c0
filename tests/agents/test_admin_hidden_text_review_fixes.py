"""What the admin shows of a call and of a rejection writes out the characters that do not show themselves
(``⟦U+202E⟧``): the model turn's call beside its arguments' table, a person's reason for rejecting, the tool's
answer and the raw trace. And an approval past its expiry, not yet swept, is shown expired, with no decision
offered."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.urls import reverse
from django.utils import timezone

from agents.models import Agent, Approval, Run

RLO = "\u202e"
ARGS = {"text": f"invoice{RLO}fdp.exe"}
REASON = f"not now a{RLO}b"


def _rejected_run() -> tuple[Run, Approval]:
    agent = Agent.objects.create(slug="bidi", name="bidi", model_provider="offline")
    told = f"A person rejected the call to 'append_note' ({REASON}) [approval:rejected]."
    run = Run.objects.create(
        agent=agent,
        query="q",
        status=Run.Status.SUCCEEDED,
        messages=[
            {"type": "human", "content": "q"},
            {"type": "ai", "content": "", "tool_calls": [{"id": "c1", "name": "append_note", "args": ARGS}]},
            {"type": "tool", "content": told, "tool_call_id": "c1", "name": "append_note", "status": "error"},
        ],
    )
    approval = Approval.objects.create(
        run=run,
        mcp_id="notes",
        tool="append_note",
        args=ARGS,
        call_hash="h",
        call_id="c1",
        status=Approval.Status.REJECTED,
        decided_by="admin:boss",
        reason=REASON,
        expires_at=timezone.now() + dt.timedelta(hours=1),
    )
    return run, approval


@pytest.mark.django_db
def test_a_model_turns_call_and_a_rejections_reason_are_written_out_on_every_page(admin_client: Any) -> None:
    run, approval = _rejected_run()
    pages = {
        "approval": reverse("admin:agents_approval_change", args=[approval.pk]),
        "decide": reverse("admin:agents_approval_decide", args=[approval.pk, "reject"]),
        "list": reverse("admin:agents_approval_changelist"),
        "run": reverse("admin:agents_run_change", args=[run.pk]),
        "timeline": reverse("admin:agents_run_timeline", args=[run.pk]),
    }
    for name, url in pages.items():
        html = admin_client.get(url).content.decode()
        assert RLO not in html, name
    for name in ("approval", "decide", "run", "timeline"):
        html = admin_client.get(pages[name]).content.decode()
        assert "invoice⟦U+202E⟧fdp.exe&quot;})" in html, name  # the model turn's "→ append_note({...})"
    for name in ("approval", "list", "run", "timeline"):
        assert "not now a⟦U+202E⟧b" in admin_client.get(pages[name]).content.decode(), name
    assert Approval.objects.get(pk=approval.pk).reason == REASON  # only what is shown changes


@pytest.mark.django_db
def test_an_approval_past_its_expiry_not_yet_swept_is_shown_expired_and_offers_no_decision(
    admin_client: Any,
) -> None:
    agent = Agent.objects.create(slug="late", name="late", model_provider="offline")
    run = Run.objects.create(agent=agent, query="q", status=Run.Status.AWAITING_APPROVAL)
    approval = Approval.objects.create(
        run=run,
        mcp_id="notes",
        tool="append_note",
        args={"text": "x"},
        call_hash="h",
        expires_at=timezone.now() - dt.timedelta(seconds=5),
    )
    html = admin_client.get(reverse("admin:agents_approval_change", args=[approval.pk])).content.decode()
    assert 'id="approve-button"' not in html and 'id="reject-button"' not in html
    assert "expires at" not in html
    assert "This approval has expired." in html
    assert 'class="run-status-badge status-expired"' in html
    decide = admin_client.get(reverse("admin:agents_approval_decide", args=[approval.pk, "reject"]))
    assert 'id="decide-form"' not in decide.content.decode()
    assert Approval.objects.get(pk=approval.pk).status == Approval.Status.PENDING  # the sweep expires it


@pytest.mark.django_db
def test_an_approval_with_time_left_is_still_offered_for_a_decision(admin_client: Any) -> None:
    agent = Agent.objects.create(slug="early", name="early", model_provider="offline")
    run = Run.objects.create(agent=agent, query="q", status=Run.Status.AWAITING_APPROVAL)
    approval = Approval.objects.create(
        run=run,
        mcp_id="notes",
        tool="append_note",
        args={"text": "x"},
        call_hash="h",
        expires_at=timezone.now() + dt.timedelta(minutes=5),
    )
    html = admin_client.get(reverse("admin:agents_approval_change", args=[approval.pk])).content.decode()
    assert 'id="approve-button"' in html and "expires at" in html
