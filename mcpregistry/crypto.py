"""Secrets at rest: Fernet encryption of bindings' env and header values.

Keys come from ``SECRETS_ENCRYPTION_KEYS`` (comma-separated Fernet keys; the first encrypts, all decrypt, so a
key is rotated by putting the new one first and running ``manage.py rotate_secrets``). Without the variable, a
key is generated once for local use into ``var/secrets_key`` (git-ignored). Once the variable is set, a key in that
file is kept as the last key, to decrypt only: what it encrypted stays readable until ``rotate_secrets`` moves it
to the variable's first key (``audit.W003`` says to set the variable and then rotate).

A local key file that holds no Fernet key (emptied, damaged) is a ``SecretDecryptionError`` naming the file: the
rows load with their secrets unreadable (``UnreadableSecrets``), as with a lost key, never a 500 of every admin page.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import models
from django.utils.translation import gettext as _

from agent_platform.key_files import key_file
from audit.masking import register_process_secrets

PREFIX = "fernet:"


class SecretDecryptionError(ImproperlyConfigured):
    """Stored secrets cannot be decrypted with the configured keys."""


@lru_cache(maxsize=4)
def _local_key(where: str) -> str:
    """The local key (in the file named ``where``), created once (``agent_platform/key_files.py``). Read once per
    process: every secret read from the database or written to it needs it. Raises ``SecretDecryptionError``
    naming the file where it holds no Fernet key (not cached: read again until it is mended)."""
    key = key_file(Path(where), lambda: Fernet.generate_key().decode())
    register_process_secrets([key])  # masked from its first use: one made now was missed at start
    try:
        Fernet(key.encode())
    except ValueError:
        raise SecretDecryptionError(local_key_unusable(where)) from None
    return key


def local_key_unusable(where: str) -> str:
    """Why the local key file ``where`` cannot be used (it holds no Fernet key)."""
    return _(
        "the local secrets key file %(path)s holds no Fernet key (44 characters of URL-safe base64): put back the "
        "key it held, or set SECRETS_ENCRYPTION_KEYS to it"
    ) % {"path": where}


def local_key_file_problem() -> str | None:
    """Why the local key file cannot be used where it is the only key (``SECRETS_ENCRYPTION_KEYS`` unset): emptied
    or damaged, named with its path (``local_key_unusable``); None where it can, or where the variable is set."""
    if str(getattr(settings, "SECRETS_ENCRYPTION_KEYS", "") or "").strip(" ,"):
        return None
    try:
        _local_key(str(settings.VAR_DIR / "secrets_key"))
    except SecretDecryptionError as exc:
        return str(exc)
    except OSError:
        return None  # unreadable, not wrong: said as the decryption fails
    return None


def configured_keys() -> list[str]:
    """The keys, the first of which encrypts: ``SECRETS_ENCRYPTION_KEYS``'s, then the local key file's where there
    is one (it decrypts what was stored before the variable was set, until ``rotate_secrets``; one that holds no
    Fernet key is left out, having encrypted nothing this process could read); without the variable, the local
    key alone (made now if there is none)."""
    raw = getattr(settings, "SECRETS_ENCRYPTION_KEYS", "") or ""
    keys = [k.strip() for k in raw.split(",") if k.strip()]
    where = settings.VAR_DIR / "secrets_key"
    if not keys:
        return [_local_key(str(where))]
    if where.exists():
        try:
            local = _local_key(str(where))
        except (SecretDecryptionError, OSError):
            return keys
        if local not in keys:
            keys.append(local)
    return keys


@lru_cache(maxsize=4)
def _newest(key: str) -> Fernet:
    return Fernet(key.encode())


@lru_cache(maxsize=4)
def _fernet(keys: tuple[str, ...]) -> MultiFernet:
    try:
        return MultiFernet([Fernet(k.encode()) for k in keys])
    except ValueError as exc:
        raise ImproperlyConfigured(
            _(
                "SECRETS_ENCRYPTION_KEYS holds a value that is not a Fernet key (44 characters of URL-safe base64; "
                'make one with: python -c "from cryptography.fernet import Fernet; '
                'print(Fernet.generate_key().decode())")'
            )
        ) from exc


def fernet() -> MultiFernet:
    return _fernet(tuple(configured_keys()))


def encrypt_json(value: Any) -> str:
    return PREFIX + fernet().encrypt(json.dumps(value, ensure_ascii=False).encode()).decode()


UNDECRYPTABLE = "stored secrets cannot be decrypted: SECRETS_ENCRYPTION_KEYS lacks the key they were encrypted with"


def decrypt_json(token: str) -> Any:
    if not token.startswith(PREFIX):
        raise SecretDecryptionError("stored secrets are not encrypted (expected a 'fernet:' token)")
    try:
        return json.loads(fernet().decrypt(token[len(PREFIX) :].encode()))
    except InvalidToken:
        raise SecretDecryptionError(UNDECRYPTABLE) from None


class UnreadableSecrets:
    """A secret map stored with a key this process lacks, as the row loaded from the database holds it.

    The row loads (a page that lists servers, a select that offers them, the admin index): one lost key must not
    take down every admin page, or the page where the secrets are entered again. Any use of the values raises
    ``SecretDecryptionError`` where it is made, as the load did before (a run of its agent fails with
    ``config:secret_unreadable``, a submission is a 503) with the reason of the load (``reason``: a key missing, or
    the local key file that holds no key). Saved back as it was loaded, the stored ciphertext is kept unchanged.
    ``unreadable_secrets`` names it to code that may not import this module (the change audit)."""

    __slots__ = ("reason", "token")
    unreadable_secrets = True

    def __init__(self, token: str, reason: str = UNDECRYPTABLE) -> None:
        self.token = token
        self.reason = reason

    def _refuse(self, *_args: Any, **_kwargs: Any) -> Any:
        raise SecretDecryptionError(self.reason)

    __iter__ = __len__ = __bool__ = __getitem__ = __contains__ = _refuse
    keys = values = items = get = copy = _refuse

    def __eq__(self, other: object) -> bool:
        return isinstance(other, UnreadableSecrets) and other.token == self.token

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return "<UnreadableSecrets>"


def readable(value: Any) -> bool:
    """Whether a secret map loaded from the database can be used (it is not :class:`UnreadableSecrets`)."""
    return not isinstance(value, UnreadableSecrets)


def rotate_token(token: str) -> str:
    """Re-encrypt a stored token with the first (newest) key; one that key decrypts already is returned as it is
    (Fernet's rotation makes a new token every time: ``rotate_secrets`` would rewrite every row on every run)."""
    multi, body = fernet(), token[len(PREFIX) :].encode()
    try:
        _newest(configured_keys()[0]).decrypt(body)
    except InvalidToken:
        return PREFIX + multi.rotate(body).decode()
    return token


class EncryptedJSONField(models.TextField):
    """A JSON object stored encrypted (Fernet). In Python it is a plain dict; in the database, ciphertext.

    ``secret``: its values are secrets (the change audit records only which names were set, changed or cleared).
    """

    secret = True

    def from_db_value(self, value: str | None, expression: Any, connection: Any) -> Any:
        if value in (None, ""):
            return {}
        try:
            return decrypt_json(value)
        except SecretDecryptionError as exc:
            if value is not None and value.startswith(PREFIX):
                return UnreadableSecrets(value, str(exc))
            raise

    def to_python(self, value: Any) -> Any:
        if isinstance(value, str):
            return decrypt_json(value) if value.startswith(PREFIX) else json.loads(value or "{}")
        return value if value is not None else {}

    def get_prep_value(self, value: Any) -> str:
        if isinstance(value, UnreadableSecrets):
            return value.token
        if value is None or value == {}:
            # Nothing to keep secret: stored empty, read back as ``{}``. Encrypted, a map with no secret in it was
            # unreadable once its key was lost, and the row named among those whose secrets must be entered again.
            return ""
        return encrypt_json(value)

    def value_to_string(self, obj: Any) -> str:
        # Serialization (dumpdata) writes the ciphertext, never the values.
        return self.get_prep_value(self.value_from_object(obj))
