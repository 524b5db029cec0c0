"""The tool gate: the one door every tool call passes, whoever asks for it (a deterministic rule, the model,
a flow node).

For each call it resolves the tool on its bound server, calls it over the session pool with a hard timeout,
writes one masked audit event per attempt and returns a ``ToolResult``. It never raises: a failure is a value
with a reason code (``tool:unknown``, ``mcp:not_loaded:<mcp_id>``, ``timeout``, ``transport``,
``tool:error``, ``protocol``, ``unexpected``) and a message that tells the model what to do next.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from django.utils.translation import gettext as _
from mcp import McpError

from audit.masking import mask_text, mask_value, register_secrets
from audit.services import audit_event_record
from mcpregistry.models import McpServer, McpTool
from mcpregistry.pool import McpTimeoutError, McpTransportError, get_default_pool

logger = logging.getLogger(__name__)

Source = Literal["deterministic", "agent", "flow", "admin"]


@dataclass
class ToolResult:
    """The outcome of one gated call. ``value`` is the tool's result (parsed JSON where the text is JSON);
    ``error`` is a reason code; ``message`` is what the model is told."""

    ok: bool
    value: Any = None
    error: str | None = None
    message: str = ""
    attempts: int = 0
    latency_ms: float = 0.0
    mcp_id: str = ""
    tool: str = ""
    args: dict[str, Any] = field(default_factory=dict)

    def for_model(self) -> str:
        """The text a model reads: the result itself, or a diagnostic that says what to do next."""
        if self.ok:
            return self.value if isinstance(self.value, str) else json.dumps(self.value, ensure_ascii=False)
        return self.message

    def as_dict(self) -> dict[str, Any]:
        return {
            "mcp_id": self.mcp_id,
            "tool": self.tool,
            "args": self.args,
            "ok": self.ok,
            "value": self.value,
            "error": self.error,
            "message": self.message,
            "attempts": self.attempts,
            "latency_ms": round(self.latency_ms, 2),
        }


@dataclass(frozen=True)
class GateCall:
    """Who is asking: the run (if any), the source and the actor, for the audit."""

    source: Source
    run_id: Any = None
    actor: str = ""
    call_id: str = ""


def _parse(text: str) -> Any:
    stripped = text.strip()
    if stripped[:1] in "{[":
        try:
            return json.loads(stripped)
        except ValueError:
            return text
    return text


def resolve_tool(
    servers: list[McpServer], mcp_id: str, tool_name: str
) -> tuple[McpServer | None, McpTool | None, str | None]:
    """Find ``tool_name`` on the bound server ``mcp_id``. Returns (server, tool, reason-if-not-found)."""
    server = next((s for s in servers if s.mcp_id == mcp_id), None)
    if server is None or not server.enabled:
        return None, None, f"mcp:not_loaded:{mcp_id}"
    tool = next((t for t in server.tools.all() if t.name == tool_name and t.callable), None)
    if tool is None:
        return server, None, "tool:unknown"
    return server, tool, None


def call(
    *,
    server: McpServer,
    tool_name: str,
    args: dict[str, Any],
    who: GateCall,
    known_tool: bool = True,
) -> ToolResult:
    """Call ``tool_name`` on ``server`` through the pool. Returns a failed ToolResult, never raises.

    ``known_tool=False`` means the caller could not resolve the tool: the call is refused (and audited)
    with ``tool:unknown`` without reaching the server.
    """
    secrets = server.secret_values()
    register_secrets(secrets)  # so every log line of this process masks them too
    started = time.perf_counter()
    result = ToolResult(ok=False, mcp_id=server.mcp_id, tool=tool_name, args=dict(args))
    raw_value: Any = None
    try:
        if not server.enabled:
            result.error = f"mcp:not_loaded:{server.mcp_id}"
            result.message = _("MCP '%(mcp_id)s' tools not loaded: the server is disabled. Do not call it again.") % {
                "mcp_id": server.mcp_id
            }
        elif not known_tool:
            result.error = "tool:unknown"
            result.message = _(
                "Tool '%(tool)s' does not exist on '%(mcp_id)s'. Use one of the tools you were given."
            ) % {
                "tool": tool_name,
                "mcp_id": server.mcp_id,
            }
        else:
            result.attempts = 1
            outcome = get_default_pool().call_tool(
                server.connection_config(),
                tool_name,
                args,
                timeout_s=server.timeout_s,
                scope=server.pool_scope(who.run_id),
            )
            raw_value = (
                outcome.structured if outcome.structured is not None and not outcome.text else _parse(outcome.text)
            )
            if outcome.is_error:
                result.error = "tool:error"
                result.message = _(
                    "Tool '%(tool)s' failed: %(detail)s Follow the tool's guidance above if it names another "
                    "tool; otherwise fix the arguments or stop and explain the failure."
                ) % {"tool": tool_name, "detail": outcome.text.strip()}
            else:
                result.ok = True
                result.value = raw_value
    except McpTimeoutError as exc:
        result.error = "timeout"
        result.message = _("Tool '%(tool)s' timed out (%(detail)s). Try again later or use another tool.") % {
            "tool": tool_name,
            "detail": exc,
        }
    except McpTransportError as exc:
        result.error = "transport"
        result.message = _("Tool '%(tool)s' could not be reached (%(detail)s). Do not retry it now.") % {
            "tool": tool_name,
            "detail": exc,
        }
    except McpError as exc:
        result.error = "protocol"
        result.message = _("The server refused the call to '%(tool)s': %(detail)s") % {"tool": tool_name, "detail": exc}
    except Exception as exc:
        logger.exception("unexpected failure calling %s.%s", server.mcp_id, tool_name)
        result.error = "unexpected"
        result.message = _("Tool '%(tool)s' failed unexpectedly (%(kind)s). Stop and explain the failure.") % {
            "tool": tool_name,
            "kind": type(exc).__name__,
        }
    result.latency_ms = (time.perf_counter() - started) * 1000
    result.message = mask_text(result.message, secrets=secrets)
    result.value = mask_value(result.value, secrets=secrets)
    result.args = mask_value(result.args, secrets=secrets)
    audit_event_record(
        source=who.source,
        run_id=who.run_id,
        mcp_id=server.mcp_id,
        tool=tool_name,
        call_id=who.call_id,
        args=args,
        result=raw_value if raw_value is not None else result.message,
        ok=result.ok,
        reason=result.error or "",
        attempt=max(result.attempts, 1),
        latency_ms=result.latency_ms,
        actor=who.actor,
        secrets=secrets,
    )
    return result
