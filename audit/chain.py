"""The audit hash chain: canonical bytes of an event, its hash, and a verifier for a sequence of events.

No Django, no database: the service (:func:`audit.services.audit_event_record`), ``verify_audit``
and ``archive_audit`` all use these functions, so a row in the database and a line in an archive file hash
the same way.

An event's hash is ``sha256(canonical_bytes(event))`` in hex, where the canonical bytes are the UTF-8 of
the JSON object of :data:`HASHED_FIELDS` (which include ``seq`` and ``prev_hash``, so each event commits to
its position and to everything before it) written with sorted keys, ``ensure_ascii=False`` and no
whitespace. Values are normalised so that a value hashes the same before it is stored and after it is read
back from SQLite's JSON text or PostgreSQL's ``jsonb``:

* ``created_at`` -> ISO 8601 in UTC with microseconds (``2026-01-02T03:04:05.000006+00:00``);
* ``run_id`` -> the hyphenated lower-case UUID, or ``null``;
* every number (also inside ``args`` and ``result``) that is integral is written as an integer
  (``1.0`` -> ``1``, ``1e+20`` -> ``100000000000000000000``), because ``jsonb`` keeps numbers as decimals
  and gives ``1e+20`` back as an integer; other floats are written as Python's shortest ``repr``.

An event chained from the pending table (deferred chaining, ``audit.services``) also carries ``nonce``: 32 random hex
digits its writer drew, covered by the pending row's MAC and by the event's hash, and unique among the events, so
that a copy of a pending row put back after it was chained is never chained again. The hash takes ``nonce`` only
where there is one (:data:`NONCE_FIELD`): an event written inline, or before nonces existed, hashes as it always did.

The first event's ``prev_hash`` is :data:`GENESIS_HASH`; after an archive, the first remaining event's
``prev_hash`` is the hash of the archive's checkpoint.

The hash has no secret: anyone who can write the database can recompute it. What authenticates the chain is a
MAC (:class:`ChainKeyring`): HMAC-SHA256 with a key kept outside the database (``AUDIT_CHAIN_KEY``) over each
event's hash, and over the chain head, each archive checkpoint and each anchor written outside the database.
A MAC is written ``<key id>:<64 hex digits>``, the key id being the first 8 hex digits of a SHA-256 of the key,
so that a verifier holding several keys (rotation) knows which one to use.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import math
import re
import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Literal

import orjson

__all__ = [
    "GENESIS_HASH",
    "HASHED_FIELDS",
    "NONCE_FIELD",
    "ChainBreak",
    "ChainKeyring",
    "ChainVerifier",
    "MacProblem",
    "SegmentEnd",
    "canonical_bytes",
    "event_check",
    "event_hash",
    "json_value",
    "json_value_plain",
    "pending_hash",
    "record_check",
]

GENESIS_HASH = "0" * 64
"""The ``prev_hash`` of the first event ever written."""

HASHED_FIELDS: tuple[str, ...] = (
    "seq",
    "prev_hash",
    "created_at",
    "run_id",
    "source",
    "action",
    "mcp_id",
    "tool",
    "call_id",
    "args",
    "result",
    "ok",
    "reason",
    "attempt",
    "latency_ms",
    "actor",
)
"""What an event's hash covers: every stored field but the storage key ``id`` and the hash itself (and
:data:`NONCE_FIELD`, covered where it is not null)."""

NONCE_FIELD = "nonce"
"""The field an event's hash covers only where it is set (not None): the pending row's one-time nonce (deferred
chaining). Events without one (inline, or written before nonces existed) hash exactly as before."""

BreakKind = Literal["altered", "removed", "inserted", "broken", "truncated", "replaced", "forged"]

BreakReason = Literal[
    "out_of_place", "missing", "unreadable", "hash_mismatch", "prev_hash", "mac", "anchor", "tail_short", "tail_hash"
]
"""Which of its kind's messages a :class:`ChainBreak` carries (a kind has several): with its ``details``, what
another wording of the message needs (``audit.verification`` words it in the platform's language)."""

MacPurpose = Literal["event", "head", "checkpoint", "anchor", "pending"]
"""What a MAC vouches for; each purpose is a separate domain, so a MAC of one kind never passes for another."""

MIN_KEY_CHARS = 32


class MacProblem(str):
    """Why a MAC does not verify (:meth:`ChainKeyring.check`): the English text, a ``str``, with what another
    wording of it needs: ``reason`` (``"missing"``, ``"unknown_key"``, ``"mismatch"``) and the MAC's ``key_id``."""

    reason: str
    key_id: str

    def __new__(cls, text: str, *, reason: str, key_id: str = "") -> MacProblem:
        problem = super().__new__(cls, text)
        problem.reason, problem.key_id = reason, key_id
        return problem

    def __reduce__(self) -> Any:  # pickled as what it is (the attributes are not a str's)
        return _mac_problem, (str(self), self.reason, self.key_id)


def _mac_problem(text: str, reason: str, key_id: str) -> MacProblem:
    return MacProblem(text, reason=reason, key_id=key_id)


class ChainKeyring:
    """The chain's keys: the first signs, every one verifies (a key is rotated by putting the new one first and
    keeping the old ones for as long as something they signed must still verify: events, archives, anchors).

    Raises ``ValueError`` for no key or a key shorter than :data:`MIN_KEY_CHARS` characters.
    """

    def __init__(self, keys: Sequence[str]) -> None:
        if not keys:
            raise ValueError("the audit chain needs at least one key")
        for key in keys:
            if len(key) < MIN_KEY_CHARS:
                raise ValueError(f"an audit chain key must be at least {MIN_KEY_CHARS} characters")
        self._secrets = {self.key_id(key): key.encode("utf-8") for key in keys}
        self.signing_key_id = self.key_id(keys[0])
        # Per key and purpose, the HMAC with the key and the purpose's prefix already in: a copy of it costs half
        # of a MAC made from the key each time (verification makes one per event).
        self._started: dict[tuple[str, str], Any] = {}

    @staticmethod
    def key_id(key: str) -> str:
        """A key's public name: 8 hex digits of a SHA-256 of it (tells nothing usable about the key)."""
        return hashlib.sha256(b"audit-chain-key-id\x00" + key.encode("utf-8")).hexdigest()[:8]

    @property
    def key_ids(self) -> tuple[str, ...]:
        return tuple(self._secrets)

    def sign(self, purpose: MacPurpose, message: str) -> str:
        """``<key id>:<hex HMAC-SHA256>`` of ``message`` for ``purpose``, with the signing (first) key."""
        return f"{self.signing_key_id}:{self._digest(self.signing_key_id, purpose, message)}"

    def check(self, purpose: MacPurpose, message: str, mac: Any) -> MacProblem | None:
        """None if ``mac`` is a valid MAC of ``message`` for ``purpose`` by one of the keys, else why not."""
        if not mac or not isinstance(mac, str):
            return MacProblem("no MAC", reason="missing")
        key_id, _, digest = mac.partition(":")
        if key_id not in self._secrets:
            return MacProblem(
                f"MAC by key {key_id}, which AUDIT_CHAIN_KEY does not hold", reason="unknown_key", key_id=key_id
            )
        # hmac.compare_digest raises TypeError for a text with non-ASCII characters: such a MAC is no MAC of ours.
        if not digest.isascii() or not hmac.compare_digest(digest, self._digest(key_id, purpose, message)):
            return MacProblem("MAC mismatch", reason="mismatch", key_id=key_id)
        return None

    def _digest(self, key_id: str, purpose: str, message: str) -> str:
        started = self._started.get((key_id, purpose))
        if started is None:
            started = hmac.new(self._secrets[key_id], f"audit.{purpose}\x00".encode(), hashlib.sha256)
            self._started[(key_id, purpose)] = started
        mac = started.copy()
        mac.update(message.encode())
        return str(mac.hexdigest())


def head_message(seq: int, hash_hex: str) -> str:
    """What the chain head's MAC covers."""
    return f"{seq}:{hash_hex}"


def checkpoint_message(seq: int, hash_hex: str, count: int) -> str:
    """What an archive checkpoint's MAC covers."""
    return f"{seq}:{hash_hex}:{count}"


def anchor_message(seq: int, hash_hex: str, at: str) -> str:
    """What an anchor's MAC covers (``at``: the ISO time it was taken, as written)."""
    return f"{seq}:{hash_hex}:{at}"


# Whether what :func:`json_value_plain` is reading is still plain (see there): per thread, as a writer and the
# process's chainer thread may read at once.
_reading = threading.local()


def _canonical_float(text: str) -> int | float:
    value = float(text)
    if value.is_integer():
        return int(Decimal(text))  # exact: int(1e300) would be the binary float's value, not 10**300
    if not 1e-4 <= abs(value) < math.inf:  # orjson writes a NaN or infinity as null, 1e-05 as 0.00001
        _reading.plain = False
    return value


def _non_finite(name: str) -> float:
    """NaN, Infinity and -Infinity as ``json`` reads them (Python writes them so; orjson would write null)."""
    _reading.plain = False
    return float(name)


_SORTED_JSON = json.JSONEncoder(ensure_ascii=False, sort_keys=True, separators=(",", ":"))
_NORMALISING_JSON = json.JSONDecoder(parse_float=_canonical_float, parse_constant=_non_finite)
# Where Python's float repr is integral: "4.0", "-0.0", "1e+20". Other floats are already canonical. A match
# inside a string is harmless (the exact path runs for nothing).
_INTEGRAL_FLOAT = re.compile(r"[0-9]\.0(?![0-9])|[0-9]e\+")


_SCAN_JSON = _NORMALISING_JSON.scan_once  # type: ignore[attr-defined] # the C scanner where there is one
# The same encoding as ``_SORTED_JSON`` made once, without a check for circular values: for values parsed from
# JSON text (verification's fast path), which cannot be circular. ``encode`` builds a new one on every call.
_ENCODE_PARSED = (
    json.encoder.c_make_encoder(  # type: ignore[attr-defined]
        None, _SORTED_JSON.default, json.encoder.encode_basestring, None, ":", ",", True, False, True
    )
    if json.encoder.c_make_encoder is not None  # type: ignore[attr-defined]
    else None
)


def json_value(text: str) -> Any:
    """Parse stored JSON text the way the hash sees it (integral floats as ints): cheaper to hash than
    Python's own parse, because :func:`canonical_bytes` then needs no second pass. Text as the databases give
    it back (nothing around the value) goes straight to the scanner; anything else through ``json``'s own
    checks, with its errors."""
    try:
        value, end = _SCAN_JSON(text, 0)
    except StopIteration:
        return _NORMALISING_JSON.decode(text)
    if end != len(text):
        return _NORMALISING_JSON.decode(text)
    return value


def _encode_parsed(record: dict[str, Any]) -> str:
    if _ENCODE_PARSED is None:
        return _SORTED_JSON.encode(record)
    return "".join(_ENCODE_PARSED(record, 0))


# Plain JSON: a value read by :func:`json_value` that orjson (a compiled writer, several times faster than
# ``json``'s) writes exactly as ``_SORTED_JSON`` does. It is plain unless it holds NaN or an infinity (orjson
# writes null) or a float under 1e-4 (orjson writes 0.00001 where Python writes 1e-05), which the reading itself
# notes (``_canonical_float``, ``_non_finite``): integral floats are ints once read, other floats write alike
# both ways, and what orjson will not write (an integer past 64 bits, a lone surrogate) raises and takes the
# exact way. Both ways give the same bytes (tests/audit/test_chain_plain_json.py checks them against each other).
# Sorted keys and no whitespace, like ``_SORTED_JSON``; anything but JSON's own types (a datetime, a dataclass, a
# subclass of str or int) raises, so that it takes the exact way and hashes (or fails) as it always did.
_ORJSON_SORTED = (
    orjson.OPT_SORT_KEYS
    | orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_SUBCLASS
)


def json_value_plain(text: str | None) -> tuple[Any, bool]:
    """:func:`json_value` of ``text`` (None for SQL's NULL: None, plain), and whether the value is plain (above):
    an event whose JSON fields are all plain is then hashed through orjson (``plain=True`` in
    :func:`canonical_bytes`, :func:`event_hash`, :func:`pending_hash` and :func:`record_check`)."""
    if text is None:
        return None, True
    _reading.plain = True
    value = json_value(text)
    return value, _reading.plain


def json_values(text: str) -> tuple[Any, Any, bool]:
    """JSON text's value as ``json.loads`` gives it (as the database gives it back), its :func:`json_value_plain`
    and whether that is plain: one parse where the text has no integral float (the two values are then the same),
    two where it has."""
    hashed, plain = json_value_plain(text)
    return (json.loads(text) if _INTEGRAL_FLOAT.search(text) else hashed), hashed, plain


def _plain_bytes(record: dict[str, Any]) -> bytes | None:
    """The canonical bytes of a record whose ``args`` and ``result`` are plain, through orjson; None where its
    ``latency_ms`` or another field is not a value both ways write alike (the caller then takes the exact way)."""
    latency = record.get("latency_ms")
    if latency is not None and not (
        (type(latency) is int and -(2**63) <= latency < 2**63)
        or (type(latency) is float and math.isfinite(latency) and not latency.is_integer() and abs(latency) >= 1e-4)
    ):
        return None
    try:
        return orjson.dumps(record, option=_ORJSON_SORTED)
    except TypeError:  # orjson.JSONEncodeError: a lone surrogate, an integer past 64 bits, a type of no JSON
        return None


def _normalized_bytes(record: dict[str, Any], *, plain: bool) -> bytes:
    """The canonical bytes of a record already in the hashed form (``args`` and ``result`` from
    :func:`json_value`), through orjson where ``plain`` allows."""
    fast = _plain_bytes(record) if plain else None
    return fast if fast is not None else _encode_parsed(record).encode("utf-8", "surrogatepass")


# ``created_at`` and ``run_id`` already in their canonical text (as PostgreSQL gives them to verification's raw
# reading and to the chainer, see ``POSTGRES_CANONICAL_TIME`` and ``run_id::text``): taken as they are, without a
# parse and a re-format.
POSTGRES_CANONICAL_TIME = """to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"')"""
_CANONICAL_TIME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}\+00:00")
_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _timestamp(value: Any) -> str:
    if isinstance(value, str) and _CANONICAL_TIME.fullmatch(value):
        return value
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value)
    if not isinstance(value, dt.datetime) or value.tzinfo is None:
        raise ValueError(f"created_at must be an aware datetime, not {value!r}")
    return value.astimezone(dt.UTC).isoformat(timespec="microseconds")


