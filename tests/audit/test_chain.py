"""The audit hash chain: every event linked to the one before, tampering named, gap-free with several writers.

Tampering is done the way an intruder with database access would do it: raw SQL, after dropping SQLite's triggers
(anyone with the database file can; inside the test's transaction, so they come back after it). An insider who also
holds the chain key re-MACs what they rewrite (``insider_mac``). On PostgreSQL the append-only triggers are checked
against a private server, and several writer processes append at once on both databases.
"""

from __future__ import annotations

import datetime as dt
import decimal
import io
import itertools
import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import DatabaseError, connection, transaction
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

import audit.verification
from agent_platform.json import UnicodeJSONEncoder
from audit.append_only import sqlite_triggers_lift
from audit.chain import GENESIS_HASH, canonical_bytes, event_hash, head_message
from audit.chain_keys import chain_keyring
from audit.masking import mask_value, truncate
from audit.models import AuditChainHead, AuditEvent
from audit.services import (
    AuditChainHeadForged,
    AuditChainHeadMissing,
    audit_chain_pending,
    audit_event_record,
    audit_events_record,
    chain_mode,
)
from tests.postgres import manage, manage_popen, postgres_url  # noqa: F401 - postgres_url is a fixture

pytestmark = pytest.mark.django_db


def record(count: int, **fields: Any) -> list[AuditEvent]:
    """Append ``count`` events and return them as chained. Deferred (``AUDIT_CHAIN_MODE``), the writer's own
    chaining runs on commit, which a test's transaction never reaches: the chainer is called here instead, and
    the events are read back as it chained them."""
    events = [
        audit_event_record(source="agent", mcp_id="demo", tool="search_employee", args={"i": i}, **fields)
        for i in range(count)
    ]
    if chain_mode() == "deferred":
        assert all(event.seq is None for event in events)
        audit_chain_pending()
        events = list(AuditEvent.objects.order_by("-seq")[:count])[::-1]
    return events


def verify(*options: str) -> str:
    """``verify_audit``'s last line on success, or its error (prefixed ``FAILED: ``)."""
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("verify_audit", *options, stdout=out, stderr=err)
    except CommandError as exc:
        return f"FAILED: {exc}"
    return out.getvalue().strip().splitlines()[-1]


def sql(statement: str, params: list[Any] | None = None) -> None:
    """Raw SQL as an intruder with the database file runs it: SQLite's triggers dropped first."""
    sqlite_triggers_lift(connection)
    with connection.cursor() as cursor:
        cursor.execute(statement, params or [])


def insider_mac(purpose: Any, message: str) -> str:
    """A MAC made with the chain key: what only an insider who holds the key can compute."""
    return chain_keyring().sign(purpose, message)


def stored(seq: int) -> dict[str, Any]:
    """An event as the database gives it back, with every hashed field."""
    return AuditEvent.objects.values().get(seq=seq)


def forge(seq: int, prev_hash: str, **fields: Any) -> dict[str, Any]:
    """A well-formed event an intruder could compute: the hash algorithm is no secret."""
    event = {
        "seq": seq,
        "prev_hash": prev_hash,
        "created_at": dt.datetime.now(dt.UTC),
        "run_id": None,
        "source": "admin",
        "action": "tool.call",
        "mcp_id": "demo",
        "tool": "search_employee",
        "call_id": "",
        "args": {"name": "김하늘"},
        "result": None,
        "ok": True,
        "reason": "",
        "attempt": 1,
        "latency_ms": None,
        "actor": "intruder",
        "mac": "",  # without the chain key there is no MAC to give it
        **fields,
    }
    event["hash"] = event_hash(event)
    return event


def insert_raw(event: dict[str, Any]) -> int:
    columns = [name for name in event if name != "run_id"] + ["run_id"]
    values = [
        json.dumps(event[name], ensure_ascii=False) if name in ("args", "result") else event[name] for name in columns
    ]
    # As Django writes it on SQLite (naive UTC, ``str``): verification refuses another spelling of the same time.
    values[columns.index("created_at")] = str(event["created_at"].astimezone(dt.UTC).replace(tzinfo=None))
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO audit_auditevent ({', '.join(columns)}) VALUES ({', '.join(['%s'] * len(columns))})", values
        )
        return cursor.lastrowid


# --- the chain as written ------------------------------------------------------------------------------------


def test_each_event_carries_a_gap_free_seq_the_previous_hash_and_its_own_hash() -> None:
    events = record(4)

    assert [event.seq for event in events] == [1, 2, 3, 4]
    assert events[0].prev_hash == GENESIS_HASH
    for before, after in itertools.pairwise(events):
        assert after.prev_hash == before.hash
    for event in events:
        assert event.hash == event_hash(stored(event.seq))
    head = AuditChainHead.objects.get()
    assert (head.seq, head.hash) == (4, events[-1].hash)


