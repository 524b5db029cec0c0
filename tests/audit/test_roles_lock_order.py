"""Users and groups written from a stale copy, out of the one lock order, or before their record (review defects
of ``audit/roles.py``; the PostgreSQL halves are in ``test_roles_postgres.py``):

1. a user saved from a copy read before a password reset wrote the old password hash back (and a copy read before
   a deactivation made the user active again, in an event that blamed the second admin): Django's users are not
   ours, so nothing remembered what a copy was read with, and every field that differed from the stored row
   counted as the caller's change; a group saved from a stale copy put its old name back the same way;
2. the recorders of changes made outside a service (a queryset update or ``bulk_create``, a save or delete inside
   an outer transaction, a deleted permission) locked or wrote the rows first and took the configuration's lock
   only when they recorded: the reverse of every service's order, a deadlock on PostgreSQL;
3. a user or group saved outside a service in autocommit committed before its record: a record that failed left
   the change standing with no event.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connection, transaction

import audit.change_guard
import audit.roles
from audit.models import AuditEvent
from audit.roles import group_save, user_create, user_password_page, user_update

User = get_user_model()
OLD, NEW = "old-Passw0rd-for-tests", "new-Passw0rd-for-tests"
LOCK = "config_write_lock"


def events(action: str) -> list[tuple[str, dict[str, Any]]]:
    return [(e.actor, e.args) for e in AuditEvent.objects.filter(action=action).order_by("id")]


# --- 1. a stale copy writes only what its caller changed ----------------------------------------------------------


@pytest.mark.django_db
def test_a_user_saved_from_a_copy_read_before_a_password_reset_keeps_the_new_password() -> None:
    target = user_create(actor="t", via="tests", username="mina", password=OLD, is_staff=True)
    form_copy = User.objects.get(pk=target.pk)  # superB opens mina's change form
    reset = User.objects.get(pk=target.pk)
    with user_password_page(actor="superA", via="admin"):  # superA resets her password meanwhile
        reset.set_password(NEW)
        reset.save()
    form_copy.email = "mina@example.com"
    user_update(user=form_copy, actor="superB", via="admin")

    stored = User.objects.get(pk=target.pk)
    assert stored.check_password(NEW) and not stored.check_password(OLD)  # the old hash was written back
    assert stored.email == "mina@example.com"
    assert [actor for actor, _args in events("config.user.password_change")] == ["superA"]


@pytest.mark.django_db
def test_a_user_saved_from_a_copy_read_before_a_deactivation_stays_deactivated() -> None:
    target = user_create(actor="t", via="tests", username="jun", password=OLD, is_staff=True)
    readers = Group.objects.create(name="readers")
    form_copy = User.objects.get(pk=target.pk)  # superB opens jun's change form
    user_update(user=User.objects.get(pk=target.pk), actor="superA", via="admin", data={"is_active": False})
    user_update(user=form_copy, actor="superB", via="admin", groups=[readers])

    assert User.objects.get(pk=target.pk).is_active is False
    assert events("config.user.update")[-2:] == [
        ("superA", {"is_active": [True, False]}),
        ("superB", {"groups": [[], ["readers"]]}),  # was {"is_active": [False, True], ...}: superB blamed
    ]
    assert (form_copy.is_active, form_copy.groups.count()) == (False, 1)  # the copy is the stored row now


@pytest.mark.django_db
def test_a_user_update_never_writes_a_password_or_last_login_it_was_handed() -> None:
    """The services that change a password are the password pages (recorded as ``password_change``); a user's
    update writes the fields of its change form, never a hash or a sign-in time a copy carries."""
    target = user_create(actor="t", via="tests", username="seo", password=OLD)
    copy = User.objects.get(pk=target.pk)
    copy.password = "md5$x$forged"  # a forged hash
    copy.last_login = copy.date_joined
    copy.is_staff = True
    user_update(user=copy, actor="superB", via="admin")
    stored = User.objects.get(pk=target.pk)
    assert stored.check_password(OLD) and stored.last_login is None and stored.is_staff
    assert not AuditEvent.objects.filter(action="config.user.password_change").exists()


@pytest.mark.django_db
def test_a_group_saved_from_a_copy_read_before_a_rename_keeps_the_new_name() -> None:
    group = Group.objects.create(name="reviewers")
    form_copy = Group.objects.get(pk=group.pk)
    renamed = Group.objects.get(pk=group.pk)
    renamed.name = "검토자"
    group_save(group=renamed, actor="superA", via="admin")
    view_run = Permission.objects.get(content_type__app_label="agents", codename="view_run")
    group_save(group=form_copy, actor="superB", via="admin", permissions=[view_run])

    assert Group.objects.get(pk=group.pk).name == "검토자"
    assert events("config.group.update")[-1] == ("superB", {"permissions": [[], ["agents.view_run"]]})


@pytest.mark.django_db
def test_a_user_refreshed_from_the_database_remembers_what_it_was_refreshed_with() -> None:
    target = user_create(actor="t", via="tests", username="ara", password=OLD)
    copy = User.objects.get(pk=target.pk)
    user_update(user=User.objects.get(pk=target.pk), actor="superA", via="admin", data={"is_staff": True})
    copy.refresh_from_db()
    user_update(user=User.objects.get(pk=target.pk), actor="superC", via="admin", data={"is_staff": False})
    copy.is_active = False
    user_update(user=copy, actor="superB", via="admin")
    stored = User.objects.get(pk=target.pk)
    assert (stored.is_staff, stored.is_active) == (False, False)  # superC's change was undone


# --- 2. the configuration's lock first, whoever writes a user or a group ------------------------------------------


@contextmanager
def statements(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The SQL run in the block, with ``config_write_lock`` where ``audit.roles`` takes the configuration's lock
    (SQLite runs no statement for it: its transactions hold the database's write lock from their start)."""
    seen: list[str] = []
    original = audit.change_guard.config_write_lock

    def lock(*, using: str | None = None) -> bool:
        seen.append(LOCK)
        return original(using=using)

    def log(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        if not sql.lstrip().upper().startswith(("SAVEPOINT", "RELEASE", "ROLLBACK", "BEGIN")):
            seen.append(sql)
        return execute(sql, params, many, context)

    monkeypatch.setattr(audit.roles, "config_write_lock", lock, raising=False)
    with connection.execute_wrapper(log):
        yield seen


def _first_write(seen: list[str]) -> int:
    return next(i for i, sql in enumerate(seen) if sql.lstrip().upper().startswith(("UPDATE", "INSERT", "DELETE")))


@pytest.fixture
def dana(db: Any) -> Any:
    """A user in the group ``ops``, both read (the caller's own reads come before the write under test)."""
    user = User.objects.create_user("pg-dl", password=OLD)
    user.groups.add(Group.objects.create(name="ops"))
    read: Any = User.objects.get(pk=user.pk)
    read.ops = Group.objects.get(name="ops")
    return read


def _save(row: Any, field: str, value: Any) -> None:
    setattr(row, field, value)
    row.save()


WRITES: dict[str, Callable[[Any], Any]] = {
    "queryset update": lambda user: User.objects.filter(username=user.username).update(is_staff=True),
    "bulk_create": lambda user: User.objects.bulk_create(
        [User(username=user.username, is_staff=True)],
        update_conflicts=True,
        unique_fields=["username"],
        update_fields=["is_staff"],
    ),
    "save": lambda user: _save(user, "is_staff", True),
    "queryset delete": lambda user: User.objects.filter(pk=user.pk).delete(),
    "delete": lambda user: user.delete(),
    "group save": lambda user: _save(user.ops, "name", "ops2"),
    "group delete": lambda user: user.ops.delete(),
}


@pytest.mark.parametrize("write", list(WRITES))
def test_a_write_outside_a_service_takes_the_configuration_lock_before_it_reads_or_writes_a_row(
    dana: Any, monkeypatch: pytest.MonkeyPatch, write: str
) -> None:
    with statements(monkeypatch) as seen, transaction.atomic():  # inside an outer transaction, as in a script
        WRITES[write](dana)
    assert LOCK in seen, seen
    first_write = _first_write(seen)
    assert seen.index(LOCK) < first_write, seen
    # Every read of a user's or group's row or links after the lock, so that what is recorded as "before" is
    # what the last writer committed (a delete's own collection of what goes with it aside: no lock, no record).
    recorder_reads = [i for i, sql in enumerate(seen[:first_write]) if "auth_" in sql and "FOR UPDATE" not in sql]
    if "delete" not in write:
        assert all(i > seen.index(LOCK) for i in recorder_reads), seen


def test_a_deleted_permission_takes_the_configuration_lock_before_its_links_go(
    dana: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    content_type = ContentType.objects.get_for_model(Group)
    granted = Permission.objects.create(codename="pg_dl_probe", name="probe", content_type=content_type)
    dana.user_permissions.add(granted)
    dana.ops.permissions.add(granted)
    with statements(monkeypatch) as seen:
        Permission.objects.filter(pk=granted.pk).delete()
    lock = seen.index(LOCK)
    links = [i for i, sql in enumerate(seen) if "auth_user_user_permissions" in sql or "auth_group_permissions" in sql]
    assert links and lock < min(links) and lock < _first_write(seen), seen
    assert [args for _a, args in events("config.user.update")][-1] == {"user_permissions": [["auth.pg_dl_probe"], []]}


# --- 3. a save outside a service commits with its record, or not at all --------------------------------------------


def _record_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(**kwargs: Any) -> None:
        raise RuntimeError("the audit could not be written")

    monkeypatch.setattr(audit.roles, "config_change_record", refused)


@pytest.mark.django_db(transaction=True)
def test_a_users_flag_saved_in_autocommit_is_rolled_back_when_its_record_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    user = User.objects.create_user("kim", password=OLD)
    _record_refused(monkeypatch)
    user.is_superuser = True
    with pytest.raises(RuntimeError):
        user.save()
    assert User.objects.get(pk=user.pk).is_superuser is False
    assert not AuditEvent.objects.filter(action="config.user.update").exists()


@pytest.mark.django_db(transaction=True)
def test_a_password_or_a_group_saved_in_autocommit_is_rolled_back_when_its_record_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    user = User.objects.create_user("lee", password=OLD)
    group = Group.objects.create(name="auditor5")
    _record_refused(monkeypatch)
    user.set_password(NEW)
    with pytest.raises(RuntimeError):
        user.save()
    group.name = "auditor6"
    with pytest.raises(RuntimeError):
        group.save()
    assert User.objects.get(pk=user.pk).check_password(OLD)
    assert Group.objects.get(pk=group.pk).name == "auditor5"


@pytest.mark.django_db(transaction=True)
def test_a_login_writes_last_login_without_the_configuration_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every sign-in saves ``last_login``: no configuration, nothing recorded, so no lock to wait for."""
    from django.contrib.auth.models import update_last_login

    user = User.objects.create_user("park", password=OLD)
    with statements(monkeypatch) as seen:
        update_last_login(User, user)
    assert LOCK not in seen and User.objects.get(pk=user.pk).last_login is not None