def canonical_bytes(event: Mapping[str, Any], *, normalized: bool = False, plain: bool = False) -> bytes:
    """The bytes an event's hash is taken over (see the module docstring).

    ``normalized``: ``args`` and ``result`` come from :func:`json_value` (integral floats already ints), which
    saves a pass. ``plain``: they come from :func:`json_value_plain`, which said both texts were plain (the same
    bytes, written by orjson). ``event`` maps at least :data:`HASHED_FIELDS` and, where it has one, ``nonce`` (a
    ``nonce`` of None is left out, as absent; other extra keys such as ``id`` and ``hash`` are ignored) to the
    values as stored: ``args`` and ``result`` must be JSON values (what the database gives back), ``created_at``
    an aware datetime or its ISO text. Raises ``KeyError`` for a missing field, ``TypeError``/``ValueError`` for
    a value that is not storable JSON.
    """
    run_id = event["run_id"]
    record = {name: event[name] for name in HASHED_FIELDS}
    nonce = event.get(NONCE_FIELD)
    if nonce is not None:
        record[NONCE_FIELD] = nonce
    record["created_at"] = _timestamp(event["created_at"])
    if run_id is not None and not (isinstance(run_id, str) and _CANONICAL_UUID.fullmatch(run_id)):
        record["run_id"] = str(uuid.UUID(str(run_id)))
    if normalized:
        # ``args`` and ``result`` were parsed with :func:`json_value`: the only float that can be integral is
        # ``latency_ms``, so no second pass over the text is needed (verification's fast path).
        latency = record["latency_ms"]
        if isinstance(latency, float) and latency.is_integer():
            record["latency_ms"] = _canonical_float(repr(latency))
        return _normalized_bytes(record, plain=plain)
    if plain and (fast := _plain_bytes(record)) is not None:
        return fast  # no integral float anywhere: plain JSON has none, and _plain_bytes takes no integral latency
    text = _SORTED_JSON.encode(record)
    if _INTEGRAL_FLOAT.search(text):
        # One round trip through the JSON text turns every integral float into an int, at any depth, at C speed.
        text = _SORTED_JSON.encode(_NORMALISING_JSON.decode(text))
    return text.encode("utf-8", "surrogatepass")


