"""Local tools: Python functions the gate calls like any MCP server's tools (seed 001's ``@tool calculator``
beside its MCP servers).

A local tool is a LangChain tool object: one made with :func:`local_tool` (the platform's authoring decorator)
or with LangChain's own ``@tool``. An admin binds local tools as an ``McpServer`` with transport ``local``
whose ``args`` are dotted paths: a module (every tool defined in it) or one tool (``package.module.name``).
Every path must lie under a module named in ``PLATFORM_LOCAL_TOOL_MODULES`` (checked before anything is
imported, at save and again at every call: importing runs code), and a tool named by its path must be defined
there, not merely imported from elsewhere. Discovery lists them as tools with a
contract pre-filled from their signature or Pydantic schema; from there they are tools like any other:
contract, risk and approval, memo, timeout, retries, breaker, fallback, audit and metrics are the gate's.

:class:`LocalToolRunner` has the pool's ``call_tool``/``list_tools`` shape, so the gate's code path is the same.
A call runs in a worker thread; the caller stops waiting at the timeout (``McpTimeoutError``), but Python
cannot stop a thread: a stuck function keeps its thread until it returns, and a call still queued behind busy
threads is cancelled (then it never ran: ``sent=False``), as it is when the caller is interrupted while it waits
(the run's soft time limit, raised as it is). So that one binding's stuck functions cannot hold every thread of the
process (and time out the other bindings' calls, other agents' included, against their breakers), a binding has
at most ``THREADS_PER_BINDING`` calls in flight: a call past that is not started at all (``LocalToolBusy``, the
gate's ``local:busy``: not sent, not retried, not counted by the breaker, a write known not done). A coroutine
tool (an ``async def``) is awaited on an event loop of its own in its worker thread, with the same deadline; at
the timeout or the caller's interruption it is cancelled at its next ``await`` (a thread cannot be stopped, a
coroutine can), so it does not run on as a function does (Django refuses its ORM's synchronous calls in it: an
async context). A tool that raises is an ``is_error`` answer, the gate's ``tool:error`` (never an exception out
of the gate; an accident's message without the internal addresses and file paths it names, ``_error_text``), whatever
it raises (but ``ArgumentRefused``, arguments the model is to fix: an ``args:*`` refusal, as the tool's own schema
makes one): also ``SystemExit`` (argparse on bad input, a library's ``sys.exit()``) and
``KeyboardInterrupt``, which would otherwise end the worker's process and leave its run ``running``, the call
unaudited and re-run on every redelivery; also a LangChain tool's ``ToolException`` that its ``handle_tool_error``
would return as its answer (``_raising``). A value is written as JSON as FastMCP writes one (a Pydantic model as its
object, ``_json_default``), and an argument its ``args_schema`` names by an alias is listed by it. A function that
reads the database does so on its own connection in the worker thread (closed after each call), so it sees committed
data only, and in the caller's language (a Korean agent's tool refuses in Korean).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import importlib
import inspect
import json
import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any, TypeGuard, overload

from django.conf import settings
from django.db import connections
from django.utils import translation
from django.utils.translation import gettext as _
from langchain_core.tools import BaseTool, StructuredTool
from mcp import McpError, types
from pydantic import BaseModel, ValidationError
from pydantic_core import to_jsonable_python

from audit.masking import mask_internal_locations
from mcpregistry.client_session import ToolResultInvalid
from mcpregistry.contracts import argument_refusal
from mcpregistry.pool import (
    McpSessionPool,
    McpTimeoutError,
    McpTransportError,
    ServerListing,
    ToolCallOutcome,
    get_default_pool,
)

LOCAL_TRANSPORT = "local"
LOCAL_PROTOCOL = "local"
# Marks a tool made by the platform's decorator (LangChain's own @tool is accepted too).
MARKER = "platform_local_tool"
# Calls of one binding in flight at once in a process (a stuck function holds its thread until it returns), and
# the process's threads for all bindings together: several bindings' stuck functions leave threads for the rest.
THREADS_PER_BINDING = 4
THREADS = 32
# The exceptions a tool's author raises on purpose, their text written for the caller: classes (or their bases) of
# these names (LangChain's ``ToolException``, FastMCP's and the MCP SDK's ``ToolError``), told by name, so that
# neither library is imported here.
ON_PURPOSE = frozenset({"ToolError", "ToolException"})

logger = logging.getLogger(__name__)


class LocalToolError(ValueError):
    """A dotted path that does not name usable local tools (not allowed, not importable, not a tool)."""


class LocalToolBusy(McpTransportError):
    """The binding already has ``THREADS_PER_BINDING`` calls in flight (functions past their timeout hold their
    threads): this call was not started (``sent`` is False). The gate reads it as ``local:busy``."""

    def __init__(self, message: str) -> None:
        super().__init__(message, sent=False)


class ArgumentRefused(ValueError):
    """Raised by a local tool's function, before it does anything, for arguments the model can fix (an expression it
    cannot read, a value a business rule refuses): the message says what is wrong and how to write it, in the
    reader's language; ``argument`` names the argument at fault. The gate takes it as the ``args:*`` refusal a
    Pydantic validator's ``ValueError`` is (``argument_refusal``), not a ``tool:error`` not to retry, and counts it
    toward the tool's self-correction cap. Still a ``ValueError`` to whoever calls the tool directly."""

    def __init__(self, message: str, *, argument: str = "") -> None:
        super().__init__(message)
        self.argument = argument


