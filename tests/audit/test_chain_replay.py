"""Replays and races of the deferred chain (``audit.services``, ``audit.verification``).

- A pending row is single-use: its writer draws a one-time nonce, covered by the row's MAC and by the event's hash
  and unique among the events, so that a copy of a pending row put back (from a backup, a replica, a trigger of
  an intruder's, none of which needs the chain key) is never chained again, and ``verify_audit`` names it; a copy
  of a row whose event was archived since is named by ``verify_audit`` against the archive file.
- Events written before nonces existed (and inline ones, which have none) hash and verify as they did.
- An ``archive_audit`` that commits while ``verify_audit`` runs is no removal.
"""

from __future__ import annotations

import gzip
import importlib
import json
import re
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from django.db import connection

from audit import services, verification
from audit.archive import audit_events_archive
from audit.chain import canonical_bytes, event_hash, pending_hash
from audit.models import AuditEvent, AuditPendingEvent
from audit.services import audit_chain_pending, audit_event_record, chain_lag
from tests.audit.test_chain import insider_mac, sql, stored, verify
from tests.audit.test_retention import record
from tests.postgres import manage, postgres_url  # noqa: F401 - postgres_url is a fixture

pytestmark = pytest.mark.django_db

PENDING = AuditPendingEvent._meta.db_table
COLUMNS = [f.column for f in AuditPendingEvent._meta.concrete_fields if not f.primary_key]


@pytest.fixture
def deferred(settings: Any) -> None:
    settings.AUDIT_CHAIN_MODE = "deferred"
    settings.AUDIT_CHAIN_BACKGROUND = "off"


def append(**fields: Any) -> None:
    audit_event_record(
        source="admin", action="config.user.update", actor="root", args={"is_superuser": [False, True]}, **fields
    )


def captured() -> list[Any]:
    """The only pending row as it is stored, every column but the id: the intruder's copy (no key involved)."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {', '.join(COLUMNS)} FROM {PENDING}")
        rows = cursor.fetchall()
    assert len(rows) == 1
    return list(rows[0])


def put_back(row: list[Any]) -> int:
    """The copy inserted again, as it was (same content, nonce and MAC); its new id."""
    sql(f"INSERT INTO {PENDING} ({', '.join(COLUMNS)}) VALUES ({', '.join(['%s'] * len(COLUMNS))})", row)
    return int(AuditPendingEvent.objects.order_by("-id").values_list("id", flat=True)[0])


# --- a pending row is chained once ---------------------------------------------------------------------------


@pytest.mark.usefixtures("deferred")
def test_a_pending_row_put_back_after_it_was_chained_is_never_chained_again_and_verify_names_it() -> None:
    append()
    copy = captured()
    assert audit_chain_pending() == 1
    assert verify().startswith("verified 1 events")
    event = AuditEvent.objects.get()
    assert event.nonce and re.fullmatch(r"[0-9a-f]{32}", event.nonce)
    assert event.nonce == copy[COLUMNS.index("nonce")]  # the pending row's nonce, now the event's

    replayed = put_back(copy)
    assert audit_chain_pending() == 0  # the chainer stops before it, as before a forged row

    assert AuditEvent.objects.filter(action="config.user.update").count() == 1
    assert chain_lag().count == 1
    assert verify() == (
        f"FAILED: pending event id {replayed}: the nonce of event seq 1 (id {event.pk}) — replayed"
        " (a copy of its pending row put back; never chained)"
    )
    append(call_id="later")  # what comes after it waits behind it, as behind a forged row
    assert audit_chain_pending() == 0


@pytest.mark.usefixtures("deferred")
def test_a_copy_put_back_before_the_row_was_chained_is_chained_once() -> None:
    append()
    original = AuditPendingEvent.objects.get().pk
    replayed = put_back(captured())

    assert audit_chain_pending() == 1  # the first of the two; the chainer stops at the second
    assert list(AuditPendingEvent.objects.values_list("id", flat=True)) == [replayed]
    assert original != replayed
    event = AuditEvent.objects.get()
    assert verify() == (
        f"FAILED: pending event id {replayed}: the nonce of event seq 1 (id {event.pk}) — replayed"
        " (a copy of its pending row put back; never chained)"
    )


@pytest.mark.usefixtures("deferred")
def test_two_pending_copies_are_named_before_either_is_chained() -> None:
    append()
    first = AuditPendingEvent.objects.get().pk
    second = put_back(captured())
    assert verify() == (
        f"FAILED: pending event id {second}: the nonce of pending event id {first} — replayed"
        " (a copy of a pending row; never chained)"
    )


@pytest.mark.usefixtures("deferred")
def test_a_copy_with_another_nonce_is_forged() -> None:
    append()
    copy = captured()
    copy[COLUMNS.index("nonce")] = uuid.uuid4().hex  # a fresh nonce: the MAC covers the nonce
    audit_chain_pending()
    replayed = put_back(copy)
    assert audit_chain_pending() == 0
    assert verify() == (
        f"FAILED: pending event id {replayed}: MAC mismatch — forged (written or rewritten without the chain key)"
    )


@pytest.mark.usefixtures("deferred")
def test_a_pending_row_without_a_nonce_is_never_chained_even_with_a_valid_mac() -> None:
    """A copy taken before nonces existed: its MAC (over its content alone) is valid, but it has no nonce."""
    append()
    row = AuditPendingEvent.objects.get()
    content = {name: getattr(row, name) for name in ("created_at", "run_id", "source", "action", "mcp_id", "tool")}
    content |= {name: getattr(row, name) for name in ("call_id", "args", "result", "ok", "reason", "attempt")}
    content |= {"latency_ms": row.latency_ms, "actor": row.actor}
    sql(
        f"UPDATE {PENDING} SET nonce = '', mac = %s WHERE id = %s",
        [insider_mac("pending", pending_hash(content)), row.pk],
    )

    assert audit_chain_pending() == 0
    assert AuditEvent.objects.count() == 0
    assert verify() == (
        f"FAILED: pending event id {row.pk}: no nonce — forged (written or rewritten without the chain key)"
    )


@pytest.mark.usefixtures("deferred")
def test_two_events_with_one_nonce_fail_verification_where_the_constraint_was_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The events' unique nonce and the chainer both refuse a second event with a nonce; were the index dropped
    and a chainer not to look (an older one), ``verify_audit`` still finds the two."""
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
    assert verify() == (
        f"FAILED: event seq 2 (id {second.pk}): the nonce of event seq 1 — replayed"
        " (a copy of its pending row chained again)"
    )


