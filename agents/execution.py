"""Executing runs: claim a queued run, build its plan, run the engine, store the outcome; resume a parked one.

``run_execute`` is what a worker's task calls. Claiming is compare-and-swap on the run's status, so a second
delivery of the same message (or a second worker) never runs a run twice.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from django.db.models import F, Q, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from agents import engine
from agents.approvals import RunApprovals
from agents.deterministic import RuleSpec
from agents.graph import RunCancelled
from agents.models import Agent, DeterministicRule, Run, RunEvent
from audit.masking import mask_value
from mcpregistry.pool import get_default_pool

logger = logging.getLogger(__name__)


def _rules_for(agent: Agent) -> list[RuleSpec]:
    bound = list(agent.servers.values_list("pk", flat=True))
    rules = (
        DeterministicRule.objects.filter(enabled=True)
        .filter(Q(agent=agent) | Q(agent__isnull=True, server__in=bound) | Q(agent__isnull=True, code__gt=""))
        .select_related("server")
        .order_by("order", "id")
    )
    return [
        RuleSpec(
            rule_id=r.pk,
            name=r.name,
            mcp_id=r.server.mcp_id if r.server else "",
            tool_name=r.tool_name,
            code=r.code,
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
        answer_from_deterministic=agent.answer_from_deterministic,
        mode=agent.mode,
        flow_graph=agent.flow_graph,
        servers=servers,
        rules=_rules_for(agent),
        actor=actor,
        emit=RunEventWriter(run_id=run.id, secrets=secrets).emit,
        approvals=RunApprovals(run_id=run.id, actor=actor, secrets=secrets),
        check_cancelled=lambda: _raise_if_cancelled(run.id),
        conversation=run.conversation or [],
        previous_results=run.deterministic_results or [],
        previous_trace=run.messages or [],
    )
    plan.emit("status", {"status": "running"})
    try:
        outcome = engine.execute(plan)
    except Exception as exc:  # the run must end in a state, whatever happened
        logger.exception("run %s crashed", run_id)
        outcome = engine.RunOutcome(status="failed", error_code="internal", error_message=type(exc).__name__)
    finally:
        # Sessions opened for this run alone (per-run scope) end with it (a resumed run opens new ones).
        get_default_pool().close_scope(f"run:{run.id}")
    timings = _merged_timings(run, outcome.timings)
    plan.emit("status", {"status": outcome.status, "answer": outcome.answer, "error": outcome.error_code or None})
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


class RunEventWriter:
    """Appends a run's progress to ``RunEvent`` (masked), numbered after what an earlier pass wrote."""

    def __init__(self, *, run_id: Any, secrets: list[str]) -> None:
        self.run_id = run_id
        self.secrets = secrets
        last = RunEvent.objects.filter(run_id=run_id).order_by("-seq").values_list("seq", flat=True).first()
        self.seq = last or 0

    def emit(self, kind: str, data: dict[str, Any]) -> None:
        self.seq += 1
        RunEvent.objects.create(
            run_id=self.run_id, seq=self.seq, kind=kind, data=mask_value(data, secrets=self.secrets)
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
