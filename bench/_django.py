"""Django for a benchmark: the project's settings on a throwaway SQLite database (or DATABASE_URL if set)."""

from __future__ import annotations

import os
import tempfile


def setup_django(*, keep_database_url: bool = False) -> str:
    """Point the settings at a fresh temporary folder, migrate, and return the folder."""
    workdir = tempfile.mkdtemp(prefix="bench-")
    os.environ["PLATFORM_VAR_DIR"] = workdir
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agent_platform.settings")
    # Benchmarks stand in for a model with the scripted provider (a fixed latency per turn).
    os.environ["PLATFORM_ALLOW_SCRIPTED_MODEL"] = "1"
    if not keep_database_url:
        os.environ.pop("DATABASE_URL", None)
    os.environ["SQLITE_PATH"] = os.path.join(workdir, "bench.sqlite3")
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", "--noinput", verbosity=0)
    return workdir
