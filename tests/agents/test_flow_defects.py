"""Flow agents: their options are checked when saved, their calls are found on the run page, a failed call is
told to the end user in plain words and counted, and a flow's ``sys.exit()`` fails its run as a value.

- ``model_params["flow"]`` that is no object failed every run as ``internal``; a typo (``mcpid``) was ignored and
  a server the agent cannot call was accepted. They are refused on save (and in an imported version), and a value
  stored before that check fails the run as ``flow:error``.
- A flow call's trace entry and event carried no ``call_id``: its audited attempts were never found.
- The templates printed a failed call (``{'ok': False, 'error': ..., 'message': <guidance for a model>}``) into
  the answer, and the run ended with ``tool_failures`` 0.
- ``sequential`` raised IndexError on a message with data only (no text).
- A flow raising ``SystemExit`` escaped ``flow_run`` and left its run ``running``."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from celery.exceptions import WorkerShutdown
from django.core.exceptions import ValidationError
from langgraph.graph import END, START, StateGraph

from agents.admin_runs import run_timeline
from agents.execution import run_execute
from agents.flow_runner import FlowSettings, flow_run
from agents.flows.common import FlowState
from agents.models import Agent, Run
from agents.services import agent_version_publish, version_content_problems
from agents.tools import MCPHandle, ToolFailure
from audit.models import AuditEvent
from mcpregistry.models import McpServer, McpTool
from mcpregistry.pool import get_default_pool
from tests.conftest import make_agent, module_flow_graphs


@pytest.fixture(autouse=True)
def _this_module_s_flows_registered(settings: Any) -> None:
    """A worker runs only registered flow graphs: this module's ``build_*`` are (a test may register others)."""
    settings.PLATFORM_FLOW_GRAPHS = module_flow_graphs(__name__)


# The options the flows of this module take besides mcp_id (agents.flow_runner.flow_option_keys).
FLOW_OPTIONS = ("greeting",)

EMPLOYEE = json.dumps({"id": 1, "name": "김하늘", "team": "클라우드운영팀", "role": "팀장"}, ensure_ascii=False)
GUIDANCE = "'list_projects' timed out; call it again with fewer rows"  # the gate's words for a model
FAILURE = ToolFailure(ok=False, error="tool:timeout", message=GUIDANCE)


async def exits(state: FlowState) -> dict[str, Any]:
    raise SystemExit(2)


async def shuts_down(state: FlowState) -> dict[str, Any]:
    raise WorkerShutdown()


async def greets(state: FlowState) -> dict[str, Any]:
    return {"output": "hello"}


def one_node(node: Any) -> Any:
    async def build(settings: Any) -> Any:
        graph = StateGraph(FlowState)
        graph.add_node("n", node)
        graph.add_edge(START, "n")
        graph.add_edge("n", END)
        return graph.compile()

    return build


build_exits = one_node(exits)
build_shuts_down = one_node(shuts_down)
build_greets = one_node(greets)


def flow_agent(demo_server: McpServer, slug: str, graph: str = "agents.flows.sequential.build_graph") -> Agent:
    agent = make_agent(slug=slug, servers=[demo_server], with_demo_rules=False)
    Agent.objects.filter(pk=agent.pk).update(mode="flow", flow_graph=graph)
    agent.refresh_from_db()
    return agent


def run(agent: Agent, query: str) -> Run:
    created = Run.objects.create(agent=agent, query=query)
    try:
        run_execute(run_id=str(created.id))
    finally:
        get_default_pool().close("sds-company-data")
    created.refresh_from_db()
    return created


