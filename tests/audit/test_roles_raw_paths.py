"""Roles changed by Django's lower paths, outside a service: recorded, unattributed, exactly once.

The defects this holds: (1) a write to the auth link tables themselves (``User.groups.through.objects.create``,
``bulk_create``, ``filter(...).delete()``, a row's ``delete``, on a user's groups and permissions and a group's
permissions) recorded nothing; (2) deleting a permission took it from its groups and users with no record; (3) a
queryset ``update(password=...)`` recorded no password change; (4) ``bulk_create`` of users or groups recorded no
creation; (5) ``bulk_update`` of link rows, which sets the owner by a ``Case`` expression, failed
(``AttributeError``) instead of recording the owners it moved links between. And what must not change: the many-to-many paths, the services and the deletion of a group or a user
record each change once, as before."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import make_password
from django.contrib.auth.models import Group, Permission
from django.db import transaction

from audit.change_guard import change_scope
from audit.models import AuditEvent
from audit.roles import UNATTRIBUTED_ACTOR, group_delete, group_save, user_create, user_delete, user_update

pytestmark = pytest.mark.django_db

User: Any = get_user_model()


def events_since(seq: int) -> list[tuple[str, str, str, dict[str, Any]]]:
    rows = AuditEvent.objects.filter(seq__gt=seq, action__startswith="config.").order_by("seq")
    return [(e.action, (e.result or {})["name"], e.actor, e.args) for e in rows]


def last_seq() -> int:
    return AuditEvent.objects.order_by("-seq").values_list("seq", flat=True).first() or 0


def permission(codename: str) -> Permission:
    return Permission.objects.get(content_type__app_label="agents", codename=codename)


def test_a_write_to_the_link_tables_is_recorded_once_like_the_many_to_many_path() -> None:
    ann = User.objects.create_user("ann-links", password="x", is_staff=True)
    ops, sec = Group.objects.create(name="ops-links"), Group.objects.create(name="sec-links")
    change_agent, view_agent = permission("change_agent"), permission("view_agent")
    user_groups, user_perms = User.groups.through, User.user_permissions.through
    group_perms = Group.permissions.through
    before = last_seq()

    user_groups.objects.create(user=ann, group=ops)
    user_groups.objects.bulk_create([user_groups(user=ann, group=sec)])
    user_groups.objects.filter(user=ann).delete()
    user_perms.objects.bulk_create(
        [user_perms(user=ann, permission=change_agent), user_perms(user=ann, permission=view_agent)]
    )
    user_perms.objects.get(user=ann, permission=view_agent).delete()
    group_perms.objects.create(group=ops, permission=view_agent)
    group_perms.objects.filter(group=ops).delete()

    assert events_since(before) == [
        ("config.user.update", "ann-links", UNATTRIBUTED_ACTOR, {"groups": [[], ["ops-links"]]}),
        (
            "config.user.update",
            "ann-links",
            UNATTRIBUTED_ACTOR,
            {"groups": [["ops-links"], ["ops-links", "sec-links"]]},
        ),
        ("config.user.update", "ann-links", UNATTRIBUTED_ACTOR, {"groups": [["ops-links", "sec-links"], []]}),
        (
            "config.user.update",
            "ann-links",
            UNATTRIBUTED_ACTOR,
            {"user_permissions": [[], ["agents.change_agent", "agents.view_agent"]]},
        ),
        (
            "config.user.update",
            "ann-links",
            UNATTRIBUTED_ACTOR,
            {"user_permissions": [["agents.change_agent", "agents.view_agent"], ["agents.change_agent"]]},
        ),
        ("config.group.update", "ops-links", UNATTRIBUTED_ACTOR, {"permissions": [[], ["agents.view_agent"]]}),
        ("config.group.update", "ops-links", UNATTRIBUTED_ACTOR, {"permissions": [["agents.view_agent"], []]}),
    ]
    assert {(e.result or {})["via"] for e in AuditEvent.objects.filter(seq__gt=before)} == {"django"}


def test_a_link_write_is_recorded_in_its_own_transaction() -> None:
    ann = User.objects.create_user("ann-rollback", password="x")
    ops = Group.objects.create(name="ops-rollback")
    before = last_seq()

    with pytest.raises(RuntimeError), transaction.atomic():
        User.groups.through.objects.create(user=ann, group=ops)
        assert len(events_since(before)) == 1  # written with the row, not after the commit
        raise RuntimeError

    assert events_since(before) == []
    assert not ann.groups.exists()


def test_the_many_to_many_paths_and_the_services_still_record_each_change_once() -> None:
    ann = User.objects.create_user("ann-once", password="x", is_staff=True)
    ops, sec = Group.objects.create(name="ops-once"), Group.objects.create(name="sec-once")
    before = last_seq()

    ann.groups.add(ops, sec)
    ann.groups.remove(ops)
    ops.user_set.add(ann)
    ann.groups.clear()
    ops.permissions.set([permission("view_agent"), permission("change_agent")])
    ops.permissions.set([permission("view_agent")])
    permission("view_agent").group_set.remove(ops)
    user_update(user=ann, actor="admin", via="admin", groups=[sec], permissions=[permission("view_agent")])
    group_save(group=sec, actor="admin", via="admin", permissions=[permission("change_agent")])

    assert [(action, args) for action, _name, _actor, args in events_since(before)] == [
        ("config.user.update", {"groups": [[], ["ops-once", "sec-once"]]}),
        ("config.user.update", {"groups": [["ops-once", "sec-once"], ["sec-once"]]}),
        ("config.user.update", {"groups": [["sec-once"], ["ops-once", "sec-once"]]}),
        ("config.user.update", {"groups": [["ops-once", "sec-once"], []]}),
        ("config.group.update", {"permissions": [[], ["agents.change_agent", "agents.view_agent"]]}),
        ("config.group.update", {"permissions": [["agents.change_agent", "agents.view_agent"], ["agents.view_agent"]]}),
        ("config.group.update", {"permissions": [["agents.view_agent"], []]}),
        ("config.user.update", {"groups": [[], ["sec-once"]], "user_permissions": [[], ["agents.view_agent"]]}),
        ("config.group.update", {"permissions": [[], ["agents.change_agent"]]}),
    ]
    assert [actor for _action, _name, actor, _args in events_since(before)][-2:] == ["admin", "admin"]


def test_a_bulk_update_moving_a_link_row_records_both_owners_once() -> None:
    ann = User.objects.create_user("ann-moved", password="x", is_staff=True)
    bob = User.objects.create_user("bob-moved", password="x", is_staff=True)
    ops, sec = Group.objects.create(name="ops-moved"), Group.objects.create(name="sec-moved")
    ann.groups.add(ops)
    bob.groups.add(sec)
    user_groups = User.groups.through
    row = user_groups.objects.get(user=ann, group=ops)
    before = last_seq()

    row.user = bob
    assert user_groups.objects.bulk_update([row], ["user"]) == 1

    assert sorted(events_since(before)) == [
        ("config.user.update", "ann-moved", UNATTRIBUTED_ACTOR, {"groups": [["ops-moved"], []]}),
        (
            "config.user.update",
            "bob-moved",
            UNATTRIBUTED_ACTOR,
            {"groups": [["sec-moved"], ["ops-moved", "sec-moved"]]},
        ),
    ]


def test_deleting_a_group_or_a_user_records_only_the_deletion_as_before() -> None:
    """Their link rows go with them: the group's deletion names its members, a user's deletion is the user's."""
    ann = User.objects.create_user("ann-gone", password="x", is_staff=True)
    ops = Group.objects.create(name="ops-gone")
    ops.permissions.add(permission("view_agent"))
    ann.groups.add(ops)
    ann.user_permissions.add(permission("change_agent"))
    before = last_seq()

    ops.delete()
    assert [action for action, *_ in events_since(before)] == ["config.group.delete"]

    sec = Group.objects.create(name="sec-gone")
    ann.groups.add(sec)
    before = last_seq()
    ann.delete()
    assert [action for action, *_ in events_since(before)] == ["config.user.delete"]

    bob = user_create(actor="admin", via="admin", username="bob-gone", password=None, groups=[sec])
    before = last_seq()
    group_delete(group=sec, actor="admin", via="admin")
    assert [(action, name) for action, name, *_ in events_since(before)] == [
        ("config.group.delete", "sec-gone"),
        ("config.user.update", "bob-gone"),
    ]
    before = last_seq()
    user_delete(user=bob, actor="admin", via="admin")
    assert [action for action, *_ in events_since(before)] == ["config.user.delete"]


