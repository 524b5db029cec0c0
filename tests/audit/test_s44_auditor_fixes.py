"""The auditor's pages and API after the s44 review:

- a value bound as a secret after events recorded it (in a tool's name, a reason, a caller) is masked in the
  metrics (page, API, the dashboard's panel) and left out of the list's filter choices, as the rows mask it;
- an export or a JSON page of a period that reaches into the archived part of the record says so;
- ``ok`` takes true or false (1 or 0) only, as the list does;
- the list's export links hold what the list shows: the folded "unknown tool" entry, and a date drilled into
  that ends before the period's ``since`` is refused with a message and no link;
- the dashboard's "tools failing most" folds a model's made-up tool names into one row.
"""

from __future__ import annotations

import base64
import datetime as dt
import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from django.contrib.messages import get_messages
from django.core.management import call_command
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from audit.masking import clear_registered_secrets, registered_secrets
from audit.models import AuditEvent
from audit.services import audit_event_record
from mcpregistry.services import mcp_server_create
from tests.conftest import AUDITOR_PASSWORD

pytestmark = pytest.mark.django_db

EVENTS = "/api/v1/audit/events"
METRICS = "/api/v1/audit/metrics"
SECRET = "zqSECONDsecret5566dd77ee88ff99"


@pytest.fixture
def api_auditor(auditor_user: Any) -> APIClient:
    client = APIClient()
    credentials = base64.b64encode(f"audrey:{AUDITOR_PASSWORD}".encode()).decode()
    client.credentials(HTTP_AUTHORIZATION=f"Basic {credentials}")
    return client


def call(**fields: Any) -> AuditEvent:
    return audit_event_record(**{"source": "agent", "mcp_id": "demo", "tool": "search", **fields})


# --- 1. a secret bound after the events that quote it ------------------------------------------------------------


@pytest.fixture
def quoted_then_bound() -> None:
    """Calls whose tool name, reason and caller hold a value, then that value bound as a server's secret, in a
    fresh web process (nothing registered)."""
    call(mcp_id="", tool=f"lookup_{SECRET}", ok=False, reason="tool:unknown", actor="local")
    call(tool="search", ok=False, reason=f"args:allowed:{SECRET}", actor=f"api_key:{SECRET}")
    call(mcp_id="demo", tool=f"fetch_{SECRET}", ok=False, reason="timeout", attempt=1, latency_ms=5.0)
    mcp_server_create(
        actor="admin",
        via="tests",
        data={"mcp_id": "vault", "name": "vault", "command": sys.executable, "args": ["-V"], "env": {"T": SECRET}},
    )
    clear_registered_secrets()
    assert SECRET not in registered_secrets()


@pytest.mark.usefixtures("quoted_then_bound")
def test_the_lists_filters_do_not_offer_a_value_bound_since(auditor_client: Client) -> None:
    page = auditor_client.get("/admin/audit/auditevent/")

    assert page.status_code == 200
    assert SECRET not in page.content.decode()


@pytest.mark.usefixtures("quoted_then_bound")
def test_the_metrics_page_masks_a_value_bound_since(auditor_client: Client) -> None:
    page = auditor_client.get("/admin/audit/auditevent/metrics/")

    assert page.status_code == 200
    text = page.content.decode()
    assert SECRET not in text
    assert "args:allowed:***" in text
    # The masked tool's row links to the events it can name without the secret: they are listed, not none.
    row = next(r for r in page.context["rows"] if "***" in r["tool"].tool)
    assert "tool=" not in row["events_url"] and "***" not in row["events_url"]
    assert auditor_client.get(row["events_url"]).context["cl"].result_count >= 1


@pytest.mark.usefixtures("quoted_then_bound")
def test_the_metrics_api_masks_a_value_bound_since(api_auditor: APIClient) -> None:
    response = api_auditor.get(METRICS)

    assert response.status_code == 200
    assert SECRET not in response.content.decode()
    report = response.json()
    assert {c["actor"] for c in report["callers"]} >= {"api_key:***"}
    assert any(t["tool"] == "fetch_***" for t in report["tools"])


@pytest.mark.usefixtures("quoted_then_bound")
def test_the_dashboard_masks_a_value_bound_since(auditor_client: Client) -> None:
    page = auditor_client.get("/admin/")

    assert page.status_code == 200
    assert SECRET not in page.content.decode()


# --- 2. the archived part of a period -----------------------------------------------------------------------------


