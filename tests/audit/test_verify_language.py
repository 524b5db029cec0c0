"""``verify_audit`` speaks the platform's language: its verdict (the first problem), its notes and its summary lines
go through gettext, in the admin's *Verify chain* and in ``manage.py verify_audit`` alike, also where the chain was
verified by worker processes. What stays as it is, is data: seq numbers, ids, file names, hashes, key ids and what
Python says of a file it cannot read. The English texts (the msgids) are the texts the other tests assert.

The texts are checked under a translation that brackets every text it translates and writes it in capitals
(``⟦EVENT SEQ 3 (ID 7)⟧``), its placeholders left as they are: a text left out of gettext shows in small letters,
inside a translated one or not, whatever the catalogue holds."""

from __future__ import annotations

import datetime as dt
import gzip
import io
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.utils import translation
from django.utils.translation import trans_real

from audit.anchors import audit_chain_anchor
from audit.append_only import append_only_install
from audit.archive import audit_events_archive
from audit.chain import GENESIS_HASH, ChainBreak, ChainKeyring, ChainVerifier, event_hash
from audit.models import AuditCheckpoint, AuditEvent, AuditPendingEvent
from audit.services import audit_chain_pending
from audit.verification import _archive_checkpoint_label, _label, audit_chain_verify, chain_break_words
from auditor.admin import audit_chain_verdict
from tests.audit.test_chain import forge, insert_raw, insider_mac, record, sql
from tests.audit.test_chain_replay import append, captured, put_back
from tests.audit.test_retention import record as record_aged

pytestmark = pytest.mark.django_db

_PLACEHOLDER = re.compile(r"(%\([^)]*\)[-#0 +]*\d*(?:\.\d+)?[diouxXeEfFgGcrsa]|%%)")


def _capitals(text: str) -> str:
    """``text`` in capitals but for its placeholders."""
    return "".join(part if _PLACEHOLDER.fullmatch(part) else part.upper() for part in _PLACEHOLDER.split(text))


class _Shouted:
    """A translation that returns the English catalogue's text in capitals, in brackets."""

    def __init__(self, base: Any) -> None:
        self._base = base

    def gettext(self, message: str) -> str:
        return f"⟦{_capitals(self._base.gettext(message))}⟧"

    def ngettext(self, singular: str, plural: str, number: int) -> str:
        return f"⟦{_capitals(self._base.ngettext(singular, plural, number))}⟧"

    def __getattr__(self, name: str) -> Any:
        return getattr(self._base, name)


@contextmanager
def shouted() -> Iterator[None]:
    """English, every translated text in capitals and brackets."""
    real = trans_real.translation
    with translation.override("en"), pytest.MonkeyPatch.context() as patch:
        patch.setattr(trans_real, "translation", lambda language: _Shouted(real(language)))
        translation.activate("en")
        yield


def assert_worded(text: str, *data: Any) -> None:
    """``text`` is translated through and through: bracketed, and no word in small letters is left once the data
    (``data``: file names, hashes, Python's words) is taken out."""
    assert text.startswith("⟦") and text.endswith("⟧"), text
    rest = text
    for value in sorted((str(item) for item in data), key=len, reverse=True):
        rest = rest.replace(value, " ")
    left = re.findall(r"[a-z][a-z_]+", rest)
    assert not left, f"not translated: {left} in:\n{text}"


def verify(*options: str) -> tuple[list[str], str | None]:
    """``verify_audit``'s output lines and its failure (or None)."""
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("verify_audit", *options, stdout=out, stderr=err)
    except CommandError as exc:
        return out.getvalue().splitlines(), str(exc)
    return out.getvalue().splitlines(), None


def anchor_data() -> list[str]:
    """The anchor file's name and every anchor's time (data in the anchors' note and their labels)."""
    from django.conf import settings

    path = Path(settings.AUDIT_ANCHOR_PATH)
    lines = path.read_text().splitlines() if path.exists() else []
    return [str(path), *(json.loads(line)["at"] for line in lines)]


# --- a chain's breaks ---------------------------------------------------------------------------------------------

KEYRING = ChainKeyring(["k" * 40])
OTHER = ChainKeyring(["o" * 40])


