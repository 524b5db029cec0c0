"""Budgets hold through a real Celery worker over Redis: runs on one key are admitted while the key's daily
budget has room, each settles with the tokens it really used, and the next one is refused with ``429
budget_exceeded`` and ``Retry-After``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import redis_server, wait_until, workers_killed_at_exit
from tests.e2e.test_worker_loss import (
    FAST_LIFECYCLE,
    SLEEPER,
    submit,
    wait_until_finished,
    wait_until_the_lease_lapses,
    wait_until_the_tool_sleeps,
)
from tests.e2e.workers import Platform, platform_without_workers

pytestmark = [pytest.mark.e2e, pytest.mark.redis]

AGENT = {
    "slug": "budgeted",
    "name": "Budgeted",
    "system_prompt": "예산 안에서 답한다.",
    "model": {"provider": "scripted", "model_id": "house-model", "params": {"script": [{"content": "예산 안의 답"}]}},
    "servers": [],
}
RESERVATION = 200


def key_budget(platform: Platform, *, max_tokens: int, reservation: int) -> None:
    platform.manage(
        "shell",
        "-c",
        "from agents.budgets import budget_create; from agents.models import ApiKey; "
        "budget_create(actor='e2e', via='shell', data={'api_key': ApiKey.objects.get(name='e2e'), "
        f"'period': 'day', 'max_tokens': {max_tokens}, 'run_reservation_tokens': {reservation}}})",
    )


def ask(platform: Platform) -> Any:
    with platform.client() as client:
        return client.post("/api/v1/runs?wait=60", json={"agent": "budgeted", "query": "남은 예산으로 답해줘"})


def test_runs_on_one_key_are_admitted_until_its_budget_is_spent_then_refused_with_retry_after(
    tmp_path: Path,
) -> None:
    env = {"PLATFORM_ALLOW_SCRIPTED_MODEL": "1"}
    with (
        redis_server(tmp_path) as broker_url,
        platform_without_workers(tmp_path, broker_url=broker_url, env=env) as p,
        workers_killed_at_exit(p),
    ):
        p.start_worker("w1")
        p.import_config({"agents": [AGENT]})
        # What one run costs in tokens (the scripted model counts a quarter token per character), measured first.
        first = ask(p)
        assert first.status_code == 200, first.text
        usage = first.json()["token_usage"]
        per_run = usage["input_tokens"] + usage["output_tokens"]
        assert first.json()["status"] == "succeeded" and per_run > 0
        # Room for three more runs' real tokens, not for a fourth run's reservation on top: the budget, created
        # mid-day, counts the day's first run too.
        limit = 4 * per_run + RESERVATION - 1
        key_budget(p, max_tokens=limit, reservation=RESERVATION)
        answered = [ask(p) for _ in range(3)]
        assert [(r.status_code, r.json()["status"]) for r in answered] == [(200, "succeeded")] * 3

        refused = ask(p)

        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "budget_exceeded"
        assert 0 < int(refused.headers["Retry-After"]) <= 86400
        # Each admitted run settled on the worker with what it used; nothing is left reserved.
        [(used, reserved)] = p.query("SELECT used_tokens, reserved_tokens FROM agents_budgetusage")
        assert (used, reserved) == (4 * per_run, 0)
        assert p.query("SELECT COUNT(*), COUNT(DISTINCT worker) FROM agents_run WHERE worker != ''") == [(4, 1)]


def model_turn_tokens(platform: Platform, run_id: str) -> int:
    turns = platform.run_events(run_id, "model_turn")
    return sum(t["usage"]["input_tokens"] + t["usage"]["output_tokens"] for t in turns)


def test_runs_cancelled_mid_call_or_lost_with_their_worker_are_charged_for_their_model_calls(tmp_path: Path) -> None:
    env = {**FAST_LIFECYCLE, "PLATFORM_RUN_MAX_DELIVERIES": "1", "PLATFORM_ALLOW_SCRIPTED_MODEL": "1"}
    with redis_server(tmp_path) as broker_url, platform_without_workers(tmp_path, broker_url=broker_url, env=env) as p:
        worker = p.start_worker("w1", wait=False)  # it starts while the commands below run (it has no run yet)
        p.import_config(SLEEPER)
        p.manage("mcp_discover", "probe")
        key_budget(p, max_tokens=100_000, reservation=5_000)
        worker.wait_ready()

        # Cancelled while its tool sleeps: its worker stops at the next step and stores no outcome.
        cancelled = submit(p)
        wait_until_the_tool_sleeps(p, cancelled)
        with p.client() as client:
            assert client.post(f"/api/v1/runs/{cancelled}/cancel").json()["status"] == "cancelled"
        wait_until(
            lambda: p.run_events(cancelled, "status")[-1]["status"] == "cancelled",
            timeout=60,
            what="the worker to stop the cancelled run",
        )
        spent_cancelled = model_turn_tokens(p, cancelled)
        assert spent_cancelled > 0 and p.run_row(cancelled)["tokens"] == spent_cancelled

        # Its worker killed while its tool sleeps: the reconciler fails it (worker_lost).
        lost = submit(p)
        wait_until_the_tool_sleeps(p, lost)
        worker.kill()
        wait_until_the_lease_lapses(p, lost)
        wait_until(
            lambda: "worker_lost: 1" in p.manage("reconcile_runs"), timeout=60, what="the reconciler", interval=0.5
        )
        row = wait_until_finished(p, lost)
        assert (row["status"], row["error_code"]) == ("failed", "worker_lost")
        spent_lost = model_turn_tokens(p, lost)
        assert spent_lost > 0 and row["tokens"] == spent_lost

        [(used, reserved)] = p.query("SELECT used_tokens, reserved_tokens FROM agents_budgetusage")
        assert (used, reserved) == (spent_cancelled + spent_lost, 0)
