"""Writes to the audit record, and its verification and archiving. Everything stored here is masked first.

The record is a hash chain (``audit/chain.py``). How it stays gap-free with many writers: every append runs
in one transaction that (1) locks the single :class:`~audit.models.AuditChainHead` row (``SELECT ... FOR
UPDATE`` on PostgreSQL; on SQLite the transaction begins with ``BEGIN IMMEDIATE``, which already takes the
database's one write lock), (2) takes ``seq = head.seq + 1`` and ``prev_hash = head.hash``, (3) inserts the
event with its hash and (4) moves the head to it. Writers therefore append one at a time, each seeing its
predecessor committed, and a rolled-back append gives its seq back with the rest of its transaction. The
lock is held until the caller's transaction ends: write the audit event late and commit soon after.
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core import signing
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.db.models import TextField
from django.db.models.functions import Cast
from django.utils import timezone
from django.utils.translation import gettext as _

from agent_platform.errors import ApplicationError
from agent_platform.json import UnicodeJSONEncoder
from audit.chain import GENESIS_HASH, HASHED_FIELDS, ChainBreak, ChainVerifier, event_hash, json_value
from audit.masking import mask_value, truncate
from audit.models import AuditChainHead, AuditCheckpoint, AuditEvent

logger = logging.getLogger(__name__)

_HEAD_ID = 1
_EVENT_FIELDS = ("id", *HASHED_FIELDS, "hash")
_CHECKPOINT_FILE_SALT = "audit.verify_audit.checkpoint"


def audit_event_record(
    *,
    source: str,
    action: str = "tool.call",
    run_id: Any = None,
    mcp_id: str = "",
    tool: str = "",
    call_id: str = "",
    args: dict[str, Any] | None = None,
    result: Any = None,
    ok: bool = True,
    reason: str = "",
    attempt: int = 1,
    latency_ms: float | None = None,
    actor: str = "",
    secrets: Iterable[str] = (),
) -> AuditEvent:
    """Append one audit event to the chain. Arguments and result are masked (key names, value patterns and
    the exact ``secrets`` given, plus every registered secret) and the result is truncated before it is stored.

    Runs in its own transaction, or inside the caller's, which then holds the chain head until it commits (see
    the module docstring); if the append fails there, the caller's transaction can only roll back: a change is
    never committed without its audit event. Returns the saved event with its ``seq`` and ``hash``.
    """
    secret_list = list(secrets)
    masked_result = truncate(
        mask_value(result, secrets=secret_list), max_chars=settings.PLATFORM_AUDIT_RESULT_MAX_CHARS
    )
    # Stored as the database gives them back (dates and decimals as text), so that the hash taken now is the
    # hash recomputed from the row later; and hashed in the chain's number form, parsed from the same text.
    stored_args, hashed_args = _stored_json(mask_value(args or {}, secrets=secret_list))
    stored_result, hashed_result = _stored_json(masked_result)
    event = AuditEvent(
        run_id=AuditEvent._meta.get_field("run_id").to_python(run_id),
        source=str(source),
        action=str(action),
        mcp_id=str(mcp_id),
        tool=str(tool),
        call_id=str(call_id)[:100],
        args=stored_args,
        result=stored_result,
        ok=bool(ok),
        reason=str(reason)[:200],
        attempt=int(attempt),
        latency_ms=None if latency_ms is None else float(latency_ms),
        actor=str(actor)[:200],
    )
    _chain_append(event, hashed_json={"args": hashed_args, "result": hashed_result})
    return event


_STORED_JSON = UnicodeJSONEncoder()  # what the JSONFields store with


def _stored_json(value: Any) -> tuple[Any, Any]:
    """``value`` as the database will give it back, and the same in the form the chain hashes."""
    if value is None:
        return None, None
    text = _STORED_JSON.encode(value)
    return json.loads(text), json_value(text)


def _chain_append(event: AuditEvent, *, hashed_json: dict[str, Any], using: str = DEFAULT_DB_ALIAS) -> None:
    connection = connections[using]
    head_table = connection.ops.quote_name(AuditChainHead._meta.db_table)
    # No savepoint inside a caller's transaction: cheaper, and a failed append fails the whole transaction.
    with transaction.atomic(using=using, savepoint=False), connection.cursor() as cursor:
        seq, prev_hash = _chain_head_locked(cursor, connection, head_table)
        event.seq = seq + 1
        event.prev_hash = prev_hash
        event.created_at = timezone.now()  # taken under the lock: time never runs backwards along the chain
        event.hash = event_hash({**_hashed_values(event), **hashed_json})
        event.save(force_insert=True, using=using)
        cursor.execute(f"UPDATE {head_table} SET seq = %s, hash = %s WHERE id = %s", [event.seq, event.hash, _HEAD_ID])  # noqa: S608 - table name from the model


def _hashed_values(event: AuditEvent) -> dict[str, Any]:
    return {
        "seq": event.seq,
        "prev_hash": event.prev_hash,
        "created_at": event.created_at,
        "run_id": event.run_id,
        "source": event.source,
        "action": event.action,
        "mcp_id": event.mcp_id,
        "tool": event.tool,
        "call_id": event.call_id,
        "args": event.args,
        "result": event.result,
        "ok": event.ok,
        "reason": event.reason,
        "attempt": event.attempt,
        "latency_ms": event.latency_ms,
        "actor": event.actor,
    }


def _chain_head_locked(cursor: Any, connection: Any, head_table: str) -> tuple[int, str]:
    """The head's (seq, hash), locked for the rest of the transaction; created if its row is missing."""
    lock = " FOR UPDATE" if connection.features.has_select_for_update else ""
    select = f"SELECT seq, hash FROM {head_table} WHERE id = %s{lock}"  # noqa: S608 - table name from the model
    cursor.execute(select, [_HEAD_ID])
    row = cursor.fetchone()
    if row is None:
        seq, digest = _chain_end_in_table()
        if seq:
            logger.error("the audit chain head was missing; re-created from the last event (seq %s)", seq)
        cursor.execute(
            f"INSERT INTO {head_table} (id, seq, hash) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",  # noqa: S608
            [_HEAD_ID, seq, digest],
        )
        cursor.execute(select, [_HEAD_ID])
        row = cursor.fetchone()
    return int(row[0]), str(row[1])


