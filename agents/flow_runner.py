"""Flow mode (seed 000): the agent's own LangGraph graph, built by the function its ``flow_graph`` names.

Its nodes call tools through ``MCPHandle``, i.e. through the gate (source ``flow``); the answer is the final
state's ``output``. A flow's failure is a value (``flow:error``; ``SystemExit`` included), except the errors of
``agents.errors.MUST_PROPAGATE`` (a database error, the time limit, a cancellation), which propagate as they do
from the ReAct loop and the deterministic stage.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from asgiref.sync import async_to_sync, sync_to_async
from celery.exceptions import WorkerShutdown, WorkerTerminate
from django.utils.translation import gettext as _

from agents.errors import MUST_PROPAGATE
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


class FlowParked(Exception):
    """Raised by ``call_tool`` for a write call that waits for a person's approval: the flow stops there."""

    def __init__(self, approval_id: str) -> None:
        super().__init__(approval_id)
        self.approval_id = approval_id


# How long before its run's time limit a flow's coroutine is cancelled (before Celery's soft limit interrupts the
# worker's thread and leaves the coroutine running).
FLOW_STOP_MARGIN_S = 1.0


class FlowTimedOut(Exception):
    """The flow did not end before its run's time limit: its coroutine was cancelled."""


# The options every flow may be given (``model_params["flow"]``): the server the shipped templates call. A flow
# module that reads options of its own names them in its own ``FLOW_OPTIONS`` (a tuple of names): any other key is
# refused when the agent is saved (a typo would otherwise be ignored, and the flow run with its default).
FLOW_OPTIONS: tuple[str, ...] = ("mcp_id",)


def flow_option_keys(path: str) -> list[str]:
    """The option keys the flow ``path`` takes: ``FLOW_OPTIONS`` and its module's own ``FLOW_OPTIONS``. Only
    ``FLOW_OPTIONS`` where ``path`` cannot be loaded (its own error is told about ``flow_graph``)."""
    keys = list(FLOW_OPTIONS)
    module_name = path.rpartition(".")[0]
    if module_name:
        try:
            own = getattr(import_user_module(module_name), "FLOW_OPTIONS", ())
        except CodeRuleError:
            own = ()
        if isinstance(own, list | tuple):
            keys.extend(str(key) for key in own if str(key) not in keys)
    return keys


def load_flow_builder(path: str) -> Callable[[FlowSettings], Any]:
    """The function ``path`` names. Raises ``CodeRuleError`` when it cannot be imported or is not callable."""
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
) -> FlowResult:
    """Build the flow's graph and stream it to its end; each node's update goes to ``trace`` and ``emit``.
    Returns the answer or a ``flow:error``; raises only ``MUST_PROPAGATE``.

    ``check`` runs after each node and once the flow ends (the run's ``RunClaim.check``: it raises if the run
    was cancelled, is out of time or was taken over; a flow that caught that exception still stops). The flow's
    coroutine is cancelled ``FLOW_STOP_MARGIN_S`` before ``time_left()`` runs out: a flow that never ends does
    not outlive its run in the worker's event loop thread (Celery's soft limit would stop the run, not it)."""

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
        async for mode, chunk in graph.astream(inputs, stream_mode=["updates", "values"]):
            if mode == "values":
                final = chunk
                continue
            for node, update in (chunk or {}).items():
                keys = sorted((update or {}).keys()) if isinstance(update, dict) else []
                trace.append({"type": "flow_node", "node": node, "updated": keys})
                await sync_to_async(emit, thread_sensitive=True)("flow_node", {"node": node, "updated": keys})
            await sync_to_async(check, thread_sensitive=True)()
        return final

    async def bounded() -> dict[str, Any]:
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

    try:
        state = async_to_sync(bounded)()
        check()  # a flow that caught the stop (or the cancellation) must not finish the run as if not stopped
    except MUST_PROPAGATE:
        raise
    except FlowTimedOut:
        return FlowResult(error_code="time_limit", error_message="the run did not finish within its time limit")
    except FlowParked as exc:
        return FlowResult(parked_on=exc.approval_id)
    except CodeRuleError as exc:
        return FlowResult(error_code="flow:error", error_message=str(exc))
    except Exception as exc:  # a flow's bug ends the run as a value, not a crash
        logger.exception("flow %s failed in run %s", flow_graph, settings.run_id)
        return FlowResult(error_code="flow:error", error_message=f"{type(exc).__name__}: {exc}")
    except (WorkerShutdown, WorkerTerminate):
        raise  # the worker's own shutdown (SystemExit's subclasses): the run is redelivered, not failed
    except SystemExit as exc:
        # sys.exit() in a flow's node is its failure too: let through, it would end the worker and leave the run
        # "running" (redelivered until worker_lost). KeyboardInterrupt and GeneratorExit still propagate.
        logger.error("flow %s raised SystemExit(%s) in run %s", flow_graph, exc.code, settings.run_id)
        return FlowResult(error_code="flow:error", error_message=f"SystemExit: {exc}")
    output = state.get("output")
    text = output if isinstance(output, str) else json.dumps(output, ensure_ascii=False, default=str)
    return FlowResult(answer=text or "")
