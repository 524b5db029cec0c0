"""The audit events' indexes (migration 0014): ``source``, ``mcp_id`` and ``tool`` by one plain index each, no
PostgreSQL pattern index beside them (no query matches them by prefix), ``reason`` still with its pattern index
(the auditors filter it by prefix); since migration 0017 ``tool``'s index holds ``action`` too and ``action`` has
its own (the audit list's filter choices are read from them); and the migrations go back to ``db_index``'s
indexes and forward again, on SQLite and on a real PostgreSQL cluster, without remaking the table."""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command
from django.db import connection

from tests.postgres import manage, postgres_url  # noqa: F401 - postgres_url is a fixture

PLAIN = {"source": "audit_event_source_idx", "mcp_id": "audit_event_mcp_id_idx"}
# Migration 0017 (the audit list's tool and action filters): tool's plain index became (tool, action).
LIST_FILTERS = {"tool+action": "audit_event_tool_action_idx", "action": "audit_event_action_idx"}

INDEXES = """
import json
from django.db import connection
def indexes():
    with connection.cursor() as cursor:
        found = connection.introspection.get_constraints(cursor, "audit_auditevent")
        cursor.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'audit_auditevent'")
        definitions = dict(cursor.fetchall())
    return {
        columns: sorted([name, definitions[name].split(" USING ")[1]] for name, about in found.items()
                        if "+".join(about["columns"]) == columns and about["index"] and not about["unique"])
        for columns in ("source", "mcp_id", "tool", "reason", "tool+action", "action")
    }
"""

PG_MIGRATE = (
    INDEXES
    + """
from django.core.management import call_command
from audit.services import audit_event_record
from audit.models import AuditEvent
audit_event_record(source="agent", mcp_id="pg-index", tool="조회", args={"i": 1})
seen = {"forward": indexes()}
call_command("migrate", "audit", "0013", verbosity=0)
seen["back"] = indexes()
call_command("migrate", "audit", verbosity=0)
seen["again"] = indexes()
seen["events"] = AuditEvent.objects.filter(mcp_id="pg-index", source="agent", tool="조회").count()
print(json.dumps(seen, ensure_ascii=False))
"""
)


def _sqlite_indexes() -> dict[str, list[str]]:
    """The plain indexes by their columns (``tool+action``)."""
    with connection.cursor() as cursor:
        found = connection.introspection.get_constraints(cursor, "audit_auditevent")
    return {
        columns: sorted(
            name
            for name, about in found.items()
            if "+".join(about["columns"]) == columns and about["index"] and not about["unique"]
        )
        for columns in (*PLAIN, "tool", "reason", *LIST_FILTERS)
    }


def _as_migrated(found: dict[str, list[str]]) -> None:
    assert {column: found[column] for column in PLAIN} == {column: [name] for column, name in PLAIN.items()}
    assert {columns: found[columns] for columns in LIST_FILTERS} == {c: [n] for c, n in LIST_FILTERS.items()}
    assert found["tool"] == []  # the (tool, action) index serves it
    assert len(found["reason"]) == 1 and found["reason"][0].startswith("audit_auditevent_reason_")


@pytest.mark.django_db(transaction=True)
def test_on_sqlite_each_field_has_one_plain_index_and_the_migration_goes_back_and_forth() -> None:
    _as_migrated(_sqlite_indexes())
    with connection.cursor() as cursor:
        cursor.execute("SELECT sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'audit_auditevent'")
        triggers = sorted(row[0] for row in cursor.fetchall())
    try:
        call_command("migrate", "audit", "0013", verbosity=0)
        back = _sqlite_indexes()
        assert all(
            len(back[column]) == 1 and back[column][0].startswith(f"audit_auditevent_{column}_")
            for column in (*PLAIN, "tool")
        ), back
        assert all(back[columns] == [] for columns in LIST_FILTERS), back
    finally:
        call_command("migrate", "audit", verbosity=0)
    _as_migrated(_sqlite_indexes())
    with connection.cursor() as cursor:  # the append-only table was not remade: its triggers are the same
        cursor.execute("SELECT sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'audit_auditevent'")
        assert sorted(row[0] for row in cursor.fetchall()) == triggers and triggers


@pytest.mark.postgres
def test_on_postgresql_the_pattern_indexes_are_gone_but_reasons_and_come_back_with_the_migration(
    postgres_url: str,  # noqa: F811 - the fixture
) -> None:
    # A database of its own, every event written inline: an event chained from the pending table carries a nonce,
    # and unapplying audit/0015 (on the way back to 0013) is refused while one does (the shared database has some).
    import uuid
    from urllib.parse import urlsplit

    import psycopg

    where, name = urlsplit(postgres_url), f"indexes_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(
        host=where.hostname, port=where.port, user="postgres", dbname="postgres", autocommit=True
    ) as db:
        db.execute(f'CREATE DATABASE "{name}"')
    own_url = f"postgres://postgres@{where.hostname}:{where.port}/{name}"
    inline = {"AUDIT_CHAIN_MODE": "inline"}
    migrated = manage("migrate", "--noinput", database_url=own_url, env=inline)
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    result = manage("shell", "-c", PG_MIGRATE, database_url=own_url, env=inline)
    assert result.returncode == 0, result.stdout + result.stderr
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    for state in ("forward", "again"):
        assert {column: seen[state][column] for column in PLAIN} == {
            column: [[name, f"btree ({column})"]] for column, name in PLAIN.items()
        }, seen[state]
        assert {columns: seen[state][columns] for columns in (*LIST_FILTERS, "tool")} == {
            "tool+action": [["audit_event_tool_action_idx", "btree (tool, action)"]],
            "action": [["audit_event_action_idx", "btree (action)"]],
            "tool": [],
        }, seen[state]
        assert sorted(how for _, how in seen[state]["reason"]) == [
            "btree (reason varchar_pattern_ops)",
            "btree (reason)",
        ]
    assert all(seen["back"][columns] == [] for columns in LIST_FILTERS), seen["back"]
    for column in (*PLAIN, "tool"):  # back at 0013: db_index's two indexes, as Django names them
        assert sorted(how for _, how in seen["back"][column]) == [
            f"btree ({column} varchar_pattern_ops)",
            f"btree ({column})",
        ]
        assert all(name.startswith(f"audit_auditevent_{column}_") for name, _ in seen["back"][column])
    assert seen["events"] == 1