def test_the_hash_is_sha256_of_sorted_key_json_of_every_stored_field_with_utc_iso_times() -> None:
    run_id = uuid.uuid4()
    event = {
        "seq": 7,
        "prev_hash": "a" * 64,
        "created_at": dt.datetime(2026, 1, 2, 12, 4, 5, 6, tzinfo=dt.timezone(dt.timedelta(hours=9))),
        "run_id": run_id.hex,
        "source": "agent",
        "action": "tool.call",
        "mcp_id": "demo",
        "tool": "search_employee",
        "call_id": "c1",
        "args": {"name": "김하늘", "b": [1.0, 2.5]},
        "result": None,
        "ok": True,
        "reason": "",
        "attempt": 1,
        "latency_ms": 3.0,
        "actor": "",
        "id": 99,  # the storage key is not hashed
    }

    text = canonical_bytes(event).decode("utf-8")

    assert text == (
        '{"action":"tool.call","actor":"","args":{"b":[1,2.5],"name":"김하늘"},"attempt":1,"call_id":"c1",'
        '"created_at":"2026-01-02T03:04:05.000006+00:00","latency_ms":3,"mcp_id":"demo","ok":true,'
        f'"prev_hash":"{"a" * 64}","reason":"","result":null,"run_id":"{run_id}","seq":7,'
        '"source":"agent","tool":"search_employee"}'
    )
    assert len(event_hash(event)) == 64


@pytest.mark.skipif("connection.vendor != 'sqlite'")
def test_a_time_sqlite_holds_in_another_form_is_read_as_the_orm_reads_it() -> None:
    """verify_audit reads SQLite's usual ``YYYY-MM-DD HH:MM:SS.ffffff`` as the hashed text in its query; a time
    stored in another form (no microseconds, which Django writes for a whole second) is parsed as the ORM would:
    the same instant hashes the same either way. (An insider with the key rewrites the last event's time.)"""
    _first, last = record(2)
    when = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    rewritten = {**stored(last.seq), "created_at": when}
    digest = event_hash(rewritten)
    sql(
        "UPDATE audit_auditevent SET created_at = %s, hash = %s, mac = %s WHERE seq = %s",
        ["2026-01-02 03:04:05", digest, insider_mac("event", digest), last.seq],
    )
    sql(
        "UPDATE audit_auditchainhead SET hash = %s, mac = %s WHERE id = 1",
        [digest, insider_mac("head", head_message(last.seq, digest))],
    )

    assert verify() == f"verified 2 events, head {digest}"
    sql("UPDATE audit_auditevent SET created_at = %s WHERE seq = %s", ["2026-01-02 03:04:06", last.seq])
    assert "altered" in verify()


def test_a_number_hashes_the_same_however_the_database_gives_it_back() -> None:
    # PostgreSQL's jsonb keeps numbers as decimals: 1e+20 comes back as the integer 100000000000000000000.
    as_written = forge(1, GENESIS_HASH, args={"big": 1e20, "one": 1.0, "small": 1.5e-7}, latency_ms=4)
    as_read = {**as_written, "args": {"big": 10**20, "one": 1.0, "small": 1.5e-07}, "latency_ms": 4.0}

    assert event_hash(as_read) == as_written["hash"]


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=12,
)


def as_jsonb_gives_it_back(value: Any) -> Any:
    """``value`` after a round trip through PostgreSQL's jsonb: numbers printed as plain decimals."""
    if isinstance(value, float):
        return json.loads(format(decimal.Decimal(repr(value)), "f"))
    if isinstance(value, list):
        return [as_jsonb_gives_it_back(item) for item in value]
    if isinstance(value, dict):
        return {key: as_jsonb_gives_it_back(item) for key, item in value.items()}
    return value


@pytest.mark.slow
@hypothesis_settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=JSON_VALUES, latency_ms=st.none() | st.floats(min_value=0, max_value=1e6) | st.integers(0, 10**6))
def test_any_json_value_hashes_the_same_as_written_and_as_read_back_from_either_database(
    value: Any, latency_ms: float | None
) -> None:
    written = forge(1, GENESIS_HASH, args={"v": value}, result=value, latency_ms=latency_ms)
    from_sqlite = {**json.loads(json.dumps({**written, "created_at": None})), "created_at": written["created_at"]}
    from_postgres = {
        **written,
        "args": as_jsonb_gives_it_back(written["args"]),
        "result": as_jsonb_gives_it_back(value),
        "latency_ms": None if latency_ms is None else float(latency_ms),
    }

    assert event_hash(from_sqlite) == written["hash"]
    assert event_hash(from_postgres) == written["hash"]


