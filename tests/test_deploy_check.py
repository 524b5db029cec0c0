"""``manage.py check --deploy`` passes with the production settings ``docker-compose.yml`` gives the web and
worker services (read from the file itself, with the two secrets it requires filled in), and still fails where
those settings are taken away."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cryptography.fernet import Fernet

# Marked slow: out of the fast loop (several seconds of real servers, processes or timeouts per test); the full
# suite runs it.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
PLACEHOLDER = re.compile(r"\$\{(?P<name>\w+)(?::(?P<kind>[?-])(?P<rest>[^}]*))?\}")


def compose_environment(service: str) -> dict[str, str]:
    """The service's environment as compose resolves it: ``${NAME:?…}`` from the secrets an operator must set,
    ``${NAME:-default}`` to its default."""
    required = {
        "SECRET_KEY": secrets.token_urlsafe(50),
        "SECRETS_ENCRYPTION_KEYS": Fernet.generate_key().decode(),
        "AUDIT_CHAIN_KEY": secrets.token_urlsafe(32),
    }

    def resolve(match: re.Match[str]) -> str:
        name, kind, rest = match["name"], match["kind"], match["rest"] or ""
        if name in required:
            return required[name]
        assert kind == "-", f"docker-compose.yml requires {name}: give the test a value for it"
        return rest

    document = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    environment = document["services"][service]["environment"]
    return {name: PLACEHOLDER.sub(resolve, str(value)) for name, value in environment.items()}


def check_deploy(environment: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k in {"PATH", "HOME", "LANG", "LC_ALL", "TZ"}}
    env.update(environment)
    # Where the container keeps var/; nothing security-related, and the check writes nothing else.
    env["PLATFORM_VAR_DIR"] = str(tmp_path / "var")
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("service", ["web", "worker"])
def test_the_deploy_check_passes_with_the_compose_settings(service: str, tmp_path: Path) -> None:
    environment = compose_environment(service)
    assert environment["DEBUG"] == "0"
    done = check_deploy(environment, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues" in done.stdout


def test_the_deploy_check_fails_without_https_settings(tmp_path: Path) -> None:
    environment = {**compose_environment("web"), "PLATFORM_TLS": "off"}
    environment.pop("SECURE_SSL_REDIRECT", None)
    done = check_deploy(environment, tmp_path)
    assert done.returncode != 0
    assert "security.W004" in done.stderr and "security.W008" in done.stderr


def test_the_deploy_check_warns_where_each_process_would_sign_the_audit_with_a_key_of_its_own(tmp_path: Path) -> None:
    """Without ``AUDIT_CHAIN_KEY`` every container generated its own chain key: the web's and the workers' audit
    writes refused each other's chain head (the compose file did not set it)."""
    environment = compose_environment("worker")
    assert environment["AUDIT_CHAIN_KEY"]  # compose requires it
    environment.pop("AUDIT_CHAIN_KEY")
    done = check_deploy(environment, tmp_path)
    assert done.returncode != 0
    assert "audit.W001" in done.stdout + done.stderr
