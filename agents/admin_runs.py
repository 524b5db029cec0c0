"""The admin's pages for runs and approvals: a run reads as a timeline that follows the run live, an approval is
decided on its own page (arguments shown masked, a reason required to reject, a confirmation), and nothing here
deletes or edits a run, an approval or an audit row.

Writes go through the services: ``run_cancel`` and ``approval_decide``. The live view is the run's own event
stream (``RunEventFeed``, the one ``GET /api/v1/runs/{id}/events`` serves), authorised by the admin's session
instead of an API key; each event makes the page fetch the timeline again (one small HTML fragment).
"""

from __future__ import annotations

import calendar
import copy
import datetime as dt
import json
import math
import re
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from functools import cached_property
from importlib import import_module
from typing import Any

from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.exceptions import NotRegistered
from django.contrib.admin.filters import ListFilter
from django.contrib.admin.views.main import ChangeList
from django.contrib.auth import HASH_SESSION_KEY, SESSION_KEY, get_user_model
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.handlers.asgi import ASGIRequest
from django.db.models import Case, F, IntegerField, Max, Min, Q, QuerySet, Value, When
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBase,
    HttpResponseRedirect,
    StreamingHttpResponse,
)
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone, translation
from django.utils.crypto import constant_time_compare
from django.utils.formats import date_format
from django.utils.html import format_html
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from agent_platform.errors import ApplicationError
from agents.agent_settings_form import RANKER_CHOICES
from agents.api.config import api_setting
from agents.api.events import RunEventFeed, stream_async, stream_sync
from agents.api.throttling import StreamSlot
from agents.approvals import REASON_MAX_CHARS, approval_decide, approvals_waiting, asked_by_the_model
from agents.budgets import usd_text
from agents.config_cache import shown_secrets
from agents.decision_reasons import approval_reason_text, reason_text
from agents.error_texts import _KNOWN_MESSAGES, error_message_text  # noqa: F401 (read here by others)
from agents.models import Agent, Approval, Run, ShadowComparison
from agents.selectors import run_seen_finished
from agents.services import CANCELLABLE, run_cancel
from audit.admin_readonly import ReadOnlyAdminMixin, WritesRefusedMixin
from audit.labels import actor_in_words, breakable, reason_label, when_cell
from audit.masking import mask_known
from audit.models import AuditEvent
from audit.visible import TOOL_DATA_CLOSE, TOOL_DATA_OPEN, readable_text, visible_text
from mcpregistry.list_fields import argument_rows

StepStatus = str
"""``ok``, ``degraded`` (it worked, after a retry, a fallback, a reused result or an uncertain outcome),
``failed``, ``skipped``, ``pending`` or ``""`` (neither: a message)."""


@dataclass
class Attempt:
    number: int
    ok: bool
    reason: str
    latency_ms: float | None
    # Named where a step's attempts went to more than one tool (the contract's fallback called by the gate).
    tool: str = ""
    # What a failed attempt got back, as its audit event stores it (masked): the tool's answer, the server's
    # message; cut short (``_attempt_said``).
    said: str = ""

    @property
    def reason_words(self) -> str:
        """The reason in the reader's words (its code when there are none)."""
        return reason_label(self.reason)


@dataclass
class TimelineStep:
    """One step of a run as the admin shows it. ``args`` and ``result`` are already masked (the trace and the
    audit store them masked) and pretty-printed."""

    kind: str
    label: str
    title: str = ""
    status: StepStatus = ""
    status_text: str = ""
    duration_ms: float | None = None
    args: str = ""
    result: str = ""
    attempts: list[Attempt] = field(default_factory=list)
    note: str = ""
    # The arguments a row each (``name``, value as the rule editor writes it), where they are an object.
    arg_rows: list[tuple[str, str]] | None = None
    # The approval the step is, or that its call had: the run's page links to it (``url``) for a reader who may
    # view approvals (``RunAdmin.timeline_context``).
    approval_id: str = ""
    url: str = ""
    # An approval's times: when it was requested, decided, or expires (local, ``_local_time``).
    when: str = ""

    def with_args(self, value: Any) -> TimelineStep:
        """Set the arguments: rows for an object, its JSON otherwise (nothing when there are none)."""
        self.args = visible_text(_pretty(value))
        self.arg_rows = argument_rows(value) if self.args else None
        return self


# A step's texts that may quote a caller, a model or a tool (its kind, status and links are the page's own).
_STEP_TEXTS = ("label", "title", "status_text", "args", "result", "note", "when")


def _step_shown(step: TimelineStep, secrets: Iterable[str]) -> TimelineStep:
    """``step`` with its texts, its argument rows and its attempts' masked again with ``secrets`` (and the
    registered ones: ``mask_known``, nothing else, so JSON stays JSON), in one pass over the step."""
    texts: dict[str, Any] = {name: getattr(step, name) for name in _STEP_TEXTS}
    texts["arg_rows"] = [list(row) for row in step.arg_rows] if step.arg_rows is not None else None
    texts["attempts"] = [[a.reason, a.tool, a.said] for a in step.attempts]
    shown = mask_known(texts, secrets=secrets)
    if shown == texts:
        return step
    for name in _STEP_TEXTS:
        setattr(step, name, shown[name])
    step.arg_rows = [(name, value) for name, value in shown["arg_rows"]] if step.arg_rows is not None else None
    step.attempts = [
        replace(a, reason=reason, tool=tool, said=said)
        for a, (reason, tool, said) in zip(step.attempts, shown["attempts"], strict=True)
    ]
    return step


def _pretty(value: Any) -> str:
    if value in (None, "", {}, []):
        return ""
    return json.dumps(value, ensure_ascii=False, indent=2)


def _text(content: Any) -> str:
    return content if isinstance(content, str) else _pretty(content)


_TOOL_DATA_BLOCK = re.compile(f"{re.escape(TOOL_DATA_OPEN)}\n(.*?)\n{re.escape(TOOL_DATA_CLOSE)}", re.S)


def _tool_data_shown(text: str) -> str:
    """``text`` (a failed call's message, the system message) with each ``<tool_data>`` block as a person reads
    it. The block writes ``<``, ``>`` and ``&`` as JSON escapes (``\\u003c``…) so that nothing in it can close it
    for the model (``audit.visible.tool_data_block``); here its JSON is shown again with those characters as they
    are and the rest as the model reads it: still JSON, so a tool's own "</tool_data>" shows inside its string's
    quotes, never as the block's end, and its ``⟦U+…⟧`` markers stay. Only what is shown changes: the stored text
    and what the model read do not. A block that is no JSON (cut short) stays as it is."""

    def shown(block: re.Match[str]) -> str:
        try:
            value = json.loads(block.group(1))
        except ValueError:
            return block.group(0)
        return f"{TOOL_DATA_OPEN}\n{json.dumps(value, ensure_ascii=False, indent=2)}\n{TOOL_DATA_CLOSE}"

    return _TOOL_DATA_BLOCK.sub(shown, text) if TOOL_DATA_OPEN in text else text


def _tool_answer_shown(text: str) -> str:
    """A successful call's text as the model read it (``gate.ToolResult.for_model``: the tool's answer in a
    ``<tool_data>`` block, a fallback's notice before it) as a person reads the tool's answer: the block's value
    itself, a text as it is and anything else as indented JSON; the notice stays. A block that is no JSON (cut
    short), and a text stored before answers were delimited, stay as they are."""

    def shown(block: re.Match[str]) -> str:
        try:
            value = json.loads(block.group(1))
        except ValueError:
            return block.group(0)
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, indent=2)

    return _TOOL_DATA_BLOCK.sub(shown, text) if TOOL_DATA_OPEN in text else text


def _failed_text(reason: str) -> str:
    """ "failed: <the reason in words> (<its code>)", or the code alone where there are no words for it."""
    words = reason_label(reason) if reason else ""
    shown = f"{words} ({reason})" if words and words != reason else (reason or "?")
    return gettext("failed: %(reason)s") % {"reason": shown}


# The most characters of a failed attempt's answer or message shown under it.
ATTEMPT_SAID_MAX_CHARS = 500


def _attempt_said(value: Any) -> str:
    """A failed attempt's stored result (masked: the tool's answer, the server's message) as shown: at most
    ``ATTEMPT_SAID_MAX_CHARS`` characters ("…" where cut), what does not show itself written out. A result the
    audit stored cut short (``audit.masking.truncate``) shows its preview."""
    stored = _dict(value)
    text = _str(stored["preview"]) if stored.get("truncated") is True and "preview" in stored else _str(value)
    if len(text) > ATTEMPT_SAID_MAX_CHARS:
        text = text[:ATTEMPT_SAID_MAX_CHARS] + "…"
    return readable_text(text)


def _call_step(step: TimelineStep, events: list[Any], *, ok_in_trace: bool | None, error: str = "") -> TimelineStep:
    """Fill a tool call's outcome, attempts and duration from its audit events (or, with none, from the trace)."""
    sent = [e for e in events if e.attempt >= 1]
    several = len({e.tool for e in sent}) > 1
    step.attempts = [
        Attempt(
            e.attempt, e.ok, e.reason, e.latency_ms, e.tool if several else "", "" if e.ok else _attempt_said(e.result)
        )
        for e in sent
    ]
    timed = [e.latency_ms for e in sent if e.latency_ms is not None]
    if timed:  # an attempt the open circuit never let through has no time: none at all is no "0 ms"
        step.duration_ms = round(sum(timed), 2)
    if not events:
        if ok_in_trace is None:
            step.status, step.status_text = "", gettext("not audited")
        elif ok_in_trace:
            step.status, step.status_text = "ok", gettext("ok")
        else:
            step.status, step.status_text = "failed", _failed_text(error)
        return step
    last = events[-1]
    if last.ok:
        step.status, step.status_text = "ok", gettext("ok")
        if last.reason == "memo:hit":
            step.status, step.status_text = "degraded", gettext("ok (reused within the run)")
        elif len(sent) > 1:
            step.status = "degraded"
    else:
        step.status, step.status_text = "failed", _failed_text(last.reason)
    if sent:  # the time is the step's duration, shown once beside it
        step.status_text += " · " + gettext("%(n)d attempt(s)") % {"n": len(sent)}
    if not step.result and last.result not in (None, "", {}):
        step.result = _pretty(last.result)
    return step


_APPROVAL_STATUS = {
    "approved": "ok",
    "executed": "ok",
    "executing": "pending",
    "pending": "pending",
    "rejected": "failed",
    "expired": "failed",
    "outcome_unknown": "degraded",
}


def _approval_step(approval: Approval | None, *, label: str, title: str, args: Any) -> TimelineStep:
    """An approval as a step: its status, who decided and why, and what the call it let through gave (the value
    the tool returned, or why the call failed: the stored ``{ok, reason, value}`` is never shown as it is)."""
    step = TimelineStep(kind="approval", label=label, title=title).with_args(args)
    if approval is None:
        step.status, step.status_text = "pending", gettext("pending")
        return step
    step.approval_id = str(approval.pk)
    step.status = _APPROVAL_STATUS.get(approval.status, "")
    step.status_text = approval.get_status_display()
    if approval.decided_by:
        step.status_text += " · " + gettext("by %(who)s") % {"who": actor_in_words(approval.decided_by)}
    times = [gettext("requested %(time)s") % {"time": _local_time(approval.created_at)}]
    if approval.decided_at is not None:
        times.append(gettext("decided %(time)s") % {"time": _local_time(approval.decided_at)})
    if approval.status == Approval.Status.EXPIRED:  # lapsed, or ended unused (then, ``approvals_unused``)
        times.append(gettext("expired %(time)s") % {"time": _local_time(approval.expires_at)})
    elif approval.decided_at is None:  # undecided: when it lapses
        times.append(gettext("expires %(time)s") % {"time": _local_time(approval.expires_at)})
    step.when = " · ".join(times)
    step.note = _reason_shown(approval.reason)
    recorded = approval.result
    if isinstance(recorded, dict) and "ok" in recorded:
        if recorded.get("ok"):
            step.result = _pretty(recorded.get("value"))
        elif reason := _str(recorded.get("reason")):
            # An outcome unknown is not a failure: the reason is what is known of how the call ended.
            words = _code_in_words(reason) if recorded.get("outcome_unknown") else _failed_text(reason)
            step.note = f"{step.note} · {words}" if step.note else words
    elif recorded:
        step.result = _pretty(recorded)
    return step


