"""Flow mode, as a review found it: a deregistered graph's module imported by a save, an imported version whose flow
calls a server the version does not bind, and a flow's odd ``BaseException`` leaving its run ``running``.

- Taking a graph out of ``PLATFORM_FLOW_GRAPHS`` is how an operator stops trusting its code, but any later save of
  an agent stored with it (a new name) imported its module to check the graph and the flow options' keys: its
  top-level code ran in the web process. Nothing of it is imported now; the stored options' keys still save.
- A version's flow was checked against every registered server (its probe binds none), not the servers the
  version's content names: an import naming another server was made live and every run failed.
- A flow node raising a ``BaseException`` that is neither ``Exception`` nor ``SystemExit`` escaped ``run_execute``
  and left its run ``running``. It is a ``flow:error`` now; the worker's own interruptions still go through."""

from __future__ import annotations

import asyncio
import copy
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import billiard.common
import pytest
from asgiref.sync import sync_to_async
from django.core.exceptions import ValidationError
from langgraph.graph import END, START, StateGraph

from agent_platform.errors import ApplicationError
from agents.configuration import config_import
from agents.flow_runner import FlowSettings, flow_run
from agents.flows.common import FlowState
from agents.models import Agent, AgentVersion, Run
from agents.services import agent_update, agent_version_publish
from agents.versions import version_content_portable
from audit.models import AuditEvent
from mcpregistry.models import McpServer
from tests.agents.test_flow_defects import flow_agent, run
from tests.agents.test_version_content_checks import document_with_version
from tests.conftest import make_agent, module_flow_graphs

# ---- 1. A deregistered graph's module is not imported by a save ---------------------------------------------------

UNTRUSTED_MODULE = "fix34_untrusted_flow"
UNTRUSTED_GRAPH = f"{UNTRUSTED_MODULE}.build_graph"
# Its top-level code leaves a line in "imported" beside it each time it is imported.
UNTRUSTED_SOURCE = textwrap.dedent(
    """
    from pathlib import Path

    from agents.flows.common import FlowState
    from langgraph.graph import END, START, StateGraph

    with (Path(__file__).parent / "imported").open("a") as marks:
        marks.write("imported\\n")

    FLOW_OPTIONS = ("depth",)


    async def answers(state: FlowState) -> dict:
        return {"output": "hi"}


    def build_graph(settings):
        graph = StateGraph(FlowState)
        graph.add_node("n", answers)
        graph.add_edge(START, "n")
        graph.add_edge("n", END)
        return graph.compile()
    """
)


@pytest.fixture
def untrusted_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The flow module on ``sys.path``; returns the file its imports are counted in."""
    (tmp_path / f"{UNTRUSTED_MODULE}.py").write_text(UNTRUSTED_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path / "imported"
    sys.modules.pop(UNTRUSTED_MODULE, None)


@pytest.mark.django_db
@pytest.mark.parametrize("mode", [Agent.Mode.FLOW, Agent.Mode.REACT])
def test_an_agent_with_a_graph_taken_out_of_the_list_saves_without_importing_its_module(
    settings: Any, demo_server: McpServer, untrusted_module: Path, mode: str
) -> None:
    settings.PLATFORM_FLOW_GRAPHS = [UNTRUSTED_GRAPH]
    agent = make_agent(slug=f"untrusted-{mode}", servers=[demo_server], with_demo_rules=False)
    # Its module's own option (FLOW_OPTIONS), accepted while the graph is registered.
    flow_settings = {"mode": mode, "flow_graph": UNTRUSTED_GRAPH, "model_params": {"flow": {"depth": 2}}}
    agent_update(agent=agent, actor="admin", via="tests", data=flow_settings)
    assert untrusted_module.exists()  # imported while trusted: checked as any registered graph

    settings.PLATFORM_FLOW_GRAPHS = []  # the operator stops trusting it
    sys.modules.pop(UNTRUSTED_MODULE, None)  # as in a web process started since
    untrusted_module.unlink()
    agent = Agent.objects.get(pk=agent.pk)
    agent_update(agent=agent, actor="admin", via="tests", data={"name": "새 이름"})

    assert not untrusted_module.exists(), "the untrusted module's top-level code ran in the saving process"
    assert UNTRUSTED_MODULE not in sys.modules
    assert Agent.objects.get(pk=agent.pk).name == "새 이름"


@pytest.mark.django_db
def test_a_graph_taken_out_of_the_list_is_still_refused_for_an_agent_switched_to_flow(
    settings: Any, demo_server: McpServer, untrusted_module: Path
) -> None:
    """The save that starts running it is refused, naming the graph, and imports nothing either."""
    settings.PLATFORM_FLOW_GRAPHS = [UNTRUSTED_GRAPH]
    agent = make_agent(slug="untrusted-switched", servers=[demo_server], with_demo_rules=False)
    agent_update(agent=agent, actor="admin", via="tests", data={"flow_graph": UNTRUSTED_GRAPH})
    settings.PLATFORM_FLOW_GRAPHS = []
    sys.modules.pop(UNTRUSTED_MODULE, None)
    untrusted_module.unlink()

    with pytest.raises(ValidationError) as refused:
        agent_update(agent=Agent.objects.get(pk=agent.pk), actor="admin", via="tests", data={"mode": "flow"})
    assert UNTRUSTED_GRAPH in str(refused.value.message_dict["flow_graph"])
    assert not untrusted_module.exists()


# ---- 2. An imported version's flow calls a server the version binds -----------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("graph", "flow", "named"),
    [
        ("agents.flows.sequential.build_graph", {"mcp_id": "elsewhere"}, "'elsewhere'"),
        # No mcp_id: a template calls the default server, which this version does not bind.
        ("agents.flows.sequential.build_graph", {}, "'sds-company-data' (PLATFORM_FLOW_DEFAULT_MCP_ID)"),
    ],
)
def test_an_imported_flow_version_calling_a_server_it_does_not_bind_is_refused_and_nothing_written(
    demo_agent: Agent, graph: str, flow: dict[str, Any], named: str
) -> None:
    McpServer.objects.create(mcp_id="elsewhere", name="elsewhere", command="true")  # exists; the version names none
    published = agent_version_publish(agent=demo_agent, actor="t", via="tests")
    content = copy.deepcopy(version_content_portable(published.content))
    content["agent"].update(
        {"mode": "flow", "flow_graph": graph, "model_params": {**content["agent"]["model_params"], "flow": flow}}
    )
    if not flow:
        content["servers"] = ["elsewhere"]
        content["rules"] = []
    versions = AgentVersion.objects.count()
    events = AuditEvent.objects.count()

    with pytest.raises(ApplicationError) as refused:
        config_import(actor="t", document=document_with_version(demo_agent, content))

    told = str(refused.value)
    assert "versions: v7: agent.model_params: flow.mcp_id:" in told, told
    assert named in told, told
    assert AgentVersion.objects.count() == versions
    assert AuditEvent.objects.count() == events
    demo_agent.refresh_from_db()
    assert demo_agent.live_version == published


@pytest.mark.django_db
def test_an_imported_flow_version_calling_a_server_it_binds_is_made_live(demo_agent: Agent) -> None:
    published = agent_version_publish(agent=demo_agent, actor="t", via="tests")
    content = copy.deepcopy(version_content_portable(published.content))
    content["agent"].update(
        {
            "mode": "flow",
            "flow_graph": "agents.flows.sequential.build_graph",
            "model_params": {**content["agent"]["model_params"], "flow": {"mcp_id": "sds-company-data"}},
        }
    )
    config_import(actor="t", document=document_with_version(demo_agent, content))
    demo_agent.refresh_from_db()
    assert demo_agent.live_version is not None and demo_agent.live_version.number == 7


# ---- 3. A flow's odd BaseException is its failure; the worker's interruptions are not --------------------------


class Odd(BaseException):
    """A library's exception that is no ``Exception`` (as ``SystemExit``, ``KeyboardInterrupt`` are)."""


