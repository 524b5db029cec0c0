from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from agents.reconciler import runs_reconcile

# One line per figure of ``ReconcileReport``, in its order. The English line starts with the report's own name
# for the figure (scripts and the end-to-end tests read ``worker_lost: 1``); a translation names it in words.
LINES = {
    # Translators: running runs past their time limit, failed.
    "timed_out": gettext_noop("timed_out: %(count)s"),
    # Translators: runs of a lost worker queued again.
    "requeued": gettext_noop("requeued: %(count)s"),
    # Translators: runs of a lost worker failed (delivered too many times).
    "worker_lost": gettext_noop("worker_lost: %(count)s"),
    # Translators: approved tool calls of those runs (failed or queued again) that their lost worker had started,
    # ended with their outcome unknown.
    "approvals_interrupted": gettext_noop("approvals_interrupted: %(count)s"),
    # Translators: queued runs whose message was lost, dispatched again.
    "redispatched": gettext_noop("redispatched: %(count)s"),
    # Translators: approvals past their deadline, expired.
    "approvals_expired": gettext_noop("approvals_expired: %(count)s"),
    # Translators: runs awaiting approval with no approval pending any more, queued again.
    "parked_resumed": gettext_noop("parked_resumed: %(count)s"),
    # Translators: approvals left by finished runs, ended (outcome unknown or unused).
    "approvals_ended": gettext_noop("approvals_ended: %(count)s"),
    # Translators: runs cancelled while they ran whose worker died before recording the end, recorded as ended.
    "cancellations_recorded": gettext_noop("cancellations_recorded: %(count)s"),
}


class Command(BaseCommand):
    help = gettext_noop(
        "One pass of the run reconciler: fail runs past their time limit, queue again (or fail) runs whose worker "
        "was lost, dispatch again runs whose message was lost, expire due approvals. Prints what it changed."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.description = _(self.help)  # marked above, translated now: argparse takes no lazy string

    def handle(self, *args: Any, **options: Any) -> None:
        for name, count in runs_reconcile().as_dict().items():
            line = LINES.get(name)
            self.stdout.write(_(line) % {"count": count} if line else f"{name}: {count}")
