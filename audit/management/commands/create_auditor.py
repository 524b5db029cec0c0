"""``manage.py create_auditor USERNAME [--password P]``: a person who may read, never change, the audit record."""

from __future__ import annotations

import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from audit.roles import AUDITOR_GROUP, user_create


class Command(BaseCommand):
    help = (
        "Create a staff user in the 'auditor' group: read-only access to audit events, runs and approvals in the "
        "admin, and to /api/v1/audit/. Prints a generated password alone on one line, once, unless --password "
        "is given."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--password", default=None, help="use this password (checked by the password validators)")
        parser.add_argument("--email", default="")

    def handle(self, *args: Any, **options: Any) -> None:
        username: str = options["username"].strip()
        user_model = get_user_model()
        if not username:
            raise CommandError("give a username")
        if user_model._default_manager.filter(**{user_model.USERNAME_FIELD: username}).exists():
            raise CommandError(f"a user named {username!r} already exists")
        group = Group.objects.filter(name=AUDITOR_GROUP).first()
        if group is None:
            raise CommandError(f"the {AUDITOR_GROUP!r} group is missing: run `manage.py migrate` first")
        generated = options["password"] is None
        password = secrets.token_urlsafe(18) if generated else options["password"]
        candidate = user_model(**{user_model.USERNAME_FIELD: username})
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
            self.stderr.write(f"Auditor {username!r} created. The password above is shown only this once.")
        else:
            self.stdout.write(f"Auditor {username!r} created.")
