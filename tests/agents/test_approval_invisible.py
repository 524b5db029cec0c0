"""A reviewer approves what they read: characters that change how an argument reads without showing themselves (a
right-to-left override makes ``invoice‮fdp.exe`` read ``invoiceexe.pdf``, while the gate runs the exact ``.exe``)
are written out (``⟦U+202E⟧``) on every page that shows a call's arguments, never passed raw."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.urls import reverse
from django.utils import timezone

from agents.models import Agent, Approval, Run
from audit.visible import invisible_characters, visible_text

RLO = "\u202e"
HIDDEN = ("\u202a", "\u202b", "\u202c", "\u202d", "\u202e", "\u2066", "\u2067", "\u2068", "\u2069", "\u200b", "\u200e")


def test_visible_text_writes_out_what_does_not_show_itself_and_keeps_the_rest() -> None:
    assert visible_text(f"invoice{RLO}fdp.exe") == "invoice⟦U+202E⟧fdp.exe"
    assert visible_text("a\u200bb\x1b[31m") == "a⟦U+200B⟧b⟦U+001B⟧[31m"
    assert visible_text("look up" + chr(0xE0049)) == "look up⟦U+E0049⟧"  # a tag character: invisible ASCII
    for kept in ("김하늘 님은 클라우드운영팀", "line one\nline two\tcell", "plain", ""):
        assert visible_text(kept) == kept and invisible_characters(kept) == []


@pytest.mark.django_db
def test_an_approvals_pages_show_a_direction_override_in_its_arguments(admin_client: Any) -> None:
    agent = Agent.objects.create(slug="bidi", name="bidi", model_provider="offline")
    run = Run.objects.create(agent=agent, query="q", status=Run.Status.AWAITING_APPROVAL)
    approval = Approval.objects.create(
        run=run,
        mcp_id="files",
        tool="delete_file",
        args={"path": f"/shared/invoice{RLO}fdp.exe", "to_account": f"{RLO}1234-9876"},
        call_hash="h",
        expires_at=timezone.now() + dt.timedelta(hours=1),
    )
    pages = {
        "change": reverse("admin:agents_approval_change", args=[approval.pk]),
        "decide": reverse("admin:agents_approval_decide", args=[approval.pk, "approve"]),
        "dashboard": "/admin/",
        "list": reverse("admin:agents_approval_changelist"),
    }
    for name, url in pages.items():
        html = admin_client.get(url).content.decode()
        assert [c for c in HIDDEN if c in html] == [], name
        assert "invoice⟦U+202E⟧fdp.exe" in html, name
