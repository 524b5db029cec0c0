"""The README's table of what is detected, one test per row: each attack made by someone who can write the database
(SQLite's triggers dropped first), then again by an insider who also holds the chain key (who re-MACs what they
rewrite). Anchors are written with ``audit_anchor`` as the workers' timer would.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from audit.anchors import audit_chain_anchor
from audit.archive import audit_events_archive
from audit.chain import GENESIS_HASH, anchor_message, checkpoint_message, event_hash, head_message
from audit.models import AuditChainHead, AuditEvent
from audit.services import AuditChainHeadMissing, audit_chain_head_create_if_fresh, audit_chain_pending
from tests.audit.test_chain import forge, insert_raw, insider_mac, record, sql, stored, verify

pytestmark = pytest.mark.django_db

FORGED = "forged (written or rewritten without the chain key)"


@pytest.fixture(autouse=True, params=["inline", "deferred"])
def chain_mode(request: pytest.FixtureRequest, settings: Any) -> str:
    """Every row of the table holds whichever way events join the chain (``audit.services``)."""
    settings.AUDIT_CHAIN_MODE = request.param
    return str(request.param)


def rehash_from(seq: int, *, key: bool) -> str:
    """Rewrite every event from ``seq`` on (actor changed), with consistent hashes and head; re-MAC'd with the
    key if ``key``. Returns the new last hash."""
    prev = stored(seq - 1)["hash"] if seq > 1 else GENESIS_HASH
    last = AuditEvent.objects.order_by("-seq").values_list("seq", flat=True).first()
    for current in range(seq, last + 1):
        row = {**stored(current), "actor": "intruder", "prev_hash": prev}
        prev = event_hash(row)
        mac = insider_mac("event", prev) if key else row["mac"]
        sql(
            "UPDATE audit_auditevent SET actor = 'intruder', prev_hash = %s, hash = %s, mac = %s WHERE seq = %s",
            [row["prev_hash"], prev, mac, current],
        )
    move_head(last, prev, key=key)
    return prev


def move_head(seq: int, hash_hex: str, *, key: bool) -> None:
    """Set the head; re-MAC'd with the key if ``key``, else its old MAC stays (no other can be made)."""
    if key:
        mac = insider_mac("head", head_message(seq, hash_hex))
        sql("UPDATE audit_auditchainhead SET seq = %s, hash = %s, mac = %s", [seq, hash_hex, mac])
    else:
        sql("UPDATE audit_auditchainhead SET seq = %s, hash = %s", [seq, hash_hex])


def test_an_edited_field_is_named_as_altered_with_or_without_the_key() -> None:
    events = record(5)
    sql("UPDATE audit_auditevent SET actor = 'intruder' WHERE seq = 3")

    assert verify() == f"FAILED: event seq 3 (id {events[2].pk}): hash mismatch — altered"
    sql("UPDATE audit_auditevent SET mac = %s WHERE seq = 3", [insider_mac("event", events[2].hash)])
    assert verify() == f"FAILED: event seq 3 (id {events[2].pk}): hash mismatch — altered"


def test_a_deleted_middle_event_is_named_as_removed_with_or_without_the_key() -> None:
    record(5)
    sql("DELETE FROM audit_auditevent WHERE seq = 3")

    assert verify() == "FAILED: seq 3 missing — removed"


def test_deleted_first_events_are_named_as_removed_with_or_without_the_key() -> None:
    record(5)
    sql("DELETE FROM audit_auditevent WHERE seq <= 2")

    assert verify() == "FAILED: seq 1 to 2 missing — removed"


def test_a_deleted_tail_is_caught_by_the_head_and_a_head_moved_back_by_its_mac_or_with_the_key_by_an_anchor() -> None:
    events = record(6)
    audit_chain_anchor()  # at seq 6
    sql("DELETE FROM audit_auditevent WHERE seq > 4")

    assert verify() == "FAILED: tail truncated: head says seq 6, last event is 4"
    move_head(4, events[3].hash, key=False)
    assert verify() == "FAILED: chain head (seq 4): MAC mismatch — forged (moved without the chain key)"
    move_head(4, events[3].hash, key=True)
    assert verify().startswith("FAILED: tail truncated: the anchor of ")
    assert verify().endswith(" says seq 6, last event is 4")