@overload
def local_tool(fn: Callable[..., Any], /) -> StructuredTool: ...


@overload
def local_tool(
    *, name: str | None = None, description: str | None = None, args_schema: type[BaseModel] | None = None
) -> Callable[[Callable[..., Any]], StructuredTool]: ...


def local_tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    args_schema: type[BaseModel] | None = None,
) -> StructuredTool | Callable[[Callable[..., Any]], StructuredTool]:
    """Make ``fn`` a local tool. Its name is ``name`` or the function's; its description ``description`` or
    the docstring (required: it is the model's manual); its input schema ``args_schema`` or one inferred from
    the type hints. Returns a LangChain ``StructuredTool`` (``.invoke({...})`` works in tests). An ``async def``
    becomes the tool's ``coroutine`` (``.ainvoke``), so that a call awaits it: as its ``func``, a call would only make
    the coroutine, and the gate would take that unawaited object for the answer. The function should return a
    string or JSON-able value and raise on failure (the gate turns that into ``tool:error``)."""

    def decorate(function: Callable[..., Any]) -> StructuredTool:
        is_async = inspect.iscoroutinefunction(function)
        made = StructuredTool.from_function(
            func=None if is_async else function,
            coroutine=function if is_async else None,
            name=name or function.__name__,
            description=description,
            args_schema=args_schema,
            infer_schema=True,
        )
        made.metadata = {**(made.metadata or {}), MARKER: True}
        return made

    return decorate(fn) if fn is not None else decorate


def _under_allowed_module(path: str, allowed: Iterable[str]) -> bool:
    return any(path == module or path.startswith(module + ".") for module in allowed if module)


def _defining_module(tool: BaseTool) -> str:
    """The module a tool's code is defined in: its function's (``func``, or ``coroutine`` for an async tool), or its
    class's for a tool written as a ``BaseTool`` subclass. Not where it was found: a module also holds the tools it
    imports."""
    function = getattr(tool, "func", None) or getattr(tool, "coroutine", None)
    return str(getattr(function, "__module__", None) or type(tool).__module__)


def _module_tools(module: Any) -> list[BaseTool]:
    """The tools defined in ``module`` (not those it imports from elsewhere)."""
    found = []
    for value in vars(module).values():
        # A BaseTool subclass's code is its class's: found as it is when bound by its dotted path.
        if isinstance(value, BaseTool) and _defining_module(value) == module.__name__:
            found.append(value)
    return found


