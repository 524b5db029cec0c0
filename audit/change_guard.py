"""The guard of configuration models: a write outside a service's change scope is refused.

A model whose rows are configuration subclasses :class:`AuditedModel` and declares ``change_audit =
ChangeAudit(entity=...)``; a model whose rows are not configuration declares ``change_audit =
NotConfiguration(reason)``. The services open a :func:`change_scope` (who, by which path) and record what they
write (``audit/changes.py``). Kept apart from the recording so that models may import it.

One lock order for every transaction that writes configuration: the configuration's generation row
(``audit.ConfigGeneration``, :func:`config_write_lock`) first, then whatever rows it reads to change or locks.
Every such write replaces that row's token anyway (:func:`config_generation_bump`), so writers of configuration
were already serialized on it; taking it at the start instead of after the first row closes the cycles of a
transaction holding a row and waiting for the generation while another holds the generation and waits for that
row (a publish on save against a manual publish: PostgreSQL's ``deadlock detected``), and every writer reads
the rows it changes as the last writer committed them. SQLite needs nothing: its transactions begin ``IMMEDIATE``,
holding the database's write lock from the start.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Collection, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self, TypeVar

from django.apps import apps
from django.conf import settings
from django.db import connections, models, router
from django.db.backends.base.base import BaseDatabaseWrapper

M = TypeVar("M", bound=models.Model)


@dataclass(frozen=True)
class ChangeAudit:
    """A model whose rows are configuration: every write goes through a service and is audited.

    ``entity`` names it in the audit (``config.<entity>.<verb>``); ``operational_fields`` are the fields the
    platform itself keeps up to date (health, breaker state, last use), written without an audit event;
    ``unrecorded_fields`` are written by services but never shown in a diff (an API key's digest).
    """

    entity: str
    operational_fields: frozenset[str] = field(default_factory=frozenset)
    unrecorded_fields: frozenset[str] = field(default_factory=frozenset)


@dataclass(frozen=True)
class NotConfiguration:
    """A model whose rows are not configuration (runs, events, approvals, the audit itself), with the reason."""

    reason: str


class UnauditedChangeError(PermissionError):
    """A configuration model was written outside a service's change scope: the change would go unrecorded."""


@dataclass(frozen=True)
class ChangeScope:
    actor: str
    via: str
    # The scope was opened inside a transaction that took the configuration's lock then (``config_write_lock``):
    # held until that transaction ends, which is after the scope closes, so the writes within need not take it.
    locked: bool = False


_scope: ContextVar[ChangeScope | None] = ContextVar("audit_change_scope", default=None)


def actor_label(actor: Any) -> str:
    """How an actor is named in the audit: a user by username, an API key as ``api_key:<prefix>``, a string as
    given (commands pass ``system:<command>``)."""
    if isinstance(actor, str):
        return actor
    label = getattr(actor, "audit_actor_label", None)
    if callable(label):
        return str(label())
    get_username = getattr(actor, "get_username", None)
    if callable(get_username):
        return str(get_username())
    return str(actor)


@contextmanager
def change_scope(*, actor: Any, via: str) -> Iterator[ChangeScope]:
    """Within this block configuration models may be written; the services record what they write. An inner
    scope keeps the outer one's actor and path (an import that creates a tool row is still the import).

    The outermost scope opened inside a transaction takes the configuration's lock first (``config_write_lock``),
    before the service reads or locks any row of its own: the one lock order of configuration writes. A scope
    opened outside a transaction leaves it to each write (``AuditedModel.save`` and the queryset's writes)."""
    outer = _scope.get()
    if outer is not None:
        yield outer
        return
    scope = ChangeScope(actor=actor_label(actor), via=via, locked=config_write_lock())
    token = _scope.set(scope)
    try:
        yield scope
    finally:
        _scope.reset(token)


def current_scope() -> ChangeScope | None:
    return _scope.get()


# --- the guard ------------------------------------------------------------------------------------------------


_registered: dict[str, ChangeAudit | NotConfiguration] = {}


def register_policy(model: type[models.Model], policy: ChangeAudit | NotConfiguration) -> None:
    """Declare the policy of a model that is not ours (Django's users and groups)."""
    _registered[model._meta.label_lower] = policy


def policy_of(model: type[models.Model]) -> ChangeAudit | NotConfiguration | None:
    declared = getattr(model, "change_audit", None)
    if isinstance(declared, ChangeAudit | NotConfiguration):
        return declared
    return _registered.get(model._meta.label_lower)


def guard_write(
    model: type[models.Model],
    *,
    fields: Iterable[str] | None = None,
    what: str = "write",
    policy: ChangeAudit | NotConfiguration | None = None,
) -> None:
    """Refuse a write of a configuration model outside a change scope, unless it touches only operational fields.

    ``fields``: the fields written (None: possibly all). Under ``PLATFORM_CHANGE_GUARD = "tests"`` (the test
    settings) a write made directly by test code (fixtures) is allowed; one made by the platform's own code is
    refused there as in production.
    """
    policy = policy or policy_of(model)
    if not isinstance(policy, ChangeAudit) or _scope.get() is not None:
        return
    if fields is not None:
        written = set(fields)
        if written and written <= policy.operational_fields:
            return
    if getattr(settings, "PLATFORM_CHANGE_GUARD", "refuse") == "tests" and _written_by_test_code():
        return
    raise UnauditedChangeError(
        f"{model._meta.label} {what} outside a service: configuration changes go through the services "
        "(mcpregistry.services, agents.services, audit.roles), which record them in the audit"
    )


_HERE = str(Path(__file__).resolve())
_DJANGO_DB = str(Path(models.__file__).resolve().parent)


def _written_by_test_code() -> bool:
    """Whether the nearest frame of this project's code (not the ORM, not this module, not an installed
    package) that led to the write is under ``tests/``."""
    root = str(Path(settings.BASE_DIR).resolve())
    tests = str(Path(settings.BASE_DIR, "tests").resolve())
    frame: Any = sys._getframe(1)
    while frame is not None:
        path: str = frame.f_code.co_filename
        if (
            path.startswith(root)
            and path != _HERE
            and "site-packages" not in path
            and not path.startswith(_DJANGO_DB)
            and not path.endswith(("/models.py", "/crypto.py"))
        ):
            return path.startswith(tests)
        frame = frame.f_back
    return False


# --- the configuration's generation ----------------------------------------------------------------------------

# Fields the platform rewrites while it runs (health checks, the circuit breaker, last use): a write of only these
# leaves the configuration's generation as it is, so that what workers cache stays cached.
VOLATILE_FIELDS = frozenset(
    {
        "health",
        "last_checked_at",
        "last_error",
        "breaker_state",
        "breaker_failures",
        "breaker_opened_at",
        "last_used_at",
        "updated_at",
    }
)


def _moves_generation(fields: Iterable[str] | None) -> bool:
    """Whether a write of ``fields`` (None: the whole row) changes configuration, not only ``VOLATILE_FIELDS``
    (a server's health, a tool's statistics): what moves the generation and takes the configuration's lock."""
    if fields is None:
        return True
    written = set(fields)
    return not written or not written <= VOLATILE_FIELDS


def config_generation_bump(
    model: type[models.Model], *, fields: Iterable[str] | None = None, using: str | None = None
) -> None:
    """A configuration row was written: give the configuration a new generation, in the writer's transaction.

    The generation (``audit.ConfigGeneration``, one row) is a random token, not a counter, so that a rolled-back
    change never leaves a generation that a later, different configuration could take again. Every write of a
    configuration model goes through :class:`AuditedModel` or :class:`AuditedQuerySet` (the guard), so this is
    where every change is seen, whoever makes it; readers that cache what a run reads of the configuration
    (``agents.config_cache``) compare their token with the row's and reload when it moved."""
    if not _moves_generation(fields):
        return
    generation = apps.get_model("audit", "ConfigGeneration")
    alias = using or router.db_for_write(model)
    token = uuid.uuid4().hex
    if generation.objects.using(alias).filter(pk=1).update(token=token) == 0:
        generation.objects.using(alias).bulk_create([generation(pk=1, token=token)], ignore_conflicts=True)


def config_generation(*, using: str | None = None) -> str | None:
    """The configuration's generation now (None where its row is missing: nothing may be cached then). Read by
    every run: plain SQL rather than a query compiled each time."""
    generation = apps.get_model("audit", "ConfigGeneration")
    connection = connections[using or router.db_for_read(generation)]
    with connection.cursor() as cursor:
        cursor.execute(config_generation_sql(connection))
        row = cursor.fetchone()
    return None if row is None else str(row[0])


def config_generation_sql(connection: BaseDatabaseWrapper) -> str:
    """The statement that reads the generation (a scalar subquery for a caller that reads it with its own row:
    a run's claim, ``agents.execution``)."""
    table = connection.ops.quote_name(apps.get_model("audit", "ConfigGeneration")._meta.db_table)
    return f"SELECT token FROM {table} WHERE id = 1"  # noqa: S608 - the model's table


def config_write_lock(*, using: str | None = None) -> bool:
    """Take the configuration's write lock in the current transaction: the generation row, ``SELECT … FOR
    UPDATE``, held until the transaction ends. Returns whether it was taken: False outside a transaction
    (autocommit: a lone statement has no lock order to keep) and on a database without row locks (SQLite, whose
    transactions hold its write lock from their start).

    Every transaction that writes configuration takes it before any row it changes, reads to change or locks
    (the outermost :func:`change_scope` does; a service that locks a row of its own before opening one, such as a
    publish locking its agent, opens its scope first), so they all lock in one order and each reads what the one
    before it committed. Readers (runs reading the token, ``config_generation``) are not blocked."""
    generation = apps.get_model("audit", "ConfigGeneration")
    alias = using or router.db_for_write(generation)
    connection = connections[alias]
    if not connection.features.has_select_for_update or not connection.in_atomic_block:
        return False
    sql = config_generation_sql(connection) + " FOR UPDATE"
    with connection.cursor() as cursor:
        cursor.execute(sql)
        if cursor.fetchone() is None:  # a database whose row is missing: made, as the first bump would make it
            generation.objects.using(alias).bulk_create(
                [generation(pk=1, token=uuid.uuid4().hex)], ignore_conflicts=True
            )
            cursor.execute(sql)
    return True


def _lock_before_write(model: type[models.Model], *, fields: Iterable[str] | None, using: str | None) -> None:
    """Before a write that moves the generation (:func:`config_generation_bump`): take the configuration's lock
    unless the change scope holds it already. Reached with it unheld only where a scope was opened outside a
    transaction (its writes open their own) or by a test's fixture."""
    if not _moves_generation(fields):
        return
    scope = _scope.get()
    if scope is not None and scope.locked:
        return
    config_write_lock(using=using or router.db_for_write(model))


class AuditedQuerySet(models.QuerySet[M]):
    """A configuration model's queryset: bulk writes are refused outside a change scope (see :func:`guard_write`)."""

    def update(self, **kwargs: Any) -> int:
        guard_write(self.model, fields=kwargs, what="update")
        _lock_before_write(self.model, fields=kwargs, using=self.db)
        count = super().update(**kwargs)
        config_generation_bump(self.model, fields=kwargs, using=self.db)
        return count

    def delete(self) -> tuple[int, dict[str, int]]:
        guard_write(self.model, what="delete")
        _lock_before_write(self.model, fields=None, using=self.db)
        deleted = super().delete()
        config_generation_bump(self.model, using=self.db)
        return deleted

    def bulk_create(self, objs: Iterable[M], *args: Any, **kwargs: Any) -> list[M]:
        guard_write(self.model, what="bulk_create")
        _lock_before_write(self.model, fields=None, using=self.db)
        created = super().bulk_create(objs, *args, **kwargs)
        config_generation_bump(self.model, using=self.db)
        return created

    def bulk_update(self, objs: Iterable[M], fields: Iterable[str], *args: Any, **kwargs: Any) -> int:
        fields = list(fields)
        guard_write(self.model, fields=fields, what="bulk_update")
        _lock_before_write(self.model, fields=fields, using=self.db)
        count = super().bulk_update(objs, fields, *args, **kwargs)
        config_generation_bump(self.model, fields=fields, using=self.db)
        return count


class AuditedModel(models.Model):
    """Base of a configuration model: ``save`` and ``delete`` outside a change scope are refused.

    A row read from the database remembers the values it was read with (:func:`changed_since_loaded`), so that a
    service saving it writes only the fields its caller changed (``audit.changes.audited_save``), never a stale
    copy of the others over what another change wrote meanwhile."""

    objects = AuditedQuerySet.as_manager()

    class Meta:
        abstract = True

    def save(self, *args: Any, **kwargs: Any) -> None:
        update_fields = kwargs.get("update_fields")
        fields = None if update_fields is None else list(update_fields)
        guard_write(type(self), fields=fields, what="save")
        using = kwargs.get("using") or self._state.db
        _lock_before_write(type(self), fields=fields, using=using)
        super().save(*args, **kwargs)
        config_generation_bump(type(self), fields=fields, using=using)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        guard_write(type(self), what="delete")
        using = kwargs.get("using") or self._state.db
        _lock_before_write(type(self), fields=None, using=using)
        deleted = super().delete(*args, **kwargs)
        config_generation_bump(type(self), using=using)
        return deleted

    @classmethod
    def from_db(cls, db: str | None, field_names: Collection[str], values: Collection[Any], **kwargs: Any) -> Self:
        instance = super().from_db(db, field_names, values, **kwargs)
        remember_loaded(instance)
        return instance

    def refresh_from_db(self, *args: Any, **kwargs: Any) -> None:
        super().refresh_from_db(*args, **kwargs)
        fields = kwargs.get("fields", args[1] if len(args) > 1 else None)
        concrete = {name: f.attname for f in self._meta.concrete_fields for name in (f.name, f.attname)}
        remember_loaded(self, fields=None if fields is None else [concrete[f] for f in fields if f in concrete])


def raw_save_guard(sender: Any, instance: Any, raw: bool = False, **kwargs: Any) -> None:
    """A row saved as loaded (``manage.py loaddata``: Django's deserializer saves it raw, past the model's own
    ``save`` and the services) is a configuration change like any other: refused outside a change scope."""
    if raw:
        guard_write(sender, what="load (manage.py loaddata)")


def m2m_changed_guard(sender: Any, instance: Any, action: str, reverse: bool, model: Any, **kwargs: Any) -> None:
    """``m2m_changed`` receiver: a many-to-many change of a configuration model outside a change scope is refused;
    one made moves the configuration's generation."""
    owner = model if reverse else type(instance)
    if action.startswith("post_"):
        config_generation_bump(owner, using=kwargs.get("using"))
        return
    if not action.startswith("pre_"):
        return
    guard_write(owner, what=f"many-to-many {action[4:]}")
    _lock_before_write(owner, fields=None, using=kwargs.get("using"))


# --- what a row was read with ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _JsonText:
    """A JSON value (a dict or a list) as it was read, kept as its text: a copy the caller's changes in place
    cannot reach, made by the C encoder (a deep copy of every schema and frozen version read costs more). Its keys
    in their order and its values by their JSON type: ``true`` is not ``1``, as a tool receiving it tells apart."""

    text: str


def _kept(value: Any) -> Any:
    if isinstance(value, dict | list):
        try:
            return _JsonText(json.dumps(value, default=str))
        except (TypeError, ValueError):
            return object()  # a value JSON cannot write: never equal, so the field counts as changed
    if isinstance(value, bool):
        return ("bool", value)  # Python's True == 1: a JSON field's true is not its 1
    return value


def values_differ(a: Any, b: Any) -> bool:
    """Whether two values of one field differ as stored: JSON by its text (key order and type count: ``true`` is
    not ``1``, which Python's ``==`` calls equal, down to a schema's ``default``), anything else by ``==``."""
    return bool(_kept(a) != _kept(b))


_remembering: ContextVar[bool] = ContextVar("audit_remember_loaded", default=True)


@contextmanager
def rows_read_only() -> Iterator[None]:
    """Rows read in this block are not remembered as read (:func:`remember_loaded`): for readers that never save
    what they read (a run's configuration, held by ``agents.config_cache``), which would pay for writing every
    JSON value as text (about twice a reload's time at 1,000 tools). A row saved all the same is compared with the
    stored row, as a row built in code is."""
    token = _remembering.set(False)
    try:
        yield
    finally:
        _remembering.reset(token)


def remember_loaded(obj: models.Model, *, fields: Iterable[str] | None = None) -> None:
    """Note ``obj``'s current values (of ``fields``, attnames; None: every concrete field it holds) as the values
    it was read with: on reading, on a refresh, and after ``audit.changes.audited_save`` wrote it."""
    if not _remembering.get():
        return
    loaded: dict[str, Any] = dict(getattr(obj, "_loaded_values", None) or {}) if fields is not None else {}
    names = set(fields) if fields is not None else None
    for model_field in obj._meta.concrete_fields:
        attname = model_field.attname
        if attname in obj.__dict__ and (names is None or attname in names):
            loaded[attname] = _kept(obj.__dict__[attname])
    obj._loaded_values = loaded  # type: ignore[attr-defined]


def changed_since_loaded(obj: models.Model, attname: str) -> bool | None:
    """Whether ``obj``'s ``attname`` differs from the value it was read with; None where that is not known (a row
    built in code, a model that is not an :class:`AuditedModel`, a field deferred when it was read)."""
    loaded = getattr(obj, "_loaded_values", None)
    if loaded is None or attname not in loaded or attname not in obj.__dict__:
        return None
    return bool(_kept(obj.__dict__[attname]) != loaded[attname])


def stored_value(obj: models.Model, field: str) -> Any:
    """``field`` as stored for ``obj`` (None before its first save). A check added to a model later applies where
    the value changes, so a row stored before it still saves, imports and exports as it is."""
    return type(obj)._base_manager.filter(pk=obj.pk).values_list(field, flat=True).first() if obj.pk else None