def test_values_that_json_stores_as_text_hash_as_the_stored_text() -> None:
    event = audit_event_record(
        source="admin",
        args={"when": dt.datetime(2026, 5, 1, 9, 30, tzinfo=dt.UTC), "amount": decimal.Decimal("12.50"), "n": 1e20},
        result={"id": uuid.UUID(int=1), "이름": "김하늘"},
        latency_ms=2,
    )

    row = stored(event.seq)
    assert row["args"] == {"when": "2026-05-01T09:30:00Z", "amount": "12.50", "n": 1e20}
    assert row["result"] == {"id": "00000000-0000-0000-0000-000000000001", "이름": "김하늘"}
    assert event_hash(row) == event.hash == row["hash"]
    assert verify().startswith("verified 1 events")


def test_masking_and_truncation_happen_before_the_hash(settings: Any) -> None:
    settings.PLATFORM_AUDIT_RESULT_MAX_CHARS = 50
    event = audit_event_record(
        source="agent", args={"api_key": "sk-live-abcdefgh12345678", "q": "x"}, result="y" * 500, secrets=["x" * 8]
    )

    row = stored(event.seq)
    assert row["args"] == {"api_key": "***", "q": "x"}
    assert row["result"]["truncated"] is True
    assert "sk-live" not in json.dumps(row, default=str)
    assert event_hash(row) == event.hash


@pytest.mark.parametrize(
    "result",
    [
        "y" * 48,  # its JSON text exactly at the limit (50 with the quotes): kept
        "y" * 49,  # one character over: truncated
        {"n": 4.0, "m": [1e20, -0.0, 2.5]},  # integral floats: stored as floats, hashed as integers
        {"when": dt.datetime(2026, 5, 1, 9, 30, tzinfo=dt.UTC), "p": "z" * 8},  # a date: JSON has no type for it
        {"when": dt.date(2026, 5, 1), "p": "z" * 40},  # over the limit only with the date's text
        [decimal.Decimal("1.50")] * 3,
    ],
)
def test_a_result_is_stored_as_truncate_makes_it_and_returned_as_read_back(settings: Any, result: Any) -> None:
    settings.PLATFORM_AUDIT_RESULT_MAX_CHARS = 50
    expected = json.loads(UnicodeJSONEncoder().encode(truncate(mask_value(result), max_chars=50)))

    event = audit_event_record(source="agent", args={"n": 4.0}, result=result)

    row = stored(event.seq)
    assert row["result"] == event.result == expected
    assert row["args"] == event.args == {"n": 4.0} and type(event.args["n"]) is float
    assert json.dumps(event.result) == json.dumps(expected)  # floats stay floats (4.0, not 4)
    assert event_hash(row) == event.hash


@pytest.mark.parametrize(
    "result",
    [
        None,
        "y" * 49,  # truncated
        {"n": 4.0, "m": [1e20, -0.0, 2.5, 10**30], "팀": "클라우드운영팀 \u2028 \x00 \U0001f600"},
        {"when": dt.datetime(2026, 5, 1, 9, 30, tzinfo=dt.UTC), "d": [decimal.Decimal("1.50")], "u": uuid.UUID(int=7)},
    ],
)
def test_the_stored_json_text_is_what_the_field_writes_of_the_value_read_back(settings: Any, result: Any) -> None:
    """Inline on SQLite the JSON fields store the text the event was masked and measured as: byte for byte what
    the field itself writes of the value it gives back (so a row written either way is the same row)."""
    settings.PLATFORM_AUDIT_RESULT_MAX_CHARS = 200
    one = audit_event_record(source="agent", args={"q": "김하늘", "n": 1.0}, result=result)
    (many, _other) = audit_events_record(
        [{"source": "agent", "args": {"q": "김하늘", "n": 1.0}, "result": result}, {"source": "admin"}]
    )
    for event in (one, many):
        with connection.cursor() as cursor:
            cursor.execute("SELECT args, result FROM audit_auditevent WHERE seq = %s", [event.seq])
            texts = cursor.fetchone()
        row = stored(event.seq)
        field = {name: AuditEvent._meta.get_field(name) for name in ("args", "result")}
        for name, text in zip(("args", "result"), texts, strict=True):
            assert text == field[name].get_db_prep_save(row[name], connection), name
        assert event_hash(row) == event.hash


def test_the_orm_refuses_to_change_or_delete_an_event() -> None:
    (event,) = record(1)

    with pytest.raises(PermissionError):
        event.save()
    with pytest.raises(PermissionError):
        event.delete()
    with pytest.raises(PermissionError):
        AuditEvent.objects.filter(pk=event.pk).update(tool="x")
    with pytest.raises(PermissionError):
        AuditEvent.objects.all().delete()


def test_an_audit_write_rolled_back_with_its_transaction_gives_its_seq_back() -> None:
    from django.db import transaction

    record(2)
    with pytest.raises(RuntimeError), transaction.atomic():
        record(1)
        raise RuntimeError("the change this event recorded failed")
    (event,) = record(1)

    assert event.seq == 3
    assert verify().startswith("verified 3 events")


# --- verify_audit -------------------------------------------------------------------------------------------


def test_an_intact_chain_verifies_and_names_its_head() -> None:
    events = record(5)

    assert verify() == f"verified 5 events, head {events[-1].hash}"