def _local_time(moment: dt.datetime) -> str:
    """A time as the run's page writes it: local, with its zone (``2026-12-04 03:32:41 KST``)."""
    return date_format(timezone.localtime(moment) if timezone.is_aware(moment) else moment, "Y-m-d H:i:s T")


def _reason_shown(reason: str) -> str:
    """An approval's reason as shown: in the reader's language where the platform wrote it, a person's as written,
    each character that does not show itself written out (``audit.visible``); the stored reason is left as it is."""
    return visible_text(approval_reason_text(reason))


def _outcome_unknown(step: TimelineStep, approval: Approval) -> None:
    """A call step whose approved write ended with its outcome unknown (a timeout, a dropped session): the write
    may have taken effect, so it is never said to have failed. Its step reads as its approval's does: "outcome
    unknown", with what is known of how the call ended (``server unreachable (transport)``) in its note."""
    if step.status in ("failed", ""):  # a send that was answered after all (an idempotent write's) says so
        step.status_text = approval.get_status_display()
        if step.attempts:
            step.status_text += " · " + gettext("%(n)d attempt(s)") % {"n": len(step.attempts)}
    step.status = "degraded"
    reason = _str(_dict(approval.result).get("reason"))
    if reason:
        step.note += " · " + _code_in_words(reason)


def _str(value: Any) -> str:
    """A stored value as text: a string as it is, nothing for None, anything else as its JSON."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    return json.dumps(value, ensure_ascii=False) if isinstance(value, dict | list) else str(value)


def _number(value: Any) -> float | None:
    """A stored number (a bool, a text or an infinity is none)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value if math.isfinite(value) else None


def _count(value: float | None) -> str:
    """A stored count as shown: grouped by thousands, "?" where none is stored."""
    return "?" if value is None else f"{value:,g}"


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _type(entry: dict[str, Any]) -> str:
    kind = entry.get("type")
    return kind if isinstance(kind, str) else ""


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _ms(value: Any) -> str:
    number = _number(value)
    return "?" if number is None else f"{number:,.2f}".rstrip("0").rstrip(".")


# Why a tool is in a turn's offer (``agents.tool_selection``).
_WHY = {
    "rule": _("named by a rule"),
    "pinned": _("pinned"),
    "called": _("called before"),
    "widened": _("asked for by the model"),
    "ranked": _("ranked %(score)s"),
    "forced": _("forced first call"),
    "fallback": _("fallback of a failed tool"),
    "all": _("allowed"),
}

# Why a turn could not force the tool it was to force (``Selection.forced_dropped``).
_FORCED_DROPPED = {
    "filtered_out": _("outside the agent's tool selection filters"),
    "withdrawn": _("withdrawn from this run"),
    "not_a_tool": _("not a tool of this run"),
}

# Entries the ReAct loop appends to the trace before the conversation's messages: each is placed by its turn or
# its call next to the step it belongs to (``_in_order``).
_MESSAGE_TYPES = frozenset({"system", "human", "ai", "tool"})
# The steps a trace records (not its messages or notes): what says whether the stored trace or the run's events
# tell more.
_STEP_TYPES = frozenset({"rule", "deterministic_call", "flow_call", "flow_node", "ai", "tool"})
# What the stored trace says of the model's context and no event does (besides the conversation's earlier answers).
_CONTEXT_TYPES = frozenset({"prompt", "resource", "resource_tool", "history_left_out", "system", "human"})


def _in_order(entries: list[dict[str, Any]], call_of_approval: dict[str, str]) -> list[dict[str, Any]]:
    """The trace's entries in the order they happened. A run's events may hold several passes, each opened by a
    ``pass`` entry (a run resumed after an approval, taken over from a lost worker, or retried after an error):
    each pass is put in order on its own (``_pass_in_order``), with the turns the engine counts before it — those
    of the passes before it, less those of a pass cut short (the pass that took it over, or retried it, started
    again from the stored conversation)."""
    ordered: list[dict[str, Any]] = []
    segment: list[dict[str, Any]] = []
    turns_before = 0

    def own_turns(part: list[dict[str, Any]]) -> int:
        return sum(1 for e in part if _type(e) == "ai" and not e.get("history"))

    for entry in entries:
        if _type(entry) != "pass":
            segment.append(entry)
            continue
        ordered.extend(_pass_in_order(segment, call_of_approval, turns_before))
        if not (entry.get("taken_over") or entry.get("retried")):
            turns_before += own_turns(segment)
        ordered.append(entry)
        segment = []
    ordered.extend(_pass_in_order(segment, call_of_approval, turns_before))
    return ordered


def _pass_in_order(
    entries: list[dict[str, Any]], call_of_approval: dict[str, str], turns_before: int = 0
) -> list[dict[str, Any]]:
    """One pass's entries in the order they happened. The engine appends what its ReAct loop notes (tool
    selection, parallel calls, a withdrawn tool, an approval, a model's failure or the outcome it ended with)
    before the conversation's messages; each goes before the model turn of its ``turn`` (counted from the run's
    ``turns_before`` earlier turns), after the turn that made its calls, before the call (a model's or a flow's)
    it approved, after the call that withdrew its tool, or last (a model failure, an outcome). One that cannot be
    placed stays where it is."""
    # This run's model turns (an earlier answer of the conversation, given to the model, is none of them).
    ai_at = [i for i, e in enumerate(entries) if _type(e) == "ai" and not e.get("history")]
    message_at = [i for i, e in enumerate(entries) if _type(e) in _MESSAGE_TYPES]
    turn_of_call: dict[str, int] = {}
    for i in ai_at:
        for call in _list(entries[i].get("tool_calls")):
            if isinstance(call, dict) and call.get("id"):
                turn_of_call.setdefault(_str(call["id"]), i)
    tool_at: dict[str, int] = {}
    flow_call_at: dict[str, int] = {}  # a flow's calls, by their number (``flow:<n>``, ``flow:<node>@<step>:<n>``)
    for i, e in enumerate(entries):
        if _type(e) == "tool" and e.get("tool_call_id"):
            tool_at.setdefault(_str(e["tool_call_id"]), i)
        elif _type(e) == "flow_call" and e.get("call_id"):
            flow_call_at.setdefault(_str(e["call_id"]), i)
    before: dict[int, list[int]] = {}
    after: dict[int, list[int]] = {}
    last: list[int] = []
    moved: set[int] = set()

    def place(j: int, where: dict[int, list[int]] | None, anchor: int | None) -> None:
        if where is None:
            if message_at:
                last.append(j)
                moved.add(j)
            return
        if anchor is not None and anchor != j:
            where.setdefault(anchor, []).append(j)
            moved.add(j)

    for j, e in enumerate(entries):
        kind = _type(e)
        if kind == "tool_selection":
            number = _number(e.get("turn"))
            turn = None if number is None else number - turns_before
            if turn is not None and turn == int(turn) and 1 <= turn <= len(ai_at):
                place(j, before, ai_at[int(turn) - 1])
            elif turn is not None and turn > len(ai_at):
                place(j, None, None)  # the turn it was for did not come back (the model failed, the run stopped)
        elif kind == "parallel_calls":
            ids = [_str(c.get("call_id")) for c in _list(e.get("calls")) if isinstance(c, dict)]
            turn_at = next((turn_of_call[i] for i in ids if i in turn_of_call), None)
            place(j, after, turn_at)
        elif kind == "tool_withdrawn":
            name = _str(e.get("tool"))
            failed = [
                i
                for i, m in enumerate(entries)
                if _type(m) == "tool" and _str(m.get("name")) == name and _str(m.get("error")).startswith("args:")
            ]
            count = _number(e.get("corrections"))
            if failed:
                nth = int(count) - 1 if count is not None and 1 <= count <= len(failed) else len(failed) - 1
                place(j, after, failed[nth])
        elif kind == "approval":
            call_id = call_of_approval.get(_str(e.get("approval_id"))) or _str(e.get("call_id"))
            if call_id in tool_at:
                place(j, before, tool_at[call_id])
            elif call_id in flow_call_at:
                place(j, before, flow_call_at[call_id])
            elif call_id in turn_of_call:
                place(j, after, turn_of_call[call_id])
        elif kind in ("model_error", "outcome"):
            place(j, None, None)
    end = message_at[-1] if message_at else -1
    ordered: list[dict[str, Any]] = []
    for i, e in enumerate(entries):
        ordered.extend(entries[k] for k in before.get(i, []))
        if i not in moved:
            ordered.append(e)
        ordered.extend(entries[k] for k in after.get(i, []))
        if i == end:
            ordered.extend(entries[k] for k in last)
    return ordered


def _pass_start(running: dict[str, Any], before: Any, delivery_before: float | None) -> str:
    """How a pass of the run began, from its ``running`` status event, the ``status`` event before it and the
    delivery of the pass before it: ``retried`` — the next delivery after its worker gave the run back on an error
    a retry can fix (a ``queued`` event with the reason ``retryable``: ``RunClaim.release``); ``taken_over`` —
    any other later delivery: one whose worker was lost, whose claim lapsed (no ``queued`` event between the
    passes, or a delivery that never wrote its ``running`` event in between) or that the reconciler queued again
    (``worker_lost: …``); or "" — the run's first delivery (its first pass, or one resumed after an approval:
    deliveries are counted afresh then)."""
    delivery = _number(running.get("delivery"))
    if delivery is None or delivery < 2:
        return ""
    released = isinstance(before, dict) and before.get("status") == "queued" and before.get("reason") == "retryable"
    if released and (delivery_before is None or delivery == delivery_before + 1):
        return "retried"
    return "taken_over"


def _pass_starts(statuses: list[Any]) -> list[str]:
    """``_pass_start`` of each ``running`` status event in ``statuses`` (the run's, in order)."""
    starts: list[str] = []
    before: Any = None
    delivery_before: float | None = None
    for data in statuses:
        if isinstance(data, dict) and data.get("status") == "running":
            starts.append(_pass_start(data, before, delivery_before))
            delivery_before = _number(data.get("delivery"))
        before = data
    return starts


def _entries_from_events(run: Run) -> list[dict[str, Any]]:
    """The run's steps as its events recorded them (masked, as they happened), in the trace's shapes. Each pass
    of the run (its ``running`` status event) opens with a ``pass`` entry: its number, and whether it took the
    run over from a worker that was lost, started it again after an error a retry can fix, or resumed it after an
    approval (``_pass_start``)."""
    events = list(run.events.order_by("seq").values_list("kind", "data"))
    starts = iter(_pass_starts([data for kind, data in events if kind == "status"]))
    entries: list[dict[str, Any]] = []
    passes = 0
    for kind, data in events:
        if not isinstance(data, dict):
            continue
        if kind == "status" and data.get("status") == "running":
            passes += 1
            start = next(starts)
            entries.append(
                {"type": "pass", "pass": passes, "taken_over": start == "taken_over", "retried": start == "retried"}
            )
        elif kind == "rule":
            entries.append({**data, "type": "rule"})
        elif kind == "deterministic_result":
            entries.append({**data, "type": "deterministic_call"})
        elif kind == "model_turn" and data.get("late") is True:
            continue  # a lost worker's call that came back after its run was taken over: charged, never used
        elif kind == "model_turn":
            entries.append({**data, "type": "ai"})
        elif kind == "tool_call" and data.get("source") == "flow":
            entries.append({**data, "type": "flow_call"})
        elif kind == "tool_call" and data.get("error") == "approval:pending":
            entries.append({"type": "approval", "call_id": data.get("call_id"), "tool": data.get("tool")})
        elif kind == "tool_call":
            ok = bool(data.get("ok"))
            entries.append(
                {
                    "type": "tool",
                    "tool_call_id": data.get("call_id"),
                    "name": data.get("tool"),
                    "content": data.get("value") if ok else data.get("message"),
                    "status": "success" if ok else "error",
                    "error": data.get("error") or "",
                }
            )
        elif kind == "approval":
            entries.append({"type": "approval", **data})
        elif kind in ("flow_node", "tool_selection", "parallel_calls"):
            entries.append({**data, "type": kind})
    return entries


