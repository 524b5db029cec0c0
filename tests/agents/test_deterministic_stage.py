"""One deterministic stage: a run and the admin's rule tester call the same function, so they agree on every
failure that ends the stage; and the errors that must propagate do, from every stage."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import OperationalError

from agents.deterministic import RuleSpec
from agents.deterministic_stage import StageInput, deterministic_stage
from agents.errors import MUST_PROPAGATE
from agents.execution import run_execute
from agents.models import Agent, DeterministicRule, Run
from agents.rule_tester import rules_trial
from agents.tools import DeterministicContext, deterministic_tool
from audit.models import AuditEvent
from mcpregistry import gate
from mcpregistry.models import McpServer
from tests.conftest import make_agent, module_flow_graphs


@pytest.fixture(autouse=True)
def _this_module_s_flows_registered(settings: Any) -> None:
    """A worker runs only registered flow graphs: this module's ``build_*`` are (a test may register others)."""
    settings.PLATFORM_FLOW_GRAPHS = module_flow_graphs(__name__)


pytestmark = pytest.mark.django_db


@deterministic_tool(mcp_id="sds-company-data")
def route_that_returns_a_list(ctx: DeterministicContext) -> Any:
    return [{"tool_name": "search_employee", "params": {"name": "김하늘"}}]


@deterministic_tool(mcp_id="sds-company-data")
def route_that_loses_the_database(ctx: DeterministicContext) -> Any:
    raise OperationalError("database is locked")


@deterministic_tool(mcp_id="sds-company-data")
def route_with_params_as_text(ctx: DeterministicContext) -> Any:
    return {"tool_name": "search_employee", "params": "김하늘"}


@deterministic_tool(mcp_id="sds-company-data")
def route_with_params_as_an_empty_list(ctx: DeterministicContext) -> Any:
    return {"tool_name": "search_employee", "params": []}


def submit(agent: Agent, query: str) -> Run:
    run = Run.objects.create(agent=agent, query=query)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    return run


def trial(agent: Agent, query: str, *, execute: bool = False) -> list[Any]:
    return rules_trial(agent=agent, query=query, context={}, a2a_data=[], execute=execute, actor="rule-tester:t")


@pytest.fixture
def listing_agent(demo_server: McpServer) -> Agent:
    agent = make_agent(slug="lists", servers=[demo_server], with_demo_rules=False)
    DeterministicRule.objects.create(agent=agent, name="returns a list", code=f"{__name__}.route_that_returns_a_list")
    return agent


def test_a_code_rule_that_returns_a_list_fails_a_run_as_a_rule_error(listing_agent) -> None:
    run = submit(listing_agent, "김하늘 님은 어느 팀 소속인가요?")
    assert (run.status, run.error_code) == (Run.Status.FAILED, "deterministic:rule_error")
    assert "returned list" in run.error_message


@pytest.mark.parametrize("execute", [False, True])
def test_a_code_rule_that_returns_a_list_is_a_rule_error_in_the_rule_tester_too(listing_agent, execute) -> None:
    [only] = trial(listing_agent, "김하늘 님은 어느 팀 소속인가요?", execute=execute)
    assert not only.matched
    assert only.reason.startswith("deterministic:rule_error: ")
    assert "returned list" in only.reason


@pytest.mark.parametrize(
    ("route", "kind"), [("route_with_params_as_text", "str"), ("route_with_params_as_an_empty_list", "list")]
)
def test_a_code_rule_whose_params_are_not_an_object_is_a_rule_error_and_calls_nothing(demo_server, route, kind) -> None:
    """Seed 000: a rule returns {"tool_name", "params": {...}} or None. Params of another type are the rule's bug:
    the stage fails with the seed's wording, and the tool is not called (an empty list used to become a call
    without arguments; a text, a tool failure)."""
    agent = make_agent(slug="params", servers=[demo_server], with_demo_rules=False)
    DeterministicRule.objects.create(agent=agent, name="odd params", code=f"{__name__}.{route}")
    run = submit(agent, "김하늘 님은 어느 팀 소속인가요?")
    assert (run.status, run.error_code) == (Run.Status.FAILED, "deterministic:rule_error")
    assert run.error_message.startswith("확정 호출된 MCP 단계에서 오류가")
    assert f'returned "params" as {kind}' in run.error_message
    assert not AuditEvent.objects.filter(run_id=run.id, action="tool.call").exists()
    [only] = trial(agent, "김하늘 님은 어느 팀 소속인가요?", execute=True)
    assert only.reason.startswith("deterministic:rule_error: ") and f'"params" as {kind}' in only.reason


