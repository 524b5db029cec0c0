"""The audit chain's keys, from ``settings.AUDIT_CHAIN_KEY`` (the ``AUDIT_CHAIN_KEY`` environment variable).

Comma-separated keys of at least 32 characters (``python -c 'import secrets; print(secrets.token_urlsafe(32))'``):
the first signs, all verify. Rotate by putting a new key first and keeping the old ones for as long as anything
they signed must still verify (events still in the table, archive files, anchors). Without the variable a key is
generated once for local use into ``settings.AUDIT_CHAIN_KEY_FILE`` (``var/audit_chain_key``, mode 0600), as the
local secrets key is (``mcpregistry/crypto.py``). The key must never be stored in the database: it is what
someone who can write the database lacks.
"""

from __future__ import annotations

import secrets
from functools import lru_cache
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from agent_platform.key_files import key_file
from audit.chain import ChainKeyring
from audit.masking import register_process_secrets

__all__ = ["chain_keyring"]


@lru_cache(maxsize=4)
def _local_key(where: str) -> str:
    """The local key (in the file named ``where``), created once (``agent_platform/key_files.py``). Read once per
    process (every append needs it)."""
    key = key_file(Path(where), lambda: secrets.token_urlsafe(32))
    register_process_secrets([key])  # masked from its first use: one made now was missed at start
    return key


@lru_cache(maxsize=8)
def _keyring(keys: tuple[str, ...]) -> ChainKeyring:
    try:
        return ChainKeyring(keys)
    except ValueError as exc:
        raise ImproperlyConfigured(f"AUDIT_CHAIN_KEY: {exc}") from exc


def chain_keyring() -> ChainKeyring:
    """The configured keyring (cached per key list). Raises ``ImproperlyConfigured`` for a key too short."""
    configured = tuple(key.strip() for key in settings.AUDIT_CHAIN_KEY if key.strip())
    return _keyring(configured or (_local_key(str(settings.AUDIT_CHAIN_KEY_FILE)),))
