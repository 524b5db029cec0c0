"""``python -m bench.audit`` writes tens of thousands of events into the audit chain of the database it keeps
(``DATABASE_URL``): pointed at a database that already holds a record, it refuses before writing anything, and the
record is as it was."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.harness import ROOT, manage_in

pytestmark = [pytest.mark.slow]

COUNT = "from audit.models import AuditEvent; print('events', AuditEvent.objects.count())"
RECORD = (
    "from audit.services import audit_event_record; "
    "audit_event_record(source='manual', action='config.note', actor='someone', args={'what': '기록'})"
)


def test_the_audit_bench_refuses_a_database_that_holds_a_record(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PLATFORM_VAR_DIR": str(tmp_path),
        "DATABASE_URL": f"sqlite:///{tmp_path / 'platform.sqlite3'}",
        "PYTHONIOENCODING": "utf-8",
    }
    manage_in(env, "migrate", "--noinput", "--verbosity", "0")
    manage_in(env, "shell", "-c", RECORD)
    assert "events 1" in manage_in(env, "shell", "-c", COUNT)

    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.audit",
            "--child",
            "--events",
            "20",
            "--writers",
            "0",
            "--verify-events",
            "20000",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )

    assert done.returncode != 0
    assert "refusing to run" in done.stderr and "1 audit events" in done.stderr
    assert "events 1" in manage_in(env, "shell", "-c", COUNT)  # nothing written, nothing deleted