@pytest.mark.usefixtures("deferred")
def test_a_copy_of_an_archived_events_row_is_named_by_verify_audit(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Once its event has left the table, a copy's nonce is in no event for the chainer to refuse: it is chained,
    and ``verify_audit`` names it against the archive file, where the nonce is."""
    record(1, days_ago=40, monkeypatch=monkeypatch)
    copy = captured()
    audit_chain_pending()
    record(2, monkeypatch=monkeypatch)
    audit_chain_pending()
    archived = audit_events_archive(older_than_days=30, output=tmp_path / "a.jsonl.gz")
    assert (archived.first_seq, archived.last_seq) == (1, 1)
    assert audit_chain_pending() == 1  # the archive's own event, seq 4
    assert verify().startswith("verified 3 events")

    put_back(copy)
    assert audit_chain_pending() == 1
    replayed = AuditEvent.objects.get(seq=5)
    assert verify() == (
        f"FAILED: event seq 5 (id {replayed.pk}): the nonce of archived event seq 1 ({tmp_path / 'a.jsonl.gz'})"
        " — replayed (a copy of its pending row chained again)"
    )


# --- what has no nonce hashes as before ----------------------------------------------------------------------


def test_an_event_without_a_nonce_hashes_as_before_and_one_with_a_nonce_covers_it() -> None:
    append()  # inline (SQLite's default): no nonce
    event = stored(1)
    assert event["nonce"] is None
    without = {name: value for name, value in event.items() if name != "nonce"}
    assert event_hash(without) == event_hash(event) == event["hash"]  # old rows, old archive lines: the same
    assert b"nonce" not in canonical_bytes(event)
    assert b'"nonce":"ab"' in canonical_bytes({**event, "nonce": "ab"})
    assert event_hash({**event, "nonce": "ab"}) != event_hash({**event, "nonce": "ac"}) != event["hash"]
    assert verify().startswith("verified 1 events")


def test_inline_events_then_deferred_ones_verify_together_and_archive(
    settings: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    record(2, days_ago=40, monkeypatch=monkeypatch)  # inline: no nonce
    settings.AUDIT_CHAIN_MODE, settings.AUDIT_CHAIN_BACKGROUND = "deferred", "off"
    record(2, days_ago=35, monkeypatch=monkeypatch)
    record(1, monkeypatch=monkeypatch)
    audit_chain_pending()
    assert [e.nonce is None for e in AuditEvent.objects.order_by("seq")] == [True, True, False, False, False]
    assert verify().startswith("verified 5 events")

    audit_events_archive(older_than_days=30, output=tmp_path / "a.jsonl.gz")
    with gzip.open(tmp_path / "a.jsonl.gz", "rt", encoding="utf-8") as lines:
        nonces = [json.loads(line).get("nonce", "none") for line in lines]
    assert nonces[:2] == [None, None] and all(re.fullmatch(r"[0-9a-f]{32}", n) for n in nonces[2:4])
    assert verify().startswith("verified 1 events")
    assert verify("--archive", str(tmp_path / "a.jsonl.gz")).startswith("verified 4 archived events")


@pytest.mark.usefixtures("deferred")
def test_the_migration_gives_rows_pending_at_the_upgrade_a_nonce_and_leaves_forged_ones_without() -> None:
    migration = importlib.import_module("audit.migrations.0015_event_nonce")
    append(call_id="waiting")
    append(call_id="forged")
    waiting, forged = AuditPendingEvent.objects.order_by("id")
    content = {name: getattr(waiting, name) for name in ("created_at", "run_id", "source", "action", "mcp_id")}
    content |= {name: getattr(waiting, name) for name in ("tool", "call_id", "args", "result", "ok", "reason")}
    content |= {"attempt": waiting.attempt, "latency_ms": waiting.latency_ms, "actor": waiting.actor}
    # As they were before the upgrade: no nonce, the MAC over the content alone (the second one's is forged).
    sql(
        f"UPDATE {PENDING} SET nonce = '', mac = %s WHERE id = %s",
        [insider_mac("pending", pending_hash(content)), waiting.pk],
    )
    sql(f"UPDATE {PENDING} SET nonce = '', mac = '' WHERE id = %s", [forged.pk])

    migration.pending_nonces(None, SimpleNamespace(connection=connection))

    waiting.refresh_from_db()
    forged.refresh_from_db()
    assert re.fullmatch(r"[0-9a-f]{32}", waiting.nonce)
    assert forged.nonce == ""
    assert audit_chain_pending() == 1
    assert AuditEvent.objects.get().call_id == "waiting"
    assert verify() == (
        f"FAILED: pending event id {forged.pk}: no MAC — forged (written or rewritten without the chain key)"
    )


# --- an archive while verify_audit runs ----------------------------------------------------------------------


def archive_right_after_the_checkpoints_are_read(monkeypatch: pytest.MonkeyPatch, output: Path) -> list[int]:
    """Have an archive commit just after ``verify_audit`` read the checkpoints (and checked the archive files),
    before it reads the events: once. Returns the list of archives made (their last seq)."""
    real_start = verification._chain_start
    made: list[int] = []

    def start_then_archive_commits(*args: Any, **kwargs: Any) -> Any:
        verifier = real_start(*args, **kwargs)
        if not made:
            made.append(audit_events_archive(older_than_days=30, output=output).last_seq)
        return verifier

    monkeypatch.setattr(verification, "_chain_start", start_then_archive_commits)
    return made


def test_an_archive_committed_while_verify_audit_runs_is_no_removal(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    record(5, days_ago=40, monkeypatch=monkeypatch)
    record(2, monkeypatch=monkeypatch)
    assert verify().startswith("verified 7 events")
    made = archive_right_after_the_checkpoints_are_read(monkeypatch, tmp_path / "a.jsonl.gz")

    # The events after the archive, and the archive's own event (seq 8), appended while verify_audit ran.
    assert verify() == f"verified 3 events, head {AuditEvent.objects.get(seq=8, action='audit.archive').hash}"
    assert made == [5]


def test_an_archive_of_every_event_committed_while_verify_audit_runs_is_no_truncation(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    record(3, days_ago=40, monkeypatch=monkeypatch)
    made = archive_right_after_the_checkpoints_are_read(monkeypatch, tmp_path / "a.jsonl.gz")

    # Only the archive's own event is left (seq 4), appended while verify_audit ran.
    assert verify() == f"verified 1 events, head {AuditEvent.objects.get(seq=4, action='audit.archive').hash}"
    assert made == [3]


def test_the_first_events_removed_are_still_removed(monkeypatch: pytest.MonkeyPatch) -> None:
    """No checkpoint covers them: verified once more at most, then reported as removed."""
    record(3, monkeypatch=monkeypatch)
    calls: list[int] = []
    real_start = verification._chain_start

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real_start(*args, **kwargs)

    monkeypatch.setattr(verification, "_chain_start", counted)
    sql("DELETE FROM audit_auditevent WHERE seq = 1")
    assert verify() == "FAILED: seq 1 missing — removed"
    assert len(calls) == 1


# --- PostgreSQL -----------------------------------------------------------------------------------------------

REPLAY_ON_POSTGRES = """
import json
from django.db import connection, transaction
from audit.models import AuditEvent, AuditPendingEvent
from audit.services import audit_chain_pending, audit_event_record
from audit.verification import audit_chain_verify

table = AuditPendingEvent._meta.db_table
columns = [f.column for f in AuditPendingEvent._meta.concrete_fields if not f.primary_key]
with transaction.atomic():
    audit_event_record(source="admin", action="replay.test", tool={tag!r})
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {{', '.join(columns)}} FROM {{table}} WHERE tool = %s", [{tag!r}])
        copy = cursor.fetchone()
audit_chain_pending(wait=True, rounds=None)  # the writer's own pass may have chained it already
first = audit_chain_verify()
with connection.cursor() as cursor:
    cursor.execute(
        f"INSERT INTO {{table}} ({{', '.join(columns)}}) VALUES ({{', '.join(['%s'] * len(columns))}})", list(copy)
    )
try:
    chained = audit_chain_pending(wait=True, rounds=None)
    replayed = audit_chain_verify()
finally:
    AuditPendingEvent.objects.filter(tool={tag!r}).delete()  # the database is the session's: unblock its chain
after = audit_chain_verify()
print(json.dumps({{
    "first": first.problem, "chained": chained, "events": AuditEvent.objects.filter(tool={tag!r}).count(),
    "replayed": replayed.problem, "after": after.problem,
}}))
"""


@pytest.mark.postgres
def test_a_pending_row_put_back_on_postgres_is_never_chained_again(
    postgres_url: str,  # noqa: F811 - the fixture
) -> None:
    tag = f"replay-{uuid.uuid4().hex[:8]}"
    done = manage(
        "shell",
        "-c",
        REPLAY_ON_POSTGRES.format(tag=tag),
        database_url=postgres_url,
        env={"AUDIT_CHAIN_MODE": "deferred", "AUDIT_CHAIN_BACKGROUND": "off"},
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["first"] is None
    assert out["chained"] == 0
    assert out["events"] == 1
    assert re.fullmatch(r"pending event id \d+: the nonce of event seq \d+ \(id \d+\) — replayed .*", out["replayed"])
    assert out["after"] is None


def test_an_export_carries_the_nonce_its_events_hash_was_made_with(deferred: None, auditor_client: Any) -> None:
    """An auditor recomputing a deferred event's hash from an export needs its nonce (the hash covers it)."""
    append(tool="exported")
    audit_chain_pending()  # chains it (and the auditor's creation)
    event = AuditEvent.objects.get(tool="exported")
    assert event.nonce
    response = auditor_client.get("/api/v1/audit/events?format=jsonl&tool=exported")
    lines = b"".join(response.streaming_content).decode().splitlines()
    assert json.loads(lines[0])["nonce"] == event.nonce


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_unapplying_0015_is_refused_while_events_carry_a_nonce(deferred: None) -> None:
    """Going back dropped the nonces the events' hashes cover: they no longer verified, for good."""
    from django.core.management import call_command
    from django.db.migrations.exceptions import IrreversibleError

    append()
    audit_chain_pending()
    assert AuditEvent.objects.filter(nonce__isnull=False).exists()
    try:
        with pytest.raises(IrreversibleError, match="cannot be unapplied"):
            call_command("migrate", "audit", "0014", verbosity=0)
        assert AuditEvent.objects.filter(nonce__isnull=False).exists()
    finally:
        call_command("migrate", "audit", verbosity=0)
    assert verify().startswith("verified")
