"""Seed 000, the specification of deterministic rules: its examples, its semantics and its error table."""

from __future__ import annotations

import logging
import sys

import pytest
from django.conf import settings
from django.core.exceptions import ValidationError

from agents.execution import run_execute
from agents.models import Agent, DeterministicRule, Run
from agents.tools import DeterministicContext
from audit.models import AuditEvent
from mcpregistry.models import McpServer
from tests.conftest import bind_demo_server, discover_as_admin, make_agent
from tests.example_rules import route_order_lookup

# ---- the seed's own unit tests, against our DeterministicContext --------------------------------------------


def test_route_matches_on_keyword() -> None:
    ctx = DeterministicContext(
        query="주문 조회 부탁해",
        context={},
        a2a_data=None,
        a2a_files=None,
        mcp_tools=[],
    )
    result = route_order_lookup(ctx)
    assert result == {"tool_name": "get_order", "params": {"query": "주문 조회 부탁해"}}


def test_route_skips_when_no_match() -> None:
    ctx = DeterministicContext(
        query="날씨 어때?",
        context={},
        a2a_data=None,
        a2a_files=None,
        mcp_tools=[],
    )
    assert route_order_lookup(ctx) is None


# ---- end to end --------------------------------------------------------------------------------------------------

SEED_SERVERS = {"order-service": "get_order", "customer-crm": "get_customer_profile", "knowledge-base": "search_docs"}


def seed_server(mcp_id: str, tools: str) -> McpServer:
    server = McpServer.objects.create(
        mcp_id=mcp_id,
        name=mcp_id,
        command=sys.executable,
        args=["-m", "tests.mcp_fixtures.example_services_server"],
        cwd=str(settings.BASE_DIR),
        env={"TOOLS": tools},
        session_scope="shared",
    )
    assert discover_as_admin(server=server).ok
    return server


@pytest.fixture
def seed_agent(db) -> Agent:  # type: ignore[no-untyped-def]
    servers = [seed_server(m, tools) for m, tools in SEED_SERVERS.items()]
    return make_agent(
        slug="seed000",
        servers=servers,
        provider="scripted",
        script=[{"content": "모델 답변"}],
        with_demo_rules=False,
    )


def code_rules(agent: Agent, *names: str) -> None:
    for order, name in enumerate(names):
        DeterministicRule.objects.create(agent=agent, name=name, order=order, code=f"tests.example_rules.{name}")


def admin_rules(agent: Agent) -> None:
    servers = {s.mcp_id: s for s in agent.servers.all()}
    DeterministicRule.objects.create(
        agent=agent,
        name="주문 조회",
        order=1,
        server=servers["order-service"],
        tool_name="get_order",
        when={"all_keywords": ["주문", "조회"]},
        params={"query": "{query}"},
    )
    DeterministicRule.objects.create(
        agent=agent,
        name="프리미엄 고객",
        order=2,
        server=servers["customer-crm"],
        tool_name="get_customer_profile",
        when={"context": {"chatbotId": "premium-support"}},
        params={"customer_id": "{context.userId}"},
    )
    DeterministicRule.objects.create(
        agent=agent,
        name="문서 검색",
        order=3,
        server=servers["knowledge-base"],
        tool_name="search_docs",
        when={"tool_available": "search_docs", "any_keywords": ["검색"]},
        params={"q": "{query}"},
    )


def run(agent: Agent, query: str, **fields) -> Run:  # type: ignore[no-untyped-def]
    run = Run.objects.create(agent=agent, query=query, **fields)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    return run


def called(run: Run) -> list[tuple[str, str, dict]]:
    return [(r["mcp_id"], r["tool"], r["args"]) for r in run.deterministic_results]


@pytest.fixture(params=["code", "admin"])
def rules_as(request, seed_agent) -> Agent:  # type: ignore[no-untyped-def]
    if request.param == "code":
        code_rules(seed_agent, "route_order_lookup", "route_by_chatbot_id", "route_by_available_tool")
    else:
        admin_rules(seed_agent)
    return seed_agent


@pytest.mark.slow
@pytest.mark.django_db
def test_the_keyword_example_calls_get_order(rules_as) -> None:
    assert called(run(rules_as, "주문 조회 부탁해")) == [("order-service", "get_order", {"query": "주문 조회 부탁해"})]


