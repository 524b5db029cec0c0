"""A worker keeps what a run reads of the configuration (servers, tools, contracts, rules) while the
configuration's generation holds; any change, by any path and any process, moves the generation in the change's
own transaction, and the next run reads the configuration again."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agent_platform.errors import ApplicationError
from agents.budgets import budget_create, period_bounds
from agents.execution import run_execute
from agents.models import Agent, BudgetUsage, DeterministicRule, Run
from agents.services import agent_update, api_key_create, api_key_update, deterministic_rule_update, run_create
from audit.change_guard import config_generation
from mcpregistry.breaker import breaker_record
from mcpregistry.models import McpServer, ToolContract
from mcpregistry.services import tool_contract_update

QUESTION = "김하늘 님은 어느 팀 소속인가요?"
CONFIGURATION_TABLES = (
    "mcpregistry_mcpserver",
    "mcpregistry_mcptool",
    "mcpregistry_toolcontract",
    "agents_deterministicrule",
)


def _run(agent: Agent) -> Run:
    run = Run.objects.create(agent=agent, query=QUESTION)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    return run


def _tools(run: Run) -> list[str]:
    return [r["tool"] for r in run.deterministic_results or []]


def _configuration_reads(agent: Agent) -> list[str]:
    with CaptureQueriesContext(connection) as queries:
        run = _run(agent)
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    return [
        q["sql"]
        for q in queries.captured_queries
        if any(f'FROM "{t}"' in q["sql"] for t in CONFIGURATION_TABLES) and not _gate_state_read(q["sql"])
    ]


def _gate_state_read(sql: str) -> bool:
    """The gate's read of a called tool's state now (callable, its server enabled, its risk: ``gate._tool_now``),
    one per call by design: what an admin changed since the run started applies from its next call. No load of the
    configuration (which reads the tools' schemas)."""
    return '"mcpregistry_toolcontract"."risk"' in sql and '"mcpregistry_mcptool"."input_schema"' not in sql


@pytest.mark.django_db(transaction=True)
def test_a_second_run_reads_no_configuration_and_a_change_reads_it_again(demo_agent: Agent) -> None:
    assert _configuration_reads(demo_agent)  # the first run of this process loads it
    assert _configuration_reads(demo_agent) == []
    rule = DeterministicRule.objects.get(agent=demo_agent, tool_name="search_employee")
    deterministic_rule_update(rule=rule, actor="tester", via="tests", data={"enabled": False})
    assert _configuration_reads(demo_agent)  # read again after the change
    assert _configuration_reads(demo_agent) == []


@pytest.mark.django_db(transaction=True)
def test_the_next_run_sees_a_rule_change(demo_agent: Agent) -> None:
    assert _tools(_run(demo_agent)) == ["search_employee"]
    rule = DeterministicRule.objects.get(agent=demo_agent, tool_name="search_employee")
    deterministic_rule_update(rule=rule, actor="tester", via="tests", data={"enabled": False})
    assert "search_employee" not in _tools(_run(demo_agent))


@pytest.mark.django_db(transaction=True)
def test_the_next_run_sees_a_contract_change(demo_agent: Agent) -> None:
    assert _run(demo_agent).deterministic_results[0]["ok"] is True
    contract = ToolContract.objects.get(tool__server__agents=demo_agent, tool__name="search_employee")
    tool_contract_update(
        contract=contract, actor="tester", via="tests", data={"args": {"name": {"allowed": ["홍길동"]}}}
    )
    result = _run(demo_agent).deterministic_results[0]
    assert result["ok"] is False and result["error"] == "args:allowed:name", result


@pytest.mark.django_db(transaction=True)
def test_the_next_run_sees_a_server_unbound(demo_agent: Agent, demo_server: McpServer) -> None:
    assert _tools(_run(demo_agent)) == ["search_employee"]
    # Unbound under its enabled rules, as an import does before it changes them (the service refuses otherwise).
    agent_update(agent=demo_agent, actor="tester", via="tests", servers=[], check_rules=False)
    unbound = _run(demo_agent)
    assert (_tools(unbound), unbound.error_code) == ([], "mcp:not_loaded:sds-company-data")


@pytest.mark.django_db(transaction=True)
def test_the_next_run_sees_its_agent_changed_and_reads_the_agent_only_then(demo_agent: Agent) -> None:
    """The run's agent is held with the configuration (one row read per run: the run's own, no join)."""

    def agent_reads() -> tuple[list[str], list[str]]:
        with CaptureQueriesContext(connection) as queries:
            run = _run(demo_agent)
        assert run.status == Run.Status.SUCCEEDED, run.error_message
        reads = [q["sql"] for q in queries.captured_queries if 'FROM "agents_agent"' in q["sql"]]
        return reads, list(run.events.order_by("seq").values_list("kind", flat=True))

    assert agent_reads()[0]  # the first run of this process reads it
    reads, kinds = agent_reads()
    assert reads == [] and "model_turn" in kinds
    agent_update(agent=demo_agent, actor="tester", via="tests", data={"answer_from_deterministic": True})
    reads, kinds = agent_reads()
    assert reads and "model_turn" not in kinds  # the answer composed from the tool's result, no model turn


@pytest.mark.django_db(transaction=True)
def test_a_change_committed_by_another_connection_is_seen(demo_agent: Agent) -> None:
    """Another process, as far as the database can tell: a thread with its own connection commits the change."""
    assert _tools(_run(demo_agent)) == ["search_employee"]
    rule_id = DeterministicRule.objects.get(agent=demo_agent, tool_name="search_employee").pk
    failures: list[BaseException] = []

    def elsewhere() -> None:
        try:
            rule = DeterministicRule.objects.get(pk=rule_id)
            deterministic_rule_update(rule=rule, actor="admin elsewhere", via="admin", data={"enabled": False})
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    assert failures == []
    assert "search_employee" not in _tools(_run(demo_agent))


@pytest.mark.django_db(transaction=True)
def test_operational_writes_keep_the_generation_and_a_rolled_back_change_leaves_it(
    demo_agent: Agent, demo_server: McpServer
) -> None:
    before = config_generation()
    assert before
    breaker_record(demo_server.pk, ok=False, reason="transport")  # the breaker's counters: not configuration
    assert config_generation() == before
    rule = DeterministicRule.objects.get(agent=demo_agent, tool_name="search_employee")
    with pytest.raises(RuntimeError), transaction.atomic():
        deterministic_rule_update(rule=rule, actor="tester", via="tests", data={"enabled": False})
        assert config_generation() != before  # moved inside the change's transaction
        raise RuntimeError("changed my mind")
    assert config_generation() == before
    assert DeterministicRule.objects.get(pk=rule.pk).enabled is True


def test_every_write_path_of_a_configuration_model_moves_the_generation(db: Any, demo_server: McpServer) -> None:
    from audit.change_guard import change_scope

    seen = [config_generation()]
    with change_scope(actor="tester", via="tests"):
        McpServer.objects.filter(pk=demo_server.pk).update(name="renamed")  # queryset update
        seen.append(config_generation())
        demo_server.refresh_from_db()
        demo_server.timeout_s = 12
        demo_server.save(update_fields=["timeout_s"])  # save
        seen.append(config_generation())
        McpServer.objects.filter(pk=demo_server.pk).update(health="down", last_error="x")  # volatile only
        seen.append(config_generation())
    assert seen[0] != seen[1] != seen[2]
    assert seen[3] == seen[2]


# --- submissions (the web side): agent, key's agents, arms, versions, servers' secrets and budgets --------------


@pytest.mark.django_db(transaction=True)
def test_a_submission_reads_the_configuration_once_and_again_after_each_change(demo_agent: Agent) -> None:
    """``run_create`` admits runs from this process's copy of what it reads of the configuration: a second
    submission reads none of it; disabling the agent, narrowing the key's agents or adding a budget is seen by
    the very next submission (each moves the generation in its own transaction)."""
    key, _raw = api_key_create(name="caller", actor="tester", via="tests", agents=[demo_agent])
    other = Agent.objects.create(slug="other-agent", name="other")

    def submit() -> tuple[Run, list[str]]:
        with CaptureQueriesContext(connection) as queries:
            run = run_create(agent_slug=demo_agent.slug, query=QUESTION, api_key=key)
        tables = ("agents_agent", "agents_apikey_agents", "agents_agentarm", "mcpregistry_mcpserver", "agents_budget")
        return run, [q["sql"] for q in queries.captured_queries if any(f'FROM "{t}"' in q["sql"] for t in tables)]

    assert submit()[1]  # the first submission of this process reads the configuration
    run, reads = submit()
    assert reads == [] and run.status == Run.Status.QUEUED

    budget = budget_create(
        actor="tester", via="tests", data={"agent": demo_agent, "max_tokens": 10, "run_reservation_tokens": 10}
    )
    # (Its counters are open already: the two runs queued above reserved on it when it was created.)
    BudgetUsage.objects.update_or_create(
        budget=budget, period_start=period_bounds(budget.period, timezone.now())[0], defaults={"used_tokens": 1}
    )
    with pytest.raises(ApplicationError) as refused:
        submit()
    assert refused.value.code == "budget_exceeded"

    api_key_update(api_key=key, actor="tester", via="tests", agents=[other])
    with pytest.raises(ApplicationError) as not_found:
        submit()
    assert not_found.value.code == "agent_not_found"

    api_key_update(api_key=key, actor="tester", via="tests", agents=[demo_agent])
    agent_update(agent=demo_agent, actor="tester", via="tests", data={"enabled": False})
    with pytest.raises(ApplicationError) as disabled:
        submit()
    assert disabled.value.code == "agent_disabled"
