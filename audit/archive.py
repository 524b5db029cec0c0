"""Archiving the audit chain (``archive_audit``): events up to a point go to a gzip JSONL file, verified as written, then
leave the table behind a MAC'd checkpoint; archive files are verified on their own or with the table (``verify_audit``
checks every checkpoint against its file)."""

from __future__ import annotations

import contextlib
import datetime as dt
import gzip
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.db.models import Count, Q, QuerySet, Sum
from django.utils import timezone
from django.utils.translation import gettext as _

from agent_platform.errors import ApplicationError
from audit.anchors import file_unwritable, parent_folder_make
from audit.append_only import archive_delete_allow, archive_delete_end
from audit.chain import ChainKeyring, ChainVerifier, checkpoint_message
from audit.chain_keys import chain_keyring
from audit.models import AuditCheckpoint, AuditEvent
from audit.services import audit_chain_catch_up
from audit.verification import _events_as_stored, _nonce_problem, chain_break_words

logger = logging.getLogger(__name__)


# --- tool-call figures (/metrics) ----------------------------------------------------------------------------

# The buckets of /metrics' tool-call latency histogram (seconds).
TOOL_CALL_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def tool_call_reason_label(reason: str) -> str:
    """A reason code as a metric label: an unknown argument's name (the caller's) is left out, so that a model
    that makes up names cannot add a series per name (``args:unknown:regoin`` → ``args:unknown``)."""
    return "args:unknown" if reason.startswith("args:unknown:") else reason


@dataclass
class ToolCallLatency:
    """One server's latency histogram: attempts sent, their total in ms, and how many took at most each bucket
    of ``TOOL_CALL_BUCKETS_S`` (cumulative, as Prometheus')."""

    count: int = 0
    sum_ms: float = 0.0
    le: list[int] = field(default_factory=lambda: [0] * len(TOOL_CALL_BUCKETS_S))

    def add(self, other: ToolCallLatency) -> None:
        self.count += other.count
        self.sum_ms += other.sum_ms
        self.le = [mine + theirs for mine, theirs in zip(self.le, other.le, strict=True)]


@dataclass
class ToolCallFigures:
    """What ``/metrics`` reports of production tool calls (``NOT_PRODUCTION_SOURCES`` left out): counts by (server,
    outcome, reason label), and each server's latency histogram of the attempts sent (``attempt >= 1`` with a
    latency: refusals, memo hits and calls the open circuit refused were never sent)."""

    calls: dict[tuple[str, str, str], int] = field(default_factory=dict)
    latency: dict[str, ToolCallLatency] = field(default_factory=dict)

    def add(self, other: ToolCallFigures) -> None:
        for labels, n in other.calls.items():
            self.calls[labels] = self.calls.get(labels, 0) + n
        for mcp_id, histogram in other.latency.items():
            self.latency.setdefault(mcp_id, ToolCallLatency()).add(histogram)

    def as_json(self) -> dict[str, Any]:
        return {
            "buckets_s": list(TOOL_CALL_BUCKETS_S),
            "calls": [[*labels, n] for labels, n in sorted(self.calls.items())],
            "latency": [[mcp_id, h.count, h.sum_ms, h.le] for mcp_id, h in sorted(self.latency.items())],
        }

    @classmethod
    def from_json(cls, data: Any) -> ToolCallFigures:
        """Figures saved by ``as_json`` (``{}``: none). Saved with other buckets (changed since), each bucket takes
        the count of the largest saved bound at or under it: fewer than were, never a histogram that decreases."""
        figures = cls()
        if not isinstance(data, dict):
            return figures
        for mcp_id, outcome, reason, n in data.get("calls") or []:
            figures.calls[(str(mcp_id), str(outcome), str(reason))] = int(n)
        saved_bounds = [float(b) for b in data.get("buckets_s") or []]
        for mcp_id, count, sum_ms, le in data.get("latency") or []:
            if saved_bounds == list(TOOL_CALL_BUCKETS_S):
                counts = [int(n) for n in le]
            else:
                counts = [
                    max((int(n) for b, n in zip(saved_bounds, le, strict=False) if b <= bound), default=0)
                    for bound in TOOL_CALL_BUCKETS_S
                ]
            figures.latency[str(mcp_id)] = ToolCallLatency(count=int(count), sum_ms=float(sum_ms), le=counts)
        return figures