def test_a_deleted_permission_is_recorded_for_each_group_and_user_that_lost_it() -> None:
    ann = User.objects.create_user("ann-perm", password="x", is_staff=True)
    bob = User.objects.create_user("bob-perm", password="x", is_staff=True)
    ops, sec = Group.objects.create(name="ops-perm"), Group.objects.create(name="sec-perm")
    view_agent, change_agent, delete_agent = (
        permission("view_agent"),
        permission("change_agent"),
        permission("delete_agent"),
    )
    ops.permissions.add(view_agent, change_agent, delete_agent)
    sec.permissions.add(view_agent)
    ann.user_permissions.add(change_agent, delete_agent)
    bob.user_permissions.add(view_agent)
    before = last_seq()

    Permission.objects.filter(pk__in=[change_agent.pk, delete_agent.pk]).delete()
    view_agent.delete()

    assert events_since(before) == [
        (
            "config.group.update",
            "ops-perm",
            UNATTRIBUTED_ACTOR,
            {
                "permissions": [
                    ["agents.change_agent", "agents.delete_agent", "agents.view_agent"],
                    ["agents.view_agent"],
                ]
            },
        ),
        (
            "config.user.update",
            "ann-perm",
            UNATTRIBUTED_ACTOR,
            {"user_permissions": [["agents.change_agent", "agents.delete_agent"], []]},
        ),
        ("config.group.update", "ops-perm", UNATTRIBUTED_ACTOR, {"permissions": [["agents.view_agent"], []]}),
        ("config.group.update", "sec-perm", UNATTRIBUTED_ACTOR, {"permissions": [["agents.view_agent"], []]}),
        ("config.user.update", "bob-perm", UNATTRIBUTED_ACTOR, {"user_permissions": [["agents.view_agent"], []]}),
    ]