@pytest.mark.slow
@pytest.mark.django_db
def test_the_chatbot_id_example_routes_by_a2a_context(rules_as) -> None:
    result = run(rules_as, "내 등급 알려줘", context={"chatbotId": "premium-support", "userId": "u-77"})
    assert called(result) == [("customer-crm", "get_customer_profile", {"customer_id": "u-77"})]
    assert called(run(rules_as, "내 등급 알려줘", context={"chatbotId": "basic", "userId": "u-77"})) == []


@pytest.mark.django_db
def test_the_available_tool_example_chooses_by_tool_name(rules_as) -> None:
    assert called(run(rules_as, "연차 규정 검색해줘")) == [
        ("knowledge-base", "search_docs", {"q": "연차 규정 검색해줘"})
    ]


@pytest.mark.django_db
def test_every_match_runs_in_order_and_accumulates_across_servers(rules_as) -> None:
    result = run(
        rules_as, "주문 조회하고 배송 규정도 검색해줘", context={"chatbotId": "premium-support", "userId": "u-1"}
    )
    assert [c[:2] for c in called(result)] == [
        ("order-service", "get_order"),
        ("customer-crm", "get_customer_profile"),
        ("knowledge-base", "search_docs"),
    ]
    events = list(
        AuditEvent.objects.filter(run_id=result.id, action="tool.call").order_by("id").values_list("mcp_id", flat=True)
    )
    assert events == ["order-service", "customer-crm", "knowledge-base"]  # one after another, in rule order
    assert result.status == "succeeded", (result.error_code, result.error_message)
    [system] = [s for s in result.messages if s["type"] == "system"]
    assert "확정 호출 결과" in system["content"] and "O-1001" in system["content"] and "연차 규정" in system["content"]
    assert "추가 도구 호출은 필요한 경우에만" in system["content"]  # the seed's default instruction
    assert result.answer == "모델 답변"


@pytest.mark.django_db
def test_the_instruction_injected_with_the_results_is_the_agents_to_edit(rules_as) -> None:
    rules_as.deterministic_instruction = "확정 호출 결과만으로 답하세요."
    rules_as.save()
    result = run(rules_as, "주문 조회")
    [system] = [s for s in result.messages if s["type"] == "system"]
    assert "확정 호출 결과만으로 답하세요." in system["content"]


@pytest.mark.django_db
def test_each_rules_decision_is_in_the_trace_and_the_audit(rules_as) -> None:
    result = run(rules_as, "주문 조회")
    decisions = [(s["rule"], s["matched"]) for s in result.messages if s["type"] == "rule"]
    assert [m for _r, m in decisions] == [True, False, False]
    audited = AuditEvent.objects.filter(run_id=result.id, action="rule.decision").order_by("id")
    assert (audited[0].reason, audited[0].tool) == ("rule:matched", "get_order")
    assert {e.reason for e in audited[1:]} == {"rule:skipped"}
    assert all("reason" in e.result for e in audited)


@pytest.mark.django_db
def test_the_pre_step_logs_how_many_calls_it_made(rules_as, caplog) -> None:
    with caplog.at_level(logging.INFO, logger="agents.engine"):
        run(rules_as, "주문 조회하고 문서 검색")
    assert "Deterministic pre-step 완료: 2건" in caplog.text  # seed 000's wording


# ---- the seed's error table ----------------------------------------------------------------------------------


def no_model_was_called(result: Run) -> bool:
    return not any(s["type"] == "ai" for s in result.messages) and result.token_usage.get("model_calls", 0) == 0


@pytest.mark.django_db
def test_a_rule_that_raises_fails_the_run_before_the_model(seed_agent) -> None:
    code_rules(seed_agent, "route_that_raises")
    result = run(seed_agent, "주문 조회")
    assert result.status == "failed"
    assert result.error_message.startswith("확정 호출된 MCP 단계에서 오류가 발생했습니다")
    assert no_model_was_called(result)


@pytest.mark.django_db
def test_a_tool_name_the_server_lacks_fails_the_run_the_same_way(seed_agent) -> None:
    code_rules(seed_agent, "route_to_a_typo")
    result = run(seed_agent, "주문 조회")
    assert result.status == "failed"
    assert result.error_message.startswith("확정 호출된 MCP 단계에서 오류가 발생했습니다")
    assert "get_ordr" in result.error_message
    assert no_model_was_called(result)
    assert AuditEvent.objects.filter(run_id=result.id, tool="get_ordr", reason="tool:unknown").exists()


