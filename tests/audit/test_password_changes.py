"""A password change is recorded, whoever makes it (``config.user.password_change``: the user named, never the
password or a hash); a re-hash of the same password (a login under a newer hasher) and a login are not changes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from audit.models import AuditEvent
from audit.roles import user_create

pytestmark = pytest.mark.django_db

OLD, NEW = "old-Passw0rd-for-tests", "new-Passw0rd-for-tests"


def changes(user: Any) -> list[tuple[str, str, dict[str, Any]]]:
    rows = AuditEvent.objects.filter(action="config.user.password_change", result__id=user.pk).order_by("seq")
    return [(e.actor, e.result["via"], e.args) for e in rows]


def test_an_admin_changing_a_password_on_its_page_is_recorded_with_the_admin_as_actor(admin_client: Client) -> None:
    user = user_create(actor="t", via="tests", username="mina", password=OLD)
    response = admin_client.post(
        f"/admin/auth/user/{user.pk}/password/", {"password1": NEW, "password2": NEW, "usable_password": "true"}
    )
    assert response.status_code == 302, response.content.decode()[:1000]
    assert changes(user) == [("admin", "admin", {})]
    user.refresh_from_db()
    stored = json.dumps(list(AuditEvent.objects.values("args", "result")), default=str)
    assert NEW not in stored and user.password not in stored


def test_a_password_set_outside_a_service_is_recorded_unattributed() -> None:
    user = user_create(actor="t", via="tests", username="jun", password=OLD)
    user.set_password(NEW)
    user.save()
    assert changes(user) == [("system:unattributed", "django", {})]


def test_the_same_password_hashed_again_or_a_login_is_no_change(client: Client) -> None:
    user = user_create(actor="t", via="tests", username="seo", password=OLD)
    user.set_password(OLD)  # as Django does when a login finds an outdated hash
    user.save(update_fields=["password"])
    assert client.login(username="seo", password=OLD)
    assert changes(user) == []


def test_an_admin_changing_their_own_password_is_recorded_with_them_as_actor(client: Client) -> None:
    user = user_create(actor="t", via="tests", username="hana", password=OLD, is_staff=True)
    client.force_login(user)
    response = client.post("/admin/password_change/", {"old_password": OLD, "new_password1": NEW, "new_password2": NEW})
    assert response.status_code == 302, response.content.decode()[:1000]
    assert changes(user) == [("hana", "admin", {})]


def test_the_own_password_page_still_needs_an_admin_login(client: Client) -> None:
    response = client.get("/admin/password_change/")
    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")