# Calls that are not live traffic: eval and shadow runs', and an admin's trials (the rule tester's "also call",
# which counted a refused trial as a failing tool). Each is still counted where asked for by source. The auditor's
# figures and /metrics read "production" alike.
NOT_PRODUCTION_SOURCES = (AuditEvent.Source.EVAL, AuditEvent.Source.SHADOW, AuditEvent.Source.ADMIN)


def tool_call_figures(events: QuerySet[AuditEvent]) -> ToolCallFigures:
    """The figures of the production ``tool.call`` events among ``events`` (two aggregate queries)."""
    calls = events.filter(action="tool.call").exclude(source__in=NOT_PRODUCTION_SOURCES)
    figures = ToolCallFigures()
    for row in calls.values("mcp_id", "ok", "reason").annotate(n=Count("id")).order_by():
        labels = (row["mcp_id"], "ok" if row["ok"] else "failed", tool_call_reason_label(row["reason"]))
        figures.calls[labels] = figures.calls.get(labels, 0) + row["n"]
    sent = (
        calls.filter(attempt__gte=1, latency_ms__isnull=False)
        .values("mcp_id")
        .annotate(
            count=Count("id"),
            sum_ms=Sum("latency_ms"),
            **{
                f"le_{i}": Count("id", filter=Q(latency_ms__lte=bound * 1000))
                for i, bound in enumerate(TOOL_CALL_BUCKETS_S)
            },
        )
        .order_by()
    )
    for row in sent:
        figures.latency[row["mcp_id"]] = ToolCallLatency(
            count=int(row["count"] or 0),
            sum_ms=float(row["sum_ms"] or 0.0),
            le=[int(row[f"le_{i}"] or 0) for i in range(len(TOOL_CALL_BUCKETS_S))],
        )
    return figures


def _latest_checkpoint() -> tuple[int, Any]:
    """The latest checkpoint's seq (0: none) and its saved figures."""
    latest = AuditCheckpoint.objects.order_by("-seq").values_list("seq", "tool_calls").first()
    return (0, {}) if latest is None else (int(latest[0]), latest[1])


def tool_call_figures_total() -> ToolCallFigures:
    """The figures of every production tool call ever audited: the events in the table after the latest
    checkpoint, plus what that checkpoint saved of all the events archived before (so ``/metrics``' counters
    never go down when ``archive_audit`` deletes events). Four small queries, however many checkpoints there are.
    Read again when an archive committed in between (the table's events and the checkpoint must be of one state:
    read apart, its events would be counted twice or not at all)."""
    for _attempt in range(3):
        seq, saved = _latest_checkpoint()
        figures = ToolCallFigures.from_json(saved)
        figures.add(tool_call_figures(AuditEvent.objects.filter(seq__gt=seq)))
        if (AuditCheckpoint.objects.order_by("-seq").values_list("seq", flat=True).first() or 0) == seq:
            break
    return figures


# --- archive files -------------------------------------------------------------------------------------------


