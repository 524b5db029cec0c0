"""A bound secret is masked wherever it appears, also encoded: every env value of 4 or more characters (unless an
admin marked it a non-secret setting), and for values of 8 or more their hex, base32, reversed and
whitespace-split forms."""

from __future__ import annotations

import base64
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from audit.masking import MASK, mask_text, mask_value
from mcpregistry.models import McpServer

SECRET = "pin-98765"


@pytest.mark.parametrize(
    "form",
    [
        SECRET,
        SECRET.encode().hex(),
        SECRET.encode().hex().upper(),
        base64.b32encode(SECRET.encode()).decode(),
        base64.b32encode(SECRET.encode()).decode().rstrip("=").lower(),
        SECRET[::-1],
        " ".join(SECRET),
        "pin-98\n765",
        "p\ti\tn-9 8765",
    ],
    ids=["raw", "hex", "HEX", "base32", "base32-lower", "reversed", "spaced", "split-over-lines", "tabs"],
)
def test_a_bound_secret_is_masked_in_its_encoded_forms(form: str) -> None:
    text = f"the tool said: {form} (done)"
    assert mask_text(text, secrets=[SECRET]) == f"the tool said: {MASK} (done)"
    assert mask_value({"echo": [form]}, secrets=[SECRET]) == {"echo": [MASK]}


def test_korean_text_around_a_secret_survives() -> None:
    assert mask_text(f"비밀번호는 {SECRET[::-1]} 입니다", secrets=[SECRET]) == f"비밀번호는 {MASK} 입니다"


def test_a_short_secret_under_an_ordinary_name_is_a_secret_unless_marked_a_setting() -> None:
    server = McpServer(
        env={"SHORTPIN": "pin9", "FAILURE_MODE": "none", "X": {"from_env": "NOPE"}}, public_env=["FAILURE_MODE"]
    )
    assert server.secret_values() == ["pin9"]
    assert mask_text("SHORTPIN is pin9; mode none", secrets=server.secret_values()) == "SHORTPIN is ***; mode none"


def test_header_values_are_always_secrets() -> None:
    server = McpServer(headers={"X-Tenant": "acme-01"}, public_env=["X-Tenant"])
    assert server.secret_values() == ["acme-01"]


@pytest.mark.slow
def test_the_platforms_files_under_var_are_the_users_alone_and_hold_no_password(tmp_path: Path) -> None:
    var = tmp_path / "var"
    env = {
        **{k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "CELERY_BROKER_URL", "REDIS_URL"}},
        "PLATFORM_VAR_DIR": str(var),
        "DEMO_ADMIN_PASSWORD": "demo-Password-31337",
    }
    # migrate, then seed_demo, as manage.py runs each, in one process (Django starts once, not twice).
    done = subprocess.run(
        [sys.executable, "-c", "import os; os.umask(0o022); from django.core.management import execute_from_command_line; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'agent_platform.settings'); execute_from_command_line(['manage.py', 'migrate', '--noinput', '-v0']); execute_from_command_line(['manage.py', 'seed_demo', '--no-discover'])"],
        cwd=settings.BASE_DIR, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "demo-Password-31337" in done.stdout  # shown once, to the person who ran it
    paths = [var, *var.rglob("*")]
    assert len(paths) > 2
    for path in paths:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode & 0o077 == 0, f"{path} is {oct(mode)}"
        if path.is_file():
            assert b"demo-Password-31337" not in path.read_bytes()