def load_local_tools(paths: Iterable[str], *, allowed_modules: Iterable[str] | None = None) -> dict[str, BaseTool]:
    """The tools named by ``paths`` (modules or single tools), by tool name. Raises LocalToolError when a path
    is outside ``allowed_modules`` (default ``PLATFORM_LOCAL_TOOL_MODULES``; checked before importing), cannot
    be imported, names no tool, names a tool defined outside ``allowed_modules`` (one an allowed module imports
    from elsewhere: binding the module would not list it), or two paths give the same tool name."""
    allowed = list(settings.PLATFORM_LOCAL_TOOL_MODULES if allowed_modules is None else allowed_modules)
    tools: dict[str, BaseTool] = {}
    for raw in paths:
        path = str(raw).strip()
        if not path or not all(part.isidentifier() for part in path.split(".")):
            raise LocalToolError(
                _("'%(path)s' is not a dotted path (package.module or package.module.tool)") % {"path": path}
            )
        if not _under_allowed_module(path, allowed):
            raise LocalToolError(
                _("'%(path)s' is not under a module named in PLATFORM_LOCAL_TOOL_MODULES (%(modules)s)")
                % {"path": path, "modules": ", ".join(allowed) or "-"}
            )
        found: list[BaseTool]
        try:
            found = _module_tools(importlib.import_module(path))
        except ModuleNotFoundError as exc:
            module_name, _sep, attribute = path.rpartition(".")
            if not module_name or exc.name not in {path, None}:
                raise LocalToolError(
                    _("cannot import '%(module)s': %(error)s") % {"module": path, "error": exc}
                ) from exc
            try:
                module = importlib.import_module(module_name)
            except ImportError as inner:
                raise LocalToolError(
                    _("cannot import '%(module)s': %(error)s") % {"module": module_name, "error": inner}
                ) from inner
            value = getattr(module, attribute, None)
            if value is None:
                raise LocalToolError(
                    _("cannot import '%(path)s': '%(module)s' has no '%(name)s'")
                    % {"path": path, "module": module_name, "name": attribute}
                ) from exc
            if not isinstance(value, BaseTool):
                raise LocalToolError(
                    _(
                        "'%(path)s' is not a tool: decorate it with @local_tool (mcpregistry.local_tools) or LangChain's @tool"
                    )
                    % {"path": path}
                ) from exc
            defined_in = _defining_module(value)
            if not _under_allowed_module(defined_in, allowed):
                raise LocalToolError(
                    _(
                        "'%(path)s' is defined in '%(module)s', which is not under a module named in "
                        "PLATFORM_LOCAL_TOOL_MODULES (%(modules)s)"
                    )
                    % {"path": path, "module": defined_in, "modules": ", ".join(allowed) or "-"}
                ) from exc
            found = [value]
        except ImportError as exc:
            raise LocalToolError(_("cannot import '%(module)s': %(error)s") % {"module": path, "error": exc}) from exc
        if not found:
            raise LocalToolError(_("'%(path)s' defines no tool (@local_tool or LangChain's @tool)") % {"path": path})
        for tool in found:
            if tool.name in tools and tools[tool.name] is not tool:
                raise LocalToolError(_("two local tools are named '%(name)s'") % {"name": tool.name})
            tools[tool.name] = tool
    return tools


def local_paths_problem(paths: Any) -> str | None:
    """Why ``paths`` (a ``local`` binding's ``args``) cannot be bound, or None (for ``McpServer.clean``)."""
    if not isinstance(paths, list) or not paths or not all(isinstance(p, str) for p in paths):
        return _('a local binding\'s arguments are a JSON list of dotted paths, e.g. ["mcpregistry.builtin_tools"]')
    try:
        load_local_tools(paths)
    except LocalToolError as exc:
        return str(exc)
    return None


def tool_input_schema(tool: BaseTool) -> dict[str, Any]:
    """The JSON schema of the arguments a model fills in (LangChain's ``tool_call_schema``), each argument by the
    name the tool reads it by (``_argument_aliases``)."""
    schema = tool.tool_call_schema
    if isinstance(schema, dict):
        return dict(schema)
    if issubclass(schema, BaseModel):
        return _by_alias(schema.model_json_schema(), _argument_aliases(tool))
    return dict(schema.schema())  # a pydantic v1 model (older LangChain tools)


