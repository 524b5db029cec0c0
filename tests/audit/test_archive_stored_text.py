"""``archive_audit`` archives only what ``verify_audit`` vouches for.

Archiving deletes the events it writes out, and an archive file is verified as a chain of hashes and MACs: an event
archived is one whose tampering no later verification can find. So archiving reads and checks each event as
verification does (the same reading of the same row): on SQLite an event whose time, run id or ``ok`` is stored in
another form than the platform writes (which hashes alike, yet escapes the auditor's filters) is named as altered, in
verification's words, and nothing is written or deleted; nor is anything while two events share a nonce (a copy of a
pending row chained again). What the platform writes still archives, every field as the database gives it back."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from django.db import connection  # noqa: F401 - named by on_sqlite's condition

from agent_platform.errors import ApplicationError
from audit import services
from audit.archive import audit_events_archive
from audit.models import AuditCheckpoint, AuditEvent
from audit.services import audit_chain_pending
from tests.audit.test_chain import record, sql, verify
from tests.audit.test_chain_replay import append, captured, put_back
from tests.audit.test_retention import archive_lines, command
from tests.audit.test_verify_stored_text import (  # noqa: F401 - both_chain_modes is a fixture
    REWRITES,
    RUN_ID,
    WHOLE_SECOND,
    altered,
    both_chain_modes,
    on_sqlite,
    written,
)

pytestmark = pytest.mark.django_db

REFUSED = "FAILED: The audit chain is broken, nothing was archived: "
FAR_AHEAD = dt.datetime(2100, 1, 1, tzinfo=dt.UTC)


def archive_all(tmp_path: Path) -> tuple[str, Path]:
    """``archive_audit`` of every event, what it said, and the file it was to write. Its cutoff far ahead: on
    SQLite the cutoff is compared with the stored text, which a time rewritten with an offset or a ``T`` makes
    sort later (the event would be left in the table as young, not archived)."""
    archive = tmp_path / "a.jsonl.gz"
    try:
        report = audit_events_archive(older_than_days=0, output=archive, now=FAR_AHEAD)
    except ApplicationError as exc:
        return f"FAILED: {exc.message}", archive
    return f"archived {report.count} events (seq {report.first_seq} to {report.last_seq})", archive


def assert_nothing_archived(tmp_path: Path, events: int) -> None:
    assert list(tmp_path.iterdir()) == []  # neither the file nor a partial one
    assert AuditEvent.objects.count() == events
    assert not AuditCheckpoint.objects.exists()


@on_sqlite
@pytest.mark.usefixtures("both_chain_modes")
@pytest.mark.parametrize("rewrite", list(REWRITES))
def test_an_event_stored_in_another_form_is_never_archived_and_is_named_as_verify_audit_names_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, rewrite: str
) -> None:
    events = written(monkeypatch)
    seq, column, text = REWRITES[rewrite]()
    sql(f"UPDATE audit_auditevent SET {column} = %s WHERE seq = %s", [text, seq])
    named = altered(events[seq - 1], column, text)

    said, _archive = archive_all(tmp_path)

    assert said == REFUSED + named.removeprefix("FAILED: ")
    assert_nothing_archived(tmp_path, events=4)
    assert verify() == named  # the evidence is still in the table


@pytest.mark.usefixtures("both_chain_modes")
def test_what_the_platform_writes_is_archived_every_field_as_the_database_gives_it_back(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Integral floats stay floats in the file (``1.0``, not the ``1`` the hash takes), a whole second's time has
    its microseconds, the run id its dashes: what the ORM reads, line for line."""
    events = written(monkeypatch)
    events += record(1, run_id=RUN_ID, latency_ms=12.0, result={"score": 2.0, "big": 1e20, "small": 1e-05})
    rows = list(AuditEvent.objects.order_by("seq").values())

    archive = tmp_path / "a.jsonl.gz"

    said = command("archive_audit", "--older-than-days", "0", "--output", str(archive))

    assert said.startswith(f"archived 5 events (seq 1 to 5) to {archive}, checkpoint "), said
    lines = archive_lines(archive)
    assert lines[-1] == {"checkpoint": {"seq": 5, "hash": events[-1].hash}}
    for line, row in zip(lines, rows, strict=False):
        row["created_at"] = row["created_at"].astimezone(dt.UTC).isoformat(timespec="microseconds")
        row["run_id"] = None if row["run_id"] is None else str(row["run_id"])
        assert json.dumps(line, sort_keys=True) == json.dumps(row, sort_keys=True)
    assert lines[0]["created_at"] == WHOLE_SECOND.isoformat(timespec="microseconds")
    assert (lines[4]["latency_ms"], lines[4]["result"]["score"]) == (12.0, 2.0)
    assert isinstance(lines[4]["latency_ms"], float) and isinstance(lines[4]["result"]["score"], float)
    assert verify("--archive", str(archive)) == f"verified 5 archived events, head {events[-1].hash}"
    recorded = AuditEvent.objects.filter(action="audit.archive").first()  # inline: chained; deferred: pending still
    count, head = (1, recorded.hash) if recorded is not None else (0, events[-1].hash)
    assert verify() == f"verified {count} events, head {head}"


def test_two_events_with_one_nonce_are_never_archived(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, settings: Any
) -> None:
    """A copy of a pending row chained again where the events' unique index was dropped and a chainer did not
    look: archived with its original, neither would be left in the table for ``verify_audit`` to find."""
    settings.AUDIT_CHAIN_MODE, settings.AUDIT_CHAIN_BACKGROUND = "deferred", "off"
    append()
    copy = captured()
    audit_chain_pending()
    sql("DROP INDEX audit_event_nonce_unique")
    real_reads = services._chain_reads

    def reads_that_do_not_look(*args: Any) -> tuple[str, str]:
        head, pending = real_reads(*args)
        return head, pending.replace("EXISTS (", "0 AND EXISTS (")

    monkeypatch.setattr(services, "_chain_reads", reads_that_do_not_look)
    put_back(copy)
    assert audit_chain_pending() == 1
    second = AuditEvent.objects.get(seq=2)
    named = (
        f"event seq 2 (id {second.pk}): the nonce of event seq 1 — replayed (a copy of its pending row chained again)"
    )

    said, _archive = archive_all(tmp_path)

    assert said == REFUSED + named
    assert_nothing_archived(tmp_path, events=2)
    assert verify() == "FAILED: " + named