@pytest.fixture
def archived(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Four calls 40 days ago, archived (seq 1 to 4), and two today."""
    real_now = timezone.now
    with monkeypatch.context() as patch:
        patch.setattr(timezone, "now", lambda: real_now() - dt.timedelta(days=40))
        for _ in range(4):
            call()
    for _ in range(2):
        call()
    archive = tmp_path / "old.jsonl.gz"
    call_command("archive_audit", "--older-than-days", "30", "--output", str(archive), stdout=io.StringIO())
    return archive


@pytest.mark.parametrize("kind", ["csv", "jsonl"])
def test_an_export_reaching_into_the_archive_says_so(archived: Path, api_auditor: APIClient, kind: str) -> None:
    response = api_auditor.get(EVENTS, {"format": kind})

    assert response.status_code == 200
    assert response["X-Audit-Archived"] == f"seq<=4; file={archived}"
    b"".join(response.streaming_content)  # type: ignore[attr-defined]
    # A period after the archived part: nothing of it is archived.
    recent = api_auditor.get(EVENTS, {"format": kind, "since": timezone.now().isoformat()})
    assert recent.status_code == 200 and "X-Audit-Archived" not in recent
    b"".join(recent.streaming_content)  # type: ignore[attr-defined]


def test_the_json_page_says_where_the_archived_events_are(archived: Path, api_auditor: APIClient) -> None:
    page = api_auditor.get(EVENTS, {"since": (timezone.now() - dt.timedelta(days=60)).date().isoformat()})

    assert page.status_code == 200
    assert page.json()["archived"]["seq"] == 4
    assert page.json()["archived"]["file"] == str(archived)
    recent = api_auditor.get(EVENTS, {"since": timezone.now().isoformat()})
    assert recent.json()["archived"] is None


# --- 3. ok: true or false -----------------------------------------------------------------------------------------


def test_ok_takes_true_or_false_only_as_the_list_does(api_auditor: APIClient) -> None:
    call(ok=True)
    call(ok=True, action="rule.decision", reason="rule:skipped")

    for word in ("yes", "on", "t", "y"):
        response = api_auditor.get(EVENTS, {"ok": word, "format": "csv"})
        assert response.status_code == 400, word
        assert "ok" in response.json()["error"]["fields"] and "true or false" in response.content.decode()
    for word, expected in (("true", True), ("1", True), ("False", False), ("0", False)):
        response = api_auditor.get(EVENTS, {"ok": word})
        assert response.status_code == 200, word
        assert all(event["ok"] is expected for event in response.json()["results"])


# --- 4. the list's export links ----------------------------------------------------------------------------------


def test_the_folded_unknown_tool_entry_exports_the_events_it_lists(auditor_client: Client) -> None:
    for name in ("no_such_tool", "또_없는_도구"):
        call(mcp_id="", tool=name, ok=False, reason="tool:unknown")
    call(tool="search", ok=True)

    page = auditor_client.get("/admin/audit/auditevent/", {"tool": "tool:unknown"})

    listed = {event.pk for event in page.context["cl"].result_list}
    assert len(listed) == 2
    export = auditor_client.get(page.context["audit_export_url"] + "format=jsonl")
    assert export.status_code == 200
    lines = b"".join(export.streaming_content).decode().splitlines()  # type: ignore[attr-defined]
    assert {json.loads(line)["id"] for line in lines} == listed


def test_a_date_drilled_before_the_periods_since_is_refused_with_no_export_link(auditor_client: Client) -> None:
    call()

    page = auditor_client.get(
        "/admin/audit/auditevent/",
        {"created_at__year": "2025", "created_at__month": "3", "created_at__day": "1", "since": "2025-03-05"},
    )

    assert page.status_code == 200
    said = [str(m) for m in get_messages(page.wsgi_request)]
    assert any("ends before it starts" in m for m in said), said
    assert page.context["audit_export_url"] is None


def test_a_date_drilled_within_the_period_keeps_its_export_link(auditor_client: Client) -> None:
    page = auditor_client.get(
        "/admin/audit/auditevent/",
        {"created_at__year": "2025", "created_at__month": "3", "created_at__day": "9", "since": "2025-03-05"},
    )

    assert page.status_code == 200
    assert "since=2025-03-09" in page.context["audit_export_url"]
    assert not [str(m) for m in get_messages(page.wsgi_request)]


# --- 5. the dashboard's tools failing most -----------------------------------------------------------------------


def test_made_up_tool_names_take_one_row_of_the_dashboards_failing_tools(auditor_client: Client) -> None:
    for n in range(6):
        call(mcp_id="", tool=f"no_such_tool_{n}", ok=False, reason="tool:unknown")
    call(mcp_id="crm", tool="invented", ok=False, reason="tool:unknown")
    for n in range(4):
        for ok in (False, True):
            call(mcp_id="crm", tool=f"real_{n}", ok=ok, reason="" if ok else "timeout", attempt=1, latency_ms=9.0)

    page = auditor_client.get("/admin/")

    rows = page.context["dashboard"]["tools"]
    assert [(row["tool"].mcp_id, row["tool"].tool) for row in rows] == [
        ("", "unknown tool (any name)"),
        *[("crm", f"real_{n}") for n in range(4)],
    ]
    assert [row["label"] for row in rows] == ["unknown tool (any name)", *[f"crm.real_{n}" for n in range(4)]]
    folded = rows[0]
    assert (folded["tool"].calls, folded["tool"].errors, folded["error_pct"]) == (7, 7, 100.0)
    assert folded["events_url"].endswith("?reason=tool%3Aunknown")
    assert [row["error_pct"] for row in rows[1:]] == [50.0] * 4
    html = page.content.decode()
    assert ">unknown tool (any name)</a>" in html
    assert ">.unknown tool" not in html and ">.no_such_tool" not in html
    assert ">crm.real_0</a>" in html
