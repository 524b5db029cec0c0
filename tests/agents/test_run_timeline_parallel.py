"""A real run whose model asks for two calls in one turn, with tool selection on: each turn's selection reads in
words just before the turn it was for, and the calls made in parallel just after the turn that asked for them."""

from __future__ import annotations

import pytest

from agents.execution import run_execute
from agents.models import Run
from mcpregistry.models import McpServer, ToolContract
from tests import local_tool_fixtures as fixtures
from tests import parallel_tool_fixtures as parallel_fixtures
from tests.agents.test_run_timeline_entries import labels, step_with, timeline
from tests.conftest import discover_as_admin, make_agent

pytestmark = pytest.mark.django_db(transaction=True)

MODULES = ["tests.local_tool_fixtures", "tests.parallel_tool_fixtures"]


@pytest.fixture(autouse=True)
def parallel_calls_on(settings):  # type: ignore[no-untyped-def]
    settings.PLATFORM_LOCAL_TOOL_MODULES = ["mcpregistry.builtin_tools", *MODULES]
    settings.PLATFORM_PARALLEL_TOOL_CALLS = 4
    settings.PLATFORM_PARALLEL_TOOL_CALLS_PER_SERVER = 2
    fixtures.EXECUTED.clear()
    parallel_fixtures.RENDEZVOUS.reset()


def test_a_real_runs_parallel_calls_and_tool_selection_read_in_words_and_in_order(admin_client) -> None:
    server = McpServer(mcp_id="local-test", name="local-test", transport=McpServer.Transport.LOCAL, args=MODULES)
    server.full_clean()
    server.save()
    assert discover_as_admin(server=server).ok
    ToolContract.objects.filter(tool__server=server).update(risk="read")
    calls = [
        {"id": "c-1", "name": "rendezvous", "args": {"label": "first"}},
        {"id": "c-2", "name": "rendezvous", "args": {"label": "second"}},
    ]
    agent = make_agent(
        slug="parallel",
        servers=[server],
        provider="scripted",
        with_demo_rules=False,
        script=[{"tool_calls": calls}, {"content": "done"}],
    )
    agent.tool_selection = {"enabled": True, "top_k": 1, "pinned": ["rendezvous"]}
    agent.save()
    run = Run.objects.create(agent=agent, query="q")
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED and any(e.get("type") == "parallel_calls" for e in run.messages)
    found = timeline(admin_client, run)
    order = labels(found)
    assert not [s for s in found if "step-other" in s[0]]
    assert order.index("user query") < order.index("tool selection") < order.index("model turn 1")
    assert order[order.index("model turn 1") + 1] == "ran in parallel"
    assert order[order.index("model turn 2") - 1] == "tool selection"
    assert order.count("tool selection") == 2
    assert "rendezvous (pinned)" in step_with(found, "tools offered for turn 1")[2]
    assert "rendezvous, rendezvous at most 2 at once" in step_with(found, "ran in parallel")[2]