def test_an_empty_record_verifies() -> None:
    assert verify() == f"verified 0 events, head {GENESIS_HASH}"


def test_a_field_edited_in_the_database_is_named_as_the_first_altered_event() -> None:
    events = record(6)
    sql("UPDATE audit_auditevent SET ok = 0 WHERE seq = 5")
    sql("UPDATE audit_auditevent SET args = %s WHERE seq = 3", [json.dumps({"i": 99})])

    assert verify() == f"FAILED: event seq 3 (id {events[2].pk}): hash mismatch — altered"


def test_a_deleted_row_is_named_as_removed() -> None:
    events = record(6)
    sql("DELETE FROM audit_auditevent WHERE id = %s", [events[3].pk])

    assert verify() == "FAILED: seq 4 missing — removed"


def test_the_first_rows_deleted_are_named_as_removed() -> None:
    events = record(4)
    sql("DELETE FROM audit_auditevent WHERE id IN (%s, %s)", [events[0].pk, events[1].pk])

    assert verify() == "FAILED: seq 1 to 2 missing — removed"


def test_a_forged_row_after_the_head_is_named_as_inserted() -> None:
    events = record(3)
    forged_id = insert_raw(forge(4, events[-1].hash))

    assert verify() == f"FAILED: event seq 4 (id {forged_id}): after the chain head (seq 3) — inserted"


def test_a_forged_row_before_the_first_event_is_named_as_inserted() -> None:
    record(3)
    forged_id = insert_raw(forge(0, GENESIS_HASH))

    assert verify() == (f"FAILED: event seq 0 (id {forged_id}): out of place, the chain continues at seq 1 — inserted")


def test_an_event_replaced_with_a_recomputed_hash_breaks_the_link_of_the_next_one() -> None:
    events = record(5)
    replacement = forge(3, events[1].prev_hash)  # links to the wrong event: the intruder guessed
    sql(
        "UPDATE audit_auditevent SET actor = %s, prev_hash = %s, hash = %s WHERE seq = 3",
        [
            "intruder",
            replacement["prev_hash"],
            event_hash({**stored(3), "actor": "intruder", "prev_hash": replacement["prev_hash"]}),
        ],
    )

    assert verify() == (
        f"FAILED: event seq 3 (id {events[2].pk}): prev_hash is not the hash of seq 2 — chain broken "
        "(the event before it was replaced, or this one was altered and rehashed)"
    )


def test_a_self_consistent_rewrite_in_the_middle_is_forged_without_the_key_and_breaks_the_next_link_with_it() -> None:
    events = record(5)
    rewritten = event_hash({**stored(3), "actor": "intruder"})
    sql("UPDATE audit_auditevent SET actor = 'intruder', hash = %s WHERE seq = 3", [rewritten])

    assert verify() == (
        f"FAILED: event seq 3 (id {events[2].pk}): MAC mismatch — forged (written or rewritten without the chain key)"
    )
    sql("UPDATE audit_auditevent SET mac = %s WHERE seq = 3", [insider_mac("event", rewritten)])
    assert verify() == (
        f"FAILED: event seq 4 (id {events[3].pk}): prev_hash is not the hash of seq 3 — chain broken "
        "(the event before it was replaced, or this one was altered and rehashed)"
    )


def test_deleting_the_last_rows_is_named_as_a_truncated_tail() -> None:
    events = record(10)
    sql("DELETE FROM audit_auditevent WHERE seq > 7")

    assert verify() == "FAILED: tail truncated: head says seq 10, last event is 7"
    sql("DELETE FROM audit_auditevent")
    assert verify() == "FAILED: tail truncated: head says seq 10, no event after seq 0"
    assert events


def test_rewriting_the_last_event_is_forged_without_the_key_and_caught_by_the_chain_head_with_it() -> None:
    events = record(4)
    rewritten = event_hash({**stored(4), "actor": "intruder"})
    sql("UPDATE audit_auditevent SET actor = 'intruder', hash = %s WHERE seq = 4", [rewritten])

    assert verify() == (
        f"FAILED: event seq 4 (id {events[-1].pk}): MAC mismatch — forged (written or rewritten without the chain key)"
    )
    sql("UPDATE audit_auditevent SET mac = %s WHERE seq = 4", [insider_mac("event", rewritten)])
    assert verify() == f"FAILED: event seq 4 (id {events[-1].pk}): hash differs from the chain head's — replaced"


def test_a_removed_chain_head_is_reported() -> None:
    record(2)
    sql("DELETE FROM audit_auditchainhead")

    assert verify() == "FAILED: chain head missing: the audit chain head row was removed"


