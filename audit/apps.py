from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from django.apps import AppConfig, apps
from django.conf import settings
from django.contrib.auth.signals import user_logged_out
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections
from django.db.migrations.recorder import MigrationRecorder
from django.db.models.signals import m2m_changed, post_migrate, pre_migrate, pre_save
from django.utils.translation import gettext_lazy as _

logger = logging.getLogger(__name__)

_GROUPS_BEFORE: dict[str, Any] = {}
"""The groups as a ``migrate`` found them, by database, until its end compares them (``audit.roles``)."""


def _audit_chain_before_migrate(*, using: str, **_kwargs: Any) -> None:
    """SQLite alters a table by copying and renaming it, which its triggers (one of which names the events
    table) do not survive: they are lifted for the length of ``migrate`` and put back after it, whether it
    succeeds (``post_migrate``) or not (:func:`append_only_put_back`). The groups are noted as the ``migrate``
    finds them, for its end to record what its data migrations did to them."""
    from audit.append_only import sqlite_triggers_lift
    from audit.roles import groups_snapshot

    connection = connections[using]
    if connection.vendor == "sqlite":
        sqlite_triggers_lift(connection)
    if using == DEFAULT_DB_ALIAS and getattr(settings, "PLATFORM_AUDIT_MIGRATED_GROUPS", True):
        _GROUPS_BEFORE[using] = groups_snapshot(using=using)


def _audit_chain_after_migrate(*, using: str, **_kwargs: Any) -> None:
    """After every ``migrate`` (and a test suite's flush): SQLite's triggers back in place (altering a table
    there drops its triggers), the chain head created if the record is empty (never over events), and the groups
    data migrations made or changed (the auditor and reviewer roles) recorded (``audit.roles.groups_record_migrated``)."""
    from audit.append_only import append_only_install
    from audit.checks import APPEND_ONLY_MIGRATION
    from audit.roles import groups_record_migrated
    from audit.services import audit_chain_head_create_if_fresh

    connection = connections[using]
    applied = MigrationRecorder(connection).applied_migrations()
    if APPEND_ONLY_MIGRATION not in applied:
        return  # migrated backwards, or not yet this far
    if connection.vendor == "sqlite":
        append_only_install(connection)
    audit_chain_head_create_if_fresh(using=using)
    if using == DEFAULT_DB_ALIAS and getattr(settings, "PLATFORM_AUDIT_MIGRATED_GROUPS", True):
        groups_record_migrated(_GROUPS_BEFORE.pop(using, None))


def append_only_put_back(*, using: str) -> None:
    """SQLite's triggers back in place where the record has them (migrated past ``0009``), for a ``migrate`` that
    did not reach ``post_migrate``: one that failed or was stopped after ``pre_migrate`` lifted them (a failed
    migration's own changes are rolled back, so the tables are as the last migration that succeeded left them),
    and, at its start, one after a ``migrate`` killed outright. Idempotent. Called by ``manage.py migrate``
    (``audit/management/commands/migrate.py``). A trigger that cannot be put back is logged, never raised over
    the ``migrate``'s own error: ``audit.E004`` names it at every ``manage.py check``."""
    from audit.append_only import append_only_install
    from audit.checks import append_only_migrated

    connection = connections[using]
    try:
        if connection.vendor == "sqlite" and append_only_migrated(connection):
            append_only_install(connection)
    except DatabaseError:
        logger.exception("the audit tables' append-only triggers could not be put back on database %r", using)


# The process's own secrets shorter than this are not masked everywhere: a short password would hide ordinary words.
PROCESS_SECRET_MIN_CHARS = 8


def _url_password(url: Any) -> str:
    """The password of a connection URL (``redis://:pw@host``), or ""."""
    if not isinstance(url, str):
        return ""
    try:
        return urlsplit(url).password or ""
    except ValueError:  # a malformed port or bracket: no password can be read, so none is leaked by this process
        return ""


def _local_key(path: Any) -> str:
    """The key in a local key file (the secrets' and the audit chain's, made on their first use), or "" where there
    is none yet (nothing is created here)."""
    try:
        return Path(path).read_text(encoding="utf-8").strip()
    except (OSError, TypeError, ValueError):
        return ""


