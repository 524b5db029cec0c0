"""An ``INSERT`` of a model's rows without compiling a query for each: for the rows a run writes on its hot path
(its events, its audit events), where Django's compiler costs more than the statement itself.

The SQL text is made once per database vendor; each value is prepared by its field (``pre_save`` then
``get_db_prep_save``), exactly as ``Model.save`` and ``bulk_create`` prepare it, so what is stored is the same.
No signals are sent (as ``bulk_create``); the rows' primary keys are read back (``RETURNING``: PostgreSQL, or
SQLite 3.35 and later) and set on the objects, which are then saved objects as after ``bulk_create``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import Field, Model


class RowInsert:
    """``INSERT INTO <table> (<fields>) VALUES (…), … RETURNING <pk>`` for ``model``'s ``field_names``: one
    statement for the rows given (its text kept per database vendor and number of rows)."""

    def __init__(self, model: type[Model], field_names: Sequence[str]) -> None:
        self.model = model
        self.field_names = tuple(field_names)
        self._fields: tuple[Field[Any, Any], ...] = ()
        self._sql: dict[tuple[str, int, bool], str] = {}

    def fields(self) -> tuple[Field[Any, Any], ...]:
        if not self._fields:  # after the app registry is ready
            self._fields = tuple(self.model._meta.get_field(name) for name in self.field_names)  # type: ignore[misc]
        return self._fields

    def sql(self, rows: int, using: str = DEFAULT_DB_ALIAS, *, skip_conflicts: bool = False) -> str:
        connection = connections[using]
        text = self._sql.get((connection.vendor, rows, skip_conflicts))
        if text is None:
            if not connection.features.can_return_rows_from_bulk_insert:
                raise NotImplementedError(f"{connection.vendor} cannot return inserted rows (SQLite 3.35+ can)")
            quote = connection.ops.quote_name
            columns = ", ".join(quote(str(field.column)) for field in self.fields())
            row = "(" + ", ".join(["%s"] * len(self.fields())) + ")"
            pk_field = self.model._meta.pk
            assert pk_field is not None
            table, pk = quote(self.model._meta.db_table), quote(str(pk_field.column))
            conflicts = " ON CONFLICT DO NOTHING" if skip_conflicts else ""
            text = f"INSERT INTO {table} ({columns}) VALUES {', '.join([row] * rows)}{conflicts} RETURNING {pk}"  # noqa: S608 - names from the model
            if rows <= _KEPT_ROWS:
                self._sql[(connection.vendor, rows, skip_conflicts)] = text
        return text

    def insert(self, objs: Sequence[Model], using: str = DEFAULT_DB_ALIAS) -> None:
        """Insert ``objs`` and set their primary keys (in order, as ``bulk_create`` does): one statement, or one
        per batch of as many rows as the database takes parameters for."""
        self._insert(objs, using, skip_conflicts=False)

    def insert_new(self, objs: Sequence[Model], using: str = DEFAULT_DB_ALIAS) -> list[Any]:
        """Insert those of ``objs`` that violate no unique constraint (``ON CONFLICT DO NOTHING``), without an
        error for the others: the primary keys of the rows inserted. When all were, they are set on the objects
        as by :meth:`insert`; when some were not, none is (the caller decides what to do with the rows written)."""
        return self._insert(objs, using, skip_conflicts=True)

    def _insert(self, objs: Sequence[Model], using: str, *, skip_conflicts: bool) -> list[Any]:
        connection = connections[using]
        inserted: list[Any] = []
        fields = self.fields()
        batch = max(1, connection.ops.bulk_batch_size(list(fields), list(objs)))
        for start in range(0, len(objs), batch):
            chunk = objs[start : start + batch]
            params = [
                field.get_db_prep_save(field.pre_save(obj, True), connection) for obj in chunk for field in fields
            ]
            with connection.cursor() as cursor:
                cursor.execute(self.sql(len(chunk), using, skip_conflicts=skip_conflicts), params)
                inserted += [key for (key,) in cursor.fetchall()]
        if len(inserted) == len(objs):
            for obj, key in zip(objs, inserted, strict=True):
                obj.pk = key
                obj._state.adding = False
                obj._state.db = using
        return inserted


_KEPT_ROWS = 16  # statements for up to this many rows are kept (a run writes a few rows at a time)
