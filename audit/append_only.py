"""The database's own refusals: triggers that keep the audit events and the chain head append-only, whatever
client asks (raw SQL, ``dbshell``, another program), and the one way past them, for ``archive_audit``.

* **PostgreSQL** (migrations ``0004`` and ``0009``): UPDATE, DELETE and TRUNCATE of events are refused unless the
  transaction set ``SET LOCAL audit.allow_archive = 'on'`` (DELETE only); the head may only be updated forward,
  onto an event that exists with that ``seq`` and ``hash``, and is never deleted or truncated.
* **SQLite** (migration ``0009``, and re-installed after every ``migrate``, because SQLite's way of altering a
  table, a copy and a rename, drops its triggers): UPDATE of events is refused, DELETE unless a row of the
  guard table :data:`SQLITE_GUARD_TABLE` exists, which ``archive_audit`` inserts and deletes again inside its
  own transaction (SQLite has one writer at a time, so no other connection ever sees it); the head as above. An
  INSERT that would take an existing event's id or seq, or a second head, is refused too: ``INSERT OR REPLACE``
  deletes the row it replaces without firing DELETE triggers, which edited an event or moved the head back.

These stop casual and accidental changes. They are no defence against someone who can drop a trigger (the
database's owner, anyone with the SQLite file): the chain's MACs and its anchors outside the database are.
"""

from __future__ import annotations

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.base.base import BaseDatabaseWrapper

__all__ = [
    "SQLITE_GUARD_TABLE",
    "append_only_drop",
    "append_only_install",
    "archive_delete_allow",
    "archive_delete_end",
    "sqlite_flush_past_triggers",
    "sqlite_triggers_lift",
    "sqlite_triggers_present",
]

SQLITE_GUARD_TABLE = "audit_append_only_guard"

SQLITE_TRIGGERS = """
CREATE TABLE IF NOT EXISTS audit_append_only_guard (purpose TEXT NOT NULL CHECK (purpose IN ('archive', 'flush')));
CREATE TRIGGER IF NOT EXISTS audit_event_no_update BEFORE UPDATE ON audit_auditevent
BEGIN SELECT RAISE(ABORT, 'audit events are append-only: UPDATE refused'); END;
CREATE TRIGGER IF NOT EXISTS audit_event_no_delete BEFORE DELETE ON audit_auditevent
WHEN NOT EXISTS (SELECT 1 FROM audit_append_only_guard)
BEGIN SELECT RAISE(ABORT, 'audit events are append-only: DELETE refused'); END;
CREATE TRIGGER IF NOT EXISTS audit_head_forward_only BEFORE UPDATE ON audit_auditchainhead
WHEN NEW.id IS NOT OLD.id OR NEW.seq <= OLD.seq
    OR NOT EXISTS (SELECT 1 FROM audit_auditevent WHERE seq = NEW.seq AND hash = NEW.hash)
BEGIN SELECT RAISE(ABORT, 'the audit chain head only moves forward, onto an appended event: UPDATE refused'); END;
CREATE TRIGGER IF NOT EXISTS audit_head_no_delete BEFORE DELETE ON audit_auditchainhead
WHEN NOT EXISTS (SELECT 1 FROM audit_append_only_guard WHERE purpose = 'flush')
BEGIN SELECT RAISE(ABORT, 'the audit chain head is never deleted: DELETE refused'); END;
CREATE TRIGGER IF NOT EXISTS audit_event_no_replace BEFORE INSERT ON audit_auditevent
WHEN EXISTS (SELECT 1 FROM audit_auditevent WHERE id = NEW.id OR seq = NEW.seq)
BEGIN SELECT RAISE(ABORT, 'audit events are append-only: REPLACE refused'); END;
CREATE TRIGGER IF NOT EXISTS audit_head_no_replace BEFORE INSERT ON audit_auditchainhead
WHEN EXISTS (SELECT 1 FROM audit_auditchainhead)
BEGIN SELECT RAISE(ABORT, 'the audit chain head is never replaced: REPLACE refused'); END;
"""

SQLITE_LIFT = """
DROP TRIGGER IF EXISTS audit_head_no_replace;
DROP TRIGGER IF EXISTS audit_event_no_replace;
DROP TRIGGER IF EXISTS audit_head_no_delete;
DROP TRIGGER IF EXISTS audit_head_forward_only;
DROP TRIGGER IF EXISTS audit_event_no_delete;
DROP TRIGGER IF EXISTS audit_event_no_update;
"""

