"""Verifying the audit chain (``verify_audit``): every archive checkpoint (its MAC, and its archive file), then every
event's hash, MAC and link from the latest checkpoint to the head (whose MAC is checked too), every anchor written
outside the database, and signed checkpoint files. Beside the chain it checks (``audit/chain.py``)."""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import gzip
import json
import logging
import os
import re
import threading
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.core import signing
from django.db import connection, connections
from django.db.models import Count, Exists, OuterRef, TextField
from django.db.models.functions import Cast
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from agent_platform.os_errors import os_error_text
from audit.anchors import (
    Anchor,
    AnchorBucket,
    AnchorFile,
    AnchorSet,
    AnchorStore,
    anchor_store,
    anchors_load,
    mac_words,
)
from audit.chain import (
    GENESIS_HASH,
    HASHED_FIELDS,
    POSTGRES_CANONICAL_TIME,
    ChainBreak,
    ChainKeyring,
    ChainVerifier,
    EventCheck,
    SegmentEnd,
    checkpoint_message,
    head_message,
    json_value,
    json_value_plain,
    json_values,
    pending_hash,
    record_check,
)
from audit.chain_keys import chain_keyring
from audit.models import AuditChainHead, AuditCheckpoint, AuditEvent, AuditPendingEvent

logger = logging.getLogger(__name__)

_HEAD_ID = 1
_EVENT_FIELDS = ("id", *HASHED_FIELDS, "hash", "mac", "nonce")
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


class CannotCheck(str):
    """A report's problem that is no verdict on the chain: an archive file that could not be opened or read (missing,
    no permission, an I/O error), so the events in it were not checked. A ``str``, so that every caller shows it as
    any problem; one that tells "not checked" from "altered" (the admin's *Verify chain*) asks ``isinstance``. A
    file that opens but is not what ``archive_audit`` wrote (not gzip, cut short, not JSON) is altered, not this."""


# --- words ---------------------------------------------------------------------------------------------------
# Every text of a report (its problem, its notes) is worded here, in the active language of whoever verifies: the
# breaks of the chain (audit/chain.py, which words them in English only) from their reason and details. Worker
# processes word nothing: a segment that does not verify is verified again in the caller's process, which words
# the problem. The English texts are the msgids, as they always were (the README quotes them).


class _Label(str):
    """A label the chain's verifier puts into its own (English) message: the English text, with the msgid and the
    values that word it in the active language when the problem is worded (:func:`_label_words`)."""

    msgid: str
    values: dict[str, Any]


def _label(msgid: str, **values: Any) -> _Label:
    """``msgid`` (marked with ``gettext_noop``) with ``values``, as a label for :class:`audit.chain.ChainVerifier`."""
    label = _Label(msgid % values)
    label.msgid, label.values = msgid, values
    return label


def _label_words(label: Any) -> str:
    """A label in the active language (one given as a plain text, by another caller of the chain, as it is)."""
    if isinstance(label, _Label):
        return _(label.msgid) % label.values
    return str(label)


def _event_words(seq: Any, event_id: Any) -> str:
    if event_id is None:
        return _("event seq %(seq)s") % {"seq": seq}
    return _("event seq %(seq)s (id %(id)s)") % {"seq": seq, "id": event_id}


def chain_break_words(problem: ChainBreak) -> str:
    """A break of the chain (:class:`audit.chain.ChainBreak`) in the active language: in English, its message word
    for word. A break with no reason (made by its caller) is its message."""
    details = problem.details
    event = _event_words(problem.seq, problem.event_id)
    match problem.reason:
        case "out_of_place":
            return _("%(event)s: out of place, the chain continues at seq %(seq)s — inserted") % {
                "event": event, "seq": details["next_seq"]
            }  # fmt: skip
        case "missing" if details["last"] == problem.seq:
            return _("seq %(seq)s missing — removed") % {"seq": problem.seq}
        case "missing":
            return _("seq %(first)s to %(last)s missing — removed") % {"first": problem.seq, "last": details["last"]}
        case "unreadable":
            return _("%(event)s: unreadable (%(error)s) — altered") % {
                "event": event, "error": _stored_form_words(details["error"])
            }  # fmt: skip
        case "hash_mismatch":
            return _("%(event)s: hash mismatch — altered") % {"event": event}
        case "prev_hash":
            return _(
                "%(event)s: prev_hash is not %(before)s — chain broken (the event before it was replaced, or this "
                "one was altered and rehashed)"
            ) % {"event": event, "before": _start_words(problem)}
        case "mac":
            return _("%(event)s: %(why)s — forged (written or rewritten without the chain key)") % {
                "event": event, "why": mac_words(details["why"])
            }  # fmt: skip
        case "anchor" | "tail_hash":
            return _("%(event)s: hash differs from the %(label)s's — replaced") % {
                "event": event, "label": _label_words(details["label"])
            }  # fmt: skip
        case "tail_short":
            values = {"label": _label_words(details["label"]), "seq": details["head_seq"], "last": details["last_seq"]}
            if details["any_event"]:
                return _("tail truncated: %(label)s says seq %(seq)s, last event is %(last)s") % values
            return _("tail truncated: %(label)s says seq %(seq)s, no event after seq %(last)s") % values
    return problem.message


def _stored_form_words(error: Any) -> str:
    """Why an event was unreadable, in the active language where it is a :class:`StoredForm` (else as it is)."""
    if isinstance(error, StoredForm):
        return _("%(column)s stored as %(stored)s, not in the form the platform writes") % {
            "column": error.column, "stored": error.stored
        }  # fmt: skip
    return str(error)


def _start_words(problem: ChainBreak) -> str:
    """What a broken link should have been (a ``prev_hash`` break): the hash of the seq before, or at the start of
    the verifier, its start's label, the genesis hash or the checkpoint before it."""
    details = problem.details
    if not details["at_start"]:
        return _("the hash of seq %(seq)s") % {"seq": (problem.seq or 0) - 1}
    if details["start_label"]:
        return _label_words(details["start_label"])
    if details["start_seq"] == 1:
        return _("the genesis hash")
    return _("the checkpoint at seq %(seq)s") % {"seq": details["start_seq"] - 1}


def _archive_checkpoint_label(seq: int) -> _Label:
    return _label(gettext_noop("the hash of the archive checkpoint at seq %(seq)s"), seq=seq)


