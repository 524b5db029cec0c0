"""``manage.py migrate``, Django's own, that never leaves SQLite's audit tables without their append-only triggers.

``pre_migrate`` lifts them for the length of a ``migrate`` and ``post_migrate`` puts them back (``audit/apps.py``),
but ``post_migrate`` is sent only after a ``migrate`` that succeeded: one whose migration raised, or that was
stopped with Ctrl-C, put them back here. One killed outright cannot: the next ``migrate`` puts them back before its
system checks run, so that ``audit.E004``, which names them missing, does not refuse the ``migrate`` that mends it.
"""

from __future__ import annotations

from typing import Any

from django.core.management.commands import migrate

from audit.apps import append_only_put_back


class Command(migrate.Command):
    def execute(self, *args: Any, **options: Any) -> str | None:
        using = options["database"]
        append_only_put_back(using=using)
        try:
            return super().execute(*args, **options)
        except BaseException:  # Ctrl-C too: the triggers go back before the process ends
            append_only_put_back(using=using)
            raise
