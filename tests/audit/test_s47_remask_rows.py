"""A server id equal to a value bound as a secret after its events were recorded is masked in the audit list's
rows and on the event's page, as the metrics and the server filter already mask it (the rows showed it in clear
under each event's tool)."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from audit.masking import MASK, clear_registered_secrets, registered_secrets
from audit.models import AuditEvent
from audit.services import audit_event_record
from mcpregistry.services import mcp_server_create

pytestmark = pytest.mark.django_db

SECRET = "Wp4nK8sQz2TmR7yLc6"


@pytest.fixture
def named_then_bound() -> AuditEvent:
    """A call recorded under a server whose id is the value, then that value bound as another server's secret,
    in a fresh web process (nothing registered)."""
    event = audit_event_record(source="agent", mcp_id=SECRET, tool="search", args={"q": "김하늘 팀"})
    mcp_server_create(
        actor="admin",
        via="tests",
        data={"mcp_id": "vault", "name": "vault", "command": sys.executable, "args": ["-V"], "env": {"T": SECRET}},
    )
    clear_registered_secrets()
    assert SECRET not in registered_secrets()
    return event


def test_the_lists_rows_mask_a_server_id_bound_as_a_secret_since(
    named_then_bound: AuditEvent, auditor_client: Any
) -> None:
    page = auditor_client.get("/admin/audit/auditevent/")

    assert page.status_code == 200
    text = page.content.decode()
    assert SECRET not in text
    assert MASK in text  # the row is listed, its server masked
    assert "search" in text


def test_the_events_page_masks_it_too(named_then_bound: AuditEvent, auditor_client: Any) -> None:
    page = auditor_client.get(f"/admin/audit/auditevent/{named_then_bound.id}/change/")

    assert page.status_code == 200
    text = page.content.decode()
    assert SECRET not in text
    assert "김하늘 팀" in text  # the rest of the record as recorded, its Korean intact
    assert AuditEvent.objects.get(pk=named_then_bound.pk).mcp_id == SECRET  # never saved masked


def test_the_audit_api_and_its_exports_mask_it(named_then_bound: AuditEvent, auditor_client: Any) -> None:
    """The API's page and its JSON Lines and CSV exports serve the event with its server masked, marked as masked
    after it was recorded (its hash is of the event as recorded)."""
    page = auditor_client.get("/api/v1/audit/events")
    assert page.status_code == 200, page.content
    (served,) = [e for e in page.json()["results"] if e["id"] == named_then_bound.id]
    assert served["mcp_id"] == MASK
    assert served["masked_after_recording"] is True
    assert served["args"] == {"q": "김하늘 팀"}
    for export in ("jsonl", "csv"):
        response = auditor_client.get("/api/v1/audit/events", {"format": export})
        text = b"".join(response.streaming_content).decode()
        assert response.status_code == 200
        assert SECRET not in text, export
        assert "김하늘 팀" in text
