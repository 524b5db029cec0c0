"""Several tool calls in one model turn (seed 002 §1): the independent read calls run concurrently through the
gate; everything else runs one by one, in the order the model asked.

A run of consecutive calls forms a concurrent batch when each would go to the gate (known, offered, not withdrawn),
the risk of the contract the gate will apply (for a published version's run, the one it froze) is ``read`` (a write
needs an approval and is sent at most once: it stays sequential), and stays ``read`` in the database now (an admin
who marks a tool ``write`` mid-run: the run's contracts were loaded at its start; the turn's tools are read once, in
one query, before its batches form) and no earlier call in the batch has the same tool and arguments (the second
then runs after the batch and is answered by the gate's memo, as it would be sequentially). A batch runs on a thread
pool of at most ``per_run`` threads, at most ``per_server`` at once on one server. Each thread makes one
``gate.call`` — contract check, memo, breaker, timeout, retries, audit, all of it — on its own database connection
(closed afterwards); the run's bookkeeping (trace, events, correction counts) stays on the run's thread, and the
results go back to the model in the order asked. Should the gate still park a batched call (a safety net: the gate
reads the tool's risk again at each call, and an admin may mark it ``write`` between the two reads), the run parks
there as it would sequentially; the batch's later calls, already sent, run again on resume. A batch takes no call of
a tool once the tool's argument errors (counted so far, and those of its calls in the batch, judged ahead by the
contract's own check) reach its correction cap: that call runs after the batch and is refused as ``tool:withdrawn``;
a fan-out of well-formed calls to one tool stays one batch. Each call runs in a copy of the run's context
(``contextvars``: its gate span is a child of the run's, its log lines carry the run's ids). Inside a transaction on
the run's connection (a test wrapped in one) calls stay sequential: another connection could not see its uncommitted
rows. The run's soft time limit (Celery raises it on the run's thread only) ends a batch at once: each attempt
out is audited ``time_limit`` then, by the run's thread, and the batch's threads send nothing more (no retry, no
backoff wait; ``BatchStop``), the answer or timeout they still wait for being nobody's. The trace gets one
``parallel_calls`` entry per batch with each call's start and end (ms from the batch start) and the most calls that
overlapped.
"""

from __future__ import annotations

import contextvars
import dataclasses
import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from django.db import connection
from django.utils import translation
from langchain_core.messages import ToolMessage

from agents.tool_offer import ToolOffer
from mcpregistry import gate
from mcpregistry.contracts import check_args, gate_filled_argument
from mcpregistry.models import McpServer, McpTool, ToolContract

CallTool = Callable[..., tuple[ToolMessage, str | None]]


class BatchStop:
    """The run's time limit as a batch's threads learn of it (``gate.CallStop``). Celery raises its soft time
    limit on the run's thread only; a thread of the batch would otherwise run its call's timeout, back off and
    send it again, long after the run ended. ``cut_short`` (on the run's thread) sets the stop, and records each
    attempt out at that moment as cut short (``time_limit``), once: the thread that sent it writes nothing when
    its answer or its timeout comes, and sends nothing more."""

    def __init__(self) -> None:
        self._set = threading.Event()
        self._lock = threading.Lock()
        self._tickets = itertools.count()
        self._out: dict[object, Callable[[], None]] = {}  # each attempt out, with what records it cut short

    def is_set(self) -> bool:
        return self._set.is_set()

    def sending(self, cut_short: Callable[[], None]) -> object | None:
        with self._lock:
            if self._set.is_set():
                return None
            ticket = next(self._tickets)
            self._out[ticket] = cut_short
            return ticket

    def back(self, ticket: object) -> bool:
        with self._lock:
            return self._out.pop(ticket, None) is not None

    def cut_short(self) -> None:
        with self._lock:
            self._set.set()
            out, self._out = list(self._out.values()), {}
        for record in out:  # outside the lock: each writes its audit event (and never raises)
            record()


