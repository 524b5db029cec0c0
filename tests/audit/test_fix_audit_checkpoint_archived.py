"""A signed checkpoint file (``verify_audit --checkpoint-file``) whose seq was archived since it was signed.

Its hash is checked against that event in the archive file: one that differs fails as "— replaced", and the file,
the evidence, is left as it is. ``--archive`` checks it too, and never rewrites it.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from audit.chain import event_hash, head_message
from audit.models import AuditEvent
from tests.audit.test_chain import insider_mac, sql, stored
from tests.audit.test_retention import command, record

pytestmark = pytest.mark.django_db


def verify(*options: str) -> tuple[list[str], str | None]:
    """``verify_audit``'s lines, and its error (None on success)."""
    out = io.StringIO()
    try:
        call_command("verify_audit", *options, stdout=out, stderr=io.StringIO())
    except CommandError as exc:
        return out.getvalue().splitlines(), str(exc)
    return out.getvalue().splitlines(), None


def insider_rewrites(first: int, last: int) -> None:
    """An insider holding the chain key rewrites seq ``first`` to ``last`` (the head) consistently: hashes, MACs
    and the head all agree, so only something kept outside the database can tell."""
    prev = stored(first - 1)["hash"]
    for seq in range(first, last + 1):
        rewritten = {**stored(seq), "actor": "intruder", "prev_hash": prev}
        prev = event_hash(rewritten)
        sql(
            "UPDATE audit_auditevent SET actor = 'intruder', prev_hash = %s, hash = %s, mac = %s WHERE seq = %s",
            [rewritten["prev_hash"], prev, insider_mac("event", prev), seq],
        )
    sql("UPDATE audit_auditchainhead SET hash = %s, mac = %s", [prev, insider_mac("head", head_message(last, prev))])


@pytest.fixture
def signed_at_5(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Five old events, their head (seq 5) signed into ``tmp_path/audit-head.json``."""
    record(5, days_ago=40, monkeypatch=monkeypatch)
    checkpoint = tmp_path / "audit-head.json"
    assert verify("--checkpoint-file", str(checkpoint))[1] is None
    assert json.loads(checkpoint.read_text())["seq"] == 5
    return checkpoint


def archive_old(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Two events of today appended, then the old ones (seq 1 to 5) archived to ``tmp_path/old.jsonl.gz``."""
    record(2, monkeypatch=monkeypatch)
    archive = tmp_path / "old.jsonl.gz"
    assert command("archive_audit", "--older-than-days", "30", "--output", str(archive)).startswith("archived 5 ")
    return archive


def test_a_signed_hash_that_differs_from_its_archived_event_fails_and_the_file_is_kept(
    signed_at_5: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    insider_rewrites(3, 5)
    event_id = stored(5)["id"]
    archive = archive_old(tmp_path, monkeypatch)
    signed = signed_at_5.read_bytes()

    _lines, failure = verify("--checkpoint-file", str(signed_at_5))

    assert failure == (
        f"archive {archive}: event seq 5 (id {event_id}): hash differs from the signed checkpoint file's — replaced"
    )
    assert signed_at_5.read_bytes() == signed  # the evidence stays


def test_a_signed_seq_that_was_archived_is_checked_there_before_the_file_moves_on(
    signed_at_5: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = archive_old(tmp_path, monkeypatch)

    lines, failure = verify("--checkpoint-file", str(signed_at_5))

    assert failure is None
    assert f"signed checkpoint file's seq 5: checked in archive {archive}" in lines
    assert json.loads(signed_at_5.read_text())["seq"] == 8  # the table's head: the archive's own event


def test_the_file_is_kept_where_the_archive_that_holds_its_seq_is_missing(
    signed_at_5: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = archive_old(tmp_path, monkeypatch)
    archive.unlink()
    signed = signed_at_5.read_bytes()

    _lines, failure = verify("--checkpoint-file", str(signed_at_5))

    assert failure is not None and failure.startswith(
        f"archive checkpoint seq 5: its archive file {archive} is missing"
    )
    assert signed_at_5.read_bytes() == signed


def test_archives_checked_with_a_checkpoint_file_check_its_seq_and_leave_it_as_it_is(
    signed_at_5: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    insider_rewrites(3, 5)
    event_id = stored(5)["id"]
    archive = archive_old(tmp_path, monkeypatch)
    signed = signed_at_5.read_bytes()

    _lines, failure = verify("--archive", str(archive), "--checkpoint-file", str(signed_at_5))

    assert failure == (
        f"archive {archive}: event seq 5 (id {event_id}): hash differs from the signed checkpoint file's — replaced"
    )
    assert verify("--archive", str(archive))[1] is None  # the archive alone cannot tell
    assert signed_at_5.read_bytes() == signed


def test_archives_that_hold_the_signed_seq_say_so_and_those_that_do_not_say_it_was_not_checked(
    signed_at_5: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = archive_old(tmp_path, monkeypatch)
    signed = signed_at_5.read_bytes()

    lines, failure = verify("--archive", str(archive), "--checkpoint-file", str(signed_at_5))
    assert failure is None
    assert f"signed checkpoint file's seq 5: checked in archive {archive}" in lines

    verify("--checkpoint-file", str(signed_at_5))  # moves it on to the table's head, seq 8 (the archive's event)
    lines, failure = verify("--archive", str(archive), "--checkpoint-file", str(signed_at_5))
    assert failure is None
    assert "signed checkpoint file's seq 8 is in none of these archives: not checked" in lines
    assert json.loads(signed_at_5.read_text())["seq"] == 8 and signed_at_5.read_bytes() != signed

    missing = tmp_path / "nowhere.json"
    assert verify("--archive", str(archive), "--checkpoint-file", str(missing))[1] == (
        f"checkpoint file {missing} does not exist"
    )
    assert not missing.exists()
    assert AuditEvent.objects.count() == 3  # two after the archive, and its own event
