"""Writes to the audit record (verification is in ``audit/verification.py``, archiving in ``audit/archive.py``). Everything stored here is masked first.

The record is a hash chain (``audit/chain.py``) with a gap-free ``seq``. Events join it in one of two ways
(``AUDIT_CHAIN_MODE``; "auto", the default, is deferred on PostgreSQL and inline on SQLite):

**Inline** (SQLite's default). Every append runs in one transaction that (1) locks the single
:class:`~audit.models.AuditChainHead` row (``SELECT ... FOR UPDATE`` on PostgreSQL; on SQLite the transaction
begins with ``BEGIN IMMEDIATE``, which already takes the database's one write lock), (2) takes ``seq = head.seq +
1`` and ``prev_hash = head.hash``, (3) inserts the event with its hash and the hash's MAC and (4) moves the head
to it, with the head's own MAC. The lock is held until the caller's transaction ends, so on PostgreSQL every
writer takes turns on one row for the whole of its transaction.

**Deferred** (PostgreSQL's default): no writer holds anything shared. An append inserts the masked event into
:class:`~audit.models.AuditPendingEvent`, its ``id`` from the table's sequence, with a random one-time ``nonce``
and a MAC of its content hash with the nonce (:func:`audit.chain.pending_hash`), and on PostgreSQL reads the head
in the same statement: outside a transaction that one statement is the append's only round trip and its only
commit. The head's MAC is checked
after it (the chain still fails closed); a rolled-back append takes its pending row with it. After the commit
(``on_commit``) the writer wakes its process's chainer thread (:class:`_BackgroundChainer`, on PostgreSQL;
``AUDIT_CHAIN_BACKGROUND``) or, without one, chains itself. *The chainer* (:func:`audit_chain_pending`) is whoever
holds the chainer's lock (on PostgreSQL a session advisory lock, tried with ``pg_try_advisory_lock``, which never
waits); it chains in batches, each one short transaction: it locks the head, reads up to a batch of pending rows
in ``id`` order, checks each row's MAC and that its nonce is in no event yet (a copy of a row chained before is
never chained again: the events' nonces are unique), gives each the next ``seq``, ``prev_hash``, ``hash`` and
event MAC exactly as the inline path would, inserts them into :class:`~audit.models.AuditEvent`, deletes their pending rows and
moves the head. It goes on while there is something to chain, lets go of the lock, and re-reads the pending
table: a writer whose chainer found the lock taken had committed before it tried, so that re-read sees its row.
A chainer thread pauses ``AUDIT_CHAIN_GATHER_S`` before each pass, also when that re-read finds more, so that
while writers keep appending, a pass chains what gathered meanwhile instead of chasing each commit with a pass of
its own; and in a worker it lets the run it is executing go first (:func:`audit_chain_held_off`), for at most
``AUDIT_CHAIN_HOLD_OFF_S``, so that its pass falls between runs rather than in the middle of one.
So the chain is computed by one chainer at a time, in order, a few milliseconds after commit, with one lock taken
per burst of batches instead of one per event for a whole transaction. A process killed between its commit and
the chaining leaves rows pending until the next append's chaining or the workers' timer
(``AUDIT_CHAIN_INTERVAL_S``); readers of the record chain what is pending before they read
(:func:`audit_chain_catch_up`).

What a chained event proves is the same in both modes (``verify_audit`` runs unchanged over the events). The
difference is the window: an event waiting in the pending table is protected by its own MAC (a forged or edited
pending row, or a copy of one chained already, is never chained, and ``verify_audit`` names it) but not yet by
the chain, so its removal before it is chained is not detected. That window is the *chain lag*, read by :func:`chain_lag` (count and age of the oldest
pending event; for ``/metrics``) and reported by ``verify_audit``.

The chain fails closed: a missing head, or one whose MAC does not verify, is never rebuilt from the events (that
is what someone who cut the tail off would want); the append raises :class:`AuditChainHeadMissing` or
:class:`AuditChainHeadForged`, both ``DatabaseError``s, so the caller's transaction and a run fail loudly.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from secrets import token_hex
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, transaction
from django.db.models import Count, Min
from django.utils import timezone

from agent_platform.json import UnicodeJSONEncoder
from agent_platform.text import grapheme_cut
from audit.chain import (
    GENESIS_HASH,
    POSTGRES_CANONICAL_TIME,
    ChainKeyring,
    event_hash,
    head_message,
    json_value_plain,
    json_values,
    pending_hash,
    sqlite_row_as_orm,
)
from audit.chain_keys import chain_keyring
from audit.masking import mask_text, mask_value, truncate
from audit.models import AuditChainHead, AuditCheckpoint, AuditEvent, AuditPendingEvent
from audit.row_statements import RowInsert

logger = logging.getLogger(__name__)

_HEAD_ID = 1
# The chainer's advisory lock on PostgreSQL (a constant of our own: "audit chain" in ASCII).
_CHAINER_LOCK_KEY = 0x61756469745F6368
_CHAIN_BATCH = 2000
_CHAIN_ROUNDS = 8  # batches one call chains at most
_BUSY_BACKOFF_S = 0.005  # a chainer thread that found the lock taken waits this long before it tries again
_LOCK_WAIT_S = 5.0  # how long a reader catching up waits for the chainer of the moment
_BUSY_BATCH = 32  # a batch at least this long: writers are busy, the chainer keeps the lock for another one
_CONTENT_FIELDS = (
    "created_at", "run_id", "source", "action", "mcp_id", "tool", "call_id", "args", "result", "ok", "reason",
    "attempt", "latency_ms", "actor",
)  # fmt: skip
# An event as the chain writes it inline: its content, its place and its MAC (one compiled statement,
# audit/row_statements.py); no nonce (null), which only the deferred path's events carry.
_EVENT_INSERT = RowInsert(AuditEvent, (*_CONTENT_FIELDS, "seq", "prev_hash", "hash", "mac"))


class AuditChainHeadMissing(DatabaseError):
    """The chain head row is gone: nothing is appended until someone finds out why (``verify_audit``)."""


class AuditChainHeadForged(DatabaseError):
    """The chain head's MAC does not verify: it was moved by someone without the chain key."""


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
    named_rows: Iterable[str] = (),
) -> AuditEvent:
    """Append one audit event to the chain. Arguments and result are masked (key names, value patterns and
    the exact ``secrets`` given, plus every registered secret) and the result is truncated before it is stored.
    ``named_rows``: arguments masked by their values only, not by a name that looks secret (a change's relation
    fields: a budget's ``api_key`` is the key's name and prefix, never the key; and its secret maps' diffs, which
    name the secrets changed, never a value).

    Runs in its own transaction, or inside the caller's (see the module docstring: inline, the caller then holds
    the chain head until it commits; deferred, the event is chained just after the caller commits); if the append
    fails there, the caller's transaction can only roll back: a change is never committed without its audit
    event. Inline, returns the saved event with its ``seq`` and ``hash``; deferred, the event as it will be
    chained, unsaved, without them (they are the chainer's).
    """
    event, content = _masked_event(dict(locals()))  # the arguments above, as audit_events_record takes them
    if chain_mode() == "deferred":
        _pending_append([(event, content)])
    else:
        _chain_append_many([(event, content)])
    return event


