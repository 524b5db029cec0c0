"""Users and groups as audited changes: who may administer, audit or approve is configuration like any other.

The services here (``user_create``, ``user_update``, ``user_delete``, ``group_save``, ``group_delete``) write
the change and its audit event (``config.user.*``, ``config.group.*``) in one transaction; the admin's user and
group pages and ``create_auditor`` call them. Django's users are not our model, so a path we do not own
(``createsuperuser``, a shell) cannot be refused; instead, a change to a user's staff/superuser/active flags,
groups or permissions, or to a group's name or permissions, made outside a service is still recorded, with the
actor ``system:unattributed`` and the path ``django``, in the change's transaction: never silently. Whichever
way Django offers: a save or delete (signals), a queryset's ``update`` or ``bulk_create`` (the managers' querysets
here), a write to the link tables (``User.groups.through``: their querysets and rows, which also carry every
many-to-many change), a deleted permission (each group and user that held it). A password change is recorded the
same way (``config.user.password_change``, naming the user, never the password or a hash), with the admin as its
actor on the admin's password page.

Such a write keeps the one lock order of configuration writes (``audit.change_guard``): the configuration's lock
first, in the write's transaction, then the rows; a save made in autocommit gets a transaction of its own, so it
commits with its record or not at all. Users and groups remember the values they were read with, as
``AuditedModel`` rows do, so that a service saving a copy writes only what its caller changed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from functools import partial, wraps
from typing import Any, NamedTuple, TypeVar

from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import check_password
from django.contrib.auth.models import AbstractBaseUser, Group, Permission
from django.db import DEFAULT_DB_ALIAS, connections, models, router, transaction
from django.db.models.signals import post_delete, post_save, pre_delete, pre_save

from audit.change_guard import (
    ChangeAudit,
    change_scope,
    config_write_lock,
    current_scope,
    register_policy,
    remember_loaded,
)
from audit.changes import (
    CONFIG_ACTION_PREFIX,
    audited_delete,
    audited_save,
    change_diff,
    config_change_record,
    recorded_fields,
    snapshot,
)

AUDITOR_GROUP = "auditor"
"""The group whose members may read the audit record (admin, read-only, and ``/api/v1/audit/``)."""

ROLE_FIELDS = frozenset({"is_staff", "is_superuser", "is_active", "username"})
UNATTRIBUTED_ACTOR = "system:unattributed"
MIGRATE_ACTOR = "system:migrate"
"""Who made a group the record had no event for: the platform's data migrations (the ``auditor`` and
``reviewer`` roles), recorded at the end of the ``migrate`` that made them."""

_NEVER_FROM_A_COPY = frozenset({"password", "last_login"})
"""A user's fields that :func:`user_update` never writes from the instance it is given: a password changes on the
password pages (recorded as ``password_change``), ``last_login`` at each sign-in."""

USER_POLICY = ChangeAudit(
    entity="user",
    operational_fields=frozenset({"last_login"}),
    unrecorded_fields=frozenset({"password", "first_name", "last_name", "email", "date_joined"}),
)
GROUP_POLICY = ChangeAudit(entity="group")

T = TypeVar("T")


def user_create(
    *,
    actor: Any,
    via: str,
    username: str,
    password: str | None,
    email: str = "",
    is_staff: bool = False,
    is_superuser: bool = False,
    groups: Iterable[Group] = (),
) -> AbstractBaseUser:
    """Create a user (a ``None`` password: unusable) with its flags and groups, recorded as one event."""
    user_model = get_user_model()
    user = user_model(
        **{user_model.USERNAME_FIELD: username}, email=email, is_staff=is_staff, is_superuser=is_superuser
    )
    if password is None:
        user.set_unusable_password()
    else:
        user.set_password(password)
    return audited_save(user, actor=actor, via=via, m2m={"groups": list(groups)}, validate=False)


def user_update(
    *,
    user: AbstractBaseUser,
    actor: Any,
    via: str,
    data: Mapping[str, Any] | None = None,
    groups: Iterable[Group] | None = None,
    permissions: Iterable[Any] | None = None,
) -> AbstractBaseUser:
    """Change a user's flags (``is_staff``, ``is_superuser``, ``is_active``), other fields, groups and
    permissions (``None``: unchanged). ``user`` may carry its caller's changes (an admin form's instance): only the
    fields changed since it was read are written (:func:`connect` has users remember it, as ``AuditedModel``
    does), never its password or ``last_login``, whatever it carries: a copy read before a password reset or a
    sign-in put the old hash back, and a copy read before a deactivation made the user active again."""
    m2m = {
        name: list(values)
        for name, values in (("groups", groups), ("user_permissions", permissions))
        if values is not None
    }
    editable = [f.name for f in type(user)._meta.concrete_fields if f.name not in _NEVER_FROM_A_COPY]
    return audited_save(user, actor=actor, via=via, data=data, m2m=m2m, validate=False, only=editable)


def user_delete(*, user: AbstractBaseUser, actor: Any, via: str) -> None:
    audited_delete(user, actor=actor, via=via)


@contextmanager
def user_password_page(*, actor: Any, via: str) -> Iterator[None]:
    """The scope of a page that changes a password (Django's own form saves it): the change is recorded, by the
    signal below, with ``actor`` and ``via``, in the same transaction (a password never changes unrecorded). The
    transaction first, then the scope: opened inside it, the scope takes the configuration's lock before the page
    reads the user, so a change form saved meanwhile and this page take turns (the scope opened first ran outside
    any transaction and took no lock)."""
    with transaction.atomic(), change_scope(actor=actor, via=via):
        yield


def group_save(*, group: Group, actor: Any, via: str, permissions: Iterable[Any] | None = None) -> Group:
    return audited_save(
        group, actor=actor, via=via, m2m=None if permissions is None else {"permissions": list(permissions)}
    )


def group_delete(*, group: Group, actor: Any, via: str) -> None:
    audited_delete(group, actor=actor, via=via)


def groups_snapshot(*, using: str = DEFAULT_DB_ALIAS) -> dict[int, dict[str, Any]] | None:
    """Every group's recorded fields (its name and permissions), by id; None before the groups' table exists (a
    fresh database's first ``migrate``)."""
    connection = connections[using]
    if Group._meta.db_table not in connection.introspection.table_names():
        return None
    names = recorded_fields(Group)
    groups = Group.objects.using(using).order_by("pk").prefetch_related("permissions")
    return {group.pk: snapshot(group, names) for group in groups}


def groups_record_migrated(before: dict[int, dict[str, Any]] | None) -> int:
    """Record, as ``system:migrate`` (path ``migrate``), what a ``migrate`` did to the groups: ``before`` is
    :func:`groups_snapshot` taken as it began. A group it made is recorded as created (with its permissions), one
    whose name or permissions it changed (a data migration that grants a role a new permission) as updated with
    the difference, one it removed as deleted. The platform's data migrations cannot call the services here, so who
    may audit or approve joins the record at the end of the ``migrate`` that changed it. Both snapshots are taken
    by the same process in the same language, so a permission's translated name never reads as a change. Then
    :func:`groups_record_unrecorded`. Returns how many events it wrote."""
    after = groups_snapshot() or {}
    earlier = before or {}
    names = recorded_fields(Group)
    written = 0
    for pk, state in earlier.items():
        if pk not in after:
            gone = Group(pk=pk, name=str(state.get("name") or ""))
            _record_by_migrate(gone, "delete", {k: [v, None] for k, v in state.items() if v})
            written += 1
    for group in Group.objects.filter(pk__in=list(after)).order_by("pk"):
        if group.pk not in earlier:
            diff = change_diff(Group, {}, after[group.pk], creating=True)
            _record_by_migrate(group, "create", diff)
            written += 1
        elif earlier[group.pk] != after[group.pk]:
            diff = change_diff(Group, {n: earlier[group.pk].get(n) for n in names}, after[group.pk])
            if diff:
                _record_by_migrate(group, "update", diff)
                written += 1
    return written + groups_record_unrecorded()


def groups_record_unrecorded() -> int:
    """Record, as created by ``system:migrate``, each group the audit record has no event for (a database
    migrated before the roles were recorded), with its permissions; a group already recorded is left alone. Not
    once events have been archived (``archive_audit``): a group's creation may lie in the archive. Returns how many
    were recorded."""
    from audit.models import AuditCheckpoint, AuditEvent

    first = AuditEvent.objects.exclude(seq__isnull=True).order_by("seq").values_list("seq", flat=True).first()
    if AuditCheckpoint.objects.exists() or (first is not None and first > 1):
        return 0  # the record's start is archived
    recorded = {
        str(pk)
        for pk in AuditEvent.objects.filter(action__startswith=f"{CONFIG_ACTION_PREFIX}group.").values_list(
            "result__id", flat=True
        )
    }
    unrecorded = [g for g in Group.objects.order_by("pk").prefetch_related("permissions") if str(g.pk) not in recorded]
    names = recorded_fields(Group)
    for group in unrecorded:
        _record_by_migrate(group, "create", change_diff(Group, {}, snapshot(group, names), creating=True))
    return len(unrecorded)


def _record_by_migrate(group: Group, verb: str, diff: dict[str, Any]) -> None:
    with transaction.atomic(), change_scope(actor=MIGRATE_ACTOR, via="migrate"):
        config_change_record(obj=group, verb=verb, diff=diff)


# --- changes made outside a service: recorded, unattributed -----------------------------------------------------


def _configuration_locked(using: str) -> None:
    """Take the configuration's lock (``audit.change_guard.config_write_lock``) in the current transaction, unless
    the open change scope holds it already (a service's scope opened outside a transaction does not: Django's users
    and groups are not ``AuditedModel``, whose writes take it then): the first statement of every write of a user or
    a group that the recorders below see, before they read, lock or write a row. They locked the rows first and the configuration
    only as they recorded, the reverse of every service's order: a deadlock on PostgreSQL, where the service (an
    admin's POST) was the one killed."""
    scope = current_scope()
    if scope is None or not scope.locked:
        config_write_lock(using=using)


def _saved_under_lock(save: Callable[..., None]) -> Callable[..., None]:
    """The user model's and ``Group``'s ``save``, outside a service: in a transaction that takes the configuration's
    lock first, so that the receivers below read the "before" under it and record in it. Django sends ``post_save``
    after an autocommitted save has committed: a record that failed left the change standing with no event. A save
    of ``last_login`` alone (every sign-in; nothing recorded) takes no lock."""
    if getattr(save, "saved_under_lock", False):
        return save

    @wraps(save)
    def locked_save(instance: Any, *args: Any, **kwargs: Any) -> None:
        scope = current_scope()
        update_fields = kwargs.get("update_fields")
        if (scope is not None and scope.locked) or (
            update_fields is not None and set(update_fields) <= USER_POLICY.operational_fields
        ):
            return save(instance, *args, **kwargs)
        using = kwargs.get("using") or router.db_for_write(type(instance), instance=instance)
        with transaction.atomic(using=using):
            config_write_lock(using=using)
            return save(instance, *args, **kwargs)

    locked_save.saved_under_lock = True  # type: ignore[attr-defined]
    return locked_save


def _remember_rows_read(model: Any) -> None:
    """Have ``model``'s rows remember the values they were read with, as ``AuditedModel``'s do
    (``audit.change_guard.remember_loaded``), so that a service saving a copy writes only what its caller changed
    (``audit.changes.instance_changes``), never a stale copy's other fields over a change committed since."""
    if getattr(model.from_db, "remembers_rows", False):
        return
    from_db = model.from_db.__func__
    refresh_from_db = model.refresh_from_db

    def remembering_from_db(cls: Any, *args: Any, **kwargs: Any) -> Any:
        row = from_db(cls, *args, **kwargs)
        remember_loaded(row)
        return row

    def remembering_refresh_from_db(self: Any, *args: Any, **kwargs: Any) -> None:
        refresh_from_db(self, *args, **kwargs)
        fields = kwargs.get("fields", args[1] if len(args) > 1 else None)
        concrete = {name: f.attname for f in self._meta.concrete_fields for name in (f.name, f.attname)}
        remember_loaded(self, fields=None if fields is None else [concrete[f] for f in fields if f in concrete])

    remembering_from_db.remembers_rows = True  # type: ignore[attr-defined]
    model.from_db = classmethod(remembering_from_db)
    model.refresh_from_db = remembering_refresh_from_db


def _remember_roles(sender: Any, instance: Any, raw: bool = False, update_fields: Any = None, **kwargs: Any) -> None:
    if raw or current_scope() is not None:
        return
    if update_fields is not None and set(update_fields) <= USER_POLICY.operational_fields | {"password"}:
        return
    stored = type(instance)._default_manager.filter(pk=instance.pk).first() if instance.pk is not None else None
    instance._roles_before = snapshot(stored, _role_fields(type(instance))) if stored is not None else None


def _record_roles(sender: Any, instance: Any, created: bool, raw: bool = False, **kwargs: Any) -> None:
    if raw or current_scope() is not None or not hasattr(instance, "_roles_before"):
        return
    before = instance.__dict__.pop("_roles_before")
    names = _role_fields(type(instance))
    diff = change_diff(type(instance), before or {}, snapshot(instance, names), creating=created)
    if created or diff:
        with change_scope(actor=UNATTRIBUTED_ACTOR, via="django"):
            config_change_record(obj=instance, verb="create" if created else "update", diff=diff)


def _remember_group(sender: Any, instance: Any, raw: bool = False, **kwargs: Any) -> None:
    """Before a group is saved or deleted outside a service: its recorded fields."""
    if raw or current_scope() is not None or instance.pk is None:
        return
    stored = Group.objects.filter(pk=instance.pk).first()
    if stored is not None:
        instance._group_before = snapshot(stored, recorded_fields(Group))


def _remember_deleted_group(sender: Any, instance: Any, **kwargs: Any) -> None:
    """Before a group is deleted outside a service: its recorded fields and its members, who lose the group with
    it (the cascade sends no m2m signal). Django's deletion sends this in its transaction, before it deletes any
    row: the configuration's lock first."""
    _configuration_locked(kwargs["using"])
    _remember_group(sender, instance)
    if "_group_before" in instance.__dict__:
        instance._group_members = sorted(str(u) for u in get_user_model()._default_manager.filter(groups=instance))


def _record_group_save(sender: Any, instance: Any, created: bool, raw: bool = False, **kwargs: Any) -> None:
    if raw or current_scope() is not None:
        return
    before = instance.__dict__.pop("_group_before", None)
    diff = change_diff(Group, before or {}, snapshot(instance, recorded_fields(Group)), creating=created)
    if created or diff:
        with transaction.atomic(), change_scope(actor=UNATTRIBUTED_ACTOR, via="django"):
            config_change_record(obj=instance, verb="create" if created else "update", diff=diff)


def _record_group_delete(sender: Any, instance: Any, **kwargs: Any) -> None:
    before = instance.__dict__.pop("_group_before", None)
    members = instance.__dict__.pop("_group_members", [])
    if before is None or current_scope() is not None:
        return
    diff = {k: [v, None] for k, v in before.items() if v}
    if members:
        diff["members"] = [members, None]
    with transaction.atomic(), change_scope(actor=UNATTRIBUTED_ACTOR, via="django"):
        config_change_record(obj=instance, verb="delete", diff=diff)


class _RoleRecordingQuerySet:
    """Mixed into the user model's and the group model's querysets. ``QuerySet.update`` and ``bulk_create`` send
    no signal, so ``User.objects.filter(...).update(is_superuser=True)`` (or ``group.user_set.update(...)``,
    ``update(password=...)``, ``User.objects.bulk_create([...])``) from a shell used to leave no trace. Now, outside
    a service, ``update()`` of a role field (a user's ``is_superuser``, ``is_staff``, ``is_active``, ``username``; a
    group's ``name``) records each row it changed, and ``bulk_create`` each row it made (or, with
    ``update_conflicts``, changed), unattributed, in the write's transaction, as a save would (role fields only). A
    password written by ``update()`` is recorded as :func:`_record_password` records a saved one: each row whose
    hash changed, by the open scope's actor if there is one, never the password or the hash. Only the live models:
    a data migration's historical ones share these managers (``use_in_migrations``), and what a ``migrate`` did is
    recorded at its end (:func:`groups_record_migrated`)."""

    def update(self, **kwargs: Any) -> int:
        model = self.model  # type: ignore[attr-defined]
        watched = set(kwargs) & (ROLE_FIELDS | {"password"} if model is not Group else {"name"})
        if model not in (Group, get_user_model()):
            watched = set()
        elif current_scope() is not None:
            watched &= {"password"}  # a service records its own changes; a password is recorded whoever changes it
        if not watched:
            return super().update(**kwargs)  # type: ignore[misc, no-any-return]
        names = sorted(watched - {"password"})
        with transaction.atomic(using=self.db):  # type: ignore[attr-defined]
            _configuration_locked(self.db)  # type: ignore[attr-defined]
            # The rows by their keys, locked: the caller's queryset may be one FOR UPDATE cannot lock as it is (a
            # DISTINCT, an outer join, values()).
            keys = list(self.values_list("pk", flat=True))  # type: ignore[attr-defined]
            rows = model._base_manager.using(self.db).select_for_update().filter(pk__in=keys)  # type: ignore[attr-defined]
            before = {row.pk: _role_state(row, names) for row in rows}
            count = super().update(**kwargs)  # type: ignore[misc]
            _record_rows(model, names, before, rows.filter(pk__in=list(before)), key="pk")
        return count  # type: ignore[no-any-return]

    def bulk_create(self, objs: Iterable[Any], *args: Any, **kwargs: Any) -> list[Any]:
        objs = list(objs)
        model = self.model  # type: ignore[attr-defined]
        if current_scope() is not None or model not in (Group, get_user_model()):
            return super().bulk_create(objs, *args, **kwargs)  # type: ignore[misc, no-any-return]
        # The rows by their natural key (a username, a group's name; unique): with ignore_conflicts a row made gets
        # no primary key back, and with update_conflicts a row that was there is changed, not made.
        key = getattr(model, "USERNAME_FIELD", "name")
        names = recorded_fields(Group) if model is Group else _role_fields(model)
        stored = model._base_manager.using(self.db)  # type: ignore[attr-defined]
        rows = stored.filter(**{f"{key}__in": [getattr(o, key) for o in objs]})
        with transaction.atomic(using=self.db):  # type: ignore[attr-defined]
            _configuration_locked(self.db)  # type: ignore[attr-defined]
            before = {getattr(row, key): _role_state(row, names) for row in rows}
            made = super().bulk_create(objs, *args, **kwargs)  # type: ignore[misc]
            _record_rows(model, names, before, rows.all(), key=key)
        return made  # type: ignore[no-any-return]


def _role_state(row: Any, names: list[str]) -> tuple[dict[str, Any], str | None]:
    """A user's or group's ``names`` (:func:`snapshot`), and a user's password hash: only to tell whether it changed,
    never recorded."""
    return snapshot(row, names), getattr(row, "password", None)


def _record_rows(
    model: Any, names: list[str], before: Mapping[Any, tuple[dict[str, Any], str | None]], rows: Any, *, key: str
) -> None:
    """Record what a queryset write did to each of ``rows`` (``before``: their :func:`_role_state` before it, by
    ``key``): made (not in ``before``), its ``names`` changed, its password changed; unattributed, or by the open
    scope's actor."""
    with change_scope(actor=UNATTRIBUTED_ACTOR, via="django"):
        for row in rows.order_by("pk"):
            now, password = _role_state(row, names)
            if getattr(row, key) not in before:
                config_change_record(obj=row, verb="create", diff=change_diff(model, {}, now, creating=True))
                continue
            was, was_password = before[getattr(row, key)]
            diff = change_diff(model, was, now)
            if diff:
                config_change_record(obj=row, verb="update", diff=diff)
            if password != was_password:
                config_change_record(obj=row, verb="password_change", diff={})


class RoleRecordingQuerySet(_RoleRecordingQuerySet, models.QuerySet):  # type: ignore[type-arg]
    """Django's own ``QuerySet`` with :class:`_RoleRecordingQuerySet` (named here, so a queryset still pickles)."""


def _record_role_updates(manager: Any) -> None:
    """Give the managers of ``manager``'s class (the user model's ``UserManager``, the group's ``GroupManager``, and
    the related managers Django makes from them: ``group.user_set``) a queryset that records role updates. Django's
    plain ``Manager`` class is every model's: there, only this manager is changed."""
    queryset_class = manager._queryset_class
    if issubclass(queryset_class, _RoleRecordingQuerySet):
        return
    if queryset_class is models.QuerySet:
        recording: type = RoleRecordingQuerySet
    else:  # a custom user model's own queryset: a class made here, findable by pickle under this module
        name = f"RoleRecording{queryset_class.__name__}"
        recording = type(name, (_RoleRecordingQuerySet, queryset_class), {"__module__": __name__})
        globals()[name] = recording
    if type(manager) is models.Manager:
        manager._queryset_class = recording  # type: ignore[attr-defined]
    else:
        type(manager)._queryset_class = recording


class _Link(NamedTuple):
    """An auth link table (the through model of a user's ``groups`` and ``user_permissions``, of a group's
    ``permissions``): the model that declares the field, the field, and the link's foreign key to that model."""

    owner: Any
    field: str
    owner_key: Any


_LINKS: dict[Any, _Link] = {}
"""The auth link tables, by their through model (:func:`connect` fills it)."""


def _links_written(through: Any, using: str, owners: Callable[[], Iterable[Any]], write: Callable[[], T]) -> T:
    """Run ``write``, a write to the link table ``through``, and record each row whose field it changed
    (``config.user.update`` with its ``groups`` or ``user_permissions`` ``[old, new]``, ``config.group.update``
    with its ``permissions``), unattributed, in the write's transaction. ``owners`` (called in that transaction)
    names the owning rows it may change. The write runs in the scope this opens, so a write that goes on through
    another recorded path (a queryset's ``create`` saves a row) is recorded once; inside a service's scope, the
    service records, not this."""
    if current_scope() is not None:
        return write()
    link = _LINKS[through]
    rows = link.owner._base_manager.using(using)
    with transaction.atomic(using=using), change_scope(actor=UNATTRIBUTED_ACTOR, via="django"):
        before = {row.pk: snapshot(row, [link.field]) for row in rows.filter(pk__in=set(owners()))}
        written = write()
        for row in rows.filter(pk__in=list(before)).order_by("pk"):
            diff = change_diff(link.owner, before[row.pk], snapshot(row, [link.field]))
            if diff:
                config_change_record(obj=row, verb="update", diff=diff)
    return written


class LinkRecordingQuerySet(models.QuerySet):  # type: ignore[type-arg]
    """The queryset of an auth link table's ``objects``: ``bulk_create``, ``update`` (so ``bulk_update``) and
    ``delete`` record what they change (:func:`_links_written`); a link row's own ``save`` and ``delete`` are
    :func:`_save_link_row` and :func:`_delete_link_row`. Django sends no signal for an auto-created model's rows,
    so ``User.groups.through.objects.create(user=u, group=g)`` from a shell used to make a user an auditor
    unrecorded. Every many-to-many change ends here too (``user.groups.add`` adds with this ``bulk_create``,
    ``remove`` and ``clear`` use this ``delete``, ``set`` both, from either side), so this is the one recorder of
    links, and no ``m2m_changed`` receiver records them a second time. The cascade of a group's, a user's or a
    permission's deletion deletes links through the table's ``_base_manager``, which keeps Django's queryset: each
    such deletion is recorded as a whole (:func:`_record_group_delete` with the group's members,
    :func:`_record_delete`, :func:`_record_permission_holders`)."""

    def bulk_create(self, objs: Iterable[Any], *args: Any, **kwargs: Any) -> list[Any]:
        objs = list(objs)
        column = _LINKS[self.model].owner_key.attname
        write = partial(super().bulk_create, objs, *args, **kwargs)
        return _links_written(self.model, self.db, lambda: {getattr(o, column) for o in objs}, write)

    def update(self, **kwargs: Any) -> int:
        """Recorded for the rows that owned the links and those that own them after. A new owner given as an
        expression (``bulk_update`` sets ``user_id=Case(When(pk=…, then=…))``, one value per row) is read by
        selecting that expression over the same rows before the write, in its transaction: the new owner's
        ``before`` must be taken before the write, so the rows cannot be read again after it instead."""
        owner_key = _LINKS[self.model].owner_key
        given = [v for k, v in kwargs.items() if k in (owner_key.name, owner_key.attname)]
        moved_to = {getattr(v, "pk", v) for v in given if not hasattr(v, "resolve_expression")}
        computed = [v for v in given if hasattr(v, "resolve_expression")]

        def owners() -> set[Any]:
            found = {*self.values_list(owner_key.attname, flat=True), *moved_to}
            for expression in computed:
                found.update(self.annotate(_new_owner=expression).values_list("_new_owner", flat=True))
            return found - {None}

        return _links_written(self.model, self.db, owners, partial(super().update, **kwargs))

    def delete(self) -> tuple[int, dict[str, int]]:
        column = _LINKS[self.model].owner_key.attname
        return _links_written(self.model, self.db, lambda: set(self.values_list(column, flat=True)), super().delete)


def _save_link_row(row: Any, *args: Any, **kwargs: Any) -> None:
    """A link row's ``save`` (``objects.create`` and ``get_or_create`` call it, as does a row saved by hand):
    recorded, for the row that owned the link and the one that owns it now."""
    through = type(row)
    column = _LINKS[through].owner_key.attname
    using = kwargs.get("using") or router.db_for_write(through, instance=row)

    def owners() -> set[Any]:
        stored = through._base_manager.using(using).filter(pk=row.pk).values_list(column, flat=True)
        return {getattr(row, column), *(stored if row.pk is not None else ())}

    _links_written(through, using, owners, partial(models.Model.save, row, *args, **kwargs))


def _delete_link_row(row: Any, using: str | None = None, keep_parents: bool = False) -> tuple[int, dict[str, int]]:
    """A link row's ``delete``: recorded (Django deletes a lone row with neither a signal nor our queryset)."""
    through = type(row)
    using = using or router.db_for_write(through, instance=row)
    owner = getattr(row, _LINKS[through].owner_key.attname)
    return _links_written(through, using, lambda: {owner}, partial(models.Model.delete, row, using, keep_parents))


def _remember_permission_holders(sender: Any, instance: Any, using: str, origin: Any = None, **kwargs: Any) -> None:
    """Before a permission is deleted outside a service: each group and user that holds it, with the field's names.
    Its links go by a cascade no receiver of ours sees. They are remembered on the deletion's ``origin`` (the
    queryset or row deleted), so that permissions deleted together record each holder once. The configuration's
    lock first: Django's deletion sends this in its transaction, before it deletes a link."""
    _configuration_locked(using)
    if current_scope() is not None:
        return
    held = (origin if origin is not None else instance).__dict__.setdefault("_roles_holders_before", {})
    for link in _LINKS.values():
        if link.owner._meta.get_field(link.field).related_model is sender:
            holders = link.owner._base_manager.using(using).filter(**{link.field: instance})
            held.update({(link, row.pk): snapshot(row, [link.field]) for row in holders})


def _record_permission_holders(sender: Any, instance: Any, using: str, origin: Any = None, **kwargs: Any) -> None:
    """After: each group and user that lost a permission is recorded, unattributed, at the deletion's first
    ``post_delete``. By then the links of every permission it deletes are gone: Django deletes the cascade, then
    the permissions, and only then sends ``post_delete``."""
    held = (origin if origin is not None else instance).__dict__.pop("_roles_holders_before", None)
    if not held or current_scope() is not None:
        return
    with transaction.atomic(using=using), change_scope(actor=UNATTRIBUTED_ACTOR, via="django"):
        for link, pk in sorted(held, key=lambda key: (key[0].field, key[1])):
            row = link.owner._base_manager.using(using).filter(pk=pk).first()
            diff = change_diff(link.owner, held[(link, pk)], snapshot(row, [link.field])) if row is not None else {}
            if diff:
                config_change_record(obj=row, verb="update", diff=diff)


def _remember_delete(sender: Any, instance: Any, **kwargs: Any) -> None:
    """Before a user is deleted (in the deletion's transaction, before any row goes): the configuration's lock;
    outside a service, then its role fields."""
    _configuration_locked(kwargs["using"])
    if current_scope() is None:
        instance._roles_deleted = snapshot(instance, _role_fields(type(instance)))


def _record_delete(sender: Any, instance: Any, **kwargs: Any) -> None:
    before = instance.__dict__.pop("_roles_deleted", None)
    if before is None or current_scope() is not None:
        return
    with transaction.atomic(), change_scope(actor=UNATTRIBUTED_ACTOR, via="django"):
        config_change_record(obj=instance, verb="delete", diff={k: [v, None] for k, v in before.items() if v})


def _remember_password(sender: Any, instance: Any, raw: bool = False, update_fields: Any = None, **kwargs: Any) -> None:
    """Before a user is saved: whether the save changes the password (not only its hash: a login that re-hashes
    the same password with a newer hasher is no change). Never the password or a hash in the record."""
    if raw or instance.pk is None or (update_fields is not None and "password" not in update_fields):
        return
    stored = type(instance)._default_manager.filter(pk=instance.pk).values_list("password", flat=True).first()
    if stored is None or stored == instance.password:
        return
    plain = getattr(instance, "_password", None)  # what set_password was given, until the save
    if plain is not None and check_password(plain, stored):
        return
    instance._password_changed = True


def _record_password(sender: Any, instance: Any, created: bool, raw: bool = False, **kwargs: Any) -> None:
    """A changed password is recorded (``config.user.password_change``, no diff) by whoever changes it: the
    actor of the change scope (the admin's password page opens one), else ``system:unattributed`` (a command, a
    shell)."""
    if raw or created or not instance.__dict__.pop("_password_changed", False):
        return
    if current_scope() is not None:
        config_change_record(obj=instance, verb="password_change", diff={})
        return
    with transaction.atomic(), change_scope(actor=UNATTRIBUTED_ACTOR, via="django"):
        config_change_record(obj=instance, verb="password_change", diff={})


def _role_fields(model: Any) -> list[str]:
    return [n for n in recorded_fields(model) if n in ROLE_FIELDS or n == "groups"]


def connect() -> None:
    """Declare users and groups as configuration and record changes made to them outside a service."""
    user_model = get_user_model()
    register_policy(user_model, USER_POLICY)
    register_policy(Group, GROUP_POLICY)
    for model in (user_model, Group):
        _remember_rows_read(model)
        model.save = _saved_under_lock(model.save)  # type: ignore[method-assign]
    pre_save.connect(_remember_roles, sender=user_model, dispatch_uid="audit.roles.pre_save")
    post_save.connect(_record_roles, sender=user_model, dispatch_uid="audit.roles.post_save")
    pre_save.connect(_remember_group, sender=Group, dispatch_uid="audit.roles.group_pre_save")
    post_save.connect(_record_group_save, sender=Group, dispatch_uid="audit.roles.group_post_save")
    pre_delete.connect(_remember_deleted_group, sender=Group, dispatch_uid="audit.roles.group_pre_delete")
    post_delete.connect(_record_group_delete, sender=Group, dispatch_uid="audit.roles.group_post_delete")
    for manager in (user_model._default_manager, user_model._base_manager, Group._default_manager):
        _record_role_updates(manager)
    for owner, field in ((user_model, "groups"), (user_model, "user_permissions"), (Group, "permissions")):
        model_field: Any = owner._meta.get_field(field)
        through = model_field.remote_field.through
        _LINKS[through] = _Link(owner, field, through._meta.get_field(model_field.m2m_field_name()))
        through._default_manager._queryset_class = LinkRecordingQuerySet
        # Django sends no pre_save/post_delete for an auto-created model's rows: their save and delete record.
        through.save = _save_link_row
        through.delete = _delete_link_row
    pre_delete.connect(_remember_permission_holders, sender=Permission, dispatch_uid="audit.roles.perm_pre_delete")
    post_delete.connect(_record_permission_holders, sender=Permission, dispatch_uid="audit.roles.perm_post_delete")
    pre_delete.connect(_remember_delete, sender=user_model, dispatch_uid="audit.roles.pre_delete")
    post_delete.connect(_record_delete, sender=user_model, dispatch_uid="audit.roles.post_delete")
    pre_save.connect(_remember_password, sender=user_model, dispatch_uid="audit.roles.password_pre_save")
    post_save.connect(_record_password, sender=user_model, dispatch_uid="audit.roles.password_post_save")
