"""Retention: old audit events move to a gzip JSONL archive that verifies on its own, and what stays behind
still verifies from the archive's checkpoint."""

from __future__ import annotations

import contextlib
import datetime as dt
import gzip
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.utils import timezone

from audit.append_only import sqlite_triggers_lift
from audit.models import AuditCheckpoint, AuditEvent
from audit.services import audit_event_record
from tests.postgres import manage, postgres_url  # noqa: F401 - postgres_url is a fixture

pytestmark = pytest.mark.django_db


def record(count: int, *, days_ago: float = 0, monkeypatch: pytest.MonkeyPatch, **fields: Any) -> list[AuditEvent]:
    """``count`` events written ``days_ago`` days ago (the clock is moved back while they are written)."""
    real_now = timezone.now
    with monkeypatch.context() as patch:
        patch.setattr(timezone, "now", lambda: real_now() - dt.timedelta(days=days_ago))
        return [
            audit_event_record(
                source="agent",
                mcp_id="demo",
                tool="search_employee",
                args={"name": "김하늘", "api_key": "sk-live-abcdefgh12345678", "i": i},
                result={"team": "클라우드운영팀"},
                latency_ms=2.5,
                **fields,
            )
            for i in range(count)
        ]


@contextlib.contextmanager
def intruder_cursor() -> Iterator[Any]:
    """A cursor as an intruder with the database file has one: SQLite's triggers dropped (in the test's
    transaction, so that they come back after it)."""
    sqlite_triggers_lift(connection)
    with connection.cursor() as cursor:
        yield cursor


def command(name: str, *options: str) -> str:
    """The command's last line on success, or its error (prefixed ``FAILED: ``)."""
    out = io.StringIO()
    try:
        call_command(name, *options, stdout=out, stderr=io.StringIO())
    except CommandError as exc:
        return f"FAILED: {exc}"
    return out.getvalue().strip().splitlines()[-1]