def audit_events_record(events: Iterable[dict[str, Any]]) -> list[AuditEvent]:
    """Append several audit events in a row (each a dict of :func:`audit_event_record`'s arguments), in order,
    masked and truncated as one by one. Inline, the chain head is read and moved once for all of them (one
    turn on the head instead of one per event); deferred, each becomes its pending row, all in one statement. In
    one transaction (the caller's, or its own): all of them are recorded, or none."""
    built = [_masked_event(dict(arguments)) for arguments in events]
    if not built:
        return []
    with transaction.atomic(savepoint=False):
        if chain_mode() == "deferred":
            _pending_append(built)
        else:
            _chain_append_many(built)
    return [event for event, _ in built]


# audit_event_record's arguments after ``source``, with their defaults.
_EVENT_DEFAULTS: dict[str, Any] = {
    "action": "tool.call",
    "run_id": None,
    "mcp_id": "",
    "tool": "",
    "call_id": "",
    "args": None,
    "result": None,
    "ok": True,
    "reason": "",
    "attempt": 1,
    "latency_ms": None,
    "actor": "",
    "secrets": (),
    "named_rows": (),
}


@dataclass(frozen=True)
class _JsonContent:
    """An event's JSON fields as the chain hashes them (``hashed``: ``args`` and ``result``), their JSON text as
    stored (``texts``, None for a null) and whether both are plain (``audit.chain.json_value_plain``)."""

    hashed: dict[str, Any]
    texts: dict[str, str | None]
    plain: bool


def _masked_event(fields: dict[str, Any]) -> tuple[AuditEvent, _JsonContent]:
    """The unsaved event (masked, truncated) and its JSON fields in the form the chain hashes."""
    unknown = set(fields) - {"source", *_EVENT_DEFAULTS}
    if unknown or "source" not in fields:
        raise TypeError(f"audit event: unknown arguments {sorted(unknown)} or no source")
    f = {**_EVENT_DEFAULTS, **fields}
    secret_list = list(f["secrets"])
    # Stored as the database gives them back (dates and decimals as text), so that the hash taken now is the
    # hash recomputed from the row later; and hashed in the chain's number form, parsed from the same text.
    # A call's arguments are a caller's (a model's) text, cut as its result is; a configuration change's are the
    # change itself (its settings before and after), kept whole.
    args_max = None if str(f["action"]).startswith("config.") else settings.PLATFORM_AUDIT_RESULT_MAX_CHARS
    masked_args = _masked_args(f["args"] or {}, secrets=secret_list, named_rows=frozenset(f["named_rows"]))
    if args_max is not None:
        masked_args = _long_texts_cut(masked_args, args_max)
    args_text, stored_args, hashed_args, args_plain = _stored_json(masked_args, max_chars=args_max)
    result_text, stored_result, hashed_result, result_plain = _stored_json(
        mask_value(f["result"], secrets=secret_list), max_chars=settings.PLATFORM_AUDIT_RESULT_MAX_CHARS
    )
    event = AuditEvent(
        run_id=AuditEvent._meta.get_field("run_id").to_python(f["run_id"]),
        source=str(f["source"]),
        action=str(f["action"]),
        mcp_id=str(f["mcp_id"]),
        tool=str(f["tool"])[:200],  # a name a model made up is masked by the gate, which knows the real ones
        # A call id is a caller's (a model's) text: masked as the reason is, then cut.
        call_id=mask_text(str(f["call_id"]), secrets=secret_list)[:100],
        args=stored_args,
        result=stored_result,
        ok=bool(f["ok"]),
        # A reason code may carry a name a model wrote (``args:unknown:<name>``): masked as the arguments are.
        reason=mask_text(str(f["reason"]), secrets=secret_list)[:200],
        attempt=int(f["attempt"]),
        latency_ms=None if f["latency_ms"] is None else float(f["latency_ms"]),
        actor=str(f["actor"])[:200],
    )
    return event, _JsonContent(
        {"args": hashed_args, "result": hashed_result}, {"args": args_text, "result": result_text},
        args_plain and result_plain,
    )  # fmt: skip


def _masked_args(args: dict[str, Any], *, secrets: list[str], named_rows: frozenset[str]) -> Any:
    rows = named_rows & args.keys()
    if not rows:
        return mask_value(args, secrets=secrets)
    masked = mask_value({k: v for k, v in args.items() if k not in rows}, secrets=secrets)
    for name in rows:  # a field's name: text masking cannot change it
        masked[name] = mask_value(args[name], secrets=secrets)
    return {name: masked[name] for name in args if name in masked} | masked


