"""Who may administer, audit or approve, changed outside a service (a shell, a script, a third-party app): never
silently. Each path Django offers is recorded, unattributed (``system:unattributed``, path ``django``): a queryset
update of a user's flags (it sends no signal), a permission given to a user directly, a group renamed or deleted
(its members lose it with it), a group's members or a user's groups cleared from either side."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission

from audit.models import AuditEvent
from audit.roles import UNATTRIBUTED_ACTOR, user_update

pytestmark = pytest.mark.django_db


def changes(action: str) -> list[tuple[str, str, dict[str, Any]]]:
    rows = AuditEvent.objects.filter(action=action).order_by("id")
    return [(e.actor, e.result.get("via"), e.args) for e in rows]


def test_a_queryset_update_of_a_users_flags_is_recorded() -> None:
    user_model = get_user_model()
    mallory = user_model.objects.create_user("mallory", password="x")
    bob = user_model.objects.create_user("bob", password="x", is_staff=True)
    updates = AuditEvent.objects.filter(action="config.user.update").count()

    changed = user_model.objects.filter(pk__in=[mallory.pk, bob.pk]).update(is_superuser=True, is_staff=True)

    assert changed == 2
    recorded = changes("config.user.update")[updates:]
    assert recorded == [
        (UNATTRIBUTED_ACTOR, "django", {"is_staff": [False, True], "is_superuser": [False, True]}),
        (UNATTRIBUTED_ACTOR, "django", {"is_superuser": [False, True]}),
    ]
    # An update of no role field (last_login, as every login writes it) records nothing.
    user_model.objects.filter(pk=bob.pk).update(first_name="Bob")
    assert len(changes("config.user.update")) == updates + 2


def test_a_permission_given_to_a_user_directly_is_recorded_from_either_side() -> None:
    user = get_user_model().objects.create_user("mallory2", password="x", is_staff=True)
    change_agent = Permission.objects.get(content_type__app_label="agents", codename="change_agent")

    user.user_permissions.add(change_agent)
    change_agent.user_set.remove(user)

    [(actor, via, granted), (_actor, _via, taken)] = changes("config.user.update")
    assert (actor, via) == (UNATTRIBUTED_ACTOR, "django")
    [was, now] = granted["user_permissions"]
    assert (was, now) == ([], ["agents.change_agent"])
    assert taken["user_permissions"] == [now, []]


def test_a_group_renamed_or_deleted_outside_a_service_is_recorded_with_the_members_it_had() -> None:
    group = Group.objects.create(name="auditor2")
    member = get_user_model().objects.create_user("aud", password="x", is_staff=True)
    member.groups.add(group)

    group.name = "auditorX"
    group.save()
    group.delete()

    assert [a for a, _v, _args in changes("config.group.create")] == [UNATTRIBUTED_ACTOR]
    [(actor, _via, renamed)] = changes("config.group.update")
    assert (actor, renamed) == (UNATTRIBUTED_ACTOR, {"name": ["auditor2", "auditorX"]})
    [(actor, _via, deleted)] = changes("config.group.delete")
    assert (actor, deleted) == (UNATTRIBUTED_ACTOR, {"name": ["auditorX", None], "members": [["aud"], None]})


def test_clearing_a_groups_members_or_a_users_groups_names_what_was_cleared() -> None:
    user_model = get_user_model()
    group = Group.objects.create(name="auditor3")
    other = Group.objects.create(name="auditor4")
    first = user_model.objects.create_user("aud3", password="x", is_staff=True)
    second = user_model.objects.create_user("aud4", password="x", is_staff=True)
    for user in (first, second):
        user.groups.add(group, other)
    before = len(changes("config.user.update"))

    group.user_set.clear()  # used to raise TypeError after the rows were gone, recording nothing
    second.groups.clear()

    recorded = [args for _a, _v, args in changes("config.user.update")[before:]]
    assert recorded == [
        {"groups": [["auditor3", "auditor4"], ["auditor4"]]},
        {"groups": [["auditor3", "auditor4"], ["auditor4"]]},
        {"groups": [["auditor4"], []]},
    ]
    assert not first.groups.filter(pk=group.pk).exists()


def test_a_service_change_is_recorded_once_by_its_service() -> None:
    user = get_user_model().objects.create_user("carol", password="x")
    before = AuditEvent.objects.filter(action="config.user.update").count()
    user_update(user=user, actor="admin", via="admin", data={"is_staff": True})
    assert AuditEvent.objects.filter(action="config.user.update").count() == before + 1


def test_every_form_of_update_is_recorded_and_still_works() -> None:
    """A related manager's update (``group.user_set``), a ``values()`` queryset, a DISTINCT over a join, a group's
    name; and a user queryset still pickles (a cache keeps querysets)."""
    import pickle

    user_model = get_user_model()
    ops = Group.objects.create(name="ops-probe")
    dana = user_model.objects.create_user("dana", password="x")
    dana.groups.add(ops)
    before = len(changes("config.user.update"))

    assert ops.user_set.update(is_superuser=True) == 1
    assert user_model.objects.filter(pk=dana.pk).values("pk").update(is_staff=True) == 1
    assert user_model.objects.filter(groups__name="ops-probe").distinct().update(is_active=False) == 1
    assert Group.objects.filter(pk=ops.pk).update(name="ops-renamed") == 1
    assert user_model._base_manager.filter(pk=dana.pk).update(is_active=True) == 1  # Django's own manager too

    recorded = [args for _a, _v, args in changes("config.user.update")[before:]]
    assert recorded == [
        {"is_superuser": [False, True]},
        {"is_staff": [False, True]},
        {"is_active": [True, False]},
        {"is_active": [False, True]},
    ]
    [(_a, _v, renamed)] = changes("config.group.update")
    assert renamed == {"name": ["ops-probe", "ops-renamed"]}
    assert list(pickle.loads(pickle.dumps(user_model.objects.filter(is_staff=True)))) == [dana]