def chain(count: int, *, start: int = 1, prev: str = GENESIS_HASH, keyring: ChainKeyring = KEYRING) -> list[dict]:
    events = []
    for seq in range(start, start + count):
        event: dict[str, Any] = {
            "seq": seq, "prev_hash": prev, "created_at": dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
            "run_id": None, "source": "agent", "action": "tool.call", "mcp_id": "demo", "tool": "search",
            "call_id": f"c{seq}", "args": {"i": seq}, "result": None, "ok": True, "reason": "", "attempt": 1,
            "latency_ms": 2.5, "actor": "", "id": seq + 100,
        }  # fmt: skip
        event["hash"] = prev = event_hash(event)
        event["mac"] = keyring.sign("event", prev)
        events.append(event)
    return events


def first_break(verifier: ChainVerifier, events: list[dict], **tail: Any) -> ChainBreak:
    for event in events:
        problem = verifier.feed(event)
        if problem is not None:
            return problem
    found = verifier.check_tail(**tail)
    assert found is not None
    return found


def breaks() -> dict[str, tuple[ChainBreak, list[str]]]:
    """One break of each reason (and of each wording of a reason), with its data."""
    events = chain(4)
    later = chain(2, start=5, prev="f" * 64)
    anchored = ChainVerifier(keyring=KEYRING)
    anchored.anchor(seq=2, hash_hex="a" * 64, label=_label("anchor of %(at)s", at="2026-01-02T03:04:05+00:00"))
    return {
        "out of place": (first_break(ChainVerifier(keyring=KEYRING), [events[0], events[0]]), []),
        "one missing": (first_break(ChainVerifier(keyring=KEYRING), [events[0], events[2]]), []),
        "several missing": (first_break(ChainVerifier(keyring=KEYRING), [events[0], events[3]]), []),
        "unreadable": (
            first_break(ChainVerifier(keyring=KEYRING), [{**events[0], "run_id": "no-uuid"}]),
            ["badly formed hexadecimal UUID string"],
        ),
        "hash mismatch": (first_break(ChainVerifier(keyring=KEYRING), [{**events[0], "actor": "x"}]), []),
        "genesis": (first_break(ChainVerifier(keyring=KEYRING), later), []),
        "checkpoint before": (first_break(ChainVerifier(start_seq=5, start_prev_hash="e" * 64), later), []),
        "archive checkpoint": (
            first_break(
                ChainVerifier(start_seq=5, start_prev_hash="e" * 64, start_label=_archive_checkpoint_label(4)), later
            ),
            [],
        ),
        "seq before": (first_break(ChainVerifier(keyring=KEYRING), [events[0], {**later[0], "seq": 2}]), []),
        "no MAC": (first_break(ChainVerifier(keyring=KEYRING), [{**events[0], "mac": None}]), []),
        "another key": (first_break(ChainVerifier(keyring=KEYRING), chain(1, keyring=OTHER)), [OTHER.signing_key_id]),
        "MAC mismatch": (
            first_break(ChainVerifier(keyring=KEYRING), [{**events[0], "mac": KEYRING.sign("event", "0" * 64)}]),
            [],
        ),
        "anchor": (first_break(anchored, events), ["2026-01-02T03:04:05+00:00"]),
        "tail short": (
            first_break(ChainVerifier(keyring=KEYRING), events, head_seq=9, head_hash="", head_label=_label("head")),
            [],
        ),
        "nothing to the head": (
            first_break(ChainVerifier(keyring=KEYRING), [], head_seq=9, head_hash="", head_label=_label("checkpoint")),
            [],
        ),
        "tail hash": (
            first_break(ChainVerifier(keyring=KEYRING), events, head_seq=4, head_hash="", head_label=_label("head")),
            [],
        ),
    }


def test_each_break_of_the_chain_is_worded_in_english_as_the_chain_words_it() -> None:
    found = breaks()
    assert len({problem.reason for problem, _ in found.values()}) == 9  # every reason
    with translation.override("en"):
        for name, (problem, _data) in found.items():
            assert chain_break_words(problem) == problem.message, name


def test_each_break_of_the_chain_goes_through_gettext() -> None:
    found = breaks()
    with shouted():
        for problem, data in found.values():
            assert_worded(chain_break_words(problem), *data)
        assert chain_break_words(found["hash mismatch"][0]) == "⟦⟦EVENT SEQ 1 (ID 101)⟧: HASH MISMATCH — ALTERED⟧"
        assert chain_break_words(found["archive checkpoint"][0]) == (
            "⟦⟦EVENT SEQ 5 (ID 105)⟧: PREV_HASH IS NOT ⟦THE HASH OF THE ARCHIVE CHECKPOINT AT SEQ 4⟧ — CHAIN BROKEN"
            " (THE EVENT BEFORE IT WAS REPLACED, OR THIS ONE WAS ALTERED AND REHASHED)⟧"
        )
        assert chain_break_words(found["another key"][0]) == (
            f"⟦⟦EVENT SEQ 1 (ID 101)⟧: ⟦MAC BY KEY {OTHER.signing_key_id}, WHICH AUDIT_CHAIN_KEY DOES NOT HOLD⟧"
            " — FORGED (WRITTEN OR REWRITTEN WITHOUT THE CHAIN KEY)⟧"
        )