def chain_mode(using: str = DEFAULT_DB_ALIAS) -> str:
    """``"deferred"`` or ``"inline"``: ``AUDIT_CHAIN_MODE``, where "auto" means deferred on PostgreSQL."""
    mode = str(getattr(settings, "AUDIT_CHAIN_MODE", "auto")).strip().lower()
    if mode in ("deferred", "inline"):
        return mode
    return "deferred" if connections[using].vendor == "postgresql" else "inline"


class _StoredJSONEncoder(UnicodeJSONEncoder):
    """What the JSONFields store with (``UnicodeJSONEncoder``), noting when a value needed its ``default`` (a type
    JSON has none of: a date, a decimal, a UUID...)."""

    def default(self, o: Any) -> Any:
        _encoding.defaulted = True
        return super().default(o)


_STORED_JSON = _StoredJSONEncoder()
_encoding = threading.local()


# The most characters of one text kept in a call's arguments over ``PLATFORM_AUDIT_RESULT_MAX_CHARS``.
ARGUMENT_TEXT_KEPT_CHARS = 1000


def _long_texts_cut(args: Any, max_chars: int) -> Any:
    """A call's arguments whose JSON is longer than ``max_chars``, with each text longer than
    ``ARGUMENT_TEXT_KEPT_CHARS`` cut to it and marked with its length: its names and its short values stay as they
    were (a stand-in for the whole call lost them, and an eval case that expects ``{"title": …}`` of a call whose
    body was long failed ``tools:args``). Arguments still over the bound after that are cut whole, as a result is."""
    try:
        if len(_STORED_JSON.encode(args)) <= max_chars:
            return args
    except (TypeError, ValueError, RecursionError):
        return args  # ``_stored_json`` meets it (``truncate``'s own way)

    def cut(value: Any) -> Any:
        if isinstance(value, str) and len(value) > ARGUMENT_TEXT_KEPT_CHARS:
            return f"{grapheme_cut(value, ARGUMENT_TEXT_KEPT_CHARS)}…[cut: {len(value)} characters]"
        if isinstance(value, dict):
            return {key: cut(item) for key, item in value.items()}
        if isinstance(value, list):
            return [cut(item) for item in value]
        return value

    return cut(args)


def _stored_json(value: Any, *, max_chars: int | None = None) -> tuple[str | None, Any, Any, bool]:
    """``value``'s JSON text as stored, the value as the database will give it back, the same in the form the
    chain hashes, and whether that is plain (``audit.chain.json_value_plain``). ``max_chars``: ``value`` is
    :func:`~audit.masking.truncate`'d to it first.

    One encoding and one parse where they suffice: a text written without the encoder's ``default`` is exactly
    the text ``truncate`` measures (``json.dumps`` with the same options), so it is measured as it is; and JSON
    text with no integral float (``4.0``) parses to the same value both ways, so one parse gives both."""
    if value is None:
        return None, None, None, True
    text: str | None = None
    _encoding.defaulted = False
    with contextlib.suppress(TypeError, ValueError, RecursionError):  # truncate's own way below meets it again
        text = _STORED_JSON.encode(value)
    if max_chars is not None and (text is None or _encoding.defaulted or len(text) > max_chars):
        value, text = truncate(value, max_chars=max_chars), None
    if text is None:  # a value JSON cannot hold raises here, as before
        text = _STORED_JSON.encode(value)
    stored, hashed, plain = json_values(text)
    return text, stored, hashed, plain


def _stored_texts(connection: Any, contents: list[_JsonContent]) -> list[dict[str, str | None]] | None:
    """On SQLite, the JSON fields' text as ``_masked_event`` wrote it, stored as it is (the field would write the
    same text again from the value parsed back from it). Elsewhere None: the fields write their values."""
    return [content.texts for content in contents] if connection.vendor == "sqlite" else None


def _chain_append_many(built: list[tuple[AuditEvent, _JsonContent]], *, using: str = DEFAULT_DB_ALIAS) -> None:
    """Inline: the head read (and locked) once, the events linked in order and inserted in one statement, the
    head moved once onto the last; one event or several, each exactly what it would be appended alone. No
    savepoint inside a caller's transaction: cheaper, and a failed append fails the whole transaction."""
    connection = connections[using]
    head_table = connection.ops.quote_name(AuditChainHead._meta.db_table)
    keyring = chain_keyring()
    with transaction.atomic(using=using, savepoint=False), connection.cursor() as cursor:
        lock = " FOR UPDATE" if connection.features.has_select_for_update else ""
        seq, prev_hash = _chain_head_read(cursor, head_table, keyring, lock=lock)
        now = timezone.now()  # taken under the lock: time never runs backwards along the chain
        for event, content in built:
            seq += 1
            event.seq = seq
            event.prev_hash = prev_hash
            event.created_at = now
            event.hash = event_hash({**_hashed_values(event), **content.hashed}, plain=content.plain)
            event.mac = keyring.sign("event", event.hash)
            prev_hash = event.hash
        _EVENT_INSERT.insert(
            [event for event, _ in built], using=using, given=_stored_texts(connection, [c for _, c in built])
        )
        cursor.execute(
            f"UPDATE {head_table} SET seq = %s, hash = %s, mac = %s WHERE id = %s",  # noqa: S608 - table name from the model
            [seq, prev_hash, _head_signed(keyring, seq, prev_hash), _HEAD_ID],
        )