def event_hash(event: Mapping[str, Any], *, normalized: bool = False, plain: bool = False) -> str:
    """``sha256(canonical_bytes(event))`` as 64 lower-case hex digits (``normalized``, ``plain``: see
    :func:`canonical_bytes`)."""
    return hashlib.sha256(canonical_bytes(event, normalized=normalized, plain=plain)).hexdigest()


def pending_hash(event: Mapping[str, Any], *, plain: bool = False) -> str:
    """The hash of an event's content before it has a place in the chain (``seq`` and ``prev_hash`` taken as
    null): what a pending event's MAC covers (``audit.services``, deferred chaining), so that the chainer links
    only what a writer holding the key wrote, exactly as it was written. With its ``nonce``, which makes each
    pending row single-use (the events' unique nonce)."""
    return event_hash({**event, "seq": None, "prev_hash": None}, plain=plain)


EventCheck = tuple[str | None, str | None, str | None]
"""What :func:`event_check` finds: (the recomputed hash, or None; why it could not be computed; why the event's
MAC does not verify, or None)."""


def event_check(event: Mapping[str, Any], keyring: ChainKeyring | None, *, normalized: bool = False) -> EventCheck:
    """An event's hash recomputed and its ``mac`` checked against it (with a ``keyring``): the work of
    :meth:`ChainVerifier.feed` that needs no other event, so that it can be done in parallel."""
    try:
        recomputed = event_hash(event, normalized=normalized)
    except (KeyError, TypeError, ValueError) as exc:
        return None, str(exc), None
    why = keyring.check("event", recomputed, event.get("mac")) if keyring is not None else None
    return recomputed, None, why


