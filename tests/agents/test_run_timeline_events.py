"""A run still going, cancelled, or stopped by its iterations shows the steps its events recorded (the stored
trace has none of them); a rejected approval says it was rejected; a known error reads in the reader's
language."""

from __future__ import annotations

from typing import Any

import pytest

from agents.execution import run_execute
from agents.models import Run, RunEvent
from tests.agents.test_approvals import WRITES_A_NOTE, decide, eager_tasks, notes, park, writer  # noqa: F401
from tests.agents.test_run_timeline_entries import a_run, labels, step_with, timeline
from tests.conftest import make_agent

pytestmark = pytest.mark.django_db


def events(run: Run, *rows: tuple[str, dict[str, Any]]) -> None:
    for seq, (kind, data) in enumerate(rows, start=1):
        RunEvent.objects.create(run=run, seq=seq, kind=kind, data=data)


def test_a_run_still_going_shows_the_steps_its_events_recorded(admin_client) -> None:
    run = a_run(status=Run.Status.RUNNING, answer="")
    events(
        run,
        ("status", {"status": "running", "delivery": 1}),
        ("rule", {"rule": "팀 조회", "mcp_id": "sds", "tool": "team", "matched": True, "params": {"name": "김"}}),
        ("deterministic_result", {"rule_id": 1, "mcp_id": "sds", "tool": "team", "ok": True, "value": "A팀"}),
        ("model_turn", {"type": "ai", "content": "", "tool_calls": [{"id": "c1", "name": "org", "args": {}}]}),
        ("tool_call", {"source": "agent", "call_id": "c1", "tool": "org", "ok": False, "error": "tool:error",
                       "message": "조직을 찾지 못함"}),
    )  # fmt: skip
    found = timeline(admin_client, run)
    order = labels(found)
    assert order == ["rule decision", "deterministic call", "user query", "model turn 1", "tool call", "status"]
    call = step_with(found, "조직을 찾지 못함")
    assert "status-failed" in call[0] and "tool:error" in call[2]


def test_a_run_stopped_by_its_iterations_shows_its_model_turns_and_calls(admin_client, demo_server) -> None:
    again = {"tool_calls": [{"name": "search_employee", "args": {"name": "김하늘"}}]}
    agent = make_agent(
        slug="loops", servers=[demo_server], provider="scripted", with_demo_rules=False, script=[again] * 5
    )
    agent.max_iterations = 2
    agent.save()
    run = Run.objects.create(agent=agent, query="김하늘 팀 알려줘")
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert run.error_code == "max_iterations"
    order = labels(timeline(admin_client, run))
    assert order == ["system message", "user query", "model turn 1", "tool call", "model turn 2", "tool call", "error"]


def test_a_cancelled_run_shows_what_it_did_before(admin_client) -> None:
    run = a_run(status=Run.Status.CANCELLED, answer="", error_code="cancelled", error_message="cancelled by admin:boss")
    events(
        run,
        ("model_turn", {"type": "ai", "content": "생각 중"}),
        ("status", {"status": "cancelled", "answer": "", "error": "cancelled"}),
    )
    found = timeline(admin_client, run)
    assert labels(found) == ["user query", "model turn 1", "error"]
    assert "생각 중" in found[1][2]


@pytest.mark.slow
def test_a_rejected_approval_says_so_on_its_tool_call(writer, admin_client, django_capture_on_commit_callbacks) -> None:  # noqa: F811
    run, client = writer
    approval = park(run)
    with django_capture_on_commit_callbacks(execute=True):
        assert decide(client, run, approval, "reject", "필요 없음").status_code == 200
    run.refresh_from_db()
    call = next(s for s in timeline(admin_client, run) if s[1] == "tool call")
    assert "failed: ?" not in call[2] and "approval:rejected" in call[2] and "필요 없음" in call[2]


@pytest.mark.parametrize(
    ("code", "stored", "shown"),
    [
        ("cancelled", "cancelled by admin:boss", "«cancelled by %(actor)s»boss (admin)"),
        ("cancelled", "cancelled by api_key:apk_ab12 (client gone)", "«cancelled by %(actor)s»API key apk_ab12… (client gone)"),
        ("max_iterations", "the agent did not finish within 6 iterations", "«the agent did not finish within %(n)s iterations»6"),
        ("time_limit", "the run did not finish within its time limit (30 s)", "«the run did not finish within its time limit (%(s)s s)»30"),
        ("worker_lost", "the worker running it was lost 3 times", "«the worker running it was lost %(n)s times»3"),
        ("config:tool_name_conflict", "the agent's servers expose the same tool name(s): a, b; set a tool name prefix", "«the agent's servers expose the same tool name(s): %(names)s; set a tool name prefix»a, b"),
        ("budget:run_ceiling", "the run used 900 tokens, its budget reservation is 800", "«the run used %(used)s tokens, its budget reservation is %(ceiling)s»900800"),
        ("budget:run_ceiling", "the run used 100 tokens and its next model call may read 750; its budget reservation is 800", "«the run used %(used)s tokens and its next model call may read %(bound)s; its budget reservation is %(ceiling)s»100750800"),
        ("model:error", "boom", "boom"),
    ],
)  # fmt: skip
def test_a_known_errors_message_is_said_in_the_readers_words(admin_client, monkeypatch, code, stored, shown) -> None:  # type: ignore[no-untyped-def]
    import agents.admin_runs
    import agents.error_texts

    class Marked(str):
        def __mod__(self, values: Any) -> str:
            return str(self) + "".join(str(v) for v in values.values())

    monkeypatch.setattr(agents.error_texts, "gettext", lambda text: Marked(f"«{text}»"))  # the words live there
    run = a_run(status=Run.Status.FAILED, answer="", error_code=code, error_message=stored)
    error = next(s for s in agents.admin_runs.run_timeline(run) if s.kind == "error")
    assert error.result == shown


def test_a_turn_cut_by_an_error_event_mid_stream_says_so_not_that_its_connection_was_cut(admin_client) -> None:
    run = a_run(status=Run.Status.FAILED, answer="", error_code="model:unavailable", error_message="x")
    events(
        run,
        ("model_turn", {"type": "ai", "content": "", "usage_estimated": True, "unanswered": "unavailable"}),
        ("model_turn", {"type": "ai", "content": "", "usage_estimated": True, "unanswered": "connection"}),
    )
    found = timeline(admin_client, run)
    turns = [step for step in found if step[1].startswith("model turn")]
    assert "an error instead of the rest" in turns[0][2] and "connection was cut" not in turns[0][2]
    assert "connection was cut" in turns[1][2]