def _trace_entries(run: Run) -> list[Any]:
    """What the timeline is built from: the stored trace (``run.messages``, written when the run ends or parks)
    or the run's events, with the trace's notes (its prompt, resources, messages, failures) beside them, where
    they tell more: for a run still going, one that ran in more than one pass (resumed after an approval, taken
    over from a lost worker, retried after an error: the stored trace holds the last pass's conversation and
    flow calls, and nothing says where a pass began), and one that ended without its steps in it (cancelled,
    stopped by its iterations or its model). A finished run's page thus shows what its live page showed."""
    stored = run.messages
    messages: list[Any] = stored if isinstance(stored, list) else ([stored] if stored else [])
    dicts = [e for e in messages if isinstance(e, dict)]
    events = _entries_from_events(run)

    def count(entries: list[Any], kinds: frozenset[str]) -> int:
        return sum(1 for e in entries if _type(e) in kinds)

    use_events = any(_type(e) != "pass" for e in events) and (
        run.status in (Run.Status.QUEUED, Run.Status.RUNNING)
        or count(events, frozenset({"pass"})) > 1
        or count(events, frozenset({"ai"})) > count(dicts, frozenset({"ai"}))
        or count(dicts, _STEP_TYPES) < count(events, _STEP_TYPES)
    )
    if not use_events:
        return messages
    # The query goes before the model's loop or the flow (after the rules and their calls, which come first).
    loop = ("ai", "tool", "tool_selection", "parallel_calls", "flow_call", "flow_node")
    first_loop = next((i for i, e in enumerate(events) if _type(e) in loop), len(events))
    # A rule that could not be decided (its parameters could not be filled) is in the trace alone: it ended the
    # deterministic stage, after the rules the events recorded.
    undecided = [e for e in dicts if _type(e) == "rule" and "rule_id" not in e]
    context = [e for e in dicts if _type(e) in _CONTEXT_TYPES or (_type(e) == "ai" and e.get("history"))]
    if not any(_type(e) == "human" for e in context):
        context.append({"type": "human", "content": run.query})
    notes = [e for e in dicts if _type(e) in ("tool_withdrawn", "model_error", "outcome")]
    return [*events[:first_loop], *undecided, *context, *events[first_loop:], *notes]


# A task of a flow's call id (``agents.flow_runner.FlowCallIds``): ``<node>@<step>``, ``<node>#<i>@<step>`` for
# the task of a step's i-th ``Send``.
_FLOW_TASK = re.compile(r"(?P<node>.+?)(?:#(?P<send>\d+))?@(?P<step>\d+)", re.S)


def _flow_call_maker(call_id: str) -> str:
    """Which node of the flow made the call ``call_id``, in words, as far as its id says: a branch's call (a task
    that ran beside others in its step, a ``Send``'s, a subgraph's) names its node, its step and its number within
    that task (``flow:reader2@1:1``: "by node reader2 at step 1, its call 1"); a subgraph's call names the parent
    tasks first (``flow:work#1@2/inner@1:1``), and a parent's later run of its subgraph (a number in the id: 1 for
    its second) too. A call of a step's only task has only its number in the run's order (``flow:3``), which names
    no node. "" where the id says neither (one shortened with a digest, a node named with a "/", another shape):
    the step shows the id itself beside."""
    made = call_id.removeprefix("flow:")
    if made == call_id:
        return ""
    if made.isdigit():
        return gettext("the flow's call no. %(n)s, made by a node that ran alone in its step") % {"n": made}
    task, colon, number = made.rpartition(":")  # a node's name holds neither | nor : (LangGraph's)
    if not colon or not number.isdigit():
        return ""
    tasks: list[str] = []
    for part in task.split("/"):
        if part.isdigit() and tasks:
            tasks[-1] = gettext("%(task)s (its subgraph's run %(n)s)") % {"task": tasks[-1], "n": int(part) + 1}
            continue
        if (found := _FLOW_TASK.fullmatch(part)) is None:
            return ""
        words = {"node": found["node"], "step": found["step"], "i": found["send"]}
        if found["send"] is None:
            tasks.append(gettext("%(node)s at step %(step)s") % words)
        else:
            tasks.append(gettext("%(node)s (Send %(i)s) at step %(step)s") % words)
    return gettext("by node %(node)s, its call %(n)s") % {"node": " › ".join(tasks), "n": number}


