"""MAC the record as it stands, with the signing key of ``AUDIT_CHAIN_KEY`` (or the local key file): every
event, every archive checkpoint and the chain head; and create the head (seq 0, the genesis hash) on a record
that has none because nothing was ever written.

Set ``AUDIT_CHAIN_KEY`` before running it where it will be set for the platform: events MAC'd here with a key
the platform does not hold fail verification later. A head that is missing while events or checkpoints exist
is not re-created (the chain fails closed): ``verify_audit`` reports it. On PostgreSQL the append-only trigger
of 0004 is disabled for this transaction's UPDATE only; SQLite's triggers come after, in 0009.
"""

from django.db import migrations

from audit.chain import GENESIS_HASH, checkpoint_message, head_message
from audit.chain_keys import chain_keyring

BATCH = 2000


def mac_the_record(apps, schema_editor):
    connection = schema_editor.connection
    keyring = chain_keyring()
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("ALTER TABLE audit_auditevent DISABLE TRIGGER audit_event_append_only")
        last_id = 0
        while True:
            cursor.execute(
                "SELECT id, hash FROM audit_auditevent WHERE id > %s ORDER BY id LIMIT %s", [last_id, BATCH]
            )
            rows = cursor.fetchall()
            if not rows:
                break
            cursor.executemany(
                "UPDATE audit_auditevent SET mac = %s WHERE id = %s",
                [(keyring.sign("event", digest), event_id) for event_id, digest in rows],
            )
            last_id = rows[-1][0]
        if connection.vendor == "postgresql":
            cursor.execute("ALTER TABLE audit_auditevent ENABLE TRIGGER audit_event_append_only")
        cursor.execute("SELECT id, seq, hash, count FROM audit_auditcheckpoint")
        for checkpoint_id, seq, digest, count in cursor.fetchall():
            cursor.execute(
                "UPDATE audit_auditcheckpoint SET mac = %s WHERE id = %s",
                [keyring.sign("checkpoint", checkpoint_message(seq, digest, count)), checkpoint_id],
            )
        cursor.execute("SELECT seq, hash FROM audit_auditchainhead WHERE id = 1")
        head = cursor.fetchone()
        if head is not None:
            cursor.execute(
                "UPDATE audit_auditchainhead SET mac = %s WHERE id = 1", [keyring.sign("head", head_message(*head))]
            )
            return
        cursor.execute("SELECT EXISTS (SELECT 1 FROM audit_auditevent) OR EXISTS (SELECT 1 FROM audit_auditcheckpoint)")
        if cursor.fetchone()[0]:
            return  # fail closed: a head is never re-created over events
        cursor.execute(
            "INSERT INTO audit_auditchainhead (id, seq, hash, mac) VALUES (1, 0, %s, %s)",
            [GENESIS_HASH, keyring.sign("head", head_message(0, GENESIS_HASH))],
        )


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0007_audit_chain_mac"),
    ]

    operations = [
        migrations.RunPython(mac_the_record, migrations.RunPython.noop),
    ]
