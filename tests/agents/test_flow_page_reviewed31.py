"""A flow's calls on the run page say which node made them, and a flow graph must be a registered one.

- The run page showed a flow's call as "flow call sds-company-data.get_asset" alone: which branch made it was only
  in the raw trace's call id (``flow:assets@1:1``), so in a parallel run a reader credited a call to the node shown
  next to it. Each flow call step now names its node, step and number where its id says them (a ``Send``'s index
  and a subgraph's parent tasks too), or its number in the run's order (``flow:3``), with the call id beside.
- ``Agent.clean`` only checked that the flow graph loads: ``import_config`` (and an imported version's frozen
  content) saved any importable callable as a flow graph, for the workers to run, though the admin's form offers
  the registered ones only. It is refused now where it changes, before it is imported."""

from __future__ import annotations

import copy
import operator
from typing import Annotated, Any, TypedDict

import pytest
from django.core.exceptions import ValidationError
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send

from agent_platform.errors import ApplicationError
from agents.configuration import config_import
from agents.flows.common import failed
from agents.models import Agent, Run
from agents.services import agent_version_publish
from agents.tools import MCPHandle
from agents.versions import version_content_portable
from tests.agents.test_flow_defects import flow_agent, run
from tests.agents.test_run_timeline_entries import timeline
from tests.agents.test_version_content_checks import document_with_version
from tests.conftest import module_flow_graphs


@pytest.fixture(autouse=True)
def _this_module_s_flows_registered(settings: Any) -> None:
    """A worker runs only registered flow graphs: this module's ``build_*`` are (a test may register others)."""
    settings.PLATFORM_FLOW_GRAPHS = module_flow_graphs(__name__)


pytestmark = pytest.mark.django_db

mcp = MCPHandle()
BRANCHES = f"{__name__}.build_branches"


class BranchState(TypedDict, total=False):
    query: str
    context: dict[str, Any]
    a2a_data: list[Any]
    messages: list[Any]
    got: Annotated[list[str], operator.add]
    output: Any


class WorkState(TypedDict, total=False):
    who: str
    got: Annotated[list[str], operator.add]


def shown(result: Any) -> str:
    return "실패" if failed(result) else "ok"


async def reader(state: BranchState) -> dict[str, Any]:
    return {"got": [shown(await mcp.call("get_asset", params={"owner": "김하늘"}))]}


async def reader2(state: BranchState) -> dict[str, Any]:
    """Two calls in one branch: numbered 1 and 2 under the branch's own name."""
    first = await mcp.call("search_employee", params={"name": "김하늘"})
    second = await mcp.call("search_employee", params={"name": "이준호"})
    return {"got": [shown(first), shown(second)]}


async def inner(state: WorkState) -> dict[str, Any]:
    return {"got": [shown(await mcp.call("search_employee", params={"name": state["who"]}))]}


def fan_out(state: BranchState) -> list[Send]:
    return [Send("work", {"who": "김하늘"}), Send("work", {"who": "이준호"})]


async def join(state: BranchState) -> dict[str, Any]:
    return {"output": " ".join(state.get("got", []))}


async def build_branches(settings: Any) -> Any:
    """Two branches side by side (step 1), then two ``Send``s to a subgraph (step 2), then a join."""
    await mcp.bind_registry(settings, mcp_ids=["sds-company-data"], mcp_id="sds-company-data")
    work = StateGraph(WorkState)
    work.add_node("inner", inner)
    work.add_edge(START, "inner")
    graph = StateGraph(BranchState)
    graph.add_node("reader", reader)
    graph.add_node("reader2", reader2)
    graph.add_node("work", work.compile())
    graph.add_node("join", join)
    graph.add_edge(START, "reader")
    graph.add_edge(START, "reader2")
    graph.add_conditional_edges("reader", fan_out, ["work"])
    graph.add_edge("work", "join")
    graph.add_edge("join", END)
    return graph.compile()


def flow_calls(client: Any, result: Run, language: str = "en") -> dict[str, tuple[str, str]]:
    """Each flow call step of the run's page, by the call id its text names: (its label, its text)."""
    found = {}
    for classes, label, text in timeline(client, result, language):
        if "step-flow" in classes and "flow:" in text:
            call_id = text.rpartition("flow:")[2].split()[0]
            found[f"flow:{call_id}"] = (label, text)
    return found


# ---- 4. which node made which call ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_each_branch_call_names_its_node_step_and_number_on_the_run_page(admin_client: Any, demo_server: Any) -> None:
    result = run(flow_agent(demo_server, "flow-branches", BRANCHES), "김하늘 님")
    assert result.status == Run.Status.SUCCEEDED, result.error_message
    ids = sorted(e["call_id"] for e in result.messages if e.get("type") == "flow_call")
    assert ids == [
        "flow:reader2@1:1",
        "flow:reader2@1:2",
        "flow:reader@1:1",
        "flow:work#0@2/inner@1:1",
        "flow:work#1@2/inner@1:1",
    ]

    calls = flow_calls(admin_client, result)

    assert sorted(calls) == ids
    assert {label for label, _text in calls.values()} == {"flow call"}
    assert "by node reader at step 1, its call 1 · call id: flow:reader@1:1" in calls["flow:reader@1:1"][1]
    assert "sds-company-data.get_asset" in calls["flow:reader@1:1"][1]
    assert "by node reader2 at step 1, its call 2 · call id: flow:reader2@1:2" in calls["flow:reader2@1:2"][1]
    assert "sds-company-data.search_employee" in calls["flow:reader2@1:2"][1]
    assert "by node work (Send 1) at step 2 › inner at step 1, its call 1" in calls["flow:work#1@2/inner@1:1"][1]


