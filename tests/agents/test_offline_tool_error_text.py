"""A read tool's own error text reaches the user of an offline run (seed 001: a good tool error says what is
needed to choose, "등록된 자산: …").

Defect held here: a run of the offline provider whose deterministic calls all failed told the user only a
generic sentence ("the tool reported an error"), while the tool had said which assets exist; the tool's text
lived only inside the gate's guidance for a model (``message``), which must not reach a user. The gate now keeps
a read tool's ``tool:error`` text, masked and cut, in ``ToolResult.tool_error_text``, and the run's message says
it after the generic sentence; never for other reason codes, never for a write, never unmasked.
"""

from __future__ import annotations

from typing import Any

import pytest

from agents.answers import all_calls_failed_text
from agents.execution import run_execute
from agents.models import Agent, Run
from mcpregistry import gate
from mcpregistry.models import McpServer, ToolContract
from mcpregistry.pool import ToolCallOutcome
from tests.conftest import DEMO_SECRET, bind_demo_server, make_agent

pytestmark = pytest.mark.django_db

UNKNOWN_ASSET_QUESTION = "A-9999 자산의 현재 상태를 알려주세요."


class AnsweringWithAnError:
    """Stands in for the session pool: every call is answered with the tool's own error (``isError``), as a
    FastMCP tool that raised ``ToolError(text)`` is."""

    def __init__(self, text: str) -> None:
        self.text = text

    def call_tool(self, *args: Any, **kwargs: Any) -> ToolCallOutcome:
        return ToolCallOutcome(
            is_error=True, text=self.text, structured=None, content=[{"type": "text", "text": self.text}]
        )


def submit(agent: Agent, query: str) -> Run:
    run = Run.objects.create(agent=agent, query=query)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    return run


def call(server: McpServer, tool: str, args: dict[str, Any], **who: Any) -> gate.ToolResult:
    server = McpServer.objects.prefetch_related("tools__contract").get(pk=server.pk)
    return gate.call(server=server, tool_name=tool, args=args, who=gate.GateCall(source="admin", **who))


@pytest.mark.slow
def test_the_gate_keeps_a_read_tools_own_error_text_apart_from_the_models_guidance(db: None) -> None:
    server = bind_demo_server(mcp_id="assets")
    result = call(server, "get_asset_status", {"asset_id": "A-9999"})
    assert (result.ok, result.error, result.value) == (False, "tool:error", None)
    assert result.tool_error_text.startswith("'A-9999' 자산을 찾을 수 없습니다. 등록된 자산: A-1001")
    assert "fallback" not in result.tool_error_text
    assert result.as_dict()["tool_error_text"] == result.tool_error_text


@pytest.mark.slow
def test_an_offline_run_tells_the_user_what_the_tool_said(db: None) -> None:
    server = bind_demo_server(mcp_id="assets")
    agent = make_agent(slug="offline-tool-text", servers=[server])
    run = submit(agent, UNKNOWN_ASSET_QUESTION)
    assert (run.status, run.error_code) == (Run.Status.FAILED, "deterministic:tool_failed")
    assert "등록된 자산: A-1001" in run.error_message
    assert "get_asset_status_backup" not in run.error_message


