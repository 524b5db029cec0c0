"""A test server's code as a file to run: a binding's program and arguments are checked again when its session
opens (``binding_policy.binding_problem``), and ``python -c CODE`` runs inline code, which the policy refuses."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path


def script_file(code: str, suffix: str = ".py") -> str:
    """The path of a file holding ``code`` (one per content, shared by the test processes of this user)."""
    folder = Path(tempfile.gettempdir()) / f"platform-test-scripts-{os.getuid()}"
    folder.mkdir(exist_ok=True)
    path = folder / f"{hashlib.sha256(code.encode()).hexdigest()[:20]}{suffix}"
    if not path.exists():
        partial = path.with_name(f"{path.name}.{os.getpid()}.part")
        partial.write_text(code, encoding="utf-8")
        partial.replace(path)
    return str(path)
