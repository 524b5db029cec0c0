"""Users and groups as audited changes: who may administer, audit or approve is configuration like any other.

The services here (``user_create``, ``user_update``, ``user_delete``, ``group_save``, ``group_delete``) write
the change and its audit event (``config.user.*``, ``config.group.*``) in one transaction; the admin's user and
group pages and ``create_auditor`` call them. Django's users are not our model, so a path we do not own
(``createsuperuser``, a shell) cannot be refused; instead, a change to a user's staff/superuser/active flags or
groups made outside a service is still recorded, by signals, with the actor ``system:unattributed`` and the
path ``django``: never silently. A password change is recorded the same way (``config.user.password_change``,
naming the user, never the password or a hash), with the admin as its actor on the admin's password page.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import check_password
from django.contrib.auth.models import AbstractBaseUser, Group
from django.db import DEFAULT_DB_ALIAS, connections, models, transaction
from django.db.models.signals import m2m_changed, post_delete, post_save, pre_delete, pre_save

from audit.change_guard import ChangeAudit, change_scope, current_scope, register_policy
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

USER_POLICY = ChangeAudit(
    entity="user",
    operational_fields=frozenset({"last_login"}),
    unrecorded_fields=frozenset({"password", "first_name", "last_name", "email", "date_joined"}),
)
GROUP_POLICY = ChangeAudit(entity="group")


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
    permissions (``None``: unchanged)."""
    m2m = {
        name: list(values)
        for name, values in (("groups", groups), ("user_permissions", permissions))
        if values is not None
    }
    return audited_save(user, actor=actor, via=via, data=data, m2m=m2m, validate=False)


def user_delete(*, user: AbstractBaseUser, actor: Any, via: str) -> None:
    audited_delete(user, actor=actor, via=via)


@contextmanager
def user_password_page(*, actor: Any, via: str) -> Iterator[None]:
    """The scope of a page that changes a password (Django's own form saves it): the change is recorded, by the
    signal below, with ``actor`` and ``via``, in the same transaction (a password never changes unrecorded)."""
    with change_scope(actor=actor, via=via), transaction.atomic():
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

    first = AuditEvent.objects.exclude(seq=None).order_by("seq").values_list("seq", flat=True).first()
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


def _user_m2m_recorder(field: str) -> tuple[Any, Any]:
    """The two ``m2m_changed`` receivers that record a change of a user's ``field`` (``groups``,
    ``user_permissions``) made outside a service, from either side (``user.groups.add(g)``,
    ``group.user_set.clear()``, ``permission.user_set.add(u)``): before it, each user it touches is remembered with
    the field's names; after it, each one whose names changed is recorded ``[old, new]``, unattributed, in one
    transaction. A clear names what was cleared (it used to be an empty list, or a TypeError from the group's
    side, after the rows were gone)."""
    memo = f"_roles_{field}_before"

    def touched(instance: Any, reverse: bool, pk_set: Any, action: str) -> list[Any]:
        user_model = get_user_model()
        if not reverse:
            return [instance]
        if action == "pre_clear":
            return list(user_model._default_manager.filter(**{field: instance}))
        return list(user_model._default_manager.filter(pk__in=pk_set or ()))

    def before(sender: Any, instance: Any, action: str, reverse: bool, pk_set: Any, **kwargs: Any) -> None:
        if current_scope() is not None or action not in ("pre_add", "pre_remove", "pre_clear"):
            return
        instance.__dict__[memo] = {
            user.pk: snapshot(user, [field]) for user in touched(instance, reverse, pk_set, action)
        }

    def after(sender: Any, instance: Any, action: str, **kwargs: Any) -> None:
        if current_scope() is not None or action not in ("post_add", "post_remove", "post_clear"):
            return
        remembered = instance.__dict__.pop(memo, None) or {}
        user_model = get_user_model()
        with transaction.atomic(), change_scope(actor=UNATTRIBUTED_ACTOR, via="django"):
            for user in user_model._default_manager.filter(pk__in=list(remembered)).order_by("pk"):
                diff = change_diff(user_model, remembered[user.pk], snapshot(user, [field]))
                if diff:
                    config_change_record(obj=user, verb="update", diff=diff)

    return before, after


def _remember_group(sender: Any, instance: Any, raw: bool = False, **kwargs: Any) -> None:
    """Before a group is saved or deleted outside a service: its recorded fields."""
    if raw or current_scope() is not None or instance.pk is None:
        return
    stored = Group.objects.filter(pk=instance.pk).first()
    if stored is not None:
        instance._group_before = snapshot(stored, recorded_fields(Group))