def in_process(graph: str, query: str, answers: dict[str, Any], a2a_data: list[Any] | None = None) -> Any:
    """The template ``graph`` run with ``answers`` for its tools (a tool's answer, or a ``ToolFailure``)."""
    called: list[str] = []

    def call_tool(mcp_id: str, tool: str, params: dict[str, Any]) -> Any:
        called.append(tool)
        return answers[tool]

    settings = FlowSettings(
        run_id="r",
        query=query,
        context={},
        a2a_data=a2a_data or [],
        a2a_files=[],
        bound_mcp_ids=["sds-company-data"],
        options={},
        call_tool=call_tool,
    )
    result = flow_run(
        flow_graph=f"agents.flows.{graph}.build_graph", settings=settings, trace=[], emit=lambda k, d: None
    )
    return result, called


# ---- 1. The flow options -----------------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("flow", "told"),
    [
        ("sds-company-data", "flow: the flow's options are an object"),
        ({"mcpid": "sds-company-data"}, "flow.mcpid: 'mcpid' is not a valid key (did you mean 'mcp_id'?)"),
        ({"mcp_id": "no-such-server"}, "flow.mcp_id: 'no-such-server' is not a server this agent can call"),
        ({"mcp_id": "elsewhere"}, "flow.mcp_id: 'elsewhere' is not a server this agent can call"),
        ({"mcp_id": 3}, "flow.mcp_id: Enter the MCP id of a server"),
    ],
)
def test_odd_flow_options_are_refused_when_saved_naming_what_is_valid(demo_server: Any, flow: Any, told: str) -> None:
    McpServer.objects.create(mcp_id="elsewhere", name="elsewhere", command="true")  # exists; the agent binds none
    agent = flow_agent(demo_server, "flow-options")
    agent.model_params = {"flow": flow}
    with pytest.raises(ValidationError) as refused:
        agent.full_clean()
    problems = refused.value.message_dict["model_params"]
    assert any(p.startswith(told) for p in problems), problems
    assert all("mcp_id" in p or "sds-company-data" in p for p in problems), problems  # the valid key, or server


@pytest.mark.django_db
def test_flow_options_the_flow_takes_are_accepted(demo_server: Any, settings: Any) -> None:
    settings.PLATFORM_FLOW_GRAPHS = [f"{__name__}.build_greets"]  # a flow of its own, registered
    agent = flow_agent(demo_server, "flow-options-ok")
    agent.model_params = {"flow": {"mcp_id": "sds-company-data"}}
    agent.full_clean()
    # A flow module names options of its own (FLOW_OPTIONS); the others' are still refused.
    agent.flow_graph = f"{__name__}.build_greets"
    agent.model_params = {"flow": {"mcp_id": "sds-company-data", "greeting": "안녕"}}
    agent.full_clean()
    agent.flow_graph = "agents.flows.sequential.build_graph"
    with pytest.raises(ValidationError) as refused:
        agent.full_clean()
    assert "the valid keys are: mcp_id" in str(refused.value)


@pytest.mark.django_db
def test_a_react_agent_keeps_a_flow_server_it_does_not_bind(demo_server: Any) -> None:
    """The server is checked in flow mode (where it is called); the options' shape whatever the mode."""
    agent = make_agent(slug="react-flow-options", servers=[demo_server], with_demo_rules=False)
    agent.model_params = {"flow": {"mcp_id": "not-yet-registered"}}
    agent.full_clean()
    agent.model_params = {"flow": "sds-company-data"}
    with pytest.raises(ValidationError):
        agent.full_clean()


@pytest.mark.django_db
def test_a_version_with_odd_flow_options_is_refused(demo_server: Any) -> None:
    agent = flow_agent(demo_server, "flow-version")
    published = agent_version_publish(agent=agent, actor="t", via="tests")
    for flow, told in [
        ("sds-company-data", "agent.model_params: flow: "),
        ({"mcpid": "sds-company-data"}, "agent.model_params: flow.mcpid: "),
        ({"mcp_id": "no-such-server"}, "agent.model_params: flow.mcp_id: "),
    ]:
        content = copy.deepcopy(published.content)
        content["agent"]["model_params"] = {"flow": flow}
        problems = version_content_problems(agent=agent, content=content)
        assert any(p.startswith(told) for p in problems), (flow, problems)


