"""Password logins are throttled: per username and per client address, in Django's cache (Redis in a deployment
with ``REDIS_URL``, so every web process shares the counts).

Every password check goes through :func:`password_check_throttled`: the admin's login form and HTTP Basic on the
audit API (``LockoutModelBackend``, ``AUTHENTICATION_BACKENDS``) and the old password on the admin's own password
page alike. A failure counts once for the username and once for the address, in a window of
``PLATFORM_LOGIN_WINDOW_S`` that starts with the first failure; an attempt is counted before its password is
checked (and given back if the password was right), so that guesses sent at once get no more checks than guesses
sent one by one. Reaching ``PLATFORM_LOGIN_MAX_FAILURES`` for a username (``PLATFORM_LOGIN_IP_MAX_FAILURES`` for an
address) locks it for ``PLATFORM_LOGIN_LOCKOUT_S``: every login of that username, or from that address, is then
refused *before the password is checked* — the right password too, so a locked account tells a guesser nothing.
The lockout is written to the audit record once (``security.lockout``); lifting it early (``login_lockout_lift``,
``manage.py unlock_login``) is audited too (``security.lockout_lift``). A successful login clears the username's
count (not the address's: one good account must not reset a guesser's count for others).

A username and an address are each counted, locked, recorded and lifted under one spelling, however they were
typed or arrived: a username stripped, casefolded and composed (NFC: Korean typed on macOS comes decomposed), an
address as ``ipaddress`` reads it, an IPv4-mapped one as its IPv4 (``agent_platform.client_ip.ip_canonical``).
An IPv6 client is counted and locked by its /64 (``agent_platform.client_ip.ip_subject``): one host normally
holds a whole /64 and may take a new address in it for each attempt, so that counting each address let one
guesser past the address limit (and onto the record) without end. Its wrong passwords are recorded with the
address they came from; its lockout names the /64, which ``unlock_login`` lifts by the /64 or any address in it.
Counts and lockouts written under an older spelling (before this rule) are no longer consulted: they lapse with
their window or lockout, minutes.

Who signed in, and who tried, is on the record too: every wrong password (the admin's form, Basic auth, the old
password on the own password page) is a
``security.login_failed`` event with the address and the path it came to; its username only when such a user
exists (a mistyped password in the username field is not written down); a sign-in through the admin's form is
``security.login`` and a sign-out ``security.logout``, by ``admin:<username>``. A refused login of a locked
username or address is not counted again (the lockout's event stands for them).

Trade-off, stated: locking by username lets anyone lock an admin out for the lockout's length; an admin lifts it
with ``unlock_login``. A cache outage fails open (logins work, unthrottled, and it is logged), like the API's
rate limits: an outage of Redis must not lock everyone out.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal, TypeVar

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.core.cache import cache, caches
from django.core.cache.backends.locmem import LocMemCache
from django.core.exceptions import PermissionDenied
from django.utils.translation import gettext as _

from agent_platform.client_ip import client_ip, ip_canonical, ip_subject
from agent_platform.text import nfc
from audit.services import audit_event_record

logger = logging.getLogger(__name__)

Subject = Literal["user", "ip"]
T = TypeVar("T")
LOCKOUT_ACTION = "security.lockout"
LIFT_ACTION = "security.lockout_lift"
LOGIN_ACTION = "security.login"
LOGOUT_ACTION = "security.logout"
FAILED_ACTION = "security.login_failed"
GUARD_ACTOR = "system:login_guard"


def cache_is_process_local() -> bool:
    """Whether the default cache lives in each process's memory (then no other process can see its entries, and
    ``unlock_login`` cannot reach the web server's lockouts)."""
    return isinstance(caches["default"], LocMemCache)


@dataclass(frozen=True)
class Lockout:
    """A username or address that may not log in for ``retry_after_s`` more seconds."""

    subject: Subject
    value: str
    retry_after_s: int

    def message(self) -> str:
        """What the refused caller reads: who can lift it, where someone can (``unlock_login`` reaches a shared
        cache only: on the embedded default, each process's own, it refuses, and the message said to use it)."""
        minutes = max(1, math.ceil(self.retry_after_s / 60))
        if cache_is_process_local():
            return _(
                "Too many failed logins. Logins are refused for about %(minutes)d more minutes; "
                "an administrator can lift this by restarting the web server."
            ) % {"minutes": minutes}
        return _(
            "Too many failed logins. Logins are refused for about %(minutes)d more minutes; "
            "an administrator can lift this (manage.py unlock_login)."
        ) % {"minutes": minutes}


def _normalized_username(username: str) -> str:
    """A username as the lockouts compare it: stripped, casefolded, composed (NFC; casefolding may decompose)."""
    return nfc(nfc(username.strip()).casefold())[:150]


def _normalized_ip(ip: str) -> str:
    """An address as the record writes it (``ip_canonical``); text that is no address as it is."""
    return ip_canonical(ip) or ip


def _ip_subject(ip: str) -> str:
    """The client an address is counted and locked as (``ip_subject``: an IPv6 address's /64); text that is no
    address as it is."""
    return ip_subject(ip) or ip


