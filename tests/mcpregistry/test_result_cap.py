"""The platform-wide result cap: a tool result larger than ``PLATFORM_TOOL_RESULT_MAX_CHARS`` (or its contract's
``returns.max_chars``, lower or higher) is refused by the gate as ``result:too_big`` before it reaches the model,
the run's answer and trace, the API or the database; the audit keeps a short masked excerpt."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from rest_framework.test import APIClient

from agents.execution import run_execute
from agents.models import Run, RunEvent
from agents.services import api_key_create
from audit.models import AuditEvent
from mcpregistry import gate
from mcpregistry.models import McpServer, ToolContract
from mcpregistry.pool import get_default_pool
from tests.conftest import discover_as_admin, make_agent

# Marked slow: out of the fast loop (several seconds of real servers, processes or timeouts per test); the full
# suite runs it.
pytestmark = [pytest.mark.django_db, pytest.mark.slow]

HUGE = 5_000_000


@pytest.fixture(scope="module")
def _one_probe_process() -> Iterator[None]:
    """The module's tests bind the same probe: the pool gives each the session (and process) the test before left
    (its tools keep no state; a start of the probe is most of such a test's time). Closed after the last test."""
    yield
    get_default_pool().close("big")


@pytest.fixture
def probe(db: Any, _one_probe_process: None) -> Any:
    server = McpServer.objects.create(
        mcp_id="big",
        name="big",
        command=sys.executable,
        args=["-m", "tests.mcp_fixtures.probe_server"],
        cwd=str(settings.BASE_DIR),
        session_scope="shared",
        timeout_s=60,
    )
    assert discover_as_admin(server=server).ok
    return server


def call(server: McpServer, chars: int) -> gate.ToolResult:
    server = McpServer.objects.prefetch_related("tools__contract").get(pk=server.pk)
    return gate.call(server=server, tool_name="big_text", args={"chars": chars}, who=gate.GateCall(source="admin"))


def test_a_five_million_character_result_never_reaches_the_run_the_api_or_the_database(probe: McpServer) -> None:
    key, raw = api_key_create(actor="test", via="tests", name="caller")
    agent = make_agent(
        slug="reads-big",
        servers=[probe],
        provider="scripted",
        with_demo_rules=False,
        script=[
            {"tool_calls": [{"name": "big_text", "args": {"chars": HUGE}}]},
            {"content": "결과: {last_tool_result}"},
        ],
    )
    run = Run.objects.create(agent=agent, api_key=key, query="큰 결과를 가져와")
    run_execute(run_id=str(run.id))
    run.refresh_from_db()

    assert run.status == Run.Status.SUCCEEDED
    # in the agent's language (ko); a line this long (30 MB) is refused by the pool unread, before the gate's cap
    assert "[result:too_big]" in run.answer and "읽지 않고 거부했습니다" in run.answer
    assert len(run.answer) < 2_000
    assert len(json.dumps(run.messages, ensure_ascii=False)) < 20_000
    assert len(json.dumps(run.conversation, ensure_ascii=False)) < 20_000
    events = RunEvent.objects.filter(run=run)
    assert sum(len(json.dumps(e.data, ensure_ascii=False)) for e in events) < 20_000
    [audited] = AuditEvent.objects.filter(run_id=run.id, tool="big_text")
    assert (audited.ok, audited.reason) == (False, "result:too_big")
    assert len(json.dumps(audited.result, ensure_ascii=False)) < 1_000
    assert "16777216" in str(audited.result)  # the limit read, in the run's language

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    response = client.get(f"/api/v1/runs/{run.id}")
    assert response.status_code == 200
    assert len(response.content) < 50_000


def test_a_result_is_refused_once_and_not_retried(probe: McpServer) -> None:
    result = call(probe, 20_001)
    assert (result.ok, result.error, result.attempts, result.value) == (False, "result:too_big", 1, None)
    assert "20001 characters, more than 20000" in result.message
    assert call(probe, 20_000).ok


def test_a_contract_may_set_a_lower_or_a_higher_cap(probe: McpServer) -> None:
    contract = ToolContract.objects.filter(tool__server=probe, tool__name="big_text")
    contract.update(returns={"max_chars": 100})
    assert call(probe, 101).error == "result:too_big"
    contract.update(returns={"max_chars": 50_000})
    result = call(probe, 40_000)
    assert result.ok and len(result.value) == 40_000


def test_the_platform_cap_is_a_setting(probe: McpServer, settings: Any) -> None:
    settings.PLATFORM_TOOL_RESULT_MAX_CHARS = 10
    assert call(probe, 11).error == "result:too_big"
    assert call(probe, 10).ok


def test_the_excerpt_of_a_refused_result_is_masked_before_it_is_cut(probe: McpServer) -> None:
    secret = "Qm7vT2pLx9RkW4zN8cYb"
    probe.env = {"PROBE_TOKEN": secret}
    probe.save()
    ToolContract.objects.filter(tool__server=probe, tool__name="echo").update(returns={"max_chars": 300})
    server = McpServer.objects.prefetch_related("tools__contract").get(pk=probe.pk)
    text = "x" * 183 + secret + "y" * 400  # the excerpt's 200 characters would end inside the secret

    result = gate.call(server=server, tool_name="echo", args={"text": text}, who=gate.GateCall(source="admin"))

    assert result.error == "result:too_big"
    [audited] = AuditEvent.objects.filter(tool="echo", action="tool.call")
    assert audited.result["excerpt"].startswith("x" * 183 + "***")
    assert secret[:6] not in json.dumps(audited.result)


def test_a_result_of_an_image_and_a_resource_reads_as_what_it_is_not_as_nothing(probe: McpServer) -> None:
    server = McpServer.objects.prefetch_related("tools__contract").get(pk=probe.pk)
    result = gate.call(server=server, tool_name="picture", args={}, who=gate.GateCall(source="admin"))
    assert result.ok, result.message
    assert "[image: image/png, 308 bytes, not shown]" in str(result.value)
    assert "사진 설명: 회의실 A" in str(result.value)
    assert "iVBOR" not in str(result.value)  # never the bytes


def test_json_text_beside_an_image_is_still_read_as_json(probe: McpServer) -> None:
    server = McpServer.objects.prefetch_related("tools__contract").get(pk=probe.pk)
    result = gate.call(server=server, tool_name="picture_with_data", args={}, who=gate.GateCall(source="admin"))
    assert result.ok and result.value == {"id": 7, "room": "회의실 A"}


def test_an_answer_nested_past_the_parsers_depth_is_kept_as_text_not_a_crash() -> None:
    """A hostile server's ``[[[[…]]]]`` used to raise RecursionError out of the result's parse (not a ValueError,
    which keeps a text that is no JSON as text)."""
    from agents.flows.common import as_data
    from mcpregistry.gate import _parse

    deep = "[" * 5000 + "]" * 5000
    assert _parse(deep) == deep
    assert as_data(deep) == deep
    assert _parse('{"a": [1, 2]}') == {"a": [1, 2]}