@pytest.mark.django_db
def test_an_unbound_mcp_id_is_reported_as_not_loaded(seed_agent) -> None:
    DeterministicRule.objects.create(
        agent=seed_agent, name="payments", code="tests.example_rules.route_to_an_unbound_server"
    )
    result = run(seed_agent, "환불해줘")
    assert result.status == "failed"
    assert result.error_message == "MCP 'payments'의 tool이 로드되지 않음"
    assert no_model_was_called(result)


@pytest.mark.django_db
def test_a_global_code_rule_goes_to_the_agents_that_bind_its_server_as_a_global_admin_rule_does(seed_agent) -> None:
    """A global code rule (no agent) for order-service is evaluated by the agent binding order-service; an agent
    without it does not evaluate it (it used to fail every such run as mcp:not_loaded); one whose function does
    not load still goes to everyone, and fails, so it is seen."""
    from agents.selectors import deterministic_rule_specs

    DeterministicRule.objects.create(agent=None, name="orders", code="tests.example_rules.route_order_lookup")
    other = make_agent(slug="demo-only", servers=[bind_demo_server()], with_demo_rules=False)
    assert [r.name for r in deterministic_rule_specs(agent=seed_agent)] == ["orders"]
    assert deterministic_rule_specs(agent=other) == []
    result = run(other, "주문 ORD-1 조회해줘")
    assert (result.status, [s for s in result.messages if s["type"] == "rule"]) == ("succeeded", [])
    assert run(seed_agent, "주문 ORD-1 조회해줘").deterministic_results[0]["tool"] == "get_order"
    DeterministicRule.objects.create(agent=None, name="broken", code="tests.example_rules.nope")
    assert [r.name for r in deterministic_rule_specs(agent=other)] == ["broken"]
    # A module that raises as it loads is a broken rule too, not an error of the page that lists the rules.
    DeterministicRule.objects.filter(name="broken").update(code="tests.broken_rules_module.route")
    assert [r.name for r in deterministic_rule_specs(agent=other)] == ["broken"]
    failed = run(other, "주문 조회")
    assert (failed.status, failed.error_code) == ("failed", "deterministic:rule_error")
    assert "RuntimeError" in failed.error_message and "불러오는 중" in failed.error_message  # the agent's language
    assert "this rules module is broken" not in failed.error_message  # its text may quote a setting: the log has it


@pytest.mark.django_db
def test_none_is_a_skip_not_an_error(seed_agent) -> None:
    code_rules(seed_agent, "route_order_lookup")
    result = run(seed_agent, "날씨 어때?")
    assert result.status == "succeeded" and result.deterministic_results == []
    [decision] = [s for s in result.messages if s["type"] == "rule"]
    assert (decision["matched"], decision["reason"]) == (False, "returned None")


# ---- saving rules ----------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_code_rule_is_validated_on_save(seed_agent) -> None:
    for path, says in [
        ("tests.example_rules.nope", "has no function"),
        ("tests.nowhere.rule", "cannot import"),
        ("tests.example_rules.not_decorated", "@deterministic_tool"),
        ("tests.example_rules.route_to_an_unbound_server", "does not bind"),
    ]:
        with pytest.raises(ValidationError, match=says):
            DeterministicRule(agent=seed_agent, name="x", code=path).full_clean()
    DeterministicRule(agent=seed_agent, name="ok", code="tests.example_rules.route_order_lookup").full_clean()


