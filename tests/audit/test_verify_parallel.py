"""``verify_audit --workers N``: the chain verified in segments by worker processes, each on a connection of its
own, the segments joined in order. An intact chain verifies to the same head as the verifier alone; a broken one
(anywhere: inside a segment, on either side of a join, at the tail) gets the verdict of the verifier alone, word for
word, because whatever does not verify or join is verified again in one process."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from audit.append_only import append_only_install
from audit.chain import GENESIS_HASH, ChainVerifier, event_check, event_hash
from audit.chain_keys import chain_keyring
from audit.models import AuditEvent
from audit.verification import _verify_workers
from tests.audit.test_chain import forge, insert_raw, insider_mac, record, sql, stored

EVENTS = 12
# --chunk-size 1: segments of 4 events, seq ≤ 4 (open below), 5 to 8, and 9 on (open above).
IN_SEGMENTS = ("--workers", "2", "--chunk-size", "1")
AGAIN = "the worker processes did not verify every segment: verified again in this one"


@pytest.fixture
def chain(transactional_db: Any) -> Iterator[list[AuditEvent]]:
    """A committed chain (the workers read it on connections of their own), its triggers put back after the
    tampering."""
    yield record(EVENTS, result={"팀": "클라우드운영팀", "level": 3.5, "n": 4.0, "이름": "김하늘"})
    if connection.vendor == "sqlite":
        append_only_install(connection)


def run(*options: str) -> tuple[list[str], str | None, str]:
    """``verify_audit``'s output lines, its failure (or None) and what it wrote to stderr (progress)."""
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("verify_audit", *options, stdout=out, stderr=err)
        failure = None
    except CommandError as exc:
        failure = str(exc)
    return out.getvalue().strip().splitlines(), failure, err.getvalue()


def rehashed_with_key(seq: int) -> Callable[[list[AuditEvent]], None]:
    """An insider rewrites event ``seq`` and its hash and MAC: the event after it no longer links."""

    def tamper(events: list[AuditEvent]) -> None:
        digest = event_hash({**stored(seq), "actor": "intruder"})
        sql(
            "UPDATE audit_auditevent SET actor = 'intruder', hash = %s, mac = %s WHERE seq = %s",
            [digest, insider_mac("event", digest), seq],
        )

    return tamper


def deleted(seq: int) -> Callable[[list[AuditEvent]], None]:
    return lambda events: sql("DELETE FROM audit_auditevent WHERE seq = %s", [seq])


def edited(seq: int) -> Callable[[list[AuditEvent]], None]:
    return lambda events: sql("UPDATE audit_auditevent SET actor = 'intruder' WHERE seq = %s", [seq])


def rehashed_without_key(events: list[AuditEvent]) -> None:
    digest = event_hash({**stored(6), "actor": "intruder"})
    sql("UPDATE audit_auditevent SET actor = 'intruder', hash = %s WHERE seq = 6", [digest])


TAMPERING: dict[str, Callable[[list[AuditEvent]], None]] = {
    "altered inside a segment": edited(6),
    "altered, the first of a segment": edited(5),
    "removed, the last of a segment": deleted(4),
    "removed, the first of a segment": deleted(9),
    "removed, the tail": deleted(EVENTS),
    "relinked across a join": rehashed_with_key(8),
    "relinked inside a segment": rehashed_with_key(2),
    "forged": rehashed_without_key,
    "unreadable": lambda events: sql("UPDATE audit_auditevent SET created_at = 'not a time' WHERE seq = 10"),
    "inserted after the head": lambda events: insert_raw(forge(EVENTS + 1, events[-1].hash)),
    "inserted before the start": lambda events: sql("UPDATE audit_auditevent SET seq = 0 WHERE seq = 1"),
}


def test_an_intact_chain_verifies_in_segments_to_the_head_of_the_verifier_alone(chain: list[AuditEvent]) -> None:
    alone, alone_failure, _ = run("--workers", "0")
    lines, failure, progress = run(*IN_SEGMENTS, "--progress-every", "5")

    assert failure is alone_failure is None
    assert lines[-1] == alone[-1] == f"verified {EVENTS} events, head {chain[-1].hash}"
    assert "events verified in 2 worker processes, in 3 segments" in lines
    assert "events verified in" not in "\n".join(alone)
    # Progress as the segments join: every multiple of 5 passed, in order.
    assert [line.split()[0] for line in progress.splitlines()] == ["5", "10"]


