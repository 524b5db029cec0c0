"""The audit events' ``source``, ``mcp_id`` and ``tool`` indexed by plain indexes (``Meta.indexes``) instead of
``db_index``, which on PostgreSQL also made a ``varchar_pattern_ops`` index per field for prefix matches that no
query makes: one index less to write per event and field.

The indexes are not rebuilt: on PostgreSQL the pattern index is dropped and the plain one renamed; on SQLite,
which has only the plain one, it is made again under the new name (SQLite cannot rename an index). Done in SQL
rather than by ``AlterField``, which on SQLite would remake the append-only table."""

from django.db import migrations, models

TABLE = "audit_auditevent"
INDEXES = (("source", "audit_event_source_idx"), ("mcp_id", "audit_event_mcp_id_idx"), ("tool", "audit_event_tool_idx"))


def _indexes_on(schema_editor, column):
    """The names of the plain (non-unique) indexes on exactly ``column``."""
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, TABLE)
    return sorted(
        name
        for name, about in constraints.items()
        if about["columns"] == [column] and about["index"] and not about["unique"] and not about["primary_key"]
    )


def to_plain_indexes(apps, schema_editor):
    quote = schema_editor.quote_name
    postgres = schema_editor.connection.vendor == "postgresql"
    for column, name in INDEXES:
        kept = None
        for old in _indexes_on(schema_editor, column):
            if postgres and kept is None and not old.endswith("_like"):
                kept = old
            else:
                schema_editor.execute(f"DROP INDEX {quote(old)}")
        if kept is not None:
            schema_editor.execute(f"ALTER INDEX {quote(kept)} RENAME TO {quote(name)}")
        else:
            schema_editor.execute(f"CREATE INDEX {quote(name)} ON {quote(TABLE)} ({quote(column)})")


def to_field_indexes(apps, schema_editor):
    """Back to ``db_index``'s indexes, as Django names and makes them (with the pattern index on PostgreSQL)."""
    model = apps.get_model("audit", "AuditEvent")
    for column, name in INDEXES:
        schema_editor.execute(f"DROP INDEX {schema_editor.quote_name(name)}")
        for statement in schema_editor._field_indexes_sql(model, model._meta.get_field(column)):
            schema_editor.execute(statement)


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0013_api_source"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(to_plain_indexes, to_field_indexes)],
            state_operations=[
                migrations.AlterField(
                    model_name="auditevent",
                    name="mcp_id",
                    field=models.CharField(blank=True, max_length=64, verbose_name="server"),
                ),
                migrations.AlterField(
                    model_name="auditevent",
                    name="source",
                    field=models.CharField(
                        choices=[
                            ("deterministic", "deterministic rule"),
                            ("agent", "agent (model)"),
                            ("flow", "flow node"),
                            ("admin", "admin"),
                            ("api", "API caller"),
                            ("eval", "eval run"),
                            ("shadow", "shadow run"),
                        ],
                        max_length=20,
                        verbose_name="source",
                    ),
                ),
                migrations.AlterField(
                    model_name="auditevent",
                    name="tool",
                    field=models.CharField(blank=True, max_length=200, verbose_name="tool"),
                ),
                migrations.AddIndex(
                    model_name="auditevent",
                    index=models.Index(fields=["source"], name="audit_event_source_idx"),
                ),
                migrations.AddIndex(
                    model_name="auditevent",
                    index=models.Index(fields=["mcp_id"], name="audit_event_mcp_id_idx"),
                ),
                migrations.AddIndex(
                    model_name="auditevent",
                    index=models.Index(fields=["tool"], name="audit_event_tool_idx"),
                ),
            ],
        ),
    ]