def _chain_start(
    keyring: ChainKeyring,
    report: ChainReport,
    *,
    archive_dir: Path | None,
    anchors: AnchorSet,
    signed: tuple[int, str] | None = None,
) -> ChainVerifier | None:
    """Check every archive checkpoint in seq order (its MAC, that it follows the one before, and its archive
    file: that chain, its MACs, the anchors inside it, the ``signed`` checkpoint file's seq and hash where it
    falls inside it, and that no event of the table has the nonce of an archived one) and return a verifier
    that starts after the latest, or at genesis. None, with ``report.problem`` set, on the first problem."""
    start_seq, start_hash = 1, GENESIS_HASH
    checkpoints = list(AuditCheckpoint.objects.order_by("seq"))
    replays = _archived_replay_candidates() if checkpoints else {}
    for checkpoint in checkpoints:
        why = keyring.check(
            "checkpoint", checkpoint_message(checkpoint.seq, checkpoint.hash, checkpoint.count), checkpoint.mac
        )
        if why is not None:
            report.problem = _checkpoint_forged(checkpoint.seq, why)
            return None
        if checkpoint.count != checkpoint.seq - start_seq + 1:
            report.problem = _(
                "archive checkpoint seq %(seq)s: says %(count)s events archived, but follows seq %(before)s"
                " — a checkpoint before it was removed"
            ) % {"seq": checkpoint.seq, "count": checkpoint.count, "before": start_seq - 1}
            return None
        path = _archive_file_of(checkpoint, archive_dir)
        if not path.exists() and archive_dir is not None:
            report.problem = CannotCheck(
                _("archive checkpoint seq %(seq)s: its archive file %(name)s is not in %(dir)s (--archive-dir)")
                % {"seq": checkpoint.seq, "name": path.name, "dir": archive_dir}
            )
            return None
        if not path.exists():
            report.problem = CannotCheck(
                _(
                    "archive checkpoint seq %(seq)s: its archive file %(path)s is missing (pass --archive-dir where "
                    "the archives are kept)"
                )
                % {"seq": checkpoint.seq, "path": path}
            )
            return None
        verifier = archive_file_verify(
            path,
            start=(start_seq, start_hash),
            recorded={checkpoint.seq: checkpoint.hash},
            report=report,
            keyring=keyring,
            anchors=anchors.by_seq,
            replays=replays,
            signed=signed,
        )
        if report.problem:
            return None
        if (verifier.last_seq, verifier.last_hash) != (checkpoint.seq, checkpoint.hash):
            report.problem = _("archive checkpoint seq %(seq)s: its archive file %(path)s ends elsewhere — replaced") % {
                "seq": checkpoint.seq, "path": path
            }  # fmt: skip
            return None
        if signed is not None and start_seq <= signed[0] <= checkpoint.seq:
            report.notes.append(_signed_checked_note(signed[0], path))
        start_seq, start_hash = checkpoint.seq + 1, checkpoint.hash
    if not checkpoints:
        return ChainVerifier(keyring=keyring, normalized=True)
    latest = checkpoints[-1]
    report.notes.append(
        _("starting after archive checkpoint seq %(seq)s (%(file)s)") % {"seq": latest.seq, "file": latest.file_name}
    )
    return ChainVerifier(
        start_seq=start_seq,
        start_prev_hash=start_hash,
        start_label=_archive_checkpoint_label(latest.seq),
        keyring=keyring,
        normalized=True,
    )


def _checkpoint_forged(seq: int, why: str) -> str:
    return _("archive checkpoint seq %(seq)s: %(why)s — forged") % {"seq": seq, "why": mac_words(why)}


def _archived_replay_candidates() -> dict[str, tuple[int, Any]]:
    """The table's events (nonce -> (seq, id)) that could be a copy of an archived event's pending row, chained
    again after the event left the table (its nonce no longer in the table for the chainer to refuse): those with
    a nonce and a time no later than the first event's. An archived event is older than the archive's cutoff, and
    the first event left after an archive is not (``archive_audit`` archives the longest run older than it), so a
    copy's time lies before the table's first; events legitimately there are the few written a moment before an
    event chained ahead of them. Read after the checkpoints, so an archive committed in between moves none of them
    into a file read here."""
    first = AuditEvent.objects.order_by("seq").values_list("created_at", flat=True).first()
    if first is None:
        return {}
    rows = AuditEvent.objects.filter(nonce__isnull=False, created_at__lte=first).order_by()
    return {nonce: (seq, event_id) for nonce, seq, event_id in rows.values_list("nonce", "seq", "id")}


def _archive_file_of(checkpoint: AuditCheckpoint, archive_dir: Path | None) -> Path:
    recorded = Path(checkpoint.file_name)
    if archive_dir is not None:
        return archive_dir / recorded.name
    return recorded


def _events_in_chain_order(
    *, chunk_size: int, up_to_seq: int | None = None, as_hashed: bool = False
) -> Iterator[dict[str, Any]]:
    """Events as dicts of ``id``, the hashed fields and ``hash``, in seq order, ``chunk_size`` rows at a time.

    ``as_hashed`` reads ``args`` and ``result`` from their JSON text straight into the form the hash takes
    (integral floats as ints): a third faster to verify. Without it they are as the ORM gives them.
    """
    return (event for event, _ in _events_checked(chunk_size=chunk_size, high=up_to_seq, as_hashed=as_hashed))


def _events_as_stored(*, chunk_size: int, up_to_seq: int) -> Iterator[tuple[dict[str, Any], EventCheck | None]]:
    """The events up to ``up_to_seq`` in seq order as ``archive_audit`` writes them (:func:`_raw_checked`'s
    ``as_stored``), each with the check ``verify_audit`` makes of it: the same reading of the same row (on SQLite
    its stored forms, :func:`_sqlite_row_as_hashed`), so that an event verification names as altered is never
    archived. On a database of no raw reading, as the ORM gives them, unchecked (None: the verifier checks them)."""
    if connection.vendor in _RAW_VENDORS:
        return _events_raw(chunk_size=chunk_size, high=up_to_seq, as_stored=True)
    return ((event, None) for event in _events_in_chain_order(chunk_size=chunk_size, up_to_seq=up_to_seq))


def _events_checked(
    *, chunk_size: int, low: int | None = None, high: int | None = None, as_hashed: bool = False
) -> Iterator[tuple[dict[str, Any], EventCheck | None]]:
    """:func:`_events_in_chain_order` from seq ``low`` to ``high`` (each None: from the first, to the last), each
    event with its :func:`audit.chain.event_check` where it was computed on the way (the raw path), else None."""
    if as_hashed and connection.vendor in _RAW_VENDORS:
        return _events_raw(chunk_size=chunk_size, low=low, high=high)
    events = AuditEvent.objects.order_by("seq")
    if low is not None:
        events = events.filter(seq__gte=low)
    if high is not None:
        events = events.filter(seq__lte=high)
    if not as_hashed:
        return ((event, None) for event in events.values(*_EVENT_FIELDS).iterator(chunk_size=chunk_size))
    plain = [name for name in _EVENT_FIELDS if name not in ("args", "result")]
    rows = events.annotate(args_json=Cast("args", TextField()), result_json=Cast("result", TextField()))
    values = rows.values(*plain, "args_json", "result_json").iterator(chunk_size=chunk_size)
    return ((event, None) for event in _with_json_values(values))


_RAW_VENDORS = ("postgresql", "sqlite")
_RAW_NAMES = ("id", *(name for name in HASHED_FIELDS if name not in ("args", "result")), "hash", "mac", "nonce")
# What Django writes on SQLite (django.db.backends.sqlite3): a time as ``str()`` of the naive UTC datetime (no
# fraction where the microseconds are 0), a UUID as 32 lower-case hex digits, a bool as the integer 0 or 1. The
# auditor's filters compare what is stored (``?since``, ``?run``, ``?agent``, a run's trace, ``?ok``), so a row
# holding another spelling of the same value (an offset, upper case, 0.5) would hash alike and yet escape them:
# only the writer's own form is read (``_sqlite_row_as_hashed``); any other is the event's problem, as altered.
# The time and ``ok`` are read with a unary plus, which keeps the stored value but drops the declared type, so that
# no converter of Django's parses it (any spelling) or turns it into a bool (anything but 1 as False).
_SQLITE_TIME = re.compile(r"([0-9]{4}-[0-9]{2}-[0-9]{2}) ([0-9]{2}:[0-9]{2}:[0-9]{2})(\.(?!0{6})[0-9]{6})?")
_SQLITE_UUID = re.compile(r"[0-9a-f]{32}")


