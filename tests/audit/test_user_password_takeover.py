"""Whose password a member of staff with "change user" (a help desk) may set (review defect: it set a reviewer's
password on the admin's password page and signed in as them): their own and that of a user with no power (not
staff, no group, no permission); anyone else's is a superuser's to set, a 403 for the help desk."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission

from audit.roles import user_create
from tests.conftest import logged_in

pytestmark = pytest.mark.django_db
User = get_user_model()
PASSWORD = "Some-Str0ng-passw0rd!"
NEW = "An0ther-Str0ng-passw0rd!"


def permission(code: str) -> Permission:
    app, codename = code.split(".")
    return Permission.objects.get(content_type__app_label=app, codename=codename)


@pytest.fixture
def help_desk() -> Any:
    user: Any = user_create(actor="t", via="tests", username="helpdesk", password=PASSWORD, is_staff=True)
    user.user_permissions.add(permission("auth.view_user"), permission("auth.change_user"))
    return User.objects.get(pk=user.pk)


def set_password(client: Any, user: Any) -> int:
    response = client.post(
        f"/admin/auth/user/{user.pk}/password/", {"password1": NEW, "password2": NEW, "usable_password": "true"}
    )
    return int(response.status_code)


def test_a_help_desk_cannot_set_a_reviewers_password(help_desk) -> None:  # type: ignore[no-untyped-def]
    reviewers = Group.objects.create(name="검토자")
    reviewers.permissions.add(permission("agents.change_approval"), permission("agents.view_approval"))
    reviewer = user_create(
        actor="t", via="tests", username="reviewer", password=PASSWORD, is_staff=True, groups=[reviewers]
    )
    client = logged_in(help_desk)
    assert client.get(f"/admin/auth/user/{reviewer.pk}/password/").status_code == 403
    assert set_password(client, reviewer) == 403
    assert User.objects.get(pk=reviewer.pk).check_password(PASSWORD)


@pytest.mark.parametrize("power", ["staff", "group", "permission"])
def test_a_help_desk_cannot_set_the_password_of_a_user_with_any_power(help_desk, power) -> None:  # type: ignore[no-untyped-def]
    user: Any = user_create(actor="t", via="tests", username="someone", password=PASSWORD, is_staff=power == "staff")
    if power == "group":
        user.groups.add(Group.objects.create(name="readers"))
    if power == "permission":
        user.user_permissions.add(permission("agents.view_run"))
    assert set_password(logged_in(help_desk), user) == 403
    assert User.objects.get(pk=user.pk).check_password(PASSWORD)


def test_a_help_desk_sets_its_own_password_and_that_of_a_user_with_no_power(help_desk) -> None:  # type: ignore[no-untyped-def]
    plain = user_create(actor="t", via="tests", username="plain", password=PASSWORD)
    client = logged_in(help_desk)
    assert set_password(client, plain) == 302
    assert User.objects.get(pk=plain.pk).check_password(NEW)
    assert set_password(client, help_desk) == 302
    assert User.objects.get(pk=help_desk.pk).check_password(NEW)


def test_a_superuser_sets_a_staff_users_password(admin_client) -> None:  # type: ignore[no-untyped-def]
    staff = user_create(actor="t", via="tests", username="staff", password=PASSWORD, is_staff=True)
    assert set_password(admin_client, staff) == 302
    assert User.objects.get(pk=staff.pk).check_password(NEW)
