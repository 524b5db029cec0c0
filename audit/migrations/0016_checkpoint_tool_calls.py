"""What ``/metrics`` counted of the archived events, kept on the archive checkpoint (``AuditCheckpoint.tool_calls``):
``archive_audit`` deletes the events its counters were computed from, and a Prometheus counter that goes down reads
as a reset.

A plain nullable column (no rewrite of the table, on SQLite neither). Checkpoints made before it stay null: the
events they archived were out of the counters already, so nothing changes for them. Outside the checkpoint's MAC
(figures, not evidence): every checkpoint made before verifies as it did.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0015_event_nonce"),
    ]

    operations = [
        migrations.AddField(
            model_name="auditcheckpoint",
            name="tool_calls",
            field=models.JSONField(blank=True, null=True, verbose_name="tool calls archived so far (metrics)"),
        ),
    ]
