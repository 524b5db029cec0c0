"""A binding's secret a server echoes disguised (full-width, zero-width spaces between its letters) is masked in
the model's tool message, the trace, the audit row, the answer and the API; a flood of one invisible character
reaches the model written once with its count, within the result cap; an offline answer and a flow's keep no raw
tag characters. Through a real stdio server (``tests.mcp_fixtures.s39_leaky_server``); only the model is scripted."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest
from django.conf import settings

from agents.execution import run_execute
from agents.models import Agent, DeterministicRule, Run
from audit.change_guard import change_scope
from audit.models import AuditEvent
from mcpregistry.models import McpServer
from mcpregistry.pool import get_default_pool
from tests.conftest import discover_as_admin, make_agent

pytestmark = [pytest.mark.django_db, pytest.mark.slow]  # a real stdio server each, 1.5 s or more

TOKEN = "bkTok5e1f0c9a7d3b"
FULL_WIDTH = "".join(chr(ord(c) + 0xFEE0) for c in TOKEN)
ZERO_WIDTH = "\u200b".join(TOKEN)


def _tags(text: str) -> bool:
    return any(0xE0000 <= ord(c) <= 0xE007F for c in text)


def _leaks(text: str) -> bool:
    """Whether ``text`` gives the token back in any of the forms the server sent it, raw or written out."""
    return FULL_WIDTH in text or ZERO_WIDTH in text or "k⟦U+200B⟧T" in text or TOKEN in text


@pytest.fixture
def leaky() -> Any:
    with change_scope(actor="tests", via="tests"):
        server = McpServer.objects.create(
            mcp_id="leaky",
            name="leaky",
            command=sys.executable,
            args=["-m", "tests.mcp_fixtures.s39_leaky_server"],
            cwd=str(settings.BASE_DIR),
            env={"BACKEND_TOKEN": TOKEN},
            timeout_s=20,
        )
    report = discover_as_admin(server=server)
    assert report.ok, report.error
    yield server
    get_default_pool().close("leaky")


def _run(agent: Agent, query: str = "q", **fields: Any) -> Run:
    run = Run.objects.create(agent=agent, query=query, **fields)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    return run


def test_disguised_secrets_are_masked_everywhere(leaky: McpServer, api_client: Any, api_caller: Any) -> None:
    tools = ("fullwidth", "zerowidth", "fullwidth_error", "invisible_flood")
    script = [
        {"tool_calls": [{"name": name, "args": {"q": "x"}} for name in tools]},
        {"content": "answer: {last_tool_result}"},
    ]
    agent = make_agent(slug="leaky-react", servers=[leaky], provider="scripted", script=script, with_demo_rules=False)
    run = _run(agent, api_key=api_caller.key)
    assert run.status == "succeeded", (run.error_code, run.error_message)

    said = {m.get("name"): str(m["content"]) for m in run.messages if m.get("type") == "tool"}
    assert set(said) == set(tools)
    for name in ("fullwidth", "zerowidth", "fullwidth_error"):
        assert "***" in said[name] and not _leaks(said[name]), said[name]
    # 19,000 tag characters (under the 20,000 cap) reach the model written once, not 171,002 characters long.
    assert said["invisible_flood"] == '<tool_data>\n"ok⟦U+E0041 ×19000⟧"\n</tool_data>'
    assert not _leaks(json.dumps(run.messages, ensure_ascii=False))

    events = AuditEvent.objects.filter(run_id=run.id, action="tool.call")
    assert {e.tool for e in events} >= set(tools)
    for event in events:
        recorded = json.dumps([event.result, event.args], ensure_ascii=False, default=str)
        assert not _leaks(recorded), (event.tool, recorded[:300])

    answer = api_client.get(f"/api/v1/runs/{run.id}")
    assert answer.status_code == 200
    assert answer.json()["answer"] == run.answer == 'answer: <tool_data>\n"ok⟦U+E0041 ×19000⟧"\n</tool_data>'
    assert not _leaks(answer.content.decode())


def test_a_result_that_written_out_passes_the_cap_is_too_big(leaky: McpServer, settings: Any) -> None:
    """The cap is measured as the model reads the result: 34 characters are under a cap of 40, but not once its 28
    tag characters are written out (tag characters that differ cannot be written once with a count)."""
    settings.PLATFORM_TOOL_RESULT_MAX_CHARS = 40
    script = [{"tool_calls": [{"name": "tagged", "args": {"q": "x"}}]}, {"content": "done"}]
    agent = make_agent(slug="leaky-cap", servers=[leaky], provider="scripted", script=script, with_demo_rules=False)
    run = _run(agent)
    (said,) = [str(m["content"]) for m in run.messages if m.get("type") == "tool"]
    assert "result:too_big" in said and not _tags(said)
    event = AuditEvent.objects.get(run_id=run.id, action="tool.call", tool="tagged")
    assert event.reason == "result:too_big"


def test_an_offline_answer_writes_out_tag_characters(leaky: McpServer, api_client: Any, api_caller: Any) -> None:
    agent = make_agent(slug="leaky-offline", servers=[leaky], provider="offline", with_demo_rules=False)
    DeterministicRule.objects.create(
        agent=agent,
        server=leaky,
        name="plain",
        order=10,
        tool_name="tagged",
        when={"any_keywords": ["팀장"]},
        params={"q": "{query}"},
    )
    run = _run(agent, "팀장 누구?", api_key=api_caller.key)
    assert run.status == "succeeded", (run.error_code, run.error_message)
    assert not _tags(run.answer)
    assert "김하늘 팀장⟦U+E0049⟧⟦U+E0047⟧" in run.answer
    shown = api_client.get(f"/api/v1/runs/{run.id}").json()["answer"]
    assert shown == run.answer


def test_an_answer_template_writes_out_its_values_not_its_own_words(leaky: McpServer) -> None:
    agent = make_agent(slug="leaky-template", servers=[leaky], provider="offline", with_demo_rules=False)
    DeterministicRule.objects.create(
        agent=agent,
        server=leaky,
        name="templated",
        order=10,
        tool_name="tagged",
        when={"any_keywords": ["팀장"]},
        params={"q": "{query}"},
        answer_template="👩\u200d💻 담당: {result}",
    )
    run = _run(agent, "팀장 누구?")
    assert run.status == "succeeded", (run.error_code, run.error_message)
    assert not _tags(run.answer)
    # The template's own zero-width joiner (an emoji sequence) is kept; the tool's tag characters written out.
    assert run.answer.startswith("👩\u200d💻 담당: 김하늘 팀장⟦U+E0049⟧"), run.answer