def _pending_append(built: list[tuple[AuditEvent, _JsonContent]], *, using: str = DEFAULT_DB_ALIAS) -> None:
    """Deferred: insert the events as MAC'd pending rows, in order (one statement for up to
    ``_PENDING_ROWS_PER_STATEMENT``), and have them chained once the transaction has committed.

    On PostgreSQL one statement, which also reads the head: outside a transaction it is the append's only round
    trip and its only commit. The head's MAC is checked after the insert; a missing or forged head raises, so a
    caller's transaction rolls back with the rows (outside one, the rows stay pending, protected by their own
    MACs, and are never chained after a head that cannot be trusted)."""
    connection = connections[using]
    keyring = chain_keyring()
    now = timezone.now()
    for start in range(0, len(built), _PENDING_ROWS_PER_STATEMENT):
        chunk = built[start : start + _PENDING_ROWS_PER_STATEMENT]
        values: list[Any] = []
        for event, content in chunk:
            event.created_at = now
            event.nonce = token_hex(16)  # one-time: the chainer chains a pending row with this nonce once at most
            digest = pending_hash({**_hashed_values(event), **content.hashed}, plain=content.plain)
            # The JSON as the text it was hashed from (jsonb takes it on PostgreSQL, SQLite stores it as it is),
            # rather than written again by the driver from its value.
            given = {**content.texts, "mac": keyring.sign("pending", digest)}
            values += _PENDING_INSERT.row_params(event, connection, given=given)
        if connection.vendor == "postgresql":
            with _statement_cursor(connection) as cursor:
                cursor.execute(_pending_insert_sql(connection, len(chunk)), [*values, _HEAD_ID])
                _head_check(cursor.fetchone(), keyring)
        else:
            with transaction.atomic(using=using, savepoint=False), connection.cursor() as cursor:
                head_table = connection.ops.quote_name(AuditChainHead._meta.db_table)
                _chain_head_read(cursor, head_table, keyring, lock="")  # no lock; a missing or forged head refuses
                cursor.execute(_pending_insert_sql(connection, len(chunk)), values)
    if connection.in_atomic_block or not connection.get_autocommit():  # Django's on_commit keeps or refuses it
        transaction.on_commit(lambda: _chain_after_commit(using), using=using)
    else:  # committed already (autocommit): what on_commit would do, without making a callback for it
        _chain_after_commit(using)


@contextlib.contextmanager
def _statement_cursor(connection: Any) -> Iterator[Any]:
    """A cursor for one statement on PostgreSQL: Django's own while anything watches its queries (a debug cursor,
    a test counting them, an execute wrapper), else one psycopg cursor kept per connection: no new cursor and no
    wrapper per append (a tenth to a fifth of its time), with Django's errors raised all the same."""
    if connection.queries_logged or connection.execute_wrappers:
        with connection.cursor() as cursor:
            yield cursor
        return
    connection.ensure_connection()
    connection.validate_no_broken_transaction()
    raw = connection.connection
    kept = getattr(connection, "_audit_cursor", None)
    if kept is None or kept[0] is not raw:
        kept = connection._audit_cursor = (raw, raw.cursor())
    with connection.wrap_database_errors:
        yield kept[1]


_PENDING_ROWS_PER_STATEMENT = 50  # 16 parameters a row: far under every database's limit
_JSON_FIELDS = ("args", "result")
# The pending table's fields as an append writes them (the content, then ``mac`` and ``nonce``), in a statement of
# its own (below).
_PENDING_INSERT = RowInsert(AuditPendingEvent, (*_CONTENT_FIELDS, "mac", "nonce"))
_PENDING_SQL: dict[tuple[str, int], str] = {}


def _pending_insert_sql(connection: Any, rows: int) -> str:
    """The pending rows' insert for ``rows`` rows, made once per database vendor and number of rows: on
    PostgreSQL with the head's read after it (its last parameter, the head's id), the JSON fields cast to jsonb."""
    text = _PENDING_SQL.get((connection.vendor, rows))
    if text is None:
        quote = connection.ops.quote_name
        fields = _PENDING_INSERT.fields()
        postgres = connection.vendor == "postgresql"
        row = "(" + ", ".join("%s::jsonb" if postgres and f.name in _JSON_FIELDS else "%s" for f in fields) + ")"
        text = (
            f"INSERT INTO {quote(AuditPendingEvent._meta.db_table)} ({', '.join(quote(f.column) for f in fields)}) "  # noqa: S608 - names from the model
            f"VALUES {', '.join([row] * rows)}"
        )
        if postgres:
            head_table = quote(AuditChainHead._meta.db_table)
            text = f"WITH added AS ({text} RETURNING 1) SELECT seq, hash, mac FROM {head_table} WHERE id = %s"  # noqa: S608
        _PENDING_SQL[(connection.vendor, rows)] = text
    return text


def _chain_after_commit(using: str) -> None:
    if chain_background(using):
        _background_chainer(using).wake()
        return
    try:
        audit_chain_pending(using=using)
    except DatabaseError:  # the writer's own transaction is committed: its event waits, the lag shows it
        logger.exception("audit chaining failed: events stay pending (see verify_audit)")


def chain_background(using: str = DEFAULT_DB_ALIAS) -> bool:
    """Whether a committed append leaves its chaining to this process's chainer thread (``AUDIT_CHAIN_BACKGROUND``:
    "auto", the default, means on PostgreSQL) rather than chaining itself before ``on_commit`` returns."""
    choice = str(getattr(settings, "AUDIT_CHAIN_BACKGROUND", "auto")).strip().lower()
    if choice in ("on", "off"):
        return choice == "on"
    return connections[using].vendor == "postgresql"


# Runs that this process is executing (``audit_chain_held_off``): its chainer thread waits for them, for a while.
_runs_held_off = 0
_no_run = threading.Condition()


@contextlib.contextmanager
def audit_chain_held_off() -> Iterator[None]:
    """While the block runs (a worker executing a run), this process's chainer thread does not start a pass, for
    at most ``AUDIT_CHAIN_HOLD_OFF_S`` from when a commit woke it: a pass (the chainer's lock, the pending rows
    read, the events inserted, the head moved: half a dozen round trips and their Python, in the run's
    interpreter) then falls between the worker's runs instead of in the middle of one, where it cost a
    PostgreSQL run about a quarter of its time, and under load a pass chains what several runs appended.
    Nested and concurrent blocks count; the chain's lag grows by at most as much."""
    global _runs_held_off
    with _no_run:
        _runs_held_off += 1
    try:
        yield
    finally:
        with _no_run:
            _runs_held_off = max(0, _runs_held_off - 1)  # a block left in a child forked inside it counts none
            if _runs_held_off == 0:
                _no_run.notify_all()


