"""``DB_CONN_MAX_AGE`` keeps database connections across requests on SQLite as on PostgreSQL (0 by default: a
connection per request, what ASGI needs); read from the environment when the settings load."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.e2e.harness import ROOT

SHOW = (
    "import json, django; django.setup(); from django.conf import settings; d = settings.DATABASES['default'];"
    "print(json.dumps([d['ENGINE'], d['CONN_MAX_AGE'], d['CONN_HEALTH_CHECKS']]))"
)


@pytest.mark.parametrize(("value", "expected"), [(None, 0), ("60", 60)])
def test_sqlite_keeps_its_connections_as_long_as_db_conn_max_age_says(
    value: str | None, expected: int, tmp_path
) -> None:
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "DB_CONN_MAX_AGE"}}
    env.update(DJANGO_SETTINGS_MODULE="agent_platform.settings", PLATFORM_VAR_DIR=str(tmp_path))
    if value is not None:
        env["DB_CONN_MAX_AGE"] = value

    done = subprocess.run([sys.executable, "-c", SHOW], cwd=ROOT, env=env, capture_output=True, text=True, check=True)

    assert json.loads(done.stdout.strip().splitlines()[-1]) == ["django.db.backends.sqlite3", expected, True]
