"""``manage.py create_auditor USERNAME [--password-stdin | --password P]``: a person who may read, never change,
the audit record."""

from __future__ import annotations

import secrets
import sys
import unicodedata
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import Group
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from audit.roles import AUDITOR_GROUP, user_create


def user_problems(candidate: AbstractBaseUser) -> None:
    """Refuse ``candidate`` (an unsaved user) as Django's own forms would: ``user_create`` saves without the
    model's validators, so a name with spaces or over 150 characters, or an e-mail that is none, was stored.
    Raises CommandError naming each field and its problem; the password is checked apart (its validators)."""
    try:
        candidate.full_clean(exclude=["password"], validate_unique=False)
    except ValidationError as exc:
        labels = {field.name: field.verbose_name for field in candidate._meta.fields}
        raise CommandError(
            "; ".join(
                problem
                if name == NON_FIELD_ERRORS
                else _("%(field)s: %(problem)s") % {"field": labels.get(name, name), "problem": problem}
                for name, problems in exc.message_dict.items()
                for problem in problems
            )
        ) from None


def password_problems(password: str) -> None:
    """Refuse a given password no one could sign in with: one with NUL (the login form refuses it, so the auditor
    could never sign in while the command said it had made them) or another control character (none can be typed
    into the form), or with bytes that were no UTF-8 (kept by Python as surrogates: hashing them raised
    UnicodeEncodeError). Raises CommandError."""
    categories = {unicodedata.category(c) for c in password}
    if "Cc" in categories:
        raise CommandError(_("the password may not contain control characters (NUL, tab, newline, …)"))
    if "Cs" in categories:
        raise CommandError(_("the password is not UTF-8 text"))


class Command(BaseCommand):
    stealth_options = ("stdin",)
    help = gettext_noop(
        "Create a staff user in the 'auditor' group: read-only access to audit events, runs and approvals in the "
        "admin, and to /api/v1/audit/. Prints a generated password alone on one line, once, unless --password "
        "or --password-stdin is given."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.description = _(self.help)  # marked above, translated now: argparse takes no lazy string
        parser.add_argument("username")
        given = parser.add_mutually_exclusive_group()
        given.add_argument(
            "--password-stdin",
            action="store_true",
            help=_("read the password from the first line of standard input (checked by the password validators)"),
        )
        given.add_argument(
            "--password",
            default=None,
            help=_(
                "use this password (checked by the password validators); other users of the machine can see a "
                "command line: prefer --password-stdin"
            ),
        )
        parser.add_argument("--email", default="")

    def handle(self, *args: Any, **options: Any) -> None:
        user_model = get_user_model()
        # Composed as Django's login form composes what is typed (NFKC): a name stored decomposed never signed in.
        username: str = user_model.normalize_username(options["username"].strip())
        if not username:
            raise CommandError(_("give a username"))
        if user_model._default_manager.filter(**{user_model.USERNAME_FIELD: username}).exists():
            raise CommandError(_("a user named %(username)s already exists") % {"username": repr(username)})
        group = Group.objects.filter(name=AUDITOR_GROUP).first()
        if group is None:
            raise CommandError(
                _("the %(group)s group is missing: run `manage.py migrate` first") % {"group": repr(AUDITOR_GROUP)}
            )
        if options["password_stdin"]:
            stdin = options.get("stdin") or sys.stdin
            try:
                options["password"] = stdin.readline().rstrip("\r\n")
            except UnicodeDecodeError:
                raise CommandError(_("the password is not UTF-8 text")) from None
            if not options["password"]:
                raise CommandError(_("no password on standard input"))
        generated = options["password"] is None
        password = secrets.token_urlsafe(18) if generated else options["password"]
        password_problems(password)
        candidate = user_model(**{user_model.USERNAME_FIELD: username}, email=options["email"])
        user_problems(candidate)
        try:
            validate_password(password, user=candidate)
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from None
        user_create(
            actor="system:create_auditor",
            via="create_auditor",
            username=username,
            password=password,
            email=options["email"],
            is_staff=True,
            groups=[group],
        )
        if generated:
            self.stdout.write(password)
            self.stderr.write(
                _("Auditor %(username)s created. The password above is shown only this once.")
                % {"username": repr(username)}
            )
        else:
            self.stdout.write(_("Auditor %(username)s created.") % {"username": repr(username)})
