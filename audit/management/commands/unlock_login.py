"""``manage.py unlock_login USER_OR_IP``: lift a login lockout (``audit/logins.py``) before it ends. Audited.

An IPv6 client is locked by its /64 (``agent_platform.client_ip.ip_subject``): the /64 as the lockout names it
(``2001:db8:1:2::/64``) or any address inside it lifts it."""

from __future__ import annotations

import ipaddress
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop
from redis.exceptions import RedisError

from audit.logins import cache_is_process_local, login_lockout_lift, login_subject_parse


class Command(BaseCommand):
    help = gettext_noop(
        "Lift the login lockout of a username or a client IP address (after too many failed passwords at the "
        "admin's login or on the audit API's Basic auth) and clear its failure count. Written to the audit "
        "record (security.lockout_lift)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.description = _(self.help)  # marked above, translated now: argparse takes no lazy string
        parser.add_argument(
            "user_or_ip",
            help=_("a username, an IPv4/IPv6 address, or an IPv6 /64 (an IPv6 client is locked by its /64)"),
        )

    def handle(self, *args: Any, **options: Any) -> None:
        text: str = options["user_or_ip"]
        if not text.strip():
            raise CommandError(_("give a username or an IP address"))
        if cache_is_process_local():
            raise CommandError(
                _(
                    "the cache is local to each process (REDIS_URL is not set): this command cannot reach the web "
                    "server's lockouts. Restart the web server, or wait for the lockout to end "
                    "(PLATFORM_LOGIN_LOCKOUT_S)."
                )
            )
        subject, value = login_subject_parse(text)
        if subject == "user" and _is_network(text):
            # No username looks like one (Django's have no "/"): lifted as a username it would say "was not locked".
            raise CommandError(
                _(
                    "%(value)s: lockouts are kept per IPv4 address and per IPv6 /64; give an address, or the /64 "
                    "as the lockout names it"
                )
                % {"value": text.strip()}
            )
        try:
            was_locked = login_lockout_lift(user_or_ip=text, actor="system:unlock_login")
        except RedisError as exc:  # the lift reads and clears the cache before it writes its audit event: none then
            raise CommandError(
                _(
                    "cannot reach the cache at REDIS_URL (%(error)s); nothing was lifted. Start Redis or correct "
                    "REDIS_URL, then try again."
                )
                % {"error": exc}
            ) from None
        if subject == "ip" and "/" in value:
            outcome = (
                _("network %(value)s: lifted")
                if was_locked
                else _("network %(value)s: was not locked; its failure count is cleared")
            )
        elif subject == "ip":
            outcome = (
                _("address %(value)s: lifted")
                if was_locked
                else _("address %(value)s: was not locked; its failure count is cleared")
            )
        else:
            outcome = (
                _("username %(value)s: lifted")
                if was_locked
                else _("username %(value)s: was not locked; its failure count is cleared")
            )
        self.stdout.write(outcome % {"value": value})


def _is_network(text: str) -> bool:
    try:
        ipaddress.ip_network(text.strip(), strict=False)
    except ValueError:
        return False
    return True