@pytest.mark.slow
@pytest.mark.django_db
def test_an_admin_rules_params_are_checked_against_the_tools_contract(db) -> None:
    server = bind_demo_server()
    agent = make_agent(slug="checked", servers=[server], with_demo_rules=False)

    def rule(**fields):  # type: ignore[no-untyped-def]
        return DeterministicRule(agent=agent, name="r", server=server, tool_name="search_employee", **fields)

    with pytest.raises(ValidationError, match="has no argument 'nam'; its arguments are: name"):
        rule(params={"nam": "{match.name}"}).full_clean()
    with pytest.raises(ValidationError, match="args:missing:name"):
        rule(params={}).full_clean()
    with pytest.raises(ValidationError, match="args:type:name"):
        rule(params={"name": 7}).full_clean()
    with pytest.raises(ValidationError, match="regular expression"):
        rule(params={"name": "{match.name}"}, when={"regex": "(unclosed"}).full_clean()
    with pytest.raises(ValidationError, match="not a tool of this server"):
        DeterministicRule(agent=agent, name="r", server=server, tool_name="no_such_tool").full_clean()
    rule(params={"name": "{match.name}"}, when={"regex": r"(?P<name>[가-힣]{2,4}) 님"}).full_clean()
    # A tool without arguments takes none.
    ping = DeterministicRule(agent=agent, name="p", server=server, tool_name="ping", params={"verbose": "yes"})
    with pytest.raises(ValidationError, match="has no argument 'verbose'; it takes none"):
        ping.full_clean()
    DeterministicRule(agent=agent, name="p", server=server, tool_name="ping", params={}).full_clean()


# ---- skipping the model when it adds nothing ---------------------------------------------------------------


@pytest.mark.django_db
def test_the_answer_comes_from_the_deterministic_results_without_a_model_call(demo_server) -> None:
    agent = make_agent(slug="direct", servers=[demo_server], provider="scripted", script=[{"content": "쓰이면 안 됨"}])
    agent.answer_from_deterministic = True
    agent.save()
    result = run(agent, "김하늘 님은 어느 팀 소속인가요?")
    assert "클라우드운영팀" in result.answer and "쓰이면 안 됨" not in result.answer
    assert result.token_usage["model_calls"] == 0 and result.token_usage["model_calls_saved"] == 1
    # No rule matched: the model is asked as usual.
    assert run(agent, "안녕하세요").answer == "쓰이면 안 됨"


# ---- Flow agents -----------------------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("template", "query", "data", "expected"),
    [
        ("sequential", "이서준 님이 소속된 팀에서 진행 중인 프로젝트를 알려주세요.", [], "클라우드 비용 최적화"),
        ("parallel", "김하늘 님 정보와 자산 알려줘", [], "자산 2건"),
        ("conditional", "물류플랫폼팀 프로젝트 뭐 있어?", [], "차세대 물류 플랫폼 구축"),
        ("conditional", "클라우드운영팀 인원 몇 명?", [], "3명"),
        ("http_pipeline", "GET /teams/클라우드운영팀/members", [], '"status": 200'),
        ("http_pipeline", "요청", [{"request": {"method": "GET", "path": "/employees/없는사람"}}], '"status": 404'),
    ],
)
def test_the_flow_templates_run_against_the_demo_server(demo_server, template, query, data, expected) -> None:  # type: ignore[no-untyped-def]
    agent = make_agent(slug=f"flow-{template}", servers=[demo_server], with_demo_rules=False)
    agent.mode, agent.flow_graph = "flow", f"agents.flows.{template}.build_graph"
    agent.save()
    result = run(agent, query, a2a_data=data)
    assert result.status == "succeeded", result.error_message
    assert expected in result.answer, result.answer
    flow_calls = AuditEvent.objects.filter(run_id=result.id, source="flow", action="tool.call")
    assert flow_calls.exists() and all(e.ok for e in flow_calls)
    assert [s["node"] for s in result.messages if s["type"] == "flow_node"]


@pytest.mark.django_db
def test_a_flow_bound_to_an_unbound_server_fails_clearly(demo_server) -> None:
    agent = make_agent(slug="flow-unbound", servers=[demo_server], with_demo_rules=False)
    agent.mode, agent.flow_graph = "flow", "agents.flows.sequential.build_graph"
    agent.model_params = {"flow": {"mcp_id": "elsewhere"}}
    agent.save()
    result = run(agent, "김하늘 님 팀?")
    assert result.status == "failed"
    assert "MCP 'elsewhere'의 tool이 로드되지 않음" in result.error_message


def test_a_rules_module_that_needs_the_database_as_it_loads_lets_its_error_through(monkeypatch) -> None:
    """A database error while a rules module loads is the task's to retry, not a broken rule (MUST_PROPAGATE)."""
    from django.db import OperationalError

    import agents.tools

    def down(name: str) -> None:
        raise OperationalError("the database is down")

    monkeypatch.setattr(agents.tools.importlib, "import_module", down)
    with pytest.raises(OperationalError):
        agents.tools.load_code_rule("tests.example_rules.route_order_lookup")