@pytest.mark.slow
@pytest.mark.django_db
def test_flow_options_stored_as_no_object_fail_the_run_as_the_flows_error(demo_server: Any) -> None:
    agent = flow_agent(demo_server, "flow-options-stored")
    Agent.objects.filter(pk=agent.pk).update(model_params={"flow": "sds-company-data"})  # stored before the check
    result = run(agent, "김하늘 님의 프로젝트")
    assert (result.status, result.error_code) == (Run.Status.FAILED, "flow:error"), result.error_message
    assert "flow.mcp_id=" in result.error_message  # in the agent's language (Korean here): how to write them


# ---- 2. A flow call's attempts on the run page -----------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db
def test_a_flow_calls_step_shows_its_audited_attempts(demo_server: Any) -> None:
    result = run(flow_agent(demo_server, "flow-timeline"), "김하늘 님의 프로젝트")
    assert result.status == Run.Status.SUCCEEDED, result.error_message
    calls = [e for e in result.messages if e.get("type") == "flow_call"]
    assert [c["call_id"] for c in calls] == ["flow:1", "flow:2"]
    events = [e.data for e in result.events.filter(kind="tool_call").order_by("seq")]
    assert [e["call_id"] for e in events] == ["flow:1", "flow:2"]
    audited = AuditEvent.objects.filter(run_id=result.id, action="tool.call").values_list("call_id", "attempt")
    assert {("flow:1", 1), ("flow:2", 1)} <= set(audited)
    steps = [s for s in run_timeline(result) if s.label == "flow call"]
    assert [s.title for s in steps] == ["sds-company-data.search_employee", "sds-company-data.list_projects"]
    assert all(len(s.attempts) == 1 and s.attempts[0].ok for s in steps), [(s.title, s.attempts) for s in steps]


# ---- 3. A failed call, told in plain words and counted --------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db
def test_a_flow_run_whose_call_failed_says_so_and_counts_it(demo_server: Any) -> None:
    McpTool.objects.filter(server=demo_server, name="list_projects").update(enabled=False)
    result = run(flow_agent(demo_server, "flow-failure"), "김하늘 님의 프로젝트")
    assert result.status == Run.Status.SUCCEEDED, result.error_message
    # A disabled tool (tool:unknown) stays disabled: no "try again later" (tests/agents/test_s38_flow_templates.py).
    assert result.answer == (
        "김하늘 님은 클라우드운영팀 소속입니다. 진행 중인 프로젝트 목록을 가져오지 못했습니다. "
        "다시 시도해도 해결되지 않으니 관리자에게 문의해 주세요."
    )
    assert result.tool_failures == 1


@pytest.mark.parametrize(
    ("graph", "query", "answers"),
    [
        ("sequential", "김하늘 님 프로젝트", {"search_employee": EMPLOYEE, "list_projects": FAILURE}),
        ("sequential", "김하늘 님 프로젝트", {"search_employee": FAILURE}),
        ("parallel", "김하늘 님 자산", {"search_employee": FAILURE, "get_asset": FAILURE}),
        ("parallel", "김하늘 님 자산", {"search_employee": EMPLOYEE, "get_asset": FAILURE}),
        ("conditional", "클라우드운영팀 프로젝트", {"list_projects": FAILURE}),
        ("conditional", "클라우드운영팀 인원", {"list_team_members": FAILURE}),
        ("conditional", "김하늘 님 노트북", {"get_asset": FAILURE}),
        ("conditional", "김하늘 님", {"search_employee": FAILURE}),
        ("http_pipeline", "GET /teams/클라우드운영팀/projects", {"list_projects": FAILURE}),
    ],
)
def test_a_template_tells_a_failed_call_in_plain_words(graph: str, query: str, answers: dict[str, Any]) -> None:
    result, _called = in_process(graph, query, answers)
    assert result.error_code == "", result
    assert "가져오지 못했습니다" in result.answer, result.answer
    assert "'ok'" not in result.answer and GUIDANCE not in result.answer, result.answer


