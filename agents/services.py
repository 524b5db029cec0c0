"""Services: every write to agents' models goes through here."""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from agent_platform.errors import ApplicationError
from agents.dispatch import run_dispatch
from agents.models import Agent, ApiKey, Approval, DeterministicRule, Run
from agents.run_state import RunEventWriter
from audit.changes import audited_delete, audited_save, change_scope, config_change_record
from audit.masking import mask_text
from audit.services import audit_event_record
from mcpregistry.models import McpServer

logger = logging.getLogger(__name__)

API_KEY_PREFIX = "apk_"


def api_key_digest(raw_key: str) -> str:
    return hashlib.sha256(raw_key.encode("utf-8")).hexdigest()


def api_key_create(
    *, name: str, actor: Any, via: str, agents: Iterable[Agent] = (), rate: str = ""
) -> tuple[ApiKey, str]:
    """Issue a key (recorded as ``config.api_key.create``: its name, prefix and agents, never the key or its
    digest). Returns the row and the raw key, which is shown once and never stored."""
    raw = API_KEY_PREFIX + secrets.token_urlsafe(32)
    key = ApiKey(name=name, prefix=raw[:12], digest=api_key_digest(raw), rate=rate)
    audited_save(key, actor=actor, via=via, m2m={"agents": list(agents)})
    return key, raw


def api_key_update(
    *,
    api_key: ApiKey,
    actor: Any,
    via: str,
    data: Mapping[str, Any] | None = None,
    agents: Iterable[Agent] | None = None,
) -> ApiKey:
    """Change a key's name, rate limit or agents."""
    return audited_save(
        api_key, actor=actor, via=via, data=data, m2m=None if agents is None else {"agents": list(agents)}
    )


def api_key_delete(*, api_key: ApiKey, actor: Any, via: str) -> None:
    audited_delete(api_key, actor=actor, via=via)


def api_key_authenticate(*, raw_key: str) -> ApiKey | None:
    """The live key with this value, or None. Records its last use."""
    key = ApiKey.objects.filter(digest=api_key_digest(raw_key), revoked_at__isnull=True).first()
    if key is not None:
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=timezone.now())
    return key


@transaction.atomic
def api_key_revoke(*, api_key: ApiKey, actor: Any, via: str) -> bool:
    """Revoke a key from now on (its next request is a 401). Compare-and-swap: returns False, and changes
    nothing, if it was already revoked. The revocation (``config.api_key.revoke``) is audited in the same
    transaction."""
    now = timezone.now()
    with change_scope(actor=actor, via=via):
        revoked = ApiKey.objects.filter(pk=api_key.pk, revoked_at__isnull=True).update(revoked_at=now) == 1
        if revoked:
            api_key.revoked_at = now
            config_change_record(obj=api_key, verb="revoke", diff={"revoked_at": [None, now.isoformat()]})
    return revoked


def agent_create(*, actor: Any, via: str, data: Mapping[str, Any], servers: Iterable[McpServer] = ()) -> Agent:
    """Define an agent with its bound servers."""
    return audited_save(Agent(), actor=actor, via=via, data=data, m2m={"servers": list(servers)})


def agent_update(
    *,
    agent: Agent,
    actor: Any,
    via: str,
    data: Mapping[str, Any] | None = None,
    servers: Iterable[McpServer] | None = None,
) -> Agent:
    """Change an agent (prompt, model, mode, limits) and, given ``servers``, the servers it binds."""
    return audited_save(
        agent, actor=actor, via=via, data=data, m2m=None if servers is None else {"servers": list(servers)}
    )


def agent_delete(*, agent: Agent, actor: Any, via: str) -> None:
    """Delete an agent with its rules (its runs are kept: the delete is refused while it has runs)."""
    audited_delete(agent, actor=actor, via=via)


def deterministic_rule_create(*, actor: Any, via: str, data: Mapping[str, Any]) -> DeterministicRule:
    """Add a rule (validated: a code rule importable, an admin rule's tool known and its params fitting)."""
    return audited_save(DeterministicRule(), actor=actor, via=via, data=data)


def deterministic_rule_update(
    *, rule: DeterministicRule, actor: Any, via: str, data: Mapping[str, Any] | None = None
) -> DeterministicRule:
    return audited_save(rule, actor=actor, via=via, data=data)


def deterministic_rule_delete(*, rule: DeterministicRule, actor: Any, via: str) -> None:
    audited_delete(rule, actor=actor, via=via)


