"""Services: every write to agents' models goes through here."""

from __future__ import annotations

import hashlib
import logging
import secrets
from collections.abc import Iterable
from typing import Any

from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from agent_platform.errors import ApplicationError
from agents.models import Agent, ApiKey, Run

logger = logging.getLogger(__name__)

API_KEY_PREFIX = "apk_"


def api_key_digest(raw_key: str) -> str:
    return hashlib.sha256(raw_key.encode("utf-8")).hexdigest()


@transaction.atomic
def api_key_create(*, name: str, agents: Iterable[Agent] = ()) -> tuple[ApiKey, str]:
    """Issue a key. Returns the row and the raw key, which is shown once and never stored."""
    raw = API_KEY_PREFIX + secrets.token_urlsafe(32)
    key = ApiKey.objects.create(name=name, prefix=raw[:12], digest=api_key_digest(raw))
    key.agents.set(list(agents))
    return key, raw


def api_key_authenticate(*, raw_key: str) -> ApiKey | None:
    """The live key with this value, or None. Records its last use."""
    key = ApiKey.objects.filter(digest=api_key_digest(raw_key), revoked_at__isnull=True).first()
    if key is not None:
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=timezone.now())
    return key


def run_create(
    *,
    agent_slug: str,
    query: str,
    api_key: ApiKey | None,
    context: dict[str, Any] | None = None,
    a2a_data: list[dict[str, Any]] | None = None,
    a2a_files: list[dict[str, Any]] | None = None,
    idempotency_key: str = "",
) -> Run:
    """Create a queued run and dispatch it to a worker once the transaction commits."""
    from agents.tasks import run_agent

    agent = Agent.objects.filter(slug=agent_slug).first()
    if agent is None or (
        api_key is not None and api_key.agents.exists() and not api_key.agents.filter(pk=agent.pk).exists()
    ):
        raise ApplicationError(
            _("Agent '%(slug)s' not found.") % {"slug": agent_slug}, code="agent_not_found", status=404
        )
    if not agent.enabled:
        raise ApplicationError(
            _("Agent '%(slug)s' is disabled.") % {"slug": agent_slug}, code="agent_disabled", status=409
        )
    with transaction.atomic():
        run = Run.objects.create(
            agent=agent,
            api_key=api_key,
            query=query,
            context=context or {},
            a2a_data=a2a_data or [],
            a2a_files=a2a_files or [],
            idempotency_key=idempotency_key,
        )
        transaction.on_commit(lambda: run_agent.delay(str(run.id)))
    return run