def test_a_tail_cut_after_the_latest_anchor_with_the_key_is_not_detected() -> None:
    events = record(6)
    audit_chain_anchor()
    record(2)
    sql("DELETE FROM audit_auditevent WHERE seq > 6")
    move_head(6, events[-1].hash, key=True)

    assert verify().startswith("verified 6 events")  # the window between anchors


def test_a_truncated_table_is_caught_by_the_head_and_with_the_key_by_the_anchors() -> None:
    record(4)
    audit_chain_anchor()
    sql("DELETE FROM audit_auditevent")

    assert verify() == "FAILED: tail truncated: head says seq 4, no event after seq 0"
    sql("DELETE FROM audit_auditchainhead")
    sql(
        "INSERT INTO audit_auditchainhead (id, seq, hash, mac) VALUES (1, 0, %s, %s)",
        [GENESIS_HASH, insider_mac("head", head_message(0, GENESIS_HASH))],
    )
    assert verify().startswith("FAILED: tail truncated: the anchor of ")
    assert verify().endswith(" says seq 4, no event after seq 0")


def test_a_deleted_head_is_reported_and_never_rebuilt_with_or_without_the_key() -> None:
    record(3)
    sql("DELETE FROM audit_auditevent WHERE seq = 3")
    sql("DELETE FROM audit_auditchainhead")

    assert verify() == "FAILED: chain head missing: the audit chain head row was removed"
    with pytest.raises(AuditChainHeadMissing), transaction.atomic():
        record(1)
    assert verify() == "FAILED: chain head missing: the audit chain head row was removed"


def test_everything_deleted_is_reported_as_a_missing_head_and_with_a_fresh_head_by_the_anchors() -> None:
    record(3)
    audit_chain_anchor()
    sql("DELETE FROM audit_auditevent")
    sql("DELETE FROM audit_auditchainhead")

    assert verify() == "FAILED: chain head missing: the audit chain head row was removed"
    sql(
        "INSERT INTO audit_auditchainhead (id, seq, hash, mac) VALUES (1, 0, %s, %s)",
        [GENESIS_HASH, insider_mac("head", head_message(0, GENESIS_HASH))],
    )
    record(1)  # the platform writes on, from genesis
    assert verify().startswith("FAILED: tail truncated: the anchor of ")
    assert verify().endswith(" says seq 3, last event is 1")


def test_a_forged_insert_is_named_without_the_key_and_with_it_is_an_append_nobody_can_tell() -> None:
    events = record(3)
    forged = forge(4, events[-1].hash)
    forged_id = insert_raw(forged)

    assert verify() == f"FAILED: event seq 4 (id {forged_id}): after the chain head (seq 3) — inserted"
    move_head(4, forged["hash"], key=False)
    assert verify() == "FAILED: chain head (seq 4): MAC mismatch — forged (moved without the chain key)"
    move_head(4, forged["hash"], key=True)
    assert verify() == f"FAILED: event seq 4 (id {forged_id}): no MAC — {FORGED}"
    sql("UPDATE audit_auditevent SET mac = %s WHERE seq = 4", [insider_mac("event", forged["hash"])])
    assert verify().startswith("verified 4 events")


def test_a_rehashed_suffix_is_forged_without_the_key_and_with_it_caught_by_an_anchor_inside_it() -> None:
    events = record(6)
    audit_chain_anchor()  # at seq 6
    record(2)
    rehash_from(3, key=False)

    assert verify() == "FAILED: chain head (seq 8): MAC mismatch — forged (moved without the chain key)"
    move_head(8, stored(8)["hash"], key=True)  # the head alone re-MAC'd: the events still give it away
    assert verify() == f"FAILED: event seq 3 (id {events[2].pk}): MAC mismatch — {FORGED}"
    rehash_from(3, key=True)
    assert verify().startswith(f"FAILED: event seq 6 (id {events[5].pk}): hash differs from the anchor of ")
    assert verify().endswith("'s — replaced")


def test_a_suffix_rehashed_after_the_latest_anchor_with_the_key_is_not_detected() -> None:
    record(6)
    audit_chain_anchor()
    record(2)
    rehash_from(7, key=True)

    assert verify().startswith("verified 8 events")


