"""Checking archives from anywhere, and archives that are not what ``archive_audit`` wrote.

- An archive written to a relative path verifies from any working directory (its checkpoint names the file
  absolutely; ``VAR_DIR`` is absolute too), and where its file is missing or unreadable the admin's *Verify chain*
  says the chain could not be checked, not that it was altered.
- A tampered archive file is a verdict, never a crash: a line without a hash, a checkpoint whose seq is text, a
  corrupt compressed stream and a MAC with non-ASCII characters each name the altered line or event, and whatever
  else stops ``verify_audit`` is a failed verdict in the admin (logged), never a server error.
"""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from audit.models import AuditCheckpoint, AuditEvent
from auditor import admin as auditor_admin
from tests.audit.test_retention import archive_lines, command, record, rewrite_archive

pytestmark = pytest.mark.django_db

VERIFY_URL = "/admin/audit/auditevent/verify/"


@pytest.fixture
def archived(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> tuple[Path, list[AuditEvent]]:
    """Four events from 40 days ago archived to ``tmp_path/old.jsonl.gz``, then two from today (in the table)."""
    record(4, days_ago=40, monkeypatch=monkeypatch)
    young = record(2, monkeypatch=monkeypatch)
    archive = tmp_path / "old.jsonl.gz"
    command("archive_audit", "--older-than-days", "30", "--output", str(archive))
    return archive, young


# --- where the archive is ---------------------------------------------------------------------------------------


def test_an_archive_written_to_a_relative_path_verifies_from_another_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    record(3, days_ago=40, monkeypatch=monkeypatch)
    young = record(2, monkeypatch=monkeypatch)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")

    command("archive_audit", "--older-than-days", "30", "--output", "arch/a.jsonl.gz")

    written = (tmp_path / "a" / "arch" / "a.jsonl.gz").resolve()
    assert AuditCheckpoint.objects.get().file_name == str(written)
    monkeypatch.chdir(tmp_path / "b")
    recorded = AuditEvent.objects.get(action="audit.archive")  # the archive's own event, after the young ones
    assert recorded.prev_hash == young[-1].hash
    assert command("verify_audit") == f"verified 3 events, head {recorded.hash}"
    assert auditor_admin.audit_chain_verdict().ok


def test_a_relative_var_dir_is_made_absolute(tmp_path: Path) -> None:
    shown = subprocess.run(
        [sys.executable, "-c", "import agent_platform.settings as s; print(s.VAR_DIR)"],
        cwd=tmp_path,
        env={**os.environ, "PLATFORM_VAR_DIR": "var-relative", "PYTHONPATH": str(settings.BASE_DIR)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert shown.stdout.strip() == str(tmp_path.resolve() / "var-relative")


def test_a_missing_archive_file_is_no_check_rather_than_altered(
    archived: tuple[Path, list[AuditEvent]], auditor_client: Any
) -> None:
    archive, _ = archived
    archive.unlink()

    verdict = auditor_admin.audit_chain_verdict()
    page = auditor_client.post(VERIFY_URL).content.decode()

    assert verdict.outcome == "unchecked" and not verdict.ok
    assert verdict.problem.startswith(f"archive checkpoint seq 4: its archive file {archive} is missing")
    assert "The audit chain could not be checked: an archive file is missing or unreadable." in page
    assert "The audit chain was altered." not in page


def test_an_archive_file_that_cannot_be_read_is_no_check_rather_than_altered(
    archived: tuple[Path, list[AuditEvent]],
) -> None:
    archive, _ = archived
    archive.unlink()
    archive.mkdir()  # there, but not a file to read: as one without read permission (the tests may run as root)

    verdict = auditor_admin.audit_chain_verdict()

    assert verdict.outcome == "unchecked"
    assert verdict.problem.startswith(f"archive {archive}: unreadable (")


# --- an archive that is not what archive_audit wrote ------------------------------------------------------------


def test_an_archive_line_without_a_hash_is_named_not_an_event(archived: tuple[Path, list[AuditEvent]]) -> None:
    archive, _ = archived
    lines = archive_lines(archive)
    del lines[1]["hash"]
    rewrite_archive(archive, lines)

    expected = f"FAILED: archive {archive} line 2: not an event — altered"
    assert command("verify_audit") == expected
    assert command("verify_audit", "--archive", str(archive)) == expected
    verdict = auditor_admin.audit_chain_verdict()
    assert (verdict.outcome, verdict.problem) == ("altered", expected.removeprefix("FAILED: "))


@pytest.mark.parametrize(
    ("tamper", "line"),
    [
        (lambda lines: lines[0].update(seq=True), 1),
        (lambda lines: lines[2].update(seq="3"), 3),
        (lambda lines: lines[0].update(prev_hash=None), 1),
        (lambda lines: lines[3].update(hash=["not", "a", "hash"]), 4),
    ],
    ids=["a bool seq", "a text seq", "no prev_hash", "a list for a hash"],
)
def test_an_archive_line_of_another_shape_is_named_not_an_event(
    archived: tuple[Path, list[AuditEvent]], tamper: Any, line: int
) -> None:
    archive, _ = archived
    lines = archive_lines(archive)
    tamper(lines)
    rewrite_archive(archive, lines)

    assert command("verify_audit") == f"FAILED: archive {archive} line {line}: not an event — altered"


@pytest.mark.parametrize(
    "checkpoint", [{"seq": "4", "hash": "x"}, {"seq": 4}, {"seq": 4, "hash": 4}, ["seq", 4]], ids=repr
)
def test_a_checkpoint_line_of_another_shape_is_named_not_a_checkpoint(
    archived: tuple[Path, list[AuditEvent]], checkpoint: Any
) -> None:
    archive, _ = archived
    lines = archive_lines(archive)
    lines[-1]["checkpoint"] = checkpoint
    rewrite_archive(archive, lines)

    assert command("verify_audit") == f"FAILED: archive {archive} line 5: not a checkpoint — altered"


def test_an_archive_whose_compressed_data_is_corrupt_is_altered(archived: tuple[Path, list[AuditEvent]]) -> None:
    archive, _ = archived
    # A gzip header, then a deflate block of the reserved type: zlib refuses it ("invalid block type").
    archive.write_bytes(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff" + b"\xff" * 8)

    said = command("verify_audit")

    assert said.startswith(f"FAILED: archive {archive}: unreadable (Error -3 while decompressing data")
    assert auditor_admin.audit_chain_verdict().outcome == "altered"


def test_an_archive_line_whose_mac_is_not_ascii_is_forged(archived: tuple[Path, list[AuditEvent]]) -> None:
    archive, _ = archived
    lines = archive_lines(archive)
    key_id = lines[0]["mac"].partition(":")[0]
    lines[0]["mac"] = f"{key_id}:위조된-서명"
    rewrite_archive(archive, lines)

    said = command("verify_audit")

    assert said.startswith(f"FAILED: archive {archive}: event seq 1 (id ")
    assert said.endswith(": MAC mismatch — forged (written or rewritten without the chain key)")


def test_the_admin_turns_an_error_of_the_check_into_a_failed_verdict(
    monkeypatch: pytest.MonkeyPatch, auditor_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    def stops(*args: Any, **kwargs: Any) -> None:
        raise KeyError("hash")

    monkeypatch.setattr(auditor_admin, "call_command", stops)

    response = auditor_client.post(VERIFY_URL)

    page = response.content.decode()
    assert response.status_code == 200
    assert "The audit chain could not be checked: the check stopped with an error." in page
    assert "verify_audit stopped with an error (KeyError); see the server log." in page
    assert "verify_audit stopped with an error" in caplog.text


def test_a_gzip_archive_line_keeps_korean_text_after_a_rewrite(archived: tuple[Path, list[AuditEvent]]) -> None:
    """The helpers above rewrite archives as archive_audit writes them: an untouched rewrite still verifies."""
    archive, young = archived
    lines = archive_lines(archive)
    rewrite_archive(archive, lines)
    with gzip.open(archive, "rt", encoding="utf-8") as text:
        assert "김하늘" in text.read()
    recorded = AuditEvent.objects.get(action="audit.archive")  # the archive's own event, after the young ones
    assert recorded.prev_hash == young[-1].hash
    assert command("verify_audit") == f"verified 3 events, head {recorded.hash}"
