"""``verify_audit``'s words where its work is not the plain one.

- The parallel verifier, finding a segment that does not verify, says on the progress stream (stderr) that it
  verifies the chain again in this process before its counts start again from the first event.
- Archives are one sequence: given newest first, they are checked oldest first (a note says in which order), not
  reported as an older file's events inserted after the newer one's.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from django.core.management import call_command

from audit.models import AuditEvent
from tests.audit.test_retention import command
from tests.audit.test_retention import record as record_days_ago
from tests.audit.test_verify_parallel import IN_SEGMENTS, chain, edited, run  # noqa: F401 - chain is a fixture

AGAIN_NOW = (
    "the worker processes did not verify every segment: verifying the chain again in this process, from the start, "
    "to name the first break"
)


def test_the_progress_says_why_it_starts_again_before_it_does(chain: list[AuditEvent]) -> None:  # noqa: F811
    edited(10)(chain)

    _lines, failure, progress = run(*IN_SEGMENTS, "--progress-every", "2")

    assert failure is not None and "seq 10" in failure
    shown = [line.strip() for line in progress.splitlines()]
    assert AGAIN_NOW in shown
    again = shown.index(AGAIN_NOW)
    # After it, the counts of this process, from the start: 2, 4, 6, 8 (the break at 10 stops it).
    assert [line.split()[0] for line in shown[again + 1 :]] == ["2", "4", "6", "8"]


@pytest.mark.django_db
def test_archives_given_newest_first_are_checked_oldest_first(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    record_days_ago(5, days_ago=100, monkeypatch=monkeypatch)
    record_days_ago(4, days_ago=50, monkeypatch=monkeypatch)
    older, newer = tmp_path / "older.jsonl.gz", tmp_path / "newer.jsonl.gz"
    assert command("archive_audit", "--older-than-days", "70", "--output", str(older)).startswith("archived 5 events")
    assert command("archive_audit", "--older-than-days", "30", "--output", str(newer)).startswith("archived 4 events")

    oldest_first = _verify_archives(older, newer)
    newest_first = _verify_archives(newer, older)

    assert oldest_first[-1].startswith("verified 9 archived events, head ")
    assert newest_first[-1] == oldest_first[-1]
    assert f"archives checked oldest first (by their first seq), in this order: {older}, {newer}" in newest_first
    assert not any(line.startswith("archives checked oldest first") for line in oldest_first)


def _verify_archives(*paths: Path) -> list[str]:
    """``verify_audit --archive`` of ``paths``, in this order: its output lines (it must not fail)."""
    out = io.StringIO()
    options = [option for path in paths for option in ("--archive", str(path))]
    call_command("verify_audit", *options, stdout=out, stderr=io.StringIO())
    return out.getvalue().strip().splitlines()
