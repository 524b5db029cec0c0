"""Defect B: a secret the model writes as an argument's name (``args:unknown:<name>``) is masked in the reason code
itself, where the gate builds its result, so no reader of the code shows it: the run's trace (``Run.messages``),
the span's status, ``platform.reason_code``, ``error.type`` and its ``gate.attempt`` event, the audit row (and the
metrics' reason label read from it)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agents.execution import run_execute
from agents.models import Run
from audit.models import AuditEvent
from mcpregistry import gate
from mcpregistry.models import McpServer
from tests.conftest import DEMO_SECRET, make_agent

pytestmark = pytest.mark.django_db


def _span_text(finished: Any) -> str:
    parts = []
    for span in finished:
        parts += [span.name, span.status.description or "", json.dumps(dict(span.attributes or {}), default=str)]
        parts += [json.dumps(dict(event.attributes or {}), default=str) for event in span.events]
    return "\n".join(parts)


@pytest.mark.slow
def test_a_secret_written_as_an_argument_name_is_masked_in_the_reason_code_everywhere(
    spans: Any, demo_server: McpServer
) -> None:
    script: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "search_employee", "args": {"name": "박도윤", DEMO_SECRET: 1}}]},
        {"content": "끝"},
    ]
    agent = make_agent(slug="leaky", servers=[demo_server], provider="scripted", script=script, with_demo_rules=False)
    run = Run.objects.create(agent=agent, query="박도윤 님?")

    run_execute(run_id=str(run.id))

    run.refresh_from_db()
    refused = [m for m in run.messages if m.get("type") == "tool" and m.get("error")]
    assert [m["error"] for m in refused] == ["args:unknown:***"]
    assert DEMO_SECRET not in json.dumps(run.messages, ensure_ascii=False)
    assert DEMO_SECRET not in json.dumps(run.conversation, ensure_ascii=False)
    event = AuditEvent.objects.get(run_id=run.id, action="tool.call")
    assert event.reason == "args:unknown:***"
    finished = spans.get_finished_spans()
    (call,) = [s for s in finished if s.name == "execute_tool search_employee"]
    assert call.attributes["platform.reason_code"] == "args:unknown:***"
    assert call.attributes["error.type"] == "args:unknown:***"
    assert call.status.description == "args:unknown:***"
    assert call.events[0].attributes["platform.reason_code"] == "args:unknown:***"
    assert DEMO_SECRET not in _span_text(finished)


def test_the_gates_result_carries_the_masked_code(demo_server: McpServer) -> None:
    who = gate.GateCall(source="admin", actor="tester")
    result = gate.call(server=demo_server, tool_name="search_employee", args={DEMO_SECRET: 1}, who=who)
    assert result.error == "args:unknown:***"
    assert DEMO_SECRET not in result.message