def _until_no_run_holds_off(deadline: float) -> None:
    with _no_run:
        _no_run.wait_for(lambda: _runs_held_off == 0, timeout=max(0.0, deadline - time.monotonic()))


class _BackgroundChainer:
    """One per process and database: a daemon thread, on a connection of its own, that chains what this
    process's writers committed. A writer's ``on_commit`` only wakes it, so an append outside a transaction is
    one insert and one commit; the thread chains everything pending in batches (one transaction per batch,
    whichever writers it came from), as the single chainer of the moment (the advisory lock). If another
    process's chainer holds the lock, that one re-reads the pending table after its commit, which comes after
    this process's writer committed, so nothing is left behind; what a process killed in between leaves, the
    workers' timer chains (``AUDIT_CHAIN_INTERVAL_S``)."""

    def __init__(self, using: str) -> None:
        self.using = using
        self.pid = os.getpid()
        self._changed = threading.Condition()
        self._asked = 0  # wake-ups asked for
        self._served = 0  # wake-ups a pass has started after (and finished)
        self._thread = threading.Thread(target=self._loop, name=f"audit-chainer-{using}", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        with self._changed:
            self._asked += 1
            self._changed.notify_all()

    def wait(self, timeout: float) -> bool:
        """Wait until a pass started after every wake-up so far has finished; False on timeout."""
        with self._changed:
            target = self._asked
            return self._changed.wait_for(lambda: self._served >= target, timeout)

    def _loop(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._asked > self._served)
            # A moment for the commits of the next few appends to join this pass: a writer appending
            # continuously then pays for a fraction of a pass per event, not a whole one. Then the run this
            # process is executing goes first, for a while.
            woken = time.monotonic()
            gather_s = float(getattr(settings, "AUDIT_CHAIN_GATHER_S", 0.05))
            hold_off_s = float(getattr(settings, "AUDIT_CHAIN_HOLD_OFF_S", 1.0))
            time.sleep(gather_s)
            _until_no_run_holds_off(woken + hold_off_s)
            with self._changed:
                target = self._asked
            try:
                _, busy = _chain_pending(
                    using=self.using,
                    batch=_CHAIN_BATCH,
                    rounds=None,
                    wait=False,
                    gather_s=gather_s,
                    hold_off_s=hold_off_s,
                )
                if busy:
                    # Another process's chainer is at work and re-reads after it lets go, so nothing is lost; wait
                    # a moment before the next try rather than ask for the lock after every commit.
                    time.sleep(_BUSY_BACKOFF_S)
            except Exception:  # the writers' transactions are committed: their events wait, the lag shows it
                logger.exception("audit chaining failed: events stay pending (see verify_audit)")
                connections[self.using].close()
                time.sleep(0.5)  # a database that is down is not hammered; the next wake-up tries again
            finally:
                # The thread keeps its connection between passes (a new one per pass would cost more than the
                # pass, whatever CONN_MAX_AGE says for requests); after a failure it is closed (above).
                with self._changed:
                    self._served = target
                    self._changed.notify_all()


_chainers: dict[str, _BackgroundChainer] = {}
_chainers_lock = threading.Lock()


def _background_chainer(using: str) -> _BackgroundChainer:
    with _chainers_lock:
        chainer = _chainers.get(using)
        if chainer is None or chainer.pid != os.getpid():
            chainer = _chainers[using] = _BackgroundChainer(using)
        return chainer


def _chainers_forget_after_fork() -> None:
    """A forked child has none of its parent's threads: it starts its own chainer when it first appends."""
    global _chainers_lock, _no_run, _runs_held_off
    _chainers.clear()
    _chainers_lock = threading.Lock()
    _no_run, _runs_held_off = threading.Condition(), 0  # the parent's runs are not the child's


os.register_at_fork(after_in_child=_chainers_forget_after_fork)


def audit_chain_wait(*, using: str = DEFAULT_DB_ALIAS, timeout: float = 10.0) -> bool:
    """Wait until what this process appended so far has been chained by its chainer thread (deferred,
    background); True at once where there is none. False if it did not happen within ``timeout`` seconds (the
    events then wait pending: the lag shows them). Called at exit, so that a short-lived process (a management
    command, a shell) does not leave its events to the workers' timer."""
    chainer = _chainers.get(using)
    if chainer is None or chainer.pid != os.getpid():
        return True
    return chainer.wait(timeout)


@atexit.register
def _chain_wait_at_exit() -> None:
    for using in list(_chainers):
        if not audit_chain_wait(using=using, timeout=10.0):
            logger.warning("audit events of this process still pending at exit: the workers' timer chains them")


def audit_chain_catch_up(*, using: str = DEFAULT_DB_ALIAS) -> int:
    """Before reading the chained events (a run's trace, the audit API), chain what is pending (deferred), so a
    reader finds every event committed before it started: one cheap query when nothing is pending; else it waits
    for the chainer of the moment (at most 5 s) and chains the rest itself. Does nothing inside a transaction (the chainer's
    lock would be held to its end) or inline. Returns how many events it chained."""
    connection = connections[using]
    if connection.in_atomic_block or chain_mode(using) != "deferred":
        return 0
    if not _pending_exists(using):
        return 0
    try:
        return audit_chain_pending(using=using, wait=True, rounds=None)
    except DatabaseError:  # a reader is not failed by the chain: the lag and verify_audit show it
        logger.exception("audit chaining failed: events stay pending (see verify_audit)")
        return 0


@dataclass(frozen=True)
class ChainLag:
    """Events appended but not chained yet: how many, and the age of the oldest in seconds (0 when none)."""

    count: int
    oldest_age_s: float


def chain_lag(*, using: str = DEFAULT_DB_ALIAS) -> ChainLag:
    """The chain's lag (deferred chaining; always 0 inline): one query, cheap enough for every ``/metrics``
    scrape. A lag that keeps growing means no chainer runs (writers died after commit and no worker's timer
    runs) or a pending row does not verify (``verify_audit`` names it)."""
    row = AuditPendingEvent.objects.using(using).aggregate(count=Count("id"), oldest=Min("created_at"))
    oldest = row["oldest"]
    age = 0.0 if oldest is None else max(0.0, (timezone.now() - oldest).total_seconds())
    return ChainLag(count=int(row["count"] or 0), oldest_age_s=age)


def audit_chain_pending(
    *, using: str = DEFAULT_DB_ALIAS, batch: int = _CHAIN_BATCH, rounds: int | None = _CHAIN_ROUNDS, wait: bool = False
) -> int:
    """Chain the pending events (deferred mode), in ``id`` order, as the single chainer; returns how many this
    call chained. Returns at once (0) if another connection is chaining (``wait``: waits for it, then chains),
    which is safe: the chainer of the moment re-reads the pending table after it lets go of the chainer's lock,
    and so sees every row committed before this call tried it. Chains up to ``rounds`` batches (None: until none
    is left; beyond that, what is left goes to the next append's chaining or the workers' timer). Safe to call
    anywhere, any time (the workers' timer does); raises :class:`AuditChainHeadMissing` or
    :class:`AuditChainHeadForged` for a head that cannot be trusted. A pending row whose MAC does not verify
    stops the chaining before it (logged as an error; the chain's lag grows and ``verify_audit`` names the row).

    On PostgreSQL, outside a transaction, the chainer's lock is a session advisory lock, tried in one round trip
    (all a chainer that does not get it pays), held over batches of three round trips each (the head and the
    pending rows read; the events copied in; their pending rows deleted, the head moved and the commit
    pipelined) for as long as there is something to chain, and let go before the re-read. Inside a caller's
    transaction the lock is the transaction's (it cannot outlive it) and the batch is one ordinary transaction
    (savepoint)."""
    return _chain_pending(using=using, batch=batch, rounds=rounds, wait=wait)[0]


def _chain_pending(
    *, using: str, batch: int, rounds: int | None, wait: bool, gather_s: float = 0.0, hold_off_s: float = 0.0
) -> tuple[int, bool]:
    """:func:`audit_chain_pending`: (events chained, whether another chainer held the lock at the first try).

    ``gather_s`` (the chainer thread's): when the re-read after letting go of the lock finds more, the pause before
    the next pass, so that while writers keep appending, each pass chains what gathered meanwhile in one batch
    instead of chasing every commit with a pass of its own (a pass costs about as much as chaining 10 to 20 events);
    then, for at most ``hold_off_s``, it waits for the runs this process executes (:func:`audit_chain_held_off`).
    When nothing more is pending it returns at once."""
    connection = connections[using]
    session_lock = connection.vendor == "postgresql" and not connection.in_atomic_block
    total, done, first = 0, 0, True
    while True:
        if session_lock and not _chainer_lock(connection, wait=wait):
            return total, first
        first = False
        try:
            while rounds is None or done < rounds:
                if session_lock:
                    chained, blocked = _chain_batch_postgres(connection, batch)
                else:
                    chained, blocked = _chain_batch(using, batch, lock=connection.vendor == "postgresql", wait=wait)
                done += 1
                if chained is None:
                    return total, first
                if blocked:
                    return total + chained, False
                total += chained
                # Another batch at once only when this one found writers busy (a short batch: nothing much is
                # waiting, and the re-read after letting go of the lock catches what came meanwhile).
                if chained < (_BUSY_BATCH if session_lock else batch):
                    break
        finally:
            if session_lock:
                _chainer_unlock(connection)
        if rounds is not None and done >= rounds:
            # Writers keep appending faster than one chainer's rounds: the rest goes to the next append's
            # chaining (or the workers' timer), so that no writer is kept chaining for others indefinitely.
            return total, False
        # Re-read after letting go of the lock: a row whose chainer found the lock taken was committed before.
        if not _pending_exists(using):
            return total, False
        if gather_s > 0:
            time.sleep(gather_s)  # writers keep appending: what they add meanwhile joins the next pass
        if hold_off_s > 0:
            _until_no_run_holds_off(time.monotonic() + hold_off_s)
        wait = False


def _pending_exists(using: str) -> bool:
    """Whether any event waits to be chained: by the ``id`` index, whose entries for the rows the chainer deleted
    are skipped once seen dead (a scan of the table would read every deleted row until it is vacuumed)."""
    return AuditPendingEvent.objects.using(using).order_by("id").values_list("id", flat=True).first() is not None


def _chainer_lock(connection: Any, *, wait: bool) -> bool:
    """Take the chainer's session lock; ``wait``: for up to ``_LOCK_WAIT_S`` (a reader is never held longer by a
    chainer that hangs), else only if it is free."""
    deadline = time.monotonic() + (_LOCK_WAIT_S if wait else 0.0)
    with connection.cursor() as cursor:
        while True:
            cursor.execute("SELECT pg_try_advisory_lock(%s)", [_CHAINER_LOCK_KEY])
            if cursor.fetchone()[0]:
                return True
            if time.monotonic() >= deadline:
                if wait:
                    logger.warning("audit chaining: the chainer's lock stayed taken; events stay pending for now")
                return False
            time.sleep(_BUSY_BACKOFF_S)


def _chainer_unlock(connection: Any) -> None:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [_CHAINER_LOCK_KEY])
    except DatabaseError:  # a broken connection: closing it lets go of the lock
        logger.warning("audit chainer: letting go of the chainer's lock failed; closing the connection")
        connection.close()


