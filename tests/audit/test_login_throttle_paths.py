"""Password checks the login lockout let through (review defects of ``audit/logins.py`` and the admin's own
password page):

4. a burst of concurrent guesses got a password check each: the lockout was checked, then the hash, and only then
   the failure counted, so 16 guesses at once at one username (limit 5) were 16 checks;
5. ``/admin/password_change/`` checked the old password with Django's own form: neither throttled nor written
   down (12 wrong old passwords, then the right one, changed it with no ``security.login_failed`` event).
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import PermissionDenied
from django.test import Client, RequestFactory

from audit import logins
from audit.models import AuditEvent
from audit.roles import user_create
from tests.conftest import logged_in

pytestmark = pytest.mark.django_db
User = get_user_model()
OLD, NEW = "old-Passw0rd-for-tests", "new-Passw0rd-for-tests"
GUESSES = 16


def test_a_burst_of_guesses_at_once_gets_no_more_password_checks_than_the_lockout_allows(
    admin_user: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The interleaving patched in: each password check is still running when the next guess arrives, so all 16
    are in flight at once, as 16 threads are."""
    backend = logins.LockoutModelBackend()
    request = RequestFactory().post("/admin/login/", REMOTE_ADDR="203.0.113.9")
    checks: list[int] = []
    refused: list[int] = []
    started = [0]

    def next_guess() -> None:
        if started[0] == GUESSES:
            return
        started[0] += 1
        try:
            backend.authenticate(request, username="admin", password=f"guess-{started[0]}")
        except PermissionDenied:
            refused.append(started[0])
            next_guess()

    def slow_check(self: Any, *args: Any, **kwargs: Any) -> None:
        checks.append(started[0])
        next_guess()  # the next guess arrives while this one's hash is being computed
        return None  # a wrong password

    monkeypatch.setattr(ModelBackend, "authenticate", slow_check)
    next_guess()

    assert len(checks) == 5  # was 16
    assert len(refused) == GUESSES - 5
    assert AuditEvent.objects.filter(action=logins.FAILED_ACTION).count() == 5
    assert AuditEvent.objects.filter(action=logins.LOCKOUT_ACTION).count() == 1
    assert logins.login_lockout_get(username="admin", ip="198.51.100.1") is not None


def test_a_right_password_among_a_burst_gives_its_place_back(admin_user: Any) -> None:
    """A success is no failure: it clears the username's count and takes itself off the address's."""
    backend = logins.LockoutModelBackend()
    request = RequestFactory().post("/admin/login/", REMOTE_ADDR="203.0.113.9")
    for _attempt in range(4):
        assert backend.authenticate(request, username="admin", password="wrong") is None
    assert backend.authenticate(request, username="admin", password="password") is not None
    for _attempt in range(4):
        assert backend.authenticate(request, username="admin", password="wrong") is None
    assert backend.authenticate(request, username="admin", password="password") is not None
    assert logins.login_lockout_get(username="admin", ip="203.0.113.9") is None


def _own_password_change(client: Client, old: str) -> Any:
    return client.post(
        "/admin/password_change/",
        {"old_password": old, "new_password1": NEW, "new_password2": NEW},
        REMOTE_ADDR="203.0.113.9",
    )


def test_wrong_old_passwords_on_the_own_password_page_are_throttled_and_written_down() -> None:
    user = user_create(actor="t", via="tests", username="hana", password=OLD, is_staff=True)
    client = logged_in(user)
    for _attempt in range(12):
        _own_password_change(client, "wrong")
    response = _own_password_change(client, OLD)

    assert response.status_code == 200  # the form again: the right old password is refused while locked
    assert "Too many failed logins" in response.content.decode()
    assert User.objects.get(pk=user.pk).check_password(OLD)  # was changed, with no event
    failed = AuditEvent.objects.filter(action=logins.FAILED_ACTION).order_by("id")
    assert [(e.args["user"], e.args["path"], e.reason) for e in failed] == [
        ("hana", "/admin/password_change/", "login:failed:password")
    ] * 5
    assert AuditEvent.objects.filter(action=logins.LOCKOUT_ACTION).count() == 1
    assert not AuditEvent.objects.filter(action="config.user.password_change").exists()
    korean = client.post(
        "/admin/password_change/",
        {"old_password": OLD, "new_password1": NEW, "new_password2": NEW},
        REMOTE_ADDR="203.0.113.9",
        HTTP_ACCEPT_LANGUAGE="ko",
    )
    assert "로그인 실패가 너무 많습니다" in korean.content.decode()


def test_the_own_password_page_still_changes_a_password_with_the_right_old_one() -> None:
    user = user_create(actor="t", via="tests", username="yuna", password=OLD, is_staff=True)
    client = logged_in(user)
    wrong = _own_password_change(client, "wrong")
    assert wrong.status_code == 200 and "Your old password was entered incorrectly" in wrong.content.decode()
    response = _own_password_change(client, OLD)
    assert response.status_code == 302 and response["Location"] == "/admin/password_change/done/"
    assert User.objects.get(pk=user.pk).check_password(NEW)
    assert logins.login_lockout_get(username="yuna", ip="203.0.113.9") is None
