"""``verify_audit --workers N``: the events' hashes and MACs recomputed in worker processes give the same verdict,
word for word, as the verifier alone, for an intact chain and for every kind of break it names."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from audit.chain import GENESIS_HASH, event_check
from audit.chain_keys import chain_keyring
from audit.models import AuditEvent
from tests.audit.test_chain import forge, insert_raw, insider_mac, record, sql, stored, verify

pytestmark = pytest.mark.django_db


def edited(events: list[AuditEvent]) -> None:
    sql("UPDATE audit_auditevent SET actor = 'intruder' WHERE seq = 3")


def deleted(events: list[AuditEvent]) -> None:
    sql("DELETE FROM audit_auditevent WHERE seq = 4")


def rehashed_without_key(events: list[AuditEvent]) -> None:
    digest = _hash_of({**stored(5), "actor": "intruder"})
    sql("UPDATE audit_auditevent SET actor = 'intruder', hash = %s WHERE seq = 5", [digest])


def rehashed_with_key(events: list[AuditEvent]) -> None:
    row = {**stored(2), "actor": "intruder"}
    digest = _hash_of(row)
    sql(
        "UPDATE audit_auditevent SET actor = 'intruder', hash = %s, mac = %s WHERE seq = 2",
        [digest, insider_mac("event", digest)],
    )


def unreadable(events: list[AuditEvent]) -> None:
    sql("UPDATE audit_auditevent SET created_at = 'not a time' WHERE seq = 6")


def inserted_after_head(events: list[AuditEvent]) -> None:
    insert_raw(forge(len(events) + 1, events[-1].hash))


def _hash_of(row: dict[str, Any]) -> str:
    from audit.chain import event_hash

    return event_hash(row)


TAMPERING: dict[str, Callable[[list[AuditEvent]], None]] = {
    "intact": lambda events: None,
    "altered": edited,
    "removed": deleted,
    "forged": rehashed_without_key,
    "broken": rehashed_with_key,
    "unreadable": unreadable,
    "inserted": inserted_after_head,
}


@pytest.mark.parametrize("kind", list(TAMPERING))
def test_worker_processes_give_the_verdict_of_the_verifier_alone(kind: str) -> None:
    events = record(8, result={"팀": "클라우드운영팀", "level": 3.5, "이름": "김하늘"})
    TAMPERING[kind](events)

    alone = verify("--workers", "0")
    in_workers = verify("--workers", "2", "--chunk-size", "3")  # several chunks in flight, in order

    assert in_workers == alone
    if kind == "intact":
        assert alone == f"verified 8 events, head {events[-1].hash}"
    else:
        assert alone.startswith("FAILED: "), alone


def test_an_event_check_is_its_hash_and_whether_its_mac_verifies() -> None:
    (event,) = record(1)
    row = stored(1)
    keyring = chain_keyring()

    assert event_check(row, keyring) == (event.hash, None, None)
    assert event_check({**row, "mac": ""}, keyring) == (event.hash, None, "no MAC")
    assert event_check({**row, "prev_hash": GENESIS_HASH + "0"}, None)[0] != event.hash
    recomputed, why, mac_why = event_check({**row, "created_at": "not a time"}, keyring)
    assert (recomputed, mac_why) == (None, None)
    assert "not a time" in str(why)
