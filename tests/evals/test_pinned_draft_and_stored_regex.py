"""What an eval run runs and scores stays what it was at its start, whatever the agent or the case holds.

Defect 2: an agent never published has no version to pin, so its eval run pinned none: its cases ran the draft as
each was submitted, and a first publish while the eval ran moved the remaining cases onto the new version. Now the
draft as it is at the start is frozen as a candidate version (not live: live traffic goes on running the draft)
and every case runs that, on every path that starts an eval (the admin, the API and ``run_eval`` all start one
with ``eval_run_start``).
Defect 3: a case's stored answer regex was compiled at scoring time without the bound the editor applies; one
that does not compile raised out of the scoring, so its eval run never ended. Now the case fails, saying why.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.core.cache import cache
from rest_framework.test import APIClient

from agents.models import AgentVersion, Run
from agents.services import agent_update, agent_version_publish, api_key_create
from audit.models import AuditEvent
from evals.models import EvalCase, EvalCaseResult, EvalRun
from evals.services import eval_run_start
from mcpregistry.models import McpServer
from tests.evals.conftest import bind_stock_server, scripted_agent
from tests.evals.test_eval_isolation import run_to_end, stock_set

pytestmark = pytest.mark.django_db(transaction=True)

LOOKUP: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "lookup_stock", "args": {"sku": "X-1"}}]},
    {"content": "7개 있습니다"},
]
CASES = (
    {"key": "a", "query": "X-1 재고?", "expected_tools": ["lookup_stock"]},
    {"key": "b", "query": "X-1 재고 다시?", "expected_tools": ["lookup_stock"]},
)


@pytest.fixture
def server(settings: Any) -> Iterator[McpServer]:
    cache.clear()
    yield bind_stock_server(settings)
    cache.clear()


def test_an_eval_of_an_agent_never_published_runs_its_draft_as_at_the_start_through_a_first_publish(
    server: McpServer,
) -> None:
    agent = scripted_agent(slug="stock-agent", server=server, script=LOOKUP)
    prompt = agent.system_prompt
    eval_run = eval_run_start(eval_set=stock_set(*CASES), agent=agent, actor="ops", window=1)

    frozen = AgentVersion.objects.get(agent=agent)
    assert eval_run.version == frozen.number
    assert isinstance(frozen.content, dict) and frozen.content["agent"]["system_prompt"] == prompt
    agent.refresh_from_db()
    assert agent.live_version is None  # a candidate: live traffic goes on running the draft
    publish = AuditEvent.objects.get(action="config.agent_version.publish")
    assert publish.actor == "ops" and (publish.result or {}).get("via") == "eval"

    # The draft edited and published for the first time while the eval runs: the next case is not moved.
    agent_update(agent=agent, actor="test", via="tests", data={"system_prompt": "새 프롬프트"})
    first = agent_version_publish(agent=agent, actor="test", via="tests")
    assert first.number != frozen.number
    eval_run = run_to_end(eval_run, window=1)

    assert dict(eval_run.results.values_list("case__key", "run__version")) == {"a": frozen.pk, "b": frozen.pk}


def test_evals_of_an_unchanged_draft_pin_one_frozen_version(server: McpServer) -> None:
    agent = scripted_agent(slug="stock-agent", server=server, script=LOOKUP)
    eval_set = stock_set(*CASES)
    first = eval_run_start(eval_set=eval_set, agent=agent, actor="ops")
    again = eval_run_start(eval_set=eval_set, agent=agent, actor="ops")
    assert first.version == again.version and AgentVersion.objects.filter(agent=agent).count() == 1

    agent_update(agent=agent, actor="test", via="tests", data={"system_prompt": "바뀐 초안"})
    edited = eval_run_start(eval_set=eval_set, agent=agent, actor="ops")
    assert edited.version != first.version  # the draft as it is now, frozen anew

    published = agent_version_publish(agent=agent, actor="test", via="tests")
    assert eval_run_start(eval_set=eval_set, agent=agent, actor="ops").version == published.number


def test_an_admins_eval_freezes_the_draft_as_published_by_the_username_as_the_admins_own_publish_records(
    server: McpServer,
) -> None:
    agent = scripted_agent(slug="stock-agent", server=server, script=LOOKUP)
    eval_run = eval_run_start(eval_set=stock_set(*CASES), agent=agent, actor="admin:alice", via="admin")

    assert eval_run.started_by == "admin:alice"  # the eval run's own record, as a run's cancellation names it
    frozen = AgentVersion.objects.get(agent=agent)
    assert frozen.published_by == "alice"
    assert AuditEvent.objects.get(action="config.agent_version.publish").actor == "alice"


def test_an_eval_started_through_the_api_on_an_agent_never_published_pins_its_frozen_draft(
    server: McpServer,
) -> None:
    agent = scripted_agent(slug="stock-agent", server=server, script=LOOKUP)
    stock_set(*CASES)
    _key, raw = api_key_create(actor="test", via="tests", name="ops", admin=True)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")

    started = client.post("/api/v1/evals/runs", {"set": "stock", "agent": agent.slug}, format="json")

    assert started.status_code == 202, started.content
    frozen = AgentVersion.objects.get(agent=agent)
    assert started.json()["version"] == frozen.number
    assert set(
        Run.objects.filter(eval_results__eval_run_id=started.json()["id"]).values_list("version", flat=True)
    ) == {frozen.pk}


def test_a_stored_regex_the_editor_would_refuse_fails_its_case_and_the_eval_run_ends(server: McpServer) -> None:
    agent = scripted_agent(slug="stock-agent", server=server, script=LOOKUP)
    eval_set = stock_set(CASES[0])
    # Written around the editor and the model's check (a data migration, a direct save).
    EvalCase.objects.filter(eval_set=eval_set).update(answer_checks=[{"contains": "7개"}, {"regex": "([0-9]+개"}])

    eval_run = run_to_end(eval_run_start(eval_set=eval_set, agent=agent, actor="test"))

    assert eval_run.status == EvalRun.Status.FINISHED
    result = EvalCaseResult.objects.get(eval_run=eval_run)
    assert result.passed is False
    assert result.scores["failed_checks"] == ["regex_refused:([0-9]+개"]


def test_the_draft_is_frozen_under_the_configurations_lock_taken_before_the_agents(
    server: McpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one lock order of configuration writes (``audit.change_guard.config_write_lock``): the configuration's
    lock before the agent's row, as a publish takes them (on PostgreSQL the other order deadlocked with an edit of
    the agent's rules); an agent with a live version pins it without locking anything."""
    import evals.services as services
    from agents.models import Agent

    order: list[str] = []
    monkeypatch.setattr(services, "config_write_lock", lambda **kwargs: order.append("configuration") or False)
    real = Agent.objects.select_for_update

    def agent_lock(*args: Any, **kwargs: Any) -> Any:
        order.append("agent")
        return real(*args, **kwargs)

    monkeypatch.setattr(Agent.objects, "select_for_update", agent_lock)
    agent = scripted_agent(slug="stock-agent", server=server, script=LOOKUP)
    eval_run_start(eval_set=stock_set(*CASES), agent=agent, actor="ops", window=1)
    assert order[:2] == ["configuration", "agent"]

    order.clear()
    live = agent_version_publish(agent=agent, actor="test", via="tests")
    order.clear()
    again = eval_run_start(eval_set=stock_set(*CASES), agent=agent, actor="ops", window=1)
    assert again.version == live.number and order == []