def _key(kind: Literal["fail", "lock"], subject: Subject, value: str) -> str:
    # A digest: usernames are arbitrary text, and cache keys (memcached's) may not be.
    digest = hashlib.sha256(f"{subject}:{value}".encode()).hexdigest()[:40]
    return f"login:{kind}:{subject}:{digest}"


def _subjects(username: str | None, ip: str) -> list[tuple[Subject, str]]:
    found: list[tuple[Subject, str]] = []
    if username:
        found.append(("user", _normalized_username(username)))
    if ip and ip != "unknown":
        found.append(("ip", _ip_subject(ip)))
    return found


def login_lockout_get(*, username: str | None, ip: str) -> Lockout | None:
    """The lockout that refuses this login now (the username's first), or None."""
    try:
        for subject, value in _subjects(username, ip):
            until = cache.get(_key("lock", subject, value))
            if until is not None and float(until) > time.time():
                return Lockout(
                    subject=subject, value=value, retry_after_s=max(1, math.ceil(float(until) - time.time()))
                )
    except Exception:
        logger.warning("login lockout cache unavailable; login not throttled", exc_info=True)
    return None


def _recorded_subject(subject: Subject, value: str) -> str | None:
    """What the record says of a login's subject: an address (an IPv6 client's /64) as it is, a username only when
    such a user exists (compared as the lockouts compare them, case aside): a password typed into the username
    field is never written down."""
    if subject == "ip":
        return value
    model = get_user_model()
    known = model._default_manager.filter(**{f"{model.USERNAME_FIELD}__iexact": value}).exists()
    return value if known else None


def login_failed_audit(*, username: str | None, ip: str, path: str) -> None:
    """Write one wrong password down (``security.login_failed``). The username only when such a user exists."""
    model = get_user_model()
    known = bool(username) and model._default_manager.filter(**{model.USERNAME_FIELD: username}).exists()
    audit_event_record(
        source="admin",
        action=FAILED_ACTION,
        tool="login",
        args={"user": username if known else None, "ip": _normalized_ip(ip), "path": path[:200]},
        ok=False,
        reason="login:failed:password" if known else "login:failed:unknown_user",
        actor=GUARD_ACTOR,
    )


def login_audit(*, user: Any, ip: str, action: str) -> None:
    """A sign-in (``security.login``) or sign-out (``security.logout``) of a person, on the record, its address
    spelled as the lockouts spell it."""
    audit_event_record(
        source="admin",
        action=action,
        tool="login",
        args={"ip": _normalized_ip(ip)},
        actor=f"admin:{user.get_username()}",
    )


def logout_record(*, request: Any, user: Any, **_kwargs: Any) -> None:
    """``user_logged_out``'s receiver: a sign-out on the record (none when nobody was signed in)."""
    if user is not None:
        ip = client_ip(request.META) if request is not None else "unknown"
        login_audit(user=user, ip=ip, action=LOGOUT_ACTION)


def _limits() -> dict[Subject, int]:
    return {
        "user": int(settings.PLATFORM_LOGIN_MAX_FAILURES),
        "ip": int(settings.PLATFORM_LOGIN_IP_MAX_FAILURES),
    }


def _reserve(subjects: list[tuple[Subject, str]]) -> dict[tuple[Subject, str], int] | None:
    """Count one attempt for each subject before its password is checked: each subject's count with it, or None
    where a count went past its limit (the attempts already failed or still being checked fill the allowance; this
    one's counts are given back). A cache outage counts nothing (empty: the check goes ahead, unthrottled)."""
    window_s = int(settings.PLATFORM_LOGIN_WINDOW_S)
    limits = _limits()
    counts: dict[tuple[Subject, str], int] = {}
    try:
        for subject, value in subjects:
            fail_key = _key("fail", subject, value)
            cache.add(fail_key, 0, timeout=window_s)
            try:
                counts[(subject, value)] = cache.incr(fail_key)
            except ValueError:  # expired between add and incr
                cache.add(fail_key, 0, timeout=window_s)
                counts[(subject, value)] = cache.incr(fail_key)
    except Exception:
        logger.warning("login lockout cache unavailable; login not throttled", exc_info=True)
        return {}
    if all(count <= limits[subject] for (subject, _value), count in counts.items()):
        return counts
    _release(counts)
    return None


def _release(counts: dict[tuple[Subject, str], int]) -> None:
    """Give back the counts of an attempt that was no failure (refused unchecked, or its password right)."""
    for subject, value in counts:
        try:
            cache.decr(_key("fail", subject, value))
        except ValueError:
            pass  # the count is gone already (expired, or cleared by a lockout or a success)
        except Exception:
            logger.warning("login lockout cache unavailable", exc_info=True)
            return


