"""What ``verify_audit`` vouches for is what an auditor reads.

On SQLite the auditor's filters compare what is stored (``?run``, ``?agent`` and a run's trace the run id's text,
``?since``/``?until`` the time's text, ``?ok`` the column's truth), while the hash covers each value in its canonical
form: a row rewritten to another spelling of the same value would escape those filters and still hash alike. So
``verify_audit`` reads the time, the run id and ``ok`` only in the form the platform stores them, and names a row
stored otherwise as altered. What the platform writes, inline or deferred, in any ``TIME_ZONE``, still verifies.

An archive file whose lines carry no MAC is only a chain of hashes, which anyone can compute: ``verify_audit
--archive`` verifies it only where the database's (MAC'd) checkpoint at its end, or an authenticated file after it,
vouches for it."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from audit.chain import GENESIS_HASH, event_hash
from audit.models import AuditEvent
from audit.services import chain_mode
from tests.audit.test_chain import record, sql, verify
from tests.audit.test_retention import archive_lines, command, rewrite_archive
from tests.audit.test_retention import record as record_days_ago

pytestmark = pytest.mark.django_db
on_sqlite = pytest.mark.skipif("connection.vendor != 'sqlite'")

RUN_ID = uuid.UUID("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0")
WHOLE_SECOND = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)


@pytest.fixture(params=["inline", "deferred"])
def both_chain_modes(request: pytest.FixtureRequest, settings: Any) -> str:
    settings.AUDIT_CHAIN_MODE = request.param
    settings.TIME_ZONE = "America/Los_Angeles"  # not UTC (nor the default Asia/Seoul): what is stored is UTC
    return str(request.param)


def written(monkeypatch: pytest.MonkeyPatch) -> list[AuditEvent]:
    """Four events as the platform writes them: at a whole second (Django stores no fraction then), with a run,
    without one, and one that failed."""
    with monkeypatch.context() as clock:
        clock.setattr(timezone, "now", lambda: WHOLE_SECOND)
        events = record(1, run_id=RUN_ID)
    events += record(1, run_id=RUN_ID)
    events += record(1)
    events += record(1, run_id=RUN_ID, ok=False, reason="tool:failed")
    return events


def stored_text(seq: int, column: str) -> Any:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT +{column} FROM audit_auditevent WHERE seq = %s", [seq])
        return cursor.fetchone()[0]


def altered(event: AuditEvent, column: str, stored: Any) -> str:
    return (
        f"FAILED: event seq {event.seq} (id {event.pk}): unreadable ({column} stored as {stored!r}, not in the form "
        "the platform writes) — altered"
    )


@on_sqlite
@pytest.mark.usefixtures("both_chain_modes")
def test_what_the_platform_writes_verifies_in_the_form_it_is_stored(monkeypatch: pytest.MonkeyPatch) -> None:
    events = written(monkeypatch)

    assert stored_text(1, "created_at") == "2026-01-02 03:04:05"  # str() of the UTC time: no ".000000"
    assert len(stored_text(2, "created_at")) == len("2026-01-02 03:04:05.000006")
    assert stored_text(2, "run_id") == RUN_ID.hex
    assert stored_text(3, "run_id") is None
    assert (stored_text(2, "ok"), stored_text(4, "ok")) == (1, 0)
    if chain_mode() == "deferred":
        assert len(stored_text(1, "nonce")) == 32
    assert verify() == f"verified 4 events, head {events[-1].hash}"


def _same_instant_with_offset(text: str) -> str:
    moment = dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC)
    return moment.astimezone(dt.timezone(dt.timedelta(hours=23, minutes=59))).isoformat(sep=" ")


# Each rewrites what is stored of one event to another spelling of the same value (the hash is unchanged), with
# SQLite's triggers lifted as an intruder with the database file does: (the event's seq, the column, its new text).
REWRITES: dict[str, Callable[[], tuple[int, str, Any]]] = {
    "run id in upper case": lambda: (2, "run_id", RUN_ID.hex.upper()),
    "run id with dashes": lambda: (2, "run_id", str(RUN_ID)),
    "time with an offset": lambda: (2, "created_at", _same_instant_with_offset(stored_text(2, "created_at"))),
    "time in ISO form": lambda: (2, "created_at", stored_text(2, "created_at").replace(" ", "T") + "+00:00"),
    "whole second with a fraction": lambda: (1, "created_at", "2026-01-02 03:04:05.000000"),
    "ok neither 0 nor 1": lambda: (4, "ok", 0.5),
}


@on_sqlite
@pytest.mark.usefixtures("both_chain_modes")
@pytest.mark.parametrize("rewrite", list(REWRITES))
def test_another_spelling_of_a_stored_value_is_named_as_altered(monkeypatch: pytest.MonkeyPatch, rewrite: str) -> None:
    events = written(monkeypatch)
    seq, column, text = REWRITES[rewrite]()

    sql(f"UPDATE audit_auditevent SET {column} = %s WHERE seq = %s", [text, seq])

    assert verify() == altered(events[seq - 1], column, text)


@on_sqlite
@pytest.mark.usefixtures("both_chain_modes")
def test_a_json_column_holding_no_json_is_named_as_altered_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    """Written with the database's checks off: verification crashed (JSONDecodeError) instead of naming it."""
    events = written(monkeypatch)
    sql("PRAGMA ignore_check_constraints = ON")
    try:
        sql("UPDATE audit_auditevent SET result = %s WHERE seq = 4", ["abc"])
    finally:
        sql("PRAGMA ignore_check_constraints = OFF")

    assert verify() == altered(events[3], "result", "abc")


