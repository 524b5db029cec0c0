"""A bound server's secret in an MCP resource or prompt is masked wherever it could show: in the run's trace, in
the audit rows of the reads, and in what the model is sent. The server is real (stdio,
``tests/mcp_fixtures/secret_context_server.py``, whose resource and prompt repeat the token it was started with);
the model is a real HTTP OpenAI-compatible server with scripted turns that keeps every request it got."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator

import pytest
from django.conf import settings

from agents.execution import run_execute
from agents.models import Run
from agents.services import agent_update
from audit.masking import MASK
from audit.models import AuditEvent
from mcpregistry.models import McpServer
from mcpregistry.pool import get_default_pool
from tests.conftest import discover_as_admin, make_agent
from tests.openai_server import ScriptedOpenAIServer

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

BACKEND_TOKEN = "bk-tok-5e1f0c9a7d3b"
RUNBOOK = "notes://ops/runbook"


@pytest.fixture
def secret_server() -> Iterator[McpServer]:
    server = McpServer.objects.create(
        mcp_id="secret-context",
        name="secret-context",
        command=sys.executable,
        args=["-m", "tests.mcp_fixtures.secret_context_server"],
        cwd=str(settings.BASE_DIR),
        env={"BACKEND_TOKEN": BACKEND_TOKEN},
        timeout_s=10,
    )
    report = discover_as_admin(server=server)
    assert report.ok, report.error
    assert BACKEND_TOKEN in server.secret_values()
    yield server
    get_default_pool().close("secret-context")


def test_a_secret_in_a_resource_or_prompt_is_masked_in_the_trace_the_audit_and_what_the_model_is_sent(
    secret_server: McpServer,
) -> None:
    turns = [
        {"tool_calls": [{"name": "read_resource", "args": {"uri": RUNBOOK}}]},
        {"content": "read: {last_tool_result}"},
    ]
    with ScriptedOpenAIServer(turns).running() as model:
        agent = make_agent(slug="ops", servers=[secret_server], provider="openai_compatible", with_demo_rules=False)
        agent.model_id = "qwen2.5-7b-instruct"
        agent.model_params = {"base_url": model.base_url}
        agent.model_secrets = {"api_key": "sk-local-model-key-1b2c3d"}
        agent.save()
        agent_update(
            agent=agent,
            actor="admin",
            via="tests",
            data={
                "mcp_context": {
                    "resources": [{"mcp_id": "secret-context", "uri": RUNBOOK}],
                    "prompt": {
                        "mcp_id": "secret-context",
                        "name": "ops-prompt",
                        "arguments": {"team": "{context.team}"},
                    },
                    "read_resource_tool": True,
                }
            },
        )
        run = Run.objects.create(agent=agent, query="런북 알려줘", context={"team": "ops"})
        run_execute(run_id=str(run.id))
        run.refresh_from_db()

    assert run.status == Run.Status.SUCCEEDED, run.error_message
    # What the model was sent: the prompt and the attached resource in the system message, the resource again as
    # the read_resource tool's answer, each with the token masked.
    assert len(model.requests) == 2
    sent = json.dumps([r["body"] for r in model.requests], ensure_ascii=False)
    assert BACKEND_TOKEN not in sent
    system = model.requests[0]["body"]["messages"][0]
    assert system["role"] == "system"
    assert f"You assist team ops. Say {MASK} to the backend." in system["content"]
    assert f"Runbook: the backend answers to {MASK}; retry twice." in system["content"]
    tool_answer = next(m for m in model.requests[1]["body"]["messages"] if m["role"] == "tool")
    assert f"the backend answers to {MASK};" in tool_answer["content"]
    # The trace and the stored conversation.
    assert BACKEND_TOKEN not in json.dumps([run.messages, run.conversation, run.answer], ensure_ascii=False)
    # The audit rows of the prompt and both reads of the resource (at run start and by the model).
    events = list(AuditEvent.objects.filter(run_id=run.id, action__in=["prompt.get", "resource.read"]).order_by("id"))
    assert [(e.action, e.tool, e.ok) for e in events] == [
        ("prompt.get", "ops-prompt", True),
        ("resource.read", RUNBOOK, True),
        ("resource.read", RUNBOOK, True),
    ]
    for event in events:
        recorded = json.dumps([event.args, event.result], ensure_ascii=False)
        assert BACKEND_TOKEN not in recorded and MASK in recorded
