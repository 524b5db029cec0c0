"""A one-time nonce per pending event (deferred chaining), copied into the event it becomes, unique among the events:
a copy of a pending row put back after it was chained (from a backup, a replica, a trigger) is never chained again.

- ``AuditEvent.nonce``: null for every event already written (and for events written inline), which hash as they
  always did (``audit.chain``: the hash takes ``nonce`` only where it is set). Added as a plain nullable column
  (no rewrite of the append-only table, on SQLite neither) with a partial unique index (``WHERE nonce IS NOT
  NULL``).
- ``AuditPendingEvent.nonce``: required from now on (the chainer refuses a pending row without one). Rows waiting
  to be chained when this runs are given one, and their MAC is made again over it with the signing key of
  ``AUDIT_CHAIN_KEY`` (as ``0008`` MACs the record), but only where their MAC verifies as it stands: a forged row
  stays without a nonce, and is never chained.

Run it with every writer stopped: a process still running the previous code inserts pending rows without a nonce,
which the database refuses (on PostgreSQL; its append fails loudly) or the chainer does.
"""

import secrets
from typing import Any

from django.db import migrations, models
from django.db.migrations.exceptions import IrreversibleError

from audit.chain import POSTGRES_CANONICAL_TIME, json_value_plain, pending_hash, sqlite_row_as_orm
from audit.chain_keys import chain_keyring

PLAIN = (
    "created_at", "run_id", "source", "action", "mcp_id", "tool", "call_id", "ok", "reason", "attempt", "latency_ms",
    "actor",
)  # fmt: skip


def pending_nonces(apps, schema_editor):
    connection = schema_editor.connection
    postgres = connection.vendor == "postgresql"
    columns = list(PLAIN)
    if postgres:  # the text the hash takes, as the chainer reads it (audit.services._chain_reads)
        texts = {"created_at": POSTGRES_CANONICAL_TIME, "run_id": "run_id::text"}
        columns = [texts.get(name, name) for name in columns] + ["args::text", "result::text"]
    else:
        columns += ["args", "result"]
    keyring = None
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id, mac, {', '.join(columns)} FROM audit_auditpendingevent ORDER BY id")  # noqa: S608
        rows = cursor.fetchall()
        updates = []
        for row in rows:
            keyring = keyring or chain_keyring()
            hashed = dict(zip(PLAIN, row[2:-2], strict=True))
            if not postgres:
                sqlite_row_as_orm(hashed)
            hashed["args"], args_plain = json_value_plain(row[-2])
            hashed["result"], result_plain = json_value_plain(row[-1])
            plain = args_plain and result_plain
            if keyring.check("pending", pending_hash(hashed, plain=plain), row[1]) is not None:
                continue  # forged: left without a nonce, never chained (verify_audit names it)
            nonce = secrets.token_hex(16)
            mac = keyring.sign("pending", pending_hash({**hashed, "nonce": nonce}, plain=plain))
            updates.append((nonce, mac, row[0]))
        if updates:
            cursor.executemany("UPDATE audit_auditpendingevent SET nonce = %s, mac = %s WHERE id = %s", updates)


def refuse_back(apps: Any, schema_editor: Any) -> None:
    """Going back would drop the nonces the hashes of events chained from the pending table cover (they would no
    longer verify, and cannot be recomputed), and leave pending rows whose MACs cover a nonce: refused while any
    such event or row exists."""
    event = apps.get_model("audit", "AuditEvent")
    pending = apps.get_model("audit", "AuditPendingEvent")
    using = schema_editor.connection.alias
    if event.objects.using(using).filter(nonce__isnull=False).exists() or pending.objects.using(using).exists():
        raise IrreversibleError(
            "audit/0015 cannot be unapplied: events chained since it carry a nonce their hashes cover (they would no "
            "longer verify) or events are still pending"
        )


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0014_audit_event_plain_indexes"),
    ]

    operations = [
        migrations.AddField(
            model_name="auditevent",
            name="nonce",
            field=models.CharField(blank=True, editable=False, max_length=32, null=True, verbose_name="nonce"),
        ),
        migrations.AddField(
            model_name="auditpendingevent",
            name="nonce",
            field=models.CharField(default="", max_length=32),
        ),
        migrations.AddConstraint(
            model_name="auditevent",
            constraint=models.UniqueConstraint(
                condition=models.Q(("nonce__isnull", False)), fields=("nonce",), name="audit_event_nonce_unique"
            ),
        ),
        migrations.RunPython(pending_nonces, refuse_back),
    ]
