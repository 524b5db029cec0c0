from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from agents.reconciler import runs_reconcile


class Command(BaseCommand):
    help = (
        "One pass of the run reconciler: fail runs past their time limit, queue again (or fail) runs whose worker "
        "was lost, dispatch again runs whose message was lost, expire due approvals. Prints what it changed."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        for name, count in runs_reconcile().as_dict().items():
            self.stdout.write(f"{name}: {count}")