def test_the_http_pipeline_answers_502_with_the_reason_and_404_for_any_nothing_found() -> None:
    failed, _called = in_process("http_pipeline", "GET /employees/김하늘", {"search_employee": FAILURE})
    response = json.loads(failed.answer)
    assert response["status"] == 502 and response["body"]["error"] == "tool:timeout"
    for path, tool, text in [
        ("/employees/홍길동", "search_employee", "'홍길동' 직원을 찾을 수 없습니다."),
        ("/assets?owner=홍길동", "get_asset", "'홍길동' 사용자의 자산이 없습니다."),
        ("/teams/없는팀/projects", "list_projects", "'없는팀' 팀의 프로젝트가 없습니다."),
    ]:
        result, _called = in_process("http_pipeline", f"GET {path}", {tool: text})
        assert json.loads(result.answer) == {"status": 404, "body": {"error": text}}, path


# ---- 4. A message with data only --------------------------------------------------------------------------------


def test_the_sequential_template_asks_for_a_name_it_was_not_given() -> None:
    result, called = in_process("sequential", "", {})
    assert (result.error_code, result.answer) == ("", "이름을 알려 주세요. (예: 김하늘 님의 프로젝트)")
    assert called == []


def test_the_sequential_template_reads_the_name_of_a_data_part() -> None:
    answers = {"search_employee": EMPLOYEE, "list_projects": json.dumps([{"name": "클라우드 비용 최적화"}])}
    result, called = in_process("sequential", "", answers, a2a_data=[{"name": "김하늘"}])
    assert result.answer == "김하늘 님은 클라우드운영팀 소속이며, 진행 중인 프로젝트는 클라우드 비용 최적화입니다."
    assert called == ["search_employee", "list_projects"]


# ---- a flow's MCPHandle binding is its run's own --------------------------------------------------------------

shared_handle = MCPHandle()


async def calls_the_shared_handle(state: FlowState) -> dict[str, Any]:
    return {"output": str(await shared_handle.call("search_employee", params={"name": "김하늘"}))}


async def build_binds_the_shared_handle(settings: Any) -> Any:
    await shared_handle.bind_registry(settings, mcp_ids=["sds-company-data"], mcp_id="sds-company-data")
    return await one_node(calls_the_shared_handle)(settings)


build_forgets_to_bind = one_node(calls_the_shared_handle)  # a flow that calls the handle without binding it


def test_a_handle_bound_by_one_run_is_not_bound_in_the_next_run_on_the_same_thread() -> None:
    """async_to_sync copies the coroutine's context variables back into the calling thread: the handle's binding
    made in run A's build stayed in the worker's thread, and run B, whose flow calls the handle unbound, called
    through run A's gate (its claim check, its audit). B must fail as a flow error instead."""
    gates: list[str] = []

    def settings_of(run_id: str) -> FlowSettings:
        def call_tool(mcp_id: str, tool: str, params: dict[str, Any]) -> Any:
            gates.append(run_id)
            return f"answered through run {run_id}'s gate"

        return FlowSettings(run_id=run_id, query="김하늘", context={}, a2a_data=[], a2a_files=[],
                            bound_mcp_ids=["sds-company-data"], options={}, call_tool=call_tool)  # fmt: skip

    first = flow_run(flow_graph=f"{__name__}.build_binds_the_shared_handle", settings=settings_of("A"), trace=[],
                     emit=lambda k, d: None)  # fmt: skip
    assert first.answer == "answered through run A's gate"
    assert shared_handle.mcp_id is None  # nothing of run A's binding left in this thread

    second = flow_run(flow_graph=f"{__name__}.build_forgets_to_bind", settings=settings_of("B"), trace=[],
                      emit=lambda k, d: None)  # fmt: skip

    assert gates == ["A"]
    assert (second.error_code, second.error_message) == (
        "flow:error",
        "RuntimeError: MCPHandle.call before bind_registry",
    )


