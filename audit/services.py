"""Writes to the audit record. Everything stored here is masked first."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.conf import settings

from audit.masking import mask_value, truncate
from audit.models import AuditEvent


def audit_event_record(
    *,
    source: str,
    action: str = "tool.call",
    run_id: Any = None,
    mcp_id: str = "",
    tool: str = "",
    call_id: str = "",
    args: dict[str, Any] | None = None,
    result: Any = None,
    ok: bool = True,
    reason: str = "",
    attempt: int = 1,
    latency_ms: float | None = None,
    actor: str = "",
    secrets: Iterable[str] = (),
) -> AuditEvent:
    """Append one audit event. Arguments and result are masked (key names, value patterns and the exact
    ``secrets`` given, plus every registered secret) and the result is truncated before it is stored."""
    secret_list = list(secrets)
    masked_result = mask_value(result, secrets=secret_list)
    return AuditEvent.objects.create(
        run_id=run_id,
        source=source,
        action=action,
        mcp_id=mcp_id,
        tool=tool,
        call_id=call_id[:100],
        args=mask_value(args or {}, secrets=secret_list),
        result=truncate(masked_result, max_chars=settings.PLATFORM_AUDIT_RESULT_MAX_CHARS),
        ok=ok,
        reason=reason[:200],
        attempt=attempt,
        latency_ms=latency_ms,
        actor=actor[:200],
    )
