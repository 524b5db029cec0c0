"""Shadow runs: a sampled live run is repeated on the agent's candidate version, in the background, and the two
are compared (same tools? same arguments? answer similarity, latency, tokens).

The shadow is created only after the live run's outcome is stored (``agents.execution`` calls
``shadow_after_live`` once the caller can already read the answer; ``agents.run_state`` once a run cut off by its
time limit or its lost worker is failed), so it can neither delay nor change that answer. A shadow that ends either
way is compared with its live run. It is an ordinary run with ``purpose="shadow"``: the gate refuses its write calls
(``eval:write_blocked``) and audits its calls under ``shadow``, apart from production metrics. It has no API
key, so it never appears among the caller's runs; it reserves its share of the agent's budgets (not the
caller's key's), and is not started when they are spent. ``PLATFORM_SHADOW_QUEUE`` sends shadow runs to their own
Celery queue, so that a worker of their own takes them and live runs never wait behind them.
"""

from __future__ import annotations

import difflib
import json
import logging
import random
from typing import Any

from django.db import transaction

from agent_platform.errors import ApplicationError
from agents.budgets import budget_reserve
from agents.dispatch import run_dispatch
from agents.models import Agent, Run, ShadowComparison

logger = logging.getLogger(__name__)

# Answers at least this similar (difflib's ratio) count as the same answer.
ANSWER_AGREEMENT = 0.8

_rng = random.Random()  # noqa: S311 - sampling, not cryptography


def shadow_after_live(*, run_id: Any) -> Run | None:
    """Called once a live run has finished: start its shadow on the candidate version if the agent names one
    and the run is sampled. Never raises (the live run's outcome is stored already); returns the shadow run."""
    try:
        return _shadow_start(run_id)
    except Exception:
        logger.exception("run %s: could not start its shadow", run_id)
        return None


def _shadow_start(run_id: Any) -> Run | None:
    live = Run.objects.select_related("agent").filter(id=run_id, purpose=Run.Purpose.LIVE).first()
    if live is None or live.shadow_of_id is not None:
        return None
    agent: Agent = live.agent
    rate = float(agent.shadow_sample_rate or 0.0)
    if agent.shadow_version_id is None or rate <= 0.0 or (rate < 1.0 and _rng.random() >= rate):
        return None
    # A live run that already ran the candidate (its A/B arm's version, or the candidate made live) is not shadowed:
    # the pair would always agree, inflating the candidate's agreement, and spend a second run of calls and budget.
    if live.version_id == agent.shadow_version_id:
        return None
    with transaction.atomic():
        savepoint = transaction.savepoint()
        shadow = Run.objects.create(
            agent=agent,
            api_key=None,
            query=live.query,
            context=live.context,
            a2a_data=live.a2a_data,
            a2a_files=live.a2a_files,
            version_id=agent.shadow_version_id,
            purpose=Run.Purpose.SHADOW,
            shadow_of=live,
        )
        # A shadow spends the agent's tokens as a live run does: it reserves its share of the agent's budgets, and
        # is skipped (never the live run's failure) when they do not have it.
        try:
            budget_reserve(run=shadow, agent=agent, api_key=None)
        except ApplicationError as exc:
            transaction.savepoint_rollback(savepoint)
            logger.info("run %s: no shadow, %s", run_id, exc.message)
            return None
        time_limit_s = agent.time_limit_s
        transaction.on_commit(
            lambda: run_dispatch(run_id=str(shadow.id), time_limit_s=time_limit_s, purpose=Run.Purpose.SHADOW)
        )
    return shadow


def _calls(run: Run) -> list[tuple[str, str, str]]:
    """The tool calls a run made or attempted, in order: (server, tool, canonical arguments). Retries of one call
    count once; a call refused before it was sent (a blocked write, a bad argument) counts as attempted."""
    calls = []
    # The idempotency key the gate adds to a write it sends (``<run id>:<call>``, recorded as sent) is the run's own:
    # left out, or a live keyed write never matched its shadow's refused call.
    gate_key = f"{run.id}:"
    for event in run.audit_events.filter(action="tool.call", attempt__lte=1).order_by("id"):
        given = event.args or {}
        if isinstance(given, dict):
            given = {k: v for k, v in given.items() if not (isinstance(v, str) and v.startswith(gate_key))}
        args = json.dumps(given, sort_keys=True, ensure_ascii=False, default=str)
        calls.append((event.mcp_id, event.tool, args))
    return calls


def answer_similarity(a: str, b: str) -> float:
    if not a and not b:
        return 1.0
    return round(difflib.SequenceMatcher(a=a, b=b, autojunk=False).ratio(), 4)


def shadow_compare(*, shadow_run_id: Any) -> ShadowComparison | None:
    """Compare a finished shadow run with its live run and store the comparison (once). Returns it, or None when
    the shadow is not a finished shadow."""
    shadow = Run.objects.select_related("shadow_of").filter(id=shadow_run_id, purpose=Run.Purpose.SHADOW).first()
    if shadow is None or shadow.shadow_of is None or not shadow.is_finished or shadow.version_id is None:
        return None
    live = shadow.shadow_of
    live_calls, shadow_calls = _calls(live), _calls(shadow)
    same_tools = sorted((m, t) for m, t, _a in live_calls) == sorted((m, t) for m, t, _a in shadow_calls)
    same_args = sorted(live_calls) == sorted(shadow_calls)
    similarity = answer_similarity(live.answer, shadow.answer)
    same_status = live.status == shadow.status
    live_ms, shadow_ms = (live.timings or {}).get("total_ms"), (shadow.timings or {}).get("total_ms")
    live_tokens = (live.token_usage or {}).get("total_tokens")
    shadow_tokens = (shadow.token_usage or {}).get("total_tokens")
    comparison, _created = ShadowComparison.objects.get_or_create(
        live_run=live,
        defaults={
            "shadow_run": shadow,
            "agent_id": shadow.agent_id,
            "candidate_id": shadow.version_id,
            "agrees": same_status and same_tools and same_args and similarity >= ANSWER_AGREEMENT,
            "same_status": same_status,
            "same_tools": same_tools,
            "same_args": same_args,
            "answer_similarity": similarity,
            "live_tools": [f"{m}.{t}" for m, t, _a in live_calls],
            "shadow_tools": [f"{m}.{t}" for m, t, _a in shadow_calls],
            "latency_delta_ms": round(shadow_ms - live_ms, 2)
            if live_ms is not None and shadow_ms is not None
            else None,
            "tokens_delta": (
                int(shadow_tokens) - int(live_tokens) if live_tokens is not None and shadow_tokens is not None else None
            ),
        },
    )
    return comparison


def shadow_after_store(*, run_id: Any, purpose: str | None = None) -> None:
    """After a run's outcome is stored (``agents.execution``), or the run was failed without it (its time limit, its
    worker lost: ``agents.run_state.run_fail_unheld``): a finished live run may start its shadow; a finished shadow
    is compared with its live run. ``purpose``: the run's, read here when the caller does not know it. Called
    outside the transaction that finished the run. Never raises."""
    if purpose is None:
        try:
            purpose = Run.objects.filter(id=run_id).values_list("purpose", flat=True).first()
        except Exception:
            logger.exception("run %s: could not read it for its shadow", run_id)
            return
    if purpose == Run.Purpose.LIVE:
        shadow_after_live(run_id=run_id)
    elif purpose == Run.Purpose.SHADOW:
        try:
            shadow_compare(shadow_run_id=run_id)
        except Exception:
            logger.exception("run %s: could not compare the shadow with its live run", run_id)