_PLAIN_FIELDS = tuple(name for name in _CONTENT_FIELDS if name not in ("args", "result"))
_EVENT_COLUMNS = (*_PLAIN_FIELDS, "args", "result", "seq", "prev_hash", "hash", "mac", "nonce")


def _chain_reads(connection: Any, batch: int) -> tuple[str, str]:
    """The head's read (locked) and the pending rows' read, as SQL: each row's id, MAC, nonce, whether an event has
    that nonce already (in the same query, by the events' unique nonce index: no round trip more), then its
    content. On PostgreSQL the JSON, the time and the run id come as the text the hash takes (no datetime or UUID
    made and formatted again per row; the events' COPY takes the same text)."""
    head_table = connection.ops.quote_name(AuditChainHead._meta.db_table)
    pending_table = connection.ops.quote_name(AuditPendingEvent._meta.db_table)
    event_table = connection.ops.quote_name(AuditEvent._meta.db_table)
    chained = f"EXISTS (SELECT 1 FROM {event_table} e WHERE e.nonce = p.nonce)"  # noqa: S608 - the model's table
    columns = list(_PLAIN_FIELDS)
    if connection.vendor == "postgresql":
        texts = {"created_at": POSTGRES_CANONICAL_TIME, "run_id": "run_id::text"}
        columns = [texts.get(name, name) for name in columns] + ["args::text", "result::text"]
    else:
        columns += ["args", "result"]
    lock_head = " FOR UPDATE" if connection.features.has_select_for_update else ""
    return (
        f"SELECT seq, hash, mac FROM {head_table} WHERE id = {_HEAD_ID}{lock_head}",  # noqa: S608 - model names
        f"SELECT p.id, p.mac, p.nonce, {chained}, {', '.join(columns)} FROM {pending_table} p"  # noqa: S608
        f" ORDER BY p.id LIMIT {int(batch)}",
    )


