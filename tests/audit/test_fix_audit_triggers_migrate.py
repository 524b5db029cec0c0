"""SQLite's append-only triggers, which ``migrate`` lifts while it runs, are back after a ``migrate`` that failed or
was stopped, and where they are missing anyway (a ``migrate`` killed outright), every ``check`` says so
(``audit.E004``) while ``migrate``, which mends it, still runs."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connection, transaction
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.recorder import MigrationRecorder
from django.db.utils import ConnectionHandler
from django.test import Client

from audit import checks as audit_checks
from audit.append_only import sqlite_triggers_lift
from audit.checks import check_append_only_triggers
from audit.services import audit_event_record

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def sqlite_only() -> None:
    if connection.vendor != "sqlite":
        pytest.skip("the triggers lifted for a migrate are SQLite's")


def raw_update_refused() -> bool:
    """Whether a raw UPDATE of an audit event is refused, as an intruder with the database would try it."""
    audit_event_record(source="agent", tool="lookup")
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("UPDATE audit_auditevent SET actor = 'intruder'")
    except DatabaseError:
        return True
    return False


def checked() -> str:
    """What ``manage.py check`` says: its report, or the error it stops with."""
    out = io.StringIO()
    try:
        call_command("check", stdout=out, stderr=io.StringIO())
    except SystemCheckError as exc:
        return str(exc)
    return out.getvalue()


@pytest.mark.parametrize("stopped_by", [RuntimeError("a migration that fails"), KeyboardInterrupt()])
def test_a_migrate_that_fails_or_is_stopped_puts_the_triggers_back(
    monkeypatch: pytest.MonkeyPatch, stopped_by: BaseException
) -> None:
    def migration_raises(*args: object, **kwargs: object) -> None:
        raise stopped_by  # after pre_migrate lifted the triggers, before post_migrate

    monkeypatch.setattr(MigrationExecutor, "migrate", migration_raises)

    with pytest.raises(type(stopped_by)):
        call_command("migrate", verbosity=0)

    assert raw_update_refused()
    assert check_append_only_triggers() == []


def test_missing_triggers_are_a_check_error_that_migrate_mends() -> None:
    sqlite_triggers_lift(connection)  # as a migrate killed outright leaves them

    said = checked()
    assert "audit.E004" in said and "lack their append-only triggers (audit_event_no_delete, " in said
    assert "HINT: Run manage.py migrate" in said

    call_command("migrate", verbosity=0, skip_checks=False)  # its checks do not refuse it

    assert raw_update_refused()
    assert "audit.E004" not in checked()


def test_a_database_no_migrate_has_run_on_is_no_check_error(monkeypatch: pytest.MonkeyPatch) -> None:
    sqlite_triggers_lift(connection)
    monkeypatch.setattr(MigrationRecorder, "has_table", lambda recorder: False)  # no django_migrations yet

    assert check_append_only_triggers() == []


def sqlite_databases(path: Path) -> ConnectionHandler:
    """Connections whose default database is the SQLite file at ``path``, as SQLITE_PATH names one."""
    return ConnectionHandler({DEFAULT_DB_ALIAS: {"ENGINE": "django.db.backends.sqlite3", "NAME": str(path)}})


def test_a_sqlite_file_that_does_not_exist_is_not_created_by_the_check(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """An image build's ``check --deploy``, SQLITE_PATH on a volume still to be mounted: nothing to protect yet, and
    an empty file made there would hide the volume's database or be taken for a fresh one."""
    missing = tmp_path / "db.sqlite3"
    databases = sqlite_databases(missing)
    monkeypatch.setattr(audit_checks, "connections", databases)

    try:
        said = check_append_only_triggers()
    finally:
        databases.close_all()

    assert said == []
    assert not missing.exists()


def test_an_existing_sqlite_file_is_still_checked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    existing = tmp_path / "db.sqlite3"
    existing.touch()
    databases = sqlite_databases(existing)
    monkeypatch.setattr(audit_checks, "connections", databases)
    monkeypatch.setattr(audit_checks, "append_only_migrated", lambda connection: True)
    monkeypatch.setattr(audit_checks, "sqlite_triggers_present", lambda using: set())

    try:
        said = check_append_only_triggers()
    finally:
        databases.close_all()

    assert [message.id for message in said] == ["audit.E004"]


def test_readyz_is_not_ready_while_the_triggers_are_missing_and_names_them(client: Client) -> None:
    """A record open to raw UPDATE and DELETE passed every probe while each request succeeded."""
    assert client.get("/readyz").json()["checks"]["audit"]["ok"] is True
    sqlite_triggers_lift(connection)

    answer = client.get("/readyz")

    assert answer.status_code == 503
    audit = answer.json()["checks"]["audit"]
    assert audit["ok"] is False
    assert "lack their append-only triggers (audit_event_no_delete, " in audit["error"]
    assert audit["error"].endswith("run manage.py migrate")
    call_command("migrate", verbosity=0)
    assert client.get("/readyz").json()["checks"]["audit"]["ok"] is True