class StoredForm(str):
    """Why a row is read as altered though its values would hash alike: a column stored in another form than the
    platform writes (on SQLite). The English text, a ``str`` (the unreadable reason of
    :class:`audit.chain.ChainBreak`), with the ``column`` and the ``stored`` value (its ``repr``) to word it."""

    column: str
    stored: str

    def __new__(cls, column: str, stored: Any) -> StoredForm:
        text = f"{column} stored as {stored!r}, not in the form the platform writes"
        problem = super().__new__(cls, text)
        problem.column, problem.stored = column, repr(stored)
        return problem


def _sqlite_row_as_hashed(record: dict[str, Any]) -> StoredForm | None:
    """A raw SQLite row's time, run id and ``ok`` put in the form the hash takes, in place (as
    :func:`audit.chain.record_check` would, without a parse); the first that is not stored as the platform writes
    it, if any (the record is then not to be hashed)."""
    created = record["created_at"]
    parts = _SQLITE_TIME.fullmatch(created) if isinstance(created, str) else None
    if parts is None:
        return StoredForm("created_at", created)
    record["created_at"] = f"{parts[1]}T{parts[2]}{parts[3] or '.000000'}+00:00"
    run_id = record["run_id"]
    if run_id is not None:
        if not (isinstance(run_id, str) and _SQLITE_UUID.fullmatch(run_id)):
            return StoredForm("run_id", run_id)
        record["run_id"] = f"{run_id[:8]}-{run_id[8:12]}-{run_id[12:16]}-{run_id[16:20]}-{run_id[20:]}"
    ok = record["ok"]
    if type(ok) is not int or ok not in (0, 1):
        return StoredForm("ok", ok)
    record["ok"] = ok == 1
    return None


def _events_raw(
    *, chunk_size: int, low: int | None = None, high: int | None = None, as_stored: bool = False
) -> Iterator[tuple[dict[str, Any], EventCheck]]:
    """The fast path of :func:`_events_checked` (``as_hashed``): one SQL query, streamed (a server-side cursor on
    PostgreSQL), rows turned into the hashed form without the ORM's per-value converters and each hashed and its
    MAC checked (:func:`audit.chain.record_check`). On SQLite the time, the run id and ``ok`` come back as
    stored, and must be stored exactly as the platform writes them (:func:`_sqlite_row_as_hashed`).
    ``as_stored``: each event as ``archive_audit`` writes it (see :func:`_raw_checked`), checked the same way."""
    table = connection.ops.quote_name(AuditEvent._meta.db_table)
    as_text = "::text" if connection.vendor == "postgresql" else ""
    selected = {name: name for name in _RAW_NAMES}
    if connection.vendor == "postgresql":  # the time and the run id in the text the hash takes (audit/chain.py)
        selected["created_at"] = POSTGRES_CANONICAL_TIME
        selected["run_id"] = "run_id::text"
    else:  # SQLite: the time and ``ok`` as stored, checked and made canonical in Python (see _SQLITE_TIME)
        selected["created_at"] = "+created_at"
        selected["ok"] = "+ok"
    columns = ", ".join((*selected.values(), f"args{as_text}", f"result{as_text}"))
    bounds = [(">=", low), ("<=", high)]
    where = " AND ".join(f"seq {op} %s" for op, value in bounds if value is not None)
    params = [value for _, value in bounds if value is not None]
    sqlite = connection.vendor == "sqlite"
    keyring = chain_keyring()
    with connection.chunked_cursor() as cursor:
        cursor.execute(
            f"SELECT {columns} FROM {table} {'WHERE ' + where if where else ''} ORDER BY seq",  # noqa: S608 - names from the model
            params,
        )
        while rows := cursor.fetchmany(chunk_size):
            for row in rows:
                yield _raw_checked(row, sqlite, keyring, as_stored=as_stored)


_PLAIN_SLOTS = tuple((name, _RAW_NAMES.index(name)) for name in HASHED_FIELDS if name not in ("args", "result"))
_ID_SLOT, _HASH_SLOT, _MAC_SLOT, _NONCE_SLOT = (_RAW_NAMES.index(name) for name in ("id", "hash", "mac", "nonce"))


def _json_column(text: Any, column: str, *, as_stored: bool) -> tuple[Any, Any, bool] | StoredForm:
    """A JSON column's value as the database gives it back (``as_stored``; else None), as hashed, and whether that
    is plain (``audit.chain.json_values``, ``json_value_plain``). Text that is no JSON (written with the database's
    checks off) is the event's problem, named as altered: not a crash of the verification, nor of an archive."""
    try:
        if text is None:
            return None, None, True
        if as_stored:
            return json_values(text)
        hashed, plain = json_value_plain(text)
        return None, hashed, plain
    except ValueError:
        return StoredForm(column, str(text)[:80])


def _raw_checked(
    row: tuple[Any, ...], sqlite: bool, keyring: ChainKeyring, *, as_stored: bool = False
) -> tuple[dict[str, Any], EventCheck]:
    """A raw row as the event the verifier reads, and its :func:`audit.chain.record_check`.

    ``as_stored``: the event given back is the one ``archive_audit`` writes instead: ``args``, ``result`` and
    ``latency_ms`` as the database gives them back (an integral float stays a float), the time and the run id in
    the text the hash takes; the check is still of the row as the verifier reads it (on SQLite its stored forms
    included), so that no event is archived that ``verify_audit`` would name."""
    record = {name: row[slot] for name, slot in _PLAIN_SLOTS}
    args = _json_column(row[-2], "args", as_stored=as_stored)
    result = _json_column(row[-1], "result", as_stored=as_stored)
    stored_form: StoredForm | None
    if isinstance(args, StoredForm) or isinstance(result, StoredForm):
        stored_form = args if isinstance(args, StoredForm) else result
        args_read = result_read = record["args"] = record["result"] = None
        args_plain = result_plain = True
    else:
        (args_read, record["args"], args_plain), (result_read, record["result"], result_plain) = args, result
        stored_form = _sqlite_row_as_hashed(record) if sqlite else None
    as_read = {"args": args_read, "result": result_read} if as_stored else None
    # Copied before record_check puts the latency in its hashed form, in place.
    event = record if as_read is None else {**record, **as_read}
    nonce = row[_NONCE_SLOT]
    if nonce is not None:  # hashed only where there is one (audit/chain.py)
        record["nonce"] = nonce
    checked: EventCheck = (
        (None, stored_form, None)
        if stored_form is not None
        else record_check(record, row[_MAC_SLOT], keyring, plain=args_plain and result_plain)
    )
    event["id"], event["hash"], event["mac"], event["nonce"] = row[_ID_SLOT], row[_HASH_SLOT], row[_MAC_SLOT], nonce
    return event, checked


# --- verification in segments ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Segment:
    """A stretch of the chain for one worker process: the events from seq ``low`` to ``high`` (None: from the
    first, to the last), verified from ``start_seq`` after ``start_prev_hash`` (None: its first link is checked
    when it is joined, :meth:`audit.chain.ChainVerifier.join`)."""

    low: int | None
    high: int | None
    start_seq: int
    start_prev_hash: str | None
    start_label: str


