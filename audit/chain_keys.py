"""The audit chain's keys, from ``settings.AUDIT_CHAIN_KEY`` (the ``AUDIT_CHAIN_KEY`` environment variable).

Comma-separated keys of at least 32 characters (``python -c 'import secrets; print(secrets.token_urlsafe(32))'``):
the first signs, all verify. Rotate by putting a new key first and keeping the old ones for as long as anything
they signed must still verify (events still in the table, archive files, anchors). Without the variable a key is
generated once for local use into ``settings.AUDIT_CHAIN_KEY_FILE`` (``var/audit_chain_key``, mode 0600), as the
local secrets key is (``mcpregistry/crypto.py``). The key must never be stored in the database: it is what
someone who can write the database lacks.
"""

from __future__ import annotations

import os
import secrets
from functools import lru_cache
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from audit.chain import ChainKeyring

__all__ = ["chain_keyring"]


@lru_cache(maxsize=4)
def _local_key(where: str) -> str:
    """The local key (in the file named ``where``), created once: written beside its final name, then linked
    into place, so that two processes starting together agree on one key and nobody reads a half-written file.
    Read once per process (every append needs it)."""
    path = Path(where)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
        descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as out:
            out.write(secrets.token_urlsafe(32))
        try:
            os.link(partial, path)
        except FileExistsError:
            pass  # another process made it first: use theirs
        finally:
            partial.unlink(missing_ok=True)
    return path.read_text(encoding="utf-8").strip()


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
