"""``DB_CONN_MAX_AGE`` keeps database connections across requests on SQLite as on PostgreSQL (0 by default: a
connection per request, what ASGI needs); on PostgreSQL values are bound on the server and a statement repeated on
a connection is prepared there (``DB_SERVER_SIDE_BINDING``, ``DB_PREPARE_THRESHOLD``). Read from the environment
when the settings load."""

from __future__ import annotations

import json

import pytest

from tests.e2e.harness import settings_seen
from tests.postgres import manage, postgres_url  # noqa: F401 - postgres_url is a fixture

DATABASE = "[settings.DATABASES['default'][k] for k in ('ENGINE', 'CONN_MAX_AGE', 'CONN_HEALTH_CHECKS')]"
OPTIONS = "settings.DATABASES['default'].get('OPTIONS', {})"


@pytest.mark.parametrize(("value", "expected"), [(None, 0), ("60", 60)])
@pytest.mark.slow
def test_sqlite_keeps_its_connections_as_long_as_db_conn_max_age_says(
    value: str | None, expected: int, tmp_path
) -> None:
    env = {} if value is None else {"DB_CONN_MAX_AGE": value}

    assert settings_seen(DATABASE, tmp_path, **env) == ["django.db.backends.sqlite3", expected, True]


@pytest.mark.parametrize(
    ("environment", "expected"),
    [
        ({}, {"server_side_binding": True, "prepare_threshold": 5, "connect_timeout": 5}),
        ({"DB_PREPARE_THRESHOLD": "0"}, {"server_side_binding": True, "prepare_threshold": None, "connect_timeout": 5}),
        ({"DB_PREPARE_THRESHOLD": "2"}, {"server_side_binding": True, "prepare_threshold": 2, "connect_timeout": 5}),
        ({"DB_SERVER_SIDE_BINDING": "0"}, {"server_side_binding": False, "prepare_threshold": 5, "connect_timeout": 5}),
    ],
)
@pytest.mark.slow
def test_postgresql_binds_on_the_server_and_prepares_repeated_statements_unless_told_not_to(
    environment: dict[str, str], expected: dict[str, object], tmp_path
) -> None:
    database_url = "postgres://platform@db.invalid:5432/platform"  # read, never connected to

    assert settings_seen(OPTIONS, tmp_path, DATABASE_URL=database_url, **environment) == expected


@pytest.mark.slow  # ≥ 1.5 s: the fast loop stays under five minutes
def test_sqlite_has_no_postgresql_options(tmp_path) -> None:
    options = settings_seen(OPTIONS, tmp_path)

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