def test_a_rule_on_a_disabled_server_fails_a_run_as_not_loaded(demo_agent, demo_server) -> None:
    McpServer.objects.filter(pk=demo_server.pk).update(enabled=False)
    run = submit(demo_agent, "김하늘 님은 어느 팀 소속인가요?")
    assert (run.status, run.error_code) == (Run.Status.FAILED, "mcp:not_loaded:sds-company-data")
    assert run.error_message == "MCP 'sds-company-data'의 tool이 로드되지 않음"


@pytest.mark.parametrize("execute", [False, True])
def test_the_rule_tester_says_not_loaded_for_a_disabled_server_as_the_run_does(
    demo_agent, demo_server, execute
) -> None:
    McpServer.objects.filter(pk=demo_server.pk).update(enabled=False)
    trials = trial(demo_agent, "김하늘 님은 어느 팀 소속인가요?", execute=execute)
    assert [t.matched for t in trials] == [False]
    assert trials[0].reason == "mcp:not_loaded:sds-company-data: MCP 'sds-company-data'의 tool이 로드되지 않음"


def test_the_dry_run_decides_and_checks_the_contract_without_calling(demo_agent, demo_server) -> None:
    rules = [
        RuleSpec(
            rule_id=1,
            name="who",
            mcp_id="sds-company-data",
            tool_name="search_employee",
            when={"regex": r"(?P<name>[가-힣]{2,4})\s*님"},
            params={"name": "{match.name}"},
        )
    ]
    stage = StageInput(query="김하늘 님?", context={}, a2a_data=[], a2a_files=[], servers=[demo_server], rules=rules)

    def no_calls(call_id: str) -> gate.GateCall:
        raise AssertionError("a dry run asked the gate for a call")

    outcome = deterministic_stage(stage, mode="dry_run", who=no_calls)
    [step] = outcome.steps
    assert step.decision is not None and step.decision.params == {"name": "김하늘"}
    assert (step.verdict, step.result, outcome.results, outcome.failure) == ("ok", None, [], None)


def test_a_dry_run_of_a_code_rule_asks_the_gate_for_nothing_either(demo_server) -> None:
    """Its ``mcp_tools`` are read as the tools are (no caller, no frozen version to consult)."""
    rules = [RuleSpec(rule_id=1, name="text", mcp_id="", tool_name="", code=f"{__name__}.route_with_params_as_text")]
    stage = StageInput(query="q", context={}, a2a_data=[], a2a_files=[], servers=[demo_server], rules=rules)

    def no_calls(call_id: str) -> gate.GateCall:
        raise AssertionError("a dry run asked the gate for a call")

    outcome = deterministic_stage(stage, mode="dry_run", who=no_calls)
    assert outcome.failure is not None and outcome.failure.code == "deterministic:rule_error"


def test_a_database_error_in_a_code_rule_propagates(demo_server) -> None:
    rules = [RuleSpec(rule_id=1, name="db", mcp_id="", tool_name="", code=f"{__name__}.route_that_loses_the_database")]
    stage = StageInput(query="q", context={}, a2a_data=[], a2a_files=[], servers=[demo_server], rules=rules)
    with pytest.raises(OperationalError):
        deterministic_stage(stage, mode="dry_run", who=lambda call_id: gate.GateCall(source="admin"))


def test_the_errors_that_must_propagate_are_database_errors_time_limits_and_cancellation() -> None:
    from celery.exceptions import SoftTimeLimitExceeded
    from django.db import DatabaseError

    from agents.errors import RunCancelled

    assert set(MUST_PROPAGATE) == {DatabaseError, SoftTimeLimitExceeded, RunCancelled}


def build_a_flow_that_loses_the_database(settings: Any) -> Any:
    raise OperationalError("database is locked")


def test_a_database_error_in_flow_mode_propagates_instead_of_a_permanent_flow_error(demo_server) -> None:
    from agents.flow_runner import FlowSettings, flow_run

    settings = FlowSettings(
        run_id=None,
        query="q",
        context={},
        a2a_data=[],
        a2a_files=[],
        bound_mcp_ids=[],
        options={},
        call_tool=lambda mcp_id, tool, params: None,
    )
    with pytest.raises(OperationalError):
        flow_run(
            flow_graph=f"{__name__}.build_a_flow_that_loses_the_database",
            settings=settings,
            trace=[],
            emit=lambda kind, data: None,
        )