@dataclass
class ParallelCalls:
    index: dict[str, tuple[McpServer, McpTool]]
    offer: ToolOffer
    who: Callable[[str, str], gate.GateCall]
    per_run: int
    per_server: int
    trace: list[dict[str, Any]]
    emit: Callable[[str, dict[str, Any]], None]
    # Raises (``RunCancelled``) where the run must stop: before the batch, and before each call a thread sends.
    check_cancelled: Callable[[], None] = lambda: None
    # The stop a batch's thread met before sending its call (``run``), for the caller to raise.
    stopped: Exception | None = None
    _server_slots: dict[str, threading.BoundedSemaphore] = field(default_factory=dict)
    # The names of the turn's tools whose risk is ``write`` in the database now (``read_risks``).
    _now_write: frozenset[str] = frozenset()

    def read_risks(self, calls: list[dict[str, Any]]) -> None:
        """Read which of the tools ``calls`` name an admin has marked ``write`` since the run loaded its contracts:
        one query for the turn, none where no batch can form. Those calls stay out of a batch."""
        self._now_write = frozenset()
        if len(calls) < 2 or self.per_run < 2 or connection.in_atomic_block:
            return
        tools = {c["name"]: self.index[c["name"]][1] for c in calls if c["name"] in self.index}
        written = gate.tools_now_write(list(tools.values()))
        self._now_write = frozenset(name for name, tool in tools.items() if tool.pk in written)

    def eligible(self, tool_call: dict[str, Any]) -> bool:
        found = self.index.get(tool_call["name"])
        if found is None or self.per_run < 2 or not isinstance(tool_call.get("args"), dict):
            return False
        if connection.in_atomic_block:
            return False  # another thread's connection cannot see this transaction's rows: one by one
        name = tool_call["name"]
        if name in self.offer.withdrawn or (self.offer.active and name not in self.offer.offered):
            return False
        return name not in self._now_write and self._applied(tool_call).risk == ToolContract.Risk.READ

    def _applied(self, tool_call: dict[str, Any]) -> ToolContract:
        """The contract the gate will apply to the call: a published version's frozen one, not the draft's."""
        server, mcp_tool = self.index[tool_call["name"]]
        return gate.contract_applied(who=self.who("agent", tool_call.get("id") or ""), server=server, tool=mcp_tool)

    def within_cap(self, name: str, refused_in_batch: Counter[str]) -> bool:
        """Whether one more call of ``name`` fits in the batch: sent one by one, it would go to the gate only if
        the tool's argument errors so far plus those of its calls already in the batch are below its correction
        cap; otherwise it waits for their results (and is refused as withdrawn)."""
        cap = self.offer.correction_caps.get(name, 3)
        return self.offer.corrections.get(name, 0) + refused_in_batch[name] < cap

    def args_refused(self, tool_call: dict[str, Any]) -> bool:
        """Whether the gate will refuse the call's arguments (the contract's check, made here ahead of it: the
        same function on the same contract), which counts as one of the tool's argument errors."""
        applied = self._applied(tool_call)
        input_schema = self.index[tool_call["name"]][1].input_schema
        _args, verdict = check_args(
            applied.args or {},
            tool_call.get("args"),
            unknown=applied.unknown_args,
            input_schema=input_schema,
            idempotency_arg=gate_filled_argument(applied),
        )
        return verdict is not None

    def run(self, batch: list[dict[str, Any]]) -> list[gate.ToolResult | None]:
        """Send ``batch`` concurrently; the results in the batch's order. Raises ``RunCancelled`` where the run
        must stop (cancelled, out of time, taken over) before the pool starts: nothing is sent. Once it has, a call
        that has not started yet (waiting for a thread or its server's slot) is not sent: its result is None and
        ``stopped`` holds the stop, for the caller to raise once it has recorded the calls that were sent (they end
        and are audited as the gate audits them, and belong in the run's record as a sequential call would). The
        run's soft time limit, raised on this thread while the calls are out, is raised on at once (``BatchStop``):
        each attempt out is audited ``time_limit``, and nothing more is sent."""
        self.stopped = None
        self.check_cancelled()
        for tool_call in batch:
            self.offer.check(tool_call["name"])  # marks them called, on the run's thread
        language = translation.get_language()
        started = time.perf_counter()
        spans: list[tuple[float, float]] = [(0.0, 0.0)] * len(batch)
        stop = BatchStop()

        def one(position: int) -> gate.ToolResult | None:
            tool_call = batch[position]
            server, mcp_tool = self.index[tool_call["name"]]
            slot = self._server_slots.setdefault(server.mcp_id, threading.BoundedSemaphore(self.per_server))
            try:
                with slot, translation.override(language):
                    try:
                        self.check_cancelled()  # on this thread's connection, closed below
                    except Exception as cancelled:  # noqa: BLE001 - the run's stop, raised by the caller once recorded
                        self.stopped = self.stopped or cancelled
                        return None
                    if stop.is_set():
                        return None  # the run's time is up: nobody reads this call's result
                    begin = time.perf_counter()
                    result = gate.call(
                        server=server,
                        tool_name=mcp_tool.name,
                        args=tool_call.get("args"),
                        who=dataclasses.replace(self.who("agent", tool_call.get("id") or ""), stop=stop),
                    )
                    spans[position] = (begin - started, time.perf_counter() - started)
                    return result
            finally:
                connection.close()  # this thread's own connection

        for server, _tool in (self.index[c["name"]] for c in batch):
            self._server_slots.setdefault(server.mcp_id, threading.BoundedSemaphore(self.per_server))
        # Taken on the run's thread: each call's span and log context continue the run's (a pool thread has none).
        contexts = [contextvars.copy_context() for _call in batch]
        pool = ThreadPoolExecutor(max_workers=min(self.per_run, len(batch)), thread_name_prefix="tool-call")
        try:
            results = list(pool.map(lambda position: contexts[position].run(one, position), range(len(batch))))
        except SoftTimeLimitExceeded:
            # The run's time is up (raised on this thread only): the calls out are recorded cut short now, their
            # threads send nothing more, and the run ends without waiting for their timeouts.
            stop.cut_short()
            raise
        finally:
            pool.shutdown(wait=not stop.is_set(), cancel_futures=stop.is_set())
        entry = {
            "type": "parallel_calls",
            "calls": [
                {
                    "call_id": c.get("id") or "",
                    "tool": c["name"],
                    "start_ms": round(a * 1000, 2),
                    "end_ms": round(b * 1000, 2),
                }
                for c, (a, b), result in zip(batch, spans, results, strict=True)
                if result is not None  # a call the run's stop kept from being sent
            ],
            "max_overlap": max_overlap(spans),
        }
        self.trace.append(entry)
        self.emit("parallel_calls", entry)
        return results


