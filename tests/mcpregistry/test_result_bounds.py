"""Bounds on what a tool's answer may be, through a real stdio server (``tests/mcp_fixtures/result_bounds_server``):

* defect E: a large structured content beside an image block (no text) is the call's value, so it is measured
  against ``PLATFORM_TOOL_RESULT_MAX_CHARS``: refused as ``result:too_big`` in a ReAct run (the model never reads it)
  and in a deterministic rule alike;
* defect F: an answer nested deeper than the MCP SDK's parser goes fails its call at once as ``result:shape`` (the
  server answered; its answer cannot be read), not after the whole timeout, and is not retried."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings

from agents.execution import run_execute
from agents.models import DeterministicRule, Run
from audit.models import AuditEvent
from mcpregistry import gate
from mcpregistry.models import McpServer
from mcpregistry.pool import get_default_pool
from tests.conftest import discover_as_admin, make_agent

pytestmark = pytest.mark.django_db

ROWS = 100_000


@pytest.fixture
def bounds_server(db: Any) -> Iterator[McpServer]:
    server = McpServer.objects.create(
        mcp_id="bounds",
        name="bounds",
        command=sys.executable,
        args=["-m", "tests.mcp_fixtures.result_bounds_server"],
        cwd=str(settings.BASE_DIR),
        session_scope="shared",
        timeout_s=5,
    )
    assert discover_as_admin(server=server).ok
    yield server
    get_default_pool().close("bounds")


@pytest.mark.slow
def test_a_large_structured_content_beside_an_image_is_refused_as_too_big(bounds_server: McpServer) -> None:
    result = gate.call(
        server=bounds_server, tool_name="image_rows", args={"rows": ROWS}, who=gate.GateCall(source="admin")
    )
    assert (result.ok, result.error, result.value) == (False, "result:too_big", None)
    event = AuditEvent.objects.get(action="tool.call", tool="image_rows")
    assert event.reason == "result:too_big"
    assert isinstance(event.result, dict) and event.result["chars"] > settings.PLATFORM_TOOL_RESULT_MAX_CHARS


def test_a_small_structured_content_beside_an_image_is_the_value(bounds_server: McpServer) -> None:
    result = gate.call(
        server=bounds_server, tool_name="image_rows", args={"rows": 2}, who=gate.GateCall(source="admin")
    )
    assert result.ok, result.message
    assert result.value == {"rows": [{"id": 0, "팀": "물류플랫폼팀"}, {"id": 1, "팀": "물류플랫폼팀"}]}


@pytest.mark.slow
def test_the_model_never_reads_a_too_big_structured_content_beside_an_image(bounds_server: McpServer) -> None:
    script: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "image_rows", "args": {"rows": ROWS}}]},
        {"content": "{last_tool_result}"},
    ]
    agent = make_agent(
        slug="charts", servers=[bounds_server], provider="scripted", script=script, with_demo_rules=False
    )
    run = Run.objects.create(agent=agent, query="차트의 행을 보여줘")

    run_execute(run_id=str(run.id))

    run.refresh_from_db()
    (tool,) = [m for m in run.messages if m.get("type") == "tool"]
    assert tool["error"] == "result:too_big"
    stored = json.dumps([run.messages, run.conversation, run.answer], ensure_ascii=False)
    assert "물류플랫폼팀" not in stored
    assert len(stored) < settings.PLATFORM_TOOL_RESULT_MAX_CHARS


def test_a_deterministic_rule_gets_no_too_big_structured_content_beside_an_image(bounds_server: McpServer) -> None:
    agent = make_agent(slug="chart-rule", servers=[bounds_server], with_demo_rules=False)
    DeterministicRule.objects.create(
        agent=agent,
        name="차트 행",
        server=bounds_server,
        tool_name="image_rows",
        when={"any_keywords": ["차트"]},
        params={"rows": ROWS},
    )
    run = Run.objects.create(agent=agent, query="차트의 행을 보여줘")

    run_execute(run_id=str(run.id))

    run.refresh_from_db()
    stored = json.dumps([run.deterministic_results, run.messages, run.conversation, run.answer], ensure_ascii=False)
    assert "물류플랫폼팀" not in stored
    assert "result:too_big" in stored
    assert len(stored) < settings.PLATFORM_TOOL_RESULT_MAX_CHARS


def test_an_answer_nested_too_deep_to_read_fails_its_call_at_once_and_is_not_retried(bounds_server: McpServer) -> None:
    started = time.monotonic()
    result = gate.call(server=bounds_server, tool_name="deep", args={"depth": 300}, who=gate.GateCall(source="admin"))
    took = time.monotonic() - started

    assert (result.ok, result.error, result.attempts) == (False, "result:shape", 1)
    assert took < bounds_server.timeout_s, took
    assert "recursion limit" in result.message
    (event,) = AuditEvent.objects.filter(action="tool.call", tool="deep")
    assert (event.reason, event.attempt) == ("result:shape", 1)
    # The session still answers: the next call on it is read as usual.
    after = gate.call(server=bounds_server, tool_name="deep", args={"depth": 3}, who=gate.GateCall(source="admin"))
    assert after.ok, after.message
    assert after.value == {"a": {"a": {"a": {"leaf": "바닥"}}}}