def test_a_missing_head_row_is_never_rebuilt_and_the_next_append_fails_as_a_database_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    record(3)
    sql("DELETE FROM audit_auditchainhead")

    with pytest.raises(AuditChainHeadMissing) as refused, transaction.atomic():
        record(1)

    assert isinstance(refused.value, DatabaseError)  # the run engine lets database errors propagate
    assert "audit append refused: the audit chain head is missing" in caplog.text
    assert AuditEvent.objects.count() == 3
    assert not AuditChainHead.objects.exists()
    assert verify() == "FAILED: chain head missing: the audit chain head row was removed"


def test_a_head_moved_without_the_key_refuses_the_next_append() -> None:
    events = record(3)
    sql("UPDATE audit_auditchainhead SET seq = 2, hash = %s", [events[1].hash])

    with (
        pytest.raises(AuditChainHeadForged, match=r"the audit chain head \(seq 2\) has MAC mismatch"),
        transaction.atomic(),
    ):
        record(1)


@pytest.mark.parametrize("mode", ["inline", "deferred"])
def test_a_head_just_verified_is_refused_under_a_keyring_without_its_key(settings: Any, mode: str) -> None:
    """An append skips the head's HMAC when the head row is the very one the same keyring verified or signed last
    (deferred, appends read the head without moving it; inline, each reads the head the last one moved): under
    another keyring (its key rotated out) the same row is checked again, and refused."""
    settings.AUDIT_CHAIN_MODE = mode
    signing = [*settings.AUDIT_CHAIN_KEY] or [Path(settings.AUDIT_CHAIN_KEY_FILE).read_text(encoding="utf-8").strip()]
    record(2)
    audit_event_record(source="agent", tool="head-known")  # the head as it is now: the row this keyring knows
    seq = AuditChainHead.objects.get().seq

    settings.AUDIT_CHAIN_KEY = ["b" * 40]  # the key dropped: nothing it signed is trusted any more
    with (
        pytest.raises(
            AuditChainHeadForged, match=rf"the audit chain head \(seq {seq}\) has MAC by key [0-9a-f]{{8}}, which"
        ),
        transaction.atomic(),
    ):
        audit_event_record(source="agent", tool="refused")

    settings.AUDIT_CHAIN_KEY = ["b" * 40, *signing]  # rotated: signs with the new key, still checks the old
    audit_event_record(source="agent", tool="accepted")
    if mode == "deferred":
        assert audit_chain_pending() == 2
    assert list(AuditEvent.objects.order_by("-seq").values_list("tool", flat=True)[:2]) == ["accepted", "head-known"]


def test_events_appended_while_verifying_are_not_taken_for_forgeries(monkeypatch: pytest.MonkeyPatch) -> None:
    record(3)
    walk = audit.verification._events_checked

    def walk_while_others_append(**options: Any) -> Any:
        record(2)  # after verify_audit read the head (seq 3), before it reads the events
        return walk(**options)

    monkeypatch.setattr(audit.verification, "_events_checked", walk_while_others_append)

    assert verify().startswith("verified 5 events, head ")


def test_progress_is_printed_on_long_chains() -> None:
    record(5)
    err = io.StringIO()

    call_command("verify_audit", "--progress-every", "2", stdout=io.StringIO(), stderr=err)

    assert err.getvalue().split() == ["2", "events", "verified…", "4", "events", "verified…"]


def test_a_signed_checkpoint_file_catches_a_tail_cut_off_together_with_the_head(tmp_path: Path) -> None:
    events = record(6)
    checkpoint = tmp_path / "audit-head.json"
    assert verify("--checkpoint-file", str(checkpoint)).startswith("verified 6 events")
    assert json.loads(checkpoint.read_text())["seq"] == 6

    # An insider who can write the database and holds the key removes the tail and moves the head back to match.
    sql("DELETE FROM audit_auditevent WHERE seq > 4")
    sql("UPDATE audit_auditchainhead SET seq = 4, hash = %s", [events[3].hash])
    assert verify() == "FAILED: chain head (seq 4): MAC mismatch — forged (moved without the chain key)"
    sql("UPDATE audit_auditchainhead SET mac = %s", [insider_mac("head", head_message(4, events[3].hash))])

    assert verify().startswith("verified 4 events")  # the database alone cannot tell
    assert verify("--checkpoint-file", str(checkpoint)) == (
        "FAILED: tail truncated: signed checkpoint file says seq 6, last event is 4"
    )


def test_a_forged_checkpoint_file_is_refused(tmp_path: Path) -> None:
    record(3)
    checkpoint = tmp_path / "audit-head.json"
    verify("--checkpoint-file", str(checkpoint))
    document = json.loads(checkpoint.read_text())
    checkpoint.write_text(json.dumps({**document, "seq": 2}))

    assert verify("--checkpoint-file", str(checkpoint)) == (
        f"FAILED: checkpoint file {checkpoint}: unreadable or bad signature — forged or altered"
    )


