"""A login lockout is counted, recorded and lifted under one spelling of its address or username.

1. ``manage.py unlock_login`` could not lift a lockout unless the address or username was typed exactly as stored:
   a dual-stack socket reports the IPv4 client 10.0.0.7 as ``::ffff:10.0.0.7``, the command read it as
   ``::ffff:a00:7`` (Python 3.11), and a Korean username typed decomposed (NFD) was not composed. It wrote "was not
   locked" on the record while the lockout stayed.
2. Behind a proxy that appends ``IP:port`` to ``X-Forwarded-For`` (Azure Application Gateway, IIS ARR) each attempt
   came from an address of its own (``203.0.113.5:40001``, ``:40002``…): the per-address lockout never started.
"""

from __future__ import annotations

import io
import logging
import unicodedata
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client

from agent_platform import client_ip as client_ip_module
from agent_platform.client_ip import client_ip
from audit import logins
from audit.management.commands import unlock_login
from audit.models import AuditEvent
from audit.roles import user_create

pytestmark = pytest.mark.django_db

PROXY = "10.0.0.2"  # a private address: a trusted proxy by default


def fail_logins(times: int, *, username: str = "nobody", **request: Any) -> None:
    client = Client()
    for attempt in range(times):
        client.post("/admin/login/", {"username": f"{username}{attempt}", "password": "wrong"}, **request)


def unlock(text: str, monkeypatch: pytest.MonkeyPatch) -> str:
    # The tests' cache is local to this process, which the command refuses (a web server's would be out of reach).
    monkeypatch.setattr(unlock_login, "cache_is_process_local", lambda: False)
    out = io.StringIO()
    call_command("unlock_login", text, stdout=out)
    return out.getvalue().strip()


@pytest.mark.parametrize("typed", ["10.0.0.7", "::ffff:10.0.0.7", "::ffff:a00:7", " ::FFFF:10.0.0.7 "])
def test_unlock_login_lifts_an_ipv4_client_a_dual_stack_socket_reported_however_it_is_typed(
    typed: str, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.PLATFORM_LOGIN_IP_MAX_FAILURES = 3
    fail_logins(3, REMOTE_ADDR="::ffff:10.0.0.7")
    assert logins.login_lockout_get(username=None, ip="::ffff:10.0.0.7") is not None

    assert unlock(typed, monkeypatch) == "address 10.0.0.7: lifted"

    assert logins.login_lockout_get(username=None, ip="::ffff:10.0.0.7") is None
    assert logins.login_lockout_get(username=None, ip="10.0.0.7") is None
    failed = AuditEvent.objects.filter(action=logins.FAILED_ACTION).values_list("args", flat=True)
    locked = AuditEvent.objects.get(action=logins.LOCKOUT_ACTION)
    lifted = AuditEvent.objects.get(action=logins.LIFT_ACTION)
    assert {args["ip"] for args in failed} == {"10.0.0.7"}
    assert locked.args["ip"] == lifted.args["ip"] == "10.0.0.7"
    assert lifted.result == {"was_locked": True}


def test_the_two_spellings_of_an_ipv4_client_share_one_count(settings: Any) -> None:
    settings.PLATFORM_LOGIN_IP_MAX_FAILURES = 4
    fail_logins(2, REMOTE_ADDR="::ffff:10.0.0.7")
    fail_logins(2, username="other", REMOTE_ADDR="10.0.0.7")

    assert logins.login_lockout_get(username=None, ip="10.0.0.7") is not None


def test_unlock_login_lifts_a_korean_username_typed_decomposed(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    settings.PLATFORM_LOGIN_MAX_FAILURES = 3
    user_create(actor="t", via="tests", username="감사자", password="pw-right-123456", is_staff=True)
    client = Client(REMOTE_ADDR="198.51.100.4")
    for _attempt in range(3):
        client.post("/admin/login/", {"username": "감사자", "password": "wrong"})
    assert logins.login_lockout_get(username="감사자", ip="unknown") is not None

    assert unlock(unicodedata.normalize("NFD", " 감사자 "), monkeypatch) == "username 감사자: lifted"

    assert logins.login_lockout_get(username="감사자", ip="unknown") is None
    lifted = AuditEvent.objects.get(action=logins.LIFT_ACTION)
    assert lifted.args == {"user": "감사자"}
    assert lifted.result == {"was_locked": True}


def test_a_username_typed_decomposed_counts_with_the_composed_one(settings: Any) -> None:
    settings.PLATFORM_LOGIN_MAX_FAILURES = 2
    decomposed = unicodedata.normalize("NFD", "감사자")
    for username in ("감사자", decomposed):
        logins.password_check_throttled(username=username, ip="unknown", path="/", check=lambda: False)

    assert logins.login_lockout_get(username=decomposed, ip="unknown") is not None
    assert logins.login_subject_parse(decomposed) == ("user", "감사자")


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ("203.0.113.5:40001", "203.0.113.5"),
        ("[2001:db8::1]:443", "2001:db8::1"),
        ("[2001:DB8::1]", "2001:db8::1"),
        ("2001:DB8:0::1", "2001:db8::1"),
        ("::ffff:a00:7", "::ffff:10.0.0.7"),  # kept mapped: /metrics' allowlist tells the forms apart
    ],
)
def test_a_forwarded_address_is_read_without_the_port_a_proxy_appended(
    entry: str, expected: str, settings: Any
) -> None:
    settings.PLATFORM_PROXY_HOPS = 1

    assert client_ip({"REMOTE_ADDR": PROXY, "HTTP_X_FORWARDED_FOR": f"6.6.6.6, {entry}"}) == expected


def test_a_forwarded_entry_that_is_no_address_is_never_a_clients_identity(
    settings: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    settings.PLATFORM_PROXY_HOPS = 1
    monkeypatch.setattr(client_ip_module, "_unreadable_entry_logged", False, raising=False)

    with caplog.at_level(logging.WARNING, logger="agent_platform.client_ip"):
        for entry in ("unknown", "Robert'); DROP TABLE", "1.2.3.4:port", "::ffff:1.2.3.4:5555"):
            assert client_ip({"REMOTE_ADDR": PROXY, "HTTP_X_FORWARDED_FOR": entry}) == PROXY

    assert [record.levelno for record in caplog.records] == [logging.WARNING]  # once
    assert "'unknown'" in caplog.records[0].getMessage()


def test_an_address_is_spelled_one_way() -> None:
    from agent_platform.client_ip import ip_canonical  # here: the module's other tests run on the old code too

    assert ip_canonical(" ::ffff:10.0.0.7") == "10.0.0.7"
    assert ip_canonical("2001:DB8:0::1") == "2001:db8::1"
    assert ip_canonical("admin") is None


def test_the_per_address_lockout_starts_behind_a_proxy_that_appends_the_port(settings: Any) -> None:
    settings.PLATFORM_PROXY_HOPS = 1
    settings.PLATFORM_LOGIN_IP_MAX_FAILURES = 5
    client = Client(REMOTE_ADDR=PROXY)
    for attempt in range(6):
        client.post(
            "/admin/login/",
            {"username": f"user{attempt}", "password": "wrong"},
            HTTP_X_FORWARDED_FOR=f"203.0.113.5:{40000 + attempt}",
        )

    lockout = logins.login_lockout_get(username=None, ip="203.0.113.5")
    assert lockout is not None
    assert AuditEvent.objects.get(action=logins.LOCKOUT_ACTION).args["ip"] == "203.0.113.5"
    failed = AuditEvent.objects.filter(action=logins.FAILED_ACTION).values_list("args", flat=True)
    assert {args["ip"] for args in failed} == {"203.0.113.5"}