def _lockouts_start(counts: dict[tuple[Subject, str], int]) -> Lockout | None:
    """After a wrong password: lock each subject whose count (``counts``, this attempt's included) reached its
    limit. Returns the first lockout it started (each audited, once)."""
    window_s = int(settings.PLATFORM_LOGIN_WINDOW_S)
    lockout_s = int(settings.PLATFORM_LOGIN_LOCKOUT_S)
    limits = _limits()
    started: Lockout | None = None
    for (subject, value), count in counts.items():
        if count < limits[subject]:
            continue
        try:
            # ``add`` is atomic: of many processes reaching the limit at once, one starts (and audits) the lockout.
            if not cache.add(_key("lock", subject, value), time.time() + lockout_s, timeout=lockout_s):
                continue
            cache.delete(_key("fail", subject, value))
        except Exception:
            logger.warning("login lockout cache unavailable; failure not counted", exc_info=True)
            return None
        audit_event_record(
            source="admin",
            action=LOCKOUT_ACTION,
            tool="login",
            args={
                subject: _recorded_subject(subject, value),
                "failures": count,
                "window_s": window_s,
                "lockout_s": lockout_s,
            },
            ok=False,
            reason=f"login:locked:{subject}",
            actor=GUARD_ACTOR,
        )
        started = started or Lockout(subject=subject, value=value, retry_after_s=lockout_s)
    return started


def password_check_throttled(*, username: str, ip: str, path: str, check: Callable[[], T]) -> T:
    """Run ``check``, a check of ``username``'s password (a truthy result: the password was right), as one login
    attempt under the lockout. Raises ``PermissionDenied`` without running it where the username or the address is
    locked, or where the attempts counted in the window (failed, or still being checked) already fill a limit: the
    attempt is counted *before* its check, so a burst of concurrent guesses gets no more checks than the lockout
    allows (counted after, 16 guesses at once at one username, limit 5, were 16 checks). A wrong password is written
    down (``security.login_failed``) and stays counted; the one that fills a limit starts its lockout. A right one
    clears the username's count and takes itself off the address's (one good account must not reset a guesser's
    count for others). A check that raises counts as nothing."""
    ip = _normalized_ip(ip)
    if login_lockout_get(username=username, ip=ip) is not None:
        raise PermissionDenied
    counts = _reserve(_subjects(username, ip))
    if counts is None:
        raise PermissionDenied
    try:
        result = check()
    except BaseException:
        _release(counts)
        raise
    if result:
        _release({key: count for key, count in counts.items() if key[0] == "ip"})
        login_success_record(username=username)
    else:
        login_failed_audit(username=username, ip=ip, path=path)
        _lockouts_start(counts)
    return result


def login_success_record(*, username: str) -> None:
    """A successful login clears the username's failure count."""
    try:
        cache.delete(_key("fail", "user", _normalized_username(username)))
    except Exception:
        logger.warning("login lockout cache unavailable", exc_info=True)


def login_subject_parse(user_or_ip: str) -> tuple[Subject, str]:
    """``"10.0.0.7"`` and ``"::ffff:10.0.0.7"`` → ("ip", "10.0.0.7"); ``"2001:db8:1:2::5"`` and
    ``"2001:db8:1:2::/64"`` → ("ip", "2001:db8:1:2::/64"); anything that is not an IP address (or an IPv6 /64) is a
    username (``"감사자"``, composed or not → ("user", "감사자")): each spelled as a lockout of it is recorded."""
    address = ip_subject(user_or_ip)
    if address is not None:
        return "ip", address
    return "user", _normalized_username(user_or_ip)


def login_lockout_lift(*, user_or_ip: str, actor: str) -> bool:
    """Lift the lockout of a username or an address, and clear its failure count. Audited
    (``security.lockout_lift``) whether or not it was locked; returns whether it was."""
    subject, value = login_subject_parse(user_or_ip)
    lock_key = _key("lock", subject, value)
    was_locked = cache.get(lock_key) is not None
    cache.delete_many([lock_key, _key("fail", subject, value)])
    audit_event_record(
        source="admin",
        action=LIFT_ACTION,
        tool="login",
        args={subject: _recorded_subject(subject, value)},
        result={"was_locked": was_locked},
        actor=actor,
    )
    return was_locked


class LockoutModelBackend(ModelBackend):
    """Django's username/password backend behind the lockout (:func:`password_check_throttled`): a locked username
    or address, or one whose allowance the attempts in flight fill, is refused before its password is checked
    (``PermissionDenied`` ends ``authenticate()`` with None); otherwise the check's outcome is counted. Callers that
    want to say *why* (the admin's form, Basic auth) ask ``login_lockout_get``."""

    def authenticate(
        self, request: Any, username: str | None = None, password: str | None = None, **kwargs: Any
    ) -> Any:
        if username is None:
            username = kwargs.get(get_user_model().USERNAME_FIELD)
        if username is not None and "\x00" in username:
            return None  # no user has one (Django's forms refuse it), and PostgreSQL cannot even look for it
        ip = client_ip(request.META) if request is not None else "unknown"
        check = partial(super().authenticate, request, username=username, password=password, **kwargs)
        if username is None or password is None:  # no password to check: Django's backend answers None
            if login_lockout_get(username=username, ip=ip) is not None:
                raise PermissionDenied
            return check()
        path = request.path if request is not None else ""
        return password_check_throttled(username=username, ip=ip, path=path, check=check)
