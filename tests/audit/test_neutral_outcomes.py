"""An approval awaited and a skipped rule are neither failed nor succeeded on the audit list (reviewer's defect 6):
shown by their words without ✓ or ✗, left out of both outcome filters, and the list's export takes the same
events. An ``approval.request`` is recorded not ok with ``approval:pending`` (it was shown ✗ 실패 and counted as
failed), a ``rule.decision`` ok with ``rule:skipped``."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from django.test import Client

from audit.models import AuditEvent
from audit.services import audit_event_record

pytestmark = pytest.mark.django_db

LIST = "/admin/audit/auditevent/"


@pytest.fixture
def events() -> dict[str, AuditEvent]:
    return {
        "pending": audit_event_record(
            source="agent", action="approval.request", mcp_id="notes", tool="append_note", ok=False,
            reason="approval:pending", attempt=0,
        ),
        "skipped": audit_event_record(
            source="deterministic", action="rule.decision", mcp_id="notes", tool="lookup", reason="rule:skipped",
            attempt=0,
        ),
        "failed": audit_event_record(source="agent", mcp_id="notes", tool="lookup", ok=False, reason="timeout"),
        "succeeded": audit_event_record(source="agent", mcp_id="notes", tool="lookup", ok=True),
    }  # fmt: skip


def outcome_cell(page: str, event: AuditEvent) -> str:
    row = page[page.index(f'href="/admin/audit/auditevent/{event.pk}/change/"') :]
    row = row[: row.index("</tr>")]
    return row[row.index('class="field-outcome_column"') :].split("</td>")[0]


def test_an_approval_awaited_and_a_skipped_rule_are_shown_by_their_words_without_a_verdict(
    auditor_client: Client, events: dict[str, AuditEvent]
) -> None:
    page = auditor_client.get(LIST, HTTP_ACCEPT_LANGUAGE="ko").content.decode()
    pending, skipped = outcome_cell(page, events["pending"]), outcome_cell(page, events["skipped"])
    assert "<img" not in pending and "승인 대기" in pending and "실패" not in pending
    assert "<img" not in skipped and "규칙 건너뜀" in skipped and "성공" not in skipped
    assert 'icon-no.svg" alt="실패"' in outcome_cell(page, events["failed"])
    assert 'icon-yes.svg" alt="성공"' in outcome_cell(page, events["succeeded"])


@pytest.mark.parametrize(("ok", "listed"), [("false", "failed"), ("true", "succeeded")])
def test_the_outcome_filters_leave_them_out_and_the_export_takes_the_same_events(
    auditor_client: Client, events: dict[str, AuditEvent], ok: str, listed: str
) -> None:
    page = auditor_client.get(f"{LIST}?ok={ok}&mcp_id=notes")
    assert [e.pk for e in page.context["cl"].result_list] == [events[listed].pk]
    export = parse_qs(urlsplit(page.context["audit_export_url"]).query)
    exported: Any = auditor_client.get("/api/v1/audit/events", {k: v[0] for k, v in export.items()}).json()
    rows = exported["results"] if isinstance(exported, dict) else exported
    assert [row["id"] for row in rows] == [events[listed].pk]


def test_the_reason_filter_still_lists_them(auditor_client: Client, events: dict[str, AuditEvent]) -> None:
    page = auditor_client.get(f"{LIST}?reason=approval:pending")
    assert [e.pk for e in page.context["cl"].result_list] == [events["pending"].pk]


@pytest.mark.parametrize("reason", ["!rule:skipped", "approval:pending", "approval:*"])
def test_with_a_reason_chosen_too_the_list_and_its_export_hold_the_same_events(
    auditor_client: Client, events: dict[str, AuditEvent], reason: str
) -> None:
    # The list left the awaited approval out while its export (the API's ok and reason) kept it.
    page = auditor_client.get(LIST, {"ok": "false", "mcp_id": "notes", "reason": reason})
    listed = sorted(e.pk for e in page.context["cl"].result_list)
    export = parse_qs(urlsplit(page.context["audit_export_url"]).query)
    exported: Any = auditor_client.get("/api/v1/audit/events", {k: v[0] for k, v in export.items()}).json()
    rows = exported["results"] if isinstance(exported, dict) else exported
    assert sorted(row["id"] for row in rows) == listed
    assert events["pending"].pk in listed
