"""Indexes for the audit list's tool and action filters, whose choices are the distinct values of the table:
``tool`` is indexed with ``action`` (the tool filter leaves configuration changes out by their action) and
``action`` on its own, so that both are read from an index rather than a scan of every event. The new ``tool``
index is made before the old one is dropped. Plain ``CREATE INDEX``/``DROP INDEX``: the append-only table is not
remade and its triggers stay as they are."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0016_checkpoint_tool_calls"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="auditevent",
            index=models.Index(fields=["tool", "action"], name="audit_event_tool_action_idx"),
        ),
        migrations.AddIndex(
            model_name="auditevent",
            index=models.Index(fields=["action"], name="audit_event_action_idx"),
        ),
        migrations.RemoveIndex(
            model_name="auditevent",
            name="audit_event_tool_idx",
        ),
    ]