@pytest.mark.parametrize("kind", list(TAMPERING))
def test_a_broken_chain_gets_the_verdict_of_the_verifier_alone(chain: list[AuditEvent], kind: str) -> None:
    TAMPERING[kind](chain)

    _, alone_failure, _ = run("--workers", "0")
    lines, failure, _ = run(*IN_SEGMENTS)

    assert alone_failure is not None
    assert failure == alone_failure
    # Found in a segment or at a join, then verified again; or (a removed tail) after the segments joined.
    again = AGAIN in lines
    assert again is (kind != "removed, the tail"), lines
    assert again or "events verified in 2 worker processes, in 3 segments" in lines


def _no_connection_left(segment: Any, **options: Any) -> Any:
    raise RuntimeError("FATAL: sorry, too many clients already")


def test_a_worker_that_fails_leaves_the_verification_to_this_process(
    chain: list[AuditEvent], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("audit.verification._segment_checked", _no_connection_left)  # forked: the workers' too

    lines, failure, _ = run(*IN_SEGMENTS)

    assert failure is None
    assert lines[-1] == f"verified {EVENTS} events, head {chain[-1].hash}"
    assert AGAIN in lines


@pytest.mark.django_db
def test_inside_a_transaction_it_verifies_in_its_own_process() -> None:
    """Workers on connections of their own would not see what the transaction wrote."""
    events = record(EVENTS)

    lines, failure, _ = run(*IN_SEGMENTS)

    assert failure is None
    assert lines[-1] == f"verified {EVENTS} events, head {events[-1].hash}"
    assert not any("worker processes" in line for line in lines)


def test_by_default_one_worker_per_core_for_a_long_chain_in_a_process_without_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    monkeypatch.setattr("threading.active_count", lambda: 1)  # manage.py verify_audit: its main thread only
    assert _verify_workers(None, events=50_000) == 2
    assert _verify_workers(None, events=5_000) == 0  # short: starting workers costs more than they save
    assert _verify_workers(3, events=5_000) == 3  # as asked
    assert _verify_workers(None, events=0) == 0
    monkeypatch.setattr("threading.active_count", lambda: 3)  # the admin's button, in a threaded web server
    assert _verify_workers(None, events=50_000) == 0  # no fork


def test_a_segment_joins_only_where_it_continues_the_chain() -> None:
    keyring = chain_keyring()
    events = []
    prev = GENESIS_HASH
    for seq in range(1, 7):
        event = {**forge(seq, prev), "id": seq}
        event["mac"] = keyring.sign("event", event["hash"])
        events.append(event)
        prev = event["hash"]
    alone = ChainVerifier(keyring=keyring)
    for event in events:
        assert alone.feed(event) is None

    def verified(part: list[dict[str, Any]], start_seq: int) -> Any:
        segment = ChainVerifier(start_seq=start_seq, start_prev_hash=None, keyring=keyring)
        for event in part:
            segment.feed(event)
        return segment.segment_end()

    joined = ChainVerifier(keyring=keyring)
    assert joined.join(verified(events[:3], 1))
    assert joined.join(verified([], 4))  # an empty stretch: nothing taken
    assert joined.join(verified(events[3:], 4))
    assert vars(joined) == vars(alone)

    head = ChainVerifier(keyring=keyring)
    assert head.join(verified(events[:2], 1))
    assert not head.join(verified(events[3:], 4))  # seq 3 missing between them
    # An insider removed seq 3 and relinked seq 4 (and what follows) to seq 2, with the key: every link holds.
    relinked_4 = {**forge(4, events[1]["hash"]), "id": 4}
    relinked_4["mac"] = keyring.sign("event", relinked_4["hash"])
    assert not head.join(verified([relinked_4], 4))
    assert not ChainVerifier(keyring=keyring).join(verified(events[1:], 2))  # seq 1 missing
    relinked = ChainVerifier(start_seq=1, start_prev_hash="f" * 64, keyring=keyring)  # another chain before it
    assert not relinked.join(verified(events, 1))
    failed = ChainVerifier(keyring=keyring)
    assert not failed.join(verified([events[0], {**events[1], "tool": "altered"}], 1))


@pytest.mark.django_db
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