def max_overlap(spans: list[tuple[float, float]]) -> int:
    """The most intervals open at one instant."""
    events = sorted([(a, 1) for a, _b in spans] + [(b, -1) for _a, b in spans], key=lambda e: (e[0], e[1]))
    open_now = best = 0
    for _t, step in events:
        open_now += step
        best = max(best, open_now)
    return best


def call_batch(
    calls: list[dict[str, Any]], *, call_tool: CallTool, parallel: ParallelCalls
) -> tuple[list[ToolMessage], str | None]:
    """Answer a model turn's calls in order: runs of eligible read calls concurrently, the rest one by one.
    Stops at a call that must wait for approval (its id is returned; the calls after it stay unanswered)."""
    answered: list[ToolMessage] = []
    parallel.read_risks(calls)
    i = 0
    while i < len(calls):
        batch: list[dict[str, Any]] = []
        keys: set[str] = set()
        refused: Counter[str] = Counter()  # the batch's calls whose arguments the gate will refuse, per tool
        while i + len(batch) < len(calls):
            candidate = calls[i + len(batch)]
            key = f"{candidate['name']}\n{gate.canonical_args(candidate.get('args') or {})}"
            if key in keys or not parallel.eligible(candidate) or not parallel.within_cap(candidate["name"], refused):
                break
            keys.add(key)
            refused[candidate["name"]] += parallel.args_refused(candidate)
            batch.append(candidate)
        if len(batch) >= 2:
            for tool_call, result in zip(batch, parallel.run(batch), strict=True):
                if result is None:
                    continue  # not sent: the run stops below, once the calls that were sent are recorded
                message, parked = call_tool(tool_call, result)
                if parked is not None:
                    # A safety net: the gate parked a call judged a read. The run stops there as it would
                    # sequentially (the approval stays the run's); the batch's later calls run again on resume.
                    return answered, parked
                answered.append(message)
            if parallel.stopped is not None:
                raise parallel.stopped
            i += len(batch)
            continue
        message, parked = call_tool(calls[i])
        if parked is not None:
            return answered, parked
        answered.append(message)
        i += 1
    return answered, None