class _Timeline:
    """Builds a run's steps from its trace entries (any stored shape: an odd one reads as such, never a 500)."""

    def __init__(self, run: Run, secrets: list[str]) -> None:
        self.secrets = secrets  # the answer is compared with a turn's text as both are shown (``offline_turn``)
        self.error_code = run.error_code
        # When each pass of the run began (its ``running`` status events). A call's number (a flow's ``flow:<n>``)
        # is given again in each pass, so its audit events are told apart by the pass they came in: a repeat in a
        # later pass (the flow run again after an approval, the run taken over from a lost worker) is no retry.
        starts = [
            created
            for data, created in run.events.filter(kind="status").order_by("seq").values_list("data", "created_at")
            if isinstance(data, dict) and data.get("status") == "running"
        ]
        self.calls: dict[str, list[Any]] = {}
        self.calls_by_pass: dict[str, dict[int, list[Any]]] = {}
        audited = run.audit_events.filter(action__in=("tool.call", "resource.read", "prompt.get")).order_by("id")
        for event in audited:
            self.calls.setdefault(event.call_id, []).append(event)
            by_pass = self.calls_by_pass.setdefault(event.call_id, {})
            by_pass.setdefault(bisect_right(starts, event.created_at), []).append(event)
        # A pending approval past its expiry, not yet swept, reads as the expired one it is (``_approval_shown``).
        self.approvals = [_approval_shown(a) for a in run.approvals.order_by("created_at")]
        # The offline provider's turn is no model's: it answers from the deterministic results.
        self.offline = run_provider_is_offline(run)
        self.answer = run.answer
        self.by_id = {str(a.pk): a for a in self.approvals}
        self.by_call = {a.call_id: a for a in self.approvals if a.call_id}
        self.shown: set[str] = set()
        self.approval_steps: set[str] = set()
        self.turns = 0
        # The pass the entries read now belong to (None: a stored trace, which holds its calls' last pass), and
        # the model turns counted before it began (a pass that takes a lost one over counts from there again).
        self.pass_now: int | None = None
        self.turns_before_pass = 0

    def offline_turn(self, entry: dict[str, Any]) -> bool:
        """Whether a model turn is the offline provider's: its one turn, which calls no tool and is the answer."""
        if not self.offline or self.turns != 1 or entry.get("tool_calls"):
            return False
        shown = mask_known([_text(entry.get("content", "")), self.answer], secrets=self.secrets)
        return bool(self.answer) and shown[0] == shown[1]

    def pass_calls(self, key: str) -> list[Any]:
        """The audit events of the call ``key`` in the pass being read (in the last pass that made it, where that
        is not known: a stored trace). A call the pass did not send (a flow's write that waited for its approval,
        sent by the next pass) has none: the next pass's attempts are not shown twice."""
        by_pass = self.calls_by_pass.get(key)
        if not by_pass:
            return []
        if self.pass_now is not None:
            return by_pass.get(self.pass_now, [])
        return by_pass[max(by_pass)]

    def step(self, entry: Any) -> TimelineStep | None:
        if not isinstance(entry, dict):
            return TimelineStep(kind="other", label=gettext("unreadable trace entry"), result=_text(entry))
        kind = entry.get("type") if isinstance(entry.get("type"), str) else ""
        handler = getattr(self, f"_{kind}", None) if kind in _HANDLED else None
        if handler is None:
            label = gettext("trace entry %(type)s") % {"type": kind} if kind else gettext("unreadable trace entry")
            return TimelineStep(kind="other", label=label, result=_pretty(entry))
        step: TimelineStep | None = handler(entry)
        return step

    def _rule(self, entry: dict[str, Any]) -> TimelineStep:
        target = f"{_str(entry.get('mcp_id'))}.{_str(entry.get('tool'))}".strip(".")
        matched = bool(entry.get("matched"))
        rule = _str(entry.get("rule"))
        return TimelineStep(
            kind="rule",
            label=gettext("rule decision"),
            title=f"{rule} → {target}" if target else rule,
            status="ok" if matched else "skipped",
            status_text=gettext("matched") if matched else gettext("skipped"),
            note="" if matched else reason_text(_str(entry.get("reason"))),
        ).with_args(entry.get("params") if matched else None)

    def _call(self, entry: dict[str, Any], *, kind: str, label: str, key: str) -> TimelineStep:
        ok = bool(entry.get("ok"))
        step = TimelineStep(
            kind=kind,
            label=label,
            title=f"{_str(entry.get('mcp_id'))}.{_str(entry.get('tool'))}",
            result=_pretty(entry.get("value")) if ok else "",
            note="" if ok else _tool_data_shown(_str(entry.get("message"))),
        ).with_args(entry.get("args"))
        _call_step(step, self.pass_calls(key), ok_in_trace=ok, error=_str(entry.get("error")))
        fallback_for = _str(entry.get("fallback_for"))
        if ok and (fallback_for or entry.get("memo_hit")) and step.status == "ok":
            step.status = "degraded"
        if ok and fallback_for:
            step.note = gettext("from the fallback tool, because %(tool)s failed") % {"tool": fallback_for}
        if step.duration_ms is None:
            step.duration_ms = _number(entry.get("latency_ms"))
        return step

    def _deterministic_call(self, entry: dict[str, Any]) -> TimelineStep:
        """A rule's call, found by its rule (``rule:<id>``, the call id its audit events and its approval carry)."""
        key = f"rule:{_str(entry.get('rule_id'))}"
        step = self._call(entry, kind="deterministic", label=gettext("deterministic call"), key=key)
        self._with_approval(step, key)
        return step

    def _flow_call(self, entry: dict[str, Any]) -> TimelineStep:
        """A flow's call, found by its number (``flow:<n>``) as a model's call is by its id: its attempts from its
        audit events and, for a write, its approval. A flow runs again from its start once an approval is
        decided, its calls numbered the same way: a call's number then holds the attempts of every pass."""
        call_id = _str(entry.get("call_id"))
        step = self._call(entry, kind="flow", label=gettext("flow call"), key=call_id)
        approval = self._with_approval(step, call_id)
        if approval is not None and entry.get("error") == "approval:pending":
            # The call waited for the person (the flow stopped there): not a failure.
            step.status, step.status_text = "pending", gettext("pending")
        if call_id:  # which node made it, first: in a parallel run the steps of the branches' calls interleave
            made_by = " · ".join(p for p in (_flow_call_maker(call_id), f"{gettext('call id')}: {call_id}") if p)
            step.note = f"{made_by} · {step.note}" if step.note else made_by
        return step

    def _with_approval(self, step: TimelineStep, call_id: str) -> Approval | None:
        """The approval of the call ``call_id``, if it had one, noted on its step (its status, who decided and
        why); a write whose outcome is unknown reads so (``_outcome_unknown``)."""
        approval = self.by_call.get(call_id) if call_id else None
        if approval is None:
            return None
        self.shown.add(str(approval.pk))
        step.approval_id = str(approval.pk)
        step.note = gettext("approval: %(status)s") % {"status": approval.get_status_display()}
        if approval.decided_by:
            step.note += " · " + gettext("by %(who)s") % {"who": actor_in_words(approval.decided_by)}
        if approval.reason:
            step.note += f" · {_reason_shown(approval.reason)}"
        if approval.status == Approval.Status.OUTCOME_UNKNOWN:
            _outcome_unknown(step, approval)
        return approval

    def _approval(self, entry: dict[str, Any]) -> TimelineStep | None:
        approval = self.by_id.get(_str(entry.get("approval_id"))) or self.by_call.get(_str(entry.get("call_id")))
        if approval is not None:
            if str(approval.pk) in self.approval_steps:
                return None  # the events name an approval twice: its call, and what the run waits for
            self.shown.add(str(approval.pk))
            self.approval_steps.add(str(approval.pk))
        # Named as a call is (``server.tool``); an event of an approval no longer stored names it itself.
        named = ".".join(n for n in (_str(entry.get("mcp_id")), _str(entry.get("tool"))) if n)
        title = f"{approval.mcp_id}.{approval.tool}" if approval is not None else named
        args = entry.get("args") if "args" in entry else (approval.args if approval else None)
        return _approval_step(approval, label=gettext("approval requested"), title=title, args=args)

    def _system(self, entry: dict[str, Any]) -> TimelineStep:
        content = _text(entry.get("content", ""))
        return TimelineStep(kind="message", label=gettext("system message"), result=_tool_data_shown(content))

    def _human(self, entry: dict[str, Any]) -> TimelineStep:
        return TimelineStep(kind="message", label=gettext("user query"), result=_text(entry.get("content", "")))

    def _ai(self, entry: dict[str, Any]) -> TimelineStep:
        if entry.get("history"):
            return TimelineStep(
                kind="message",
                label=gettext("earlier answer in the conversation"),
                result=_text(entry.get("content", "")),
            )
        self.turns += 1
        wanted = []
        for call in _list(entry.get("tool_calls")):
            if isinstance(call, dict):
                wanted.append(f"→ {_str(call.get('name')) or '?'}({_str(call.get('args'))})")
            else:
                wanted.append(f"→ {_str(call)}")
        # The calls as the arguments' table shows them: a direction override in an argument written out, not
        # turning the line around.
        step = TimelineStep(
            kind="model",
            label=gettext("answer without a model (offline provider)")
            if self.offline_turn(entry)
            else gettext("model turn %(n)d") % {"n": self.turns},
            title=visible_text("\n".join(wanted)),
            result=_text(entry.get("content", "")),
        )
        if entry.get("guardrail"):
            step.status, step.status_text = "degraded", gettext("stopped by a guardrail")
            step.note = _str(entry.get("guardrail"))
        elif entry.get("unanswered"):
            # A call sent and never answered (``agents.engine``'s ``charge_unanswered``): an empty turn otherwise.
            step.status, step.status_text = "failed", gettext("no answer came back")
            step.note = (
                (
                    gettext("It timed out after its request was sent.")
                    if entry.get("unanswered") == "timeout"
                    else gettext("Its connection was cut after its request was sent.")
                    if entry.get("unanswered") == "connection"
                    # An error event in a stream that had begun (``agents.providers.stream_error_event``).
                    else gettext("Its answer had begun when the model server sent an error instead of the rest.")
                )
                + " "
                + gettext("It is charged an estimate: its input and the max_tokens it was given.")
            )
        elif entry.get("usage_estimated"):
            step.note = gettext("Its tokens are an estimate: the provider did not report them.")
        return step

    def _tool(self, entry: dict[str, Any]) -> TimelineStep:
        call_id = _str(entry.get("tool_call_id"))
        step = TimelineStep(kind="tool", label=gettext("tool call"), title=_str(entry.get("name")))
        failed = entry.get("status") == "error"
        content = _text(entry.get("content", ""))
        # A failure's message is the gate's, its details in a block; a result is the tool's own text, as it is, but
        # for the characters that do not show themselves, written out (a rejection's reason, a tool's output).
        # A success reached the model as data in a block (``gate.ToolResult.for_model``): shown here as the tool's
        # answer, as a rule's call is.
        step.result = visible_text(_tool_data_shown(content) if failed else _tool_answer_shown(content))
        events = self.pass_calls(call_id)
        if events and events[0].tool:
            # By the tool's own server and name, as a rule's call is titled (the model's name for it may be an
            # alias, ``tool_6c077b03`` for ``직원.검색``, or carry the agent's prefix): beside it where it differs.
            step.title = _offered_name({"name": step.title, "tool": events[0].tool, "mcp_id": events[0].mcp_id})
        if events and events[0].args:
            step.with_args(events[0].args)
        _call_step(step, events, ok_in_trace=False if failed else None, error=_str(entry.get("error")))
        self._with_approval(step, call_id)
        return step

    def _outcome(self, entry: dict[str, Any]) -> TimelineStep | None:
        errors = entry.get("tool_errors")
        if _str(entry.get("reason")) == self.error_code and not errors:
            return None  # the run's error, the last step, says it (a model's empty or cut-off answer, a fault)
        return TimelineStep(
            kind="outcome",
            label=gettext("outcome"),
            title=_code_in_words(_str(entry.get("reason"))),
            status="failed",
            note=", ".join(
                _code_in_words(_str(c)) for c in (errors if isinstance(errors, list) else [errors] if errors else [])
            ),
        )

    def _answer(self, entry: dict[str, Any]) -> None:
        return None  # the run's answer is the last step

    def _pass(self, entry: dict[str, Any]) -> TimelineStep | None:
        """Where a pass of the run begins (its first is no step): one taken over from a lost worker, or retried
        after an error a retry can fix, started again, so its model turns are counted again from where the pass
        cut short began. Only a lost worker makes the pass degraded: a retry is the run working as it should."""
        number = _number(entry.get("pass"))
        self.pass_now = int(number) if number is not None else None
        taken_over = bool(entry.get("taken_over"))
        retried = bool(entry.get("retried"))
        if taken_over or retried:
            self.turns = self.turns_before_pass
        self.turns_before_pass = self.turns
        if not (taken_over or retried) and (number is None or number <= 1):
            return None
        shown = "?" if number is None else f"{number:g}"
        if retried:
            return TimelineStep(
                kind="pass",
                label=gettext("pass %(n)s") % {"n": shown},
                status_text=gettext("retried after an error"),
                note=gettext(
                    "The pass before stopped at an error a retry can fix (the database or the message broker did "
                    "not answer); the run started again here from its last stored state."
                ),
            )
        if taken_over:
            return TimelineStep(
                kind="pass",
                label=gettext("pass %(n)s") % {"n": shown},
                status="degraded",
                status_text=gettext("taken over: the worker was lost"),
                note=gettext(
                    "The pass before was cut short when its worker was lost; the run started again here from its "
                    "last stored state."
                ),
            )
        return TimelineStep(
            kind="pass",
            label=gettext("pass %(n)s") % {"n": shown},
            status_text=gettext("resumed after the approval it waited for"),
        )

    def _tool_selection(self, entry: dict[str, Any]) -> TimelineStep:
        offered = []
        for tool in _list(entry.get("offered")):
            if not isinstance(tool, dict):
                offered.append(_str(tool))
                continue
            why = _str(tool.get("why"))
            score = _number(tool.get("score"))
            words = _WHY.get(why)
            if why == "ranked":
                because = str(words) % {"score": "?" if score is None else f"{score:g}"}
            else:
                because = str(words) if words is not None else why
            name = _offered_name(tool)
            offered.append(f"{name} ({because})" if because else name)
        turn = _number(entry.get("turn"))
        title = gettext("tools offered for turn %(turn)s: %(tools)s") % {
            "turn": "?" if turn is None else f"{turn:g}",
            "tools": ", ".join(offered) or gettext("none"),
        }
        ranker = _str(entry.get("ranker"))
        notes = []
        if ranker == "none":
            notes.append(gettext("every allowed tool offered (no ranking needed)"))
        elif ranker:
            words = dict(RANKER_CHOICES).get(ranker)  # the words the agent's page offers it by
            notes.append(gettext("ranker: %(ranker)s") % {"ranker": f"{words} ({ranker})" if words else ranker})
        fallback = _str(entry.get("fallback"))
        if fallback:
            notes.append(gettext("fell back: %(why)s") % {"why": _code_in_words(fallback)})
        candidates = _number(entry.get("candidates"))
        if candidates is not None:
            notes.append(gettext("%(n)s candidate tools") % {"n": f"{candidates:g}"})
        dropped = entry.get("forced_dropped")
        if isinstance(dropped, dict):
            why = str(_FORCED_DROPPED.get(_str(dropped.get("why")), _str(dropped.get("why"))))
            notes.append(
                gettext("could not force %(tool)s: %(why)s") % {"tool": _str(dropped.get("tool")) or "?", "why": why}
            )
        return TimelineStep(
            kind="selection",
            label=gettext("tool selection"),
            title=title,
            status="degraded" if fallback or isinstance(dropped, dict) else "",
            duration_ms=_number(entry.get("selection_ms")),
            note=" · ".join(notes),
        )

    def _parallel_calls(self, entry: dict[str, Any]) -> TimelineStep:
        calls = [c for c in _list(entry.get("calls")) if isinstance(c, dict)]
        starts = [s for c in calls if (s := _number(c.get("start_ms"))) is not None]
        ends = [e for c in calls if (e := _number(c.get("end_ms"))) is not None]
        names = ", ".join(_str(c.get("tool")) or "?" for c in calls)
        overlap = _number(entry.get("max_overlap"))
        span = f"{_ms(min(starts))}–{_ms(max(ends))} ms" if starts and ends else ""
        note = gettext("at most %(n)s at once") % {"n": "?" if overlap is None else f"{overlap:g}"}
        return TimelineStep(
            kind="parallel",
            label=gettext("ran in parallel"),
            title=names,
            note=f"{note}, {span}" if span else note,
        )

    def _tool_withdrawn(self, entry: dict[str, Any]) -> TimelineStep:
        count = _number(entry.get("corrections"))
        return TimelineStep(
            kind="withdrawn",
            label=gettext("tool withdrawn"),
            title=_str(entry.get("tool")),
            status="failed",
            status_text=gettext("withdrawn for the rest of the run after %(n)s calls with invalid arguments")
            % {"n": "?" if count is None else f"{count:g}"},
        )

    def _tool_left_out(self, entry: dict[str, Any]) -> TimelineStep:
        """A published version's tool not offered: its frozen contract no longer fits its server's arguments
        (``agents.engine.tools_left_out``), told in the reader's words."""
        return TimelineStep(
            kind="withdrawn",
            label=gettext("tool left out"),
            title=visible_text(_str(entry.get("tool"))),
            status="skipped",
            status_text=gettext("not offered"),
            note=gettext(
                "Tool %(tool)s of server %(server)s is left out: the contract %(version)s froze for it does not fit "
                "the arguments its server lists now. Fit the tool's contract and publish the agent again."
            )
            % {
                "tool": visible_text(_str(entry.get("tool"))),
                "server": visible_text(_str(entry.get("mcp_id"))),
                "version": _str(entry.get("version")) or "?",
            },
        )

    def _history_left_out(self, entry: dict[str, Any]) -> TimelineStep:
        """Earlier turns of the conversation the model was not given: with them its first call would not have
        fit the run's token reservation (``agents.engine._history_within_reservation``)."""
        turns, kept, ceiling = (_number(entry.get(k)) for k in ("turns", "kept", "token_ceiling"))
        return TimelineStep(
            kind="message",
            label=gettext("earlier turns left out"),
            status="skipped",
            status_text=gettext("%(n)s earlier turn(s) not given to the model") % {"n": _count(turns)},
            note=gettext(
                "The oldest turns of the conversation were left out so that the model's first call fits the run's "
                "token reservation (%(ceiling)s tokens); the newest %(kept)s turn(s) were given."
            )
            % {"ceiling": _count(ceiling), "kept": _count(kept)},
        )

    def _model_error(self, entry: dict[str, Any]) -> TimelineStep:
        attempts = _number(entry.get("attempts"))
        return TimelineStep(
            kind="model_error",
            label=gettext("model call failed"),
            title=_code_in_words(_str(entry.get("reason"))),
            status="failed",
            status_text=gettext("%(n)s attempt(s)") % {"n": "?" if attempts is None else f"{attempts:g}"},
        )

    def _prompt(self, entry: dict[str, Any]) -> TimelineStep:
        ok = bool(entry.get("ok"))
        delivered = _str(entry.get("delivered"))
        step = TimelineStep(
            kind="context",
            label=gettext("MCP prompt"),
            title=f"{_str(entry.get('mcp_id'))}/{_str(entry.get('name'))}",
        ).with_args(entry.get("arguments"))
        _call_step(step, self.calls.get("prompt", []), ok_in_trace=ok, error=_str(entry.get("error")))
        if ok:
            step.note = {
                "system": gettext("used as the system prompt"),
                "data": gettext("attached as data (it takes the caller's text, so never as instructions)"),
            }.get(delivered, gettext("it had no text: the agent's own system prompt stands"))
        else:
            step.note = _str(entry.get("message")) or gettext("the agent's own system prompt stands")
        return step

    def _resource(self, entry: dict[str, Any]) -> TimelineStep:
        ok = bool(entry.get("ok"))
        step = TimelineStep(
            kind="context",
            label=gettext("MCP resource read"),
            title=f"{_str(entry.get('mcp_id'))} {_str(entry.get('uri'))}".strip(),
        )
        uri = _str(entry.get("uri"))
        events = [e for events in self.calls.values() for e in events if e.action == "resource.read" and e.tool == uri]
        _call_step(step, events[-1:] if ok else events, ok_in_trace=ok, error=_str(entry.get("error")))
        if not ok:
            step.status, step.status_text = "failed", _failed_text(_str(entry.get("error")))
        chars = _number(entry.get("chars"))
        if ok and chars is not None:
            step.note = gettext("%(n)s characters attached as data") % {"n": f"{chars:,.0f}"}
        elif not ok:
            step.note = gettext("left out of the model's context")
        return step

    def _resource_tool(self, entry: dict[str, Any]) -> TimelineStep:
        offered = entry.get("offered") is not False
        error = _str(entry.get("error"))
        step = TimelineStep(kind="context", label=gettext("read_resource tool"))
        if offered:
            step.status, step.status_text = "ok", gettext("offered")
            return step
        step.status, step.status_text = "skipped", gettext("not offered")
        if error == "config:tool_name_conflict":
            step.note = gettext(
                "The server %(server)s has a tool of that name; set a tool name prefix on that server."
            ) % {"server": _str(entry.get("mcp_id")) or "?"}
        else:
            step.note = _code_in_words(error) if error else _str(entry.get("message"))
        return step

    def _flow_node(self, entry: dict[str, Any]) -> TimelineStep:
        updated = [_str(k) for k in _list(entry.get("updated"))]
        return TimelineStep(
            kind="flow",
            label=gettext("flow node"),
            title=_str(entry.get("node")),
            status="ok",
            note=gettext("updated: %(keys)s") % {"keys": ", ".join(updated)} if updated else gettext("updated nothing"),
        )


