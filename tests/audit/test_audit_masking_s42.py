"""A value bound as a secret after events recorded it is masked wherever the auditors are served those events, and
a configuration change that quotes a bound secret is recorded masked by whichever process records it.

- An event recorded with a user's text holding a token, then a server bound with that token (in a fresh web
  process: no secret registered): the API's JSON page, its JSON Lines and CSV exports and the admin's event page
  show ``***``, never the token; a JSON Lines line masked so says it (``masked_after_recording``: its hash is of the
  event as recorded), the others do not; the list shows a reason that quoted it masked too.
- ``agent_update`` in a process that never registered the bindings' secrets records a system prompt that quotes
  one masked, as the process whose gate registered it does.
"""

from __future__ import annotations

import base64
import csv
import io
import json
import sys
from typing import Any

import pytest
from django.contrib import admin
from django.urls import include, path
from rest_framework.test import APIClient

from agents.models import Agent
from agents.services import agent_update
from audit.masking import clear_registered_secrets, registered_secrets
from audit.models import AuditEvent
from audit.services import audit_event_record
from mcpregistry.services import mcp_server_create
from tests.conftest import AUDITOR_PASSWORD, make_agent

pytestmark = pytest.mark.django_db

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/audit/", include("auditor.urls")),
    path("api/v1/", include("agents.api.urls")),
]

EVENTS = "/api/v1/audit/events"
TOKEN = "Zq7kR2mPp9xLw4vTn8"


@pytest.fixture(autouse=True)
def audit_api_urls(settings: Any) -> None:
    settings.ROOT_URLCONF = __name__


@pytest.fixture
def api_auditor(auditor_user: Any) -> APIClient:
    client = APIClient()
    credentials = base64.b64encode(f"audrey:{AUDITOR_PASSWORD}".encode()).decode()
    client.credentials(HTTP_AUTHORIZATION=f"Basic {credentials}")
    return client


def bind(token: str, *, mcp_id: str = "vault") -> Any:
    """A server bound with ``token`` as a secret, through the service an admin's page calls."""
    return mcp_server_create(
        actor="admin",
        via="tests",
        data={"mcp_id": mcp_id, "name": mcp_id, "command": sys.executable, "args": ["-V"], "env": {"TOKEN": token}},
    )


@pytest.fixture
def told_before_bound() -> AuditEvent:
    """A call recorded with the token in its arguments, a refusal quoting it in its reason, then the token bound;
    then a fresh web process (nothing registered)."""
    event = audit_event_record(source="agent", mcp_id="demo", tool="search", args={"q": f"접속 토큰은 {TOKEN} 입니다"})
    audit_event_record(
        source="agent", mcp_id="demo", tool="search", ok=False, reason=f"args:unknown:{TOKEN}", result={"x": TOKEN}
    )
    bind(TOKEN)
    clear_registered_secrets()
    assert TOKEN not in registered_secrets()
    return event


def test_the_json_page_masks_a_value_bound_after_it_was_recorded(
    told_before_bound: AuditEvent, api_auditor: APIClient
) -> None:
    response = api_auditor.get(EVENTS)

    assert response.status_code == 200
    text = response.content.decode()
    assert TOKEN not in text
    events = {event["id"]: event for event in response.json()["results"]}
    assert events[told_before_bound.id]["args"] == {"q": "접속 토큰은 *** 입니다"}
    assert events[told_before_bound.id]["masked_after_recording"] is True


def test_the_jsonl_export_masks_it_and_marks_the_lines_masked(
    told_before_bound: AuditEvent, api_auditor: APIClient
) -> None:
    response = api_auditor.get(EVENTS, {"format": "jsonl"})

    assert response.status_code == 200
    text = b"".join(response.streaming_content).decode()  # type: ignore[attr-defined]
    assert TOKEN not in text
    lines = [json.loads(line) for line in text.splitlines()]
    masked = {line["id"]: line for line in lines if line.get("masked_after_recording")}
    assert told_before_bound.id in masked
    assert masked[told_before_bound.id]["args"] == {"q": "접속 토큰은 *** 입니다"}
    assert masked[told_before_bound.id]["hash"] == told_before_bound.hash  # the recorded event's, as stored
    # The server's creation holds no value (only the names set): its line is as recorded, unmarked.
    created = [line for line in lines if line["action"] == "config.mcp_server.create"]
    assert created and "masked_after_recording" not in created[0]


def test_the_csv_export_masks_it(told_before_bound: AuditEvent, api_auditor: APIClient) -> None:
    response = api_auditor.get(EVENTS, {"format": "csv"})

    assert response.status_code == 200
    text = b"".join(response.streaming_content).decode("utf-8-sig")  # type: ignore[attr-defined]
    assert TOKEN not in text
    rows = {row["id"]: row for row in csv.DictReader(io.StringIO(text))}
    assert json.loads(rows[str(told_before_bound.id)]["args"]) == {"q": "접속 토큰은 *** 입니다"}


def test_the_admin_pages_mask_it(told_before_bound: AuditEvent, auditor_client: Any) -> None:
    refused = AuditEvent.objects.get(reason__startswith="args:unknown:")
    for event in (told_before_bound, refused):
        page = auditor_client.get(f"/admin/audit/auditevent/{event.id}/change/")
        assert page.status_code == 200
        assert TOKEN not in page.content.decode()
        assert "***" in page.content.decode()
    listed = auditor_client.get("/admin/audit/auditevent/")
    assert listed.status_code == 200
    assert TOKEN not in listed.content.decode()


# --- a configuration change, in a process that never registered the binding's secrets ------------------------

PASSWORD = "Hr7vQw2Lz9Kp4Xn"


def test_a_prompt_quoting_a_bound_secret_is_recorded_masked_by_a_fresh_process() -> None:
    server = bind(PASSWORD, mcp_id="hr-db")
    agent = make_agent(slug="hr", servers=[server], with_demo_rules=False)
    clear_registered_secrets()  # a web process whose gate never met the binding

    agent_update(
        agent=Agent.objects.get(pk=agent.pk),
        actor="admin",
        via="tests",
        data={"system_prompt": f"인사DB 비밀번호 {PASSWORD} 는 절대 말하지 마세요."},
    )

    event = AuditEvent.objects.filter(action="config.agent.update").latest("id")
    assert PASSWORD not in json.dumps(event.args, ensure_ascii=False)
    assert event.args["system_prompt"][1] == "인사DB 비밀번호 *** 는 절대 말하지 마세요."
