"""Approval status ``outcome_unknown`` (the call went out and no answer came); the status column grows to hold it.

Approvals left ``executing`` by a worker that died, on runs that have finished since, end ``outcome_unknown``:
nothing will ever record their outcome (a run still going is left to its worker or the reconciler)."""

from __future__ import annotations

from typing import Any

from django.db import migrations, models


def interrupted_executions_end_outcome_unknown(apps: Any, schema_editor: Any) -> None:
    approval = apps.get_model("agents", "Approval")
    approval.objects.filter(status="executing", run__status__in=["succeeded", "failed", "cancelled"]).update(
        status="outcome_unknown",
        result={"ok": False, "reason": "approval:outcome_unknown", "value": None, "outcome_unknown": True},
    )


class Migration(migrations.Migration):
    dependencies = [
        ("agents", "0005_agent_language_no_match_tool_failures"),
    ]

    operations = [
        migrations.AlterField(
            model_name="approval",
            name="status",
            field=models.CharField(
                choices=[
                    ("pending", "pending"),
                    ("approved", "approved"),
                    ("rejected", "rejected"),
                    ("expired", "expired"),
                    ("executing", "executing"),
                    ("executed", "executed"),
                    ("outcome_unknown", "outcome unknown"),
                ],
                db_index=True,
                default="pending",
                max_length=20,
                verbose_name="status",
            ),
        ),
        migrations.RunPython(interrupted_executions_end_outcome_unknown, migrations.RunPython.noop),
    ]