async def raises_odd(state: FlowState) -> dict[str, Any]:
    raise Odd("odd")


async def interrupted(state: FlowState) -> dict[str, Any]:
    raise KeyboardInterrupt


async def terminated(state: FlowState) -> dict[str, Any]:
    """What billiard's terminate handler does in a pool's child: notes it fired, then ``sys.exit()``."""
    billiard.common._should_have_exited[0] = True  # type: ignore[attr-defined]  # not in its stubs
    raise SystemExit(-241)


node_started: asyncio.Event | None = None  # set by ``waits`` once it runs, on the caller's own loop


async def waits(state: FlowState) -> dict[str, Any]:
    assert node_started is not None
    node_started.set()
    await asyncio.Event().wait()  # until cancelled
    return {"output": "never"}


def one_node(node: Any) -> Any:
    def build(settings: Any) -> Any:
        graph = StateGraph(FlowState)
        graph.add_node("n", node)
        graph.add_edge(START, "n")
        graph.add_edge("n", END)
        return graph.compile()

    return build


async def build_cancelled_itself(settings: Any) -> Any:
    raise asyncio.CancelledError("the builder's own")


build_odd = one_node(raises_odd)
build_interrupted = one_node(interrupted)
build_terminated = one_node(terminated)
build_waits = one_node(waits)


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


def flow_of(name: str) -> Any:
    return flow_run(flow_graph=f"{__name__}.{name}", settings=settings_for_nothing(), trace=[], emit=lambda k, d: None)


@pytest.fixture
def this_module_s_flows(settings: Any) -> None:
    settings.PLATFORM_FLOW_GRAPHS = module_flow_graphs(__name__)


@pytest.mark.django_db
def test_a_flow_node_raising_an_odd_base_exception_fails_its_run_as_a_flow_error(
    demo_server: McpServer, this_module_s_flows: None
) -> None:
    ended = run(flow_agent(demo_server, "flow-odd", f"{__name__}.build_odd"), "q")
    assert (ended.status, ended.error_code) == (Run.Status.FAILED, "flow:error")
    assert "Odd: odd" in ended.error_message


def test_a_flow_cancelling_itself_is_a_flow_error(this_module_s_flows: None) -> None:
    result = flow_of("build_cancelled_itself")
    assert (result.error_code, result.error_message) == ("flow:error", "CancelledError: the builder's own")


def test_the_worker_s_own_interruptions_go_through_a_flow(this_module_s_flows: None) -> None:
    with pytest.raises(KeyboardInterrupt):
        flow_of("build_interrupted")
    try:
        with pytest.raises(SystemExit):
            flow_of("build_terminated")
    finally:
        billiard.common.clear_terminate_handler_fired()  # type: ignore[attr-defined]


def test_a_cancellation_of_the_flow_s_coroutine_goes_through(this_module_s_flows: None) -> None:
    """Run from a thread of an event loop (``sync_to_async``), the flow runs on that loop: the loop's task that
    waits for it is cancelled, and so is the flow, which must not be told as its failure."""

    async def cancelled_while_the_flow_waits() -> None:
        global node_started
        node_started = asyncio.Event()
        waiting = asyncio.create_task(sync_to_async(flow_of, thread_sensitive=False)("build_waits"))
        await node_started.wait()
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting

    asyncio.run(cancelled_while_the_flow_waits())