def test_a_signed_checkpoint_file_catches_its_event_rewritten_with_the_rest_of_the_chain(tmp_path: Path) -> None:
    record(3)
    checkpoint = tmp_path / "audit-head.json"
    verify("--checkpoint-file", str(checkpoint))
    record(2)
    # An insider with the key rewrites seq 3 and everything after it consistently, MACs and head included.
    prev = stored(2)["hash"]
    for seq in (3, 4, 5):
        rewritten = {**stored(seq), "actor": "intruder", "prev_hash": prev}
        prev = event_hash(rewritten)
        sql(
            "UPDATE audit_auditevent SET actor = 'intruder', prev_hash = %s, hash = %s, mac = %s WHERE seq = %s",
            [rewritten["prev_hash"], prev, insider_mac("event", prev), seq],
        )
    sql("UPDATE audit_auditchainhead SET hash = %s, mac = %s", [prev, insider_mac("head", head_message(5, prev))])

    assert verify().startswith("verified 5 events")
    assert verify("--checkpoint-file", str(checkpoint)) == (
        f"FAILED: event seq 3 (id {stored(3)['id']}): hash differs from the signed checkpoint file's — replaced"
    )


# --- several writers at once ---------------------------------------------------------------------------------

# Four processes on two cores, released at once: they overlap from their first appends (the interleaving is
# asserted), so 100 events each (400 in all) show a lost, doubled or reordered seq as well as more would; most
# of a writer test's time is the processes starting.
WRITERS = 4
EVENTS_PER_WRITER = 100

WRITER_CODE = """
import pathlib, time
from audit.masking import mask_value
from audit.models import AuditChainHead
from audit.services import (
    AuditChainHeadForged,
    AuditChainHeadMissing,
    audit_chain_pending,
    audit_event_record,
    chain_mode,
)
AuditChainHead.objects.exists(), mask_value({{"warm": "up"}})  # connected and warm before the start
pathlib.Path({ready!r}).touch()
go = pathlib.Path({go!r})
while not go.exists():
    time.sleep(0.002)
for i in range({count}):
    audit_event_record(source="agent", mcp_id="demo", tool={tool!r}, call_id="{name}:%d" % i, args={{"i": i}})
"""


def run_writers(tmp_path: Path, *, tool: str = "writer", **database: str) -> list[str]:
    """Start the writer processes, release them at once, wait; returns their names. Their events are ``tool``'s
    (on the session's PostgreSQL database, a name of the test's own tells them from other tests' writers)."""
    names = [f"w{n}" for n in range(WRITERS)]
    processes = []
    for name in names:
        code = WRITER_CODE.format(
            ready=str(tmp_path / f"{name}.ready"),
            go=str(tmp_path / "go"),
            count=EVENTS_PER_WRITER,
            name=name,
            tool=tool,
        )
        processes.append(manage_popen("shell", "-c", code, **database))
    deadline = time.monotonic() + 120
    while not all((tmp_path / f"{name}.ready").exists() for name in names):
        assert all(p.poll() is None for p in processes), [p.communicate() for p in processes]
        assert time.monotonic() < deadline, "the writers did not start"
        time.sleep(0.05)
    (tmp_path / "go").touch()
    for process in processes:
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, out + err
    return names


def assert_interleaved_and_gap_free(call_ids_in_seq_order: list[str], seqs: list[int]) -> None:
    assert len(call_ids_in_seq_order) == WRITERS * EVENTS_PER_WRITER
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    writers = [call_id.split(":")[0] for call_id in call_ids_in_seq_order]
    switches = sum(1 for a, b in itertools.pairwise(writers) if a != b)
    assert switches >= WRITERS, f"the writers never overlapped ({switches} switches): the test proved nothing"
    for name in set(writers):  # each writer's own events in its order
        own = [int(call_id.split(":")[1]) for call_id in call_ids_in_seq_order if call_id.startswith(f"{name}:")]
        assert own == list(range(EVENTS_PER_WRITER))


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_writer_processes_appending_at_once_keep_the_sqlite_chain_gap_free(tmp_path: Path) -> None:
    record(2)

    run_writers(tmp_path, sqlite_path=connection.settings_dict["NAME"])

    assert verify().startswith(f"verified {2 + WRITERS * EVENTS_PER_WRITER} events")
    rows = list(AuditEvent.objects.filter(tool="writer").order_by("seq").values_list("seq", "call_id"))
    assert_interleaved_and_gap_free([call_id for _, call_id in rows], [seq for seq, _ in rows])
    assert AuditChainHead.objects.get().seq == 2 + WRITERS * EVENTS_PER_WRITER


# Two lines: the chain mode and the number of events the writers left pending (chain_lag), as they left them; then
# the events of ``tool``, chained, as JSON [[seq, call_id], ...] in seq order.
READ_WRITER_EVENTS = """
import json
from audit.models import AuditEvent
from audit.services import audit_chain_pending, chain_lag, chain_mode
print(chain_mode(), chain_lag().count)
audit_chain_pending(wait=True, rounds=None)  # a writer that exited before its chainer finished left rows pending
print(json.dumps(list(AuditEvent.objects.filter(tool={tool!r}).order_by("seq").values_list("seq", "call_id"))))
"""