_HANDLED = frozenset(
    {
        "rule",
        "deterministic_call",
        "flow_call",
        "approval",
        "system",
        "human",
        "ai",
        "tool",
        "outcome",
        "answer",
        "tool_selection",
        "parallel_calls",
        "tool_withdrawn",
        "tool_left_out",
        "history_left_out",
        "model_error",
        "prompt",
        "resource",
        "resource_tool",
        "flow_node",
        "pass",
    }
)


def run_timeline(run: Run, *, secrets: Iterable[str] | None = None) -> list[TimelineStep]:
    """A run's steps in order: rule decisions, deterministic calls (with their attempts), the MCP prompt and
    resources, each turn's tool selection, the model's turns, its tool calls (with their attempts and approvals),
    approvals, and the answer (or error) last. Built from the stored trace, or from the run's events while it
    runs, where it ran in several passes or ended without its steps stored (``_trace_entries``); never fails on
    an odd stored shape.

    Every step is shown masked again with ``secrets`` (default: those bound now, ``shown_secrets``): what the
    steps quote (the trace, the events, the audit events, the approvals) was masked when it was recorded, with
    the secrets known then."""
    known = list(shown_secrets() if secrets is None else secrets)
    return [_step_shown(step, known) for step in _steps(run, known)]


def _steps(run: Run, secrets: list[str]) -> list[TimelineStep]:
    timeline = _Timeline(run, secrets)
    entries = _trace_entries(run)
    call_of_approval = {str(a.pk): a.call_id for a in timeline.approvals if a.call_id}
    readable = [e for e in entries if isinstance(e, dict)]
    ordered: list[Any] = _in_order(readable, call_of_approval) if len(readable) == len(entries) else entries
    steps = [step for entry in ordered if (step := timeline.step(entry)) is not None]
    for approval in timeline.approvals:
        if str(approval.pk) not in timeline.shown:
            steps.append(
                _approval_step(
                    approval,
                    label=gettext("approval"),
                    title=f"{approval.mcp_id}.{approval.tool}",
                    args=approval.args,
                )
            )
    total = _number(_dict(run.timings).get("total_ms"))
    if run.error_code:
        steps.append(
            TimelineStep(
                kind="error",
                label=gettext("error"),
                title=_code_in_words(run.error_code),
                status="failed",
                status_text=run.get_status_display(),
                duration_ms=total,
                result=error_message_text(run.error_code, run.error_message),
            )
        )
    elif run.answer:
        steps.append(
            TimelineStep(
                kind="answer",
                label=gettext("answer"),
                status="ok",
                status_text=run.get_status_display(),
                duration_ms=total,
                result=run.answer,
            )
        )
    else:
        steps.append(
            TimelineStep(kind="status", label=gettext("status"), status="pending", status_text=run.get_status_display())
        )
    return steps


def _rules_tools_ms(run: Run) -> float | None:
    """The time the deterministic stage's tool calls took (each ``deterministic_call`` entry's, in the stored
    trace): a part of the stage's time. None where none was recorded (a run the rules answered without a call)."""
    stored = run.messages if isinstance(run.messages, list) else []
    timed = [
        n
        for e in stored
        if isinstance(e, dict)
        and e.get("type") == "deterministic_call"
        and (n := _number(e.get("latency_ms"))) is not None
    ]
    return sum(timed) if timed else None


def _loop_tools_ms(run: Run, timings: dict[str, Any]) -> float | None:
    """The time the model's (a flow's) tool calls took (``tools_ms``). None where no time was recorded, or no such
    call was made: no "tools 0 ms"."""
    recorded = _number(timings.get("tools_ms"))
    if recorded is None:
        return None
    stored = run.messages if isinstance(run.messages, list) else []
    called = any(isinstance(e, dict) and e.get("type") in ("tool", "flow_call") for e in stored)
    return recorded if recorded > 0 or called else None


def run_provider_is_offline(run: Run) -> bool:
    """Whether the run was answered by the offline provider, which is no model: the provider is the run's
    version's (its frozen content), or the agent's where it ran the draft, as the worker reads it."""
    if run.version_id is not None:
        provider = _dict(_dict(run.version.content).get("agent")).get("model_provider")
    else:
        provider = run.agent.model_provider if run.agent_id is not None else None
    return bool(provider == Agent.Provider.OFFLINE)


def run_summary(run: Run) -> list[str]:
    """What the run's summary line says besides its status: its time (in all, and in its deterministic stage, of
    which its tool calls, its model turns and the model's tool calls: the parts never count a time twice; a flow's
    run, which runs neither the stage nor a model, in its flow, of which its tool calls), its tokens (input,
    output, cache), its model calls (and those rules saved) and its cost. The offline provider's turn is said to be
    what it is, an answer made without a model. Only what was recorded; an odd stored shape is left out."""
    parts: list[str] = []
    timings = _dict(run.timings)
    offline = run_provider_is_offline(run)
    total = _number(timings.get("total_ms"))
    if total is not None:
        parts.append(gettext("%(ms)s ms in all") % {"ms": _ms(total)})
    deterministic = ""
    if _number(timings.get("deterministic_ms")) is not None:
        deterministic = gettext("deterministic %(ms)s ms") % {"ms": _ms(timings["deterministic_ms"])}
        if (rules_tools := _rules_tools_ms(run)) is not None:
            deterministic += " " + gettext("(its tool calls %(ms)s ms)") % {"ms": _ms(rules_tools)}
    model = ""
    if _number(timings.get("model_ms")) is not None:
        model = (gettext("answer without a model %(ms)s ms") if offline else gettext("model %(ms)s ms")) % {
            "ms": _ms(timings["model_ms"])
        }
    tools_ms = _loop_tools_ms(run, timings)
    tools = gettext("tools %(ms)s ms") % {"ms": _ms(tools_ms)} if tools_ms is not None else ""
    split = [deterministic, model, tools]
    if _number(timings.get("flow_ms")) is not None:
        # A flow's run runs neither the deterministic stage nor a model: its flow's time, of which its tool calls.
        flow = gettext("flow %(ms)s ms") % {"ms": _ms(timings["flow_ms"])}
        if tools_ms is not None:
            flow += " " + gettext("(its tool calls %(ms)s ms)") % {"ms": _ms(tools_ms)}
        split = [flow]
    if any(split):
        parts.append(" · ".join(s for s in split if s))
    usage = _dict(run.token_usage)

    def tokens(key: str) -> str:
        number = _number(usage.get(key))
        return "" if number is None else f"{number:,.0f}"

    if any((_number(usage.get(key)) or 0) > 0 for key in ("input_tokens", "output_tokens")):
        text = gettext("tokens: %(input)s in, %(output)s out") % {
            "input": tokens("input_tokens") or "0",
            "output": tokens("output_tokens") or "0",
        }
        if tokens("cache_read_tokens"):
            text += ", " + gettext("%(n)s read from the cache") % {"n": tokens("cache_read_tokens")}
        if tokens("cache_creation_tokens"):
            text += ", " + gettext("%(n)s written to the cache") % {"n": tokens("cache_creation_tokens")}
        parts.append(text)
    if tokens("model_calls") and not offline:
        text = gettext("model calls: %(n)s") % {"n": tokens("model_calls")}
        if tokens("model_calls_saved") and tokens("model_calls_saved") != "0":
            text += " " + gettext("(%(n)s saved by rules)") % {"n": tokens("model_calls_saved")}
        parts.append(text)
    elif tokens("model_calls_saved") and tokens("model_calls_saved") != "0":
        parts.append(gettext("no model call (%(n)s saved by rules)") % {"n": tokens("model_calls_saved")})
    if run.cost_micros:
        parts.append(gettext("cost: US$%(usd)s") % {"usd": usd_text(run.cost_micros)})
    statuses = list(run.events.filter(kind="status").order_by("seq").values_list("data", flat=True))
    taken_over = _pass_starts(statuses).count("taken_over")  # a pass retried after an error is no takeover
    if taken_over:  # the timeline marks where each pass began; the summary says how often a worker was lost
        parts.append(gettext("taken over %(n)s time(s): a worker was lost") % {"n": taken_over})
    return parts


def _offered_name(tool: dict[str, Any]) -> str:
    """A tool of a selection entry by its server and own name (``hr.직원.검색``), the alias the model was offered
    it by beside it where that differs (``as tool_6c077b03``); an entry written before they were kept, by the name
    the model saw."""
    name, own = _str(tool.get("name")), _str(tool.get("tool"))
    if not own:
        return name
    real = ".".join(n for n in (_str(tool.get("mcp_id")), own) if n)
    return real if own == name else gettext("%(tool)s as %(alias)s") % {"tool": real, "alias": name}


def _code_in_words(code: str) -> str:
    """An error code in the reader's words, the code beside them (``every deterministic call failed
    (deterministic:tool_failed)``); the code alone where no words are known."""
    words = reason_label(code)
    return code if words == code else f"{words} ({code})"


