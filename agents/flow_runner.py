"""Flow mode (seed 000): the agent's own LangGraph graph, built by the function its ``flow_graph`` names.

Its nodes call tools through ``MCPHandle``, i.e. through the gate (source ``flow``); the answer is the final
state's ``output``. A flow's failure is a value (``flow:error``; ``SystemExit`` and any other ``BaseException`` it
raises included), except the errors of ``agents.errors.MUST_PROPAGATE`` (a database error, the time limit, a
cancellation), which propagate as they do from the ReAct loop and the deterministic stage, and the worker's own
interruptions (``worker_interruption``).

Nothing of a graph that is not registered (``agents.flows.registered_flow_graphs``) is imported, neither to run it
nor to check an agent's options: taking it out of ``PLATFORM_FLOW_GRAPHS`` is how an operator stops trusting its
code, and importing a module runs its top-level code.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import inspect
import json
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from asgiref.sync import async_to_sync, sync_to_async
from django.utils.translation import gettext as _
from langchain_core.callbacks import BaseCallbackHandler
from langgraph.config import get_config
from langgraph.errors import GraphBubbleUp, GraphRecursionError

from agents.errors import MUST_PROPAGATE, worker_interruption
from agents.flows import registered_flow_graphs
from agents.tools import CodeRuleError, import_user_module

logger = logging.getLogger(__name__)


@dataclass
class FlowSettings:
    """What a flow's ``build_graph(settings)`` receives: the run's input, the servers it may bind, and the
    agent's options (``model_params["flow"]``). ``call_tool`` is the gate, used through ``MCPHandle``."""

    run_id: Any
    query: str
    context: dict[str, Any]
    a2a_data: list[dict[str, Any]]
    a2a_files: list[dict[str, Any]]
    bound_mcp_ids: list[str]
    options: dict[str, Any]
    call_tool: Callable[[str, str, dict[str, Any]], Any]

    def option(self, name: str, default: Any = None) -> Any:
        return self.options.get(name, default)


@dataclass
class FlowResult:
    """``answer`` (unmasked: the caller masks it) or ``error_code``/``error_message``, or ``parked_on``: the
    approval a write call of the flow waits for (the run waits too, and runs the flow again once it is decided)."""

    answer: str = ""
    error_code: str = ""
    error_message: str = ""
    parked_on: str | None = None


class FlowParked(GraphBubbleUp):
    """Raised by ``call_tool`` for a write call that waits for a person's approval: the flow stops there.

    LangGraph's ``GraphBubbleUp`` (as its own ``interrupt()``): the branches running beside it in its step are not
    cancelled but finish, and the graph stops after the step. Cancelled, a branch whose approved write had not
    gone out yet never asked for it in this pass: the approval ended unused as the run parked, and the write was
    lost (told ``approval:expired`` when the flow ran again)."""

    def __init__(self, approval_id: str) -> None:
        super().__init__(approval_id)
        self.approval_id = approval_id


def flow_too_many_steps(exc: GraphRecursionError) -> FlowResult:
    """The flow ran past its graph's own loop bound (LangGraph's ``recursion_limit``): ``flow:too_many_steps``, in
    the caller's words rather than LangGraph's (a developer's hint and a troubleshooting link, in English)."""
    bound = re.search(r"Recursion limit of (\d+)", str(exc))
    if bound is None:
        message = _("The flow was stopped: it ran more steps than its graph allows without reaching its end.")
    else:
        message = _(
            "The flow was stopped: it ran more steps than its graph allows (recursion_limit %(limit)d) without "
            "reaching its end."
        ) % {"limit": int(bound.group(1))}
    return FlowResult(error_code="flow:too_many_steps", error_message=message)


