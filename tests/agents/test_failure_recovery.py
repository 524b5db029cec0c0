"""Seed 001's failure injection end to end: the demo server's backend fails (timeout, rate limit, bad schema),
the gate retries what a retry can fix, and a scripted model that follows the fallback instruction recovers
through get_asset_status_backup. The seed's four DoD checks are the assertions."""

from __future__ import annotations

import logging

import pytest

from agents.execution import run_execute
from agents.models import Run
from audit.masking import SecretMaskingFilter
from tests.conftest import DEMO_SECRET, bind_demo_server, make_agent

# Marked slow: out of the fast loop (several seconds of real servers, processes or timeouts per test); the full
# suite runs it.
pytestmark = [pytest.mark.django_db, pytest.mark.slow]

QUESTION = "A-1001 자산의 현재 상태를 알려주세요."
FOLLOWS_THE_FALLBACK = [
    {"tool_calls": [{"name": "get_asset_status", "args": {"asset_id": "A-1001"}}]},
    {
        "if_last_tool_result_contains": "get_asset_status_backup",
        "tool_calls": [{"name": "get_asset_status_backup", "args": {"asset_id": "A-1001"}}],
    },
    {"content": "A-1001 상태: {last_tool_result}"},
]


@pytest.fixture
def agent_log(tmp_path):  # type: ignore[no-untyped-def]
    """Like the seed's agent.log: a file handler with the platform's masking filter, at DEBUG for everything
    (the servers' stderr included)."""
    path = tmp_path / "agent.log"
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.addFilter(SecretMaskingFilter())
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    yield path
    root.removeHandler(handler)
    root.setLevel(old_level)
    handler.close()


def run_with(failure_mode: str, **env: str) -> Run:
    server = bind_demo_server(mcp_id=f"assets-{failure_mode}", failure_mode=failure_mode, **env)
    agent = make_agent(
        slug=f"assets-{failure_mode}",
        servers=[server],
        provider="scripted",
        script=FOLLOWS_THE_FALLBACK,
        with_demo_rules=False,
    )
    run = Run.objects.create(agent=agent, query=QUESTION)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    return run


def tool_names(run: Run) -> list[str]:
    """The tools a run actually asked for, read from its trace (seed 001's tool_names)."""
    return [c["name"] for step in run.messages if step["type"] == "ai" for c in step.get("tool_calls", [])]


def test_a_normal_call_is_answered_from_the_live_backend(agent_log) -> None:
    run = run_with("none")
    # DoD 1: get_asset_status was requested and the answer has no error in it.
    assert tool_names(run) == ["get_asset_status"]
    assert run.status == Run.Status.SUCCEEDED
    assert "사용중" in run.answer and "에러" not in run.answer


@pytest.mark.parametrize(
    ("mode", "reason", "attempts"),
    [("timeout", "timeout", 3), ("rate_limit", "rate_limit", 3), ("bad_schema", "result:shape", 1)],
)
def test_an_injected_failure_is_answered_and_recovered_through_the_backup(
    mode, reason, attempts, agent_log, gate_clock
) -> None:  # type: ignore[no-untyped-def]
    run = run_with(mode)
    # DoD 2: the graph did not die; the run ended with an answer.
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert run.answer.strip()
    # DoD 3: recovered through the backup tool.
    assert tool_names(run) == ["get_asset_status", "get_asset_status_backup"]
    assert "백업 스냅샷 기준" in run.answer
    calls = run.audit_events.filter(tool="get_asset_status", action="tool.call").order_by("id")
    assert [(e.ok, e.reason) for e in calls] == [(False, reason)] * attempts
    # DoD 4: no secret in the log.
    text = agent_log.read_text(encoding="utf-8")
    assert DEMO_SECRET not in text and "AKIA" not in text


def test_rate_limits_back_off_like_the_seed(agent_log, gate_clock) -> None:
    run_with("rate_limit")
    first, second = gate_clock.slept
    assert 2.0 <= first <= 2.5 and 4.0 <= second <= 5.0


@pytest.mark.parametrize("provider", ["scripted", "offline"])
def test_a_recovered_failure_counts_as_a_failed_call_whoever_followed_the_fallback(
    provider: str, agent_log, gate_clock
) -> None:  # type: ignore[no-untyped-def]
    """The model recovering through the backup left its failed call counted (1); the demo's rules, whose failed call
    the gate answers from the backup itself, counted none: every failure-injection run of the shipped demo read clean
    in the runs list and the API. Both count the failed call."""
    server = bind_demo_server(mcp_id=f"counted-{provider}", failure_mode="bad_schema")
    agent = make_agent(
        slug=f"counted-{provider}",
        servers=[server],
        provider=provider,
        script=FOLLOWS_THE_FALLBACK if provider == "scripted" else None,
        with_demo_rules=provider == "offline",
    )
    run = Run.objects.create(agent=agent, query=QUESTION)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()

    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert "백업 스냅샷 기준" in run.answer
    assert run.tool_failures == 1