def record_check(record: dict[str, Any], mac: Any, keyring: ChainKeyring | None, *, plain: bool = False) -> EventCheck:
    """:func:`event_check` of an event given as a dict of exactly :data:`HASHED_FIELDS` (and ``nonce`` where it is
    not None: a ``nonce`` of None is dropped from it), ``args`` and ``result``
    from :func:`json_value`, that the caller gives up (its time, run id and latency are put in their hashed form
    in place: no copy is made; verification's fast path). The same hash as :func:`event_hash` with
    ``normalized``."""
    try:
        if NONCE_FIELD in record and record[NONCE_FIELD] is None:
            del record[NONCE_FIELD]
        record["created_at"] = _timestamp(record["created_at"])
        run_id = record["run_id"]
        if run_id is not None and not (isinstance(run_id, str) and _CANONICAL_UUID.fullmatch(run_id)):
            record["run_id"] = str(uuid.UUID(str(run_id)))
        latency = record["latency_ms"]
        if isinstance(latency, float) and latency.is_integer():
            record["latency_ms"] = _canonical_float(repr(latency))
        recomputed = hashlib.sha256(_normalized_bytes(record, plain=plain)).hexdigest()
    except (KeyError, TypeError, ValueError) as exc:
        return None, str(exc), None
    why = keyring.check("event", recomputed, mac) if keyring is not None else None
    return recomputed, None, why