def _chain_end_in_table() -> tuple[int, str]:
    """The last event's (seq, hash), else the latest checkpoint's, else the start of a chain."""
    last = AuditEvent.objects.order_by("-seq").values_list("seq", "hash").first()
    if last is None:
        last = AuditCheckpoint.objects.order_by("-seq").values_list("seq", "hash").first()
    return (int(last[0]), str(last[1])) if last else (0, GENESIS_HASH)


# --- verification --------------------------------------------------------------------------------------------


@dataclass
class ChainReport:
    """What ``verify_audit`` found: ``problem`` names the first altered, removed or inserted event, or is None."""

    count: int = 0
    head_seq: int = 0
    head_hash: str = GENESIS_HASH
    problem: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.problem is None


def _chain_start() -> tuple[ChainVerifier, AuditCheckpoint | None]:
    checkpoint = AuditCheckpoint.objects.order_by("-seq").first()
    if checkpoint is None:
        return ChainVerifier(), None
    verifier = ChainVerifier(
        start_seq=checkpoint.seq + 1,
        start_prev_hash=checkpoint.hash,
        start_label=f"the hash of the archive checkpoint at seq {checkpoint.seq}",
    )
    return verifier, checkpoint


def _events_in_chain_order(
    *, chunk_size: int, up_to_seq: int | None = None, as_hashed: bool = False
) -> Iterator[dict[str, Any]]:
    """Events as dicts of ``id``, the hashed fields and ``hash``, in seq order, ``chunk_size`` rows at a time.

    ``as_hashed`` reads ``args`` and ``result`` from their JSON text straight into the form the hash takes
    (integral floats as ints): a third faster to verify. Without it they are as the ORM gives them.
    """
    events = AuditEvent.objects.order_by("seq")
    if up_to_seq is not None:
        events = events.filter(seq__lte=up_to_seq)
    if not as_hashed:
        return events.values(*_EVENT_FIELDS).iterator(chunk_size=chunk_size)
    plain = [name for name in _EVENT_FIELDS if name not in ("args", "result")]
    rows = events.annotate(args_json=Cast("args", TextField()), result_json=Cast("result", TextField()))
    return _with_json_values(rows.values(*plain, "args_json", "result_json").iterator(chunk_size=chunk_size))


