"""Defect A: a parked ``openai_compatible`` run resumes. Its stored conversation is masked, but LangChain's own
message structure (``usage_metadata`` with its ``input_token_details`` / ``output_token_details``, the
``response_metadata`` token counts) must survive masking, or the resumed pass cannot rebuild its messages."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from langchain_core.messages import AIMessage, HumanMessage, messages_from_dict

from agents.approvals import approval_decide
from agents.engine import stored_conversation
from agents.execution import run_execute
from agents.models import Run
from mcpregistry.models import McpServer, ToolContract
from mcpregistry.pool import get_default_pool
from tests.conftest import discover_as_admin, make_agent
from tests.openai_server import ScriptedOpenAIServer

pytestmark = pytest.mark.django_db


@pytest.fixture
def notes_server(db: Any, tmp_path: Path) -> Iterator[tuple[McpServer, Path]]:
    notes = tmp_path / "notes.txt"
    server = McpServer.objects.create(
        mcp_id="notes",
        name="notes",
        command=sys.executable,
        args=["-m", "tests.mcp_fixtures.probe_server"],
        cwd=str(settings.BASE_DIR),
        env={"NOTES_FILE": str(notes)},
        session_scope="shared",
    )
    assert discover_as_admin(server=server).ok
    ToolContract.objects.filter(tool__server=server, tool__name="append_note").update(idempotency_arg="idempotency_key")
    yield server, notes
    get_default_pool().close("notes")


@pytest.mark.slow
def test_an_openai_compatible_run_parked_for_an_approval_resumes_and_succeeds(
    notes_server: tuple[McpServer, Path],
) -> None:
    server, notes = notes_server
    turns: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "append_note", "args": {"text": "회의록 저장"}}]},
        {"content": "저장했습니다: {last_tool_result}"},
    ]
    with ScriptedOpenAIServer(turns).running() as model_server:
        agent = make_agent(slug="notes-llm", servers=[server], provider="openai_compatible", with_demo_rules=False)
        agent.model_id = "qwen2.5-7b-instruct"
        agent.model_params = {"base_url": model_server.base_url, "max_tokens": 512}
        agent.model_secrets = {"api_key": "sk-local-model-key-7f3a9c"}
        agent.full_clean()
        agent.save()
        run = Run.objects.create(agent=agent, query="회의록을 저장해줘")

        run_execute(run_id=str(run.id))
        run.refresh_from_db()
        assert run.status == Run.Status.AWAITING_APPROVAL, (run.error_code, run.error_message)
        # The stored conversation keeps LangChain's token counts as numbers (no secret in them).
        ai_turn = next(m for m in run.conversation if m["type"] == "ai")
        assert isinstance(ai_turn["data"]["usage_metadata"]["input_token_details"], dict)
        assert isinstance(ai_turn["data"]["usage_metadata"]["output_token_details"], dict)

        approval = run.approvals.get()
        approval_decide(run=run, approval_id=str(approval.pk), decision="approve", actor="reviewer")
        run_execute(run_id=str(run.id))

    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, (run.error_code, run.error_message)
    assert run.answer.startswith("저장했습니다")
    written = notes.read_text(encoding="utf-8").splitlines()
    assert [line.split("\t")[0] for line in written] == ["회의록 저장"]  # once, with its idempotency key


def test_a_stored_conversation_keeps_its_token_counts_where_a_secret_of_digits_equals_one() -> None:
    usage = {
        "input_tokens": 1234,
        "output_tokens": 10,
        "total_tokens": 1244,
        "input_token_details": {"cache_read": 1234},
    }
    turn = AIMessage("", usage_metadata=usage)

    stored = stored_conversation([HumanMessage("PIN 1234"), turn], ["1234"])

    assert stored[0]["data"]["content"] == "PIN ***"  # the secret is masked where it is one
    _human, resumed = messages_from_dict(stored)
    assert isinstance(resumed, AIMessage) and resumed.usage_metadata == usage
