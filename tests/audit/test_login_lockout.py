"""Brute force on passwords: the admin's login and HTTP Basic on the audit API are throttled per username and per
client address; a lockout refuses even the right password, says so plainly, is audited, and an admin lifts it."""

from __future__ import annotations

import base64
import io

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from agent_platform.client_ip import client_ip
from audit import logins
from audit.management.commands import unlock_login
from audit.models import AuditEvent
from tests.conftest import AUDITOR_PASSWORD

# Marked slow: out of the fast loop (several seconds of real servers, processes or timeouts per test); the full
# suite runs it.
pytestmark = [pytest.mark.django_db, pytest.mark.slow]

AUDIT_URL = "/api/v1/audit/events"


def admin_login(client: Client, username: str, password: str, ip: str = "203.0.113.9"):  # type: ignore[no-untyped-def]
    return client.post("/admin/login/?next=/admin/", {"username": username, "password": password}, REMOTE_ADDR=ip)


def basic(username: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()


def test_sixty_wrong_admin_passwords_then_the_right_one_does_not_log_in(admin_user) -> None:
    client = Client()
    for _attempt in range(60):
        admin_login(client, "admin", "wrong")
    response = admin_login(client, "admin", "password")
    assert response.status_code == 200  # the form again, not the redirect of a login
    assert "_auth_user_id" not in client.session
    assert "Too many failed logins" in response.content.decode()


def test_the_fifth_failure_locks_the_username_and_the_form_says_so(admin_user) -> None:
    client = Client()
    for _attempt in range(4):
        assert "Too many" not in admin_login(client, "admin", "wrong").content.decode()
    assert "Too many failed logins" in admin_login(client, "admin", "wrong").content.decode()


def test_a_lockout_is_audited_once(admin_user) -> None:
    client = Client()
    for _attempt in range(8):
        admin_login(client, "admin", "wrong")
    events = AuditEvent.objects.filter(action=logins.LOCKOUT_ACTION)
    assert events.count() == 1
    event = events.get()
    assert event.source == "admin"
    assert event.args["user"] == "admin"
    assert event.ok is False
    assert "wrong" not in str(event.args)


def test_the_username_lock_holds_from_another_address(admin_user) -> None:
    client = Client()
    for _attempt in range(5):
        admin_login(client, "admin", "wrong", ip="203.0.113.9")
    admin_login(client, "admin", "password", ip="198.51.100.4")
    assert "_auth_user_id" not in client.session


def test_one_address_guessing_many_usernames_is_locked(admin_user, settings) -> None:
    settings.PLATFORM_LOGIN_IP_MAX_FAILURES = 10
    client = Client()
    for number in range(10):
        admin_login(client, f"user{number}", "wrong", ip="192.0.2.50")
    admin_login(client, "admin", "password", ip="192.0.2.50")
    assert "_auth_user_id" not in client.session
    admin_login(client, "admin", "password", ip="192.0.2.51")
    assert "_auth_user_id" in client.session


def test_a_successful_login_clears_the_usernames_count(admin_user) -> None:
    client = Client()
    for _attempt in range(4):
        admin_login(client, "admin", "wrong")
    admin_login(client, "admin", "password")
    assert "_auth_user_id" in client.session
    other = Client()
    for _attempt in range(4):
        admin_login(other, "admin", "wrong")
    admin_login(other, "admin", "password")
    assert "_auth_user_id" in other.session


def test_a_lockout_ends_when_the_lockout_time_has_passed(admin_user, monkeypatch) -> None:
    client = Client()
    for _attempt in range(5):
        admin_login(client, "admin", "wrong")
    now = logins.time.time()
    monkeypatch.setattr(logins.time, "time", lambda: now + 901)
    admin_login(client, "admin", "password")
    assert "_auth_user_id" in client.session


def test_a_hundred_wrong_basic_passwords_then_the_right_one_is_a_429(auditor_user) -> None:
    client = Client()
    statuses = {client.get(AUDIT_URL, HTTP_AUTHORIZATION=basic("audrey", "wrong")).status_code for _ in range(100)}
    assert statuses == {401, 429}
    response = client.get(AUDIT_URL, HTTP_AUTHORIZATION=basic("audrey", AUDITOR_PASSWORD))
    assert response.status_code == 429
    assert response.json()["error"]["code"] == "login_locked"
    assert 1 <= int(response["Retry-After"]) <= 900


def test_basic_auth_and_the_admin_login_share_one_count(auditor_user) -> None:
    client = Client()
    for _attempt in range(3):
        client.get(AUDIT_URL, HTTP_AUTHORIZATION=basic("audrey", "wrong"), REMOTE_ADDR="203.0.113.9")
    for _attempt in range(2):
        admin_login(client, "audrey", "wrong")
    response = client.get(AUDIT_URL, HTTP_AUTHORIZATION=basic("audrey", AUDITOR_PASSWORD))
    assert response.status_code == 429


def test_lifting_a_lockout_lets_the_right_password_in_and_is_audited(admin_user) -> None:
    client = Client()
    for _attempt in range(5):
        admin_login(client, "admin", "wrong")
    assert logins.login_lockout_lift(user_or_ip="admin", actor="admin") is True
    admin_login(client, "admin", "password")
    assert "_auth_user_id" in client.session
    lift = AuditEvent.objects.get(action=logins.LIFT_ACTION)
    assert (lift.actor, lift.args, lift.result) == ("admin", {"user": "admin"}, {"was_locked": True})


def test_unlock_login_lifts_an_address(admin_user, settings, monkeypatch) -> None:
    monkeypatch.setattr(unlock_login, "cache_is_process_local", lambda: False)
    settings.PLATFORM_LOGIN_IP_MAX_FAILURES = 3
    client = Client()
    for number in range(3):
        admin_login(client, f"nobody{number}", "wrong", ip="192.0.2.7")
    out = io.StringIO()
    call_command("unlock_login", "192.0.2.7", stdout=out)
    assert out.getvalue().strip() == "address 192.0.2.7: lifted"
    admin_login(client, "admin", "password", ip="192.0.2.7")
    assert "_auth_user_id" in client.session
    assert AuditEvent.objects.get(action=logins.LIFT_ACTION).actor == "system:unlock_login"


def test_unlock_login_refuses_when_the_cache_is_local_to_each_process() -> None:
    with pytest.raises(CommandError, match="REDIS_URL"):
        call_command("unlock_login", "admin", stdout=io.StringIO())


def test_a_cache_outage_fails_open(admin_user, monkeypatch) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise ConnectionError("redis is down")

    monkeypatch.setattr(logins.cache, "get", broken)
    monkeypatch.setattr(logins.cache, "add", broken)
    client = Client()
    admin_login(client, "admin", "wrong")
    admin_login(client, "admin", "password")
    assert "_auth_user_id" in client.session


def test_only_trusted_proxy_hops_decide_the_address(settings) -> None:
    meta = {"REMOTE_ADDR": "10.0.0.1", "HTTP_X_FORWARDED_FOR": "6.6.6.6, 198.51.100.7"}
    assert client_ip(meta) == "10.0.0.1"
    settings.PLATFORM_PROXY_HOPS = 1
    assert client_ip(meta) == "198.51.100.7"


def test_sign_ins_sign_outs_and_wrong_passwords_are_on_the_record(admin_user, auditor_user) -> None:
    client = Client()
    admin_login(client, "admin", "wrong")
    admin_login(client, "hunter2-typed-here", "x")  # a password typed into the username field
    client.get(AUDIT_URL, HTTP_AUTHORIZATION=basic("audrey", "nope"))
    failed = list(AuditEvent.objects.filter(action=logins.FAILED_ACTION).order_by("id"))
    assert [(event.args["user"], event.reason, event.ok) for event in failed] == [
        ("admin", "login:failed:password", False),
        (None, "login:failed:unknown_user", False),
        ("audrey", "login:failed:password", False),
    ]
    assert failed[0].args["ip"] == "203.0.113.9"
    assert failed[0].args["path"] == "/admin/login/"
    assert failed[2].args["path"] == AUDIT_URL
    assert "hunter2" not in str([event.args for event in failed])
    assert "wrong" not in str([event.args for event in failed])

    admin_login(client, "admin", "password")
    assert "_auth_user_id" in client.session
    login = AuditEvent.objects.get(action=logins.LOGIN_ACTION)
    assert (login.actor, login.args, login.ok) == ("admin:admin", {"ip": "203.0.113.9"}, True)

    client.post("/admin/logout/", REMOTE_ADDR="203.0.113.9")
    assert "_auth_user_id" not in client.session
    logout = AuditEvent.objects.get(action=logins.LOGOUT_ACTION)
    assert (logout.actor, logout.args) == ("admin:admin", {"ip": "203.0.113.9"})


def test_a_locked_login_is_not_written_down_again(admin_user) -> None:
    client = Client()
    for _attempt in range(12):
        admin_login(client, "admin", "wrong")
    # five wrong passwords, then the lockout (one event); the seven refused before their check are not counted
    assert AuditEvent.objects.filter(action=logins.FAILED_ACTION).count() == 5
    assert AuditEvent.objects.filter(action=logins.LOCKOUT_ACTION).count() == 1


def test_a_sign_in_lasts_a_working_day_not_two_weeks(admin_user) -> None:
    client = Client()
    admin_login(client, "admin", "password")
    assert client.session.get_expiry_age() == 8 * 3600
    assert client.cookies["sessionid"]["max-age"] == 8 * 3600


def test_a_password_typed_as_the_username_never_reaches_the_record(admin_user) -> None:
    client = Client()
    typed = "Tr0ub4dor&3-horse"
    for _attempt in range(5):
        admin_login(client, typed, "x")
    logins.login_lockout_lift(user_or_ip=typed, actor="admin:admin")
    assert AuditEvent.objects.filter(action=logins.LOCKOUT_ACTION).get().args["user"] is None
    assert AuditEvent.objects.filter(action=logins.LIFT_ACTION).get().args["user"] is None
    record = str(list(AuditEvent.objects.values("args", "result", "reason", "actor")))
    assert typed.casefold() not in record.casefold()


@pytest.mark.parametrize("fields", [{"username": "admin", "password": ""}, {"username": "", "password": "x"}])
def test_a_sign_in_with_an_empty_field_shows_the_form_again(admin_user, fields) -> None:
    client = Client(raise_request_exception=False)
    response = client.post("/admin/login/?next=/admin/", fields)
    assert response.status_code == 200 and "This field is required" in response.content.decode()
    assert not AuditEvent.objects.filter(action=logins.LOGIN_ACTION).exists()


def test_the_lockout_names_unlock_login_only_where_it_can_lift_it(auditor_user, settings) -> None:
    """``unlock_login`` reaches a shared cache only: on the embedded default (each process's own) it refuses, so the
    refused caller is not told to have it run."""
    client = Client()
    for _ in range(5):
        response = client.get("/api/v1/audit/events", HTTP_AUTHORIZATION=basic(auditor_user.username, "wrong"))
    assert response.status_code == 429
    message = response.json()["error"]["message"]
    assert "unlock_login" not in message and "restarting the web server" in message
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.dummy.DummyCache"}}  # a shared one's kind
    assert "manage.py unlock_login" in logins.Lockout(subject="user", value="x", retry_after_s=60).message()
