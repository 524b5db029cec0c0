"""An eval run measures what it started to measure, on its own: nothing from live traffic, other eval runs or later
edits leaks into it.

Defect 2: an eval run read the gate's cross-run memo (only its writes to it were blocked), so a case passed on a
live run's cached value without calling the tool.
Defect 3: without a version, each case took the live version at its submission: a publish during the eval moved
the remaining cases to the new version, while the eval run recorded none.
Defect 4: an eval run's conversation history was every earlier eval run of the agent with that contextId (any set,
any version); now it is the earlier cases of its own eval run, in case order, a case held back until they ended.
Defect 7: scoring and display read the case as it is now: a case edited during its eval run was run with its new
query and scored against its new expectations.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.core.cache import cache
from rest_framework.test import APIClient

from agents.execution import conversation_history, run_execute
from agents.models import Run
from agents.services import agent_update, agent_version_publish, api_key_create, run_create
from audit.models import AuditEvent
from evals.models import EvalCase, EvalCaseResult, EvalRun, EvalSet
from evals.services import eval_case_update, eval_run_refresh, eval_run_start, eval_set_apply
from mcpregistry.models import McpServer, ToolContract
from tests import local_tool_fixtures
from tests.evals.conftest import bind_stock_server, scripted_agent

pytestmark = pytest.mark.django_db(transaction=True)

LOOKUP = [{"tool_calls": [{"name": "lookup_stock", "args": {"sku": "X-1"}}]}, {"content": "7개 있습니다"}]


@pytest.fixture
def server(settings: Any) -> Iterator[McpServer]:
    cache.clear()
    yield bind_stock_server(settings)
    cache.clear()


def stock_set(*cases: dict[str, Any]) -> EvalSet:
    return eval_set_apply(document={"name": "stock", "cases": list(cases)}, actor="test", via="tests").eval_set


def run_to_end(eval_run: EvalRun, *, window: int = 4) -> EvalRun:
    """What the workers and the background refresh do until the eval run ends."""
    for _round in range(10):
        for run_id in Run.objects.filter(eval_results__eval_run=eval_run, status=Run.Status.QUEUED).values_list(
            "id", flat=True
        ):
            run_execute(run_id=str(run_id))
        eval_run = eval_run_refresh(eval_run=eval_run, window=window)
        if eval_run.status == EvalRun.Status.FINISHED:
            return eval_run
    raise AssertionError("the eval run did not end")


def case_run(eval_run: EvalRun, key: str) -> Run | None:
    return EvalCaseResult.objects.get(eval_run=eval_run, case__key=key).run


def test_an_eval_case_calls_the_tool_a_live_run_just_read_rather_than_take_its_cached_value(server: McpServer) -> None:
    ToolContract.objects.filter(tool__server=server, tool__name="lookup_stock").update(memo=True, memo_ttl_s=3600)
    agent = scripted_agent(slug="stock-agent", server=server, script=LOOKUP)
    for _turn in range(2):  # the second live run takes the first one's value: the shared memo is on
        live = run_create(agent_slug=agent.slug, query="X-1 재고?", api_key=None)
        run_execute(run_id=str(live.id))
    assert AuditEvent.objects.filter(run_id=live.id, action="tool.call").get().reason == "memo:hit"
    assert len(local_tool_fixtures.EXECUTED["lookup_stock"]) == 1

    eval_run = eval_run_start(
        eval_set=stock_set({"key": "x1", "query": "X-1 재고?", "expected_tools": ["lookup_stock"]}),
        agent=agent,
        actor="test",
    )
    eval_run = run_to_end(eval_run)

    run = case_run(eval_run, "x1")
    assert run is not None
    [call] = AuditEvent.objects.filter(run_id=run.id, action="tool.call")
    assert (call.ok, call.reason, call.attempt) == (True, "", 1)  # a real call, not memo:hit
    assert len(local_tool_fixtures.EXECUTED["lookup_stock"]) == 2


def test_cases_submitted_after_a_publish_run_the_version_that_was_live_when_the_eval_started(
    server: McpServer,
) -> None:
    agent = scripted_agent(slug="stock-agent", server=server, script=LOOKUP)
    first = agent_version_publish(agent=agent, actor="test", via="tests")
    eval_set = stock_set(
        {"key": "a", "query": "X-1 재고?", "expected_tools": ["lookup_stock"]},
        {"key": "b", "query": "X-1 재고 다시?", "expected_tools": ["lookup_stock"]},
    )
    eval_run = eval_run_start(eval_set=eval_set, agent=agent, actor="test", window=1)
    assert eval_run.version == first.number  # what it ran is recorded, not left to each case

    agent.refresh_from_db()
    agent_update(agent=agent, actor="test", via="tests", data={"system_prompt": "새 프롬프트"})
    second = agent_version_publish(agent=agent, actor="test", via="tests")
    assert second.number != first.number
    eval_run = run_to_end(eval_run, window=1)

    versions = {r.case.key: r.run.version_id for r in eval_run.results.select_related("case", "run")}
    assert versions == {"a": first.pk, "b": first.pk}


def test_an_eval_run_holds_the_conversations_of_its_own_cases_in_case_order_only(server: McpServer) -> None:
    agent = scripted_agent(slug="stock-agent", server=server, script=[{"content": "네"}])
    conversation = {"contextId": "conv-1"}
    eval_set = stock_set(
        {"key": "first", "query": "첫 질문", "type": "no_tool", "forbidden_tools": ["*"], "context": conversation},
        {"key": "second", "query": "둘째 질문", "type": "no_tool", "forbidden_tools": ["*"], "context": conversation},
    )
    earlier = run_to_end(eval_run_start(eval_set=eval_set, agent=agent, actor="test"))
    assert earlier.summary["passed"] == 2
    live = run_create(agent_slug=agent.slug, query="live", api_key=None, context=conversation)
    run_execute(run_id=str(live.id))

    eval_run = eval_run_start(eval_set=eval_set, agent=agent, actor="test")
    first = case_run(eval_run, "first")
    assert first is not None
    assert conversation_history(first) == []  # not the earlier eval run's turns, nor a live one's
    assert case_run(eval_run, "second") is None  # held back until the turn before it in the conversation ended
    eval_run = run_to_end(eval_run)

    second = case_run(eval_run, "second")
    assert second is not None
    first.refresh_from_db()
    assert conversation_history(second) == [{"query": "첫 질문", "answer": first.answer}]
    assert eval_run.summary["passed"] == 2


def test_a_case_edited_during_its_eval_run_is_run_scored_and_shown_as_it_was_at_the_start(server: McpServer) -> None:
    agent = scripted_agent(slug="stock-agent", server=server, script=LOOKUP)
    eval_set = stock_set(
        {"key": "a", "query": "X-1 재고?", "expected_tools": ["lookup_stock"]},
        {"key": "b", "query": "X-1 재고 다시?", "expected_tools": ["lookup_stock"]},
    )
    eval_run = eval_run_start(eval_set=eval_set, agent=agent, actor="test", window=1)
    for key in ("a", "b"):  # "a" is in flight, "b" waits to be submitted
        case = EvalCase.objects.get(eval_set=eval_set, key=key)
        eval_case_update(
            case=case,
            actor="test",
            via="tests",
            data={"query": f"바뀐 질문 {key}", "expected_tools": [{"name": "sleepy"}]},
        )

    eval_run = run_to_end(eval_run, window=1)

    results = {r.case.key: r for r in eval_run.results.select_related("case", "run")}
    assert results["b"].run is not None and results["b"].run.query == "X-1 재고 다시?"
    assert all(r.passed for r in results.values()), [r.scores["failed_checks"] for r in results.values()]
    _key, raw = api_key_create(actor="test", via="tests", name="ops", admin=True)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    body = client.get(f"/api/v1/evals/runs/{eval_run.id}").json()
    assert [(c["case"], c["query"]) for c in body["cases"]] == [("a", "X-1 재고?"), ("b", "X-1 재고 다시?")]
