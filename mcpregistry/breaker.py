"""A circuit breaker per MCP server, kept in the database so every worker (and the admin) sees one state.

``closed``: calls flow; ``breaker_threshold`` consecutive failures open it. ``open``: calls are refused at once
(``circuit:open``) until ``breaker_cooldown_s`` has passed; then one trial call is let through (``half_open``):
its success closes the circuit, its failure opens it again. Every transition is a compare-and-swap update.
Only failures that say the server is unwell count (timeout, transport, rate limit, unexpected), not a bad
argument or a tool's own answer.

The recovery path stays open: a tool that a contract on the server names as its fallback (seed 001's
``get_asset_status_backup``, which always answers) goes out past a circuit that other calls opened, or the
model that asked twice for the failing tool (seed 001 warns it may) would be refused the backup it is told to
use. Such a call is no trial: its success closes nothing (the failing tool stays held off), its failures count
as any other's, and once one of them is seen after the circuit opened (or opened it), the fallback is held off
too until the circuit's next trial.

Only live traffic moves the circuit. A call of an eval or shadow run (its writes blocked: ``live=False``) runs a
version that is not the live one (its frozen contract may tighten a timeout the server meets), so it respects an
open (or half-open) circuit but never claims its trial, and its outcome, a success or a failure, is not recorded:
it can neither open the circuit for live runs nor close it for them.

On the hot path (a healthy server) each process keeps what it last read for one second, so a call to a closed
circuit costs no query; a circuit another worker opened is seen within that second.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta

from django.db.models import F
from django.utils import timezone

from mcpregistry.models import McpServer

State = McpServer.BreakerState
COUNTED = frozenset({"timeout", "transport", "rate_limit", "unexpected"})
FRESH_S = 1.0
_seen_closed: dict[int, float] = {}  # server id -> monotonic time this process last saw it closed and clean
# (server id, tool) -> when this process last recorded a counted failure of that tool. Kept per process, as
# _seen_closed is: a fallback tool that fails while the circuit is open is sent at most once more by each other
# worker before that worker holds it off too.
_failed_at: dict[tuple[int, str], datetime] = {}


def breaker_admit(server_id: int, *, recovery_tool: str = "", live: bool = True, now: datetime | None = None) -> bool:
    """Whether a call to this server may go out now.

    ``live``: False for a call that is not production traffic (an eval or shadow run's): it goes out only while the
    circuit is closed (or as the recovery path), and never claims the half-open trial, which is live traffic's.

    ``recovery_tool``: ask for the recovery path of a call the plain check refused, naming a tool that a contract
    on the server names as its fallback. It is let through while the circuit is open or half open, unless that
    tool's own counted failure came after the circuit opened (or opened it); it never claims the trial. Record
    its outcome with ``past_open=True``."""
    if now is None and time.monotonic() - _seen_closed.get(server_id, -FRESH_S) < FRESH_S:
        return True
    now = now or timezone.now()
    row = (
        McpServer.objects.filter(pk=server_id)
        .values("breaker_state", "breaker_opened_at", "breaker_cooldown_s", "breaker_failures")
        .first()
    )
    if row is None or row["breaker_state"] == State.CLOSED:
        if row is not None and row["breaker_failures"] == 0:
            _seen_closed[server_id] = time.monotonic()
        return True
    opened_at = row["breaker_opened_at"] or now
    if recovery_tool:
        failed_at = _failed_at.get((server_id, recovery_tool))
        return failed_at is None or failed_at < opened_at
    if not live or now - opened_at < timedelta(seconds=row["breaker_cooldown_s"]):
        return False
    # Cool-down over: exactly one caller wins the trial (a stale half-open trial is retried the same way).
    claimed = McpServer.objects.filter(
        pk=server_id, breaker_state=row["breaker_state"], breaker_opened_at=row["breaker_opened_at"]
    ).update(breaker_state=State.HALF_OPEN, breaker_opened_at=now)
    return claimed == 1


def breaker_record(
    server_id: int,
    *,
    ok: bool,
    reason: str = "",
    answered: bool = False,
    tool: str = "",
    past_open: bool = False,
    live: bool = True,
    now: datetime | None = None,
) -> None:
    """Record a call's outcome. Failures that are the caller's (arguments) or the tool's answer don't count; an
    answer of any kind (``answered``: the tool's own error, a malformed result) ends a half-open trial as a
    success: the server is there (the trial used to stay half open, one call let through per cool-down).

    ``past_open``: the call went out past the open circuit as the recovery path (``breaker_admit``'s
    ``recovery_tool``): only its counted failure is recorded, so that the fallback's answer does not reopen the
    way for the tool that failed. ``tool``: the tool called, whose counted failures hold its recovery path off.
    ``live``: False for a call that is not production traffic (``breaker_admit``'s): nothing is recorded."""
    if not live or (past_open and (ok or reason not in COUNTED)):
        return
    if not ok and answered and reason not in COUNTED:
        McpServer.objects.filter(pk=server_id, breaker_state=State.HALF_OPEN).update(
            breaker_state=State.CLOSED, breaker_failures=0, breaker_opened_at=None
        )
        return
    if ok:
        if time.monotonic() - _seen_closed.get(server_id, -FRESH_S) < FRESH_S:
            return  # already closed and clean, as far as this process saw a moment ago
        McpServer.objects.filter(pk=server_id).exclude(breaker_state=State.CLOSED, breaker_failures=0).update(
            breaker_state=State.CLOSED, breaker_failures=0, breaker_opened_at=None
        )
        _seen_closed[server_id] = time.monotonic()
        return
    if reason not in COUNTED:
        return
    _seen_closed.pop(server_id, None)
    now = now or timezone.now()
    if tool:
        _failed_at[(server_id, tool)] = now
    McpServer.objects.filter(pk=server_id).update(breaker_failures=F("breaker_failures") + 1)
    # A failed trial reopens at once; otherwise open when the threshold is reached.
    McpServer.objects.filter(pk=server_id, breaker_state=State.HALF_OPEN).update(
        breaker_state=State.OPEN, breaker_opened_at=now
    )
    McpServer.objects.filter(
        pk=server_id, breaker_state=State.CLOSED, breaker_failures__gte=F("breaker_threshold")
    ).update(breaker_state=State.OPEN, breaker_opened_at=now)