def _segments(verifier: ChainVerifier, *, head_seq: int, size: int) -> list[_Segment]:
    """The events from the verifier's next seq to the head in stretches of ``size`` seqs; the first open
    below (an event out of place before the start is read, and found), the last open above (events appended
    since the head was read are read too, as the verifier alone reads them). Fewer than two: none."""
    start = verifier.next_seq
    if head_seq - start + 1 < 2 * size:
        return []
    lows = list(range(start, head_seq + 1, size))
    segments = [_Segment(None, start + size - 1, start, verifier.prev_hash, verifier.start_label)]
    for index, low in enumerate(lows[1:], start=1):
        high = None if index == len(lows) - 1 else low + size - 1
        segments.append(_Segment(low, high, low, None, ""))
    return segments


# In a worker process: the anchors every segment is checked against, given once when it starts.
_worker_anchors: dict[int, tuple[str, str]] = {}


def _segment_checked(segment: _Segment, *, chunk_size: int) -> SegmentEnd:
    """In a worker process (forked, on a connection of its own): one stretch of the chain verified."""
    verifier = ChainVerifier(
        start_seq=segment.start_seq,
        start_prev_hash=segment.start_prev_hash,
        start_label=segment.start_label,
        keyring=chain_keyring(),
        normalized=True,
    )
    verifier.anchors = _worker_anchors
    with contextlib.closing(
        _events_checked(chunk_size=chunk_size, low=segment.low, high=segment.high, as_hashed=True)
    ) as events:
        for event, checked in events:
            if verifier.feed(event, checked=checked) is not None:
                break
    return verifier.segment_end()


def _worker_started(anchors: dict[int, tuple[str, str]]) -> None:
    """A pool worker: takes the anchors; its database connections (opened on first use, none inherited: the
    parent closed its own before forking) are closed when it exits."""
    import multiprocessing.util

    _worker_anchors.clear()
    _worker_anchors.update(anchors)
    multiprocessing.util.Finalize(None, connections.close_all, exitpriority=10)


