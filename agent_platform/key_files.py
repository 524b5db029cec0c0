"""Keys generated once for local use, each in its own git-ignored file under ``var/`` (mode 0600).

Without ``SECRET_KEY``, ``SECRETS_ENCRYPTION_KEYS`` or ``AUDIT_CHAIN_KEY`` the platform makes its own key on
first use. The web, the workers and the commands of ``./bin/up`` start together on a fresh machine: two of them
may find the file missing at once. Each writes its key beside the final name and links it into place, so the
first one wins, every process reads that one key, and nobody reads a half-written file. (A key written over by a
second process would leave what the first one encrypted or signed undecryptable or unverifiable.)

No Django import: the settings module reads its ``SECRET_KEY`` here.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

__all__ = ["key_file"]


def key_file(path: Path, generate: Callable[[], str]) -> str:
    """The key stored in ``path``, made by ``generate`` and stored first if there is none yet."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.partial")
        descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as out:
            out.write(generate())
        try:
            os.link(partial, path)
        except FileExistsError:
            pass  # another process made it first: use theirs
        finally:
            partial.unlink(missing_ok=True)
    return path.read_text(encoding="utf-8").strip()