@dataclass(frozen=True)
class ChainBreak:
    """The first place a chain stops verifying, with a message that names the event (in English). ``reason`` says
    which of its kind's messages it is and ``details`` holds the values that message names besides ``seq`` and
    ``event_id`` (see :meth:`ChainVerifier.feed` and :meth:`ChainVerifier.check_tail`), so that it can be worded
    otherwise (``audit.verification``: in the platform's language); a break made elsewhere may have neither."""

    kind: BreakKind
    seq: int | None
    event_id: Any
    message: str
    reason: BreakReason | None = None
    details: Mapping[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class SegmentEnd:
    """What a verifier started inside the chain found over its stretch of it (:meth:`ChainVerifier.segment_end`):
    enough for the verifier of the stretch before to go on past it (:meth:`ChainVerifier.join`)."""

    failed: bool
    count: int
    first_seq: int | None
    first_prev_hash: str | None
    last_seq: int
    last_hash: str | None
    last_id: Any


def _name(seq: Any, event_id: Any) -> str:
    return f"event seq {seq}" if event_id is None else f"event seq {seq} (id {event_id})"


class ChainVerifier:
    """Checks events fed in ``seq`` order: seq continuity, each hash recomputed, each ``prev_hash`` link, and
    with a ``keyring`` each event's ``mac`` (HMAC of its hash).

    Start it where the chain starts (seq 1 after :data:`GENESIS_HASH`, or after an archive checkpoint), then
    :meth:`feed` every event; the first problem is returned (and kept in :attr:`problem`) and the verifier
    stops checking. :meth:`check_tail` compares where the chain ends with an independently kept head. Started
    with ``start_prev_hash=None``, it verifies a stretch of the chain from ``start_seq`` on whose first link is
    not its to check: another verifier takes the stretch on with :meth:`join` (verification in segments).
    ``count``, ``last_seq`` and ``last_hash`` describe what verified so far. Without a keyring (or with
    ``require_mac=False``, for archives written before events carried a MAC) MACs are not checked: the chain
    then proves only what its hashes prove. ``normalized``: events are fed with ``args`` and ``result`` parsed by
    :func:`json_value` (see :func:`canonical_bytes`).
    """

    def __init__(
        self,
        *,
        start_seq: int = 1,
        start_prev_hash: str | None = GENESIS_HASH,
        start_label: str = "",
        keyring: ChainKeyring | None = None,
        require_mac: bool = True,
        normalized: bool = False,
    ) -> None:
        self.keyring = keyring if require_mac else None
        self.normalized = normalized
        self.start_seq = start_seq
        self.next_seq = start_seq
        self.prev_hash = start_prev_hash
        self.start_label_given = start_label  # "": the label is one of the two below
        self.start_label = start_label or (
            "the genesis hash" if start_seq == 1 else f"the checkpoint at seq {start_seq - 1}"
        )
        self.count = 0
        self.last_seq = start_seq - 1
        self.last_hash = start_prev_hash
        self.last_id: Any = None
        self.first_prev_hash: str | None = None  # the first verified event's prev_hash
        self.problem: ChainBreak | None = None
        self.anchors: dict[int, tuple[str, str]] = {}

    def anchor(self, *, seq: int, hash_hex: str, label: str) -> None:
        """Also require the event at ``seq`` to have ``hash_hex`` (a head or checkpoint kept elsewhere)."""
        self.anchors[seq] = (hash_hex, label)

    def feed(self, event: Mapping[str, Any], *, checked: EventCheck | None = None) -> ChainBreak | None:
        """Check the next event (a mapping of :data:`HASHED_FIELDS`, ``hash`` and optionally ``id`` and ``nonce``).

        ``checked``: what :func:`event_check` gave for the event, computed elsewhere (verification hashes in
        worker processes); ``event`` then needs only ``seq``, ``id``, ``prev_hash``, ``hash`` and ``mac``."""
        if self.problem is not None:
            return self.problem
        seq, event_id = event["seq"], event.get("id")
        if not isinstance(seq, int) or seq < self.next_seq:
            return self._stop(
                "inserted",
                seq,
                event_id,
                f"{_name(seq, event_id)}: out of place, the chain continues at seq {self.next_seq} — inserted",
                "out_of_place",
                next_seq=self.next_seq,
            )
        if seq > self.next_seq:
            missing = f"seq {self.next_seq}" if seq == self.next_seq + 1 else f"seq {self.next_seq} to {seq - 1}"
            return self._stop("removed", self.next_seq, None, f"{missing} missing — removed", "missing", last=seq - 1)
        if checked is None:
            checked = event_check(event, self.keyring, normalized=self.normalized)
        recomputed, unreadable, mac_why = checked
        if recomputed is None:
            return self._stop(
                "altered",
                seq,
                event_id,
                f"{_name(seq, event_id)}: unreadable ({unreadable}) — altered",
                "unreadable",
                error=unreadable,
            )
        if recomputed != event["hash"]:
            return self._stop(
                "altered", seq, event_id, f"{_name(seq, event_id)}: hash mismatch — altered", "hash_mismatch"
            )
        if self.prev_hash is not None and event["prev_hash"] != self.prev_hash:
            before = self.start_label if self.count == 0 else f"the hash of seq {seq - 1}"
            return self._stop(
                "broken",
                seq,
                event_id,
                f"{_name(seq, event_id)}: prev_hash is not {before} — chain broken "
                f"(the event before it was replaced, or this one was altered and rehashed)",
                "prev_hash",
                # At the start: the start's label (given, or "" for the genesis hash or the checkpoint before it).
                at_start=self.count == 0,
                start_seq=self.start_seq,
                start_label=self.start_label_given,
            )
        if self.keyring is not None and mac_why is not None:
            return self._stop(
                "forged",
                seq,
                event_id,
                f"{_name(seq, event_id)}: {mac_why} — forged (written or rewritten without the chain key)",
                "mac",
                why=mac_why,
            )
        anchored = self.anchors.get(seq)
        if anchored is not None and anchored[0] != recomputed:
            return self._stop(
                "replaced",
                seq,
                event_id,
                f"{_name(seq, event_id)}: hash differs from the {anchored[1]}'s — replaced",
                "anchor",
                label=anchored[1],
            )
        if self.count == 0:
            self.first_prev_hash = event["prev_hash"]
        self.count += 1
        self.next_seq = seq + 1
        self.prev_hash = self.last_hash = recomputed
        self.last_seq, self.last_id = seq, event_id
        return None

    def segment_end(self) -> SegmentEnd:
        """Where this verifier got to, for :meth:`join`."""
        first_seq = self.last_seq - self.count + 1 if self.count else None
        return SegmentEnd(
            self.problem is not None, self.count, first_seq, self.first_prev_hash, self.last_seq, self.last_hash,
            self.last_id,
        )  # fmt: skip

    def join(self, end: SegmentEnd) -> bool:
        """Go on past the stretch of the chain that another verifier checked (its :meth:`segment_end`): True if
        that stretch verified and continues this chain exactly (its first event at the next seq, linked to the
        last hash); this verifier is then where feeding it those events would have left it. False (nothing
        taken): feed the events instead, to have the first problem found and named."""
        if self.problem is not None or end.failed:
            return False
        if end.count == 0:
            return True  # nothing here: a gap shows at the next stretch's first event, or at the tail
        if end.first_seq != self.next_seq or self.prev_hash is None or end.first_prev_hash != self.prev_hash:
            return False
        if self.count == 0:
            self.first_prev_hash = end.first_prev_hash
        self.count += end.count
        self.next_seq = end.last_seq + 1
        self.prev_hash = self.last_hash = end.last_hash
        self.last_seq, self.last_id = end.last_seq, end.last_id
        return True

    def check_tail(self, *, head_seq: int, head_hash: str, head_label: str = "head") -> ChainBreak | None:
        """Compare the last verified event with a head kept elsewhere (after feeding every event).

        A chain that ends before the head was truncated; one that ends at the head must end with its hash. A
        chain that goes on past the head is not judged here: the caller tells events appended since it read
        the head from forged ones (see ``audit.services.audit_chain_verify``)."""
        if self.problem is not None:
            return self.problem
        if self.last_seq < head_seq:
            last = f"last event is {self.last_seq}" if self.count else f"no event after seq {self.last_seq}"
            return self._stop(
                "truncated",
                self.last_seq + 1,
                None,
                f"tail truncated: {head_label} says seq {head_seq}, {last}",
                "tail_short",
                label=head_label,
                head_seq=head_seq,
                last_seq=self.last_seq,
                any_event=bool(self.count),
            )
        if self.last_seq == head_seq and self.last_hash != head_hash:
            return self._stop(
                "replaced",
                self.last_seq,
                self.last_id,
                f"{_name(self.last_seq, self.last_id)}: hash differs from the {head_label}'s — replaced",
                "tail_hash",
                label=head_label,
            )
        return None

    def _stop(
        self, kind: BreakKind, seq: int | None, event_id: Any, message: str, reason: BreakReason, **details: Any
    ) -> ChainBreak:
        self.problem = ChainBreak(
            kind=kind, seq=seq, event_id=event_id, message=message, reason=reason, details=details
        )
        return self.problem


def sqlite_row_as_orm(row: dict[str, Any]) -> None:
    """SQLite's raw values as the ORM gives them (a time in UTC without an offset, ``ok`` as 0/1)."""
    created = row["created_at"]
    if isinstance(created, dt.datetime) and created.tzinfo is None:
        row["created_at"] = created.replace(tzinfo=dt.UTC)
    elif isinstance(created, str) and "+" not in created[10:]:
        row["created_at"] = created + "+00:00"
    row["ok"] = bool(row["ok"])