def _event_line(event: dict[str, Any]) -> str:
    """An event as its archive line: its time and run id in the text the hash takes (as the raw reading gives
    them already, :func:`audit.verification._events_as_stored`; a datetime and a UUID from the ORM's)."""
    line = dict(event)
    created = event["created_at"]
    if isinstance(created, dt.datetime):
        line["created_at"] = created.astimezone(dt.UTC).isoformat(timespec="microseconds")
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
    *,
    older_than_days: int,
    output: Path | str | None = None,
    chunk_size: int = 2000,
    now: dt.datetime | None = None,
    progress: Callable[[str], None] | None = None,
    progress_every: int = 100_000,
) -> ArchiveReport:
    """Move the events older than ``older_than_days`` days out of the database into a gzip JSONL file.

    Takes the longest run of events from the start of the chain that are all older than the cutoff, checks
    their chain while writing them, each event read and checked as ``verify_audit`` reads and checks it (on
    SQLite a time, run id or ``ok`` stored in another form than the platform writes is altered), and that no
    two events share a nonce (a broken chain is never archived: the evidence would be deleted), ends
    the file with ``{"checkpoint": {"seq": S, "hash": H}}``, syncs it to disk, and then in one transaction
    records an :class:`~audit.models.AuditCheckpoint` and deletes events ``seq <= S``: the only delete the
    audit table allows (on PostgreSQL by ``SET LOCAL audit.allow_archive = 'on'``, which the append-only trigger
    reads and which ends with the transaction). Raises ``ApplicationError`` if the chain is broken, the file
    exists or cannot be written (naming why), or the table changed underneath; nothing is deleted then. ``count`` 0 means nothing was old enough.
    ``progress`` is told each step and every ``progress_every`` events written (a long table takes minutes).
    ``output``: the file, or a folder to write it in under its default name (:func:`_archive_path`).
    """
    tell = progress or (lambda _message: None)
    if older_than_days < 0:
        raise ApplicationError(_("--older-than-days must be 0 or more."), code="archive_days")
    cutoff = (now or timezone.now()) - dt.timedelta(days=older_than_days)
    tell(_("chaining the events appended but not chained yet…"))
    audit_chain_catch_up()  # events committed but not chained yet (deferred chaining) are archived with the rest
    verifier = _archive_start(chain_keyring())
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
    # Absolute, so that the checkpoint names the file wherever verify_audit runs (a path relative to this
    # process's working directory would name another file, or none, from any other).
    name = f"audit-{first_seq:012d}-{last_seq:012d}.jsonl.gz"
    path = _archive_path(output, name) if output is not None else Path(settings.VAR_DIR) / "audit-archive" / name
    path = path.resolve()
    if path.exists():
        raise ApplicationError(
            _("%(path)s exists: an archive is never overwritten.") % {"path": path}, code="archive_exists"
        )
    try:
        parent_folder_make(path)
    except OSError as exc:
        raise file_unwritable(path, exc) from exc
    partial = path.with_name(path.name + ".partial")
    tell(
        _("checking and writing seq %(first)s to %(last)s to %(path)s…")
        % {"first": first_seq, "last": last_seq, "path": path}
    )
    try:
        _archive_file_write(
            partial,
            path,
            verifier,
            last_seq=last_seq,
            chunk_size=chunk_size,
            written=lambda count: (
                tell(_("%(count)s events written…") % {"count": f"{count:,}"}) if count % progress_every == 0 else None
            ),
        )
        report.count, report.hash, report.path = verifier.count, verifier.last_hash, path
        tell(_("recording the checkpoint and deleting %(count)s events…") % {"count": f"{report.count:,}"})
        _archive_commit(report)
    except BaseException:
        _file_remove(partial)
        if report.path is not None:
            _file_remove(report.path)
        raise
    return report


def _archive_path(output: Path | str, name: str) -> Path:
    """Where ``--output`` puts the archive: the file it names, or ``name`` inside it where it is a folder (one that
    exists, or one written with a separator at its end: made)."""
    text = os.fspath(output)
    if text.endswith(tuple(sep for sep in (os.sep, os.altsep) if sep)) or Path(text).is_dir():
        return Path(text) / name
    return Path(text)


def _file_remove(path: Path) -> None:
    """Remove what an archive that failed left; an error doing so (a folder it may not write) must not hide why
    it failed."""
    with contextlib.suppress(OSError):
        path.unlink(missing_ok=True)