# --- the verdict, in the admin and in the command -----------------------------------------------------------------


def test_a_tampered_records_verdict_is_translated_in_the_admin_and_in_the_command() -> None:
    events = record(5)
    audit_chain_anchor()
    sql("UPDATE audit_auditevent SET actor = 'intruder' WHERE seq = 3")

    with shouted():
        verdict = audit_chain_verdict()
        lines, failure = verify()
    assert not verdict.ok
    assert verdict.problem == failure == f"⟦⟦EVENT SEQ 3 (ID {events[2].pk})⟧: HASH MISMATCH — ALTERED⟧"
    assert verdict.lines == lines
    for line in lines:  # the anchors' note
        assert_worded(line, *anchor_data())


def test_a_forged_event_a_removed_one_and_a_forged_head_are_translated() -> None:
    events = record(5)
    sql("UPDATE audit_auditevent SET mac = 'deadbeef:00' WHERE seq = 2")
    with shouted():
        assert verify()[1] == (
            f"⟦⟦EVENT SEQ 2 (ID {events[1].pk})⟧: ⟦MAC BY KEY deadbeef, WHICH AUDIT_CHAIN_KEY DOES NOT HOLD⟧"
            " — FORGED (WRITTEN OR REWRITTEN WITHOUT THE CHAIN KEY)⟧"
        )
    sql("DELETE FROM audit_auditevent WHERE seq = 2")
    with shouted():
        assert verify()[1] == "⟦SEQ 2 MISSING — REMOVED⟧"
    sql("UPDATE audit_auditchainhead SET seq = 1, hash = %s", [events[0].hash])
    with shouted():
        assert verify()[1] == "⟦CHAIN HEAD (SEQ 1): ⟦MAC MISMATCH⟧ — FORGED (MOVED WITHOUT THE CHAIN KEY)⟧"
    sql("DELETE FROM audit_auditchainhead")
    with shouted():
        assert verify()[1] == "⟦CHAIN HEAD MISSING: THE AUDIT CHAIN HEAD ROW WAS REMOVED⟧"


def test_a_truncated_tail_is_translated() -> None:
    record(4)
    audit_chain_anchor()
    sql("DELETE FROM audit_auditevent WHERE seq > 2")
    with shouted():
        failure = verify()[1]
    assert failure == "⟦TAIL TRUNCATED: ⟦HEAD⟧ SAYS SEQ 4, LAST EVENT IS 2⟧"


def test_events_out_of_place_are_translated() -> None:
    events = record(3)
    after = insert_raw(forge(4, events[-1].hash))
    with shouted():
        assert verify()[1] == f"⟦⟦EVENT SEQ 4 (ID {after})⟧: AFTER THE CHAIN HEAD (SEQ 3) — INSERTED⟧"
    before = insert_raw(forge(0, GENESIS_HASH))
    with shouted():
        assert verify()[1] == (f"⟦⟦EVENT SEQ 0 (ID {before})⟧: OUT OF PLACE, THE CHAIN CONTINUES AT SEQ 1 — INSERTED⟧")


def test_the_checkpoint_files_note_and_its_forgery_are_translated(tmp_path: Path) -> None:
    record(3)
    checkpoint = tmp_path / "audit-head.json"
    with shouted():
        lines, failure = verify("--checkpoint-file", str(checkpoint))
    assert failure is None
    assert f"⟦CHECKPOINT FILE {checkpoint} DOES NOT EXIST YET: IT WILL BE WRITTEN⟧" in lines
    for line in lines:
        assert_worded(line, checkpoint, *anchor_data(), *(event.hash for event in AuditEvent.objects.all()))

    document = json.loads(checkpoint.read_text())
    checkpoint.write_text(json.dumps({**document, "seq": 2}))
    with shouted():
        failure = verify("--checkpoint-file", str(checkpoint))[1]
    assert failure == f"⟦CHECKPOINT FILE {checkpoint}: UNREADABLE OR BAD SIGNATURE — FORGED OR ALTERED⟧"


# --- archives -----------------------------------------------------------------------------------------------------