def test_a_forged_checkpoint_is_named_without_the_key_and_with_it_by_its_missing_archive_file() -> None:
    record(8)
    sql("DELETE FROM audit_auditevent WHERE seq <= 4")
    sql(
        "INSERT INTO audit_auditcheckpoint (seq, hash, archived_at, file_name, count, mac) VALUES (4, %s, %s, %s, 4, %s)",
        [stored(5)["prev_hash"], timezone.now().isoformat(), "/nowhere/audit.jsonl.gz", ""],
    )

    assert verify() == "FAILED: archive checkpoint seq 4: no MAC — forged"
    mac = insider_mac("checkpoint", checkpoint_message(4, stored(5)["prev_hash"], 4))
    sql("UPDATE audit_auditcheckpoint SET mac = %s", [mac])
    assert verify() == (
        "FAILED: archive checkpoint seq 4: its archive file /nowhere/audit.jsonl.gz is missing "
        "(pass --archive-dir where the archives are kept)"
    )


def test_a_checkpoint_moved_to_hide_archived_events_with_the_key_is_caught_by_an_anchor_in_the_archive(
    tmp_path: Path,
) -> None:
    record(4)
    audit_chain_anchor()  # at seq 4
    record(4)
    report = audit_events_archive(older_than_days=0, output=tmp_path / "all.jsonl.gz")
    assert report.count == 8
    audit_chain_pending()  # deferred: the archive's own event joins the chain
    assert verify().startswith("verified 1 events")  # the archive's own event
    # The insider rewrites the archive file from seq 3 on and MACs everything anew, checkpoint included.
    lines = [json.loads(line) for line in _gunzip(report.path)]
    prev = lines[1]["hash"]
    for line in lines[2:-1]:
        line.update(actor="intruder", prev_hash=prev)
        line["hash"] = prev = event_hash({**line, "created_at": dt.datetime.fromisoformat(line["created_at"])})
        line["mac"] = insider_mac("event", prev)
    lines[-1] = {"checkpoint": {"seq": 8, "hash": prev}}
    _gzip(report.path, lines)
    sql(
        "UPDATE audit_auditcheckpoint SET hash = %s, mac = %s",
        [prev, insider_mac("checkpoint", checkpoint_message(8, prev, 8))],
    )
    sql("DELETE FROM audit_auditchainhead")
    sql(
        "INSERT INTO audit_auditchainhead (id, seq, hash, mac) VALUES (1, 8, %s, %s)",
        [prev, insider_mac("head", head_message(8, prev))],
    )

    said = verify()
    assert said.startswith(
        f"FAILED: archive {report.path}: event seq 4 (id {lines[3]['id']}): hash differs from the anchor of "
    )


def test_a_forged_anchor_is_refused_and_one_written_with_the_key_disagrees_with_the_genuine_one(
    anchor_file: Path,
) -> None:
    events = record(4)
    audit_chain_anchor()
    genuine = anchor_file.read_text()
    at = dt.datetime.now(dt.UTC).isoformat(timespec="microseconds")
    copied_mac = json.loads(genuine)["mac"]
    with anchor_file.open("a") as out:
        out.write(json.dumps({"seq": 2, "hash": events[1].hash, "at": at, "mac": copied_mac}) + "\n")

    assert verify() == f"FAILED: anchor file {anchor_file}: the anchor of {at} (seq 2) has MAC mismatch — forged"
    anchor_file.write_text(genuine)
    forged_hash = "f" * 64
    with anchor_file.open("a") as out:
        mac = insider_mac("anchor", anchor_message(4, forged_hash, at))
        out.write(json.dumps({"seq": 4, "hash": forged_hash, "at": at, "mac": mac}) + "\n")
    assert verify().endswith(f"and {at} disagree on seq 4 — the chain was rewritten between them")


def _gunzip(path: Path) -> list[str]:
    import gzip

    with gzip.open(path, "rt", encoding="utf-8") as lines:
        return list(lines)


def _gzip(path: Path, lines: list[dict[str, Any]]) -> None:
    import gzip

    with gzip.open(path, "wt", encoding="utf-8") as out:
        for line in lines:
            out.write(json.dumps(line, ensure_ascii=False) + "\n")


def test_the_head_row_comes_with_the_migrations_and_is_recreated_only_on_an_empty_record() -> None:
    head = AuditChainHead.objects.get()
    assert (head.seq, head.hash) == (0, GENESIS_HASH)
    record(2)
    sql("DELETE FROM audit_auditchainhead")

    assert audit_chain_head_create_if_fresh() is False
    sql("DELETE FROM audit_auditevent")
    assert audit_chain_head_create_if_fresh() is True
    assert verify() == f"verified 0 events, head {GENESIS_HASH}"