class FlowTooManyCalls(Exception):
    """Raised by ``call_tool`` for a call past the run's cap on a flow's calls: the flow stops there."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.limit = limit

    @property
    def message(self) -> str:
        return _(
            "The flow was stopped: it made more tool calls than a run allows (%(limit)d, PLATFORM_FLOW_MAX_CALLS)."
        ) % {"limit": self.limit}


# The key LangGraph streams a stop of the graph for a person's input under (``interrupt()``), as a node's update.
INTERRUPT_KEY = "__interrupt__"


def _encloses(task: tuple[str, ...], other: tuple[str, ...]) -> bool:
    """Whether ``task`` is a parent task of ``other`` (its namespace a proper prefix of the other's)."""
    return 0 < len(task) < len(other) and other[: len(task)] == task


class FlowCallIds:
    """The ids of a flow's tool calls (``flow:…``). Its audit events, its approvals, its event and its trace entry
    carry a call's id, and a flow run again from its start after an approval finds the approved call by it: the
    same call must get the same id on every pass.

    A call of a step's only task is numbered in the run's order (``flow:3``): the steps run one after another, so
    that order is the same on every pass. The tasks of one step run side by side (parallel branches, a ``Send``
    fan-out) and their calls arrive in whichever order they happen to: each such task numbers its own,
    ``flow:<node>@<step>:<n>`` (``<node>#<i>`` for the i-th ``Send`` of a step), so that a branch gets the same ids
    whatever the other does. A subgraph's task numbers its calls so as well, under the same names of its parent
    tasks, outermost first (``flow:work#1@2/inner@1:1``): its siblings are not streamed to ``flow_run`` before it
    starts, and two ``Send``s to one subgraph would otherwise share a counter and swap numbers between passes.

    ``flow_run`` tells it the graph's own tasks as they start and end (the stream shows a step's tasks before any
    of them runs), and every task's name, step and ``Send`` index as it starts, its subgraphs' included
    (``FlowTaskStarts``); the other methods are called in the calling task's context (LangGraph's config of that
    task). A task's calls made at once (``asyncio.gather`` in one node) are numbered in the order they arrive."""

    def __init__(self) -> None:
        self._in_order = 0
        self._by_task: dict[str, int] = {}
        self._started: set[str] = set()
        self._running: set[str] = set()
        self._side_by_side: set[str] = set()
        self._names: dict[str, str] = {}  # task id -> "<node>#<i>@<step>", of every task seen starting
        self._steps: dict[str, Any] = {}  # task id -> its step in its graph (or subgraph) run
        self.unnamed: FlowCallUnnamed | None = None
        # The graph's own tasks that ended with an error (their namespace, the error), as ``flow_run`` streams them.
        self.failed_tasks: list[tuple[tuple[str, ...], Exception]] = []

    def task_started(self, task_id: str) -> None:
        self._started.add(task_id)
        self._running.add(task_id)
        if len(self._running) > 1:
            self._side_by_side |= self._running

    def task_ended(self, task_id: str, *, name: str = "", error: BaseException | None = None) -> None:
        """A task of the graph ends; ``error`` is what it raised (a wait for an approval is none)."""
        self._running.discard(task_id)
        if isinstance(error, Exception) and not isinstance(error, GraphBubbleUp):
            self.failed_tasks.append(((f"{name}:{task_id}",), error))

    def failed_beside(self, parked: Sequence[tuple[str, ...]]) -> Exception | None:
        """The error of a task that failed beside each task in ``parked`` (``beside``), or None. Such a task cannot
        depend on a parked call: its error is the flow's own, and would end the next pass as well.

        A parent of a parked call failing counts too: the task stream names a subgraph's node, not its inner
        tasks, so its error may be an inner sibling's (beside the park) or the parked task's own, which cannot be
        told apart here; the write is then not put to a person for a flow that may fail anyway. The parked task
        itself failing (it turned its wait into an error of its own) does not."""
        for task, error in self.failed_tasks:
            if all(self.beside(task, other) or _encloses(task, other) for other in parked):
                return error
        return None

    def task_seen(self, metadata: dict[str, Any]) -> None:
        """A task of the graph or of a subgraph starts (LangGraph's metadata of it): its name in call ids."""
        *_parents, own = _namespace(metadata) or ("",)
        _node, colon, task_id = own.rpartition(":")
        if colon and task_id not in self._names:
            self._names[task_id] = _task_name(metadata)
            self._steps[task_id] = metadata.get("langgraph_step")

    def calling_task(self) -> tuple[str, ...]:
        """The calling task, as its namespace: ``<node>:<task id>`` of its outermost parent task first, its own
        last; () outside a task (a flow's builder). For ``beside``."""
        metadata = _task_metadata()
        namespace = _namespace(metadata)
        if namespace:
            self._steps.setdefault(namespace[-1].rpartition(":")[2], metadata.get("langgraph_step"))
        return namespace

    def beside(self, task: tuple[str, ...], parked: tuple[str, ...]) -> bool:
        """Whether ``task`` may call on after ``parked`` waited for an approval: where the two part, both are tasks
        of one step of one graph (or subgraph) run. A waiting call stops each graph it runs in after its step: that
        run's other tasks of that step finish, and so does everything they run, subgraphs included (they cannot
        depend on the waiting call). The task that waits, its parents and what it runs afterwards, the tasks of a
        later step (a node that caught the wait lets its graph go on), a subgraph run again by a parent that caught
        the wait (a namespace part without a task id: its n-th run), and a task whose step is unknown are not
        beside it."""
        for mine, theirs in zip(task, parked, strict=False):
            if mine != theirs:
                if ":" not in mine or ":" not in theirs:
                    return False
                step = self._steps.get(mine.rpartition(":")[2])
                return step is not None and step == self._steps.get(theirs.rpartition(":")[2])
        return False

    def next_call_id(self) -> str:
        """The calling task's next call id. Raises ``FlowCallUnnamed`` (also for every later call) when a parent
        task of a subgraph's task was not seen starting: the id could differ between passes and an approval meet
        another call, so the call is not made."""
        if self.unnamed is not None:
            raise self.unnamed
        metadata = _task_metadata()
        namespace = _namespace(metadata)
        task_id = namespace[-1].rpartition(":")[2] if namespace else ""
        if not namespace or (len(namespace) == 1 and task_id in self._started and task_id not in self._side_by_side):
            self._in_order += 1
            return f"flow:{self._in_order}"
        names = []
        for parent in namespace[:-1]:
            _node, colon, parent_id = parent.rpartition(":")
            if not colon:
                names.append(parent)  # not a task: a parent task's n-th subgraph run after its first
            elif parent_id in self._names:
                names.append(self._names[parent_id])
            else:
                self.unnamed = FlowCallUnnamed()
                raise self.unnamed
        task = "/".join([*names, _task_name(metadata)])
        if len(task) > 80:  # the id is stored in 100 characters (an approval's, an audit event's call_id)
            task = f"{task[:60]}~{hashlib.sha256(task.encode()).hexdigest()[:12]}"
        self._by_task[task] = self._by_task.get(task, 0) + 1
        return f"flow:{task}:{self._by_task[task]}"


class FlowCallUnnamed(Exception):
    """Raised by ``FlowCallIds.next_call_id`` for a subgraph's call whose parent task was not seen starting."""

    @property
    def message(self) -> str:
        return _(
            "The flow's call was not made: the subgraph task that made it cannot be named the same way on every "
            "pass (its parent task was not seen starting), so an approval could be given to another call."
        )


class FlowTaskStarts(BaseCallbackHandler):
    """Tells ``FlowCallIds`` each task of a flow's graph as it starts, its subgraphs' tasks included: LangChain
    calls ``on_chain_start`` with the task's metadata (name, step, path) before its node runs. Only the calling task's
    own metadata is at hand when it calls, and a stream chunk of a task has no ``Send`` index nor step."""

    run_inline = True  # before the task runs, also in an async graph

    def __init__(self, call_ids: FlowCallIds) -> None:
        self.call_ids = call_ids
        self._nodes: dict[Any, tuple[str, ...]] = {}  # a node's own run (its function) -> its task's namespace

    def on_chain_start(
        self, serialized: dict[str, Any], inputs: dict[str, Any], *, metadata: dict[str, Any] | None = None, **kw: Any
    ) -> None:
        metadata = metadata or {}
        self.call_ids.task_seen(metadata)
        node = metadata.get("langgraph_node")
        if node and kw.get("name") == node and kw.get("run_id") is not None:
            self._nodes[kw["run_id"]] = _namespace(metadata)

    def on_chain_error(self, error: BaseException, *, run_id: Any = None, **kw: Any) -> None:
        """A node's own failure, a subgraph's inner nodes' included, with its task's namespace: the stream names
        only the top-level tasks, and a subgraph stopped by a call waiting beside it may end with the wait alone,
        its inner node's error lost (``failed_beside``)."""
        namespace = self._nodes.pop(run_id, None)
        if namespace and isinstance(error, Exception) and not isinstance(error, GraphBubbleUp):
            self.call_ids.failed_tasks.append((namespace, error))

    def on_chain_end(self, outputs: Any, *, run_id: Any = None, **kw: Any) -> None:
        self._nodes.pop(run_id, None)


def _task_metadata() -> dict[str, Any]:
    """LangGraph's metadata of the task that calls ({} outside a task: a flow's builder)."""
    try:
        return dict(get_config().get("metadata") or {})
    except RuntimeError:
        return {}


def _namespace(metadata: dict[str, Any]) -> tuple[str, ...]:
    """The task's namespace, outermost first: ``<node>:<task id>`` for each of its parent tasks (subgraph nodes)
    and for itself (a node's name holds neither | nor :), and a number where a parent runs a subgraph again."""
    namespace = str(metadata.get("langgraph_checkpoint_ns") or "")
    return tuple(namespace.split("|")) if namespace else ()


def _task_name(metadata: dict[str, Any]) -> str:
    """``<node>@<step>``, ``<node>#<i>@<step>`` for the task of a step's i-th ``Send``: the same on every pass."""
    node = str(metadata.get("langgraph_node") or "")
    path: tuple[Any, ...] = tuple(metadata.get("langgraph_path") or ())
    if len(path) > 1 and path[0] == "__pregel_push" and isinstance(path[1], int):
        node = f"{node}#{path[1]}"
    return f"{node}@{metadata.get('langgraph_step')}"


# How long before its run's time limit a flow's coroutine is cancelled (before Celery's soft limit interrupts the
# worker's thread and leaves the coroutine running).
FLOW_STOP_MARGIN_S = 1.0


class FlowTimedOut(Exception):
    """The flow did not end before its run's time limit: its coroutine was cancelled."""


class FlowInterrupted(Exception):
    """The flow called LangGraph's ``interrupt()``: it stopped for a person's input, which a run cannot give."""


class FlowCancelledItself(Exception):
    """The flow raised ``asyncio.CancelledError`` while nothing cancelled it (its builder, say: LangGraph makes a
    node's own a ``NodeCancelledError``): its failure, told apart from a cancellation of its coroutine by the
    worker, which propagates."""

    def __init__(self, cancellation: asyncio.CancelledError) -> None:
        super().__init__(cancellation)
        self.cancellation = cancellation


# The options every flow may be given (``model_params["flow"]``): the server the shipped templates call. A flow
# module that reads options of its own names them in its own ``FLOW_OPTIONS`` (a tuple of names): any other key is
# refused when the agent is saved (a typo would otherwise be ignored, and the flow run with its default).
FLOW_OPTIONS: tuple[str, ...] = ("mcp_id",)


def flow_option_keys(path: str) -> list[str]:
    """The option keys the flow ``path`` takes: ``FLOW_OPTIONS`` and its module's own ``FLOW_OPTIONS``. Only
    ``FLOW_OPTIONS`` where ``path`` cannot be loaded (its own error is told about ``flow_graph``) or is not
    registered: its module is not imported then (an agent stored with a graph taken out of the list still saves)."""
    keys = list(FLOW_OPTIONS)
    module_name = path.rpartition(".")[0]
    if module_name and path in registered_flow_graphs():
        try:
            own = getattr(import_user_module(module_name), "FLOW_OPTIONS", ())
        except CodeRuleError:
            own = ()
        if isinstance(own, list | tuple):
            keys.extend(str(key) for key in own if str(key) not in keys)
    return keys


def flow_graph_not_registered(path: str) -> str:
    """Why the graph ``path`` is refused when it is not one of ``registered_flow_graphs``, naming those."""
    return _("flow graph '%(path)s' is not registered; the registered ones are: %(graphs)s") % {
        "path": path,
        "graphs": ", ".join(registered_flow_graphs()),
    }


def load_flow_builder(path: str) -> Callable[[FlowSettings], Any]:
    """The function ``path`` names. Raises ``CodeRuleError`` when it is not registered (checked before its module
    is imported), cannot be imported or is not callable."""
    if path not in registered_flow_graphs():
        raise CodeRuleError(flow_graph_not_registered(path))
    module_name, _dot, attribute = path.rpartition(".")
    if not module_name:
        raise CodeRuleError(
            _("flow graph '%(path)s' cannot be loaded: not a dotted path (package.module.function)") % {"path": path}
        )
    try:
        builder = getattr(import_user_module(module_name), attribute)
    except (CodeRuleError, AttributeError) as exc:
        raise CodeRuleError(_("flow graph '%(path)s' cannot be loaded: %(why)s") % {"path": path, "why": exc}) from exc
    if not callable(builder):
        raise CodeRuleError(_("flow graph '%(path)s' is not a function") % {"path": path})
    return builder  # type: ignore[no-any-return]


def flow_run(
    *,
    flow_graph: str,
    settings: FlowSettings,
    trace: list[dict[str, Any]],
    emit: Callable[[str, dict[str, Any]], None],
    check: Callable[[], None] = lambda: None,
    time_left: Callable[[], float | None] = lambda: None,
    call_ids: FlowCallIds | None = None,
) -> FlowResult:
    """Build the flow's graph and stream it to its end; each node's update goes to ``trace`` and ``emit``.
    Returns the answer or a ``flow:error``; raises only ``MUST_PROPAGATE`` and the worker's own interruptions
    (``worker_interruption``).

    ``check`` runs after each node and once the flow ends (the run's ``RunClaim.check``: it raises if the run
    was cancelled, is out of time or was taken over; a flow that caught that exception still stops). The flow's
    coroutine is cancelled ``FLOW_STOP_MARGIN_S`` before ``time_left()`` runs out: a flow that never ends does
    not outlive its run in the worker's event loop thread (Celery's soft limit would stop the run, not it).

    ``call_ids`` is told the graph's tasks as they start and end (``FlowCallIds``). A flow that stops for a
    person's input (LangGraph's ``interrupt()``), or ends without an ``output`` or with one that cannot be written
    as JSON, is a ``flow:error``: the run would otherwise succeed with the answer "null".

    A graph that is no longer registered (``registered_flow_graphs``: taken out of ``PLATFORM_FLOW_GRAPHS`` after an
    agent or a version was saved with it) is a ``flow:error`` before anything of it is imported: taking it out is
    how an operator stops trusting its code."""
    if flow_graph not in registered_flow_graphs():
        return FlowResult(error_code="flow:error", error_message=flow_graph_not_registered(flow_graph))

    async def run_flow() -> dict[str, Any]:
        builder = load_flow_builder(flow_graph)
        graph = builder(settings)
        if inspect.isawaitable(graph):
            graph = await graph
        final: dict[str, Any] = {}
        inputs = {
            "query": settings.query,
            "context": dict(settings.context),
            "a2a_data": list(settings.a2a_data),
            "messages": [],
        }
        config = {"callbacks": [FlowTaskStarts(call_ids)]} if call_ids is not None else None
        async for mode, chunk in graph.astream(inputs, config, stream_mode=["updates", "values", "tasks"]):
            if mode == "values":
                final = chunk
                continue
            if mode == "tasks":
                # A task's start (its input and triggers) or its end. A step's tasks are all streamed before
                # any of them runs: the call ids of tasks that run side by side are told apart before their calls.
                if call_ids is not None and isinstance(chunk, dict):
                    if "triggers" in chunk:
                        call_ids.task_started(str(chunk.get("id")))
                    else:
                        error = chunk.get("error")
                        call_ids.task_ended(str(chunk.get("id")), name=str(chunk.get("name")), error=error)
                continue
            if isinstance(chunk, dict) and INTERRUPT_KEY in chunk:
                # Without a checkpointer, the graph just ends there; the run has no way to give the input.
                raise FlowInterrupted()
            for node, update in (chunk or {}).items():
                keys = sorted((update or {}).keys()) if isinstance(update, dict) else []
                trace.append({"type": "flow_node", "node": node, "updated": keys})
                await sync_to_async(emit, thread_sensitive=True)("flow_node", {"node": node, "updated": keys})
            await sync_to_async(check, thread_sensitive=True)()
        return final

    async def within_time() -> dict[str, Any]:
        left = time_left()
        if left is None:
            return await run_flow()
        scope = asyncio.timeout(max(left - FLOW_STOP_MARGIN_S, 0.1))
        try:
            async with scope:
                return await run_flow()
        except TimeoutError:
            if not scope.expired():
                raise  # the flow's own (a read that timed out): its error, not the run's time limit
            await sync_to_async(check, thread_sensitive=True)()  # out of time: raises (the claim says why)
            raise FlowTimedOut() from None

    async def bounded() -> dict[str, Any]:
        try:
            return await within_time()
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                # Cancelled from outside (the task that waits for the flow was stopped): the worker's own. The
                # time limit's cancellation is a TimeoutError by now, its scope having taken it back.
                raise
            raise FlowCancelledItself(exc) from exc

    try:
        # In a context of its own: async_to_sync copies the context variables the coroutine set back into this
        # thread, and an ``MCPHandle``'s binding (agents.tools) would outlive the run in the worker's thread, where a
        # later run's flow that calls the handle without binding it would call through this run's gate.
        state = contextvars.copy_context().run(async_to_sync(bounded))
        check()  # a flow that caught the stop (or the cancellation) must not finish the run as if not stopped
    except MUST_PROPAGATE:
        raise
    except FlowTimedOut:
        return FlowResult(error_code="time_limit", error_message="the run did not finish within its time limit")
    except FlowParked as exc:
        if call_ids is not None:
            for _task, error in call_ids.failed_tasks:  # the engine tells whether one is the flow's error
                logger.error(
                    "flow %s failed in run %s beside a call waiting for its approval",
                    flow_graph,
                    settings.run_id,
                    exc_info=error,
                )
        return FlowResult(parked_on=exc.approval_id)
    except FlowTooManyCalls as exc:
        return FlowResult(error_code="flow:too_many_calls", error_message=exc.message)
    except FlowCallUnnamed as exc:
        return FlowResult(error_code="flow:error", error_message=exc.message)
    except FlowInterrupted:
        return FlowResult(
            error_code="flow:error",
            error_message=_(
                "The flow stopped for input (interrupt()): a flow cannot pause for a person's input. "
                "Call a write tool instead: its approval pauses the run."
            ),
        )
    except CodeRuleError as exc:
        return FlowResult(error_code="flow:error", error_message=str(exc))
    except GraphRecursionError as exc:  # its own bound, not a bug: no traceback
        logger.warning("flow %s ran past its recursion_limit in run %s: %s", flow_graph, settings.run_id, exc)
        return flow_too_many_steps(exc)
    except FlowCancelledItself as exc:
        return _flow_failed(flow_graph, settings.run_id, exc.cancellation)
    except Exception as exc:  # noqa: BLE001 - a flow's bug ends the run as a value (logged there), not a crash
        return _flow_failed(flow_graph, settings.run_id, exc)
    except BaseException as exc:
        if worker_interruption(exc):
            raise  # the run is redelivered or ended by its task, not failed as the flow's
        # sys.exit() in a node, a BaseException subclass of a library's: let through, it would end the worker or
        # escape the run's task and leave the run "running" (redelivered until worker_lost).
        return _flow_failed(flow_graph, settings.run_id, exc)
    if call_ids is not None and call_ids.unnamed is not None:  # whatever the flow made of the exception
        return FlowResult(error_code="flow:error", error_message=call_ids.unnamed.message)
    return _flow_answer(state)


def _flow_failed(flow_graph: str, run_id: Any, exc: BaseException) -> FlowResult:
    """A flow's failure, ``exc`` (its bug, not the run's nor the worker's), as a ``flow:error`` naming it."""
    logger.error("flow %s failed in run %s", flow_graph, run_id, exc_info=exc)
    return FlowResult(error_code="flow:error", error_message=f"{type(exc).__name__}: {exc}")


def _flow_answer(state: Any) -> FlowResult:
    """The answer of the flow's final ``state``: its ``output``, a string as it is, else as JSON. A flow error
    where there is none, where it is a string of nothing but whitespace, or where it cannot be written as JSON;
    raises only ``MUST_PROPAGATE``."""
    output = state.get("output") if isinstance(state, dict) else None
    if output is None:
        return FlowResult(error_code="flow:error", error_message=_("The flow ended without an output."))
    if isinstance(output, str):
        if not output.strip():
            # An answer of nothing reads as a run that answered: a model's empty last turn fails too (model:empty).
            return FlowResult(error_code="flow:error", error_message=_("The flow ended with an empty output."))
        return FlowResult(answer=output)
    try:
        text = json.dumps(output, ensure_ascii=False, default=_as_text)
    except (TypeError, ValueError, RecursionError) as exc:  # keys that are no strings, a cycle, an odd value
        return FlowResult(
            error_code="flow:error",
            error_message=_("The flow's output cannot be written as JSON: %(why)s") % {"why": exc},
        )
    return FlowResult(answer=text)


def _as_text(value: Any) -> str:
    """A value JSON has no form for, as its text; a ``TypeError`` where even that fails (its ``__str__`` raised)."""
    try:
        return str(value)
    except MUST_PROPAGATE:
        raise
    except Exception as exc:
        raise TypeError(f"{type(value).__name__} cannot be written as text: {type(exc).__name__}: {exc}") from exc