def process_secrets() -> list[str]:
    """This process's own secrets, which every mask hides (audit rows, tool results and errors, logs): a local tool
    runs in the process and can read (and return, or raise with) any of them. Django's keys, the Fernet keys of the
    bindings' secrets, the audit chain's keys (the settings', and the local key files' where they exist), the
    metrics token, the database passwords, the broker's and Redis's URL passwords, the embeddings API key and the
    AWS secret credentials of the environment. Only values that cannot be ordinary text (``_maskable``): a short,
    numeric or one-kind one (a word) would hide words and numbers everywhere."""
    values: list[Any] = [settings.SECRET_KEY, *getattr(settings, "SECRET_KEY_FALLBACKS", ())]
    values += str(getattr(settings, "SECRETS_ENCRYPTION_KEYS", "") or "").split(",")
    values.append(_local_key(Path(settings.VAR_DIR) / "secrets_key"))  # mcpregistry.crypto's local key
    values += list(getattr(settings, "AUDIT_CHAIN_KEY", ()) or ())
    values.append(_local_key(getattr(settings, "AUDIT_CHAIN_KEY_FILE", "")))
    values += [getattr(settings, "PLATFORM_METRICS_TOKEN", ""), getattr(settings, "PLATFORM_DEMO_ADMIN_PASSWORD", "")]
    values += [database.get("PASSWORD") for database in settings.DATABASES.values()]
    values += [_url_password(getattr(settings, name, "")) for name in ("CELERY_BROKER_URL", "REDIS_URL")]
    values += [_url_password(cache.get("LOCATION")) for cache in settings.CACHES.values()]
    values += [
        os.environ.get(name) for name in ("PLATFORM_EMBEDDINGS_API_KEY", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
    ]
    found = [value.strip() for value in values if isinstance(value, str)]
    return list(dict.fromkeys(v for v in found if _maskable(v)))


def _maskable(value: str) -> bool:
    """Whether a process secret can be masked everywhere without hiding ordinary text: ``PROCESS_SECRET_MIN_CHARS``
    or more characters, not digits alone, and of two kinds of character at least (lower and upper case letters,
    digits, others) unless it is long. A generated key always is; a word is not: the compose stack's database
    password "platform" (its user's name too) was masked in every tool result, audit row and log line, and so were
    "postgres" and "password"."""
    if len(value) < PROCESS_SECRET_MIN_CHARS or value.isdigit():
        return False
    kinds = (str.islower, str.isupper, str.isdigit, lambda ch: not ch.isalnum())
    varied = sum(any(kind(ch) for ch in value) for kind in kinds) >= 2
    return varied or len(value) >= 20


class AuditConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "audit"
    verbose_name = _("Audit")

    def ready(self) -> None:
        from audit import (
            checks,  # noqa: F401 - registers the audit chain's system checks
            logins,
            roles,
        )
        from audit.admin_changes import link_tables_named
        from audit.change_guard import ChangeAudit, m2m_changed_guard, policy_of, raw_save_guard
        from audit.masking import register_process_secrets

        # Before anything is masked: a local tool's answer, an error quoting a setting, a log line.
        register_process_secrets(process_secrets())
        roles.connect()
        link_tables_named()
        user_logged_out.connect(logins.logout_record, dispatch_uid="audit.logins.logout")
        # Rows loaded raw (loaddata) of a configuration model, users and groups included: refused unrecorded.
        for model in apps.get_models():
            if isinstance(policy_of(model), ChangeAudit):
                pre_save.connect(raw_save_guard, sender=model, dispatch_uid=f"audit.guard.raw.{model._meta.label}")
        pre_migrate.connect(_audit_chain_before_migrate, sender=self, dispatch_uid="audit.chain.before_migrate")
        post_migrate.connect(_audit_chain_after_migrate, sender=self, dispatch_uid="audit.chain.after_migrate")
        # Many-to-many changes of a configuration model (an agent's servers, a key's agents) are writes too.
        for model in apps.get_models():
            if isinstance(getattr(model, "change_audit", None), ChangeAudit) and policy_of(model) is not None:
                for m2m in model._meta.many_to_many:
                    m2m_changed.connect(
                        m2m_changed_guard,
                        sender=m2m.remote_field.through,
                        dispatch_uid=f"audit.guard.{model._meta.label}.{m2m.name}",
                    )