@pytest.mark.slow
def test_a_sequential_flows_calls_say_their_number_in_the_runs_order(admin_client: Any, demo_server: Any) -> None:
    result = run(flow_agent(demo_server, "flow-in-order"), "김하늘 님의 프로젝트")
    assert result.status == Run.Status.SUCCEEDED, result.error_message

    calls = flow_calls(admin_client, result)

    assert sorted(calls) == ["flow:1", "flow:2"]
    assert "the flow's call no. 2, made by a node that ran alone in its step · call id: flow:2" in calls["flow:2"][1]
    assert "list_projects" in calls["flow:2"][1]


@pytest.mark.slow
def test_the_korean_page_names_the_node_of_each_parallel_call(admin_client: Any, demo_server: Any) -> None:
    graph = "agents.flows.parallel.build_graph"
    result = run(flow_agent(demo_server, "flow-parallel-ko", graph), "김하늘 님 자산")
    assert result.status == Run.Status.SUCCEEDED, result.error_message

    calls = flow_calls(admin_client, result, "ko")

    assert sorted(calls) == ["flow:assets@1:1", "flow:employee@1:1"]
    label, text = calls["flow:assets@1:1"]
    assert label == "플로우 호출" and "get_asset" in text
    assert "assets" in text.partition("get_asset")[2] and "호출 ID: flow:assets@1:1" in text
    assert "employee" in calls["flow:employee@1:1"][1].partition("search_employee")[2]


def test_a_failed_branch_call_names_its_node_before_the_failure(admin_client: Any, demo_server: Any) -> None:
    demo_server.tools.filter(name="get_asset").update(enabled=False)
    result = run(flow_agent(demo_server, "flow-parallel-fail", "agents.flows.parallel.build_graph"), "김하늘 님 자산")
    assert result.status == Run.Status.SUCCEEDED, result.error_message

    text = flow_calls(admin_client, result)["flow:assets@1:1"][1]

    assert "by node assets at step 1, its call 1 · call id: flow:assets@1:1 · " in text


# ---- 5. a flow graph must be registered -----------------------------------------------------------------------------


def flow_entry(graph: str, **more: Any) -> dict[str, Any]:
    return {"slug": "imported-flow", "servers": ["sds-company-data"], "mode": "flow", "flow_graph": graph, **more}


@pytest.mark.slow
@pytest.mark.parametrize("graph", [BRANCHES, "json.loads"])
def test_an_import_naming_a_flow_graph_that_is_not_registered_is_refused(
    demo_server: Any, settings: Any, graph: str
) -> None:
    settings.PLATFORM_FLOW_GRAPHS = []

    with pytest.raises(ApplicationError) as refused:
        config_import(actor="t", document={"agents": [flow_entry(graph)]})

    assert f"flow_graph: flow graph '{graph}' is not registered; the registered ones are: " in str(refused.value)
    assert "agents.flows.parallel.build_graph" in str(refused.value)
    assert not Agent.objects.filter(slug="imported-flow").exists()


@pytest.mark.slow
def test_a_registered_flow_graph_imports(demo_server: Any, settings: Any) -> None:
    settings.PLATFORM_FLOW_GRAPHS = [BRANCHES]
    config_import(actor="t", document={"agents": [flow_entry(BRANCHES)]})
    assert Agent.objects.get(slug="imported-flow").flow_graph == BRANCHES


def test_a_react_agents_flow_graph_is_checked_too(demo_server: Any, settings: Any) -> None:
    """Its graph would run once the mode is switched (and the switch does not change the graph)."""
    settings.PLATFORM_FLOW_GRAPHS = []
    with pytest.raises(ApplicationError) as refused:
        config_import(actor="t", document={"agents": [flow_entry("json.loads", mode="react")]})
    assert "flow graph 'json.loads' is not registered" in str(refused.value)


def test_an_agent_stored_with_a_graph_no_longer_registered_saves_until_it_changes_its_graph_or_mode(
    demo_server: Any, settings: Any
) -> None:
    agent = flow_agent(demo_server, "flow-stored", BRANCHES)  # stored while it was registered
    settings.PLATFORM_FLOW_GRAPHS = []

    agent.name = "다른 이름"
    agent.full_clean()  # unchanged: it saves as it is
    Agent.objects.filter(pk=agent.pk).update(mode="react")
    agent.refresh_from_db()
    agent.full_clean()
    agent.mode = Agent.Mode.FLOW  # switched back on: refused
    with pytest.raises(ValidationError) as refused:
        agent.full_clean()
    assert "is not registered" in refused.value.message_dict["flow_graph"][0]
    agent.flow_graph = "json.loads"
    with pytest.raises(ValidationError):
        agent.full_clean()


def test_an_imported_version_whose_frozen_flow_graph_is_not_registered_is_refused(
    demo_agent: Any, settings: Any
) -> None:
    settings.PLATFORM_FLOW_GRAPHS = []
    published = agent_version_publish(agent=demo_agent, actor="t", via="tests")
    content = copy.deepcopy(version_content_portable(published.content))
    content["agent"].update({"mode": "flow", "flow_graph": "json.loads"})

    with pytest.raises(ApplicationError) as refused:
        config_import(actor="t", document=document_with_version(demo_agent, content))

    assert "versions: v7: agent.flow_graph: flow graph 'json.loads' is not registered" in str(refused.value)
    assert not demo_agent.versions.filter(number=7).exists()
