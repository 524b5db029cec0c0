"""Keys made for local use: the processes of a fresh start that find the key missing together agree on one key."""

from __future__ import annotations

import concurrent.futures
import os
import stat
import threading
from pathlib import Path
from typing import Any

from agent_platform.key_files import key_file
from mcpregistry.crypto import decrypt_json, encrypt_json


def test_callers_that_find_the_key_missing_together_all_get_the_one_key_stored(tmp_path: Path) -> None:
    path = tmp_path / "var" / "some_key"
    everyone_looked = threading.Barrier(8)

    def make() -> str:
        everyone_looked.wait(timeout=10)  # every caller has found the file missing before any stores its key
        return f"key-of-{threading.get_ident()}"

    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        keys = list(pool.map(lambda _: key_file(path, make), range(8)))

    assert len(set(keys)) == 1
    assert path.read_text() == keys[0]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert list(path.parent.iterdir()) == [path]  # no partial file left behind


def test_a_key_once_stored_is_never_replaced(tmp_path: Path) -> None:
    path = tmp_path / "some_key"
    first = key_file(path, lambda: "first")
    assert key_file(path, lambda: "second") == first == "first"


def test_without_secrets_encryption_keys_the_local_key_is_made_once_and_then_read_from_memory(
    settings: Any, tmp_path: Path
) -> None:
    settings.SECRETS_ENCRYPTION_KEYS = ""
    settings.VAR_DIR = tmp_path
    token = encrypt_json({"TOKEN": "시크릿"})
    assert stat.S_IMODE(os.stat(tmp_path / "secrets_key").st_mode) == 0o600

    (tmp_path / "secrets_key").unlink()  # gone from the disk: this process still decrypts with the key it read
    assert decrypt_json(token) == {"TOKEN": "시크릿"}
    assert not (tmp_path / "secrets_key").exists()
    assert encrypt_json({}).startswith("fernet:") and not (tmp_path / "secrets_key").exists()
