"""Verifying the audit chain (``verify_audit``): every event's hash and link from the start (or the latest archive
checkpoint) to the head, and signed checkpoint files. Beside the chain it checks (``audit/chain.py``)."""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.core import signing
from django.db.models import TextField
from django.db.models.functions import Cast
from django.utils import timezone

from audit.chain import GENESIS_HASH, HASHED_FIELDS, ChainBreak, ChainVerifier, json_value
from audit.models import AuditChainHead, AuditCheckpoint, AuditEvent

logger = logging.getLogger(__name__)

_HEAD_ID = 1
_EVENT_FIELDS = ("id", *HASHED_FIELDS, "hash")
_CHECKPOINT_FILE_SALT = "audit.verify_audit.checkpoint"


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
