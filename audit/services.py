"""Writes to the audit record (verification is in ``audit/verification.py``, archiving in ``audit/archive.py``). Everything stored here is masked first.

The record is a hash chain (``audit/chain.py``). How it stays gap-free with many writers: every append runs
in one transaction that (1) locks the single :class:`~audit.models.AuditChainHead` row (``SELECT ... FOR
UPDATE`` on PostgreSQL; on SQLite the transaction begins with ``BEGIN IMMEDIATE``, which already takes the
database's one write lock), (2) takes ``seq = head.seq + 1`` and ``prev_hash = head.hash``, (3) inserts the
event with its hash and the hash's MAC and (4) moves the head to it, with the head's own MAC. Writers therefore
append one at a time, each seeing its predecessor committed, and a rolled-back append gives its seq back with
the rest of its transaction. The lock is held until the caller's transaction ends: write the audit event late
and commit soon after.

The chain fails closed: a missing head, or one whose MAC does not verify, is never rebuilt from the events (that
is what someone who cut the tail off would want); the append raises :class:`AuditChainHeadMissing` or
:class:`AuditChainHeadForged`, both ``DatabaseError``s, so the caller's transaction and a run fail loudly.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, transaction
from django.utils import timezone

from agent_platform.json import UnicodeJSONEncoder
from audit.chain import GENESIS_HASH, ChainKeyring, event_hash, head_message, json_value
from audit.chain_keys import chain_keyring
from audit.masking import mask_value, truncate
from audit.models import AuditChainHead, AuditCheckpoint, AuditEvent

logger = logging.getLogger(__name__)

_HEAD_ID = 1


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
    keyring = chain_keyring()
    # No savepoint inside a caller's transaction: cheaper, and a failed append fails the whole transaction.
    with transaction.atomic(using=using, savepoint=False), connection.cursor() as cursor:
        seq, prev_hash = _chain_head_locked(cursor, connection, head_table, keyring)
        event.seq = seq + 1
        event.prev_hash = prev_hash
        event.created_at = timezone.now()  # taken under the lock: time never runs backwards along the chain
        event.hash = event_hash({**_hashed_values(event), **hashed_json})
        event.mac = keyring.sign("event", event.hash)
        event.save(force_insert=True, using=using)
        cursor.execute(
            f"UPDATE {head_table} SET seq = %s, hash = %s, mac = %s WHERE id = %s",  # noqa: S608 - table name from the model
            [event.seq, event.hash, keyring.sign("head", head_message(event.seq, event.hash)), _HEAD_ID],
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
    }


def _chain_head_locked(cursor: Any, connection: Any, head_table: str, keyring: ChainKeyring) -> tuple[int, str]:
    """The head's (seq, hash), locked for the rest of the transaction. Raises :class:`AuditChainHeadMissing`
    or :class:`AuditChainHeadForged` rather than append after a head that cannot be trusted."""
    lock = " FOR UPDATE" if connection.features.has_select_for_update else ""
    cursor.execute(f"SELECT seq, hash, mac FROM {head_table} WHERE id = %s{lock}", [_HEAD_ID])  # noqa: S608
    row = cursor.fetchone()
    if row is None:
        logger.error("audit append refused: the audit chain head is missing")
        raise AuditChainHeadMissing(
            "the audit chain head is missing: appending refused (run verify_audit; a head is never rebuilt)"
        )
    seq, digest, mac = int(row[0]), str(row[1]), row[2]
    why = keyring.check("head", head_message(seq, digest), mac)
    if why is not None:
        logger.error("audit append refused: the audit chain head (seq %s) has %s", seq, why)
        raise AuditChainHeadForged(f"the audit chain head (seq {seq}) has {why}: appending refused (run verify_audit)")
    return seq, digest


def audit_chain_head_create_if_fresh(*, using: str = DEFAULT_DB_ALIAS) -> bool:
    """Create the chain head (seq 0, the genesis hash, MAC'd) where the record is empty: no head, no event, no
    checkpoint, as after the first ``migrate`` or a test suite's flush. Returns whether it created one. A head
    missing beside events or checkpoints is left missing: the chain fails closed."""
    with transaction.atomic(using=using):
        if AuditChainHead.objects.using(using).filter(pk=_HEAD_ID).exists():
            return False
        if AuditEvent.objects.using(using).exists() or AuditCheckpoint.objects.using(using).exists():
            logger.error("the audit chain head is missing beside events: not re-created (run verify_audit)")
            return False
        mac = chain_keyring().sign("head", head_message(0, GENESIS_HASH))
        AuditChainHead.objects.using(using).create(id=_HEAD_ID, seq=0, hash=GENESIS_HASH, mac=mac)
        return True