def _with_json_values(rows: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for row in rows:
        args, result = row.pop("args_json"), row.pop("result_json")
        row["args"] = None if args is None else json_value(args)
        row["result"] = None if result is None else json_value(result)
        yield row


def _head_now() -> tuple[int, str] | None:
    row = AuditChainHead.objects.filter(pk=_HEAD_ID).values_list("seq", "hash").first()
    return (int(row[0]), str(row[1])) if row else None


def _inserted_after_head(head_seq: int) -> str:
    first = AuditEvent.objects.filter(seq__gt=head_seq).order_by("seq").values_list("seq", "id").first()
    if first is None:
        return f"chain head says seq {head_seq}, behind the chain it vouches for — head rolled back"
    return f"event seq {first[0]} (id {first[1]}): after the chain head (seq {head_seq}) — inserted"


def audit_chain_verify(
    *,
    checkpoint_file: Path | None = None,
    progress: Callable[[int], None] | None = None,
    progress_every: int = 100_000,
    chunk_size: int = 2000,
) -> ChainReport:
    """Walk the whole chain in ``seq`` order, streaming, and compare its end with the chain head.

    Starts after the latest archive checkpoint (or at seq 1 from the genesis hash), recomputes every hash,
    checks every ``prev_hash`` link and that no seq is missing, and that the chain ends exactly at the head
    kept in :class:`~audit.models.AuditChainHead`. Events appended while it runs are checked too, never taken
    for forgeries. With ``checkpoint_file``, the chain must also still contain the seq and hash signed into
    that file by an earlier run (if the file exists), and the file is rewritten with the new end on success:
    kept outside the database, it catches a rewrite by someone who can change both events and head.
    Returns a report; never raises for a broken chain.
    """
    report = ChainReport()
    verifier, checkpoint = _chain_start()
    if checkpoint is not None:
        report.notes.append(f"starting after archive checkpoint seq {checkpoint.seq} ({checkpoint.file_name})")
    head = _head_now()
    if head is None:
        if checkpoint is not None or AuditEvent.objects.exists():
            report.problem = "chain head missing: the audit chain head row was removed"
            return report
        head = (0, GENESIS_HASH)
    verifier.anchor(seq=head[0], hash_hex=head[1], label="chain head")
    signed = _checkpoint_file_read(checkpoint_file, report) if checkpoint_file else None
    if report.problem:
        return report
    if signed is not None:
        _anchor_signed_checkpoint(verifier, checkpoint, signed, report)
    for event in _events_in_chain_order(chunk_size=chunk_size, as_hashed=True):
        problem = verifier.feed(event)
        if problem is not None:
            report.problem = _classify(problem, head)
            return report
        if progress is not None and verifier.count % progress_every == 0:
            progress(verifier.count)
    report.count = verifier.count
    report.problem = _tail_problem(verifier, head)
    if report.problem is None and signed is not None and signed[0] > verifier.last_seq:
        report.problem = (
            f"tail truncated: signed checkpoint file says seq {signed[0]}, last event is {verifier.last_seq}"
        )
    if report.problem is None:
        report.head_seq, report.head_hash = verifier.last_seq, verifier.last_hash
        if checkpoint_file is not None:
            _checkpoint_file_write(checkpoint_file, seq=verifier.last_seq, hash_hex=verifier.last_hash)
    return report


def _classify(problem: ChainBreak, head: tuple[int, str]) -> str:
    """A break past the head read at the start is a forgery only if it is past the head now, too."""
    if problem.seq is not None and problem.seq > head[0]:
        now = _head_now()
        if now is None or problem.seq > now[0]:
            return _inserted_after_head(head[0] if now is None else now[0])
    return problem.message


def _tail_problem(verifier: ChainVerifier, head: tuple[int, str]) -> str | None:
    if verifier.last_seq <= head[0]:
        tail = verifier.check_tail(head_seq=head[0], head_hash=head[1], head_label="head")
        return tail.message if tail else None
    now = _head_now()  # the chain goes on past the head read at the start: appended since, or forged?
    if now is None or verifier.last_seq > now[0]:
        return _inserted_after_head(head[0] if now is None else now[0])
    if verifier.last_seq == now[0] and verifier.last_hash != now[1]:
        return f"event seq {verifier.last_seq} (id {verifier.last_id}): hash differs from the chain head's — replaced"
    return None


def _checkpoint_file_read(path: Path, report: ChainReport) -> tuple[int, str] | None:
    if not path.exists():
        report.notes.append(f"checkpoint file {path} does not exist yet: it will be written")
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        signed_text = _checkpoint_file_payload(seq=data["seq"], hash_hex=data["hash"], at=data["verified_at"])
        signing.Signer(salt=_CHECKPOINT_FILE_SALT).unsign(f"{signed_text}:{data['signature']}")
    except (OSError, ValueError, KeyError, TypeError, signing.BadSignature):
        report.problem = f"checkpoint file {path}: unreadable or bad signature — forged or altered"
        return None
    return int(data["seq"]), str(data["hash"])


def _anchor_signed_checkpoint(
    verifier: ChainVerifier, checkpoint: AuditCheckpoint | None, signed: tuple[int, str], report: ChainReport
) -> None:
    seq, hash_hex = signed
    archived_up_to = checkpoint.seq if checkpoint else 0
    if seq > archived_up_to:
        verifier.anchor(seq=seq, hash_hex=hash_hex, label="signed checkpoint file")
    elif checkpoint is not None and seq == checkpoint.seq:
        if hash_hex != checkpoint.hash:
            report.problem = f"archive checkpoint seq {seq}: hash differs from the signed checkpoint file's — replaced"
    else:
        report.notes.append(f"signed checkpoint file's seq {seq} is archived: check it with --archive")


def _checkpoint_file_payload(*, seq: int, hash_hex: str, at: str) -> str:
    return json.dumps({"hash": hash_hex, "seq": seq, "verified_at": at}, sort_keys=True, separators=(",", ":"))


def _checkpoint_file_write(path: Path, *, seq: int, hash_hex: str) -> None:
    at = timezone.now().astimezone(dt.UTC).isoformat()
    payload = _checkpoint_file_payload(seq=seq, hash_hex=hash_hex, at=at)
    signature = signing.Signer(salt=_CHECKPOINT_FILE_SALT).sign(payload).rsplit(":", 1)[1]
    document = {"seq": seq, "hash": hash_hex, "verified_at": at, "signature": signature}
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(document) + "\n", encoding="utf-8")
    os.replace(partial, path)


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
