"""Traces (OpenTelemetry) and JSON log lines: small helpers the rest of the code calls in a few places.

Tracing is opt-in by the standard ``OTEL_*`` variables: it is on when ``OTEL_TRACES_EXPORTER`` names an exporter
(``otlp``, ``console``, or both as the spec's comma-separated list) or ``OTEL_EXPORTER_OTLP_ENDPOINT`` /
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set, and ``OTEL_SDK_DISABLED`` is not true. An exporter this platform
does not ship (``zipkin``, ``jaeger``, a typo) leaves traces off with a warning at start, naming it, rather than
exporting OTLP to wherever the default endpoint points. ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES`` and the exporter's own
variables (headers, timeout) are read by the SDK; the service is named ``agent-platform`` only where neither names
it. The exporter speaks OTLP over HTTP with protobuf only: an ``OTEL_EXPORTER_OTLP_PROTOCOL`` (or ``…_TRACES_…``)
naming another (``grpc``, ``http/json``) leaves traces off with a warning at start, rather than sending HTTP to a
gRPC port. Off, every helper here is OpenTelemetry's no-op.

Spans: one per API request (``TracingMiddleware``), Celery task (the publish injects the trace context into the
message headers, the worker continues it; a run's later pass also links to the trace that created the run,
``Run.traceparent``), run (``run_span``), deterministic rule (``spans_per_item``), model
call (``agents.model_tracing``), gate call (``gate_span``, a call refused before the gate too; each attempt is a
span event; one waiting for an approval is no error, ``platform.parked``), gated read (``gate_read_span``:
``resources/read``, ``prompts/get``) and MCP ``tools/call`` whose ``_meta`` carries a caller's trace context
(``mcp_call_traced``). Attributes follow the GenAI semantic conventions (``gen_ai.*``) plus ours (``platform.*``:
run id, agent, reason code, a stable code, never a sentence). A tool's arguments and results never become
attributes unless ``PLATFORM_TRACE_TOOL_PAYLOADS`` is on, and then only masked. ``mcp_request_meta()`` is what the pool sends to an MCP server in the request's ``_meta``. Only the W3C
trace context crosses a boundary (``traceparent``, ``tracestate``): a caller's ``baggage`` is neither read from a
request nor passed on to the broker or an MCP server.

This module imports no app of the platform as it loads (the apps import it); a gate call's span masks the tool's
name with ``audit.masking``, imported when called.
"""

from __future__ import annotations

import contextvars
import functools
import json
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan

logger = logging.getLogger(__name__)

TRACER_NAME = "agent_platform"
T = TypeVar("T")
R = TypeVar("R")
AttributeValue = str | bool | int | float

# The W3C trace context (``traceparent``, ``tracestate``) and nothing else: what crosses a boundary here (an HTTP
# request's headers in, a Celery message's headers, an MCP request's ``_meta``) is never read or written with the
# process's global propagator, which also carries ``baggage`` (a caller's baggage header, whatever it holds, would
# be forwarded to the broker and to every MCP server).
_W3C = TraceContextTextMapPropagator()

# The run this thread works for (JSON log lines carry it); set by the worker for a run's task.
current_run_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("platform_run_id", default=None)

_configured_lock = threading.Lock()
_configured = False


# The exporters OTEL_TRACES_EXPORTER may name (``none``, alone, turns traces off).
TRACES_EXPORTERS = ("otlp", "console")
# The names the installed exporter packages register for them (their ``opentelemetry_traces_exporter`` entry points):
# ``otlp_proto_http`` is the OTLP/HTTP exporter the platform uses.
TRACES_EXPORTER_ALIASES = {"otlp_proto_http": "otlp"}


def traces_exporters(environ: Mapping[str, str] | None = None) -> list[str]:
    """The exporters ``OTEL_TRACES_EXPORTER`` names, lower-cased, in order, each once: a comma-separated list (the
    OpenTelemetry spec's form; ``otlp`` alone is the usual value). Empty or unset: ``[]`` (the SDK's default,
    ``otlp``, where an endpoint asks for traces)."""
    env = os.environ if environ is None else environ
    named = (name.strip() for name in env.get("OTEL_TRACES_EXPORTER", "").lower().split(","))
    return list(dict.fromkeys(TRACES_EXPORTER_ALIASES.get(name, name) for name in named if name))