def _pending_detail(approval: Approval) -> str:
    """A pending approval's masked arguments (cut to 60 characters) and short id: what tells it apart from
    another pending call of the same tool."""
    args = visible_text(json.dumps(approval.args, ensure_ascii=False)) if approval.args else ""
    short = str(approval.pk)[:8]
    if len(args) > 60:
        args = args[:59] + "…"
    return f"{args} · {short}" if args else short


def _past_expiry(approval: Approval) -> bool:
    return approval.expires_at is not None and approval.expires_at <= timezone.now()


def _approval_shown(approval: Approval) -> Approval:
    """``approval`` as people are shown it (``_status_shown``): one pending past its expiry, which the periodic
    expiry has not reached yet, is a copy that reads expired (its page's title, its step on the run's timeline);
    the stored row is left as it is."""
    if _status_shown(approval) == approval.status:
        return approval
    shown = copy.copy(approval)
    shown.status = _status_shown(approval)
    return shown


def secrets_shown(request: HttpRequest) -> list[str]:
    """The secrets the configuration binds now (``agents.config_cache.shown_secrets``: held by the process while
    the configuration's generation holds, not decrypted again per page), read once per request: what
    these pages mask a run's recorded texts with again as they show them. A run's records (its question, trace,
    events, answer; its audit events and approvals) were masked with the secrets known when they were written, and
    a value bound as a secret after (a token a user typed into a query, then gave a server) is in none of them."""
    secrets: list[str] | None = getattr(request, "_secrets_shown", None)
    if secrets is None:
        secrets = shown_secrets()
        request._secrets_shown = secrets  # type: ignore[attr-defined]
    return secrets


# A run's fields that hold what a caller, a model or a tool said (or a server's id): shown masked again.
_RUN_RECORDED = (
    "query",
    "context",
    "a2a_data",
    "a2a_files",
    "answer",
    "error_message",
    "deterministic_results",
    "messages",
    "conversation",
    "idempotency_key",
    "write_sandbox",
    "feedback_comment",
)
# An approval's: the call (its server, tool, id and arguments), what it gave, who asked and decided, and why.
_APPROVAL_RECORDED = ("mcp_id", "tool", "call_id", "args", "result", "requested_by", "decided_by", "reason")


def _masked_in_place(obj: Any, names: Iterable[str], secrets: Iterable[str]) -> None:
    """``obj``'s fields ``names`` masked again with ``secrets`` (``mask_known``), on the object loaded to be shown:
    the caller never saves it."""
    for name in names:
        value = getattr(obj, name)
        shown = mask_known(value, secrets=secrets)
        if shown != value:
            setattr(obj, name, shown)


def _run_masked(run: Run, secrets: Iterable[str]) -> Run:
    """A copy of ``run`` as its pages show it: its recorded texts masked again (``_masked_in_place``). A copy,
    so that nothing that reads the run for a write (a cancel, which reads it again by its id) ever holds it."""
    shown = copy.copy(run)
    _masked_in_place(shown, _RUN_RECORDED, secrets)
    return shown


def _approval_masked(approval: Approval, secrets: Iterable[str]) -> Approval:
    """A copy of ``approval`` as its pages show it: its call, arguments, result, actors and reason masked again.
    A decision is taken by the approval's id (``approval_decide`` reads it again), never from this copy."""
    shown = copy.copy(approval)
    _masked_in_place(shown, _APPROVAL_RECORDED, secrets)
    return shown


def _events_url(admin_site: admin.AdminSite, run_id: Any) -> str:
    return f"{reverse('admin:audit_auditevent_changelist', current_app=admin_site.name)}?run={run_id}"


def _resume_point(request: HttpRequest) -> int:
    """Where a stream resumes: ``Last-Event-ID`` (an EventSource reconnecting), ``?after=``, or the start."""
    for raw in (request.headers.get("Last-Event-ID"), request.GET.get("after")):
        if raw and raw.strip().isdigit() and raw.strip().isascii() and len(raw.strip()) <= 18:
            return int(raw.strip())
    return 0


def _session_still_views_runs(model_admin: admin.ModelAdmin[Any], *, session_key: str | None, user_id: Any) -> bool:
    """Whether the admin session a run's stream was opened with would still be let in to the run's page: the
    session still exists (not signed out, not expired) and still names the user; its password hash still
    matches the user's (as ``django.contrib.auth.get_user`` checks it, fallback keys included: a password
    changed elsewhere signs this session out); the user is still active staff; and the page's own rule
    (``has_view_permission``: may view or change runs) still lets them in.

    Only reads: unlike ``get_user`` it neither flushes a session that fails nor rotates a fallback-key one (the
    next page the session asks for does that). A session whose key was cycled (a password changed on this
    session's own page) is a new session: this stream ends and the page's ``EventSource`` reconnects with it."""
    if not session_key:
        return False
    session = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    try:
        names_the_user = get_user_model()._meta.pk.to_python(session.get(SESSION_KEY)) == user_id
    except ValidationError:
        return False
    user = get_user_model()._default_manager.filter(pk=user_id).first() if names_the_user else None
    stored_hash = session.get(HASH_SESSION_KEY)
    if user is None or not isinstance(stored_hash, str) or not stored_hash:
        return False
    hashes = [user.get_session_auth_hash(), *user.get_session_auth_fallback_hash()]
    if not any(constant_time_compare(stored_hash, expected) for expected in hashes):
        return False
    probe = HttpRequest()
    probe.user = user
    return model_admin.admin_site.has_permission(probe) and model_admin.has_view_permission(probe)


def _whole_number(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _local_date(value: Any) -> dt.date | None:
    """A date-time as the date it is in the current time zone (where the drill-down's filter reads it)."""
    if isinstance(value, dt.datetime):
        return (timezone.localtime(value) if timezone.is_aware(value) else value).date()
    return value  # type: ignore[no-any-return]


class _DrillDownRows(QuerySet[Any]):
    """A change list's rows as Django's date drill-down (``{% date_hierarchy %}``) reads them: it asks this
    queryset for the first and last date (``aggregate(first=Min, last=Max)``) and for the distinct years,
    months or days (``datetimes``/``dates``), which the database answers by truncating every row's date (on
    SQLite a Python call per row: 1.2 s a page at 200,000 audit events). Here both are answered from the first
    and last date of ``drill_table`` (the rows the list shows, its filters applied), two ordered reads of one row
    each off the date's index: the links are every year, month or day between them, without asking which hold
    rows (one that holds none opens an empty list). Any other call is a plain queryset's."""

    drill_field = ""
    drill_table: QuerySet[Any] | None = None
    # The year and the month the list is drilled into, where it is.
    drill_year: int | None = None
    drill_month: int | None = None

    @cached_property
    def drill_ends(self) -> tuple[Any, Any]:
        if self.drill_table is None:
            return None, None
        dates = self.drill_table.values_list(self.drill_field, flat=True)
        return dates.order_by(self.drill_field).first(), dates.order_by(f"-{self.drill_field}").first()

    def _drills(self, field_name: str, kind: str) -> bool:
        return self.drill_table is not None and field_name == self.drill_field and kind in ("year", "month", "day")

    def aggregate(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        first, last = kwargs.get("first"), kwargs.get("last")
        drill_down = (
            not args
            and len(kwargs) == 2
            and isinstance(first, Min)
            and isinstance(last, Max)
            and all(getattr(e.get_source_expressions()[0], "name", None) == self.drill_field for e in (first, last))
        )
        if not drill_down or self.drill_table is None:
            return super().aggregate(*args, **kwargs)
        return dict(zip(("first", "last"), self.drill_ends, strict=True))

    def datetimes(self, field_name: str, kind: str, order: str = "ASC", tzinfo: Any = None) -> Any:
        if not self._drills(field_name, kind):
            return super().datetimes(field_name, kind, order, tzinfo)  # type: ignore[arg-type]
        return self._drill_dates(kind)

    def dates(self, field_name: str, kind: str, order: str = "ASC") -> Any:
        if not self._drills(field_name, kind):
            return super().dates(field_name, kind, order)  # type: ignore[arg-type]
        return self._drill_dates(kind)

    def _drill_dates(self, kind: str) -> list[dt.date]:
        """Each year, month or day (as its first date) from the first row's to the last row's; the months of
        the year drilled into, the days of the month (that of all the rows where they are all in one: Django
        starts the drill-down there)."""
        first, last = (_local_date(end) for end in self.drill_ends)
        if first is None or last is None:
            return []
        if kind == "year":
            return [dt.date(year, 1, 1) for year in range(first.year, last.year + 1)]
        year = self.drill_year or first.year
        if kind == "month":
            # Months counted from year 0, so that a range crosses years.
            low, high = (
                max(first.year * 12 + first.month, year * 12 + 1),
                min(last.year * 12 + last.month, year * 12 + 12),
            )
            return [dt.date(year, month - year * 12, 1) for month in range(low, high + 1)]
        month = self.drill_month or first.month
        if not 1 <= month <= 12:
            return []
        month_start = dt.date(year, month, 1)
        month_end = month_start.replace(day=calendar.monthrange(year, month)[1])
        start, end = max(first, month_start), min(last, month_end)
        return [start + dt.timedelta(days=n) for n in range((end - start).days + 1)]


class DateDrillDownChangeList(ChangeList):
    """A change list whose date drill-down reads two rows, not the whole table (``_DrillDownRows``); the
    drill-down's filter itself (a range of the date) is Django's. For an admin with ``date_hierarchy`` over a
    large table (runs, audit events): its ``get_changelist``."""

    def get_filters(self, request: HttpRequest) -> tuple[list[ListFilter], bool, dict[str, bool | str], bool, bool]:
        try:
            return super().get_filters(request)
        except ValueError as exc:
            year = _whole_number(self.params.get(f"{self.date_hierarchy}__year")) if self.date_hierarchy else None
            if year != dt.MAXYEAR:
                raise
            # Django bounds a drilled-down year by the next one (``replace(year=year + 1)``): after 9999 there is
            # none, and the ValueError was a server error. A filter out of range, answered as one (the list without
            # its filters, and why: agent_platform/admin_filters.py), as a month or day past the last one is.
            raise OverflowError(str(exc)) from exc

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        if not self.date_hierarchy:
            return
        # The rows are read (the page's, its count); what reads ``queryset`` after them is the drill-down.
        rows = _DrillDownRows(model=self.model, query=self.queryset.query.chain(), using=self.queryset.db)
        rows.drill_field, rows.drill_table = self.date_hierarchy, self.queryset  # the rows the list shows
        rows.drill_year = _whole_number(self.params.get(f"{self.date_hierarchy}__year"))
        rows.drill_month = _whole_number(self.params.get(f"{self.date_hierarchy}__month"))
        self.queryset = rows


def may_view(admin_site: admin.AdminSite, request: HttpRequest, model: type[Any]) -> bool:
    """Whether the admin of ``model`` lets this user in (none registered: no). A run's page links its approvals and
    its shadow comparison, and an approval's page shows its run's timeline (its query, answer, tool calls and their
    results), only to whoever may view them."""
    try:
        return bool(admin_site.get_model_admin(model).has_view_permission(request))
    except NotRegistered:
        return False


class RunArmFilter(admin.SimpleListFilter):
    """The runs of one A/B arm (``Run.arm``, by its name; an arm's name stays on its runs after the arm is
    deleted): the arms any run ran under, read by the column's index. Not the field's own filter, which listed
    the runs under no arm ("") as an empty entry."""

    title = Run._meta.get_field("arm").verbose_name
    parameter_name = "arm"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[Any, str]]:
        arms = Run.objects.filter(arm__gt="").order_by("arm").values_list("arm", flat=True).distinct()
        return [(arm, visible_text(arm)) for arm in arms]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Run]) -> QuerySet[Run]:
        value = self.value()
        return queryset if value is None else queryset.filter(arm=value)


