"""System checks of the keys every process of a deployment must share (registered by ``AuditConfig.ready``).

Without its variable, each of these keys falls back to one generated into a file under this machine's ``var/``: on
one machine all processes share that file, but processes in other containers or on other machines each make their
own. ``check --deploy`` warns for each:

- ``audit.W001``: ``AUDIT_CHAIN_KEY`` is not set. An append refuses a chain head another key signed
  (``AuditChainHeadForged``): the first writer's events stand, every other writer's fail.
- ``audit.W002``: ``SECRET_KEY`` is not set. Sessions, CSRF tokens and password-reset links signed by one process
  are refused by the others (an admin is signed out at every request another container serves).
- ``audit.W003``: ``SECRETS_ENCRYPTION_KEYS`` is not set. The bindings' secrets one process encrypts, the others
  cannot decrypt (their MCP servers then fail to start or to authenticate).

Give every process the same values, as ``docker-compose.yml`` requires. They live here, beside the audit chain's
key, because this is the registered home of the platform's deploy checks; they read settings only (no import of
the apps that use the keys).

A key that is set but cannot be used fails only where it is first used, at every audited write or stored secret
(``ImproperlyConfigured``), so these are errors of every ``check`` (``migrate`` included), not of ``--deploy``
only, and ``/readyz`` answers 503 for them (``unusable_keys``; ``agent_platform/probes.py``):

- ``audit.E001``: an ``AUDIT_CHAIN_KEY`` key shorter than the chain's minimum (``audit.chain.MIN_KEY_CHARS``).
- ``audit.E003``: a ``SECRETS_ENCRYPTION_KEYS`` value that is no Fernet key, or, without the variable, a local key
  file (``var/secrets_key``) that holds none (emptied, damaged).

And one of the proxy in front (``agent_platform/client_ip.py``):

- ``audit.W004``: ``PLATFORM_TLS=proxy`` with ``PLATFORM_PROXY_HOPS=0``. Every request has the proxy's address:
  one client's wrong passwords and unknown API keys lock out and throttle every client.

And one of the database (``audit/append_only.py``), an error of every ``check``:

- ``audit.E004``: on SQLite, audit triggers missing from a record migrated past ``0009``, as a ``migrate`` killed
  while it had them lifted leaves it: raw UPDATE and DELETE of events and of the chain head succeed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cryptography.fernet import Fernet
from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.migrations.recorder import MigrationRecorder

from audit.append_only import SQLITE_TRIGGERS, sqlite_triggers_present
from audit.chain import MIN_KEY_CHARS, ChainKeyring


@register(Tags.security, deploy=True)
def check_audit_chain_key(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    if any(str(key).strip() for key in settings.AUDIT_CHAIN_KEY):
        return []
    return [
        Warning(
            "AUDIT_CHAIN_KEY is not set: this process signs the audit chain with a key of its own machine "
            f"({settings.AUDIT_CHAIN_KEY_FILE}). Processes in other containers or on other machines would each "
            "make their own, and their audit writes would be refused.",
            hint="Set AUDIT_CHAIN_KEY (32 characters or more, the same in every process), e.g. "
            "python3 -c 'import secrets; print(secrets.token_urlsafe(32))'.",
            id="audit.W001",
        )
    ]


def _generated_secret_key_file() -> Path | None:
    """The file ``SECRET_KEY`` was read from when the settings generated it (no ``SECRET_KEY`` variable), else
    None. Compared by value, so a key set any other way (the variable, a settings module of one's own) counts as
    set."""
    key_file = getattr(settings, "SECRET_KEY_FILE", None)
    if key_file is None:
        return None
    try:
        generated = Path(key_file).read_text(encoding="utf-8").strip()
    except OSError:
        return None  # never generated here: the key came from elsewhere
    return Path(key_file) if generated and generated == settings.SECRET_KEY else None


@register(Tags.security, deploy=True)
def check_secret_key_shared(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    key_file = _generated_secret_key_file()
    if key_file is None:
        return []
    return [
        Warning(
            f"SECRET_KEY is not set: this process signs sessions and CSRF tokens with a key of its own machine "
            f"({key_file}). Processes in other containers or on other machines would each make their own, and "
            "refuse each other's sessions and tokens.",
            hint="Set SECRET_KEY (50 characters or more, the same in every process), e.g. "
            "python3 -c 'import secrets; print(secrets.token_urlsafe(50))'.",
            id="audit.W002",
        )
    ]


@register(Tags.security, deploy=True)
def check_secrets_encryption_keys(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    configured = str(getattr(settings, "SECRETS_ENCRYPTION_KEYS", "") or "")
    if any(key.strip() for key in configured.split(",")):
        return []
    return [
        Warning(
            "SECRETS_ENCRYPTION_KEYS is not set: this process encrypts the MCP bindings' secrets with a key of its "
            f"own machine ({Path(settings.VAR_DIR) / 'secrets_key'}). Processes in other containers or on other "
            "machines would each make their own, and could not read the secrets the others stored.",
            hint="Set SECRETS_ENCRYPTION_KEYS (Fernet keys, comma-separated, the same in every process), e.g. "
            "python3 -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())', then run "
            "manage.py rotate_secrets: it re-encrypts the secrets stored so far with that key (until then the local "
            "key file still decrypts them; keep it until rotate_secrets reports no row left).",
            id="audit.W003",
        )
    ]


def _unusable(keys: Sequence[str], build: Callable[[str], object]) -> list[int]:
    """The places (from 1) of the keys ``build`` refuses (``ValueError``, ``TypeError``)."""
    places = []
    for place, key in enumerate(keys, start=1):
        try:
            build(key)
        except (ValueError, TypeError):
            places.append(place)
    return places


def _places(places: list[int], total: int) -> str:
    return (
        f"key {places[0]} of {total} is" if len(places) == 1 else f"keys {', '.join(map(str, places))} of {total} are"
    )


def audit_chain_key_problem() -> str | None:
    """Why the configured ``AUDIT_CHAIN_KEY`` cannot make the chain's keyring, or None where it can or is not set
    (the local key: ``audit.W001``). Each key is built into a keyring as ``audit.chain_keys`` builds them, and named
    by its place in the list, never quoted."""
    keys = [str(key).strip() for key in settings.AUDIT_CHAIN_KEY if str(key).strip()]
    places = _unusable(keys, lambda key: ChainKeyring([key]))
    if not places:
        return None
    return f"AUDIT_CHAIN_KEY: {_places(places, len(keys))} shorter than {MIN_KEY_CHARS} characters"


def secrets_encryption_keys_problem(*, full_path: bool = True) -> str | None:
    """Why the configured ``SECRETS_ENCRYPTION_KEYS`` cannot make the secrets' Fernet keys, or None where they can.
    Built as ``mcpregistry.crypto`` builds them (which this module may not import), each named by its place in the
    list, never quoted. Without the variable, the local key file (``audit.W003``) where there is one: emptied or
    damaged, it is named by its path (with the variable set it only decrypts, and one that holds no key is left
    out); without ``full_path`` (``/readyz``, which anyone reaching the port reads) by its name in
    ``PLATFORM_VAR_DIR`` only. None where there is no file yet: it is made at first use."""
    configured = str(getattr(settings, "SECRETS_ENCRYPTION_KEYS", "") or "")
    keys = [key.strip() for key in configured.split(",") if key.strip()]
    if not keys:
        local = Path(settings.VAR_DIR) / "secrets_key"
        named = str(local) if full_path else f"{local.name} in PLATFORM_VAR_DIR"
        try:
            key = local.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            return None
        except OSError as exc:
            return f"the local secrets key file {named} cannot be read ({exc.strerror})"
        if _unusable([key], lambda local_key: Fernet(local_key.encode())):
            return f"the local secrets key file {named} holds no Fernet key (44 characters of URL-safe base64)"
        return None
    places = _unusable(keys, lambda key: Fernet(key.encode()))
    if not places:
        return None
    return f"SECRETS_ENCRYPTION_KEYS: {_places(places, len(keys))} not a Fernet key (44 characters of URL-safe base64)"


def unusable_keys() -> list[str]:
    """What ``audit.E001`` and ``audit.E003`` find, for ``/readyz``: no key in the answer, no path of this machine's
    (the local key file by its name), and cheap (a hash and a base64 decoding per key)."""
    found = (audit_chain_key_problem(), secrets_encryption_keys_problem(full_path=False))
    return [problem for problem in found if problem]


@register(Tags.security)
def check_audit_chain_key_usable(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    problem = audit_chain_key_problem()
    if problem is None:
        return []
    return [
        Error(
            f"{problem}: every audited write (each run, tool call and configuration change) would fail.",
            hint="Give each key 32 characters or more, e.g. "
            "python3 -c 'import secrets; print(secrets.token_urlsafe(32))'. To replace a key that signed events "
            "already, put the new key first and keep the old one (see audit/chain_keys.py).",
            id="audit.E001",
        )
    ]


@register(Tags.security)
def check_secrets_encryption_keys_usable(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    problem = secrets_encryption_keys_problem()
    if problem is None:
        return []
    return [
        Error(
            f"{problem}: every MCP binding's stored secret would fail to be read or written.",
            hint="Make a key with python3 -c 'from cryptography.fernet import Fernet; "
            "print(Fernet.generate_key().decode())'; keep the keys the stored secrets were encrypted with. A local "
            "key file: put back the key it held (a backup); without it, remove the file and enter the stored "
            "secrets again in the admin.",
            id="audit.E003",
        )
    ]


@register(Tags.security, deploy=True)
def check_proxy_hops(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    if getattr(settings, "PLATFORM_TLS", "off") != "proxy" or int(getattr(settings, "PLATFORM_PROXY_HOPS", 0)) > 0:
        return []
    return [
        Warning(
            "PLATFORM_TLS is proxy but PLATFORM_PROXY_HOPS is 0: every request has the proxy's address, so one "
            "client's wrong passwords and unknown API keys lock out and throttle every client, and /metrics refuses "
            "every request the proxy forwards unless it carries PLATFORM_METRICS_TOKEN.",
            hint="Set PLATFORM_PROXY_HOPS to the number of proxies in front that each append the client's address to "
            "X-Forwarded-For (1 for one TLS proxy, as docker-compose.yml sets), and PLATFORM_TRUSTED_PROXIES to "
            "their addresses.",
            id="audit.W004",
        )
    ]


APPEND_ONLY_MIGRATION = ("audit", "0009_audit_append_only_sqlite")
"""The migration from which a record has its append-only triggers on SQLite."""

SQLITE_TRIGGER_NAMES = frozenset(re.findall(r"CREATE TRIGGER IF NOT EXISTS (\w+)", SQLITE_TRIGGERS))


def append_only_migrated(connection: BaseDatabaseWrapper) -> bool:
    """Whether the database is migrated past :data:`APPEND_ONLY_MIGRATION` (False before the first ``migrate``)."""
    return APPEND_ONLY_MIGRATION in MigrationRecorder(connection).applied_migrations()


def sqlite_triggers_missing(using: str = DEFAULT_DB_ALIAS) -> list[str]:
    """The audit triggers a SQLite database migrated past ``0009`` lacks, sorted; none on another database, before
    that migration (a fresh database: ``migrate`` is still to make them), or where the database cannot be read
    (what cannot connect is for ``migrate`` and every request to say)."""
    connection = connections[using]
    if connection.vendor != "sqlite" or _sqlite_file_missing(connection):
        return []
    try:
        if not append_only_migrated(connection):
            return []
        return sorted(SQLITE_TRIGGER_NAMES - sqlite_triggers_present(using))
    except DatabaseError:
        return []


def _sqlite_file_missing(connection: BaseDatabaseWrapper) -> bool:
    """Whether the SQLite database is a file that does not exist yet: there is no record to protect, and connecting
    would create it empty (``check --deploy`` in an image build, SQLITE_PATH pointing at a volume not mounted yet)."""
    if connection.is_in_memory_db():  # type: ignore[attr-defined]  # SQLite's wrapper has it
        return False
    return not Path(connection.settings_dict["NAME"]).exists()


@register(Tags.database)
def check_append_only_triggers(
    app_configs: Any = None, databases: Sequence[str] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """``audit.E004``. Unlike Django's own database checks this one reads the default database at every ``check``
    too (not only ``migrate`` and ``check --database``): a record left open to raw UPDATE and DELETE must not
    pass a plain ``manage.py check``, and on SQLite the read is one query of a local file. ``migrate`` is not
    refused by it: it puts the triggers back before its checks run (``audit/management/commands/migrate.py``). A
    SQLite file that does not exist is not opened (which would create it): nothing is recorded there yet."""
    errors: list[CheckMessage] = []
    for using in databases if databases is not None else [DEFAULT_DB_ALIAS]:
        missing = sqlite_triggers_missing(using)
        if missing:
            errors.append(
                Error(
                    f"The audit tables of database {using!r} lack their append-only triggers ({', '.join(missing)}): "
                    "raw UPDATE and DELETE of audit events and of the chain head succeed. A migrate that was "
                    "interrupted leaves them so.",
                    hint="Run manage.py migrate: it puts the triggers back (then verify_audit, to check that nothing "
                    "was changed meanwhile).",
                    id="audit.E004",
                )
            )
    return errors
