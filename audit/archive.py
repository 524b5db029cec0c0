"""Archiving the audit chain (``archive_audit``): events up to a point go to a gzip JSONL file, verified as written, then
leave the table behind a checkpoint; archive files are verified on their own or with the table."""

from __future__ import annotations

import datetime as dt
import gzip
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from agent_platform.errors import ApplicationError
from audit.chain import HASHED_FIELDS, ChainBreak, ChainVerifier
from audit.models import AuditCheckpoint, AuditEvent
from audit.verification import ChainReport, _chain_start, _events_in_chain_order

logger = logging.getLogger(__name__)

_HEAD_ID = 1
_EVENT_FIELDS = ("id", *HASHED_FIELDS, "hash")
_CHECKPOINT_FILE_SALT = "audit.verify_audit.checkpoint"


# --- archive files -------------------------------------------------------------------------------------------


def _event_line(event: dict[str, Any]) -> str:
    line = dict(event)
    line["created_at"] = event["created_at"].astimezone(dt.UTC).isoformat(timespec="microseconds")
    line["run_id"] = None if event["run_id"] is None else str(event["run_id"])
    return json.dumps(line, ensure_ascii=False, sort_keys=True)


@dataclass
class ArchiveReport:
    """What ``archive_audit`` did: ``count`` events, seq ``first_seq`` to ``last_seq``, into ``path``."""

    count: int = 0
    first_seq: int = 0
    last_seq: int = 0
    hash: str = ""
    path: Path | None = None