@dataclass
class _Linked:
    """Pending rows given their place in the chain: the events' columns (``_EVENT_COLUMNS``), their pending ids,
    the new head, and whether a row that does not verify stopped the batch."""

    rows: list[list[Any]]
    ids: list[int]
    seq: int
    hash: str
    blocked: bool


def _chain_link(rows: list[Any], *, seq: int, prev_hash: str, keyring: ChainKeyring, sqlite: bool) -> _Linked:
    """Check each pending row (its MAC; a nonce, in no event yet nor in a row before it: a pending row is chained
    once at most) and give it the next seq, prev_hash, hash and event MAC, exactly as the inline path would (the
    columns kept as read: the database's own text for JSON and times, so the event stores what was hashed).
    Stops before a row that does not verify, as before a forged one."""
    linked = _Linked(rows=[], ids=[], seq=seq, hash=prev_hash, blocked=False)
    nonces: set[str] = set()
    for row in rows:
        pending_id, pending_mac, nonce, chained = row[0], row[1], row[2], row[3]
        args_text, result_text = row[-2], row[-1]
        hashed = dict(zip(_PLAIN_FIELDS, row[4:-2], strict=True))
        if sqlite:
            sqlite_row_as_orm(hashed)
        hashed["args"], args_plain = json_value_plain(args_text)
        hashed["result"], result_plain = json_value_plain(result_text)
        hashed["nonce"] = nonce or None
        plain = args_plain and result_plain
        why = keyring.check("pending", pending_hash(hashed, plain=plain), pending_mac)
        if why is None and not nonce:
            why = "no nonce (written before nonces, or without the chain key)"
        elif why is None and (chained or nonce in nonces):
            why = "the nonce of an event chained already (or of a row before it) — replayed"
        if why is not None:
            logger.error("audit chaining stopped: pending event id %s has %s (run verify_audit)", pending_id, why)
            linked.blocked = True
            break
        nonces.add(nonce)
        hashed["seq"], hashed["prev_hash"] = linked.seq + 1, linked.hash
        digest = event_hash(hashed, normalized=True, plain=plain)
        linked.rows.append([*row[4:], linked.seq + 1, linked.hash, digest, keyring.sign("event", digest), nonce])
        linked.ids.append(pending_id)
        linked.seq, linked.hash = linked.seq + 1, digest
    return linked


def _chain_batch(using: str, batch: int, *, lock: bool = False, wait: bool = False) -> tuple[int | None, bool]:
    """One chainer transaction in Django's transaction handling (SQLite, or inside a caller's transaction):
    (events chained, or None if ``lock`` and another chainer holds the lock; whether a pending row that does not
    verify stopped it)."""
    connection = connections[using]
    keyring = chain_keyring()
    head_read, pending_read = _chain_reads(connection, batch)
    with transaction.atomic(using=using), connection.cursor() as cursor:
        if lock:
            function = "pg_advisory_xact_lock" if wait else "pg_try_advisory_xact_lock"
            cursor.execute(f"SELECT {function}(%s)", [_CHAINER_LOCK_KEY])
            if not wait and not cursor.fetchone()[0]:
                return None, False
        cursor.execute(head_read)
        seq, prev_hash = _head_check(cursor.fetchone(), keyring)
        cursor.execute(pending_read)
        linked = _chain_link(
            cursor.fetchall(), seq=seq, prev_hash=prev_hash, keyring=keyring, sqlite=connection.vendor == "sqlite"
        )
        if linked.rows:
            move_head, head_values = _head_move(connection, linked, keyring)
            if connection.vendor == "postgresql":
                delete = _events_insert_postgres(connection, linked)
                with connection.connection.pipeline():
                    cursor.execute(*delete)
                    cursor.execute(move_head, head_values)
            else:
                event_table = connection.ops.quote_name(AuditEvent._meta.db_table)
                pending_table = connection.ops.quote_name(AuditPendingEvent._meta.db_table)
                one = "(" + ", ".join(["%s"] * len(_EVENT_COLUMNS)) + ")"
                cursor.executemany(
                    f"INSERT INTO {event_table} ({', '.join(_EVENT_COLUMNS)}) VALUES {one}",  # noqa: S608
                    linked.rows,
                )
                cursor.execute(
                    f"DELETE FROM {pending_table} WHERE id IN ({', '.join(['%s'] * len(linked.ids))})",  # noqa: S608
                    linked.ids,
                )
                cursor.execute(move_head, head_values)
        return len(linked.rows), linked.blocked