@pytest.mark.slow
def test_a_secret_in_the_tools_error_text_is_masked_in_the_message_the_user_reads(
    db: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = bind_demo_server(mcp_id="assets-leaky")
    monkeypatch.setattr(
        gate,
        "get_default_pool",
        lambda: AnsweringWithAnError(f"backend refused key={DEMO_SECRET}; 등록된 자산: A-1001"),
    )
    agent = make_agent(slug="offline-leaky", servers=[server])
    run = submit(agent, UNKNOWN_ASSET_QUESTION)
    assert run.error_code == "deterministic:tool_failed"
    assert "등록된 자산: A-1001" in run.error_message
    assert DEMO_SECRET not in run.error_message
    [result] = run.deterministic_results
    assert result["tool_error_text"] and DEMO_SECRET not in result["tool_error_text"]


@pytest.mark.slow
def test_the_tools_text_is_cut_as_the_models_message_cuts_it(db: None, monkeypatch: pytest.MonkeyPatch) -> None:
    server = bind_demo_server(mcp_id="assets-long")
    monkeypatch.setattr(gate, "get_default_pool", lambda: AnsweringWithAnError("등록된 자산: " + "가" * 5000))
    result = call(server, "get_asset_status", {"asset_id": "A-9999"})
    assert result.error == "tool:error" and len(result.tool_error_text) == 500


@pytest.mark.slow
def test_an_error_text_the_gate_reads_as_a_rate_limit_is_not_shown(
    db: None, monkeypatch: pytest.MonkeyPatch, gate_clock: Any
) -> None:
    """The tool's isError text that names a backend failure is classified (``rate_limit``, ``timeout``): the user
    is told to try again later, not the tool's text (which names a tool for the model to use)."""
    server = bind_demo_server(mcp_id="assets-limited")
    ToolContract.objects.filter(tool__server=server, tool__name="get_asset_status").update(fallback_tool="")
    text = "429 rate_limit: 에러: 호출 한도를 초과했습니다. get_asset_status_backup 도구를 사용하세요."
    monkeypatch.setattr(gate, "get_default_pool", lambda: AnsweringWithAnError(text))
    agent = make_agent(slug="offline-limited", servers=[server])
    run = submit(agent, UNKNOWN_ASSET_QUESTION)
    assert run.error_code == "deterministic:tool_failed"
    assert [r["error"] for r in run.deterministic_results] == ["rate_limit"]
    assert run.deterministic_results[0]["tool_error_text"] == ""
    assert "호출 한도" not in run.error_message and "get_asset_status_backup" not in run.error_message


@pytest.mark.slow
def test_a_write_tools_own_error_text_is_not_kept_for_a_person(db: None, monkeypatch: pytest.MonkeyPatch) -> None:
    server = bind_demo_server(mcp_id="assets-write")
    ToolContract.objects.filter(tool__server=server, tool__name="get_asset_status").update(risk="write")
    monkeypatch.setattr(gate, "get_default_pool", lambda: AnsweringWithAnError("'A-9999' 자산을 찾을 수 없습니다."))
    # A sandboxed evaluation's write is sent without a person's approval.
    result = call(
        server,
        "get_asset_status",
        {"asset_id": "A-9999"},
        writes_blocked=True,
        write_sandbox=frozenset({"assets-write"}),
    )
    assert result.error == "tool:error" and "찾을 수 없습니다" in result.message
    assert result.tool_error_text == ""


def test_only_a_tool_error_s_text_follows_the_sentence() -> None:
    results = [
        {"tool": "get_asset_status", "error": "tool:error", "tool_error_text": "등록된 자산: A-1001"},
        {"tool": "list_projects", "error": "timeout", "tool_error_text": "stale text"},
    ]
    text = all_calls_failed_text(language="en", results=results)
    assert text == (
        "The information needed for this answer could not be retrieved. Please try again later. "
        "get_asset_status said: “등록된 자산: A-1001”"
    )


def test_a_tool_errors_hidden_characters_are_written_out_for_the_caller() -> None:
    """The failure text reaches people and A2A/MCP callers (often another agent's model, which reads a tag
    character as ASCII; a right-to-left override turns what follows around on a screen)."""
    results = [{"tool": "lookup", "error": "tool:error", "tool_error_text": "invoice\u202efdp.exe \U000e0049gnore 끝"}]
    text = all_calls_failed_text(language="en", results=results)
    assert "\u202e" not in text and "\U000e0049" not in text
    assert "invoice⟦U+202E⟧fdp.exe ⟦U+E0049⟧gnore 끝" in text
