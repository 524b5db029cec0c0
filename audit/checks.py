"""System checks of the audit chain's settings (registered by ``AuditConfig.ready``).

- ``audit.W001`` (``check --deploy``): ``AUDIT_CHAIN_KEY`` is not set. Each process then signs the chain with a
  key generated into its own ``var/audit_chain_key``: on one machine all processes share that file, but
  processes in other containers or on other machines each make their own, and an append refuses a chain head
  another key signed (``AuditChainHeadForged``): the first writer's events stand, every other writer's fail.
  Give every process the same ``AUDIT_CHAIN_KEY``, as ``docker-compose.yml`` requires.
"""

from __future__ import annotations

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