def _joined_in_segments(
    verifier: ChainVerifier,
    segments: list[_Segment],
    *,
    workers: int,
    chunk_size: int,
    progress: Callable[[int], None] | None,
    progress_every: int,
) -> bool:
    """Verify ``segments`` in ``workers`` forked processes, in order, and join each onto ``verifier``: True if
    every one verified and joined (the verifier is then where feeding it every event would have left it);
    False at the first that did not (the caller verifies again in one process, which names the problem)."""
    import multiprocessing

    connections.close_all()  # no connection is shared with the forked workers: each opens its own
    check = functools.partial(_segment_checked, chunk_size=chunk_size)
    context = multiprocessing.get_context("fork")
    with context.Pool(workers, initializer=_worker_started, initargs=(dict(verifier.anchors),)) as pool:
        try:
            for end in pool.imap(check, segments):
                before = verifier.count
                if not verifier.join(end):
                    return False  # leaving the block stops the workers
                if progress is not None:
                    for passed in range(before // progress_every + 1, verifier.count // progress_every + 1):
                        progress(passed * progress_every)
        except Exception:  # a worker could not read (no connection left on the server, …): one process reads
            logger.warning("audit verification: a worker process failed; verifying in one process", exc_info=True)
            return False
        pool.close()
        pool.join()
    return True


def _with_json_values(rows: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for row in rows:
        args, result = row.pop("args_json"), row.pop("result_json")
        row["args"] = None if args is None else json_value(args)
        row["result"] = None if result is None else json_value(result)
        yield row


def _head_now() -> tuple[int, str] | None:
    row = AuditChainHead.objects.filter(pk=_HEAD_ID).values_list("seq", "hash").first()
    return (int(row[0]), str(row[1])) if row else None


def _head_checked(keyring: ChainKeyring, report: ChainReport) -> tuple[int, str] | None:
    """The head, if it is there and its MAC verifies; else None with ``report.problem`` set."""
    row = AuditChainHead.objects.filter(pk=_HEAD_ID).values_list("seq", "hash", "mac").first()
    if row is None:
        report.problem = _("chain head missing: the audit chain head row was removed")
        return None
    seq, hash_hex, mac = int(row[0]), str(row[1]), row[2]
    why = keyring.check("head", head_message(seq, hash_hex), mac)
    if why is not None:
        report.problem = _("chain head (seq %(seq)s): %(why)s — forged (moved without the chain key)") % {
            "seq": seq, "why": mac_words(why)
        }  # fmt: skip
        return None
    return seq, hash_hex


def _inserted_after_head(head_seq: int) -> str:
    first = AuditEvent.objects.filter(seq__gt=head_seq).order_by("seq").values_list("seq", "id").first()
    if first is None:
        return _("chain head says seq %(seq)s, behind the chain it vouches for — head rolled back") % {"seq": head_seq}
    return _("%(event)s: after the chain head (seq %(seq)s) — inserted") % {
        "event": _("event seq %(seq)s (id %(id)s)") % {"seq": first[0], "id": first[1]}, "seq": head_seq
    }  # fmt: skip


def audit_chain_verify(
    *,
    checkpoint_file: Path | None = None,
    archive_dir: Path | None = None,
    progress: Callable[[int], None] | None = None,
    progress_every: int = 100_000,
    chunk_size: int = 2000,
    workers: int | None = None,
    progress_note: Callable[[str], None] | None = None,
) -> ChainReport:
    """Verify the whole record, streaming, and fail closed: anything missing or unauthenticated is a problem.

    In order: the anchors outside the database (each MAC; two that disagree), the chain head (present, its
    MAC), every archive checkpoint (its MAC, continuity, and its archive file, found where it was written or
    by name in ``archive_dir``), then every event after the latest checkpoint in ``seq`` order: hash, MAC,
    ``prev_hash`` link, no seq missing, the chain ending exactly at the head, and reaching the highest
    anchored seq with every anchored hash in place. Events appended while it runs are checked too, never
    taken for forgeries. With ``checkpoint_file``, the chain must also still contain the seq and hash signed
    into that file by an earlier run (if the file exists), and the file is rewritten with the new end on
    success. Returns a report; never raises for a broken chain.

    ``workers``: processes that verify the events in parallel, each a segment of the chain on a connection of its
    own, the segments then joined in order (see :func:`_verify_workers` for the default; 0 or 1: none). Where a
    segment does not verify or join, the whole record is verified again in this process, so that the verdict
    and its words are the verifier's alone; ``progress_note`` (where progress is shown) is told so first, for the
    counts then start again from the beginning.

    An ``archive_audit`` that commits while it runs (after the checkpoints were read, before the events were)
    takes away the events it was to start with: where nothing verified from the start because the first events
    are gone, and a checkpoint now covers them, the record is verified again from the new checkpoint (at most
    ``_ARCHIVE_RACE_RETRIES`` times), rather than reported as removed. A checkpoint that appeared is verified
    like any other (MAC, archive file), so a forged one is named as forged.
    """
    options: dict[str, Any] = {
        "checkpoint_file": checkpoint_file, "archive_dir": archive_dir, "progress": progress,
        "progress_every": progress_every, "chunk_size": chunk_size, "workers": workers, "progress_note": progress_note,
    }  # fmt: skip
    for _attempt in range(_ARCHIVE_RACE_RETRIES):
        report, archived_meanwhile = _chain_verify(**options)
        if not archived_meanwhile:
            return report
    report, archived_meanwhile = _chain_verify(**options)
    if archived_meanwhile:
        report.notes.append(
            _("archive_audit committed while verifying, %(times)s times: verify again once it is done")
            % {"times": _ARCHIVE_RACE_RETRIES + 1}
        )
    return report


_ARCHIVE_RACE_RETRIES = 3


def _archived_since(start_seq: int) -> bool:
    """Whether a checkpoint (read now) covers ``start_seq``: an archive committed since the checkpoints were read."""
    return AuditCheckpoint.objects.filter(seq__gte=start_seq).exists()


def _chain_verify(
    *,
    checkpoint_file: Path | None,
    archive_dir: Path | None,
    progress: Callable[[int], None] | None,
    progress_every: int,
    chunk_size: int,
    workers: int | None,
    progress_note: Callable[[str], None] | None,
) -> tuple[ChainReport, bool]:
    """:func:`audit_chain_verify` once: the report, and whether it failed only because an archive committed while
    it ran (nothing verified from the start, and a checkpoint now covers the start)."""
    report = ChainReport()
    keyring = chain_keyring()
    store = anchor_store()
    anchors = anchors_load(store, keyring)
    if anchors.problem:
        report.problem = anchors.problem
        return report, False
    report.notes.append(_anchors_note(anchors, store))
    head = _head_checked(keyring, report)
    if head is None:
        return report, False
    # Read before the archives are walked: a signed seq that was archived since is checked in its archive file.
    signed = _checkpoint_file_read(checkpoint_file, report) if checkpoint_file else None
    if report.problem:
        return report, False
    verifier = _chain_start(keyring, report, archive_dir=archive_dir, anchors=anchors, signed=signed)
    if verifier is None:
        return report, False
    start_seq = verifier.next_seq
    verifier.anchor(seq=head[0], hash_hex=head[1], label=_label(gettext_noop("chain head")))
    for seq, anchor in anchors.by_seq.items():
        if seq >= verifier.next_seq:
            verifier.anchor(seq=seq, hash_hex=anchor.hash, label=_anchor_label(anchor))
    if signed is not None:
        _anchor_signed_checkpoint(verifier, signed, report)
    workers = _verify_workers(workers, events=head[0] - verifier.next_seq + 1)
    segments = _segments(verifier, head_seq=head[0], size=_SEGMENT_CHUNKS * chunk_size) if workers > 1 else []
    if segments and connection.vendor in _RAW_VENDORS and not connection.in_atomic_block:
        # Inside a transaction the workers, on connections of their own, would not see what it wrote: one process.
        joined = _joined_in_segments(
            verifier, segments, workers=workers, chunk_size=chunk_size, progress=progress, progress_every=progress_every
        )
        if not joined:  # something does not verify: the verifier alone finds it and names it, word for word
            if progress_note is not None:  # its counts start again from the first event: say why before they do
                progress_note(
                    _(
                        "the worker processes did not verify every segment: verifying the chain again in this "
                        "process, from the start, to name the first break"
                    )
                )
            again = audit_chain_verify(
                checkpoint_file=checkpoint_file,
                archive_dir=archive_dir,
                progress=progress,
                progress_every=progress_every,
                chunk_size=chunk_size,
                workers=0,
                progress_note=progress_note,
            )
            again.notes.append(_("the worker processes did not verify every segment: verified again in this one"))
            return again, False
        report.notes.append(
            _("events verified in %(workers)s worker processes, in %(segments)s segments")
            % {"workers": workers, "segments": len(segments)}
        )
    else:
        with contextlib.closing(_events_checked(chunk_size=chunk_size, as_hashed=True)) as events:
            for event, checked in events:
                problem = verifier.feed(event, checked=checked)
                if problem is not None:
                    report.problem = _classify(problem, head)
                    # The first events gone, nothing verified: archived while this ran, or removed?
                    archived = problem.kind == "removed" and problem.seq == start_seq and _archived_since(start_seq)
                    return report, archived
                if progress is not None and verifier.count % progress_every == 0:
                    progress(verifier.count)
    report.count = verifier.count
    report.problem = _tail_problem(verifier, head)
    if report.problem is not None and verifier.count == 0 and _archived_since(start_seq):
        return report, True  # no event at all after the start: the whole table archived while this ran
    if report.problem is None and anchors.latest is not None and anchors.latest.seq > verifier.last_seq:
        values = {"at": anchors.latest.at, "seq": anchors.latest.seq, "last": verifier.last_seq}
        if verifier.count:
            report.problem = _("tail truncated: the anchor of %(at)s says seq %(seq)s, last event is %(last)s") % values
        else:
            report.problem = (
                _("tail truncated: the anchor of %(at)s says seq %(seq)s, no event after seq %(last)s") % values
            )
    if report.problem is None and signed is not None and signed[0] > verifier.last_seq:
        report.problem = _("tail truncated: signed checkpoint file says seq %(seq)s, last event is %(last)s") % {
            "seq": signed[0], "last": verifier.last_seq
        }  # fmt: skip
    if report.problem is None:
        report.problem = _nonce_problem()
    if report.problem is None:
        report.problem = _pending_problem(keyring, report, chunk_size=chunk_size)
    if report.problem is None:
        report.head_seq, report.head_hash = verifier.last_seq, verifier.last_hash
        if checkpoint_file is not None:
            try:
                _checkpoint_file_write(checkpoint_file, seq=verifier.last_seq, hash_hex=verifier.last_hash)
            except OSError as exc:  # the chain verified; the file that is to hold its head did not get it
                report.problem = _(
                    "verified %(count)s events, but the checkpoint file %(path)s cannot be written: %(reason)s"
                ) % {"count": report.count, "path": checkpoint_file, "reason": os_error_text(exc)}
    return report, False


def _verify_workers(workers: int | None, *, events: int) -> int:
    """The worker processes to verify in: as asked (0 or 1: none); by default (None) one per core, up to
    ``_AUTO_WORKERS``, for a chain of at least ``_AUTO_MIN_EVENTS`` events after its start, and only in a process
    running no other thread (a forked worker inherits none of their locks: ``manage.py verify_audit``, not the
    admin's button inside a threaded web server, which verifies in its own process)."""
    if events <= 0:
        return 0
    if workers is not None:
        return max(0, workers)
    if events < _AUTO_MIN_EVENTS or threading.active_count() > 1:
        return 0
    return min(os.cpu_count() or 1, _AUTO_WORKERS)


_AUTO_MIN_EVENTS = 20_000  # under it, starting the workers costs more than they save
_AUTO_WORKERS = 8
_SEGMENT_CHUNKS = 4  # a segment is this many chunks (--chunk-size) of events


def _pending_problem(keyring: ChainKeyring, report: ChainReport, *, chunk_size: int) -> str | None:
    """Events appended but not chained yet (deferred chaining, ``audit.services``): each must carry a valid MAC
    of its content and nonce, or it was written or edited without the chain key (and will never be chained), and
    a nonce that no event and no pending row before it has, or it is a copy of a row put back (never chained
    either). The count and the oldest one's age go into the notes: the chain's lag, the window in which a removal
    is not seen."""
    plain = [
        "id", "mac", "nonce", *(name for name in HASHED_FIELDS if name not in ("seq", "prev_hash", "args", "result"))
    ]  # fmt: skip
    chained = AuditEvent.objects.filter(nonce=OuterRef("nonce"))
    rows = AuditPendingEvent.objects.order_by("id").annotate(
        args_json=Cast("args", TextField()),
        result_json=Cast("result", TextField()),
        chained=Exists(chained),
    )
    count, oldest = 0, None
    seen: dict[str, Any] = {}
    values = rows.values(*plain, "chained", "args_json", "result_json").iterator(chunk_size=chunk_size)
    for row in _with_json_values(values):
        nonce = row.pop("nonce") or None
        why: str | None
        try:
            why = keyring.check(
                "pending", pending_hash({**row, "seq": None, "prev_hash": None, "nonce": nonce}), row["mac"]
            )
        except (KeyError, TypeError, ValueError) as exc:
            why = _("unreadable content (%(error)s)") % {"error": exc}
        else:
            why = mac_words(why) if why is not None else None
        if why is None and nonce is None:
            why = _("no nonce")
        if why is not None:
            return _("pending event id %(id)s: %(why)s — forged (written or rewritten without the chain key)") % {
                "id": row["id"], "why": why
            }  # fmt: skip
        if row["chained"]:
            event = AuditEvent.objects.filter(nonce=nonce).order_by("seq").values_list("seq", "id").first()
            return _(
                "pending event id %(id)s: the nonce of event seq %(seq)s (id %(event_id)s) — replayed"
                " (a copy of its pending row put back; never chained)"
            ) % {"id": row["id"], "seq": event and event[0], "event_id": event and event[1]}
        if nonce in seen:
            return _(
                "pending event id %(id)s: the nonce of pending event id %(other)s — replayed"
                " (a copy of a pending row; never chained)"
            ) % {"id": row["id"], "other": seen[nonce]}
        seen[nonce] = row["id"]
        count += 1
        oldest = row["created_at"] if oldest is None else min(oldest, row["created_at"])
    if count:
        age = (timezone.now() - oldest).total_seconds() if oldest is not None else 0.0
        report.notes.append(
            _("%(count)s events appended but not chained yet (chain lag), the oldest %(age).1f s old")
            % {"count": count, "age": age}
        )
    return None


def _nonce_problem() -> str | None:
    """Two events with one nonce: a pending row chained twice, which the events' unique nonce and the chainer
    refuse, so found only where the constraint was dropped (one aggregate query, by that index where it is)."""
    found = list(
        AuditEvent.objects.filter(nonce__isnull=False)
        .order_by()
        .values("nonce")
        .annotate(events=Count("id"))
        .filter(events__gt=1)
        .values_list("nonce", flat=True)[:1]
    )  # no first(): its ordering by id would group by it
    if not found:
        return None
    twice = found[0]
    (first_seq, _first_id), (seq, event_id) = (
        AuditEvent.objects.filter(nonce=twice).order_by("seq").values_list("seq", "id")[:2]
    )
    return _(
        "event seq %(seq)s (id %(id)s): the nonce of event seq %(first)s — replayed"
        " (a copy of its pending row chained again)"
    ) % {"seq": seq, "id": event_id, "first": first_seq}


def _anchors_note(anchors: AnchorSet, store: AnchorStore) -> str:
    """What the anchors say, in the active language (the admin's *Verify chain* shows it)."""
    where = _store_words(store)
    if anchors.latest is None:
        return _("no anchors yet in %(where)s: run audit_anchor (the workers do, on a timer)") % {"where": where}
    return _("%(count)s anchors in %(where)s, the latest at seq %(seq)s (%(at)s)") % {
        "count": anchors.count,
        "where": where,
        "seq": anchors.latest.seq,
        "at": anchors.latest.at,
    }


def _anchor_label(anchor: Anchor) -> _Label:
    """An anchor's label in a chain's break: ``AnchorSet.label``'s text."""
    return _label(gettext_noop("anchor of %(at)s"), at=anchor.at)


def _store_words(store: AnchorStore) -> str:
    """Where the anchors are kept (``AnchorFile.description``, ``AnchorBucket.description``), in the active
    language."""
    if isinstance(store, AnchorFile):
        return _("anchor file %(path)s") % {"path": store.path}
    if isinstance(store, AnchorBucket):
        return _("anchor bucket s3://%(bucket)s/%(prefix)s") % {"bucket": store.bucket, "prefix": store.prefix}
    return store.description


def _classify(problem: ChainBreak, head: tuple[int, str]) -> str:
    """A break past the head read at the start is a forgery only if it is past the head now, too."""
    if problem.seq is not None and problem.seq > head[0]:
        now = _head_now()
        if now is None or problem.seq > now[0]:
            return _inserted_after_head(head[0] if now is None else now[0])
    return chain_break_words(problem)


def _tail_problem(verifier: ChainVerifier, head: tuple[int, str]) -> str | None:
    if verifier.last_seq <= head[0]:
        tail = verifier.check_tail(head_seq=head[0], head_hash=head[1], head_label=_label(gettext_noop("head")))
        return chain_break_words(tail) if tail else None
    now = _head_now()  # the chain goes on past the head read at the start: appended since, or forged?
    if now is None or verifier.last_seq > now[0]:
        return _inserted_after_head(head[0] if now is None else now[0])
    if verifier.last_seq == now[0] and verifier.last_hash != now[1]:
        return _("%(event)s: hash differs from the %(label)s's — replaced") % {
            "event": _("event seq %(seq)s (id %(id)s)") % {"seq": verifier.last_seq, "id": verifier.last_id},
            "label": _("chain head"),
        }
    return None


def _checkpoint_file_read(path: Path, report: ChainReport) -> tuple[int, str] | None:
    if not path.exists():
        report.notes.append(_("checkpoint file %(path)s does not exist yet: it will be written") % {"path": path})
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        signed_text = _checkpoint_file_payload(seq=data["seq"], hash_hex=data["hash"], at=data["verified_at"])
        signing.Signer(salt=_CHECKPOINT_FILE_SALT).unsign(f"{signed_text}:{data['signature']}")
    except (OSError, ValueError, KeyError, TypeError, signing.BadSignature):
        report.problem = _("checkpoint file %(path)s: unreadable or bad signature — forged or altered") % {"path": path}
        return None
    return int(data["seq"]), str(data["hash"])


def _anchor_signed_checkpoint(verifier: ChainVerifier, signed: tuple[int, str], report: ChainReport) -> None:
    """Require the table's chain to hold the signed seq and hash where they lie after the start. A seq the
    archives hold was checked in its archive file already (:func:`_chain_start`): an archive file missing or
    unreadable fails the report, so a checkpoint file is never rewritten over a seq that was not checked."""
    seq, hash_hex = signed
    archived_up_to = verifier.next_seq - 1
    if seq > archived_up_to:
        verifier.anchor(seq=seq, hash_hex=hash_hex, label=_signed_checkpoint_label())
    elif seq == archived_up_to and hash_hex != verifier.prev_hash:
        report.problem = _(
            "archive checkpoint seq %(seq)s: hash differs from the signed checkpoint file's — replaced"
        ) % {"seq": seq}


def _signed_checkpoint_label() -> _Label:
    return _label(gettext_noop("signed checkpoint file"))


def _signed_checked_note(seq: int, path: Path) -> str:
    return _("signed checkpoint file's seq %(seq)s: checked in archive %(path)s") % {"seq": seq, "path": path}


def _checkpoint_file_payload(*, seq: int, hash_hex: str, at: str) -> str:
    return json.dumps({"hash": hash_hex, "seq": seq, "verified_at": at}, sort_keys=True, separators=(",", ":"))


def _checkpoint_file_write(path: Path, *, seq: int, hash_hex: str) -> None:
    at = timezone.now().astimezone(dt.UTC).isoformat()
    payload = _checkpoint_file_payload(seq=seq, hash_hex=hash_hex, at=at)
    signature = signing.Signer(salt=_CHECKPOINT_FILE_SALT).sign(payload).rsplit(":", 1)[1]
    document = {"seq": seq, "hash": hash_hex, "verified_at": at, "signature": signature}
    partial = path.with_name(path.name + ".partial")
    try:
        partial.write_text(json.dumps(document) + "\n", encoding="utf-8")
        os.replace(partial, path)
    except OSError:
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)  # no half-written head left beside the file
        raise


# --- archive files ------------------------------------------------------------------------------------------


def audit_archive_verify(paths: list[Path], *, checkpoint_file: Path | None = None) -> tuple[ChainReport, list[str]]:
    """Check archive files as one chain, oldest first whatever the order given (:func:`_archives_in_chain_order`;
    a note names the order used where it differs): each line's hash, MAC, links and seq continuity,
    the final checkpoint line against the last event, the anchors that fall inside them, and where the database
    still records a checkpoint at a file's start or end, that it is authentic and agrees. Returns the report
    and one summary line per file.

    With ``checkpoint_file``, its signed seq and hash too, where the files hold that seq (a note says whether
    they did). The file must exist, and is never rewritten: it holds the table's head, which this does not
    check."""
    report = ChainReport()
    summaries: list[str] = []
    keyring = chain_keyring()
    recorded = _recorded_checkpoints(keyring, report)
    anchors = anchors_load(anchor_store(), keyring)
    if anchors.problem:
        report.problem = anchors.problem
    signed = _signed_checkpoint_of_archives(checkpoint_file, report) if checkpoint_file else None
    if report.problem:
        return report, summaries
    start: tuple[int, str] | None = None
    signed_in: Path | None = None
    unvouched: tuple[Path, int, int] | None = None  # the first file nothing authenticated yet: its last seq, index
    paths, reordered = _archives_in_chain_order(paths)
    if reordered is not None:
        report.notes.append(reordered)  # before the loop, which takes each file's summary from the notes' end
    for path in paths:
        verifier = archive_file_verify(
            path, start=start, recorded=recorded, report=report, keyring=keyring, anchors=anchors.by_seq, signed=signed
        )
        if report.problem:
            return report, summaries
        summaries.append(report.notes.pop())
        if _archive_vouched_for(verifier, recorded):
            unvouched = None  # a file linked to the ones before it vouches for them too: its chain holds their hash
        elif unvouched is None:
            unvouched = (path, verifier.last_seq, len(summaries) - 1)
        if signed is not None and verifier.last_seq - verifier.count < signed[0] <= verifier.last_seq:
            signed_in = path
        report.count += verifier.count
        report.head_seq, report.head_hash = verifier.last_seq, verifier.last_hash
        start = (verifier.next_seq, verifier.last_hash)
    if unvouched is not None:
        report.problem = _(
            "archive %(path)s: its lines carry no MAC and the database holds no checkpoint at seq %(seq)s that "
            "vouches for it — unauthenticated (anyone can write such a file: check it against the database that "
            "archived it)"
        ) % {"path": unvouched[0], "seq": unvouched[1]}
        return report, summaries[: unvouched[2]]  # no "verified" line for what is not
    if signed is not None:
        report.notes.append(
            _signed_checked_note(signed[0], signed_in)
            if signed_in is not None
            else _("signed checkpoint file's seq %(seq)s is in none of these archives: not checked")
            % {"seq": signed[0]}
        )
    return report, summaries


def _archives_in_chain_order(paths: list[Path]) -> tuple[list[Path], str | None]:
    """``paths`` by the seq of their first event: archives are one sequence, so the order they are given in does not
    matter (given newest first, the older file's first event read as inserted after the newer one). With a note
    naming the order used where it differs from the one given. Where a file's first seq cannot be read (missing,
    not gzip, not an event first), the order given: that file's check names its problem."""
    firsts: list[int] = []
    for path in paths:
        seq = _archive_first_seq(path)
        if seq is None:
            return paths, None
        firsts.append(seq)
    ordered = [path for _first, _given, path in sorted(zip(firsts, range(len(paths)), paths, strict=True))]
    if ordered == paths:
        return paths, None
    return ordered, _("archives checked oldest first (by their first seq), in this order: %(paths)s") % {
        "paths": ", ".join(str(path) for path in ordered)
    }


def _archive_first_seq(path: Path) -> int | None:
    """The seq of the first line of an archive file, or None where it cannot be read as an event's."""
    try:
        with gzip.open(path, "rt", encoding="utf-8") as lines:
            first = json.loads(lines.readline())
    except (OSError, EOFError, zlib.error, UnicodeDecodeError, ValueError, RecursionError):
        return None
    seq = first.get("seq") if isinstance(first, dict) else None
    return seq if type(seq) is int else None


def _archive_vouched_for(verifier: ChainVerifier, recorded: dict[int, str]) -> bool:
    """Whether an archive file that verified is authenticated: its lines carry MACs (checked), or its last hash is
    the one of the database's checkpoint at its end (MAC-checked, ``recorded``) or of an anchor or signed checkpoint
    file at its last seq (checked as the file was walked). A file without MACs (written before events had one, or
    stripped of them) is otherwise only a chain of hashes, which anyone can compute."""
    return (
        verifier.keyring is not None
        or recorded.get(verifier.last_seq) == verifier.last_hash
        or verifier.last_seq in verifier.anchors
    )


def _signed_checkpoint_of_archives(path: Path, report: ChainReport) -> tuple[int, str] | None:
    """The signed seq and hash to check archives against: a checkpoint file that does not exist is a problem here
    (there is nothing to check, and this writes none)."""
    if not path.exists():
        report.problem = _("checkpoint file %(path)s does not exist") % {"path": path}
        return None
    return _checkpoint_file_read(path, report)


def _recorded_checkpoints(keyring: ChainKeyring, report: ChainReport) -> dict[int, str]:
    """The database's checkpoints (seq -> hash); a forged one (MAC) is the report's problem."""
    recorded: dict[int, str] = {}
    for seq, hash_hex, count, mac in AuditCheckpoint.objects.order_by("seq").values_list("seq", "hash", "count", "mac"):
        why = keyring.check("checkpoint", checkpoint_message(seq, hash_hex, count), mac)
        if why is not None:
            report.problem = _checkpoint_forged(seq, why)
            return recorded
        recorded[seq] = hash_hex
    return recorded


def archive_file_verify(
    path: Path,
    *,
    start: tuple[int, str] | None,
    recorded: dict[int, str],
    report: ChainReport,
    keyring: ChainKeyring,
    anchors: dict[int, Anchor],
    replays: dict[str, tuple[int, Any]] | None = None,
    signed: tuple[int, str] | None = None,
) -> ChainVerifier:
    """Check one archive file, starting at ``start`` (seq, prev_hash) or where its first line says; sets
    ``report.problem`` on the first problem, else appends a summary line to ``report.notes``. ``replays``: events
    of the table by nonce (:func:`_archived_replay_candidates`), none of which may have the nonce of an event in
    the file. ``signed``: a signed checkpoint file's seq and hash, which the file's event at that seq (if it holds
    it) must have. Never raises.

    A file that cannot be opened or read (:class:`CannotCheck`) leaves the chain unchecked; one whose bytes are not
    what ``archive_audit`` wrote (not gzip, corrupt or cut-short compressed data, not UTF-8) was altered."""
    try:
        verifier = _archive_file_walk(path, start, recorded, report, keyring, anchors, replays or {}, signed)
    except (EOFError, gzip.BadGzipFile, zlib.error, UnicodeDecodeError) as exc:
        report.problem = _("archive %(path)s: unreadable (%(error)s)") % {"path": path, "error": exc}
        return ChainVerifier()
    except OSError as exc:
        report.problem = CannotCheck(
            _("archive %(path)s: unreadable (%(error)s)") % {"path": path, "error": os_error_text(exc)}
        )
        return ChainVerifier()
    return verifier


def _archive_file_walk(
    path: Path,
    start: tuple[int, str] | None,
    recorded: dict[int, str],
    report: ChainReport,
    keyring: ChainKeyring,
    anchors: dict[int, Anchor],
    replays: dict[str, tuple[int, Any]],
    signed: tuple[int, str] | None,
) -> ChainVerifier:
    verifier: ChainVerifier | None = None
    checkpoint: dict[str, Any] | None = None
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        for number, text in enumerate(lines, start=1):
            try:
                line = json.loads(text)
            except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
                report.problem = _("archive %(path)s line %(line)s: not JSON — altered") % {
                    "path": path,
                    "line": number,
                }
                break
            if checkpoint is not None:
                report.problem = _("archive %(path)s line %(line)s: after the checkpoint line — inserted") % {
                    "path": path, "line": number
                }  # fmt: skip
                break
            if isinstance(line, dict) and "checkpoint" in line:
                checkpoint = line["checkpoint"]
                if not _is_checkpoint(checkpoint):
                    report.problem = _("archive %(path)s line %(line)s: not a checkpoint — altered") % {
                        "path": path, "line": number
                    }  # fmt: skip
                    break
                continue
            if not _is_event_line(line):
                report.problem = _("archive %(path)s line %(line)s: not an event — altered") % {
                    "path": path, "line": number
                }  # fmt: skip
                break
            if verifier is None:
                verifier = _archive_verifier(path, line, start, recorded, report, keyring)
                if verifier is None:
                    break
                for seq, anchor in anchors.items():
                    if seq >= verifier.next_seq:
                        verifier.anchor(seq=seq, hash_hex=anchor.hash, label=_anchor_label(anchor))
                if signed is not None and signed[0] >= verifier.next_seq:
                    verifier.anchor(seq=signed[0], hash_hex=signed[1], label=_signed_checkpoint_label())
            if ("mac" in line) != (verifier.keyring is not None):
                report.problem = _("archive %(path)s line %(line)s: MACs on some lines and not on others — altered") % {
                    "path": path, "line": number
                }  # fmt: skip
                break
            problem = verifier.feed(line)
            if problem is not None:
                report.problem = _archive_problem(path, chain_break_words(problem))
                break
            copy = replays.get(line["nonce"]) if replays and isinstance(line.get("nonce"), str) else None
            if copy is not None:
                report.problem = _(
                    "event seq %(seq)s (id %(id)s): the nonce of archived event seq %(archived)s (%(path)s)"
                    " — replayed (a copy of its pending row chained again)"
                ) % {"seq": copy[0], "id": copy[1], "archived": line["seq"], "path": path}
                break
    if report.problem:
        return verifier or ChainVerifier()
    if verifier is None:
        report.problem = _("archive %(path)s: no events") % {"path": path}
        return ChainVerifier()
    if not isinstance(checkpoint, dict):
        report.problem = _("archive %(path)s: no checkpoint line — truncated") % {"path": path}
        return verifier
    tail = verifier.check_tail(
        head_seq=checkpoint["seq"], head_hash=checkpoint["hash"], head_label=_label(gettext_noop("checkpoint"))
    )
    if tail is not None:
        report.problem = _archive_problem(path, chain_break_words(tail))
    elif verifier.last_seq != checkpoint["seq"]:
        report.problem = _archive_problem(path, _("events after the checkpoint — inserted"))
    elif verifier.last_seq in recorded and recorded[verifier.last_seq] != verifier.last_hash:
        report.problem = _("archive %(path)s: checkpoint seq %(seq)s differs from the database's — replaced") % {
            "path": path, "seq": verifier.last_seq
        }  # fmt: skip
    first = verifier.last_seq - verifier.count + 1
    report.notes.append(
        _("archive %(path)s: verified %(count)s events (seq %(first)s to %(last)s), checkpoint %(hash)s")
        % {"path": path, "count": verifier.count, "first": first, "last": verifier.last_seq, "hash": verifier.last_hash}
    )
    return verifier


def _is_event_line(line: Any) -> bool:
    """Whether an archive line has an event's shape: an int ``seq`` (not a bool), a text ``hash`` and ``prev_hash``.
    These the verifier reads as they are (it compares the seq with ints and the hashes with its own); anything else
    is refused here rather than fed to it to raise. A missing or odd hashed field is the verifier's to find (the
    event's hash cannot be computed: "unreadable", naming the event)."""
    return (
        isinstance(line, dict)
        and _is_seq(line.get("seq"))
        and isinstance(line.get("hash"), str)
        and isinstance(line.get("prev_hash"), str)
    )


def _is_checkpoint(checkpoint: Any) -> bool:
    """Whether an archive's checkpoint line holds what ``archive_audit`` writes: an int ``seq`` and a text ``hash``."""
    return isinstance(checkpoint, dict) and _is_seq(checkpoint.get("seq")) and isinstance(checkpoint.get("hash"), str)


def _is_seq(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _archive_problem(path: Path, problem: str) -> str:
    """A problem of the chain in an archive file, named after the file."""
    return _("archive %(path)s: %(problem)s") % {"path": path, "problem": problem}


def _archive_verifier(
    path: Path,
    first: dict[str, Any],
    start: tuple[int, str] | None,
    recorded: dict[int, str],
    report: ChainReport,
    keyring: ChainKeyring,
) -> ChainVerifier | None:
    """Where a file's chain starts: at ``start``, at genesis, or after a recorded checkpoint. A file whose
    lines carry no MAC was written before events had one: its events are checked by hash only, and are
    authenticated only where the database's (MAC'd) checkpoint at its end agrees with it."""
    with_macs = "mac" in first
    if not with_macs:
        report.notes.append(
            _("archive %(path)s: written before events carried a MAC; authenticated only by the database's checkpoint")
            % {"path": path}
        )
    options: dict[str, Any] = {"keyring": keyring, "require_mac": with_macs}
    if start is not None:
        seq, prev_hash = start
        label = _label(gettext_noop("the previous file's checkpoint")) if seq > 1 else ""
        return ChainVerifier(start_seq=seq, start_prev_hash=prev_hash, start_label=label, **options)
    seq = first["seq"]
    if isinstance(seq, int) and seq > 1:
        before = recorded.get(seq - 1)
        if before is not None:
            return ChainVerifier(
                start_seq=seq,
                start_prev_hash=before,
                start_label=_archive_checkpoint_label(seq - 1),
                **options,
            )
        report.notes.append(
            _(
                "archive %(path)s starts at seq %(seq)s: its link to seq %(before)s is not checked (pass the earlier "
                "archive first)"
            )
            % {"path": path, "seq": seq, "before": seq - 1}
        )
        return ChainVerifier(start_seq=seq, start_prev_hash=str(first.get("prev_hash")), **options)
    return ChainVerifier(start_prev_hash=GENESIS_HASH, **options)