def request_digest(body: Any) -> str:
    """SHA-256 of a JSON body in canonical form (keys sorted, no insignificant whitespace): two bodies that
    mean the same have the same digest, whatever their key order or spacing."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class RunSubmission:
    run: Run
    # True when an earlier request with the same Idempotency-Key created the run: nothing new was queued.
    replayed: bool


def run_submit(
    *,
    agent_slug: str,
    query: str,
    api_key: ApiKey | None,
    context: dict[str, Any] | None = None,
    a2a_data: list[dict[str, Any]] | None = None,
    a2a_files: list[dict[str, Any]] | None = None,
    idempotency_key: str = "",
    digest: str = "",
) -> RunSubmission:
    """Create a queued run (``run_create``), once per ``(api_key, idempotency_key)``.

    The same key with the same ``digest`` (of the request body) returns the run the first request created;
    with another digest it is a 409. Two identical requests racing are serialized on the API key's row
    (``SELECT … FOR UPDATE`` on PostgreSQL; SQLite's ``BEGIN IMMEDIATE`` takes the write lock at the start of
    the transaction), so only one of them creates the run."""
    if not idempotency_key or api_key is None:
        run = run_create(
            agent_slug=agent_slug,
            query=query,
            api_key=api_key,
            context=context,
            a2a_data=a2a_data,
            a2a_files=a2a_files,
            digest=digest,
        )
        return RunSubmission(run=run, replayed=False)
    with transaction.atomic():
        ApiKey.objects.select_for_update().filter(pk=api_key.pk).values_list("pk", flat=True).first()
        earlier = (
            Run.objects.select_related("agent")
            .filter(api_key=api_key, idempotency_key=idempotency_key)
            .order_by("created_at")
            .first()
        )
        if earlier is not None:
            if earlier.request_digest != digest:
                raise ApplicationError(
                    _("This Idempotency-Key was used with another request body."),
                    code="idempotency_key_reused",
                    status=409,
                )
            return RunSubmission(run=earlier, replayed=True)
        run = run_create(
            agent_slug=agent_slug,
            query=query,
            api_key=api_key,
            context=context,
            a2a_data=a2a_data,
            a2a_files=a2a_files,
            idempotency_key=idempotency_key,
            digest=digest,
        )
        return RunSubmission(run=run, replayed=False)


def _mask_strings(value: Any, secrets: list[str]) -> Any:
    """Mask secret values inside a caller's input, keeping its keys' values otherwise (an A2A ``sessionId`` is a
    conversation id, not a credential, so key-name rules do not apply here; value patterns and known secrets do)."""
    if isinstance(value, str):
        return mask_text(value, secrets=secrets)
    if isinstance(value, dict):
        return {k: _mask_strings(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask_strings(v, secrets) for v in value]
    return value


def run_create(
    *,
    agent_slug: str,
    query: str,
    api_key: ApiKey | None,
    context: dict[str, Any] | None = None,
    a2a_data: list[dict[str, Any]] | None = None,
    a2a_files: list[dict[str, Any]] | None = None,
    idempotency_key: str = "",
    digest: str = "",
) -> Run:
    """Create a queued run and dispatch it to a worker once the transaction commits (``run_dispatch``: with the
    agent's time limits; a broker that cannot be reached leaves the run queued for the reconciler, never an
    error to the caller, since the run exists).

    Raises ApplicationError 404 (no such agent, or not one this key may use) and 409 (agent disabled)."""
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
        # Input guardrail: a secret a caller pastes (or one bound to the platform) is never stored or shown.
        secrets = [value for server in agent.servers.all() for value in server.secret_values()]
        run = Run.objects.create(
            agent=agent,
            api_key=api_key,
            query=mask_text(query, secrets=secrets),
            context=_mask_strings(context or {}, secrets),
            a2a_data=_mask_strings(a2a_data or [], secrets),
            a2a_files=_mask_strings(a2a_files or [], secrets),
            idempotency_key=idempotency_key,
            request_digest=digest,
        )
        time_limit_s = agent.time_limit_s
        transaction.on_commit(lambda: run_dispatch(run_id=str(run.id), time_limit_s=time_limit_s))
    return run


CANCELLABLE = (Run.Status.QUEUED, Run.Status.AWAITING_APPROVAL, Run.Status.RUNNING)


@transaction.atomic
def run_cancel(*, run: Run, actor: str) -> Run:
    """Cancel a run that has not finished. Compare-and-swap on the status it was read with (read again if it
    changed in between), so that what follows depends on the status it really had:

    - ``queued``: it never starts (a worker's claim only takes ``queued`` runs);
    - ``awaiting_approval``: its pending approvals expire (a later decision is a 409) and it is not resumed;
    - ``running``: its worker stops at the next step (the engine checks between model and tool steps); a
      tool call already under way finishes first. The worker's final write only applies to a ``running`` run
      it holds, so it never overwrites the cancellation (``agents.execution``).

    A ``status`` event (``cancelled``) is appended for a queued or parked run; a running run's worker
    appends its own. Returns the run, fresh. Raises ApplicationError 409 for a finished run."""
    now = timezone.now()
    cancelled_from: str | None = None
    for _attempt in range(5):
        current = Run.objects.filter(pk=run.pk).values_list("status", flat=True).first()
        if current not in CANCELLABLE:
            run.refresh_from_db()
            raise ApplicationError(
                _("The run has already finished (%(status)s).") % {"status": run.status},
                code="run_finished",
                status=409,
            )
        swapped = Run.objects.filter(pk=run.pk, status=current).update(
            status=Run.Status.CANCELLED,
            finished_at=now,
            lease_expires_at=None,
            error_code="cancelled",
            error_message=f"cancelled by {actor}",  # stored: not translated
        )
        if swapped == 1:
            cancelled_from = current
            break
    if cancelled_from is None:  # its status kept changing under us
        raise ApplicationError(_("The run is changing state; try again."), code="run_busy", status=409)
    expired = Approval.objects.filter(run_id=run.pk, status=Approval.Status.PENDING).update(
        status=Approval.Status.EXPIRED, reason="the run was cancelled"
    )
    if cancelled_from != Run.Status.RUNNING:
        RunEventWriter(run_id=run.pk, secrets=[]).emit(
            "status", {"status": "cancelled", "answer": "", "error": "cancelled"}
        )
    audit_event_record(
        source="admin",
        action="run.cancel",
        run_id=run.pk,
        args={"from_status": cancelled_from, "approvals_expired": expired},
        actor=actor,
    )
    run.refresh_from_db()
    return run