def audit_events_archive(
    *, older_than_days: int, output: Path | None = None, chunk_size: int = 2000, now: dt.datetime | None = None
) -> ArchiveReport:
    """Move the events older than ``older_than_days`` days out of the database into a gzip JSONL file.

    Takes the longest run of events from the start of the chain that are all older than the cutoff, checks
    their chain while writing them (a broken chain is never archived: the evidence would be deleted), ends
    the file with ``{"checkpoint": {"seq": S, "hash": H}}``, syncs it to disk, and then in one transaction
    records an :class:`~audit.models.AuditCheckpoint` and deletes events ``seq <= S``: the only delete the
    audit table allows (on PostgreSQL by ``SET LOCAL audit.allow_archive = 'on'``, which the append-only trigger
    reads and which ends with the transaction). Raises ``ApplicationError`` if the chain is broken, the file
    exists, or the table changed underneath; nothing is deleted then. ``count`` 0 means nothing was old enough.
    """
    if older_than_days < 0:
        raise ApplicationError(_("--older-than-days must be 0 or more."), code="archive_days")
    cutoff = (now or timezone.now()) - dt.timedelta(days=older_than_days)
    verifier, _checkpoint = _chain_start()
    first_seq = verifier.next_seq
    first_young = AuditEvent.objects.filter(created_at__gte=cutoff).order_by("seq").values_list("seq", flat=True)
    young = first_young.first()
    if young is not None:
        last_seq = young - 1
    else:
        last_seq = AuditEvent.objects.order_by("-seq").values_list("seq", flat=True).first() or 0
    report = ArchiveReport(first_seq=first_seq, last_seq=last_seq)
    if last_seq < first_seq:
        return report
    path = output or Path(settings.VAR_DIR) / "audit-archive" / f"audit-{first_seq:012d}-{last_seq:012d}.jsonl.gz"
    if path.exists():
        raise ApplicationError(
            _("%(path)s exists: an archive is never overwritten.") % {"path": path}, code="archive_exists"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    try:
        _archive_write(partial, verifier, name=path.name, last_seq=last_seq, chunk_size=chunk_size)
        os.replace(partial, path)
        _fsync_directory(path.parent)
        report.count, report.hash, report.path = verifier.count, verifier.last_hash, path
        _archive_commit(report)
    except BaseException:
        partial.unlink(missing_ok=True)
        if report.path is not None:
            report.path.unlink(missing_ok=True)
        raise
    return report


def _archive_write(partial: Path, verifier: ChainVerifier, *, name: str, last_seq: int, chunk_size: int) -> None:
    with partial.open("wb") as raw, gzip.GzipFile(filename=name, fileobj=raw, mode="wb") as compressed:
        for event in _events_in_chain_order(chunk_size=chunk_size, up_to_seq=last_seq):
            problem = verifier.feed(event)
            if problem is not None:
                raise ApplicationError(
                    _("The audit chain is broken, nothing was archived: %(problem)s") % {"problem": problem.message},
                    code="audit_chain_broken",
                )
            compressed.write(_event_line(event).encode("utf-8") + b"\n")
        if verifier.last_seq != last_seq:
            raise ApplicationError(
                _("The audit chain is broken, nothing was archived: seq %(seq)s missing — removed")
                % {"seq": verifier.last_seq + 1},
                code="audit_chain_broken",
            )
        checkpoint = {"checkpoint": {"seq": verifier.last_seq, "hash": verifier.last_hash}}
        compressed.write(json.dumps(checkpoint).encode("utf-8") + b"\n")
        compressed.close()
        raw.flush()
        os.fsync(raw.fileno())


def _fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _archive_commit(report: ArchiveReport) -> None:
    connection = connections[DEFAULT_DB_ALIAS]
    events_table = connection.ops.quote_name(AuditEvent._meta.db_table)
    with transaction.atomic(), connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SET LOCAL audit.allow_archive = 'on'")
        AuditCheckpoint.objects.create(
            seq=report.last_seq, hash=report.hash, file_name=str(report.path), count=report.count
        )
        cursor.execute(f"DELETE FROM {events_table} WHERE seq <= %s", [report.last_seq])  # noqa: S608
        if cursor.rowcount != report.count:
            raise ApplicationError(
                _("The audit table changed while archiving (%(deleted)s events to delete, %(count)s archived).")
                % {"deleted": cursor.rowcount, "count": report.count},
                code="archive_conflict",
                status=409,
            )


def audit_archive_verify(paths: list[Path]) -> tuple[ChainReport, list[str]]:
    """Check archive files, in the order given, as one chain: each line's hash, links and seq continuity,
    the final checkpoint line against the last event, and where the database still records a checkpoint at
    a file's start or end, that it agrees. Returns the report and one summary line per file."""
    report = ChainReport()
    summaries: list[str] = []
    verifier: ChainVerifier | None = None
    recorded = dict(AuditCheckpoint.objects.values_list("seq", "hash"))
    for path in paths:
        try:
            verifier, summary = _archive_file_verify(path, verifier, recorded, report)
        except (OSError, EOFError, gzip.BadGzipFile, UnicodeDecodeError) as exc:
            report.problem = f"archive {path}: unreadable ({exc})"
        if report.problem:
            return report, summaries
        summaries.append(summary)
        report.count += verifier.count
        report.head_seq, report.head_hash = verifier.last_seq, verifier.last_hash
    return report, summaries


def _archive_file_verify(
    path: Path, previous: ChainVerifier | None, recorded: dict[int, str], report: ChainReport
) -> tuple[ChainVerifier, str]:
    verifier: ChainVerifier | None = None
    checkpoint: dict[str, Any] | None = None
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        for number, text in enumerate(lines, start=1):
            try:
                line = json.loads(text)
            except ValueError:
                report.problem = f"archive {path} line {number}: not JSON — altered"
                break
            if checkpoint is not None:
                report.problem = f"archive {path} line {number}: after the checkpoint line — inserted"
                break
            if isinstance(line, dict) and "checkpoint" in line:
                checkpoint = line["checkpoint"]
                continue
            if not isinstance(line, dict) or "seq" not in line:
                report.problem = f"archive {path} line {number}: not an event — altered"
                break
            if verifier is None:
                verifier = _archive_verifier(path, line, previous, recorded, report)
                if verifier is None:
                    break
            problem = verifier.feed(line)
            if problem is not None:
                report.problem = f"archive {path}: {problem.message}"
                break
    if report.problem:
        return verifier or ChainVerifier(), ""
    if verifier is None:
        report.problem = f"archive {path}: no events"
        return ChainVerifier(), ""
    if not isinstance(checkpoint, dict):
        report.problem = f"archive {path}: no checkpoint line — truncated"
        return verifier, ""
    tail = verifier.check_tail(
        head_seq=checkpoint.get("seq", -1), head_hash=checkpoint.get("hash"), head_label="checkpoint"
    )
    if tail is None and verifier.last_seq != checkpoint.get("seq"):
        tail = ChainBreak("inserted", verifier.last_seq, verifier.last_id, "events after the checkpoint — inserted")
    if tail is not None:
        report.problem = f"archive {path}: {tail.message}"
    elif verifier.last_seq in recorded and recorded[verifier.last_seq] != verifier.last_hash:
        report.problem = f"archive {path}: checkpoint seq {verifier.last_seq} differs from the database's — replaced"
    first = verifier.last_seq - verifier.count + 1
    return (
        verifier,
        f"archive {path}: verified {verifier.count} events (seq {first} to {verifier.last_seq}), checkpoint {verifier.last_hash}",
    )


def _archive_verifier(
    path: Path, first: dict[str, Any], previous: ChainVerifier | None, recorded: dict[int, str], report: ChainReport
) -> ChainVerifier | None:
    """Where a file's chain starts: after the previous file, at genesis, or after a recorded checkpoint."""
    if previous is not None:
        return ChainVerifier(
            start_seq=previous.next_seq,
            start_prev_hash=previous.last_hash,
            start_label="the previous file's checkpoint",
        )
    seq = first["seq"]
    if isinstance(seq, int) and seq > 1:
        before = recorded.get(seq - 1)
        if before is not None:
            return ChainVerifier(
                start_seq=seq,
                start_prev_hash=before,
                start_label=f"the hash of the archive checkpoint at seq {seq - 1}",
            )
        report.notes.append(
            f"archive {path} starts at seq {seq}: its link to seq {seq - 1} is not checked (pass the earlier archive first)"
        )
        return ChainVerifier(start_seq=seq, start_prev_hash=str(first.get("prev_hash")))
    return ChainVerifier()
