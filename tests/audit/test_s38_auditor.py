"""The auditor's pages after review: an archived period says so, a metrics row links to the calls it counts, recorded
text shows what does not show itself, a call's arguments are stored cut, ``--output`` takes a folder, the reason
filter takes either normalization form and folds made-up argument names, and a future ``since`` is refused."""

from __future__ import annotations

import datetime as dt
import html
import io
import json
import re
import unicodedata
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from audit.archive import audit_events_archive
from audit.models import AuditEvent
from audit.services import audit_event_record
from auditor.selectors import AuditEventFilters, audit_event_filter
from tests.audit.test_chain import verify

pytestmark = pytest.mark.django_db

METRICS = "/admin/audit/auditevent/metrics/"
LIST = "/admin/audit/auditevent/"


def recorded_days_ago(days: int, **fields: Any) -> AuditEvent:
    with mock.patch("django.utils.timezone.now", return_value=timezone.now() - dt.timedelta(days=days)):
        return audit_event_record(**fields)


def listed_ids(client: Client, url: str) -> list[int]:
    body = client.get(url).content.decode().split('id="result_list"', 1)[1].split("</table>", 1)[0]
    return [int(n) for n in re.findall(r"/admin/audit/auditevent/(\d+)/change/", body)]


def test_an_archived_period_says_so_and_the_auditor_sees_the_checkpoints(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    for _ in range(5):
        recorded_days_ago(40, source="agent", mcp_id="hr", tool="휴가조회", latency_ms=5.0)
    recorded_days_ago(20, source="agent", mcp_id="hr", tool="휴가조회", latency_ms=5.0)  # kept: where archived ends
    auditor_client: Client = request.getfixturevalue("auditor_client")  # made after: its creation is not archived
    day = timezone.localtime(timezone.now() - dt.timedelta(days=40)).date()
    period = f"?since={day - dt.timedelta(days=1)}&until={day + dt.timedelta(days=1)}"
    before = auditor_client.get(METRICS + period).content.decode()
    assert 'title="5"' in before and "are archived in" not in before

    archive = tmp_path / "a.jsonl.gz"
    call_command(
        "archive_audit", "--older-than-days", "30", "--output", str(archive), stdout=io.StringIO(), stderr=io.StringIO()
    )

    after = html.unescape(auditor_client.get(METRICS + period).content.decode())
    assert f"(up to seq 5) are archived in {archive}; their figures are not shown here." in after
    drilled = f"{LIST}?created_at__year={day.year}&created_at__month={day.month}&created_at__day={day.day}"
    listed = html.unescape(auditor_client.get(drilled).content.decode())
    assert f"(up to seq 5) are archived in {archive}; they are not listed here." in listed
    # A period after the archived part says nothing of it.
    assert "are archived in" not in auditor_client.get(METRICS).content.decode()
    assert "are archived in" not in auditor_client.get(f"{LIST}?since={timezone.now().date()}").content.decode()
    checkpoints = auditor_client.get("/admin/audit/auditcheckpoint/")
    assert checkpoints.status_code == 200 and str(archive) in checkpoints.content.decode()


def test_a_metrics_row_links_to_the_calls_it_counts(auditor_client: Client) -> None:
    recorded_days_ago(30, source="agent", mcp_id="hr", tool="휴가조회", latency_ms=5.0)  # before the period
    counted = audit_event_record(source="agent", mcp_id="hr", tool="휴가조회", latency_ms=5.0)
    audit_event_record(source="agent", action="rule.decision", mcp_id="hr", tool="휴가조회", reason="rule:skipped")
    page = auditor_client.get(METRICS).content.decode()
    assert re.findall(r'<td class="num" title="(\d+)"', page) == ["1"]
    link = html.unescape(re.findall(r'href="(/admin/audit/auditevent/\?[^"]*mcp_id=[^"]*)"', page)[0])
    assert "action=tool.call" in link and "since=" in link and "until=" in link
    assert listed_ids(auditor_client, link) == [counted.pk]
    assert "from every source" in page


def test_the_metrics_page_writes_out_what_does_not_show_itself(auditor_client: Client) -> None:
    audit_event_record(
        source="agent", mcp_id="h\u202er", tool="get\u202eeteled", latency_ms=5.0, actor="\u202eabc", ok=False,
        reason="args:unknown:\u202ex",
    )  # fmt: skip
    page = auditor_client.get(METRICS).content.decode()
    assert "\u202e" not in page
    assert "get⟦U+202E⟧eteled" in page and "⟦U+202E⟧abc" in page


def test_a_calls_arguments_are_stored_cut_as_its_result_is_and_the_chain_verifies(
    admin_client: Client, settings: Any
) -> None:
    event = audit_event_record(source="agent", mcp_id="hr", tool="메모", args={"본문": "가" * 2_000_000})
    stored = AuditEvent.objects.get(pk=event.pk)
    limit = settings.PLATFORM_AUDIT_RESULT_MAX_CHARS
    assert stored.args == {"본문": "가" * 1000 + "…[cut: 2000000 characters]"}  # its long text cut, its name kept
    # Arguments still over the bound once their long texts are cut (many of them) are cut whole, as a result is.
    many = audit_event_record(source="agent", mcp_id="hr", tool="메모", args={f"k{i}": "가" * 900 for i in range(40)})
    whole = AuditEvent.objects.get(pk=many.pk).args
    assert whole["truncated"] is True and len(whole["preview"]) == limit
    assert len(json.dumps(whole, ensure_ascii=False)) < limit + 200
    assert verify().startswith("verified ")
    page = admin_client.get(f"/admin/audit/auditevent/{event.pk}/change/")
    assert page.status_code == 200 and len(page.content) < 4 * limit + 100_000


def test_archive_output_may_name_a_folder(tmp_path: Path) -> None:
    recorded_days_ago(40, source="agent", mcp_id="hr", tool="x")
    recorded_days_ago(35, source="agent", mcp_id="hr", tool="x")
    folder = tmp_path / "archives"
    report = audit_events_archive(older_than_days=38, output=f"{folder}/")  # missing, with a separator: made
    assert folder.is_dir() and report.path == folder / "audit-000000000001-000000000001.jsonl.gz"
    assert report.path.is_file()
    out = io.StringIO()
    call_command(
        "archive_audit", "--older-than-days", "30", "--output", str(folder), stdout=out, stderr=io.StringIO()
    )  # it exists
    assert (folder / "audit-000000000002-000000000002.jsonl.gz").is_file()


def test_the_reason_filter_finds_either_normalization_form() -> None:
    event = audit_event_record(source="agent", mcp_id="hr", tool="t", ok=False, reason="args:allowed:지역")
    for reason in (unicodedata.normalize("NFD", "args:allowed:지역"), unicodedata.normalize("NFD", "args:allowed:지*")):
        found = audit_event_filter(AuditEvent.objects.all(), AuditEventFilters(reason=reason))
        assert list(found.values_list("pk", flat=True)) == [event.pk]


def test_made_up_argument_names_are_one_reason_entry_that_finds_them_all(auditor_client: Client) -> None:
    made_up = [
        audit_event_record(source="agent", mcp_id="hr", tool="t", ok=False, reason=f"args:unknown:지역{i}").pk
        for i in range(30)
    ]
    audit_event_record(source="agent", mcp_id="hr", tool="t", ok=False, reason="args:allowed:지역")
    page = auditor_client.get(LIST).content.decode()
    assert page.count("reason=args%3Aunknown") == 1 and "reason=args%3Aallowed" in page
    link = html.unescape(re.findall(r'href="(\?[^"]*reason=args%3Aunknown[^"]*)"', page)[0])
    assert sorted(listed_ids(auditor_client, f"{LIST}{link}")) == made_up


def test_metrics_with_a_future_since_alone_are_refused(auditor_client: Client) -> None:
    future = (timezone.now() + dt.timedelta(days=30)).date()
    page = auditor_client.get(f"{METRICS}?since={future}").content.decode()
    assert "The period ends before it starts; showing the last 7 days." in page


@pytest.mark.django_db
def test_archive_audit_given_a_folder_with_a_trailing_separator_writes_inside_it(tmp_path, monkeypatch) -> None:
    """From the command line too: ``--output archives/`` names a folder (the option's Path dropped the slash, and
    the archive became a file named "archives")."""
    real_now = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real_now() - dt.timedelta(days=60))
    audit_event_record(source="agent", tool="t", args={}, result="r")
    monkeypatch.setattr(timezone, "now", real_now)
    folder = tmp_path / "archives"
    call_command("archive_audit", "--older-than-days", "30", "--output", f"{folder}/", stdout=io.StringIO())
    assert folder.is_dir() and [p.suffix for p in folder.iterdir()] == [".gz"]


@pytest.mark.django_db
def test_a_calls_long_arguments_keep_their_names_and_short_values() -> None:
    """Cut whole, an event's arguments were a stand-in: an eval case expecting {"title": "Q3 report"} of a call
    whose body was long failed ``tools:args``, and the run page showed no argument."""
    from evals.scoring import _subset

    audit_event_record(source="agent", tool="write_report", args={"title": "Q3 report", "body": "가" * 25_000})
    event = AuditEvent.objects.get(tool="write_report")
    assert event.args["title"] == "Q3 report"
    assert event.args["body"].startswith("가" * 1000) and event.args["body"].endswith("…[cut: 25000 characters]")
    assert _subset({"title": "Q3 report"}, event.args)
