"""Services: every write to agents' models goes through here."""

from __future__ import annotations

import hashlib
import logging
import secrets
from collections.abc import Iterable
from typing import Any

from django.db import transaction
from django.db.models import F, Q, Value
from django.db.models.functions import Coalesce
from django.utils import timezone
from django.utils.translation import gettext as _

from agent_platform.errors import ApplicationError
from agents import engine
from agents.approvals import RunApprovals
from agents.deterministic import RuleSpec
from agents.graph import RunCancelled
from agents.models import Agent, ApiKey, DeterministicRule, Run
from mcpregistry.pool import get_default_pool

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


def _rules_for(agent: Agent) -> list[RuleSpec]:
    bound = list(agent.servers.values_list("pk", flat=True))
    rules = (
        DeterministicRule.objects.filter(enabled=True)
        .filter(Q(agent=agent) | Q(agent__isnull=True, server__in=bound))
        .select_related("server")
        .order_by("order", "id")
    )
    return [
        RuleSpec(
            rule_id=r.pk,
            name=r.name,
            mcp_id=r.server.mcp_id,
            tool_name=r.tool_name,
            when=r.when or {},
            params=r.params or {},
            answer_template=r.answer_template,
        )
        for r in rules
    ]


def run_execute(*, run_id: str) -> None:
    """Execute a queued run (or resume one whose approval was decided). Claiming it is compare-and-swap: a
    second delivery of the same run does nothing."""
    claimed = Run.objects.filter(id=run_id, status=Run.Status.QUEUED).update(
        status=Run.Status.RUNNING, started_at=Coalesce(F("started_at"), Value(timezone.now()))
    )
    if claimed != 1:
        logger.info("run %s already claimed or finished", run_id)
        return
    run = Run.objects.select_related("agent", "api_key").get(id=run_id)
    agent = run.agent
    servers = list(agent.servers.prefetch_related("tools__contract"))
    secrets = [value for server in servers for value in server.secret_values()]
    actor = f"api_key:{run.api_key.prefix}" if run.api_key else "local"
    plan = engine.RunPlan(
        run_id=run.id,
        query=run.query,
        context=run.context or {},
        a2a_data=run.a2a_data or [],
        a2a_files=run.a2a_files or [],
        system_prompt=agent.system_prompt,
        deterministic_instruction=agent.deterministic_instruction,
        answer_template=agent.answer_template,
        provider=agent.model_provider,
        model_id=agent.model_id,
        model_params=agent.model_params or {},
        max_iterations=agent.max_iterations,
        servers=servers,
        rules=_rules_for(agent),
        actor=actor,
        approvals=RunApprovals(run_id=run.id, actor=actor, secrets=secrets),
        check_cancelled=lambda: _raise_if_cancelled(run.id),
        conversation=run.conversation or [],
        previous_results=run.deterministic_results or [],
        previous_trace=run.messages or [],
    )
    try:
        outcome = engine.execute(plan)
    except Exception as exc:  # the run must end in a state, whatever happened
        logger.exception("run %s crashed", run_id)
        outcome = engine.RunOutcome(status="failed", error_code="internal", error_message=type(exc).__name__)
    finally:
        # Sessions opened for this run alone (per-run scope) end with it (a resumed run opens new ones).
        get_default_pool().close_scope(f"run:{run.id}")
    timings = _merged_timings(run, outcome.timings)
    finished = outcome.status in {"succeeded", "failed", "cancelled"}
    Run.objects.filter(id=run_id, status=Run.Status.RUNNING).update(
        status=outcome.status,
        answer=outcome.answer,
        error_code=outcome.error_code,
        error_message=outcome.error_message,
        deterministic_results=outcome.deterministic_results,
        messages=outcome.messages,
        conversation=outcome.conversation,
        timings=timings,
        token_usage=outcome.token_usage,
        finished_at=timezone.now() if finished else None,
    )


def _merged_timings(run: Run, timings: dict[str, float]) -> dict[str, float]:
    """A resumed run adds this pass's durations to the earlier ones."""
    merged = dict(run.timings or {})
    for key, value in timings.items():
        merged[key] = round(merged.get(key, 0.0) + value, 2) if key != "queue_wait_ms" else value
    if "queue_wait_ms" not in merged and run.started_at:
        merged["queue_wait_ms"] = round((run.started_at - run.created_at).total_seconds() * 1000, 2)
    return merged


def _raise_if_cancelled(run_id: Any) -> None:
    if Run.objects.filter(id=run_id, status=Run.Status.CANCELLED).exists():
        raise RunCancelled()


def run_resume(*, run_id: str) -> None:
    """A parked run whose approval was decided (or expired) goes back to the queue, once."""
    from agents.tasks import run_agent

    if Run.objects.filter(id=run_id, status=Run.Status.AWAITING_APPROVAL).update(status=Run.Status.QUEUED) == 1:
        transaction.on_commit(lambda: run_agent.delay(str(run_id)))
