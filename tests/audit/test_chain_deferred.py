"""Deferred chaining (``audit.services``): writers insert MAC'd pending rows and hold no shared lock; a single
chainer links them into the chain in order just after commit. The tamper table runs in both modes
(``tests/audit/test_tamper.py``); here: the pending stage itself, its lag, forged and edited pending rows, a
rolled-back writer, and writer processes appending at once on SQLite and PostgreSQL, with no event left behind.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from audit.chain import GENESIS_HASH, event_hash
from audit.models import AuditChainHead, AuditEvent, AuditPendingEvent
from audit.services import audit_chain_pending, audit_event_record, audit_events_record, chain_lag, chain_mode
from tests.audit.test_chain import (
    EVENTS_PER_WRITER,
    READ_WRITER_EVENTS,
    WRITERS,
    assert_interleaved_and_gap_free,
    insider_mac,
    run_writers,
    sql,
    stored,
    verify,
)
from tests.postgres import manage, postgres_url  # noqa: F401 - postgres_url is a fixture

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def deferred(settings: Any) -> None:
    settings.AUDIT_CHAIN_MODE = "deferred"


def append(i: int, **fields: Any) -> AuditEvent:
    return audit_event_record(source="agent", mcp_id="demo", tool="search_employee", call_id=f"c{i}", **fields)


def test_auto_mode_is_deferred_on_postgresql_and_inline_on_sqlite(settings: Any) -> None:
    settings.AUDIT_CHAIN_MODE = "auto"
    assert chain_mode() == ("deferred" if connection.vendor == "postgresql" else "inline")
    settings.AUDIT_CHAIN_MODE = "inline"
    assert chain_mode() == "inline"


def test_appended_events_wait_as_pending_rows_then_join_the_chain_in_order_with_the_lag_read() -> None:
    written = [append(i, args={"i": i, "api_key": "sk-live-abcdefgh12345678"}) for i in range(3)]

    assert [event.seq for event in written] == [None, None, None]
    assert AuditEvent.objects.count() == 0
    lag = chain_lag()
    assert lag.count == 3
    assert 0 <= lag.oldest_age_s < 60
    assert "sk-live" not in json.dumps(list(AuditPendingEvent.objects.values("args")))  # masked before it waits
    assert verify().startswith("verified 0 events")

    assert audit_chain_pending() == 3

    assert chain_lag().count == 0
    assert chain_lag().oldest_age_s == 0.0
    events = list(AuditEvent.objects.order_by("seq"))
    assert [(e.seq, e.call_id) for e in events] == [(1, "c0"), (2, "c1"), (3, "c2")]
    assert events[0].prev_hash == GENESIS_HASH
    assert events[1].prev_hash == events[0].hash
    assert all(event.hash == event_hash(stored(event.seq)) for event in events)
    assert [e.created_at for e in events] == [w.created_at for w in written]  # the writer's time, not the chainer's
    head = AuditChainHead.objects.get()
    assert (head.seq, head.hash) == (3, events[-1].hash)
    assert verify().startswith("verified 3 events")
    assert audit_chain_pending() == 0


def test_verify_reports_events_not_chained_yet_as_the_chain_lag() -> None:
    append(0)
    audit_chain_pending()
    append(1)
    append(2)

    out = verify_all_lines()
    assert any(line.startswith("2 events appended but not chained yet (chain lag)") for line in out), out
    assert out[-1].startswith("verified 1 events")


def verify_all_lines() -> list[str]:
    import io

    from django.core.management import call_command

    stdout = io.StringIO()
    call_command("verify_audit", stdout=stdout, stderr=io.StringIO())
    return stdout.getvalue().strip().splitlines()


def test_values_stored_as_json_text_hash_the_same_when_the_chainer_reads_them_back() -> None:
    append(0, args={"when": dt.date(2026, 1, 2), "amount": decimal.Decimal("1.50"), "n": 4.0, "이름": "김하늘"})
    append(1, result={"at": timezone.now(), "big": 1e20, "nested": [{"x": 2.0}]}, latency_ms=2.5)

    assert audit_chain_pending() == 2
    assert verify().startswith("verified 2 events")


def test_the_writer_chains_its_own_event_once_its_transaction_commits(django_capture_on_commit_callbacks: Any) -> None:
    with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
        append(0)
        append(1)
        assert AuditPendingEvent.objects.count() == 2
        assert AuditEvent.objects.count() == 0  # nothing shared is touched while the writer's transaction runs

    assert AuditPendingEvent.objects.count() == 0
    assert list(AuditEvent.objects.order_by("seq").values_list("seq", "call_id")) == [(1, "c0"), (2, "c1")]


def test_a_rolled_back_writer_leaves_nothing_pending_and_no_gap() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        append(0)
        raise RuntimeError("the caller's change failed")
    append(1)

    assert audit_chain_pending() == 1
    assert list(AuditEvent.objects.values_list("seq", "call_id")) == [(1, "c1")]
    assert verify().startswith("verified 1 events")


def insert_pending_raw(**fields: Any) -> int:
    row = {
        "run_id": None, "source": "admin", "action": "tool.call", "mcp_id": "demo", "tool": "search_employee",
        "call_id": "", "args": json.dumps({"name": "김하늘"}, ensure_ascii=False), "result": None, "ok": True,
        "reason": "", "attempt": 1, "latency_ms": None, "actor": "intruder", "created_at": timezone.now().isoformat(),
        "mac": "", "nonce": uuid.uuid4().hex, **fields,
    }  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO audit_auditpendingevent ({', '.join(row)}) VALUES ({', '.join(['%s'] * len(row))})",
            list(row.values()),
        )
        cursor.execute("SELECT MAX(id) FROM audit_auditpendingevent")
        return int(cursor.fetchone()[0])


def test_a_pending_row_forged_without_the_key_is_never_chained_and_verify_names_it() -> None:
    append(0)
    forged = insert_pending_raw()
    append(1)

    assert audit_chain_pending() == 1  # the genuine event before it; the chainer stops at the forgery

    assert list(AuditEvent.objects.values_list("call_id", flat=True)) == ["c0"]
    assert chain_lag().count == 2
    assert verify() == (
        f"FAILED: pending event id {forged}: no MAC — forged (written or rewritten without the chain key)"
    )
    insert_pending_raw(mac=insider_mac("pending", "0" * 64))
    assert verify() == (
        f"FAILED: pending event id {forged}: no MAC — forged (written or rewritten without the chain key)"
    )


def test_a_pending_row_edited_before_it_is_chained_is_never_chained_and_verify_names_it() -> None:
    append(0)
    pending = AuditPendingEvent.objects.get()
    sql("UPDATE audit_auditpendingevent SET actor = 'intruder' WHERE id = %s", [pending.pk])

    assert audit_chain_pending() == 0
    assert AuditEvent.objects.count() == 0
    assert verify() == (
        f"FAILED: pending event id {pending.pk}: MAC mismatch — forged (written or rewritten without the chain key)"
    )


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_writer_processes_appending_at_once_on_sqlite_deferred_leave_nothing_pending(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUDIT_CHAIN_MODE", "deferred")

    run_writers(tmp_path, sqlite_path=connection.settings_dict["NAME"])

    assert AuditPendingEvent.objects.count() == 0
    assert verify().startswith(f"verified {WRITERS * EVENTS_PER_WRITER} events")
    rows = list(AuditEvent.objects.filter(tool="writer").order_by("seq").values_list("seq", "call_id"))
    assert_interleaved_and_gap_free([call_id for _, call_id in rows], [seq for seq, _ in rows])


@pytest.mark.postgres
@pytest.mark.parametrize("mode", ["deferred", "inline"])
def test_writer_processes_on_postgres_chain_every_event_gap_free_in_either_mode(
    postgres_url: str,  # noqa: F811 - the fixture
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
) -> None:
    monkeypatch.setenv("AUDIT_CHAIN_MODE", mode)
    tool = f"writer-{uuid.uuid4().hex[:8]}"  # the database is the session's: only what these writers append

    run_writers(tmp_path, tool=tool, database_url=postgres_url)

    read = manage("shell", "-c", READ_WRITER_EVENTS.format(tool=tool), database_url=postgres_url)
    assert read.returncode == 0, read.stderr
    *_, pending, events = read.stdout.strip().splitlines()
    assert pending.split() == [mode, "0"]  # read before anything is chained: the writers left nothing pending
    verified = manage("verify_audit", database_url=postgres_url)
    assert verified.returncode == 0, verified.stderr
    assert verified.stdout.strip().splitlines()[-1].startswith("verified ")
    rows = json.loads(events)
    assert_interleaved_and_gap_free([call_id for _, call_id in rows], [seq for seq, _ in rows])


def test_events_appended_together_wait_as_pending_rows_in_order_then_join_the_chain() -> None:
    written = audit_events_record(
        [
            {"source": "agent", "call_id": f"c{i}", "args": {"i": i, "api_key": "sk-live-abcdefgh12345678"}}
            for i in range(4)
        ]
    )
    assert [event.seq for event in written] == [None] * 4
    assert chain_lag().count == 4
    assert "sk-live" not in json.dumps(list(AuditPendingEvent.objects.values("args")))
    assert audit_chain_pending() == 4
    assert [e.call_id for e in AuditEvent.objects.order_by("seq")] == ["c0", "c1", "c2", "c3"]
    assert verify().startswith("verified 4 events")


def test_more_events_than_one_statement_carries_are_appended_in_order() -> None:
    """Pending rows go out in statements of up to 50 rows (one round trip each, with the head's check)."""
    audit_events_record([{"source": "agent", "call_id": f"c{i}", "args": {"i": i}} for i in range(123)])
    assert chain_lag().count == 123
    assert audit_chain_pending() == 123
    assert [e.call_id for e in AuditEvent.objects.order_by("seq")] == [f"c{i}" for i in range(123)]
    assert verify().startswith("verified 123 events")
