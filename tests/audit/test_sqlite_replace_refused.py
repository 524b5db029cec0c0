"""SQLite's ``INSERT OR REPLACE`` deletes the row it replaces without firing DELETE triggers: it edited a chained
event in place and moved the chain head back past the append-only triggers. Refused now, as UPDATE is."""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from audit.models import AuditChainHead, AuditEvent
from audit.services import audit_event_record

pytestmark = pytest.mark.django_db


def refused(statement: str) -> str:
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(statement)
    except Exception as exc:  # noqa: BLE001 - the database's refusal, as its client sees it
        return str(exc).splitlines()[0]
    return "allowed"


@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite's triggers")
def test_insert_or_replace_can_neither_edit_an_event_nor_move_the_head_back() -> None:
    for i in range(3):
        audit_event_record(source="agent", tool="replace", args={"i": i})
    event = AuditEvent.objects.order_by("seq")[1]
    columns = [f.column for f in AuditEvent._meta.concrete_fields]
    listed = ", ".join(columns)
    chosen = ", ".join("'intruder'" if c == "actor" else c for c in columns)
    edit = f"INSERT OR REPLACE INTO audit_auditevent ({listed}) SELECT {chosen} FROM audit_auditevent WHERE seq = {event.seq}"
    assert refused(edit) == "audit events are append-only: REPLACE refused"
    assert AuditEvent.objects.get(pk=event.pk).actor == event.actor

    head = AuditChainHead.objects.get()
    back = (
        "INSERT OR REPLACE INTO audit_auditchainhead (id, seq, hash, mac) "
        f"SELECT id, seq - 1, (SELECT hash FROM audit_auditevent WHERE seq = {head.seq - 1}), mac FROM audit_auditchainhead"
    )
    assert refused(back) == "the audit chain head is never replaced: REPLACE refused"
    assert AuditChainHead.objects.get().seq == head.seq
    # Appending goes on as before.
    audit_event_record(source="agent", tool="replace", args={"i": 3})
    assert AuditChainHead.objects.get().seq == head.seq + 1