def _argument_aliases(tool: BaseTool) -> dict[str, str]:
    """The names the tool's own ``args_schema`` reads its arguments by where they are not the fields' own, by field
    name: ``from_: str = Field(alias="from")`` (``from`` is a Python keyword) is sent as ``from``, which validation
    and the call read. LangChain's ``tool_call_schema`` drops the aliases: the model, told ``from_``, sent what the
    tool refuses, every time."""
    if not _is_model(tool.args_schema):
        return {}
    aliases = {}
    for name, field in tool.args_schema.model_fields.items():
        alias = field.validation_alias if isinstance(field.validation_alias, str) else field.alias
        if alias and alias != name:
            aliases[name] = alias
    return aliases


def _by_alias(schema: dict[str, Any], aliases: dict[str, str]) -> dict[str, Any]:
    """``schema`` with its properties and required names renamed by ``aliases``."""
    properties = schema.get("properties")
    if not aliases or not isinstance(properties, dict):
        return schema
    renamed = {**schema, "properties": {aliases.get(name, name): spec for name, spec in properties.items()}}
    if isinstance(schema.get("required"), list):
        renamed["required"] = [aliases.get(name, name) for name in schema["required"]]
    return renamed


def _is_coroutine_tool(tool: BaseTool) -> bool:
    """Whether ``tool`` runs only as a coroutine (an ``async def`` made a tool by ``local_tool`` or LangChain's
    ``@tool``): its ``invoke`` cannot run it."""
    return getattr(tool, "func", None) is None and getattr(tool, "coroutine", None) is not None


class _CoroutineCall:
    """One call of a coroutine tool: awaited on an event loop of its own in the worker thread (``run``), and
    cancelled from the waiting caller's thread (``cancel``) at its next ``await``, or before it starts."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cancelled = False
        self._task: asyncio.Task[Any] | None = None

    def run(self, tool: BaseTool, arguments: dict[str, Any]) -> Any:
        async def awaited() -> Any:
            with self._lock:
                if self._cancelled:
                    raise asyncio.CancelledError
                self._task = asyncio.current_task()
            try:
                return await tool.ainvoke(arguments)
            finally:
                with self._lock:
                    self._task = None  # the loop closes after this: nothing may be scheduled on it any more

        return asyncio.run(awaited())

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            if self._task is not None:
                self._task.get_loop().call_soon_threadsafe(self._task.cancel)


def _invoke(tool: BaseTool, arguments: dict[str, Any], coroutine_call: _CoroutineCall | None) -> ToolCallOutcome:
    """Run ``tool`` in the worker thread (a coroutine tool through ``coroutine_call``). A tool that raises is an
    answer (``is_error=True``), made here, in the tool's own thread: the caller's thread then tells the tool's
    failures from its own interruptions (Celery's soft time limit is an ``Exception`` raised in the caller's thread
    while it waits), which are never the tool's. Whatever this thread raises is the tool's, ``BaseException``
    included: signals, Celery's time limits and its shutdown are raised in the caller's thread, never in this one,
    so ``SystemExit`` or ``KeyboardInterrupt`` here came from the tool's code (argparse, ``sys.exit()``), and left
    to the future it would be raised in the caller's thread as the caller's own and end the worker's process. A
    coroutine cancelled is an answer too: nobody waits for it when the caller cancelled it, and one the tool
    cancelled itself is the tool's failure.

    Arguments the tool's own schema refuses (a Pydantic ``Field(gt=0)`` the contract does not hold) are not the
    tool's failure: the function is not run, and the answer carries ``argument_refusal``'s reason in ``refused``
    (what is wrong in its text), which the gate takes as the ``args:*`` refusal it is (the model is to fix the
    argument), not a ``tool:error`` not to retry; so is an ``ArgumentRefused`` the function raises.

    A typed value is written as its JSON, as FastMCP writes a tool's: a Pydantic model or a dataclass as its object,
    a set as a list, a date in ISO form (``_json_default``). A value that is no JSON (a dict with tuple keys, a
    circular reference) raises ``ToolResultInvalid`` (the gate's ``result:shape``): the function finished, a write
    was carried out, its answer cannot be read. ``None`` (a
    lookup that found nothing) is an answer with no content, as FastMCP gives it: the text ``null`` would pass a
    contract's ``returns.non_empty`` and be remembered."""
    try:
        refused = _arguments_refused(tool, arguments)
        if refused is not None:
            reason, problems = refused
            return ToolCallOutcome(
                is_error=True,
                text=problems,
                structured=None,
                content=[{"type": "text", "text": problems}],
                refused=reason,
            )
        raising = _raising(tool)
        value = coroutine_call.run(raising, arguments) if coroutine_call is not None else raising.invoke(arguments)
    except ArgumentRefused as exc:
        error = {"type": "value_error", "loc": (exc.argument,) if exc.argument else (), "ctx": {"error": exc}}
        reason, problems = argument_refusal([error])
        return ToolCallOutcome(
            is_error=True, text=problems, structured=None, content=[{"type": "text", "text": problems}], refused=reason
        )
    except BaseException as exc:  # noqa: BLE001 - raised by the tool's own code in its own thread: an answer
        text = _error_text(tool, exc)
        return ToolCallOutcome(is_error=True, text=text, structured=None, content=[{"type": "text", "text": text}])
    finally:
        # This worker thread's own database connections (a tool may read configuration): never left open.
        connections.close_all()
    if value is None:
        return ToolCallOutcome(is_error=False, text="", structured=None, content=[])
    try:
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=_json_default)
    except BaseException as exc:  # noqa: BLE001 - json's refusal, or the tool's own __str__ (``_json_default``)
        raise ToolResultInvalid(
            _("the tool's value cannot be written as JSON: %(error)s")
            % {"error": f"{type(exc).__name__}: {_message(exc)}"}
        ) from None
    return ToolCallOutcome(
        is_error=False, text=text, structured=_structured(value), content=[{"type": "text", "text": text}]
    )