def tracing_requested(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the ``OTEL_*`` variables ask for traces (see the module's docstring)."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() in {"1", "true", "yes", "on"}:
        return False
    exporters = traces_exporters(env)
    if exporters == ["none"]:
        return False
    return bool(exporters or env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


# The service name where neither OTEL_SERVICE_NAME nor OTEL_RESOURCE_ATTRIBUTES gives one.
DEFAULT_SERVICE_NAME = "agent-platform"
# The one OTLP protocol the installed exporter (opentelemetry-exporter-otlp-proto-http) speaks.
OTLP_PROTOCOL = "http/protobuf"


def otlp_protocol(environ: Mapping[str, str] | None = None) -> str:
    """The OTLP protocol the variables ask for traces (``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL``, else
    ``OTEL_EXPORTER_OTLP_PROTOCOL``; empty or unset: ``http/protobuf``), lower-cased."""
    env = os.environ if environ is None else environ
    chosen = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "").strip() or env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "")
    return chosen.strip().lower() or OTLP_PROTOCOL


def configure_tracing() -> bool:
    """Install the SDK's tracer provider with a batch exporter (one per exporter named), once per process, when the
    ``OTEL_*`` variables ask for traces. Returns whether this call installed it. An exporter other than
    ``TRACES_EXPORTERS``, or an OTLP protocol other than ``http/protobuf``, installs nothing and logs a warning
    saying so (OTLP would go to a default endpoint where no collector listens, or HTTP wherever a gRPC collector
    listens, every batch failing). The batch processor re-creates its thread in a forked child (Celery's pool
    processes), so configuring before the fork is safe."""
    global _configured
    with _configured_lock:
        if _configured or not tracing_requested():
            return False
        from opentelemetry.sdk.resources import SERVICE_NAME, OTELResourceDetector, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

        exporter_names = traces_exporters() or ["otlp"]
        if any(name not in TRACES_EXPORTERS for name in exporter_names):
            logger.warning(
                "traces are off: OTEL_TRACES_EXPORTER is %r, but this platform exports traces with %s only (one of "
                "them, both comma-separated, or none to turn traces off)",
                os.environ.get("OTEL_TRACES_EXPORTER", "").strip(),
                " or ".join(TRACES_EXPORTERS),
            )
            return False
        exporters: list[SpanExporter] = []
        if "otlp" in exporter_names:
            protocol = otlp_protocol()
            if protocol != OTLP_PROTOCOL:
                logger.warning(
                    "traces are off: OTEL_EXPORTER_OTLP_PROTOCOL (or OTEL_EXPORTER_OTLP_TRACES_PROTOCOL) is %r, but this "
                    "platform exports OTLP over %s only (set it to %s, or unset it, and point "
                    "OTEL_EXPORTER_OTLP_ENDPOINT at the collector's HTTP port, usually 4318)",
                    protocol,
                    OTLP_PROTOCOL,
                    OTLP_PROTOCOL,
                )
                return False
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporters.append(OTLPSpanExporter())
        if "console" in exporter_names:
            exporters.append(ConsoleSpanExporter(formatter=console_span_text))
        # The SDK reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES itself, and an attribute given here would
        # override both: the default name only where neither gives one.
        named = SERVICE_NAME in OTELResourceDetector().detect().attributes
        resource = Resource.create({} if named else {SERVICE_NAME: DEFAULT_SERVICE_NAME})
        provider = TracerProvider(resource=resource)
        for exporter in exporters:
            provider.add_span_processor(BatchSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        _configured = True
        return True


def console_span_text(finished: ReadableSpan) -> str:
    """A finished span as the console exporter prints it: the SDK's JSON, with Korean (any text) as written, not
    as ``\\uXXXX`` escapes (the SDK's own ``to_json`` escapes every character outside ASCII)."""
    return json.dumps(json.loads(finished.to_json()), ensure_ascii=False, indent=4) + os.linesep


# Before a provider is installed this is OpenTelemetry's proxy, which follows the provider once there is one.
_tracer = trace.get_tracer(TRACER_NAME)


def tracer() -> trace.Tracer:
    return _tracer


def _clean(attributes: Mapping[str, Any]) -> dict[str, AttributeValue]:
    """Attributes OpenTelemetry accepts: None dropped, anything else not a primitive as its ``str``."""
    return {
        key: value if isinstance(value, str | bool | int | float) else str(value)
        for key, value in attributes.items()
        if value is not None
    }


@contextmanager
def span(
    name: str, attributes: Mapping[str, Any] | None = None, *, kind: SpanKind = SpanKind.INTERNAL
) -> Iterator[Span]:
    """A span around a block, current inside it; an exception escaping the block is recorded (type only: its
    text may hold a secret) and marks the span as an error."""
    with tracer().start_as_current_span(
        name, kind=kind, attributes=_clean(attributes or {}), record_exception=False, set_status_on_exception=False
    ) as current:
        try:
            yield current
        except GeneratorExit:
            raise  # a loop left early (``spans_per_item``): not a failure
        except BaseException as exc:
            current.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            current.set_attribute("error.type", type(exc).__name__)
            raise


def set_attributes(attributes: Mapping[str, Any]) -> None:
    """Set attributes on the current span (nothing when there is none)."""
    trace.get_current_span().set_attributes(_clean(attributes))


def add_event(name: str, attributes: Mapping[str, Any]) -> None:
    """An event on the current span (nothing when there is none)."""
    trace.get_current_span().add_event(name, _clean(attributes))


def spans_per_item(items: Iterable[T], name: str, attributes: Callable[[T], Mapping[str, Any]]) -> Iterator[T]:
    """Iterate ``items`` with one span around the loop body of each (current while the body runs): the span ends
    when the loop moves to the next item, breaks or returns (CPython closes the iterator at once)."""
    for item in items:
        with span(name, attributes(item)):
            yield item


def trace_id_hex() -> str | None:
    """The current trace's id as 32 hex digits, or None outside a recorded trace (a caller's trace continued where
    this process does not record is not ours to name)."""
    current = trace.get_current_span()
    return format(current.get_span_context().trace_id, "032x") if current.is_recording() else None


def traceparent_current() -> str:
    """The W3C ``traceparent`` of the current span, where this process records it (tracing on, the span sampled),
    else ``""``: a process that does not trace continues a caller's ``traceparent`` in a span it never exports, and
    a run created there has no trace of its own to link to. A run stores it (``Run.traceparent``)."""
    current = trace.get_current_span()
    if not current.is_recording() or not current.get_span_context().is_valid:
        return ""
    carrier: dict[str, str] = {}
    _W3C.inject(carrier)
    return carrier.get("traceparent", "")


def mcp_request_meta() -> dict[str, Any] | None:
    """The trace context for an MCP request's ``_meta`` (``traceparent``, ``tracestate`` where set), or None
    where there is none. A caller's context continued where this process does not record (traces off) is passed on
    as it came, as W3C trace context asks. Called on the caller's thread: the pool's event loop runs in another."""
    if not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    _W3C.inject(carrier)
    return dict(carrier) or None


# ---- the gate -------------------------------------------------------------------------------------------------


def payloads_enabled() -> bool:
    from django.conf import settings

    return bool(getattr(settings, "PLATFORM_TRACE_TOOL_PAYLOADS", False))


def traced_gate_call(call: Callable[..., R]) -> Callable[..., R]:
    """Wrap the gate's ``call(*, server, tool_name, args, who, ...)`` in its span (``gate_span``) and record the
    outcome of the ``ToolResult`` it returns (``gate_outcome``; its args and value are masked by then). Where the
    contract's fallback answered, the span is still the asked tool's, with that tool's failure, and names the backup
    (``platform.fallback_tool``). A call that raises (the run's time limit, the database) is named by the asked
    tool's name, masked as ``refuse_call`` masks it (a model may write anything there): it was left unnamed."""

    @functools.wraps(call)
    def traced(**kwargs: Any) -> R:
        who = kwargs["who"]
        with gate_span(
            mcp_id=kwargs["server"].mcp_id, tool="", source=who.source, run_id=who.run_id, call_id=who.call_id
        ) as current:
            try:
                result = call(**kwargs)
            except BaseException:
                if current.is_recording():
                    from audit.masking import mask_text

                    # Masked once the gate registered the server's secrets (as it started).
                    asked = mask_text(kwargs["tool_name"])
                    current.update_name(f"execute_tool {asked}")
                    current.set_attribute("gen_ai.tool.name", asked)
                raise
            outcome: Any = result
            # Named from the result: a name the server does not have (a model may write anything there) is
            # masked by the gate by then. Where the contract's fallback answered, the span is the asked tool's, with
            # its own failure; the backup's call is a span of its own inside this one.
            asked = outcome.fallback_for or outcome.tool
            current.update_name(f"execute_tool {asked}")
            current.set_attribute("gen_ai.tool.name", asked)
            if outcome.fallback_for:
                current.set_attribute("platform.fallback_tool", outcome.tool)
                gate_outcome(
                    ok=False,
                    reason=outcome.fallback_for_error,
                    attempts=outcome.fallback_for_attempts,
                    memo_hit=False,
                    args=outcome.args,
                    value=None,
                )
                return result
            gate_outcome(
                ok=outcome.ok,
                reason=outcome.error,
                attempts=outcome.attempts,
                memo_hit=outcome.memo_hit,
                args=outcome.args,
                value=outcome.value,
            )
            return result

    return traced


@contextmanager
def gate_span(*, mcp_id: str, tool: str, source: str, run_id: Any, call_id: str) -> Iterator[Span]:
    """The span of one gated tool call (``execute_tool <tool>``); the gate adds an event per attempt
    (``gate_attempt``) and the outcome (``gate_outcome``)."""
    with span(
        f"execute_tool {tool}",
        {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": tool,
            "gen_ai.tool.call.id": call_id or None,
            "gen_ai.tool.type": "function",
            "platform.mcp_id": mcp_id,
            "platform.source": source,
            "platform.run_id": str(run_id) if run_id else None,
        },
    ) as current:
        yield current


@contextmanager
def gate_read_span(
    *, method: str, mcp_id: str, target: str | None, source: str, run_id: Any, call_id: str
) -> Iterator[Span]:
    """The span of one gated MCP read: ``resources/read`` or ``prompts/get <prompt>`` (MCP's method names). The
    resource's URI is an attribute (``mcp.resource.uri``), never the name; ``target`` is None where the server
    never listed it (the caller's text: neither named nor recorded). The gate adds ``gate_attempt`` and
    ``gate_outcome`` as for a tool call."""
    prompt = method == "prompts/get"
    with span(
        f"{method} {target}" if prompt and target else method,
        {
            "mcp.method.name": method,
            "mcp.resource.uri": None if prompt else target,
            "gen_ai.prompt.name": target if prompt else None,
            "gen_ai.tool.call.id": call_id or None,
            "platform.mcp_id": mcp_id,
            "platform.source": source,
            "platform.run_id": str(run_id) if run_id else None,
        },
    ) as current:
        yield current


def gate_attempt(*, attempt: int, ok: bool, reason: str, latency_ms: float | None, action: str) -> None:
    """One audited attempt (or refusal, memo hit, approval request) of the current gate call, as a span event."""
    add_event(
        "gate.attempt",
        {
            "platform.attempt": attempt,
            "platform.ok": ok,
            "platform.reason_code": reason,
            "platform.latency_ms": latency_ms,
            "platform.action": action,
        },
    )


# The reason code of a write call waiting for a person's approval (the gate's): parked, neither success nor failure.
APPROVAL_PENDING = "approval:pending"


def gate_outcome(*, ok: bool, reason: str | None, attempts: int, memo_hit: bool, args: Any, value: Any) -> None:
    """The outcome of the current gate call. ``args`` and ``value`` must be masked already; they are recorded only
    where ``PLATFORM_TRACE_TOOL_PAYLOADS`` is on. A failure is an error span (status ERROR, ``error.type``); a call
    waiting for an approval (``approval:pending``) is none: it says ``platform.parked`` instead, its status unset."""
    current = trace.get_current_span()
    current.set_attributes(
        _clean(
            {
                "platform.ok": ok,
                "platform.reason_code": reason or "",
                "platform.attempts": attempts,
                "platform.memo_hit": memo_hit,
            }
        )
    )
    if reason == APPROVAL_PENDING:
        # Parked, not failed: the call waits for a person (the audit counts it as neither success nor failure), so
        # the span has no error status (an approval request was a red span, in every span error rate).
        current.set_attribute("platform.parked", True)
    elif not ok:
        current.set_status(Status(StatusCode.ERROR, reason or "failed"))
        current.set_attribute("error.type", reason or "failed")
    if payloads_enabled():
        current.set_attribute("gen_ai.tool.call.arguments", json.dumps(args, ensure_ascii=False, default=str))
        current.set_attribute("gen_ai.tool.call.result", json.dumps(value, ensure_ascii=False, default=str))


# ---- a run ----------------------------------------------------------------------------------------------------

# ``gen_ai.provider.name`` of the platform's model providers, for the run's span and each model call's
# (``agents.model_tracing``): the GenAI semantic conventions' well-known values. ``openai`` for any
# OpenAI-compatible server (vLLM, Ollama, LiteLLM): the conventions set it from the instrumentation's best knowledge
# and name the API the client speaks, since many providers are reached through the OpenAI API and its client
# (``gen_ai.request.model`` and ``server.address`` tell the actual one). The platform's own models, no GenAI
# product, keep their names as custom values: ``offline`` (answers from the deterministic results) and ``scripted``
# (replays a script: tests, demos).
GEN_AI_PROVIDER_NAMES: dict[str, str] = {"bedrock": "aws.bedrock", "openai_compatible": "openai"}


def gen_ai_provider_name(provider: str) -> str:
    """``gen_ai.provider.name`` for the platform's model ``provider`` (``GEN_AI_PROVIDER_NAMES``)."""
    return GEN_AI_PROVIDER_NAMES.get(provider, provider)


@contextmanager
def run_span(*, run_id: Any, agent: str, provider: str, model: str) -> Iterator[Span]:
    """The span of one pass of a run in the worker (``invoke_agent <agent>``); ``provider`` is the platform's name
    of the model provider (``Agent.model_provider``)."""
    with span(
        f"invoke_agent {agent}",
        {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": agent,
            "gen_ai.provider.name": gen_ai_provider_name(provider),
            "gen_ai.request.model": model or None,
            "platform.agent": agent,
            "platform.run_id": str(run_id),
        },
    ) as current:
        token = current_run_id.set(str(run_id))
        try:
            yield current
        finally:
            current_run_id.reset(token)


def run_outcome(*, status: str, error_code: str | None, token_usage: Mapping[str, Any]) -> None:
    """The outcome of the current run span."""
    set_attributes(
        {
            "platform.run.status": status,
            "platform.reason_code": error_code or "",
            "gen_ai.usage.input_tokens": int(token_usage.get("input_tokens", 0) or 0),
            "gen_ai.usage.output_tokens": int(token_usage.get("output_tokens", 0) or 0),
        }
    )
    if status == "failed":
        trace.get_current_span().set_status(Status(StatusCode.ERROR, error_code or "failed"))


# ---- Celery: web → broker → worker ----------------------------------------------------------------------------

_task_spans: dict[str, tuple[Span, object]] = {}
_task_spans_lock = threading.Lock()

# The task message's header with the run's first trace (``Run.traceparent``), sent with each later pass of the run
# (``agents.dispatch.run_dispatch``): the pass's task span links to it, its parent staying the publisher's.
RUN_TRACEPARENT_HEADER = "platform_run_traceparent"


def _before_task_publish(headers: dict[str, Any] | None = None, **_kwargs: Any) -> None:
    """Put the publisher's trace context into the task message's headers (W3C ``traceparent``)."""
    if headers is not None:
        _W3C.inject(headers)


class _RequestGetter:
    """Reads the trace context from a Celery task request, where message headers become attributes."""

    def get(self, carrier: Any, key: str) -> list[str] | None:
        value = getattr(carrier, key, None)
        if value is None and isinstance(getattr(carrier, "headers", None), dict):
            value = carrier.headers.get(key)
        return [value] if isinstance(value, str) else None

    def keys(self, carrier: Any) -> list[str]:
        return []


def _task_prerun(task_id: str = "", task: Any = None, args: Any = None, **_kwargs: Any) -> None:
    """Start the task's span as a child of the publisher's, and note the run id for log lines."""
    if task is None:
        return
    parent = _W3C.extract(task.request, getter=_RequestGetter())  # type: ignore[arg-type]
    if not trace.get_current_span(parent).get_span_context().is_valid:
        # No trace context in the message (a task run in-process, eagerly): the caller's context, if any.
        parent = otel_context.get_current()
    run_id = str(args[0]) if task.name == "agents.run_agent" and args else None
    current_run_id.set(run_id)
    started = tracer().start_span(
        f"celery.task {task.name}",
        context=parent,
        kind=SpanKind.CONSUMER,
        links=_run_trace_links(task.request, parent),
        attributes=_clean(
            {
                "messaging.system": "celery",
                "messaging.operation.type": "process",
                "messaging.message.id": task_id,
                "celery.task.name": task.name,
                "platform.run_id": run_id,
            }
        ),
    )
    token = otel_context.attach(trace.set_span_in_context(started, parent))
    with _task_spans_lock:
        _task_spans[task_id] = (started, token)


def _run_trace_links(request: Any, parent: otel_context.Context) -> list[Link]:
    """A later pass of a run (resumed after an approval, queued again by the reconciler): a link to the run's first
    trace, which its message names (``RUN_TRACEPARENT_HEADER``); none where the pass is in that trace already."""
    stored = _RequestGetter().get(request, RUN_TRACEPARENT_HEADER)
    if not stored:
        return []
    first = trace.get_current_span(_W3C.extract({"traceparent": stored[0]})).get_span_context()
    if not first.is_valid or first.trace_id == trace.get_current_span(parent).get_span_context().trace_id:
        return []
    return [Link(first)]


def _task_failure(task_id: str = "", exception: BaseException | None = None, **_kwargs: Any) -> None:
    with _task_spans_lock:
        entry = _task_spans.get(task_id)
    if entry is not None and exception is not None:
        entry[0].set_status(Status(StatusCode.ERROR, type(exception).__name__))
        entry[0].set_attribute("error.type", type(exception).__name__)


def _task_postrun(task_id: str = "", state: str | None = None, **_kwargs: Any) -> None:
    with _task_spans_lock:
        entry = _task_spans.pop(task_id, None)
    current_run_id.set(None)
    if entry is None:
        return
    started, token = entry
    if state:
        started.set_attribute("celery.task.state", state)
    started.end()
    try:
        otel_context.detach(token)  # type: ignore[arg-type]
    except Exception:  # noqa: BLE001 - a context from another thread: the span is ended, that is what matters
        logger.debug("trace context of task %s not detached", task_id)


def _flush_spans(**_kwargs: Any) -> None:
    """Export the spans still batched before a pool process ends (it leaves without running ``atexit``)."""
    provider = trace.get_tracer_provider()
    flush = getattr(provider, "force_flush", None)
    if callable(flush):
        flush(5000)


def connect_celery_signals() -> None:
    """Connect the publish and task signals (once; ``agent_platform.celery`` calls it)."""
    from celery.signals import before_task_publish, task_failure, task_postrun, task_prerun, worker_process_shutdown

    before_task_publish.connect(_before_task_publish, weak=False, dispatch_uid="platform-trace-publish")
    worker_process_shutdown.connect(_flush_spans, weak=False, dispatch_uid="platform-trace-flush")
    task_prerun.connect(_task_prerun, weak=False, dispatch_uid="platform-trace-prerun")
    task_failure.connect(_task_failure, weak=False, dispatch_uid="platform-trace-failure")
    task_postrun.connect(_task_postrun, weak=False, dispatch_uid="platform-trace-postrun")


# ---- Django: one span per request -----------------------------------------------------------------------------


class _MetaGetter:
    """Reads ``traceparent`` / ``tracestate`` from a Django request's ``META``."""

    def get(self, carrier: Mapping[str, Any], key: str) -> list[str] | None:
        value = carrier.get("HTTP_" + key.upper().replace("-", "_"))
        return [value] if isinstance(value, str) else None

    def keys(self, carrier: Mapping[str, Any]) -> list[str]:
        return []


# The request methods a span is named by (HTTP's and PATCH's); any other is ``_OTHER`` (OpenTelemetry's HTTP
# conventions): a client may send any token there, and each would be a span name.
_KNOWN_METHODS = frozenset({"CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "TRACE"})


# The request's attribute holding its recorded span's context (``TracingMiddleware``), for the log lines Django
# writes once the middleware chain has returned (``django.request``'s "Not Found: …"), outside the span.
REQUEST_SPAN_CONTEXT = "platform_span_context"


class TracingMiddleware:
    """A server span per request, continuing a caller's ``traceparent`` (never its ``baggage``). Named by the method
    alone (``GET``; ``HTTP`` for a method outside HTTP's own, which is ``_OTHER`` in ``http.request.method``) and,
    once a route matched, by the method and the route (``GET /api/v1/runs/<uuid:run_id>``): the path a client
    asked for is the ``url.path`` attribute, never the name (a scanner's every path would be a span name).

    A recorded span's context is kept on the request (``REQUEST_SPAN_CONTEXT``): Django logs a 4xx or 5xx response
    (``django.request``) after the chain, outside the span, and the JSON log line names the request's trace all the
    same. A probe's 503 (``/readyz`` not ready) is left out of ``django.request``: it was an ERROR line saying only
    "Service Unavailable" on every probe, while the probe logs its failure with the reason itself."""

    def __init__(self, get_response: Callable[[Any], Any]) -> None:
        self.get_response = get_response

    def __call__(self, request: Any) -> Any:
        parent = _W3C.extract(request.META, getter=_MetaGetter())  # type: ignore[arg-type]
        raw_method = str(request.method or "")
        known = raw_method in _KNOWN_METHODS
        method = raw_method if known else "_OTHER"
        named = raw_method if known else "HTTP"
        attributes: dict[str, AttributeValue] = {"http.request.method": method, "url.path": request.path}
        if not known:
            attributes["http.request.method_original"] = raw_method[:64]
        with tracer().start_as_current_span(
            named,
            context=parent,
            kind=SpanKind.SERVER,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as current:
            if current.is_recording():
                setattr(request, REQUEST_SPAN_CONTEXT, current.get_span_context())
            response = self.get_response(request)
            if response.status_code == 503:
                from agent_platform.probe_middleware import PROBE_PATHS

                if request.path_info in PROBE_PATHS:
                    response._has_been_logged = True  # Django's own flag: log_response() writes nothing
            match = getattr(request, "resolver_match", None)
            if match is not None and match.route:
                route = "/" + match.route.lstrip("^").rstrip("$")
                current.update_name(f"{named} {route}")
                current.set_attribute("http.route", route)
            current.set_attribute("http.response.status_code", response.status_code)
            if response.status_code >= 500:
                current.set_status(Status(StatusCode.ERROR))
            return response


# ---- MCP: the trace context in a request's ``_meta`` ---------------------------------------------------------


@contextmanager
def mcp_call_traced(meta: Mapping[str, Any], request_meta: Mapping[str, Any]) -> Iterator[None]:
    """Around the run an MCP ``tools/call`` makes: the trace context its ``params._meta`` carries (``traceparent``,
    ``tracestate``: MCP's place for it, and the only one the platform's own MCP client fills) continued by a server
    span, ``tools/call``, current inside the block, so that the run (``Run.traceparent``) and its task join the
    caller's trace; the span links to the request's own (``TracingMiddleware``'s, a trace of its own). Read as a
    header is: a malformed ``traceparent`` is ignored, and so is ``_meta``'s where the request's header gave one
    (the request's span continues that already). Nothing to continue: the block runs as it would."""
    carrier = {key: meta[key] for key in ("traceparent", "tracestate") if isinstance(meta.get(key), str)}
    parent = _W3C.extract(carrier)
    headed = _W3C.extract(request_meta, getter=_MetaGetter())  # type: ignore[arg-type]
    if not trace.get_current_span(parent).get_span_context().is_valid or (
        trace.get_current_span(headed).get_span_context().is_valid
    ):
        yield
        return
    request_span = trace.get_current_span().get_span_context()
    with tracer().start_as_current_span(
        "tools/call",
        context=parent,
        kind=SpanKind.SERVER,
        links=[Link(request_span)] if request_span.is_valid else [],
        attributes={"mcp.method.name": "tools/call"},
        record_exception=False,
        set_status_on_exception=False,
    ):
        yield


# ---- logs -----------------------------------------------------------------------------------------------------


# The web server's own loggers (uvicorn's start and error lines, and its access log: one line per request, the query
# string included).
SERVER_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access")


def server_log_handlers_adopted(log_format: str) -> None:
    """Mask what the web server's own loggers write, and write it as JSON objects under ``LOG_FORMAT=json``: called
    as the application is loaded (``agent_platform.asgi``), in each process that serves it, after the server set
    up its logging. uvicorn run alone gave them its own plain, unmasked handlers (a URL's ``?api_key=`` in clear).
    The handlers stay the server's, with their destinations and levels (``--log-config``, ``--log-level``,
    ``--no-access-log``, gunicorn.conf.py's): only uvicorn's own formatters give way to the JSON one."""
    from audit.masking import install_logging_filter

    install_logging_filter()  # every handler there is, these included: idempotent
    for name in SERVER_LOGGERS:
        for handler in logging.getLogger(name).handlers:
            formatter = handler.formatter
            if not type(formatter).__module__.startswith("uvicorn."):
                continue  # the operator's, or gunicorn's (gunicorn.conf.py): theirs
            if log_format == "json":
                handler.setFormatter(JsonLogFormatter())
            elif type(formatter).__name__ == "AccessFormatter":
                # It reads the request's parts from the record's arguments, which the masking filter has formatted
                # into its (masked) message: the same line from that message (only the status' phrase is gone).
                from uvicorn.logging import DefaultFormatter

                colours = getattr(formatter, "use_colors", None)
                handler.setFormatter(DefaultFormatter("%(levelprefix)s %(message)s", use_colors=colours))


def _logged_span_context(record: logging.LogRecord) -> trace.SpanContext | None:
    """The span a log line belongs to: the current one where this process records it (never a caller's trace
    continued in a span this process does not record: traces off, its ids are not ours), else the span of the
    request the record names (``REQUEST_SPAN_CONTEXT``: Django's own lines, logged after the middleware chain)."""
    current = trace.get_current_span()
    if current.is_recording():
        return current.get_span_context()
    kept = getattr(getattr(record, "request", None), REQUEST_SPAN_CONTEXT, None)
    return kept if isinstance(kept, trace.SpanContext) else None


def _django_response_text(message: str) -> str:
    """A message Django's ``log_response`` wrote, its arguments (the request's path) escaped to ASCII with
    ``unicode_escape``: Korean as written again (``Not Found: /api/v1/좌표``, not ``\\uc88c\\ud45c``), while any
    character that is not printable (a control character, a line separator) stays escaped as Django wrote it. The
    JSON line needs no more against log injection; a message Django did not escape (not ASCII) is left as it is."""
    try:
        text = message.encode("ascii").decode("unicode_escape")
    except UnicodeError:
        return message
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


def _is_django_response(record: logging.LogRecord) -> bool:
    """Whether ``record`` is Django's line about a response (``log_response()``'s and ``log_message()``'s)."""
    return record.name.startswith("django.") and hasattr(record, "status_code") and hasattr(record, "request")


class PlainLogFormatter(logging.Formatter):
    """The plain line (``LOG_FORMAT`` unset): Django's lines about a response say the request's path as written
    (``_django_response_text``: ``Not Found: /api/v1/좌표``), as the JSON line does."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        if _is_django_response(record):
            record = logging.makeLogRecord({**record.__dict__, "message": _django_response_text(record.message)})
        return super().formatMessage(record)


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and the run id and trace id where known
    (``LOG_FORMAT=json``). The handler's masking filter has already masked the record. Django's lines about a
    response (``django.request``: ``Not Found: …``) carry the request's trace and say its path as written
    (``_django_response_text``)."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if _is_django_response(record):
            message = _django_response_text(message)  # log_response()'s and log_message()'s records
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": message,
        }
        run_id = getattr(record, "run_id", None) or current_run_id.get()
        if run_id:
            entry["run_id"] = str(run_id)
        context = _logged_span_context(record)
        if context is not None and context.is_valid:
            entry["trace_id"] = format(context.trace_id, "032x")
            entry["span_id"] = format(context.span_id, "016x")
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:  # ``stack_info=True``: where the line was logged from (the plain format shows it too)
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False, default=str)