def _chain_batch_postgres(connection: Any, batch: int) -> tuple[int, bool]:
    """One chainer transaction on PostgreSQL, the session's chainer lock held, outside Django's transaction
    handling so that it takes three round trips: ``BEGIN`` with the head's and the pending rows' reads as one
    query; the events' ``COPY``; then their pending rows' delete, the head's move and ``COMMIT``, pipelined.
    Rolled back on any error."""
    keyring = chain_keyring()
    head_read, pending_read = _chain_reads(connection, batch)
    connection.ensure_connection()
    raw = connection.connection
    committed = False
    try:
        with connection.cursor() as cursor:  # the client-side binding cursor: several statements in one query
            cursor.execute(f"BEGIN; {head_read}; {pending_read}")
            cursor.nextset()
            seq, prev_hash = _head_check(cursor.fetchone(), keyring)
            cursor.nextset()
            linked = _chain_link(cursor.fetchall(), seq=seq, prev_hash=prev_hash, keyring=keyring, sqlite=False)
            delete = _events_insert_postgres(connection, linked) if linked.rows else None
            with raw.pipeline():
                if delete is not None:
                    cursor.execute(*delete)
                    cursor.execute(*_head_move(connection, linked, keyring))
                cursor.execute("COMMIT")
            committed = True
        return len(linked.rows), linked.blocked
    finally:
        if not committed:
            try:
                raw.execute("ROLLBACK")
            except Exception:  # noqa: BLE001 - a broken connection: closing it ends the transaction
                connection.close()


def _head_move(connection: Any, linked: _Linked, keyring: ChainKeyring) -> tuple[str, list[Any]]:
    head_table = connection.ops.quote_name(AuditChainHead._meta.db_table)
    return (
        f"UPDATE {head_table} SET seq = %s, hash = %s, mac = %s WHERE id = %s",  # noqa: S608 - the model's table
        [linked.seq, linked.hash, _head_signed(keyring, linked.seq, linked.hash), _HEAD_ID],
    )


def _events_insert_postgres(connection: Any, linked: _Linked) -> tuple[str, list[Any]]:
    """Copy the chained rows into the events table (``COPY … FROM STDIN``: each value written by psycopg's C
    dumpers, and the server's cheapest way in; one statement with a column array each spent a quarter of the
    chainer's time building the arrays in Python); returns the delete of their pending rows, for the caller to
    send with the head's move, in the same transaction."""
    import psycopg  # the PostgreSQL driver, there only where PostgreSQL is

    quote = connection.ops.quote_name
    with (
        psycopg.Cursor(connection.connection) as bound,
        bound.copy(f"COPY {quote(AuditEvent._meta.db_table)} ({', '.join(_EVENT_COLUMNS)}) FROM STDIN") as copy,
    ):
        for row in linked.rows:
            copy.write_row(row)
    return (
        f"DELETE FROM {quote(AuditPendingEvent._meta.db_table)} WHERE id = ANY(%s)",  # noqa: S608 - the model's table
        [linked.ids],
    )


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
        "nonce": event.nonce,
    }


def _chain_head_read(cursor: Any, head_table: str, keyring: ChainKeyring, *, lock: str) -> tuple[int, str]:
    """The head's (seq, hash), locked for the rest of the transaction if ``lock`` is ``" FOR UPDATE"``. Raises
    :class:`AuditChainHeadMissing` or :class:`AuditChainHeadForged` rather than append after a head that cannot
    be trusted."""
    cursor.execute(f"SELECT seq, hash, mac FROM {head_table} WHERE id = %s{lock}", [_HEAD_ID])  # noqa: S608
    return _head_check(cursor.fetchone(), keyring)


# The head row (with the keyring that verified it) last found valid: a MAC is a function of the key and the row,
# so the same row under the same keyring verifies again without its HMAC being recomputed.
_head_verified: tuple[ChainKeyring, int, str, Any] | None = None


def _head_signed(keyring: ChainKeyring, seq: int, digest: str) -> str:
    """The MAC of a head moved to (seq, digest), noted as verified: the next append that reads the head as it was
    moved here checks it without an HMAC (rolled back, the row is not read again; the MAC is valid all the same)."""
    global _head_verified
    mac = keyring.sign("head", head_message(seq, digest))
    _head_verified = (keyring, seq, digest, mac)
    return mac


def _head_check(row: Any, keyring: ChainKeyring) -> tuple[int, str]:
    """The head's (seq, hash) from its row (seq, hash, mac), or the refusal of a missing or forged head."""
    global _head_verified
    if row is None:
        logger.error("audit append refused: the audit chain head is missing")
        raise AuditChainHeadMissing(
            "the audit chain head is missing: appending refused (run verify_audit; a head is never rebuilt)"
        )
    seq, digest, mac = int(row[0]), str(row[1]), row[2]
    if _head_verified == (keyring, seq, digest, mac):
        return seq, digest  # the very row this keyring verified last (appends read the head every time)
    why = keyring.check("head", head_message(seq, digest), mac)
    if why is not None:
        logger.error("audit append refused: the audit chain head (seq %s) has %s", seq, why)
        raise AuditChainHeadForged(f"the audit chain head (seq {seq}) has {why}: appending refused (run verify_audit)")
    _head_verified = (keyring, seq, digest, mac)
    return seq, digest


def audit_chain_head_create_if_fresh(*, using: str = DEFAULT_DB_ALIAS) -> bool:
    """Create the chain head (seq 0, the genesis hash, MAC'd) where the record is empty: no head, no event, no
    checkpoint, as after the first ``migrate`` or a test suite's flush. Returns whether it created one. A head
    missing beside events or checkpoints is left missing: the chain fails closed."""
    with transaction.atomic(using=using):
        if AuditChainHead.objects.using(using).filter(pk=_HEAD_ID).exists():
            return False
        if (
            AuditEvent.objects.using(using).exists()
            or AuditCheckpoint.objects.using(using).exists()
            or AuditPendingEvent.objects.using(using).exists()
        ):
            logger.error("the audit chain head is missing beside events: not re-created (run verify_audit)")
            return False
        mac = chain_keyring().sign("head", head_message(0, GENESIS_HASH))
        AuditChainHead.objects.using(using).create(id=_HEAD_ID, seq=0, hash=GENESIS_HASH, mac=mac)
        return True
