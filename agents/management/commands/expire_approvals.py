from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from agents.approvals import approvals_expire_due


class Command(BaseCommand):
    help = "Expire pending approvals past their time; their runs resume and the model is told the call was not made."

    def handle(self, *args: Any, **options: Any) -> None:
        self.stdout.write(f"expired {approvals_expire_due()} approval(s)")
