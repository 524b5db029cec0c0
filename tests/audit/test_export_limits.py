"""The audit record's exports and their limits (review defects 2 and 3):

- a CSV cell over what a spreadsheet holds (Excel: 32,767 characters) is cut, with a marker saying so and where the
  whole event is (``?format=jsonl``); the JSON Lines export keeps it whole;
- ``limit`` with an export is refused, as ``cursor`` is: an export holds every matching event.
"""

from __future__ import annotations

import base64
import csv
import io
import json

import pytest
from rest_framework.test import APIClient

from audit.services import audit_event_record
from auditor.api import CSV_CELL_MAX_UNITS
from tests.conftest import AUDITOR_PASSWORD

pytestmark = pytest.mark.django_db

EVENTS = "/api/v1/audit/events"
EXCEL_CELL_MAX = 32_767


@pytest.fixture
def auditor_api(auditor_user) -> APIClient:  # type: ignore[no-untyped-def]
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Basic " + base64.b64encode(f"audrey:{AUDITOR_PASSWORD}".encode()).decode())
    return client


def streamed(response) -> str:  # type: ignore[no-untyped-def]
    assert response.status_code == 200, response.content
    return b"".join(response.streaming_content).decode("utf-8-sig")


def csv_rows(response) -> list[dict[str, str]]:  # type: ignore[no-untyped-def]
    body = streamed(response)
    header, *rows = list(csv.reader(io.StringIO(body)))
    return [dict(zip(header, row, strict=True)) for row in rows]


def utf16_units(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def test_a_csv_cell_longer_than_a_spreadsheet_holds_is_cut_with_a_marker_and_jsonl_keeps_it_whole(
    auditor_api: APIClient,
) -> None:
    prompt = "당신은 회사 도우미입니다. " * 1_300  # an 18,000-character system prompt, changed from one to another
    # A configuration change keeps its args whole (a tool call's are cut at PLATFORM_AUDIT_RESULT_MAX_CHARS).
    audit_event_record(
        source="admin", action="config.agent.update", tool="long", args={"system_prompt": [prompt, prompt]}
    )
    audit_event_record(source="agent", tool="short", args={"name": "김하늘"})

    rows = {row["tool"]: row for row in csv_rows(auditor_api.get(EVENTS, {"format": "csv"}))}
    cell = rows["long"]["args"]
    whole = json.dumps({"system_prompt": [prompt, prompt]}, ensure_ascii=False)
    assert len(whole) > EXCEL_CELL_MAX
    assert utf16_units(cell) <= CSV_CELL_MAX_UNITS < EXCEL_CELL_MAX
    kept, marker = cell.split("…[cut: ", 1)
    assert whole.startswith(kept)
    assert marker == f"{len(whole) - len(kept)} of {len(whole)} characters; the whole event is in ?format=jsonl]"
    assert json.loads(rows["short"]["args"]) == {"name": "김하늘"}  # a cell that fits is whole, valid JSON

    lines = streamed(auditor_api.get(EVENTS, {"format": "jsonl"})).splitlines()
    events = {event["tool"]: event for event in map(json.loads, lines)}
    assert events["long"]["args"] == {"system_prompt": [prompt, prompt]}


def test_a_cut_cell_counts_characters_outside_the_bmp_as_a_spreadsheet_does(auditor_api: APIClient) -> None:
    audit_event_record(source="agent", tool="emoji", result={"text": "😀" * 20_000})  # 40,000 UTF-16 units
    (row,) = csv_rows(auditor_api.get(EVENTS, {"format": "csv", "source": "agent"}))
    assert utf16_units(row["result"]) <= CSV_CELL_MAX_UNITS
    assert "characters; the whole event is in ?format=jsonl]" in row["result"]
    # Cut at the limit, not far below it (it dropped a character per unit over, two units each), no emoji split.
    assert utf16_units(row["result"]) > CSV_CELL_MAX_UNITS - 200
    assert "\ufffd" not in row["result"]


def test_a_cut_korean_cell_keeps_its_start_as_itself(auditor_api: APIClient) -> None:
    audit_event_record(source="admin", action="config.agent.update", tool="long", args={"q": "가" * 40_000})
    (row,) = csv_rows(auditor_api.get(EVENTS, {"format": "csv", "tool": "long"}))
    assert utf16_units(row["args"]) <= CSV_CELL_MAX_UNITS
    assert row["args"].startswith('{"q": "가가가')  # raw UTF-8, not escaped


@pytest.mark.parametrize("export", ["csv", "jsonl"])
def test_limit_with_an_export_is_refused_as_cursor_is(auditor_api: APIClient, export: str) -> None:
    audit_event_record(source="agent", tool="one")
    response = auditor_api.get(EVENTS, {"format": export, "limit": "1"})
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid_input"
    assert error["fields"] == {"limit": ["An export holds every matching event: leave 'limit' out."]}

    both = auditor_api.get(EVENTS, {"format": export, "limit": "1", "cursor": "0"}).json()["error"]
    assert set(both["fields"]) == {"limit", "cursor"}


def test_an_export_without_limit_and_a_page_with_it_still_answer(auditor_api: APIClient) -> None:
    audit_event_record(source="agent", tool="one")
    audit_event_record(source="agent", tool="two")
    exported = [
        row["tool"] for row in csv_rows(auditor_api.get(EVENTS, {"format": "csv", "source": "agent", "limit": ""}))
    ]
    assert exported == ["one", "two"]
    page = auditor_api.get(EVENTS, {"source": "agent", "limit": "1"}).json()
    assert [event["tool"] for event in page["results"]] == ["one"]
