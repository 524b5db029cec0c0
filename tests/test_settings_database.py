"""``DB_CONN_MAX_AGE`` keeps database connections across requests on SQLite as on PostgreSQL (0 by default: a
connection per request, what ASGI needs); on PostgreSQL values are bound on the server and a statement repeated on
a connection is prepared there (``DB_SERVER_SIDE_BINDING``, ``DB_PREPARE_THRESHOLD``). Read from the environment
when the settings load."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.e2e.harness import ROOT
from tests.postgres import manage, postgres_url  # noqa: F401 - postgres_url is a fixture

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


SHOW_OPTIONS = (
    "import json, django; django.setup(); from django.conf import settings;"
    "print(json.dumps(settings.DATABASES['default'].get('OPTIONS', {})))"
)


@pytest.mark.parametrize(
    ("environment", "expected"),
    [
        ({}, {"server_side_binding": True, "prepare_threshold": 5}),
        ({"DB_PREPARE_THRESHOLD": "0"}, {"server_side_binding": True, "prepare_threshold": None}),
        ({"DB_PREPARE_THRESHOLD": "2"}, {"server_side_binding": True, "prepare_threshold": 2}),
        ({"DB_SERVER_SIDE_BINDING": "0"}, {"server_side_binding": False, "prepare_threshold": 5}),
    ],
)
def test_postgresql_binds_on_the_server_and_prepares_repeated_statements_unless_told_not_to(
    environment: dict[str, str], expected: dict[str, object], tmp_path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DB_") and k != "DATABASE_URL"}
    env.update(
        DJANGO_SETTINGS_MODULE="agent_platform.settings",
        PLATFORM_VAR_DIR=str(tmp_path),
        DATABASE_URL="postgres://platform@db.invalid:5432/platform",  # read, never connected to
        **environment,
    )

    done = subprocess.run(
        [sys.executable, "-c", SHOW_OPTIONS], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )

    assert json.loads(done.stdout.strip().splitlines()[-1]) == expected


def test_sqlite_has_no_postgresql_options(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update(DJANGO_SETTINGS_MODULE="agent_platform.settings", PLATFORM_VAR_DIR=str(tmp_path))

    done = subprocess.run(
        [sys.executable, "-c", SHOW_OPTIONS], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )

    options = json.loads(done.stdout.strip().splitlines()[-1])
    assert "server_side_binding" not in options
    assert "prepare_threshold" not in options


# A statement a run makes between every two of its steps, run six times on one connection, then what that connection
# holds prepared (``pg_prepared_statements`` shows a session its own).
BETWEEN_STEPS = (
    "import json, uuid; from django.db import connection; from agents.execution import _run_holder\n"
    "for _ in range(6): _run_holder(uuid.uuid4())\n"
    "with connection.cursor() as c:\n"
    "    c.execute('SELECT statement FROM pg_prepared_statements')\n"
    "    print(json.dumps([row[0] for row in c.fetchall()]))"
)


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("environment", "prepared"),
    [({}, True), ({"DB_PREPARE_THRESHOLD": "0"}, False), ({"DB_SERVER_SIDE_BINDING": "0"}, False)],
)
def test_a_statement_repeated_on_a_postgresql_connection_is_prepared_with_its_values_bound_on_the_server(
    postgres_url: str,  # noqa: F811 - the fixture
    environment: dict[str, str],
    prepared: bool,
) -> None:
    done = manage("shell", "-c", BETWEEN_STEPS, database_url=postgres_url, env=environment, timeout=120)

    assert done.returncode == 0, done.stderr
    statements = json.loads(done.stdout.strip().splitlines()[-1])
    between_steps = [s for s in statements if "SELECT status, worker, delivery_count" in s]
    if prepared:
        assert len(between_steps) == 1, statements
        assert "$1" in between_steps[0]  # the run's id sent apart from the text, not quoted into it
    else:
        assert between_steps == []