def archive_lines(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        return [json.loads(line) for line in lines]


def rewrite_archive(path: Path, lines: list[dict[str, Any]]) -> None:
    with gzip.open(path, "wt", encoding="utf-8") as out:
        for line in lines:
            out.write(json.dumps(line, ensure_ascii=False) + "\n")


@pytest.fixture
def old_and_new(monkeypatch: pytest.MonkeyPatch) -> tuple[list[AuditEvent], list[AuditEvent]]:
    """Eight events from 40 days ago, then three from today."""
    return record(8, days_ago=40, monkeypatch=monkeypatch), record(3, monkeypatch=monkeypatch)


def test_archiving_moves_the_old_events_to_a_file_and_the_rest_still_verifies(
    old_and_new: tuple[list[AuditEvent], list[AuditEvent]], tmp_path: Path
) -> None:
    old, new = old_and_new
    archive = tmp_path / "old.jsonl.gz"

    said = command("archive_audit", "--older-than-days", "30", "--output", str(archive))

    assert said == f"archived 8 events (seq 1 to 8) to {archive}, checkpoint {old[-1].hash}"
    assert list(AuditEvent.objects.order_by("seq").values_list("seq", flat=True)) == [
        9,
        10,
        11,
        12,
    ]  # 12: the archive's
    checkpoint = AuditCheckpoint.objects.get()
    assert (checkpoint.seq, checkpoint.hash, checkpoint.count, checkpoint.file_name) == (
        8,
        old[-1].hash,
        8,
        str(archive),
    )
    recorded = AuditEvent.objects.get(seq=12)
    assert (recorded.action, recorded.actor, recorded.args) == (
        "audit.archive",
        "system:archive_audit",
        {"first_seq": 1, "last_seq": 8, "count": 8, "file": str(archive), "hash": old[-1].hash},
    )
    assert recorded.prev_hash == new[-1].hash
    assert command("verify_audit") == f"verified 4 events, head {recorded.hash}"


def test_the_archive_holds_every_field_as_stored_one_event_a_line_then_its_checkpoint(
    old_and_new: tuple[list[AuditEvent], list[AuditEvent]], tmp_path: Path
) -> None:
    old, _ = old_and_new
    stored = list(AuditEvent.objects.filter(seq__lte=8).order_by("seq").values())
    archive = tmp_path / "old.jsonl.gz"

    command("archive_audit", "--older-than-days", "30", "--output", str(archive))

    lines = archive_lines(archive)
    assert len(lines) == 9
    assert lines[-1] == {"checkpoint": {"seq": 8, "hash": old[-1].hash}}
    for line, row in zip(lines, stored, strict=False):
        assert set(line) == set(row)
        assert line["created_at"] == row["created_at"].astimezone(dt.UTC).isoformat(timespec="microseconds")
        assert {name: line[name] for name in line if name != "created_at"} == {
            name: value for name, value in row.items() if name != "created_at"
        }
    assert lines[0]["args"] == {"name": "김하늘", "api_key": "***", "i": 0}  # masked, as stored


def test_an_archive_file_verifies_on_its_own(
    old_and_new: tuple[list[AuditEvent], list[AuditEvent]], tmp_path: Path
) -> None:
    old, _ = old_and_new
    archive = tmp_path / "old.jsonl.gz"
    command("archive_audit", "--older-than-days", "30", "--output", str(archive))

    assert command("verify_audit", "--archive", str(archive)) == f"verified 8 archived events, head {old[-1].hash}"


def test_archives_taken_one_after_another_verify_as_one_chain(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    record(5, days_ago=100, monkeypatch=monkeypatch)
    record(4, days_ago=50, monkeypatch=monkeypatch)
    recent = record(2, monkeypatch=monkeypatch)
    first, second = tmp_path / "first.jsonl.gz", tmp_path / "second.jsonl.gz"

    assert command("archive_audit", "--older-than-days", "70", "--output", str(first)).startswith(
        "archived 5 events (seq 1 to 5)"
    )
    assert command("archive_audit", "--older-than-days", "30", "--output", str(second)).startswith(
        "archived 4 events (seq 6 to 9)"
    )

    recorded = AuditEvent.objects.filter(action="audit.archive").order_by("seq")
    assert [(e.seq, e.args["first_seq"], e.args["last_seq"]) for e in recorded] == [(12, 1, 5), (13, 6, 9)]
    assert recent[-1].seq == 11
    assert command("verify_audit") == f"verified 4 events, head {recorded.last().hash}"  # type: ignore[union-attr]
    both = command("verify_audit", "--archive", str(first), "--archive", str(second))
    assert both.startswith("verified 9 archived events, head ")
    assert command("verify_audit", "--archive", str(second)).startswith("verified 4 archived events")
    # Given newest first, they are checked oldest first (it read as an insertion).
    assert "verified 9 archived events" in command("verify_audit", "--archive", str(second), "--archive", str(first))


def test_an_archive_altered_after_it_was_written_is_named(
    old_and_new: tuple[list[AuditEvent], list[AuditEvent]], tmp_path: Path
) -> None:
    archive = tmp_path / "old.jsonl.gz"
    command("archive_audit", "--older-than-days", "30", "--output", str(archive))
    lines = archive_lines(archive)

    edited = [dict(line) for line in lines]
    edited[3]["result"] = {"team": "보안팀"}
    rewrite_archive(archive, edited)
    assert command("verify_audit", "--archive", str(archive)) == (
        f"FAILED: archive {archive}: event seq 4 (id {lines[3]['id']}): hash mismatch — altered"
    )

    rewrite_archive(archive, lines[:4] + lines[5:])
    assert command("verify_audit", "--archive", str(archive)) == f"FAILED: archive {archive}: seq 5 missing — removed"

    rewrite_archive(archive, lines[:-3] + lines[-1:])
    assert command("verify_audit", "--archive", str(archive)) == (
        f"FAILED: archive {archive}: tail truncated: checkpoint says seq 8, last event is 6"
    )

    rewrite_archive(archive, lines[:-1])
    assert command("verify_audit", "--archive", str(archive)) == (
        f"FAILED: archive {archive}: no checkpoint line — truncated"
    )


def test_a_broken_chain_is_never_archived(
    old_and_new: tuple[list[AuditEvent], list[AuditEvent]], tmp_path: Path
) -> None:
    old, _ = old_and_new
    with intruder_cursor() as cursor:
        cursor.execute("UPDATE audit_auditevent SET actor = 'intruder' WHERE seq = 2")
    archive = tmp_path / "old.jsonl.gz"

    said = command("archive_audit", "--older-than-days", "30", "--output", str(archive))

    assert said == (
        f"FAILED: The audit chain is broken, nothing was archived: event seq 2 (id {old[1].pk}): hash mismatch — altered"
    )
    assert AuditEvent.objects.count() == 11
    assert not AuditCheckpoint.objects.exists()
    assert list(tmp_path.iterdir()) == []


def test_nothing_is_archived_when_no_event_is_old_enough(
    old_and_new: tuple[list[AuditEvent], list[AuditEvent]], tmp_path: Path
) -> None:
    said = command("archive_audit", "--older-than-days", "60", "--output", str(tmp_path / "none.jsonl.gz"))

    assert said == "nothing to archive: no event older than 60 days"
    assert AuditEvent.objects.count() == 11
    assert list(tmp_path.iterdir()) == []


def test_an_archive_file_is_never_overwritten(
    old_and_new: tuple[list[AuditEvent], list[AuditEvent]], tmp_path: Path
) -> None:
    archive = tmp_path / "old.jsonl.gz"
    archive.write_bytes(b"an earlier archive")

    said = command("archive_audit", "--older-than-days", "30", "--output", str(archive))

    assert said == (
        f"FAILED: {archive} exists: an archive is never overwritten. No archive checkpoint names it: an "
        "archive_audit run interrupted before it committed may have left it (its events are still in the table); "
        "move it away and run archive_audit again."
    )
    assert archive.read_bytes() == b"an earlier archive"
    assert AuditEvent.objects.count() == 11


def test_the_default_archive_file_is_named_by_its_seq_range(
    old_and_new: tuple[list[AuditEvent], list[AuditEvent]], settings: Any, tmp_path: Path
) -> None:
    settings.VAR_DIR = tmp_path

    said = command("archive_audit", "--older-than-days", "30")

    archive = tmp_path / "audit-archive" / "audit-000000000001-000000000008.jsonl.gz"
    assert said.startswith(f"archived 8 events (seq 1 to 8) to {archive}")
    assert command("verify_audit", "--archive", str(archive)).startswith("verified 8 archived events")


def test_events_removed_after_the_checkpoint_are_still_detected(
    old_and_new: tuple[list[AuditEvent], list[AuditEvent]], tmp_path: Path
) -> None:
    command("archive_audit", "--older-than-days", "30", "--output", str(tmp_path / "old.jsonl.gz"))
    with intruder_cursor() as cursor:
        cursor.execute("DELETE FROM audit_auditevent WHERE seq = 9")

    assert command("verify_audit") == "FAILED: seq 9 missing — removed"


def test_a_forged_first_event_after_the_checkpoint_is_detected(
    old_and_new: tuple[list[AuditEvent], list[AuditEvent]], tmp_path: Path
) -> None:
    _, new = old_and_new
    command("archive_audit", "--older-than-days", "30", "--output", str(tmp_path / "old.jsonl.gz"))
    with intruder_cursor() as cursor:
        cursor.execute("UPDATE audit_auditevent SET prev_hash = %s WHERE seq = 9", ["f" * 64])

    assert command("verify_audit") == f"FAILED: event seq 9 (id {new[0].pk}): hash mismatch — altered"


def test_new_events_after_an_archive_continue_the_chain(
    old_and_new: tuple[list[AuditEvent], list[AuditEvent]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    command("archive_audit", "--older-than-days", "0", "--output", str(tmp_path / "all.jsonl.gz"))
    (recorded,) = AuditEvent.objects.all()  # only the archive's own event, which follows the checkpoint
    assert (recorded.seq, recorded.action, recorded.prev_hash) == (
        12,
        "audit.archive",
        AuditCheckpoint.objects.get().hash,
    )
    assert command("verify_audit") == f"verified 1 events, head {recorded.hash}"

    (event,) = record(1, monkeypatch=monkeypatch)

    assert event.seq == 13
    assert event.prev_hash == recorded.hash
    assert command("verify_audit") == f"verified 2 events, head {event.hash}"


ARCHIVE_ON_POSTGRES = """
import json
from django.db import connection, transaction
from audit.archive import audit_events_archive
from audit.services import audit_chain_wait, audit_event_record
for i in range(20):
    audit_event_record(source="agent", tool="retention", args={{"i": i}})
report = audit_events_archive(older_than_days=0, output=__import__("pathlib").Path({path!r}))
audit_event_record(source="agent", tool="after-archive")
audit_chain_wait()  # chained by this process's chainer thread (deferred), so the table is not empty
try:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("DELETE FROM audit_auditevent")
    refused = "allowed"
except Exception as exc:
    refused = str(exc).splitlines()[0]
print(json.dumps({{"archived": report.count, "last_seq": report.last_seq, "delete_after": refused}}))
"""


@pytest.mark.postgres
def test_archiving_on_postgres_gets_past_the_trigger_only_for_itself(
    postgres_url: str,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    archive = tmp_path / "pg.jsonl.gz"

    ran = manage("shell", "-c", ARCHIVE_ON_POSTGRES.format(path=str(archive)), database_url=postgres_url)

    assert ran.returncode == 0, ran.stderr
    outcome = json.loads(ran.stdout.strip().splitlines()[-1])
    assert outcome["archived"] >= 20
    assert outcome["delete_after"] == "audit events are append-only: DELETE refused"
    verified = manage("verify_audit", database_url=postgres_url)
    assert verified.returncode == 0, verified.stderr
    assert verified.stdout.strip().splitlines()[-1].startswith("verified ")
    assert f"starting after archive checkpoint seq {outcome['last_seq']}" in verified.stdout
    archived = manage("verify_audit", "--archive", str(archive), database_url=postgres_url)
    assert archived.returncode == 0, archived.stderr
    assert archived.stdout.strip().splitlines()[-1].startswith(f"verified {outcome['archived']} archived events")


def test_archive_audit_says_what_it_is_doing_as_it_goes(
    old_and_new: tuple[list[AuditEvent], list[AuditEvent]], tmp_path: Path
) -> None:
    """On a production table archiving takes minutes: it said nothing until its last line."""
    archive = tmp_path / "told.jsonl.gz"
    out, err = io.StringIO(), io.StringIO()
    call_command(
        "archive_audit", "--older-than-days", "30", "--output", str(archive), "--progress-every", "3",
        stdout=out, stderr=err,
    )  # fmt: skip
    told = [line.strip() for line in err.getvalue().splitlines()]
    assert told == [
        "chaining the events appended but not chained yet…",
        f"checking and writing seq 1 to 8 to {archive}…",
        "3 events written…",
        "6 events written…",
        "recording the checkpoint and deleting 8 events…",
    ]
    assert out.getvalue().startswith("archived 8 events")
