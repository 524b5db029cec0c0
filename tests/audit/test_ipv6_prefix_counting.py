"""An IPv6 client is counted and locked by its /64, not by each address in it.

One host normally holds a whole /64 and may take a new address in it for every request. Counted per address, 199
unknown API keys from 199 addresses of one /64 (``PLATFORM_API_BAD_KEY_RATE=5/15min``) were 199 × 401 and never a
429, and 100 wrong admin passwords from 100 addresses of one /64 started no address lockout and wrote 100
``security.login_failed`` events (a lockout is what bounds what guessing adds to the record). IPv4 is counted per
address as before; an IPv4-mapped address as its IPv4.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from audit import logins
from audit.management.commands import unlock_login
from audit.models import AuditEvent
from tests.e2e.harness import redis_server

pytestmark = pytest.mark.django_db

RUNS = "/api/v1/runs"
PREFIX = "2001:db8:1:2::/64"


def in_prefix(host: int) -> str:
    return f"2001:db8:1:2::{host:x}"


def fail_logins(addresses: list[str]) -> None:
    client = Client()
    for attempt, address in enumerate(addresses):
        client.post("/admin/login/", {"username": f"user{attempt}", "password": "wrong"}, REMOTE_ADDR=address)


def unlock(text: str) -> str:
    out = io.StringIO()
    call_command("unlock_login", text, stdout=out)
    return out.getvalue().strip()


@pytest.fixture
def lockouts_reachable(monkeypatch: pytest.MonkeyPatch) -> None:
    # The tests' cache is local to this process, which the command refuses (a web server's would be out of reach).
    monkeypatch.setattr(unlock_login, "cache_is_process_local", lambda: False)


@pytest.mark.parametrize(
    ("text", "subject"),
    [
        ("2001:db8:1:2::5", PREFIX),
        (" 2001:DB8:1:2:ffff:ffff:ffff:ffff ", PREFIX),
        (PREFIX, PREFIX),
        ("2001:db8:1:2::5/64", PREFIX),  # the host part set: the same /64
        ("fe80::1%eth0", "fe80::/64"),  # a scope is no part of the network
        ("203.0.113.5", "203.0.113.5"),
        ("::ffff:10.0.0.7", "10.0.0.7"),
        ("2001:db8::/48", None),  # no lockout is kept under another prefix length
        ("10.0.0.0/8", None),
        ("admin", None),
    ],
)
def test_an_ipv6_client_is_its_64_and_an_ipv4_client_its_address(text: str, subject: str | None) -> None:
    from agent_platform.client_ip import ip_subject  # here: the module's other tests run on the old code too

    assert ip_subject(text) == subject


def test_unknown_keys_from_many_addresses_of_one_64_are_throttled_together(api_caller: Any, settings: Any) -> None:
    settings.PLATFORM_API_BAD_KEY_RATE = "5/15min"
    client = Client()
    statuses = [
        client.get(RUNS, HTTP_AUTHORIZATION=f"Bearer guess-{host}", REMOTE_ADDR=in_prefix(host)).status_code
        for host in range(1, 6)
    ]
    assert statuses == [401] * 5

    refused = client.get(RUNS, HTTP_AUTHORIZATION=f"Bearer {api_caller.raw_key}", REMOTE_ADDR=in_prefix(99))
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "throttled"
    # The next /64 is another client, counted apart.
    assert client.get(RUNS, HTTP_AUTHORIZATION="Bearer guess", REMOTE_ADDR="2001:db8:1:3::1").status_code == 401


@pytest.mark.slow
def test_wrong_passwords_from_many_addresses_of_one_64_lock_it_and_stop_the_record(settings: Any) -> None:
    settings.PLATFORM_LOGIN_IP_MAX_FAILURES = 5
    fail_logins([in_prefix(host) for host in range(1, 101)])

    failed = AuditEvent.objects.filter(action=logins.FAILED_ACTION).values_list("args", flat=True)
    assert sorted(args["ip"] for args in failed) == sorted(in_prefix(host) for host in range(1, 6))  # as they came
    locked = AuditEvent.objects.get(action=logins.LOCKOUT_ACTION)
    assert locked.args["ip"] == PREFIX
    lockout = logins.login_lockout_get(username=None, ip=in_prefix(0xBEEF))
    assert lockout is not None and lockout.value == PREFIX
    assert logins.login_lockout_get(username=None, ip="2001:db8:1:3::1") is None


def test_an_ipv4_client_is_still_counted_by_its_address(settings: Any) -> None:
    settings.PLATFORM_LOGIN_IP_MAX_FAILURES = 3
    fail_logins(["203.0.113.1", "203.0.113.2", "203.0.113.3"])

    assert logins.login_lockout_get(username=None, ip="203.0.113.1") is None
    assert not AuditEvent.objects.filter(action=logins.LOCKOUT_ACTION).exists()


@pytest.mark.parametrize("typed", [PREFIX, "2001:db8:1:2::ffff", " 2001:DB8:1:2::5/64 "])
def test_unlock_login_lifts_a_64_named_as_it_is_or_by_an_address_inside_it(
    typed: str, settings: Any, lockouts_reachable: None
) -> None:
    settings.PLATFORM_LOGIN_IP_MAX_FAILURES = 3
    fail_logins([in_prefix(host) for host in range(1, 4)])
    assert logins.login_lockout_get(username=None, ip=in_prefix(1)) is not None

    assert unlock(typed) == f"network {PREFIX}: lifted"

    assert logins.login_lockout_get(username=None, ip=in_prefix(1)) is None
    lifted = AuditEvent.objects.get(action=logins.LIFT_ACTION)
    assert lifted.args == {"ip": PREFIX}
    assert lifted.result == {"was_locked": True}


@pytest.mark.parametrize("typed", ["2001:db8::/48", "10.0.0.0/8"])
def test_unlock_login_refuses_a_network_no_lockout_is_kept_under(typed: str, lockouts_reachable: None) -> None:
    with pytest.raises(CommandError, match="per IPv6 /64"):
        unlock(typed)

    assert not AuditEvent.objects.filter(action=logins.LIFT_ACTION).exists()


# ---- on a real Redis, as every web process and the command share it ------------------------------------------


@pytest.fixture
def redis_cache(settings: Any, tmp_path: Path) -> Iterator[None]:
    with redis_server(tmp_path) as url:
        settings.CACHES = {"default": {"BACKEND": "agent_platform.redis_cache.RedisCache", "LOCATION": url}}
        yield


@pytest.mark.redis
@pytest.mark.slow
def test_on_redis_a_64_is_throttled_locked_and_lifted_as_one_client(
    redis_cache: None, api_caller: Any, settings: Any
) -> None:
    settings.PLATFORM_API_BAD_KEY_RATE = "3/15min"
    settings.PLATFORM_LOGIN_IP_MAX_FAILURES = 3
    client = Client()
    for host in range(1, 4):
        client.get(RUNS, HTTP_AUTHORIZATION=f"Bearer guess-{host}", REMOTE_ADDR=in_prefix(host))
    assert client.get(RUNS, HTTP_AUTHORIZATION="Bearer guess", REMOTE_ADDR=in_prefix(4)).status_code == 429
    fail_logins([in_prefix(host) for host in range(1, 4)])
    assert logins.login_lockout_get(username=None, ip=in_prefix(4)) is not None

    assert unlock(in_prefix(4)) == f"network {PREFIX}: lifted"  # no stand-in: the command reaches Redis

    assert logins.login_lockout_get(username=None, ip=in_prefix(1)) is None