def _archive_start(keyring: ChainKeyring) -> ChainVerifier:
    """Where the next archive starts: after the latest checkpoint, whose MAC must verify, or at genesis."""
    checkpoint = AuditCheckpoint.objects.order_by("-seq").first()
    if checkpoint is None:
        return ChainVerifier(keyring=keyring)
    why = keyring.check(
        "checkpoint", checkpoint_message(checkpoint.seq, checkpoint.hash, checkpoint.count), checkpoint.mac
    )
    if why is not None:
        raise ApplicationError(
            _("The audit chain is broken, nothing was archived: archive checkpoint seq %(seq)s has %(why)s — forged")
            % {"seq": checkpoint.seq, "why": why},
            code="audit_chain_broken",
        )
    return ChainVerifier(
        start_seq=checkpoint.seq + 1,
        start_prev_hash=checkpoint.hash,
        start_label=f"the hash of the archive checkpoint at seq {checkpoint.seq}",
        keyring=keyring,
    )


def _archive_file_write(
    partial: Path,
    path: Path,
    verifier: ChainVerifier,
    *,
    last_seq: int,
    chunk_size: int,
    written: Callable[[int], None],
) -> None:
    """Write the archive to ``partial``, then put it in ``path``, synced. Raises ApplicationError where the file
    cannot be written (a folder it may not write, a full disk), naming it and why."""
    try:
        _archive_write(partial, verifier, name=path.name, last_seq=last_seq, chunk_size=chunk_size, written=written)
        os.replace(partial, path)
        _fsync_directory(path.parent)
    except OSError as exc:
        raise file_unwritable(path, exc) from exc


def _archive_write(
    partial: Path,
    verifier: ChainVerifier,
    *,
    name: str,
    last_seq: int,
    chunk_size: int,
    written: Callable[[int], None],
) -> None:
    replayed = _nonce_problem()  # a copy chained again: archived with its original, verify_audit would not see it
    if replayed is not None:
        raise ApplicationError(
            _("The audit chain is broken, nothing was archived: %(problem)s") % {"problem": replayed},
            code="audit_chain_broken",
        )
    with partial.open("wb") as raw, gzip.GzipFile(filename=name, fileobj=raw, mode="wb") as compressed:
        for event, checked in _events_as_stored(chunk_size=chunk_size, up_to_seq=last_seq):
            problem = verifier.feed(event, checked=checked)
            if problem is not None:
                raise ApplicationError(
                    _("The audit chain is broken, nothing was archived: %(problem)s")
                    % {"problem": chain_break_words(problem)},
                    code="audit_chain_broken",
                )
            compressed.write(_event_line(event).encode("utf-8") + b"\n")
            written(verifier.count)
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
    mac = chain_keyring().sign("checkpoint", checkpoint_message(report.last_seq, report.hash, report.count))
    with transaction.atomic(), connection.cursor() as cursor:
        # What /metrics counted of the events about to leave the table, added to what the previous checkpoint saved.
        previous_seq, saved = _latest_checkpoint()
        figures = ToolCallFigures.from_json(saved)
        figures.add(tool_call_figures(AuditEvent.objects.filter(seq__gt=previous_seq, seq__lte=report.last_seq)))
        archive_delete_allow(cursor, connection)
        AuditCheckpoint.objects.create(
            seq=report.last_seq,
            hash=report.hash,
            file_name=str(report.path),
            count=report.count,
            mac=mac,
            tool_calls=figures.as_json(),
        )
        cursor.execute(f"DELETE FROM {events_table} WHERE seq <= %s", [report.last_seq])  # noqa: S608
        deleted = cursor.rowcount
        archive_delete_end(cursor, connection)
        if deleted != report.count:
            raise ApplicationError(
                _("The audit table changed while archiving (%(deleted)s events to delete, %(count)s archived).")
                % {"deleted": deleted, "count": report.count},
                code="archive_conflict",
                status=409,
            )
