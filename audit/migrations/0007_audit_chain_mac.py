"""A MAC beside every hash: events, the chain head and archive checkpoints each get a ``mac`` column
(``<key id>:<hex HMAC-SHA256>`` under ``AUDIT_CHAIN_KEY``, see ``audit/chain.py``). 0008 fills it in."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0006_auditevent_run_id"),
    ]

    operations = [
        migrations.AddField(
            model_name="auditevent",
            name="mac",
            field=models.CharField(default="", editable=False, max_length=80, verbose_name="MAC"),
        ),
        migrations.AddField(
            model_name="auditchainhead",
            name="mac",
            field=models.CharField(default="", max_length=80, verbose_name="MAC"),
        ),
        migrations.AddField(
            model_name="auditcheckpoint",
            name="mac",
            field=models.CharField(default="", max_length=80, verbose_name="MAC"),
        ),
    ]