@admin.register(Run)
class RunAdmin(ReadOnlyAdminMixin, WritesRefusedMixin, admin.ModelAdmin):
    """Runs are read-only here (no add, change or delete for anyone); an admin may cancel one that has not
    finished."""

    change_form_template = "admin/agents/run/change_form.html"
    # Beside the menu and the filters at 1,400 px: the start's date above its time, the error code under the status.
    list_display = ["created", "agent", "status_badge", "short_query", "tool_failures", "total_ms"]
    list_display_links = ["created"]
    list_filter = ["status", "purpose", "agent", RunArmFilter]
    search_fields = ["id", "query", "answer"]
    date_hierarchy = "created_at"  # from the ends of the created_at index (DateDrillDownChangeList)
    # The error message in the reader's language, as the timeline says it (``error_message_shown``), not as stored.
    readonly_fields = [
        "error_message_shown" if f.name == "error_message" else f.name
        for f in Run._meta.fields
        if f.name not in ("messages", "conversation")
    ] + ["trace_json"]
    fieldsets = [(_("Raw data"), {"classes": ["collapse"], "fields": list(readonly_fields)})]

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return DateDrillDownChangeList

    def get_changelist_instance(self, request: HttpRequest) -> ChangeList:
        """The list's page of runs, their questions masked again as a run's page masks them (``secrets_shown``:
        read once for the page). The rows are never saved."""
        changelist = super().get_changelist_instance(request)
        secrets = secrets_shown(request)
        for run in changelist.result_list:
            _masked_in_place(run, ("query",), secrets)
        return changelist

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None) -> Run | None:
        """The run as its pages show it (the timeline, the raw fields): ``_run_masked``, with the secrets bound
        now."""
        run = super().get_object(request, object_id, from_field)
        return None if run is None else _run_masked(run, secrets_shown(request))

    def may_cancel(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("agents.change_run"))

    @admin.display(description=_("created"), ordering="created_at")
    def created(self, obj: Run) -> str:
        return when_cell(obj.created_at)

    @admin.display(description=_("status"), ordering="status")
    def status_badge(self, obj: Run) -> str:
        badge = format_html('<span class="run-status run-status-{}">{}</span>', obj.status, obj.get_status_display())
        if not obj.error_code:
            return badge
        return format_html(
            '{}<code class="cell-code" title="{}">{}</code>',
            badge,
            reason_label(obj.error_code),
            breakable(obj.error_code),
        )

    @admin.display(description=_("query"))
    def short_query(self, obj: Run) -> str:
        return obj.query[:80]

    @admin.display(description=_("total (ms)"))
    def total_ms(self, obj: Run) -> Any:
        total = _number(_dict(obj.timings).get("total_ms"))
        return "—" if total is None else f"{total:,.1f}"

    @admin.display(description=Run._meta.get_field("error_message").verbose_name)
    def error_message_shown(self, obj: Run) -> str:
        return error_message_text(obj.error_code, obj.error_message)

    @admin.display(description=_("trace (raw)"))
    def trace_json(self, obj: Run) -> str:
        """The stored trace as JSON, each character that does not show itself written out (still JSON)."""
        return format_html('<pre style="white-space:pre-wrap">{}</pre>', visible_text(_pretty(obj.messages)))

    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        return [
            path("<path:object_id>/cancel/", wrap(self.cancel_view), name="agents_run_cancel"),
            path("<path:object_id>/timeline/", wrap(self.timeline_view), name="agents_run_timeline"),
            path("<path:object_id>/events/", wrap(self.events_view), name="agents_run_events"),
            *super().get_urls(),
        ]

    def _run_or_404(self, request: HttpRequest, object_id: str) -> Run:
        if not self.has_view_permission(request):
            raise PermissionDenied
        run = self.get_object(request, object_id)
        if run is None:
            raise Http404(gettext("Run not found."))
        return run

    def timeline_context(self, request: HttpRequest, run: Run) -> dict[str, Any]:
        name = self.admin_site.name
        secrets = secrets_shown(request)
        timeline = run_timeline(run, secrets=secrets)
        may_view_approvals = may_view(self.admin_site, request, Approval)
        if may_view_approvals:  # a decided approval is reached from its step, as a pending one from the bar above
            for step in timeline:
                if step.approval_id:
                    step.url = reverse("admin:agents_approval_change", args=[step.approval_id], current_app=name)
        pending = [_approval_masked(a, secrets) for a in approvals_waiting(run)]
        calls = [f"{a.mcp_id}.{a.tool}" for a in pending]
        return {
            "run": run,
            "timeline": timeline,
            "summary": run_summary(run),
            "version_text": gettext("version %(number)s") % {"number": f"v{run.version.number}"}
            if run.version is not None
            else gettext("the agent's draft (no published version)"),
            # The A/B arm that chose the version for this caller (``agents.services.run_version_choice``).
            "arm_text": gettext("arm %(name)s") % {"name": visible_text(run.arm)} if run.arm else "",
            "related_runs": self._related_runs(request, run),
            # A run cancelled while its worker held it is followed until the worker records its end (the call under
            # way, perhaps an approved write, and its last status): the page stopped following it at the cancel.
            "finished": run_seen_finished(run),
            "may_cancel": self.may_cancel(request) and run.status in CANCELLABLE,
            "cancel_url": reverse("admin:agents_run_cancel", args=[run.pk], current_app=name),
            "timeline_url": reverse("admin:agents_run_timeline", args=[run.pk], current_app=name),
            "events_stream_url": reverse("admin:agents_run_events", args=[run.pk], current_app=name),
            # Linked only for whoever the audit list lets in (a reviewer views runs, not their audit events).
            "audit_events_url": _events_url(self.admin_site, run.pk)
            if may_view(self.admin_site, request, AuditEvent)
            else "",
            "pending_approvals": [
                {
                    "approval": a,
                    "call": call,
                    # Several pending calls of one tool are told apart by their (masked) arguments and short id.
                    "detail": _pending_detail(a) if calls.count(call) > 1 else "",
                    "url": reverse("admin:agents_approval_change", args=[a.pk], current_app=name)
                    if may_view_approvals
                    else "",
                }
                for a, call in zip(pending, calls, strict=True)
            ],
        }

    def _related_runs(self, request: HttpRequest, run: Run) -> list[dict[str, str]]:
        """The runs a shadow run is tied to, each way (its live run; a live run's shadows), and their comparison
        where one was made and the reader may view it: a shadow's page looks like its live twin's otherwise."""
        name = self.admin_site.name

        def run_link(label: str, run_id: Any) -> dict[str, str]:
            url = reverse("admin:agents_run_change", args=[run_id], current_app=name)
            return {"label": label, "url": url, "text": str(run_id)[:8]}

        links = []
        if run.shadow_of_id is not None:
            links.append(run_link(gettext("shadow of"), run.shadow_of_id))
        links += [
            run_link(gettext("shadow run"), pk)
            for pk in run.shadows.order_by("created_at").values_list("pk", flat=True)
        ]
        comparison = ShadowComparison.objects.filter(Q(live_run=run) | Q(shadow_run=run)).first()
        if comparison is not None and may_view(self.admin_site, request, ShadowComparison):
            links.append(
                {
                    "label": gettext("shadow comparison"),
                    "url": reverse("admin:agents_shadowcomparison_change", args=[comparison.pk], current_app=name),
                    "text": gettext("agrees") if comparison.agrees else gettext("differs"),
                }
            )
        return links

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        run = self.get_object(request, object_id)
        extra = dict(extra_context or {})
        if run is not None and self.has_view_permission(request, run):
            extra.update(self.timeline_context(request, run))
        return super().change_view(request, object_id, form_url, extra)

    def timeline_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """The timeline alone, as the run page shows it: what the live page fetches after each event."""
        run = self._run_or_404(request, object_id)
        return TemplateResponse(request, "admin/agents/run/timeline.html", self.timeline_context(request, run))

    def events_view(self, request: HttpRequest, object_id: str) -> HttpResponseBase:
        """The run's event stream (server-sent events) for someone logged in to the admin who may view runs; it
        re-checks at intervals that their session is still signed in and that they still may (an
        ``event: error`` ends it otherwise), and closes when the run has finished."""
        run = self._run_or_404(request, object_id)
        user_id, session_key = request.user.pk, request.session.session_key
        feed = RunEventFeed(
            run_id=run.pk,
            after=_resume_point(request),
            poll_s=float(api_setting("PLATFORM_SSE_POLL_S")),
            keepalive_s=float(api_setting("PLATFORM_SSE_KEEPALIVE_S")),
            max_s=float(api_setting("PLATFORM_SSE_MAX_S")),
            still_authorized=lambda: _session_still_views_runs(self, session_key=session_key, user_id=user_id),
            auth_recheck_s=min(15.0, float(api_setting("PLATFORM_SSE_AUTH_RECHECK_S"))),
            language=translation.get_language(),
            revoked_message=gettext(
                "Your admin session has ended, or you may no longer view runs; the stream is closed."
            ),
        )
        no_slot = StreamSlot(cache_key="", token="")  # streams per API key are capped; a session has none
        stream = stream_async(feed, no_slot) if isinstance(request, ASGIRequest) else stream_sync(feed, no_slot)
        response = StreamingHttpResponse(stream, content_type="text/event-stream; charset=utf-8")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"
        return response

    def cancel_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        run = self._run_or_404(request, object_id)
        if request.method != "POST":  # a copied address: the run's page, where its Cancel button is (it said 403)
            return HttpResponseRedirect(
                reverse("admin:agents_run_change", args=[run.pk], current_app=self.admin_site.name)
            )
        if not self.may_cancel(request):
            raise PermissionDenied
        try:
            run_cancel(run=run, actor=f"admin:{request.user.get_username()}")
            self.message_user(request, gettext("The run was cancelled."), messages.SUCCESS)
        except ApplicationError as exc:
            self.message_user(request, exc.message, messages.WARNING)
        return HttpResponseRedirect(reverse("admin:agents_run_change", args=[run.pk], current_app=self.admin_site.name))


def _status_shown(approval: Approval) -> str:
    """An approval's status as people are shown it: one pending past its expiry, which the periodic expiry has not
    reached yet, is expired (a decision would be refused as expired)."""
    if approval.status == Approval.Status.PENDING and _past_expiry(approval):
        return Approval.Status.EXPIRED
    return approval.status


class ApprovalStatusFilter(admin.SimpleListFilter):
    """The approvals by their status as the list shows it (``_status_shown``): "pending" leaves out those past their
    expiry, "expired" takes them in. Its parameter is the field's own, which the dashboard's link uses."""

    title = Approval._meta.get_field("status").verbose_name
    parameter_name = "status__exact"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[Any, str]]:
        return list(Approval.Status.choices)

    def queryset(self, request: HttpRequest, queryset: QuerySet[Approval]) -> QuerySet[Approval]:
        value, now = self.value(), timezone.now()
        if value is None:
            return queryset
        if value == Approval.Status.PENDING:
            return queryset.filter(status=value, expires_at__gt=now)
        if value == Approval.Status.EXPIRED:
            return queryset.filter(Q(status=value) | Q(status=Approval.Status.PENDING, expires_at__lte=now))
        return queryset.filter(status=value)


class ShownValuesFilter(admin.AllValuesFieldListFilter):
    """A field's recorded values to choose from, less those that hold a secret bound since they were recorded
    (``secrets_shown``): the rows show them masked, and a choice's words and link would carry them in clear."""

    def __init__(
        self, field: Any, request: HttpRequest, params: Any, model: Any, model_admin: Any, field_path: str
    ) -> None:
        super().__init__(field, request, params, model, model_admin, field_path)
        secrets = secrets_shown(request)
        self.lookup_choices = [v for v in self.lookup_choices if mask_known(v, secrets=secrets) == v]


