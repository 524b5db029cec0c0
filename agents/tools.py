"""What rule and flow authors import (seed 000): ``@deterministic_tool``, ``DeterministicContext``, ``MCPHandle``.

A code rule is a function decorated with ``@deterministic_tool(mcp_id=...)`` that receives a
``DeterministicContext`` and returns ``{"tool_name": ..., "params": {...}}`` to call that tool on its server
before the model runs, or ``None`` to skip. Admins register it by dotted path (a deterministic rule's *code*).

A flow node calls tools through an ``MCPHandle`` bound once per graph build (``await mcp.bind_registry(settings,
mcp_ids=[...], mcp_id=...)``, then ``await mcp.call(tool_name, params={...})``). Every call of both goes through
the platform's tool gate, like the model's.
"""

from __future__ import annotations

import functools
import importlib
import logging
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar

from django.utils.translation import gettext as _
from langchain_core.tools import BaseTool

from agents.errors import MCP_NOT_LOADED, MUST_PROPAGATE

logger = logging.getLogger(__name__)

RuleFunction = Callable[["DeterministicContext"], dict[str, Any] | None]
F = TypeVar("F", bound=RuleFunction)


@dataclass
class DeterministicContext:
    """The one argument of a routing function. A dataclass, so a test builds one directly."""

    query: str
    context: dict[str, Any]
    a2a_data: list[dict[str, Any]] | None
    a2a_files: list[dict[str, Any]] | None
    mcp_tools: list[BaseTool] = field(default_factory=list)


def deterministic_tool(*, mcp_id: str) -> Callable[[F], F]:
    """Mark a routing function as a deterministic rule for the tools of ``mcp_id``."""

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(ctx: DeterministicContext) -> dict[str, Any] | None:
            return fn(ctx)

        wrapper.deterministic_mcp_id = mcp_id  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorate


class CodeRuleError(ValueError):
    """A code rule's dotted path does not name a usable ``@deterministic_tool`` function."""


def import_user_module(module_name: str) -> Any:
    """Import a rules or flow module. Raises ``CodeRuleError`` when it cannot be found, or when it raises as it
    loads: then only the exception's type is told (its text, which may quote a setting, goes to the log, masked),
    as for a rule that raises when it runs. The errors a run must not swallow (``MUST_PROPAGATE``) propagate."""
    try:
        return importlib.import_module(module_name)
    except MUST_PROPAGATE:
        raise
    except ImportError as exc:
        raise CodeRuleError(_("cannot import '%(module)s': %(error)s") % {"module": module_name, "error": exc}) from exc
    except Exception as exc:
        logger.warning("module %s raised as it loaded", module_name, exc_info=True)
        raise CodeRuleError(
            _("cannot import '%(module)s': it raised %(error)s as it loaded")
            % {"module": module_name, "error": type(exc).__name__}
        ) from exc


def load_code_rule(path: str) -> tuple[RuleFunction, str]:
    """Import ``package.module.function`` and return it with its ``mcp_id``. Raises CodeRuleError."""
    module_name, _sep, attribute = path.rpartition(".")
    if not module_name:
        raise CodeRuleError(_("'%(path)s' is not a dotted path (package.module.function)") % {"path": path})
    module = import_user_module(module_name)
    fn = getattr(module, attribute, None)
    if fn is None or not callable(fn):
        raise CodeRuleError(
            _("'%(module)s' has no function '%(function)s'") % {"module": module_name, "function": attribute}
        )
    mcp_id = getattr(fn, "deterministic_mcp_id", None)
    if not mcp_id:
        raise CodeRuleError(_("'%(path)s' is not decorated with @deterministic_tool(mcp_id=...)") % {"path": path})
    return fn, mcp_id


class ToolFailure(dict[str, Any]):
    """What ``MCPHandle.call`` returns for a failed call: ``{"ok": False, "error": <reason>, "message": ...}``, a
    dict as the seed's flows read it, and a type of its own, so that a tool whose answer is itself ``{"ok":
    false, ...}`` is not taken for a failure. Test with ``isinstance(result, ToolFailure)``
    (``agents.flows.common.failed``)."""


@dataclass(frozen=True)
class _Binding:
    caller: Callable[[str, str, dict[str, Any]], Any]
    mcp_ids: tuple[str, ...]
    mcp_id: str | None


class MCPHandle:
    """A flow's door to its MCP tools. Declare one at module level; bind it when the graph is built.

    The binding is the run's own (a context variable, which the graph's node tasks inherit from the coroutine that
    built the graph): two runs of the same flow at once in one process (a threaded pool, an inline runner) each
    call through their own run's gate, never the other's."""

    def __init__(self) -> None:
        self._binding: ContextVar[_Binding | None] = ContextVar(f"mcp_handle_{id(self)}", default=None)

    @property
    def mcp_id(self) -> str | None:
        binding = self._binding.get()
        return binding.mcp_id if binding is not None else None

    @property
    def mcp_ids(self) -> list[str]:
        binding = self._binding.get()
        return list(binding.mcp_ids) if binding is not None else []

    async def bind_registry(self, settings: Any, *, mcp_ids: list[str], mcp_id: str | None = None) -> None:
        """Bind to the run's registry (``settings`` is the ``FlowSettings`` the engine passes to
        ``build_graph``). ``mcp_id`` is the default server of ``call``. A server the agent does not bind fails the
        build (``CodeRuleError``); one it binds that is disabled binds, and each call to it is refused by the gate
        (``mcp:not_loaded:<id>``, audited), returned as a ``ToolFailure`` as any failed call."""
        missing = [m for m in mcp_ids if m not in settings.bound_mcp_ids]
        if missing:
            raise CodeRuleError("; ".join(MCP_NOT_LOADED.format(mcp_id=m) for m in missing))
        self._binding.set(_Binding(settings.call_tool, tuple(mcp_ids), mcp_id or (mcp_ids[0] if mcp_ids else None)))

    async def call(self, tool_name: str, params: dict[str, Any] | None = None, *, mcp_id: str | None = None) -> Any:
        """Call a tool through the gate. Returns its result (a dict or a string); a failure is returned as a
        ``ToolFailure`` (``{"ok": False, "error": <reason>, "message": ...}``), never raised."""
        binding = self._binding.get()
        if binding is None:
            raise RuntimeError("MCPHandle.call before bind_registry")
        target = mcp_id or binding.mcp_id
        if target is None or target not in binding.mcp_ids:
            raise CodeRuleError(f"'{target}' is not bound to this handle")
        from asgiref.sync import sync_to_async

        # The gate writes the audit with the run's database connection: back to the run's own thread.
        return await sync_to_async(binding.caller, thread_sensitive=True)(target, tool_name, params or {})
