"""An audit event refers to its run by id (``run_id``), not by a foreign key to ``agents.Run``: events outlive runs
under retention, and the audit core names no model of the apps that write to it.

The column stays ``run_id`` with its values (the hash chain hashes ``run_id``, so every hash stays valid); only the
foreign-key constraint goes (``db_constraint=False`` on the database), and the model's state becomes a plain
indexed UUID field."""

from __future__ import annotations

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("agents", "0004_approval_exact_args"),
        ("audit", "0005_auditor_group"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.AlterField(
                    model_name="auditevent",
                    name="run",
                    field=models.ForeignKey(
                        blank=True,
                        null=True,
                        db_constraint=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="audit_events",
                        to="agents.run",
                    ),
                ),
            ],
            state_operations=[
                migrations.RemoveField(model_name="auditevent", name="run"),
                migrations.AddField(
                    model_name="auditevent",
                    name="run_id",
                    field=models.UUIDField(blank=True, db_index=True, null=True, verbose_name="run"),
                ),
            ],
        ),
    ]
