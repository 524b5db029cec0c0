"""Chain the events written before the chain existed, in id order, and set the chain head.

Runs before 0004 makes ``seq`` required and unique and (on PostgreSQL) installs the append-only trigger, the
last moment these rows can still be updated.
"""

from django.db import migrations

from audit.chain import GENESIS_HASH, HASHED_FIELDS, event_hash


def chain_existing_events(apps, schema_editor):
    AuditEvent = apps.get_model("audit", "AuditEvent")
    AuditChainHead = apps.get_model("audit", "AuditChainHead")
    database = schema_editor.connection.alias
    seq, prev_hash = 0, GENESIS_HASH
    fields = [name for name in HASHED_FIELDS if name not in ("seq", "prev_hash")]
    rows = AuditEvent.objects.using(database).order_by("id").values("id", *fields)
    for row in rows.iterator(chunk_size=2000):
        seq += 1
        row.update(seq=seq, prev_hash=prev_hash)
        digest = event_hash(row)
        AuditEvent.objects.using(database).filter(pk=row["id"]).update(seq=seq, prev_hash=prev_hash, hash=digest)
        prev_hash = digest
    AuditChainHead.objects.using(database).update_or_create(pk=1, defaults={"seq": seq, "hash": prev_hash})


class Migration(migrations.Migration):

    dependencies = [
        ('audit', '0002_audit_chain'),
    ]

    operations = [
        migrations.RunPython(chain_existing_events, migrations.RunPython.noop),
    ]