def test_an_unreadable_archive_a_line_not_json_and_an_empty_archive_are_translated(tmp_path: Path) -> None:
    not_gzip = tmp_path / "a.jsonl.gz"
    not_gzip.write_bytes(b"no archive")
    not_json = tmp_path / "b.jsonl.gz"
    not_json.write_bytes(gzip.compress(b"{not json\n"))
    empty = tmp_path / "c.jsonl.gz"
    empty.write_bytes(gzip.compress(b""))

    with shouted():
        unreadable = verify("--archive", str(not_gzip))[1]
        assert verify("--archive", str(not_json))[1] == f"⟦ARCHIVE {not_json} LINE 1: NOT JSON — ALTERED⟧"
        assert verify("--archive", str(empty))[1] == f"⟦ARCHIVE {empty}: NO EVENTS⟧"
    assert unreadable is not None
    assert unreadable.startswith(f"⟦ARCHIVE {not_gzip}: UNREADABLE (Not a gzipped file")
    assert_worded(unreadable, not_gzip, "Not a gzipped file (b'no')")


def test_an_archives_summary_its_checkpoint_and_a_break_inside_it_are_translated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record_aged(4, days_ago=40, monkeypatch=monkeypatch)
    record_aged(2, monkeypatch=monkeypatch)
    path = tmp_path / "a.jsonl.gz"
    audit_events_archive(older_than_days=30, output=path)
    checkpoint = AuditCheckpoint.objects.get()
    hashes = [checkpoint.hash, *(event.hash for event in AuditEvent.objects.all())]

    with shouted():
        lines, failure = verify()  # starts after the checkpoint
        archive_lines, archive_failure = verify("--archive", str(path))
    assert failure is None and archive_failure is None
    assert f"⟦STARTING AFTER ARCHIVE CHECKPOINT SEQ 4 ({path})⟧" in lines
    assert f"⟦ARCHIVE {path}: VERIFIED 4 EVENTS (SEQ 1 TO 4), CHECKPOINT {checkpoint.hash}⟧" in archive_lines
    for line in [*lines, *archive_lines]:
        assert_worded(line, path, *hashes, *anchor_data())

    lines = gzip.decompress(path.read_bytes()).decode().splitlines()
    event = json.loads(lines[1])
    lines[1] = json.dumps({**event, "actor": "intruder"})
    path.write_bytes(gzip.compress("\n".join(lines).encode() + b"\n"))
    with shouted():
        failure = verify("--archive", str(path))[1]
        in_table = verify()[1]
    assert failure == in_table == f"⟦ARCHIVE {path}: ⟦⟦EVENT SEQ 2 (ID {event['id']})⟧: HASH MISMATCH — ALTERED⟧⟧"

    sql("UPDATE audit_auditcheckpoint SET mac = 'deadbeef:00'")
    with shouted():
        failure = verify()[1]
    assert failure == (
        "⟦ARCHIVE CHECKPOINT SEQ 4: ⟦MAC BY KEY deadbeef, WHICH AUDIT_CHAIN_KEY DOES NOT HOLD⟧ — FORGED⟧"
    )


# --- pending events and nonces ------------------------------------------------------------------------------------


@pytest.fixture
def deferred(settings: Any) -> None:
    settings.AUDIT_CHAIN_MODE = "deferred"
    settings.AUDIT_CHAIN_BACKGROUND = "off"


@pytest.mark.usefixtures("deferred")
def test_the_chain_lag_and_the_pending_rows_replayed_or_forged_are_translated() -> None:
    append()
    with shouted():
        lines, failure = verify()
    assert failure is None
    assert any(line.startswith("⟦1 EVENTS APPENDED BUT NOT CHAINED YET (CHAIN LAG), THE OLDEST ") for line in lines)
    for line in lines:
        assert_worded(line, *anchor_data())

    copy = captured()
    audit_chain_pending()
    event = AuditEvent.objects.get()
    replayed = put_back(copy)
    with shouted():
        assert verify()[1] == (
            f"⟦PENDING EVENT ID {replayed}: THE NONCE OF EVENT SEQ 1 (ID {event.pk}) — REPLAYED"
            " (A COPY OF ITS PENDING ROW PUT BACK; NEVER CHAINED)⟧"
        )
    sql("UPDATE audit_auditpendingevent SET nonce = '' WHERE id = %s", [replayed])
    with shouted():
        assert verify()[1] == (
            f"⟦PENDING EVENT ID {replayed}: ⟦MAC MISMATCH⟧ — FORGED (WRITTEN OR REWRITTEN WITHOUT THE CHAIN KEY)⟧"
        )
    sql("DELETE FROM audit_auditpendingevent")
    append()
    first = AuditPendingEvent.objects.get().pk
    second = put_back(captured())  # two copies, neither chained
    with shouted():
        assert verify()[1] == (
            f"⟦PENDING EVENT ID {second}: THE NONCE OF PENDING EVENT ID {first} — REPLAYED"
            " (A COPY OF A PENDING ROW; NEVER CHAINED)⟧"
        )