POSTGRES_HEAD_TRIGGER = """
CREATE OR REPLACE FUNCTION audit_head_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        IF NEW.id = OLD.id AND NEW.seq > OLD.seq
           AND EXISTS (SELECT 1 FROM audit_auditevent WHERE seq = NEW.seq AND hash = NEW.hash) THEN
            RETURN NEW;
        END IF;
        RAISE EXCEPTION 'the audit chain head only moves forward, onto an appended event: UPDATE refused'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RAISE EXCEPTION 'the audit chain head is never deleted: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$;
DROP TRIGGER IF EXISTS audit_head_forward_only ON audit_auditchainhead;
CREATE TRIGGER audit_head_forward_only BEFORE UPDATE OR DELETE ON audit_auditchainhead
    FOR EACH ROW EXECUTE FUNCTION audit_head_refuse_change();
DROP TRIGGER IF EXISTS audit_head_no_truncate ON audit_auditchainhead;
CREATE TRIGGER audit_head_no_truncate BEFORE TRUNCATE ON audit_auditchainhead
    FOR EACH STATEMENT EXECUTE FUNCTION audit_head_refuse_change();
"""

POSTGRES_DROP = """
DROP TRIGGER IF EXISTS audit_head_no_truncate ON audit_auditchainhead;
DROP TRIGGER IF EXISTS audit_head_forward_only ON audit_auditchainhead;
DROP FUNCTION IF EXISTS audit_head_refuse_change();
"""


def _statements(script: str) -> list[str]:
    """SQLite's driver runs one statement per call; a trigger's body holds ``;`` but ends with ``END;``."""
    statements, current = [], []
    for line in script.strip().splitlines():
        current.append(line)
        text = "\n".join(current).strip()
        if text.endswith(";") and (not text.upper().startswith("CREATE TRIGGER") or text.upper().endswith("END;")):
            statements.append(text)
            current = []
    return statements


def append_only_install(connection: BaseDatabaseWrapper) -> None:
    """Install (idempotently) this vendor's triggers; the events trigger of PostgreSQL is migration 0004's."""
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            for statement in _statements(SQLITE_TRIGGERS):
                cursor.execute(statement)
        elif connection.vendor == "postgresql":
            cursor.execute(POSTGRES_HEAD_TRIGGER)


def append_only_drop(connection: BaseDatabaseWrapper) -> None:
    """Remove what :func:`append_only_install` installed (the migration's reverse)."""
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            for statement in _statements(SQLITE_LIFT):
                cursor.execute(statement)
            cursor.execute(f"DROP TABLE IF EXISTS {SQLITE_GUARD_TABLE}")
        elif connection.vendor == "postgresql":
            cursor.execute(POSTGRES_DROP)


def sqlite_triggers_lift(connection: BaseDatabaseWrapper) -> None:
    """Drop the SQLite triggers for the length of a ``migrate`` (``audit.apps`` puts them back after it)."""
    with connection.cursor() as cursor:
        for statement in _statements(SQLITE_LIFT):
            cursor.execute(statement)


def archive_delete_allow(cursor: object, connection: BaseDatabaseWrapper) -> None:
    """Let this transaction (and only it) delete archived events. Call it inside ``transaction.atomic()``
    before the DELETE, and on SQLite call :func:`archive_delete_end` before the transaction ends."""
    if connection.vendor == "postgresql":
        cursor.execute("SET LOCAL audit.allow_archive = 'on'")  # type: ignore[attr-defined]
    elif connection.vendor == "sqlite":
        cursor.execute(f"INSERT INTO {SQLITE_GUARD_TABLE} (purpose) VALUES ('archive')")  # type: ignore[attr-defined]  # noqa: S608


def archive_delete_end(cursor: object, connection: BaseDatabaseWrapper) -> None:
    """Close what :func:`archive_delete_allow` opened (PostgreSQL's ``SET LOCAL`` ends with the transaction)."""
    if connection.vendor == "sqlite":
        cursor.execute(f"DELETE FROM {SQLITE_GUARD_TABLE}")  # type: ignore[attr-defined]  # noqa: S608


def sqlite_flush_past_triggers(statements: list[str], tables: list[str] | set[str]) -> list[str]:
    """Django's SQLite flush statements, wrapped in the guard so that the triggers let them empty the audit
    tables. For test suites (``TransactionTestCase`` empties every table after each test); a production
    ``manage.py flush`` stays refused, as on PostgreSQL."""
    if "audit_auditevent" not in tables and "audit_auditchainhead" not in tables:
        return statements
    return [
        f"INSERT INTO {SQLITE_GUARD_TABLE} (purpose) VALUES ('flush');",  # noqa: S608
        *statements,
        f"DELETE FROM {SQLITE_GUARD_TABLE};",  # noqa: S608
    ]


def sqlite_triggers_present(using: str = DEFAULT_DB_ALIAS) -> set[str]:
    """The names of the audit triggers installed on a SQLite database (for checks and tests)."""
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT name FROM sqlite_master WHERE type = 'trigger' AND name LIKE 'audit_%'")
        return {row[0] for row in cursor.fetchall()}
