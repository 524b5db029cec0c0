"""Statements on a model's rows made once instead of compiled by the ORM on every use: for the rows a run reads and
writes on its hot path (the run itself, its events, its audit events), where Django's compiler costs more than the
statement itself.

- ``RowInsert``: ``INSERT … RETURNING <pk>`` of some fields. Each value is prepared by its field (``pre_save`` then
  ``get_db_prep_save``), exactly as ``Model.save`` and ``bulk_create`` prepare it, so what is stored is the same;
  a plain value of a plain field (a ``str`` of a ``CharField`` or ``TextField``, an ``int`` of an integer field, a
  ``bool`` of a ``BooleanField``, a ``float`` of a ``FloatField``), which that preparation returns unchanged, is
  passed as it is.
  No signals are sent (as ``bulk_create``); the rows' primary keys are read back (``RETURNING``: PostgreSQL, or
  SQLite 3.35 and later) and set on the objects, which are then saved objects as after ``bulk_create``.
- ``RowRead``: every concrete column of a row (or of every row that matches, in a given order), made into the
  model's instance as a queryset makes it (the database backend's and the fields' converters, then
  ``Model.from_db``).
- ``RowUpdate``: ``UPDATE … SET <fields> WHERE <fields>`` (equality, or ``IS NULL`` for None), each value prepared
  by its field as ``QuerySet.update`` prepares it (``get_db_prep_save``; no ``pre_save``, no signals, as there);
  the number of rows changed, for a compare-and-swap.

The SQL text is made once per database vendor (and, for an insert, number of rows).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections, models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.base.operations import BaseDatabaseOperations
from django.db.models import Field, Model
from django.db.models.expressions import Col


class RowInsert:
    """``INSERT INTO <table> (<fields>) VALUES (…), … RETURNING <pk>`` for ``model``'s ``field_names``: one
    statement for the rows given (its text kept per database vendor and number of rows)."""

    def __init__(self, model: type[Model], field_names: Sequence[str]) -> None:
        self.model = model
        self.field_names = tuple(field_names)
        self._fields: tuple[Field[Any, Any], ...] = ()
        self._sql: dict[tuple[str, int, bool], str] = {}
        self._plain: dict[str, tuple[type | None, ...]] = {}

    def fields(self) -> tuple[Field[Any, Any], ...]:
        if not self._fields:  # after the app registry is ready
            self._fields = tuple(self.model._meta.get_field(name) for name in self.field_names)  # type: ignore[misc]
        return self._fields

    def plain_types(self, connection: BaseDatabaseWrapper) -> tuple[type | None, ...]:
        """Per field, the type of the values its preparation leaves as they are (None: prepare every value).
        Integers are not plain where the backend adapts them (PostgreSQL's psycopg 3: ``Int4``, ``Int8``)."""
        kept = self._plain.get(connection.vendor)
        if kept is None:
            ops = type(connection.ops)
            ints_plain = ops.adapt_integerfield_value is BaseDatabaseOperations.adapt_integerfield_value
            kept = self._plain[connection.vendor] = tuple(
                None if kind is int and not ints_plain else kind
                for kind in (_PLAIN_VALUE.get(type(field)) for field in self.fields())
            )
        return kept

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

    def insert(
        self, objs: Sequence[Model], using: str = DEFAULT_DB_ALIAS, *, given: Sequence[Mapping[str, Any]] | None = None
    ) -> None:
        """Insert ``objs`` and set their primary keys (in order, as ``bulk_create`` does): one statement, or one
        per batch of as many rows as the database takes parameters for. ``given``: per object, values already in
        their database form (as :meth:`row_params` takes them)."""
        self._insert(objs, using, skip_conflicts=False, given=given)

    def insert_new(self, objs: Sequence[Model], using: str = DEFAULT_DB_ALIAS) -> list[Any]:
        """Insert those of ``objs`` that violate no unique constraint (``ON CONFLICT DO NOTHING``), without an
        error for the others: the primary keys of the rows inserted. When all were, they are set on the objects
        as by :meth:`insert`; when some were not, none is (the caller decides what to do with the rows written)."""
        return self._insert(objs, using, skip_conflicts=True)

    def row_params(
        self, obj: Model, connection: BaseDatabaseWrapper, *, given: Mapping[str, Any] | None = None
    ) -> list[Any]:
        """``obj``'s parameters for one row of the statement, in its field order, each prepared by its field (a
        plain value as it is); ``given``: values already in their database form, by field name, taken as they are.
        ``obj`` may be of another model with the same field names (the attributes are read by name)."""
        params: list[Any] = []
        for field, kind in zip(self.fields(), self.plain_types(connection), strict=True):
            if given is not None and field.name in given:
                params.append(given[field.name])
            elif kind is not None:
                value = getattr(obj, field.attname)  # these fields' pre_save reads the attribute
                params.append(value if type(value) is kind else field.get_db_prep_save(value, connection))
            else:
                params.append(field.get_db_prep_save(field.pre_save(obj, True), connection))
        return params

    def _insert(
        self,
        objs: Sequence[Model],
        using: str,
        *,
        skip_conflicts: bool,
        given: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[Any]:
        connection = connections[using]
        inserted: list[Any] = []
        batch = max(1, connection.ops.bulk_batch_size(list(self.fields()), list(objs)))
        for start in range(0, len(objs), batch):
            chunk = objs[start : start + batch]
            params: list[Any] = []
            for i, obj in enumerate(chunk, start=start):
                params += self.row_params(obj, connection, given=None if given is None else given[i])
            with connection.cursor() as cursor:
                cursor.execute(self.sql(len(chunk), using, skip_conflicts=skip_conflicts), params)
                inserted += [key for (key,) in cursor.fetchall()]
        if len(inserted) == len(objs):
            pk_field = self.model._meta.pk
            assert pk_field is not None
            for obj, key in zip(objs, inserted, strict=True):
                obj.pk = pk_field.to_python(key)  # as the database driver gave it: SQLite's UUIDs are hex text
                obj._state.adding = False
                obj._state.db = using
        return inserted


# Fields (these exact classes) whose pre_save reads the attribute and whose preparation returns a value of this
# exact type unchanged (integers: where the backend does not adapt them, see ``RowInsert.plain_types``).
_PLAIN_VALUE: dict[type, type] = {
    models.CharField: str,
    models.TextField: str,
    models.IntegerField: int,
    models.BigIntegerField: int,
    models.SmallIntegerField: int,
    models.PositiveIntegerField: int,
    models.PositiveBigIntegerField: int,
    models.PositiveSmallIntegerField: int,
    models.BooleanField: bool,
    models.FloatField: float,
}

_KEPT_ROWS = 16  # statements for up to this many rows are kept (a run writes a few rows at a time)


class RowRead:
    """``SELECT <every concrete column> FROM <table> WHERE <fields> = …``, the row made into ``model``'s instance
    (``get``: by primary key; ``get_where``: by fields, equality or ``IS NULL`` for None, the first row where
    several match; ``all_where``: every row that matches, in a given order). ``columns(alias)`` and
    ``instance(values)`` serve a statement that reads the row with more (a join)."""

    def __init__(self, model: type[Model]) -> None:
        self.model = model
        self._converters: dict[str, list[tuple[int, list[Any], Col]]] = {}
        self._columns: dict[str, str] = {}
        self._sql: dict[tuple[Any, ...], tuple[str, tuple[Field[Any, Any], ...]]] = {}

    def columns(self, alias: str) -> str:
        """The row's columns, in the model's order, as ``alias.column`` (quoted for the default database)."""
        text = self._columns.get(alias)
        if text is None:
            quote = connections[DEFAULT_DB_ALIAS].ops.quote_name
            fields = self.model._meta.concrete_fields
            text = self._columns[alias] = ", ".join(f"{alias}.{quote(str(field.column))}" for field in fields)
        return text

    def get(self, pk: Any, using: str = DEFAULT_DB_ALIAS) -> Model | None:
        pk_field = self.model._meta.pk
        assert pk_field is not None
        return self.get_where({pk_field.name: pk}, using)

    def get_where(self, where: dict[str, Any], using: str = DEFAULT_DB_ALIAS) -> Model | None:
        pk_field = self.model._meta.pk
        assert pk_field is not None
        by_pk = tuple(where) == (pk_field.name,)
        with connections[using].cursor() as cursor:
            cursor.execute(*self._select(where, using, order_by=None if by_pk else pk_field.name, first=not by_pk))
            row = cursor.fetchone()
        return None if row is None else self.instance(row, using)

    def all_where(self, where: dict[str, Any], *, order_by: str, using: str = DEFAULT_DB_ALIAS) -> list[Model]:
        """Every row where the fields are as given (equality, or ``IS NULL`` for None), ordered by the field
        ``order_by`` and then the primary key (so rows that tie come in one order every time)."""
        with connections[using].cursor() as cursor:
            cursor.execute(*self._select(where, using, order_by=order_by, first=False))
            rows = cursor.fetchall()
        return [self.instance(row, using) for row in rows]

    def _select(self, where: dict[str, Any], using: str, *, order_by: str | None, first: bool) -> tuple[str, list[Any]]:
        connection = connections[using]
        names = tuple(where)
        nulls = tuple(where[name] is None for name in names)
        key = (connection.vendor, names, nulls, order_by, first)
        kept = self._sql.get(key)
        if kept is None:
            quote = connection.ops.quote_name
            fields = _fields_of(self.model, names)
            order = ""
            if order_by is not None:
                pk_field = self.model._meta.pk
                assert pk_field is not None
                ordering = [self.model._meta.get_field(order_by), pk_field]
                if ordering[0] is pk_field:
                    ordering.pop()
                order = " ORDER BY " + ", ".join(f"r.{quote(str(field.column))}" for field in ordering)  # type: ignore[union-attr]
            limit = " LIMIT 1" if first else ""
            table = quote(self.model._meta.db_table)
            sql = f"SELECT {self.columns('r')} FROM {table} r WHERE {_conditions(fields, nulls, quote, 'r.')}{order}{limit}"  # noqa: S608 - names from the model
            kept = self._sql[key] = (sql, fields)
        sql, fields = kept
        return sql, _condition_params(fields, [where[name] for name in names], connection)

    def instance(self, values: Sequence[Any], using: str = DEFAULT_DB_ALIAS) -> Model:
        """The instance for the first ``len(concrete_fields)`` of ``values`` (as the database driver gave them)."""
        connection = connections[using]
        fields = self.model._meta.concrete_fields
        row = list(values[: len(fields)])
        for index, converters, expression in self._converters_for(using):
            value = row[index]
            for converter in converters:
                value = converter(value, expression, connection)
            row[index] = value
        return self.model.from_db(using, [field.attname for field in fields], row)

    def _converters_for(self, using: str) -> list[tuple[int, list[Any], Col]]:
        connection = connections[using]
        kept = self._converters.get(connection.vendor)
        if kept is None:
            kept = []
            for index, field in enumerate(self.model._meta.concrete_fields):
                expression = field.get_col(self.model._meta.db_table)
                converters = connection.ops.get_db_converters(expression) + expression.get_db_converters(connection)
                if converters:
                    kept.append((index, converters, expression))
            self._converters[connection.vendor] = kept
        return kept


class RowUpdate:
    """``UPDATE <table> SET <set_fields> = … WHERE <where_fields> = …`` for ``model``: ``execute`` returns the number
    of rows changed. Every field of ``set_fields`` is set (the values given by name); a None in ``where`` matches
    NULL."""

    def __init__(self, model: type[Model], set_fields: Sequence[str], where_fields: Sequence[str]) -> None:
        self.model = model
        self.set_names = tuple(set_fields)
        self.where_names = tuple(where_fields)
        self._sql: dict[tuple[str, tuple[bool, ...]], str] = {}
        self._fields: tuple[tuple[Field[Any, Any], ...], tuple[Field[Any, Any], ...]] | None = None

    def execute(self, values: dict[str, Any], where: dict[str, Any], using: str = DEFAULT_DB_ALIAS) -> int:
        if set(values) != set(self.set_names) or set(where) != set(self.where_names):
            raise ValueError(
                f"RowUpdate of {self.model.__name__}: set {sorted(self.set_names)} where {sorted(self.where_names)}"
            )
        if self._fields is None:  # after the app registry is ready
            self._fields = (_fields_of(self.model, self.set_names), _fields_of(self.model, self.where_names))
        set_fields, where_fields = self._fields
        connection = connections[using]
        nulls = tuple(where[name] is None for name in self.where_names)
        sql = self._sql.get((connection.vendor, nulls))
        if sql is None:
            quote = connection.ops.quote_name
            assignments = ", ".join(f"{quote(str(field.column))} = %s" for field in set_fields)
            table = quote(self.model._meta.db_table)
            sql = f"UPDATE {table} SET {assignments} WHERE {_conditions(where_fields, nulls, quote)}"  # noqa: S608 - names from the model
            self._sql[(connection.vendor, nulls)] = sql
        params = [
            field.get_db_prep_save(values[name], connection)
            for name, field in zip(self.set_names, set_fields, strict=True)
        ]
        params += _condition_params(where_fields, [where[name] for name in self.where_names], connection)
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return int(cursor.rowcount)


def _fields_of(model: type[Model], names: Sequence[str]) -> tuple[Field[Any, Any], ...]:
    return tuple(model._meta.get_field(name) for name in names)  # type: ignore[misc]


def _conditions(fields: Sequence[Field[Any, Any]], nulls: Sequence[bool], quote: Any, prefix: str = "") -> str:
    """``<column> = %s`` for each field, ``<column> IS NULL`` where its value is None, joined by AND."""
    return " AND ".join(
        f"{prefix}{quote(str(field.column))} IS NULL" if null else f"{prefix}{quote(str(field.column))} = %s"
        for field, null in zip(fields, nulls, strict=True)
    )


def _condition_params(
    fields: Sequence[Field[Any, Any]], values: Sequence[Any], connection: BaseDatabaseWrapper
) -> list[Any]:
    """The parameters of ``_conditions``: each value prepared by its field, None left out (``IS NULL``)."""
    return [
        field.get_db_prep_value(value, connection)
        for field, value in zip(fields, values, strict=True)
        if value is not None
    ]