def _raising(tool: BaseTool) -> BaseTool:
    """``tool`` as the gate must run it: raising its errors. A LangChain tool made with ``handle_tool_error`` (or
    ``handle_validation_error``) returns its ``ToolException``'s message as its answer instead, marked an error
    only on the ``ToolMessage`` a tool call gets, never on the value a call with arguments returns: the gate would
    take the failure for a success (audited ``ok``, remembered, checked as a result, no fallback). A copy with both
    off raises it, and the tool's failure is its ``tool:error``, its message as its author wrote it."""
    if not (tool.handle_tool_error or tool.handle_validation_error):
        return tool
    return tool.model_copy(update={"handle_tool_error": False, "handle_validation_error": False})


def _json_default(value: Any) -> Any:
    """What JSON writes for a value it has no form for: a Pydantic model, a dataclass, a set, a date, an enum as
    Pydantic writes them (FastMCP's way, so that a local tool that returns ``Employee(...)`` answers the object,
    not its Python ``repr`` as a text no contract's ``returns`` holds); anything Pydantic cannot write either as its
    text, as before."""
    try:
        return to_jsonable_python(value)
    except Exception:  # noqa: BLE001 - Pydantic's refusal, or the value's own code: its text then
        return str(value)


def _message(exc: BaseException) -> str:
    """``str(exc)``, or a note where the exception's own ``__str__`` fails: its text is then unreadable, and the
    failure to read it must not be taken for the caller's interruption (``unexpected``) nor end the worker."""
    try:
        return str(exc)
    except BaseException:  # noqa: BLE001 - the tool's exception's own code, run in the tool's thread
        return _("(its message could not be read)")


def _is_model(schema: Any) -> TypeGuard[type[BaseModel]]:
    return isinstance(schema, type) and issubclass(schema, BaseModel)