@admin.register(Approval)
class ApprovalAdmin(WritesRefusedMixin, admin.ModelAdmin):
    """Approvals, pending first (oldest first among them: closest to expiring), with their masked arguments. A
    decision is taken on the approval's page: Approve, or Reject with a reason, each confirmed on a page of its
    own; nobody edits or deletes an approval."""

    change_form_template = "admin/agents/approval/change_form.html"
    # When a pending one expires right after its status: in view without scrolling on a narrow screen.
    list_display = [
        "created_at",
        "status_badge",
        "expires",
        "call",
        "masked_args",
        "run_link",
        "requested_by_words",
        "decided_by_words",
        "reason_text",
    ]
    list_display_links = ["created_at"]
    list_filter = [ApprovalStatusFilter, ("mcp_id", ShownValuesFilter), ("tool", ShownValuesFilter)]
    search_fields = ["tool", "run__id"]
    # The masked arguments are shown by ``shown_args`` (characters that do not show themselves written out); the
    # exact ones are never shown.
    readonly_fields = [
        {
            "args": "shown_args",
            "reason": "reason_text",
            "requested_by": "requested_by_words",
            "decided_by": "decided_by_words",
        }.get(f.name, f.name)
        for f in Approval._meta.fields
        if f.name != "exact_args"
    ]
    exclude = ["args", "exact_args", "reason"]
    list_select_related = ["run__agent"]

    @admin.display(description=_("requested by"), ordering="requested_by")
    def requested_by_words(self, obj: Approval) -> str:
        return actor_in_words(obj.requested_by)

    @admin.display(description=_("decided by"), ordering="decided_by")
    def decided_by_words(self, obj: Approval) -> str:
        return actor_in_words(obj.decided_by)

    @admin.display(description=_("arguments (masked)"))
    def shown_args(self, obj: Approval) -> str:
        return visible_text(json.dumps(obj.args, ensure_ascii=False))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None) -> Approval | None:
        """The approval as its pages show it (its page, the confirmation, its history): ``_approval_masked``,
        with the secrets bound now."""
        approval = super().get_object(request, object_id, from_field)
        return None if approval is None else _approval_masked(approval, secrets_shown(request))

    def get_changelist_instance(self, request: HttpRequest) -> ChangeList:
        """The list's page of approvals, masked again as an approval's page masks it (the secrets read once for
        the page). The rows are never saved."""
        changelist = super().get_changelist_instance(request)
        secrets = secrets_shown(request)
        for approval in changelist.result_list:
            _masked_in_place(approval, _APPROVAL_RECORDED, secrets)
        return changelist

    def get_ordering(self, request: HttpRequest) -> list[Any]:
        pending = Case(
            When(status=Approval.Status.PENDING, then=Value(0)), default=Value(1), output_field=IntegerField()
        )
        pending_since = Case(When(status=Approval.Status.PENDING, then=F("created_at")), default=None)
        return [pending.asc(), pending_since.asc(nulls_last=True), F("created_at").desc()]

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        return {}  # decisions are taken one at a time, with the arguments in view (the approval's page)

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        """Titled to view, as the run list is: nobody edits an approval (a decider decides on its page), and Django
        titled the list "Select approval to change" for whoever may decide."""
        title = gettext("Select %s to view") % self.model._meta.verbose_name
        return super().changelist_view(request, {"title": title, **(extra_context or {})})

    def history_view(self, request: HttpRequest, object_id: str, extra_context: Any = None) -> HttpResponse:
        """The audit record's page of an object (``ReadOnlyAdminMixin``), with an approval's own text: nobody edits
        an approval, but its status changes (pending → approved → executing → executed), each change an audit
        event of its run, linked for whoever may view them. Django's page read its own log, never written here,
        and said the approval "probably wasn't added via this admin site", which reads as a gap in the record."""
        extra = dict(extra_context or {})
        approval = self.get_object(request, object_id)
        if approval is not None:
            shown = _approval_shown(approval)
            extra.update(
                object=shown,
                title=gettext("History: %(object)s") % {"object": shown},
                audit_events_url=_events_url(self.admin_site, approval.run_id)
                if may_view(self.admin_site, request, AuditEvent)
                else "",
            )
        response = ReadOnlyAdminMixin.history_view(self, request, object_id, extra)  # type: ignore[arg-type]
        if isinstance(response, TemplateResponse):  # not rendered yet: the approval's text in place of a record's
            response.template_name = "admin/agents/approval/object_history.html"
        return response

    @admin.display(description=_("status"), ordering="status")
    def status_badge(self, obj: Approval) -> str:
        shown = _status_shown(obj)
        return format_html(
            '<span class="approval-status approval-status-{}">{}</span>', shown, Approval.Status(shown).label
        )

    @admin.display(description=_("reason"), ordering="reason")
    def reason_text(self, obj: Approval) -> str:
        return _reason_shown(obj.reason)

    @admin.display(description=_("expires"), ordering="expires_at")
    def expires(self, obj: Approval) -> str:
        """When a pending approval expires; an ended one's "expires" (one past it too) is no time to come."""
        return when_cell(obj.expires_at) if _status_shown(obj) == Approval.Status.PENDING else "—"

    @admin.display(description=_("call"))
    def call(self, obj: Approval) -> str:
        return f"{obj.mcp_id}.{obj.tool}"

    @admin.display(description=_("arguments (masked)"))
    def masked_args(self, obj: Approval) -> str:
        text = visible_text(json.dumps(obj.args, ensure_ascii=False))
        return format_html("<code>{}</code>", text if len(text) <= 200 else text[:199] + "…")

    @admin.display(description=_("run"), ordering="run")
    def run_link(self, obj: Approval) -> str:
        url = reverse("admin:agents_run_change", args=[obj.run_id], current_app=self.admin_site.name)
        return format_html('<a href="{}">{} {}</a>', url, obj.run.agent.slug, str(obj.run_id)[:8])

    def get_urls(self) -> list[URLPattern]:
        decide = self.admin_site.admin_view(self.decide_view)
        return [
            path("<path:object_id>/decide/<str:decision>/", decide, name="agents_approval_decide"),
            *super().get_urls(),
        ]

    def may_decide(self, request: HttpRequest, approval: Approval) -> bool:
        """Whether ``request``'s user may decide ``approval`` now: pending and not past its expiry (one that is
        past it, not yet swept, would be refused as expired)."""
        return (
            bool(self.has_change_permission(request, approval))
            and approval.status == Approval.Status.PENDING
            and not _past_expiry(approval)
        )

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if request.method == "POST":
            raise PermissionDenied  # nothing on an approval is edited; decisions go through decide_view
        approval = self.get_object(request, object_id)
        extra = dict(extra_context or {})
        extra.update(show_save=False, show_save_and_continue=False, show_save_and_add_another=False, show_delete=False)
        if approval is not None and self.has_view_permission(request, approval):
            extra.update(self._approval_context(request, approval))
            # Nothing on it is edited ("View approval", as a run's page reads "View run"); its heading, title and
            # breadcrumb name its status as shown: expired for one past its expiry not yet swept.
            shown = _approval_shown(approval)
            extra.update(title=gettext("View approval"), subtitle=str(shown), original=shown)
        return super().change_view(request, object_id, form_url, extra)

    def _approval_context(self, request: HttpRequest, approval: Approval) -> dict[str, Any]:
        """What an approval's page and its confirmation show. A pending approval past its expiry, which the
        periodic expiry has not reached yet, is shown as the expired one it is (no "expires at" a past time, no
        decision offered); the stored row, in "All fields", stays as it is until then."""
        name = self.admin_site.name
        may_view_run = may_view(self.admin_site, request, Run)
        secrets = secrets_shown(request)
        shown, reason = _approval_shown(approval), _reason_shown(approval.reason)
        if shown.status == Approval.Status.EXPIRED and not reason:  # lapsed: swept, or past its expiry not yet
            reason = gettext("This approval has expired.")
        return {
            "approval": shown,
            "reason_text": reason,
            # The question that led to the call, as stored (masked), whole: an approver weighs the call against
            # it, and had to open the run's page for it (which not every approver may view).
            "run_query": visible_text(mask_known(approval.run.query, secrets=secrets)),
            "args_pretty": visible_text(_pretty(approval.args)) or "{}",
            "arg_rows": argument_rows(approval.args),
            "may_decide": self.may_decide(request, approval),
            "asked_by_the_model": asked_by_the_model(approval),
            "approve_url": reverse("admin:agents_approval_decide", args=[approval.pk, "approve"], current_app=name),
            "reject_url": reverse("admin:agents_approval_decide", args=[approval.pk, "reject"], current_app=name),
            "run_url": reverse("admin:agents_run_change", args=[approval.run_id], current_app=name)
            if may_view_run
            else "",
            "timeline": run_timeline(approval.run, secrets=secrets) if may_view_run else None,
            "audit_events_url": _events_url(self.admin_site, approval.run_id)
            if may_view(self.admin_site, request, AuditEvent)
            else "",
        }

    def decide_view(self, request: HttpRequest, object_id: str, decision: str) -> HttpResponse:
        """GET: the confirmation (the call, its masked arguments, a reason: required to reject). POST: the
        decision, through ``approval_decide``; then the run's page, where the resumed run can be followed."""
        if decision not in ("approve", "reject"):
            raise Http404
        approval = self.get_object(request, object_id)
        if approval is None:
            raise Http404(gettext("Approval not found."))
        if not self.has_change_permission(request, approval):
            raise PermissionDenied
        error = ""
        # A rule's or a flow's call has no model to tell: the run goes on without the call and ends with the
        # rejection, which its caller sees.
        by_the_model = asked_by_the_model(approval)
        # A browser sends a textarea's line breaks as CRLF and counts each as one character against ``maxlength``.
        reason = request.POST.get("reason", "").replace("\r\n", "\n").strip() if request.method == "POST" else ""
        if request.method == "POST":
            if decision == "reject" and not reason:
                error = (
                    gettext("Give a reason for rejecting: the model and the caller are told it.")
                    if by_the_model
                    else gettext("Give a reason for rejecting: the caller is told it.")
                )
            elif len(reason) > REASON_MAX_CHARS:
                # Refused here, the text kept in the form to shorten (approval_decide would refuse it too).
                error = gettext("Give a reason of at most %(max)d characters (this one has %(count)d).") % {
                    "max": REASON_MAX_CHARS,
                    "count": len(reason),
                }
            else:
                try:
                    approval_decide(
                        run=approval.run,
                        approval_id=str(approval.pk),
                        decision=decision,
                        actor=f"admin:{request.user.get_username()}",
                        reason=reason,
                    )
                except ApplicationError as exc:
                    self.message_user(request, exc.message, messages.ERROR)
                else:
                    done = gettext("Approved: the run resumes and makes the call once.")
                    if decision == "reject" and by_the_model:
                        done = gettext("Rejected: the run resumes and the model is told why.")
                    elif decision == "reject":
                        done = gettext(
                            "Rejected: the call is not made; the run ends and its caller sees the rejection."
                        )
                    self.message_user(request, done, messages.SUCCESS)
                if not error:  # the run's page, where it can be followed; the approval's for one who cannot view runs
                    name = self.admin_site.name
                    if may_view(self.admin_site, request, Run):
                        return HttpResponseRedirect(
                            reverse("admin:agents_run_change", args=[approval.run_id], current_app=name)
                        )
                    return HttpResponseRedirect(
                        reverse("admin:agents_approval_change", args=[approval.pk], current_app=name)
                    )
        approval_context = self._approval_context(request, approval)
        title = gettext("Approve this call?") if decision == "approve" else gettext("Reject this call?")
        # Ended (or past its expiry): nothing to confirm, and maybe nobody decided it.
        if not approval_context["may_decide"]:
            title = gettext("Approval %(call)s: %(status)s") % {
                "call": f"{approval.mcp_id}.{approval.tool}",
                "status": approval_context["approval"].get_status_display(),
            }
        context = {
            **self.admin_site.each_context(request),
            **approval_context,
            "title": title,
            "opts": self.model._meta,
            "decision": decision,
            "reason": reason,
            "reason_max_chars": REASON_MAX_CHARS,
            "error": error,
            "change_url": reverse("admin:agents_approval_change", args=[approval.pk], current_app=self.admin_site.name),
        }
        return TemplateResponse(request, "admin/agents/approval/decide.html", context)