@pytest.mark.usefixtures("deferred")
def test_a_pending_row_without_a_nonce_is_named_in_the_active_language() -> None:
    from audit.chain import pending_hash

    append()
    row = AuditPendingEvent.objects.get()
    content = {name: getattr(row, name) for name in ("created_at", "run_id", "source", "action", "mcp_id", "tool")}
    content |= {name: getattr(row, name) for name in ("call_id", "args", "result", "ok", "reason", "attempt")}
    content |= {"latency_ms": row.latency_ms, "actor": row.actor}
    sql(
        "UPDATE audit_auditpendingevent SET nonce = '', mac = %s WHERE id = %s",
        [insider_mac("pending", pending_hash(content)), row.pk],
    )
    with shouted():
        assert verify()[1] == (
            f"⟦PENDING EVENT ID {row.pk}: ⟦NO NONCE⟧ — FORGED (WRITTEN OR REWRITTEN WITHOUT THE CHAIN KEY)⟧"
        )


# --- worker processes ---------------------------------------------------------------------------------------------


@pytest.fixture
def committed(transactional_db: Any) -> Iterator[list[AuditEvent]]:
    """A committed chain (the workers read it on connections of their own), its triggers put back after."""
    yield record(12)
    from django.db import connection

    if connection.vendor == "sqlite":
        append_only_install(connection)


def test_a_verdict_found_by_worker_processes_is_worded_in_the_callers_language(committed: list[AuditEvent]) -> None:
    with shouted():
        report = audit_chain_verify(workers=2, chunk_size=1)
    assert report.ok
    assert "⟦EVENTS VERIFIED IN 2 WORKER PROCESSES, IN 3 SEGMENTS⟧" in report.notes

    sql("UPDATE audit_auditevent SET actor = 'intruder' WHERE seq = 6")
    with shouted():
        report = audit_chain_verify(workers=2, chunk_size=1)
    assert report.problem == f"⟦⟦EVENT SEQ 6 (ID {committed[5].pk})⟧: HASH MISMATCH — ALTERED⟧"
    assert "⟦THE WORKER PROCESSES DID NOT VERIFY EVERY SEGMENT: VERIFIED AGAIN IN THIS ONE⟧" in report.notes
    for note in report.notes:
        assert_worded(note, *anchor_data())


@pytest.mark.usefixtures("deferred")
def test_the_replay_of_an_archived_events_row_and_two_events_with_one_nonce_are_translated(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from audit import services

    record_aged(1, days_ago=40, monkeypatch=monkeypatch)
    copy = captured()
    audit_chain_pending()
    record_aged(2, monkeypatch=monkeypatch)
    audit_chain_pending()
    path = tmp_path / "a.jsonl.gz"
    audit_events_archive(older_than_days=30, output=path)
    assert audit_chain_pending() == 1  # the archive's own event, seq 4
    put_back(copy)
    assert audit_chain_pending() == 1
    replayed = AuditEvent.objects.get(seq=5)
    with shouted():
        assert verify()[1] == (
            f"⟦EVENT SEQ 5 (ID {replayed.pk}): THE NONCE OF ARCHIVED EVENT SEQ 1 ({path})"
            " — REPLAYED (A COPY OF ITS PENDING ROW CHAINED AGAIN)⟧"
        )

    sql("DROP INDEX audit_event_nonce_unique")  # a second event with the nonce of one in the table
    real_reads = services._chain_reads

    def reads_that_do_not_look(*args: Any) -> tuple[str, str]:
        head, pending = real_reads(*args)
        return head, pending.replace("EXISTS (", "0 AND EXISTS (")

    monkeypatch.setattr(services, "_chain_reads", reads_that_do_not_look)
    put_back(copy)
    assert audit_chain_pending() == 1
    again = AuditEvent.objects.get(seq=6)
    monkeypatch.setattr("audit.verification._archived_replay_candidates", lambda: {})
    with shouted():
        assert verify()[1] == (
            f"⟦EVENT SEQ 6 (ID {again.pk}): THE NONCE OF EVENT SEQ 5 — REPLAYED"
            " (A COPY OF ITS PENDING ROW CHAINED AGAIN)⟧"
        )