def _arguments_refused(tool: BaseTool, arguments: dict[str, Any]) -> tuple[str, str] | None:
    """Why the tool's own schema refuses ``arguments`` (``argument_refusal``'s reason and text), or None. Checked
    before the function runs against the tool's own ``args_schema``, its validators included (a ``field_validator``'s
    business rule: its ``ValueError`` is an argument refusal with the author's own words); LangChain's
    ``tool_call_schema`` is a copy without them. Only the arguments a model fills in are judged: an error at an
    injected argument (``InjectedToolArg``: not in ``tool_call_schema``) is left to the call. A ``ValidationError``
    the function raises itself (a backend's data it validates) stays its own error. A tool whose schema is no
    Pydantic v2 model (a JSON schema, a v1 model) is left to its own parsing."""
    filled = tool.tool_call_schema
    schema = tool.args_schema if _is_model(tool.args_schema) else filled
    if not _is_model(schema):
        return None
    try:
        schema.model_validate(arguments)
    except ValidationError as exc:
        errors = exc.errors()
        if schema is not filled and _is_model(filled):
            aliases = _argument_aliases(tool)
            names = {n for name, f in filled.model_fields.items() for n in (name, f.alias, aliases.get(name)) if n}
            errors = [e for e in errors if not e.get("loc") or str(e["loc"][0]) in names]
        return argument_refusal(errors) if errors else None
    return None


def _error_text(tool: BaseTool, exc: BaseException) -> str:
    """What a tool's exception tells the model, the gate's audit and, for a read, the person: ``"<Type>: <message>"``.
    An error its author raised on purpose (``ON_PURPOSE``) keeps its message as written; any other is an accident
    whose message may carry where the tool's backend lives (``ConnectionError: could not connect to 10.0.3.17:5432
    via /srv/app/db.py line 42``): its internal addresses, file paths and line numbers are left out
    (``mask_internal_locations``; secrets are the gate's to mask, as for every text), and the whole exception is
    logged for the operator, its secrets masked by the logging filter."""
    text = _message(exc)
    if not any(cls.__name__ in ON_PURPOSE for cls in type(exc).__mro__):
        masked = mask_internal_locations(text)
        if masked != text:
            logger.warning("local tool %s raised %s", tool.name, type(exc).__name__, exc_info=exc)
        text = masked
    return f"{type(exc).__name__}: {text}"


def _structured(value: Any) -> Any:
    """A local tool's value as an MCP server's structured content: an object as it is; a number or true/false
    wrapped as FastMCP wraps a value that is no object (``{"result": 3}``), so that the gate reads the tool's own
    value, not its text (the text ``3`` is no int, and a contract's ``returns.type: int`` would refuse it); no
    structured content for the rest (a text, a list: the text reads as them)."""
    if isinstance(value, dict):
        return value
    if isinstance(value, bool | int | float):
        return {"result": value}
    return None


def _in_language(
    language: str | None,
    invoke: Callable[[BaseTool, dict[str, Any], _CoroutineCall | None], ToolCallOutcome],
    tool: BaseTool,
    arguments: dict[str, Any],
    coroutine_call: _CoroutineCall | None,
) -> ToolCallOutcome:
    """``invoke`` in the worker thread with the caller's active language (``language``)."""
    with translation.override(language):
        return invoke(tool, arguments, coroutine_call)