def _remember_deleted_group(sender: Any, instance: Any, **kwargs: Any) -> None:
    """Before a group is deleted outside a service: its recorded fields and its members, who lose the group with
    it (the cascade sends no m2m signal)."""
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
    """Mixed into the user model's and the group model's querysets: ``update()`` of a role field (a user's
    ``is_superuser``, ``is_staff``, ``is_active``, ``username``; a group's ``name``) outside a service records each
    row it changed, unattributed, in the update's transaction. ``QuerySet.update`` sends no signal, so
    ``User.objects.filter(...).update(is_superuser=True)`` (or ``group.user_set.update(...)``) from a shell used to
    leave no trace."""

    def update(self, **kwargs: Any) -> int:
        model = self.model  # type: ignore[attr-defined]
        watched = set(kwargs) & (ROLE_FIELDS if model is not Group else {"name"})
        if not watched or current_scope() is not None:
            return super().update(**kwargs)  # type: ignore[misc]
        names = sorted(watched)
        with transaction.atomic(using=self.db):  # type: ignore[attr-defined]
            # The rows by their keys, locked: the caller's queryset may be one FOR UPDATE cannot lock as it is (a
            # DISTINCT, an outer join, values()).
            keys = list(self.values_list("pk", flat=True))  # type: ignore[attr-defined]
            rows = model._base_manager.using(self.db).select_for_update().filter(pk__in=keys)  # type: ignore[attr-defined]
            before = {row.pk: snapshot(row, names) for row in rows}
            count = super().update(**kwargs)  # type: ignore[misc]
            with change_scope(actor=UNATTRIBUTED_ACTOR, via="django"):
                for row in model._base_manager.using(self.db).filter(pk__in=list(before)).order_by("pk"):  # type: ignore[attr-defined]
                    diff = change_diff(model, before[row.pk], snapshot(row, names))
                    if diff:
                        config_change_record(obj=row, verb="update", diff=diff)
        return count


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
        manager._queryset_class = recording
    else:
        type(manager)._queryset_class = recording


def _remember_group_permissions(
    sender: Any, instance: Any, action: str, reverse: bool, pk_set: Any, **kwargs: Any
) -> None:
    """Before a group's permissions change outside a service (a shell, a script): each group's permissions."""
    if current_scope() is not None or action not in ("pre_add", "pre_remove", "pre_clear"):
        return
    groups = list(Group.objects.filter(pk__in=pk_set or ())) if reverse else [instance]
    if reverse and action == "pre_clear":
        groups = list(instance.group_set.all())
    instance._group_permissions_before = {group.pk: snapshot(group, ["permissions"]) for group in groups}


def _record_group_permissions(sender: Any, instance: Any, action: str, **kwargs: Any) -> None:
    """After: each group whose permissions changed is recorded, unattributed (``config.group.update``)."""
    if current_scope() is not None or action not in ("post_add", "post_remove", "post_clear"):
        return
    before = instance.__dict__.pop("_group_permissions_before", None) or {}
    with transaction.atomic(), change_scope(actor=UNATTRIBUTED_ACTOR, via="django"):
        for group in Group.objects.filter(pk__in=list(before)).order_by("pk"):
            diff = change_diff(Group, before[group.pk], snapshot(group, ["permissions"]))
            if diff:
                config_change_record(obj=group, verb="update", diff=diff)


def _remember_delete(sender: Any, instance: Any, **kwargs: Any) -> None:
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
    pre_save.connect(_remember_roles, sender=user_model, dispatch_uid="audit.roles.pre_save")
    post_save.connect(_record_roles, sender=user_model, dispatch_uid="audit.roles.post_save")
    for field in ("groups", "user_permissions"):
        before, after = _user_m2m_recorder(field)
        through = getattr(user_model, field).through
        m2m_changed.connect(before, sender=through, dispatch_uid=f"audit.roles.{field}_before", weak=False)
        m2m_changed.connect(after, sender=through, dispatch_uid=f"audit.roles.{field}_after", weak=False)
    pre_save.connect(_remember_group, sender=Group, dispatch_uid="audit.roles.group_pre_save")
    post_save.connect(_record_group_save, sender=Group, dispatch_uid="audit.roles.group_post_save")
    pre_delete.connect(_remember_deleted_group, sender=Group, dispatch_uid="audit.roles.group_pre_delete")
    post_delete.connect(_record_group_delete, sender=Group, dispatch_uid="audit.roles.group_post_delete")
    for manager in (user_model._default_manager, user_model._base_manager, Group._default_manager):
        _record_role_updates(manager)
    permissions = Group.permissions.through
    m2m_changed.connect(_remember_group_permissions, sender=permissions, dispatch_uid="audit.roles.perms_before")
    m2m_changed.connect(_record_group_permissions, sender=permissions, dispatch_uid="audit.roles.perms_after")
    pre_delete.connect(_remember_delete, sender=user_model, dispatch_uid="audit.roles.pre_delete")
    post_delete.connect(_record_delete, sender=user_model, dispatch_uid="audit.roles.post_delete")
    pre_save.connect(_remember_password, sender=user_model, dispatch_uid="audit.roles.password_pre_save")
    post_save.connect(_record_password, sender=user_model, dispatch_uid="audit.roles.password_post_save")
