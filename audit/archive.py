"""Archiving the audit chain (``archive_audit``): events up to a point go to a gzip JSONL file, verified as written, then
leave the table behind a MAC'd checkpoint; archive files are verified on their own or with the table (``verify_audit``
checks every checkpoint against its file)."""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import fcntl
import gzip
import json
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, transaction
from django.db.models import Case, Count, F, Q, QuerySet, Sum, Value, When
from django.utils import timezone
from django.utils.translation import gettext as _

from agent_platform.errors import ApplicationError
from agent_platform.os_errors import os_error_text
from audit.anchors import file_unwritable, parent_folder_make
from audit.append_only import archive_delete_allow, archive_delete_end
from audit.chain import ChainKeyring, ChainVerifier, checkpoint_message
from audit.chain_keys import chain_keyring
from audit.models import AuditCheckpoint, AuditEvent
from audit.services import audit_chain_catch_up, audit_event_record
from audit.verification import _events_as_stored, _nonce_problem, chain_break_words

logger = logging.getLogger(__name__)

# How an archive records itself in the chain (the event that says which events it deleted, into which file).
ARCHIVE_ACTION = "audit.archive"
ARCHIVE_ACTOR = "system:archive_audit"
# The archive runs' advisory lock on PostgreSQL (a constant of our own: "audit_ar" in ASCII).
_ARCHIVE_LOCK_KEY = 0x61756469745F6172


# --- tool-call figures (/metrics) ----------------------------------------------------------------------------

# The buckets of /metrics' tool-call latency histogram (seconds).
TOOL_CALL_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


# The ``tool`` label of calls to a name no server lists (``tool:unknown`` refusals, and refusals that name no server):
# the caller's made-up names fold into this one value, so that a model cannot add a series per name.
UNKNOWN_TOOL = "(unknown)"
# The ``tool`` label of the calls a checkpoint saved before the saved figures kept the tool (the tool of events
# archived then is in the archive files only): their counts stay, under this one value, and never go down.
ARCHIVED_TOOL = "(archived)"


def tool_call_reason_label(reason: str) -> str:
    """A reason code as a metric label: an unknown argument's name (the caller's) is left out, so that a model
    that makes up names cannot add a series per name (``args:unknown:regoin`` → ``args:unknown``)."""
    return "args:unknown" if reason.startswith("args:unknown:") else reason


def _tool_label() -> Case:
    """An event's tool as a metric label: its own where its server resolved it, ``UNKNOWN_TOOL`` where the gate
    refused the name as unknown or no server was named (the name is then the caller's text). Read from the event
    alone, so the label a call counts under never changes afterwards (a counter never moves between series)."""
    return Case(When(Q(reason="tool:unknown") | Q(mcp_id=""), then=Value(UNKNOWN_TOOL)), default=F("tool"))


@dataclass
class ToolCallLatency:
    """One tool's latency histogram: attempts sent, their total in ms, and how many took at most each bucket
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
    tool label, outcome, reason label), and each (server, tool label)'s latency histogram of the attempts sent
    (``attempt >= 1`` with a latency: refusals, memo hits and calls the open circuit refused were never sent)."""

    calls: dict[tuple[str, str, str, str], int] = field(default_factory=dict)
    latency: dict[tuple[str, str], ToolCallLatency] = field(default_factory=dict)

    def add(self, other: ToolCallFigures) -> None:
        for labels, n in other.calls.items():
            self.calls[labels] = self.calls.get(labels, 0) + n
        for key, histogram in other.latency.items():
            self.latency.setdefault(key, ToolCallLatency()).add(histogram)

    def as_json(self) -> dict[str, Any]:
        return {
            "buckets_s": list(TOOL_CALL_BUCKETS_S),
            "calls": [[*labels, n] for labels, n in sorted(self.calls.items())],
            "latency": [[*key, h.count, h.sum_ms, h.le] for key, h in sorted(self.latency.items())],
        }

    @classmethod
    def from_json(cls, data: Any) -> ToolCallFigures:
        """Figures saved by ``as_json`` (``{}``: none). Saved with other buckets (changed since), each bucket takes
        the count of the largest saved bound at or under it: fewer than were, never a histogram that decreases.
        Saved before the figures kept the tool (rows one shorter), they count under ``ARCHIVED_TOOL``."""
        figures = cls()
        if not isinstance(data, dict):
            return figures
        for row in data.get("calls") or []:
            mcp_id, tool, outcome, reason, n = row if len(row) == 5 else (row[0], ARCHIVED_TOOL, *row[1:])
            labels = (str(mcp_id), str(tool), str(outcome), str(reason))
            figures.calls[labels] = figures.calls.get(labels, 0) + int(n)
        saved_bounds = [float(b) for b in data.get("buckets_s") or []]
        for row in data.get("latency") or []:
            mcp_id, tool, count, sum_ms, le = row if len(row) == 5 else (row[0], ARCHIVED_TOOL, *row[1:])
            if saved_bounds == list(TOOL_CALL_BUCKETS_S):
                counts = [int(n) for n in le]
            else:
                counts = [
                    max((int(n) for b, n in zip(saved_bounds, le, strict=False) if b <= bound), default=0)
                    for bound in TOOL_CALL_BUCKETS_S
                ]
            figures.latency.setdefault((str(mcp_id), str(tool)), ToolCallLatency()).add(
                ToolCallLatency(count=int(count), sum_ms=float(sum_ms), le=counts)
            )
        return figures


