"""Triggers on SQLite too: UPDATE and DELETE of audit events refused (``archive_audit`` passes a guard row it sets
inside its own transaction), and on both databases the chain head may only move forward onto an appended event
and is never deleted. The SQL is in ``audit/append_only.py``, which also re-installs the SQLite triggers after
every ``migrate`` (SQLite rebuilds a table to alter it, and its triggers go with the old table)."""

from django.db import migrations

from audit.append_only import append_only_drop, append_only_install


def install(apps, schema_editor):
    append_only_install(schema_editor.connection)


def drop(apps, schema_editor):
    append_only_drop(schema_editor.connection)


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0008_audit_chain_mac_backfill"),
    ]

    operations = [
        migrations.RunPython(install, drop),
    ]