@pytest.mark.postgres
def test_writer_processes_appending_at_once_keep_the_postgres_chain_gap_free(
    postgres_url: str,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    tool = f"writer-{uuid.uuid4().hex[:8]}"  # the session's database: other tests' writers too

    run_writers(tmp_path, tool=tool, database_url=postgres_url)

    verified = manage("verify_audit", "--workers", "0", database_url=postgres_url)
    assert verified.returncode == 0, verified.stderr
    assert verified.stdout.strip().splitlines()[-1].startswith("verified ")
    # In segments, by worker processes on connections of their own: the same head (tests/audit/test_verify_parallel.py).
    in_segments = manage("verify_audit", "--workers", "2", "--chunk-size", "2", database_url=postgres_url)
    assert in_segments.returncode == 0, in_segments.stderr
    assert in_segments.stdout.strip().splitlines()[-1] == verified.stdout.strip().splitlines()[-1]
    assert "events verified in 2 worker processes" in in_segments.stdout
    read = manage("shell", "-c", READ_WRITER_EVENTS.format(tool=tool), database_url=postgres_url)
    rows = json.loads(read.stdout.splitlines()[-1])
    assert_interleaved_and_gap_free([call_id for _, call_id in rows], [seq for seq, _ in rows])


TRY_TO_TAMPER = """
import json
from django.db import connection, transaction
from audit.models import AuditEvent
from audit.services import audit_chain_catch_up, audit_event_record
audit_event_record(source="admin", tool="victim")
# PostgreSQL chains events after commit: the event is in the table before anyone tries it (a row-level refusal
# needs a row: on an empty table an UPDATE or DELETE changes nothing, and was taken for "allowed").
audit_chain_catch_up()
assert AuditEvent.objects.filter(tool="victim").exists()
outcome = {}
for statement in ["UPDATE audit_auditevent SET tool = 'x'", "DELETE FROM audit_auditevent", "TRUNCATE audit_auditevent CASCADE"]:
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(statement)
        outcome[statement.split()[0]] = "allowed"
    except Exception as exc:
        outcome[statement.split()[0]] = str(exc).splitlines()[0]
print(json.dumps(outcome))
"""


@pytest.mark.postgres
def test_postgres_refuses_to_update_delete_or_truncate_audit_events(postgres_url: str) -> None:  # noqa: F811
    tried = manage("shell", "-c", TRY_TO_TAMPER, database_url=postgres_url)

    assert tried.returncode == 0, tried.stderr
    assert json.loads(tried.stdout.strip().splitlines()[-1]) == {
        "UPDATE": "audit events are append-only: UPDATE refused",
        "DELETE": "audit events are append-only: DELETE refused",
        "TRUNCATE": "audit events are append-only: TRUNCATE refused",
    }
    verified = manage("verify_audit", database_url=postgres_url)
    assert verified.returncode == 0, verified.stderr


TRY_TO_MOVE_THE_HEAD = """
import json
from django.db import connection, transaction
from audit.services import audit_event_record
audit_event_record(source="admin", tool="victim")
outcome = {}
for name, statement in [
    ("back", "UPDATE audit_auditchainhead SET seq = seq - 1"),
    ("nowhere", "UPDATE audit_auditchainhead SET seq = seq + 1"),
    ("delete", "DELETE FROM audit_auditchainhead"),
    ("truncate", "TRUNCATE audit_auditchainhead"),
]:
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(statement)
        outcome[name] = "allowed"
    except Exception as exc:
        outcome[name] = str(exc).splitlines()[0]
print(json.dumps(outcome))
"""


@pytest.mark.postgres
def test_postgres_refuses_to_move_the_head_anywhere_but_onto_an_appended_event(postgres_url: str) -> None:  # noqa: F811
    tried = manage("shell", "-c", TRY_TO_MOVE_THE_HEAD, database_url=postgres_url)

    assert tried.returncode == 0, tried.stderr
    moved = "the audit chain head only moves forward, onto an appended event: UPDATE refused"
    assert json.loads(tried.stdout.strip().splitlines()[-1]) == {
        "back": moved,
        "nowhere": moved,
        "delete": "the audit chain head is never deleted: DELETE refused",
        "truncate": "the audit chain head is never deleted: TRUNCATE refused",
    }


WRITE_EVENTS_AS_BEFORE_THE_MAC = """
from django.db import connection
from django.utils import timezone
from audit.chain import GENESIS_HASH, event_hash
prev, rows = GENESIS_HASH, []
for seq in (1, 2, 3):
    event = {"seq": seq, "prev_hash": prev, "created_at": timezone.now(), "run_id": None, "source": "agent",
             "action": "tool.call", "mcp_id": "demo", "tool": "old", "call_id": "", "args": {}, "result": None,
             "ok": True, "reason": "", "attempt": 1, "latency_ms": None, "actor": ""}
    prev = event_hash(event)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO audit_auditevent (seq, prev_hash, hash, created_at, source, action, mcp_id, tool, call_id,"
            " args, ok, reason, attempt, actor) VALUES (%s, %s, %s, %s, 'agent', 'tool.call', 'demo', 'old', '',"
            " '{}', 1, '', 1, '')", [seq, event["prev_hash"], prev, str(event["created_at"].replace(tzinfo=None))])
with connection.cursor() as cursor:
    cursor.execute("UPDATE audit_auditchainhead SET seq = 3, hash = %s WHERE id = 1", [prev])
"""


@pytest.mark.slow
def test_migrating_a_chain_written_before_macs_macs_it_and_it_verifies(tmp_path: Path) -> None:
    database = str(tmp_path / "old.sqlite3")
    assert manage("migrate", "audit", "0006", "--noinput", sqlite_path=database).returncode == 0
    written = manage("shell", "-c", WRITE_EVENTS_AS_BEFORE_THE_MAC, sqlite_path=database)
    assert written.returncode == 0, written.stderr

    migrated = manage("migrate", "--noinput", sqlite_path=database)

    assert migrated.returncode == 0, migrated.stderr
    verified = manage("verify_audit", sqlite_path=database)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert verified.stdout.strip().splitlines()[-1].startswith("verified 3 events, head ")


# --- several events at once (audit_events_record) ---------------------------------------------------------------


def test_events_appended_together_are_linked_in_order_exactly_as_one_by_one() -> None:
    before = record(2)
    batch = audit_events_record(
        [
            {
                "source": "agent",
                "action": "rule.decision",
                "args": {"i": i, "password": "hunter2-secret"},
                "run_id": None,
            }
            for i in range(5)
        ]
    )
    after = record(1)
    events = list(AuditEvent.objects.order_by("seq"))
    assert [e.seq for e in events] == list(range(1, 9))
    assert [e.pk for e in events[2:7]] == [e.pk for e in batch]
    assert [e.args["i"] for e in events[2:7]] == [0, 1, 2, 3, 4]
    assert all(e.args["password"] == "***" for e in events[2:7])  # masked as one by one
    for previous, event in itertools.pairwise(events):
        assert event.prev_hash == previous.hash
    assert events[-1].pk == after[0].pk and events[0].pk == before[0].pk
    head = AuditChainHead.objects.get()
    assert (head.seq, head.hash) == (8, events[-1].hash)
    assert verify() == f"verified 8 events, head {events[-1].hash}"


def test_events_appended_together_are_all_recorded_or_none() -> None:
    record(2)
    head_before = AuditChainHead.objects.get()
    with pytest.raises(DatabaseError), transaction.atomic():
        audit_events_record([{"source": "agent", "args": {"i": i}} for i in range(3)])
        raise DatabaseError("the caller's transaction fails after the append")
    assert AuditEvent.objects.count() == 2
    assert AuditChainHead.objects.get().seq == head_before.seq
    assert verify() == f"verified 2 events, head {head_before.hash}"


def test_a_head_moved_without_the_key_refuses_events_appended_together() -> None:
    events = record(3)
    sql("UPDATE audit_auditchainhead SET seq = 2, hash = %s", [events[1].hash])
    with pytest.raises(AuditChainHeadForged), transaction.atomic():
        audit_events_record([{"source": "agent", "args": {"i": i}} for i in range(3)])
    assert AuditEvent.objects.count() == 3


def test_events_appended_together_refuse_an_unknown_argument_before_writing_any() -> None:
    with pytest.raises(TypeError, match="unknown arguments"):
        audit_events_record([{"source": "agent"}, {"source": "agent", "secretz": ["x"]}])
    assert AuditEvent.objects.count() == 0


RECORD_UNSTORABLE_TEXT = """
import json
from audit.services import audit_chain_pending, audit_event_record
audit_event_record(
    source="agent", tool="garbled", args={"q\\x00": "a\\x00b"}, result={"text": "x\\ud800y", "note": ["\\x00"]}, ok=True
)
audit_chain_pending(wait=True)
from audit.models import AuditEvent
row = AuditEvent.objects.filter(tool="garbled").order_by("-seq").first()
print(json.dumps([row.args, row.result]))
"""


@pytest.mark.postgres
def test_postgres_stores_an_event_whose_text_held_nul_or_an_unpaired_surrogate(postgres_url: str) -> None:  # noqa: F811
    recorded = manage("shell", "-c", RECORD_UNSTORABLE_TEXT, database_url=postgres_url)

    assert recorded.returncode == 0, recorded.stderr[-2000:]
    assert json.loads(recorded.stdout.strip().splitlines()[-1]) == [
        {"q\ufffd": "a\ufffdb"},
        {"text": "x\ufffdy", "note": ["\ufffd"]},
    ]
    verified = manage("verify_audit", database_url=postgres_url)
    assert verified.returncode == 0, verified.stderr