# Calls that are not live traffic: eval and shadow runs', and an admin's trials (the rule tester's "also call",
# which counted a refused trial as a failing tool). Each is still counted where asked for by source. The auditor's
# figures and /metrics read "production" alike.
NOT_PRODUCTION_SOURCES = (AuditEvent.Source.EVAL, AuditEvent.Source.SHADOW, AuditEvent.Source.ADMIN)


def tool_call_figures(events: QuerySet[AuditEvent]) -> ToolCallFigures:
    """The figures of the production ``tool.call`` events among ``events`` (two aggregate queries)."""
    calls = (
        events.filter(action="tool.call").exclude(source__in=NOT_PRODUCTION_SOURCES).annotate(tool_label=_tool_label())
    )
    figures = ToolCallFigures()
    for row in calls.values("mcp_id", "tool_label", "ok", "reason").annotate(n=Count("id")).order_by():
        labels = (
            row["mcp_id"],
            row["tool_label"],
            "ok" if row["ok"] else "failed",
            tool_call_reason_label(row["reason"]),
        )
        figures.calls[labels] = figures.calls.get(labels, 0) + row["n"]
    sent = (
        calls.filter(attempt__gte=1, latency_ms__isnull=False)
        .values("mcp_id", "tool_label")
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
        figures.latency[(row["mcp_id"], row["tool_label"])] = ToolCallLatency(
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

    One run at a time (:func:`_archive_lock`; a second is refused, nothing done). The file is written as
    ``<name>.partial``, created by this run only (``O_EXCL``), and takes its name only after the checkpoint
    committed (a link that never replaces a file): a file under an archive's name always has its checkpoint. In
    the transaction of the checkpoint and the delete, an ``audit.archive`` event (actor ``system:archive_audit``)
    records the seq range, count, file and hash; it follows the events it describes, so it stays in the table.
    """
    tell = progress or (lambda _message: None)
    if older_than_days < 0:
        raise ApplicationError(_("--older-than-days must be 0 or more."), code="archive_days")
    with _archive_lock():
        return _archive_locked(
            output=output,
            chunk_size=chunk_size,
            tell=tell,
            progress_every=progress_every,
            cutoff=(now or timezone.now()) - dt.timedelta(days=older_than_days),
        )


def _archive_locked(
    *,
    output: Path | str | None,
    chunk_size: int,
    tell: Callable[[str], None],
    progress_every: int,
    cutoff: dt.datetime,
) -> ArchiveReport:
    tell(_("chaining the events appended but not chained yet…"))
    audit_chain_catch_up()  # events committed but not chained yet (deferred chaining) are archived with the rest
    verifier = _archive_start(chain_keyring())
    _interrupted_publish(tell)
    first_seq = verifier.next_seq
    first_young = AuditEvent.objects.filter(created_at__gte=cutoff).order_by("seq").values_list("seq", flat=True)
    young = first_young.first()
    if young is not None:
        last_seq = young - 1
    else:
        last_seq = AuditEvent.objects.order_by("-seq").values_list("seq", flat=True).first() or 0
    in_range = AuditEvent.objects.filter(seq__gte=first_seq, seq__lte=last_seq)
    if last_seq >= first_seq and not in_range.exclude(action=ARCHIVE_ACTION).exists():
        last_seq = first_seq - 1  # only archives' own events: an archive of them would record one more, each time
    report = ArchiveReport(first_seq=first_seq, last_seq=last_seq)
    if last_seq < first_seq:
        return report
    # Absolute, so that the checkpoint names the file wherever verify_audit runs (a path relative to this
    # process's working directory would name another file, or none, from any other).
    name = f"audit-{first_seq:012d}-{last_seq:012d}.jsonl.gz"
    path = _archive_path(output, name) if output is not None else Path(settings.VAR_DIR) / "audit-archive" / name
    path = path.resolve()
    named = AuditCheckpoint.objects.filter(file_name=str(path)).exists()
    if path.exists() and not named:
        raise ApplicationError(
            _(
                "%(path)s exists: an archive is never overwritten. No archive checkpoint names it: an archive_audit "
                "run interrupted before it committed may have left it (its events are still in the table); move it "
                "away and run archive_audit again."
            )
            % {"path": path},
            code="archive_exists",
        )
    if path.exists():
        raise ApplicationError(
            _("%(path)s exists: an archive is never overwritten.") % {"path": path}, code="archive_exists"
        )
    try:
        parent_folder_make(path)
    except OSError as exc:
        raise file_unwritable(path, exc) from exc
    partial = _partial_of(path)
    if partial.is_file() and not named:  # no run writes it now (the lock): a run killed before it committed left it
        tell(_("removing %(path)s, left by an archive_audit run that was interrupted…") % {"path": partial})
        _file_remove(partial)
    tell(
        _("checking and writing seq %(first)s to %(last)s to %(path)s…")
        % {"first": first_seq, "last": last_seq, "path": path}
    )
    created = False
    try:
        try:
            raw = os.fdopen(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "wb")
        except OSError as exc:
            why = IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR)) if partial.is_dir() else exc
            raise file_unwritable(path, why) from exc  # a folder there: O_EXCL says it exists
        created = True
        _archive_file_write(
            raw,
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
        _archive_commit(report, start_seq=first_seq - 1)
    except BaseException:
        if created:  # only the file this run made: never a file another run wrote or published
            _file_remove(partial)
        raise
    _archive_publish(partial, path)
    return report


@contextlib.contextmanager
def _archive_lock() -> Iterator[None]:
    """Hold the archive runs' lock for the whole run, or refuse at once where another run holds it: two runs
    picked the same events and file, and the later one's cleanup removed the archive the first had committed.
    PostgreSQL: a session advisory lock of its own on the run's connection; SQLite: an exclusive ``flock`` on
    ``<database file>.archive-lock`` (in ``VAR_DIR`` for a database in memory). Both end with the process."""
    connection = connections[DEFAULT_DB_ALIAS]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_lock(%s)", [_ARCHIVE_LOCK_KEY])
            taken = cursor.fetchone()[0]
        if not taken:
            raise _archive_busy()
        try:
            yield
        finally:
            try:
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_advisory_unlock(%s)", [_ARCHIVE_LOCK_KEY])
            except DatabaseError:  # a broken connection: closing it lets go of the lock
                connection.close()
        return
    name = str(connection.settings_dict["NAME"])
    in_memory = name == ":memory:" or "mode=memory" in name or not name
    lock_path = Path(settings.VAR_DIR) / "audit-archive.lock" if in_memory else Path(name + ".archive-lock")
    try:
        descriptor = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise file_unwritable(lock_path, exc) from exc
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _archive_busy() from None
        yield
    finally:
        os.close(descriptor)  # lets go of the lock


def _archive_busy() -> ApplicationError:
    return ApplicationError(
        _("Another archive_audit is running on this database; nothing was archived. Run it again when it has ended."),
        code="archive_busy",
        status=409,
    )


def _partial_of(path: Path) -> Path:
    """Where the archive for ``path`` is written until its checkpoint commits."""
    return path.with_name(path.name + ".partial")


# Where a folder's file system makes no hard links (exFAT, some network and FUSE mounts).
_NO_LINKS = frozenset({errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.ENOSYS, errno.EMLINK})


def _archive_publish(partial: Path, path: Path) -> None:
    """Give the committed archive its name: a link (which never replaces a file), then the partial name goes. Where
    the file system makes no links, a rename where nothing has the name (the archive runs' lock is held: no other
    run names a file meanwhile)."""
    try:
        try:
            os.link(partial, path)
        except OSError as exc:
            if exc.errno not in _NO_LINKS or path.exists():
                raise
            os.rename(partial, path)
        else:
            partial.unlink()
        _fsync_directory(path.parent)
    except OSError as exc:
        raise ApplicationError(
            _(
                "The checkpoint is recorded and the events were deleted, but the archive could not be named %(path)s "
                "(%(why)s): it is %(partial)s."
            )
            % {"path": path, "why": os_error_text(exc), "partial": partial},
            code="archive_unpublished",
        ) from exc


def _interrupted_publish(tell: Callable[[str], None]) -> None:
    """Name the latest checkpoint's archive where the run that committed it was interrupted before it did (its
    file still ``.partial``, complete and synced before the commit)."""
    latest = AuditCheckpoint.objects.order_by("-seq").values_list("file_name", flat=True).first()
    if latest is None:
        return
    path = Path(latest)
    partial = _partial_of(path)
    if path.exists() or not partial.exists():
        return
    tell(_("naming %(path)s: the archive_audit run that committed it was interrupted before it did…") % {"path": path})
    _archive_publish(partial, path)


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
    raw: Any,
    partial: Path,
    path: Path,
    verifier: ChainVerifier,
    *,
    last_seq: int,
    chunk_size: int,
    written: Callable[[int], None],
) -> None:
    """Write the archive to ``raw`` (``partial``, open), synced, with its folder. Raises ApplicationError where the
    file cannot be written (a folder it may not write, a full disk), naming it and why."""
    try:
        _archive_write(raw, verifier, name=path.name, last_seq=last_seq, chunk_size=chunk_size, written=written)
        _fsync_directory(path.parent)
    except OSError as exc:
        raise file_unwritable(path, exc) from exc


def _archive_write(
    raw: Any,
    verifier: ChainVerifier,
    *,
    name: str,
    last_seq: int,
    chunk_size: int,
    written: Callable[[int], None],
) -> None:
    replayed = _nonce_problem()  # a copy chained again: archived with its original, verify_audit would not see it
    if replayed is not None:
        raw.close()
        raise ApplicationError(
            _("The audit chain is broken, nothing was archived: %(problem)s") % {"problem": replayed},
            code="audit_chain_broken",
        )
    with raw, gzip.GzipFile(filename=name, fileobj=raw, mode="wb") as compressed:
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


def _archive_commit(report: ArchiveReport, *, start_seq: int) -> None:
    """Record the checkpoint, delete the archived events and record the archive's own event, in one transaction;
    refused (nothing deleted) where the latest checkpoint is no longer ``start_seq``, the one the run started
    after, or the table changed underneath."""
    connection = connections[DEFAULT_DB_ALIAS]
    events_table = connection.ops.quote_name(AuditEvent._meta.db_table)
    mac = chain_keyring().sign("checkpoint", checkpoint_message(report.last_seq, report.hash, report.count))
    with transaction.atomic(), connection.cursor() as cursor:
        # What /metrics counted of the events about to leave the table, added to what the previous checkpoint saved.
        previous_seq, saved = _latest_checkpoint()
        if previous_seq != start_seq:
            raise ApplicationError(
                _(
                    "Another archive committed while this one ran (the latest checkpoint is seq %(seq)s, this run "
                    "started after seq %(start)s); nothing was deleted."
                )
                % {"seq": previous_seq, "start": start_seq},
                code="archive_conflict",
                status=409,
            )
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
        # The archive's own record, after the events it deleted (its seq is the head's next): chained like any
        # event, never in the range it describes. Not a tool call: the auditor's figures and /metrics skip it.
        audit_event_record(
            source=AuditEvent.Source.ADMIN,
            action=ARCHIVE_ACTION,
            actor=ARCHIVE_ACTOR,
            args={
                "first_seq": report.first_seq,
                "last_seq": report.last_seq,
                "count": report.count,
                "file": str(report.path),
                "hash": report.hash,
            },
        )