def test_a_queryset_update_of_passwords_records_each_changed_row_and_no_hash() -> None:
    ann = User.objects.create_user("ann-pw", password="old")
    bob = User.objects.create_user("bob-pw", password="old")
    new_hash = make_password("new")
    User.objects.filter(pk=bob.pk).update(password=new_hash)
    before = last_seq()

    assert User.objects.filter(pk__in=[ann.pk, bob.pk]).update(password=new_hash, is_staff=True) == 2

    assert events_since(before) == [
        ("config.user.update", "ann-pw", UNATTRIBUTED_ACTOR, {"is_staff": [False, True]}),
        ("config.user.password_change", "ann-pw", UNATTRIBUTED_ACTOR, {}),
        ("config.user.update", "bob-pw", UNATTRIBUTED_ACTOR, {"is_staff": [False, True]}),
    ]  # bob already had it: no change
    before = last_seq()
    with change_scope(actor="admin", via="admin"):  # a password is recorded whoever changes it, as a save's is
        User.objects.filter(pk=ann.pk).update(password=make_password("newer"), is_staff=False)
    assert events_since(before) == [("config.user.password_change", "ann-pw", "admin", {})]
    recorded = json.dumps([[e.args, e.result] for e in AuditEvent.objects.all()])
    assert new_hash not in recorded and new_hash.split("$")[-1] not in recorded


def test_bulk_created_users_and_groups_are_recorded_as_created() -> None:
    before = last_seq()
    User.objects.create(username="made-one", is_staff=True)  # as a save records it
    [(_action, _name, _actor, made)] = events_since(before)
    before = last_seq()

    User.objects.bulk_create([User(username="bulk-one", is_staff=True), User(username="bulk-two")])
    Group.objects.bulk_create([Group(name="bulk-ops")])
    Group.objects.bulk_create([Group(name="bulk-ops"), Group(name="bulk-sec")], ignore_conflicts=True)

    assert events_since(before) == [
        ("config.user.create", "bulk-one", UNATTRIBUTED_ACTOR, {**made, "username": [None, "bulk-one"]}),
        (
            "config.user.create",
            "bulk-two",
            UNATTRIBUTED_ACTOR,
            {**made, "username": [None, "bulk-two"], "is_staff": [None, False]},
        ),
        ("config.group.create", "bulk-ops", UNATTRIBUTED_ACTOR, {"name": [None, "bulk-ops"]}),
        ("config.group.create", "bulk-sec", UNATTRIBUTED_ACTOR, {"name": [None, "bulk-sec"]}),
    ]  # the second bulk-ops, ignored as a conflict, made nothing


def test_a_data_migrations_writes_are_left_to_the_end_of_migrate() -> None:
    """A migration's historical models share the group's manager (``use_in_migrations``): what they write is
    recorded once, as ``system:migrate``, by ``groups_record_migrated``, not here as well."""
    from django.db import connection
    from django.db.migrations.loader import MigrationLoader

    historical = MigrationLoader(connection).project_state().apps.get_model("auth", "Group")
    before = last_seq()

    [made] = historical.objects.bulk_create([historical(name="migrated-ops")])
    historical.objects.filter(pk=made.pk).update(name="migrated-sec")
    links = historical.permissions.through
    links.objects.bulk_create([links(group_id=made.pk, permission_id=permission("view_agent").pk)])

    assert events_since(before) == []