class LocalToolRunner:
    """Runs local tools in worker threads, with the pool's ``call_tool``/``list_tools`` signatures."""

    def __init__(self, *, max_workers: int = THREADS, per_binding: int = THREADS_PER_BINDING) -> None:
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="local-tool")
        self._per_binding = per_binding
        self._slots: dict[Any, threading.BoundedSemaphore] = {}
        self._slots_lock = threading.Lock()

    def _binding_slots(self, config: dict[str, Any]) -> threading.BoundedSemaphore:
        """The binding's calls in flight, counted by its ``mcp_id`` (by its paths where it has none)."""
        key = config.get("mcp_id") or tuple(config.get("args") or [])
        with self._slots_lock:
            return self._slots.setdefault(key, threading.BoundedSemaphore(self._per_binding))

    def list_tools(self, config: dict[str, Any], *, timeout_s: float = 30.0, scope: str | None = None) -> ServerListing:
        """The binding's tools as a listing (no process, no session). Raises ``McpTransportError`` when its
        paths no longer load (recorded as the binding's health by discovery)."""
        try:
            tools = load_local_tools(config.get("args") or [])
        except LocalToolError as exc:
            raise McpTransportError(str(exc), sent=False) from exc
        listed = [
            {"name": name, "description": tool.description or "", "inputSchema": tool_input_schema(tool)}
            for name, tool in sorted(tools.items())
        ]
        return ServerListing(protocol_version=LOCAL_PROTOCOL, server_info={"name": "local tools"}, tools=listed)

    def call_tool(
        self,
        config: dict[str, Any],
        tool: str,
        arguments: dict[str, Any],
        *,
        timeout_s: float,
        scope: str | None = None,
    ) -> ToolCallOutcome:
        """Run ``tool`` in a worker thread and wait at most ``timeout_s``.

        Raises ``McpTransportError(sent=False)`` when the binding no longer loads, ``LocalToolBusy`` (not started)
        when the binding has ``per_binding`` calls in flight already, ``McpError`` for a tool the binding does not
        have, ``McpTimeoutError`` past the deadline (``sent`` False only if the call never started),
        ``ToolResultInvalid`` for a value that is no JSON (the function finished). A tool that raises comes back
        as ``is_error=True`` with ``"<ExceptionType>: <message>"`` (``_error_text``; ``SystemExit`` and ``KeyboardInterrupt`` too:
        raised in the tool's thread, they are the tool's); what interrupts the caller while it waits (Celery's
        ``SoftTimeLimitExceeded``) is raised, the call cancelled if it had not started. A coroutine tool under way
        is cancelled at the deadline and at the interruption too."""
        try:
            tools = load_local_tools(config.get("args") or [])
        except LocalToolError as exc:
            raise McpTransportError(str(exc), sent=False) from exc
        target = tools.get(tool)
        if target is None:
            raise McpError(types.ErrorData(code=types.METHOD_NOT_FOUND, message=f"Unknown local tool: {tool}"))
        coroutine_call = _CoroutineCall() if _is_coroutine_tool(target) else None
        slots = self._binding_slots(config)
        if not slots.acquire(blocking=False):
            raise LocalToolBusy(
                _(
                    "local tool '%(tool)s' was not started: %(count)d earlier calls of its binding are still running "
                    "(a function past its timeout keeps its thread until it returns)"
                )
                % {"tool": tool, "count": self._per_binding}
            )
        try:
            # Run in the caller's context (its run id, its span): the tool's log lines and spans belong to the run's;
            # and in its language, which the context does not carry (Django's is the thread's): a Korean agent's tool
            # refuses in Korean.
            language = translation.get_language()
            future = self._executor.submit(
                contextvars.copy_context().run, _in_language, language, _invoke, target, arguments, coroutine_call
            )
        except BaseException:
            slots.release()
            raise
        # The slot is the binding's until the function returns, or until the call is cancelled before it started.
        future.add_done_callback(lambda _done: slots.release())
        try:
            return future.result(timeout=timeout_s)
        except ToolResultInvalid:
            raise  # the tool's answer, not the caller's interruption
        except concurrent.futures.TimeoutError:
            started = not future.cancel()
            if coroutine_call is not None:
                coroutine_call.cancel()
            raise McpTimeoutError(f"local tool '{tool}' did not return within {timeout_s:g}s", sent=started) from None
        except BaseException:
            # The caller was stopped while it waited (the run's soft time limit, a shutdown): its own interruption,
            # raised as it is for the run to handle (an approved write's outcome is then unknown), never the
            # tool's error. A call still queued behind busy threads never starts; a function under way runs on, a
            # coroutine is cancelled.
            future.cancel()
            if coroutine_call is not None:
                coroutine_call.cancel()
            raise

    def close_scope(self, scope: str) -> None:
        """Nothing to close: local tools hold no sessions."""


_runner: LocalToolRunner | None = None


def local_runner() -> LocalToolRunner:
    global _runner
    if _runner is None:
        _runner = LocalToolRunner()
    return _runner


def runner_for(transport: str) -> McpSessionPool | LocalToolRunner:
    """Who carries a call for a binding of ``transport``: the local runner, or the MCP session pool."""
    return local_runner() if transport == LOCAL_TRANSPORT else get_default_pool()