@on_sqlite
@pytest.mark.usefixtures("both_chain_modes")
def test_a_run_id_in_upper_case_hides_the_event_from_its_run_and_is_named_as_altered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    events = written(monkeypatch)
    sql("UPDATE audit_auditevent SET run_id = upper(run_id) WHERE seq = 2")

    # What the tampering does: the run's trace (and ?run=, ?agent=) no longer finds the event.
    assert list(AuditEvent.objects.filter(run_id=RUN_ID).values_list("seq", flat=True)) == [1, 4]
    assert verify() == altered(events[1], "run_id", RUN_ID.hex.upper())


@on_sqlite
@pytest.mark.usefixtures("both_chain_modes")
def test_a_time_with_an_offset_moves_the_event_out_of_its_day_and_is_named_as_altered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    events = written(monkeypatch)
    day = dt.datetime(2026, 1, 2, tzinfo=dt.UTC)
    shifted = _same_instant_with_offset("2026-01-02 03:04:05")
    sql("UPDATE audit_auditevent SET created_at = %s WHERE seq = 1", [shifted])

    # What the tampering does: the same instant, but its text sorts into the next day (?since=/?until=).
    in_its_day = AuditEvent.objects.filter(created_at__gte=day, created_at__lt=day + dt.timedelta(days=1))
    assert list(in_its_day.values_list("seq", flat=True)) == []
    assert verify() == altered(events[0], "created_at", shifted)


# --- archive files without MACs ---------------------------------------------------------------------------------


def archived_without_macs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> tuple[Path, Path]:
    """Eight events archived 40 days old, then three of today and the first archive's own event: two archive files
    (each with its checkpoint in the database), their MACs taken off, as a file written before events had one."""
    record_days_ago(8, days_ago=40, monkeypatch=monkeypatch)
    record_days_ago(3, monkeypatch=monkeypatch)
    old, new = tmp_path / "old.jsonl.gz", tmp_path / "new.jsonl.gz"
    command("archive_audit", "--older-than-days", "30", "--output", str(old))
    command("archive_audit", "--older-than-days", "0", "--output", str(new))
    for path in (old, new):
        rewrite_archive(path, [{k: v for k, v in line.items() if k != "mac"} for line in archive_lines(path)])
    return old, new


def unauthenticated(path: Path, seq: int) -> str:
    return (
        f"FAILED: archive {path}: its lines carry no MAC and the database holds no checkpoint at seq {seq} that "
        "vouches for it — unauthenticated (anyone can write such a file: check it against the database that "
        "archived it)"
    )


def test_an_archive_without_macs_verifies_where_the_database_checkpoint_vouches_for_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    old, new = archived_without_macs(monkeypatch, tmp_path)
    head = archive_lines(new)[-1]["checkpoint"]["hash"]

    assert command("verify_audit", "--archive", str(old)).startswith("verified 8 archived events, head ")
    assert command("verify_audit", "--archive", str(old), "--archive", str(new)) == (
        f"verified 12 archived events, head {head}"
    )
    # The first file's checkpoint gone: the second, linked to it, still vouches for both.
    sql("DELETE FROM audit_auditcheckpoint WHERE seq = 8")
    assert command("verify_audit", "--archive", str(old), "--archive", str(new)).startswith("verified 12 ")


def test_an_archive_without_macs_that_no_checkpoint_vouches_for_is_unauthenticated(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    old, new = archived_without_macs(monkeypatch, tmp_path)
    sql("DELETE FROM audit_auditcheckpoint WHERE seq = 8")

    assert command("verify_audit", "--archive", str(old)) == unauthenticated(old, 8)
    sql("DELETE FROM audit_auditcheckpoint")
    assert command("verify_audit", "--archive", str(old), "--archive", str(new)) == unauthenticated(old, 8)


def test_a_forged_archive_stripped_of_its_macs_is_not_verified_without_its_checkpoint(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The reviewer's case: every line rewritten and rehashed, no MAC to give it; on a database that holds no
    checkpoint for it (another machine, a restored database) it was "verified"."""
    old, _new = archived_without_macs(monkeypatch, tmp_path)
    forged, prev = [], GENESIS_HASH
    for line in archive_lines(old)[:-1]:
        line = {**line, "actor": "someone-else", "result": {"team": "forged"}, "prev_hash": prev}
        line["hash"] = prev = event_hash(line)
        forged.append(line)
    rewrite_archive(old, [*forged, {"checkpoint": {"seq": 8, "hash": prev}}])

    said = command("verify_audit", "--archive", str(old))
    assert said == f"FAILED: archive {old}: checkpoint seq 8 differs from the database's — replaced"
    sql("DELETE FROM audit_auditcheckpoint")
    assert command("verify_audit", "--archive", str(old)) == unauthenticated(old, 8)