@pytest.mark.slow
@pytest.mark.django_db
def test_a_run_whose_flow_calls_an_unbound_handle_fails_as_a_value_after_a_run_that_bound_it(demo_server: Any) -> None:
    """The same with real runs of the demo server: run B used to call through run A's gate, whose claim check
    (run A's, finished) made B discard its own outcome and stay ``running``, unaudited."""
    binds = run(flow_agent(demo_server, "flow-binds", f"{__name__}.build_binds_the_shared_handle"), "김하늘")
    assert binds.status == Run.Status.SUCCEEDED and "김하늘" in binds.answer

    forgets = run(flow_agent(demo_server, "flow-forgets", f"{__name__}.build_forgets_to_bind"), "김하늘")

    assert (forgets.status, forgets.error_code) == (Run.Status.FAILED, "flow:error")
    assert "MCPHandle.call before bind_registry" in forgets.error_message
    assert not AuditEvent.objects.filter(run_id=forgets.id, action="tool.call").exists()
    assert AuditEvent.objects.filter(run_id=binds.id, action="tool.call").count() == 1


# ---- 5. sys.exit() in a flow ------------------------------------------------------------------------------------


def settings_for_nothing() -> FlowSettings:
    return FlowSettings(
        run_id="r",
        query="q",
        context={},
        a2a_data=[],
        a2a_files=[],
        bound_mcp_ids=[],
        options={},
        call_tool=lambda *a: None,
    )


def test_a_flow_that_exits_is_a_flow_error_but_the_workers_shutdown_goes_through() -> None:
    settings = settings_for_nothing()
    result = flow_run(flow_graph=f"{__name__}.build_exits", settings=settings, trace=[], emit=lambda k, d: None)
    assert (result.error_code, result.error_message) == ("flow:error", "SystemExit: 2")
    with pytest.raises(WorkerShutdown):
        flow_run(flow_graph=f"{__name__}.build_shuts_down", settings=settings, trace=[], emit=lambda k, d: None)


@pytest.mark.slow
@pytest.mark.django_db
def test_a_flow_that_exits_ends_its_run_as_a_value(demo_server: Any) -> None:
    result = run(flow_agent(demo_server, "flow-exits", f"{__name__}.build_exits"), "q")
    assert (result.status, result.error_code) == (Run.Status.FAILED, "flow:error")


# ---- a flow agent's runs skip the deterministic stage (seed 000) ---------------------------------------------------


@pytest.mark.slow
def test_a_flow_agent_evaluates_no_rules_and_the_tester_says_so(demo_server: McpServer, admin_client: Any) -> None:
    """Seed 000: a flow calls its tools in its own nodes. The stage ran before the flow: the demo rules called
    search_employee again (its result reached no node), and a rule for a server the agent lacks failed the run."""
    agent = make_agent(slug="flow-with-rules", servers=[demo_server], with_demo_rules=True)
    Agent.objects.filter(pk=agent.pk).update(mode="flow", flow_graph="agents.flows.sequential.build_graph")
    agent.refresh_from_db()
    assert agent.rules.filter(enabled=True).exists()
    result = run(agent, "김하늘 님의 프로젝트")
    assert result.status == Run.Status.SUCCEEDED, (result.error_code, result.error_message)
    calls = list(AuditEvent.objects.filter(run_id=result.id, action="tool.call").values_list("source", "tool"))
    assert calls == [("flow", "search_employee"), ("flow", "list_projects")]
    assert result.deterministic_results == []
    page = admin_client.post("/admin/agents/rule-tester/", {"agent": agent.pk, "query": "김하늘 님의 프로젝트"})
    assert "This agent runs a flow: its runs evaluate no rules" in page.content.decode()
