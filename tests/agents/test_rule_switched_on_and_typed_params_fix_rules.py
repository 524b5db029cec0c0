"""Rule defects (``DeterministicRule.clean``, ``agents.deterministic.template_problems``):

1. the checks a stored rule skips where what they read is unchanged (its server bound to its agent, an empty
   keyword, a brace that is no placeholder, ``{params.NAME}`` of no parameter, a forced tool outside the agent's
   tool selection) were skipped too where a disabled rule is switched on: an agent may drop the server of a
   disabled rule, and switching the rule on then was accepted while every run it matched failed
   ``mcp:not_loaded``. Switched on, a rule is judged as a new one; an enabled rule saved unchanged still saves;
2. a placeholder that always renders as text (``{match.NAME}``, ``{query}``, a placeholder inside other text) for
   an argument typed otherwise (``warehouse: int``) saved, and every call was refused ``args:type``. Now refused
   on save, naming the argument, its type and the value; ``{data.…}`` or ``{context.…}`` alone keeps its type and
   is fine. Refused rather than converted: the gate takes no numeric text for a number, and the params are
   rendered (in a run and in the rule tester) without the tool's contract.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from agents.deterministic import always_text, template_problems
from agents.models import Agent, DeterministicRule, Run
from agents.services import agent_update, deterministic_rule_create, deterministic_rule_update
from mcpregistry.models import McpServer, McpTool, ToolContract
from mcpregistry.services import mcp_server_create, tool_contract_update
from tests.agents.test_rule_input_forms import run_now
from tests.conftest import discover_as_admin, make_agent

pytestmark = pytest.mark.django_db

LOCAL_MODULE = "tests.local_tool_fixtures"
STOCK_WHEN = {"regex": r"(?P<sku>[A-Z]-\d{4})\D*(?P<wh>\d)번 창고"}
STOCK_QUERY = "A-1001 3번 창고 재고 알려줘"


def schema_server(mcp_id: str) -> McpServer:
    """A server known by its discovered tools alone (nothing is called): ``lookup`` takes a text ``q``."""
    server = McpServer.objects.create(mcp_id=mcp_id, name=mcp_id, command=sys.executable, args=[])
    schema = {"type": "object", "properties": {"q": {"type": "string"}}}
    McpTool.objects.create(server=server, name="lookup", input_schema=schema, discovered_at=timezone.now())
    return server


@pytest.fixture
def moved_agent() -> tuple[Agent, McpServer]:
    """An agent binding ``first``, and a server ``second`` it may move to."""
    first = schema_server("first")
    schema_server("second")
    agent = Agent.objects.create(slug="mover", name="mover")
    agent.servers.set([first])
    return agent, first


def stored_rule(agent: Agent, server: McpServer, *, enabled: bool, **fields: Any) -> DeterministicRule:
    """A rule written as it was stored before a check (test code may write rows directly)."""
    values = {"name": "조회", "tool_name": "lookup", "when": {"any_keywords": ["조회"]}, "params": {}, **fields}
    return DeterministicRule.objects.create(agent=agent, server=server, enabled=enabled, **values)


def switch_on(rule: DeterministicRule) -> None:
    deterministic_rule_update(
        rule=DeterministicRule.objects.get(pk=rule.pk), actor="t", via="tests", data={"enabled": True}
    )


# ---- 1. switching a rule on judges it as a new one ----------------------------------------------------------------


def test_a_disabled_rule_for_a_server_its_agent_no_longer_binds_is_not_switched_on(moved_agent) -> None:
    agent, first = moved_agent
    rule = deterministic_rule_create(
        actor="t",
        via="tests",
        data={"agent": agent, "server": first, "name": "조회", "tool_name": "lookup", "enabled": False},
    )
    agent_update(agent=agent, actor="t", via="tests", servers=[McpServer.objects.get(mcp_id="second")])

    with pytest.raises(ValidationError) as refused:
        switch_on(rule)

    assert refused.value.message_dict["server"] == ["The rule is for MCP 'first', which this agent does not bind."]
    assert DeterministicRule.objects.get(pk=rule.pk).enabled is False
    # While it stays off, it still saves.
    deterministic_rule_update(rule=DeterministicRule.objects.get(pk=rule.pk), actor="t", via="tests", data={"order": 5})


def test_an_enabled_rule_stored_for_a_server_no_longer_bound_still_saves_as_it_is(moved_agent) -> None:
    agent, first = moved_agent
    rule = stored_rule(agent, first, enabled=True)
    agent.servers.set([McpServer.objects.get(mcp_id="second")])  # stored before the check

    deterministic_rule_update(rule=rule, actor="t", via="tests", data={"name": "조회 (옛)"})

    assert DeterministicRule.objects.get(pk=rule.pk).name == "조회 (옛)"


@pytest.mark.parametrize(
    ("fields", "field", "problem"),
    [
        (
            {"when": {"any_keywords": ["조회", " "]}},
            "when",
            "any_keywords: an empty keyword matches every query; remove it.",
        ),
        (
            {"params": {"q": "{match.name"}},
            "params",
            "q: {match.name: use {query}, {context.KEY}, {data.KEY} or {match.NAME}, each written whole",
        ),
        (
            {"answer_template": "{params.name}: 찾았습니다"},
            "answer_template",
            "{params.name}: the rule sends no parameter 'name' (its parameters: none)",
        ),
    ],
)
def test_a_disabled_rule_stored_before_a_check_meets_it_when_switched_on(moved_agent, fields, field, problem) -> None:
    agent, first = moved_agent
    kept_on = stored_rule(agent, first, enabled=True, **fields)
    switched = stored_rule(agent, first, enabled=False, **fields)

    deterministic_rule_update(rule=kept_on, actor="t", via="tests", data={"order": 7})  # saves as it is
    with pytest.raises(ValidationError) as refused:
        switch_on(switched)

    assert problem in refused.value.message_dict[field]


def test_a_disabled_rule_forcing_a_tool_outside_the_agents_selection_is_not_switched_on(moved_agent) -> None:
    agent, first = moved_agent
    McpTool.objects.filter(server=first).update(tags=["장부"])
    McpTool.objects.create(server=first, name="audit_log", input_schema={}, discovered_at=timezone.now())
    Agent.objects.filter(pk=agent.pk).update(
        model_provider="scripted", tool_selection={"enabled": True, "tags": ["장부"]}
    )
    agent.refresh_from_db()
    rule = stored_rule(agent, first, enabled=False, force_first_tool="audit_log")

    with pytest.raises(ValidationError) as refused:
        switch_on(rule)

    assert "'audit_log' is outside the servers and tags" in refused.value.message_dict["force_first_tool"][0]


# ---- 2. a placeholder that is always text, for an argument that is not ----------------------------------------


@pytest.mark.parametrize(
    ("template", "text"),
    [
        ("{match.wh}", True),
        ("{query}", True),
        ("{data.wh}번", True),
        ("{data.a}{data.b}", True),
        ("{data.wh}", False),
        ("{context.warehouse}", False),
    ],
)
def test_only_a_context_or_data_placeholder_written_alone_keeps_its_type(template: str, text: bool) -> None:
    assert always_text(template) is text


def test_a_text_placeholder_is_refused_only_for_an_argument_typed_otherwise() -> None:
    constraints = {"sku": {"type": "str"}, "warehouse": {"type": "int"}, "note": {}}
    params = {"sku": "{match.sku}", "warehouse": "{match.wh}", "note": "{match.wh}"}

    assert template_problems(constraints, params) == [
        "args:type:warehouse: {match.wh} is always text and 'warehouse' must be of type int: every call would be "
        "refused. Give a fixed value, or {data.KEY} or {context.KEY} alone, which keep their type."
    ]
    assert template_problems(constraints, params, text_into_typed=False) == []
    assert template_problems(constraints, {"sku": "{query}", "warehouse": "{data.wh}"}) == []


@pytest.fixture
def stock_agent(settings) -> Agent:
    """The real local tool ``lookup_stock(sku: str, warehouse: int = 1)``, a read."""
    settings.PLATFORM_LOCAL_TOOL_MODULES = ["mcpregistry.builtin_tools", LOCAL_MODULE]
    server = mcp_server_create(
        actor="admin",
        via="tests",
        data={
            "mcp_id": "stock",
            "name": "stock",
            "transport": "local",
            "args": [f"{LOCAL_MODULE}.lookup_stock"],
            "timeout_s": 5,
        },
    )
    assert discover_as_admin(server=server).ok
    contract = ToolContract.objects.get(tool__server=server, tool__name="lookup_stock")
    tool_contract_update(contract=contract, actor="admin", via="tests", data={"risk": "read"})
    return make_agent(slug="stock", servers=[server], with_demo_rules=False)


def stock_rule(agent: Agent, params: dict[str, Any]) -> dict[str, Any]:
    server = agent.servers.get()
    return {
        "agent": agent,
        "server": server,
        "name": "재고",
        "tool_name": "lookup_stock",
        "when": STOCK_WHEN,
        "params": params,
        "answer_template": "{result.sku}: {result.count}개",
    }


@pytest.mark.parametrize("warehouse", ["{match.wh}", "{match.wh}번", "{query}"])
def test_a_rule_sending_text_where_its_tool_takes_an_integer_is_not_saved(stock_agent: Agent, warehouse: str) -> None:
    with pytest.raises(ValidationError) as refused:
        deterministic_rule_create(
            actor="t", via="tests", data=stock_rule(stock_agent, {"sku": "{match.sku}", "warehouse": warehouse})
        )

    assert refused.value.message_dict["params"] == [
        f"args:type:warehouse: {warehouse} is always text and 'warehouse' must be of type int: every call would be "
        "refused. Give a fixed value, or {data.KEY} or {context.KEY} alone, which keep their type."
    ]
    assert not DeterministicRule.objects.exists()


def test_a_data_placeholder_alone_keeps_its_number_and_the_call_succeeds(stock_agent: Agent) -> None:
    deterministic_rule_create(
        actor="t", via="tests", data=stock_rule(stock_agent, {"sku": "{match.sku}", "warehouse": "{data.wh}"})
    )

    run = run_now(stock_agent, STOCK_QUERY, a2a_data=[{"wh": 3}])

    assert run.status == Run.Status.SUCCEEDED, (run.error_code, run.error_message)
    assert run.answer == "A-1001: 7개"


def test_a_rule_stored_with_text_for_an_integer_saves_as_it_is_until_its_params_change_or_it_is_switched_on(
    stock_agent: Agent,
) -> None:
    text_params = {"sku": "{match.sku}", "warehouse": "{match.wh}"}
    data = {**stock_rule(stock_agent, text_params), "enabled": True}
    kept_on = DeterministicRule.objects.create(**data)  # stored before the check
    switched = DeterministicRule.objects.create(**{**data, "name": "재고 (꺼짐)", "enabled": False})

    deterministic_rule_update(rule=kept_on, actor="t", via="tests", data={"order": 3})
    with pytest.raises(ValidationError, match="args:type:warehouse"):
        deterministic_rule_update(
            rule=DeterministicRule.objects.get(pk=kept_on.pk),
            actor="t",
            via="tests",
            data={"params": {**text_params, "sku": "{match.sku} "}},
        )
    with pytest.raises(ValidationError, match="args:type:warehouse"):
        switch_on(switched)
