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
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Tags, Warning, register


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
            "python3 -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())'.",
            id="audit.W003",
        )
    ]
