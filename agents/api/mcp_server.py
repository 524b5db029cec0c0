"""Agents as an MCP server: ``/mcp/``, streamable HTTP (MCP 2025-03-26 and later), one tool per agent the key
may use.

``ask_<slug>`` takes ``query`` and optional ``context`` (``userId``, ``sessionId``, ``chatbotId``…) and ``data``
(an object: one entry of the run's ``a2a_data``), submits a run through the normal path (``run_submit``: the
worker, the gate, the audit) and answers when the run has finished or waits for an approval: the answer as
text, and as ``structuredContent`` the run's id, status, error, tool calls and the approvals pending. While it
runs, a call that sent a ``progressToken`` gets ``notifications/progress`` (one per status change and tool
call) on the response's event stream. ``notifications/cancelled`` for the call, or the client going away
before the answer, cancels the run. A call, answered on an event stream or as a JSON body held open, takes one of
the key's stream slots (``PLATFORM_SSE_MAX_STREAMS_PER_KEY``; none free: an ``isError`` result saying to call
again), and checks its key again every ``PLATFORM_SSE_AUTH_RECHECK_S``: once the key is revoked it ends with an
``isError`` result (``authentication_failed``), once the key may no longer read the run (taken off its agent, or the
agent disabled) with one saying ``run_not_found``, the run left to go on either way. A request over its key's rate
limit is answered in a 200 as the stream slots' refusal is (an HTTP 429 ends the official client's whole session):
a ``tools/call`` with an ``isError`` result, any other request with the JSON-RPC error ``THROTTLED``, both saying
when to ask again; a notification is counted too, and one over the limit is dropped (not acted on) with its usual
202.

Written as plain Django views rather than the ``mcp`` SDK's session manager, because the platform serves from
several processes (gunicorn's uvicorn workers, or ``runserver``) and an SDK session lives in one process's
memory: here nothing outlives a request but the run, whose idempotency key names the call that made it (so a
``notifications/cancelled`` that reaches another process finds it in the database). A session id is issued on
``initialize`` only to scope the client's request ids; the server keeps no session, so there is none to end
(``DELETE`` is a 405, as MCP allows) and no server-initiated stream (``GET`` is a 405). What the server says of
itself (the tools' descriptions, their schemas', the instructions) is in the caller's language, as its errors are.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse, StreamingHttpResponse
from django.utils import timezone, translation
from django.utils.translation import gettext as _
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions
from rest_framework.fields import DateTimeField

import agent_platform.telemetry as telemetry
from agent_platform.errors import ApplicationError
from agents.api.a2a_server import description_secrets, prompt_summary, task_stopped
from agents.api.config import api_setting
from agents.api.protocol_http import (
    KeyRecheck,
    Poll,
    PollState,
    caller_authenticate,
    charset_is_utf8,
    dumps,
    error_response,
    json_body,
    json_response,
    key_may_read_run,
    retry_after,
    revoked_message,
    rpc_body,
    run_unreadable_message,
    slot_stream,
    status_progress_text,
    stream_slot_take,
    throttled_message,
    too_many_streams,
    tool_progress_text,
)
from agents.api.throttling import api_key_rate_check, stream_slot_release
from agents.approvals import approvals_waiting
from agents.config_cache import described_configuration, shown_secrets
from agents.conversations import CONTEXT_ID_MAX_CHARS, context_id_problem, context_without_null_id
from agents.error_texts import error_message_text
from agents.models import Agent, AgentVersion, ApiKey, Run
from agents.selectors import agent_list_for_key, run_events_after, run_tool_calls
from agents.services import run_cancel, run_create, secrets_readable_or_refused
from audit.change_guard import config_generation
from audit.masking import mask_known
from audit.visible import visible_text

logger = logging.getLogger(__name__)

SERVER_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26")
TOOL_PREFIX = "ask_"
# A run's events that are tool calls: the model's or a flow's (``tool_call``) and the deterministic rules'.
TOOL_EVENTS = frozenset({"tool_call", "deterministic_result"})
EVENTS_READ = 200  # a poll's read of a run's events
STOPPED = frozenset({Run.Status.SUCCEEDED, Run.Status.FAILED, Run.Status.CANCELLED, Run.Status.AWAITING_APPROVAL})


def input_schema() -> dict[str, Any]:
    """A tool's ``inputSchema``, its descriptions in the active language (built per request, as its errors are)."""
    return {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": _("The question for the agent.")},
            "context": {
                "type": "object",
                "description": _("A2A context: userId, sessionId, chatbotId, …"),
                # The conversation (A2A's contextId): text, not blank, as ``tool_call_start`` checks it; null: none.
                "properties": {
                    "contextId": {
                        "type": ["string", "null"],
                        "minLength": 1,
                        "maxLength": CONTEXT_ID_MAX_CHARS,
                        "pattern": r"\S",
                    }
                },
            },
            "data": {"type": "object", "description": _("Structured input (one entry of the run's a2a_data).")},
        },
        "required": ["query"],
        "additionalProperties": False,
    }


# A tool's ``outputSchema`` (``structuredContent`` of ``call_result``): names only, no text to translate.
OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "run_id": {"type": "string"},
        "status": {"type": "string", "enum": [s.value for s in Run.Status]},
        "answer": {"type": "string"},
        "error": {"type": ["object", "null"]},
        "tool_calls": {"type": "array", "items": {"type": "object"}},
        "approvals_pending": {"type": "array", "items": {"type": "object"}},
    },
    "required": ["run_id", "status", "answer", "error", "tool_calls", "approvals_pending"],
}


class McpError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def tool_name(agent: Agent) -> str:
    return f"{TOOL_PREFIX}{agent.slug}"


def tool_of(agent: Agent, summary: str) -> dict[str, Any]:
    """The agent as an MCP tool, described by ``summary``: the first line of the prompt live traffic runs with,
    masked (``tools_listed``)."""
    asked = _("Ask the agent '%(name)s'.") % {"name": agent.name}
    return {
        "name": tool_name(agent),
        "title": agent.name,
        "description": f"{asked} {summary}".strip(),
        "inputSchema": input_schema(),
        "outputSchema": OUTPUT_SCHEMA,
    }


def tools_listed(*, api_key: ApiKey) -> list[dict[str, Any]]:
    """``tools/list``: one tool per agent the key may use (sync), each described as its A2A card is: by the prompt
    live traffic runs with (``served_system_prompt``: a published agent's unpublished draft is not what a call of it
    runs, and must not be announced), masked with the secrets its runs are masked with (``description_secrets``).
    The live prompts are read in one query, that prompt alone, and the live versions without their content (a
    version's content holds every contract it froze): the configuration that names the secrets is this process's
    copy while the configuration has not changed (``described_configuration``)."""
    agents = agent_list_for_key(api_key=api_key)
    live = {
        pk: (version_id, prompt)
        for pk, version_id, prompt in Agent.objects.filter(
            pk__in=[agent.pk for agent in agents], live_version__isnull=False
        ).values_list("pk", "live_version_id", "live_version__content__agent__system_prompt")
    }
    versions = AgentVersion.objects.defer("content").in_bulk([version_id for version_id, _prompt in live.values()])
    generation = config_generation()
    tools = []
    for agent in agents:
        version_id, prompt = live.get(agent.pk, (None, agent.system_prompt))
        version = versions.get(version_id) if version_id is not None else None
        configuration = described_configuration(agent=agent, version=version, generation=generation)
        secrets = description_secrets(agent, configuration)
        tools.append(tool_of(agent, prompt_summary(prompt or "", secrets=secrets, max_chars=300)))
    return tools


def call_result(run: Run) -> dict[str, Any]:
    """A finished (or parked) run as a ``CallToolResult``."""
    pending = [
        {
            "approval_id": str(a.pk),
            "mcp_id": a.mcp_id,
            "tool": a.tool,
            "args": a.args,
            "expires_at": DateTimeField().to_representation(a.expires_at),  # as GET /runs/{id} writes it
        }
        for a in approvals_waiting(run)
    ]
    error = {"code": run.error_code, "message": run.error_message} if run.error_code else None
    # In the caller's language, the status by its label (as the A2A and run events APIs show it).
    label = Run.Status(run.status).label if run.status in Run.Status.values else run.status
    if run.status == Run.Status.SUCCEEDED:
        text = run.answer
    elif run.status == Run.Status.AWAITING_APPROVAL:
        # Each call with the URL that decides it (its approval's id): a client that reads the text alone, as a
        # model does, could not decide one when the id was only in ``structuredContent``.
        calls = "; ".join(
            _("%(tool)s %(args)s (decide with POST /api/v1/runs/%(run_id)s/approvals/%(approval_id)s)")
            % {
                "tool": p["tool"],
                # As the admin shows them to an approver: a character that hides itself written out.
                "args": visible_text(json.dumps(p["args"], ensure_ascii=False)),
                "run_id": run.id,
                "approval_id": p["approval_id"],
            }
            for p in pending
        )
        text = f"{label}: {calls}"
    elif error:
        text = f"{label}: {error['code']}: {error_message_text(run.error_code, run.error_message)}"
    else:
        text = _("status: %(status)s") % {"status": label}
    structured = {
        "run_id": str(run.id),
        "status": run.status,
        "answer": run.answer,
        "error": error,
        "tool_calls": run_tool_calls(run=run),
        "approvals_pending": pending,
    }
    return {
        "content": [{"type": "text", "text": text}],
        "structuredContent": structured,
        "isError": run.status in {Run.Status.FAILED, Run.Status.CANCELLED},
    }


def call_idempotency_key(session_id: str, rpc_id: Any) -> str:
    """The idempotency key of the run a ``tools/call`` makes: ``mcp-call `` and the SHA-256 of the call's session
    and request id. The space keeps it apart from every ``Idempotency-Key`` header (which has none) and the prefix
    from the A2A and REST message keys (``a2a …``, ``message …``); the digest bounds its length. The API key is the
    run's own column, so it need not be in the key."""
    call = json.dumps([session_id, rpc_id], ensure_ascii=False)
    return f"mcp-call {hashlib.sha256(call.encode()).hexdigest()}"


def call_cancel_window() -> timedelta:
    """How long after its call a run can be cancelled by the call's id: the longest a call is answered for
    (``PLATFORM_SSE_MAX_S``) and a minute. A ``notifications/cancelled`` later than that (or for a request id used
    again much later) leaves the run alone."""
    return timedelta(seconds=float(api_setting("PLATFORM_SSE_MAX_S")) + 60)


def tool_call_start(*, api_key: ApiKey, params: dict[str, Any], session_id: str, rpc_id: Any) -> Run:
    """Create the run a ``tools/call`` asks for, its idempotency key naming the call (``call_idempotency_key``),
    so that any web process can find it to cancel it. Made by ``run_create``, never replayed as ``run_submit``
    replays a key: a request id is unique only among a session's requests in flight (a client without a session
    may send id 1 every time), so a key seen before is a new call, not a retry.
    Raises McpError (unknown tool) or ApplicationError (bad arguments, agent disabled)."""
    name = params.get("name")
    agents = {tool_name(a): a for a in agent_list_for_key(api_key=api_key)}
    if not isinstance(name, str) or name not in agents:
        raise McpError(-32602, _("Unknown tool: %(name)s") % {"name": name})
    arguments = params.get("arguments") or {}
    if not isinstance(arguments, dict):
        raise ApplicationError(_("'arguments' must be an object."), code="invalid_input", status=400)
    unknown = sorted(set(arguments) - {"query", "context", "data"})
    if unknown:
        raise ApplicationError(_("Unknown arguments: %(names)s") % {"names": ", ".join(unknown)}, code="invalid_input")
    query = arguments.get("query")
    if not isinstance(query, str) or not query.strip():
        raise ApplicationError(_("'query' must be a non-empty string."), code="invalid_input", status=400)
    for field in ("context", "data"):
        if field in arguments and not isinstance(arguments[field], dict):
            raise ApplicationError(_("'%(field)s' must be an object.") % {"field": field}, code="invalid_input")
    context = context_without_null_id(arguments.get("context") or {})  # a null contextId: none, the run its own
    problem = context_id_problem(context, field="context.contextId")
    if problem is not None:  # a number was kept as it came: the run's conversation, which nothing finds
        raise ApplicationError(problem, code="invalid_input")
    with secrets_readable_or_refused():  # a secret this process cannot decrypt: config:secret_unreadable, as REST
        return run_create(
            agent_slug=agents[name].slug,
            query=query.strip(),
            api_key=api_key,
            context=context,
            a2a_data=[arguments["data"]] if arguments.get("data") else [],
            idempotency_key=call_idempotency_key(session_id, rpc_id),
        )


def tool_call_cancel(*, api_key: ApiKey, session_id: str, rpc_id: Any, why: str) -> None:
    """Cancel the run a ``notifications/cancelled`` names by its request id: the latest one the key made under the
    call's id within ``call_cancel_window`` (read from the index ``run_key_idempotency_idx``, in whichever process
    the notification reaches), as ``tool_call_run_cancel`` cancels it. The session is part of the call's id, so a
    session's notification finds only its own session's calls. Without a session the request id is all there is:
    two sessionless calls with the same id under one key cannot be told apart, and the latest is taken (what a
    client that sends id 1 every time means). A client gone cancels its own run by its id instead."""
    run_id = (
        Run.objects.filter(
            api_key=api_key,
            idempotency_key=call_idempotency_key(session_id, rpc_id),
            created_at__gte=timezone.now() - call_cancel_window(),
        )
        .order_by("-created_at")
        .values_list("pk", flat=True)
        .first()
    )
    if run_id is not None:
        tool_call_run_cancel(api_key=api_key, run_id=run_id, why=why)


def tool_call_run_cancel(*, api_key: ApiKey, run_id: Any, why: str) -> None:
    """Cancel a call's run as its key's own cancel (``why`` in the actor): a finished run is left, and so is one the
    key may no longer read (``key_may_read_run``: another key's, taken off its agent, or the agent disabled), as
    REST's cancel answers it a 404. Either is ignored as an unknown request id is: a notification has no answer,
    nor has a client gone."""
    run = Run.objects.filter(pk=run_id, api_key=api_key).first()
    if run is None or run.is_finished or not key_may_read_run(api_key=api_key, run_id=run.pk):
        return
    with contextlib.suppress(ApplicationError):  # it finished in between
        run_cancel(run=run, actor=call_cancel_actor(api_key, why), source="api")


def call_cancel_actor(api_key: ApiKey, why: str) -> str:
    """Who cancelled a call's run, as its ``run.cancel`` audit event and its error message name it: the key, and why
    (``cancelled``: the client's ``notifications/cancelled``; ``client gone``)."""
    return f"api_key:{api_key.prefix} ({why})"


class CallFeed:
    """A ``tools/call`` on an event stream: progress notifications while the run goes, then the result."""

    def __init__(
        self,
        *,
        run: Run,
        rpc_id: Any,
        progress_token: Any,
        recheck: KeyRecheck | None = None,
        cancel_notice_actor: str | None = None,
    ) -> None:
        """``recheck`` asks again whether the key is live and may still read the run (and renews the call's
        stream slot); once it is not, the call ends with an ``isError`` result saying why (nothing of the run),
        the run left to go on. ``cancel_notice_actor``: who a ``notifications/cancelled`` for this call cancels its
        run as (``call_cancel_actor``); a run cancelled so ends the stream with no answer (MCP: a receiver of the
        notification should not answer the request)."""
        self.run_id = run.pk
        self.cancelled_by_notice = f"cancelled by {cancel_notice_actor}" if cancel_notice_actor else None
        self.rpc_id = rpc_id
        self.recheck = recheck
        self.language = translation.get_language()  # the caller's (the stream outlives the request's translation)
        self.progress_token = progress_token
        self.secrets: list[str] | None = None  # what its messages are masked with (``_message``)
        self.last_seq = 0
        self.progress = 0
        self.deadline = time.monotonic() + float(api_setting("PLATFORM_SSE_MAX_S"))
        self.last_sent = time.monotonic()
        self.keepalive_s = float(api_setting("PLATFORM_SSE_KEEPALIVE_S"))

    def _message(self, body: dict[str, Any]) -> str:
        """One message of the call's stream, masked again with the credentials bound now (read with its first
        message): the run's records were masked with those known when they were written, and a value bound as a
        secret since (a token the caller typed, then given to a server) was in none of them."""
        self.last_sent = time.monotonic()
        if self.secrets is None:
            self.secrets = shown_secrets()
        return f"event: message\ndata: {dumps(mask_known(body, secrets=self.secrets))}\n\n"

    def _progress(self, message: str) -> str:
        self.progress += 1
        params = {"progressToken": self.progress_token, "progress": self.progress, "message": message}
        return self._message({"jsonrpc": "2.0", "method": "notifications/progress", "params": params})

    def poll(self) -> tuple[list[str], PollState]:
        with translation.override(self.language):
            loss = self.recheck.lost() if self.recheck is not None else None
            if loss is not None:
                text = (
                    f"authentication_failed: {revoked_message()}"
                    if loss == "revoked"
                    else f"run_not_found: {run_unreadable_message()}"
                )
                result = {"content": [{"type": "text", "text": text}], "isError": True}
                return [self._message({"jsonrpc": "2.0", "id": self.rpc_id, "result": result})], "done"
            return self._poll()

    def _poll(self) -> tuple[list[str], PollState]:
        run = Run.objects.select_related("agent").get(pk=self.run_id)
        if run.status == Run.Status.CANCELLED and run.error_message == self.cancelled_by_notice:
            return [], "done"  # the client cancelled this request: it is not answered
        # Before the events: a run cancelled while it ran records its call, then its end. A run parked on approvals
        # all past their expiry waits for the reconciler, not for anyone (``task_stopped``): the call follows it on,
        # where it ended "waiting for approval" with none to decide.
        ended = task_stopped(run)
        chunks: list[str] = []
        events = run_events_after(run_id=run.pk, after=self.last_seq, limit=EVENTS_READ)
        for event in events:
            self.last_seq = event.seq
            if self.progress_token is None:
                continue
            if event.kind == "status":
                chunks.append(self._progress(status_progress_text(run, str(event.data.get("status") or ""))))
            elif event.kind in TOOL_EVENTS:
                chunks.append(self._progress(tool_progress_text(run, event.data)))
        if len(events) == EVENTS_READ:
            # More may follow: read before the result, or every event past the first read's would never be sent
            # (the progress counter has no gap to tell the caller so).
            return chunks, "more"
        if ended or time.monotonic() >= self.deadline:
            chunks.append(self._message({"jsonrpc": "2.0", "id": self.rpc_id, "result": call_result(run)}))
            return chunks, "done"
        if not chunks and time.monotonic() - self.last_sent >= self.keepalive_s:
            self.last_sent = time.monotonic()
            chunks.append(": keep-alive\n\n")
        return chunks, "wait"


def _rpc_error(rpc_id: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rpc_id, "error": {"code": code, "message": message}}


# A request over its key's rate limit: a server-defined JSON-RPC code (A2A's RESOURCE_EXHAUSTED has the same).
THROTTLED = -32029


def _valid_id(rpc_id: Any) -> bool:
    """Whether ``rpc_id`` is a request id a client can match its answer to (MCP: a string or an integer, never
    null), short enough to echo."""
    return not isinstance(rpc_id, bool) and (
        isinstance(rpc_id, int) or (isinstance(rpc_id, str) and len(rpc_id) <= 200)
    )


def _id_echoed(body: Any) -> Any:
    """The id of an invalid request to answer under: its own where it is a valid one, else null."""
    rpc_id = body.get("id") if isinstance(body, dict) else None
    return rpc_id if _valid_id(rpc_id) else None


def throttled_answer(body: Any, wait: float) -> JsonResponse:
    """A request over its key's rate limit, answered as the stream slots' refusal is, in a 200 (an HTTP 429 makes
    the official client raise in its task group and ends the whole session): a ``tools/call``'s own ``isError``
    result, any other request's JSON-RPC error, each saying when to ask again. What is no request (no id a client
    could match) keeps the REST API's 429."""
    message = throttled_message(wait)
    rpc_id = _id_echoed(body)
    if rpc_id is None:
        return error_response("throttled", message, 429, headers=retry_after(wait))
    if body.get("method") == "tools/call":
        result = {"content": [{"type": "text", "text": f"throttled: {message}"}], "isError": True}
        return json_response({"jsonrpc": "2.0", "id": rpc_id, "result": result}, headers=retry_after(wait))
    error = _rpc_error(rpc_id, THROTTLED, message)
    error["error"]["data"] = {"code": "throttled", "retryAfter": int(wait)}
    return json_response(error, headers=retry_after(wait))


def refusal_result(exc: ApplicationError) -> dict[str, Any]:
    """A ``tools/call`` refused before its run was made, as an ``isError`` result: the text (our code and message),
    and in ``structuredContent`` what the REST API and A2A carry beside them: our ``code``, and where known a spent
    budget's ``reason`` (``used_up``, ``runs_in_flight``), ``resets_at`` and ``retryAfter`` (its ``Retry-After``, in
    seconds), so a client knows whether and when to call again (the text alone lost them)."""
    structured: dict[str, Any] = {"code": exc.code}
    structured.update({key: str(exc.fields[key]) for key in ("reason", "resets_at") if key in exc.fields})
    wait = str(exc.headers.get("Retry-After", ""))
    if wait.isdigit():
        structured["retryAfter"] = int(wait)
    return {
        "content": [{"type": "text", "text": f"{exc.code}: {exc.message}"}],
        "structuredContent": structured,
        "isError": True,
    }


def _initialize(params: dict[str, Any]) -> dict[str, Any]:
    asked = params.get("protocolVersion")
    version = asked if asked in SERVER_VERSIONS else SERVER_VERSIONS[0]
    return {
        "protocolVersion": version,
        "capabilities": {"tools": {"listChanged": False}},
        "serverInfo": {"name": "agent-platform", "version": "1"},
        "instructions": _(
            "Each tool asks one agent of the platform; the answer comes with the run's id and tool calls."
        ),
    }


def _accepted() -> HttpResponse:
    """``202 Accepted`` without a body (a notification, a JSON-RPC response): with no ``Content-Type`` either, where
    Django's default claimed ``text/html``."""
    response = HttpResponse(status=202)
    del response["Content-Type"]
    return response


@csrf_exempt
async def mcp_view(request: HttpRequest) -> HttpResponseBase:
    if request.method != "POST":
        # DELETE too: the server keeps no session state, so a session cannot be ended (MCP lets a server answer
        # 405 here; it used to answer 204 to anyone, while the session id went on working).
        return error_response(
            "method_not_allowed",
            _("POST JSON-RPC messages here (streamable HTTP)."),
            405,
            headers={"Allow": "POST"},
        )
    # Counted against the key's rate once the body says what it is: a notification over the limit is dropped with
    # its usual 202 (it has no answer to carry a refusal, and a 429 ended the official client's session), so a
    # stream of them is no way around the limit.
    caller = await sync_to_async(caller_authenticate)(request, counted=False)
    if caller.api_key is None:
        return caller.refusal  # type: ignore[return-value]
    api_key = caller.api_key
    body: Any = None
    refusal: JsonResponse | None = None
    if request.body and (request.content_type != "application/json" or not charset_is_utf8(request)):
        # As the MCP SDK's own server answers: the body is JSON in UTF-8, said so (a text/plain body, or one in
        # EUC-KR, was read all the same, or read wrong).
        message = _("Send the message as application/json in UTF-8.")
        refusal = json_response(_rpc_error(None, -32600, message), status=415)
    else:
        try:
            body = rpc_body(request)
        except exceptions.ParseError as exc:
            refusal = json_response(_rpc_error(None, -32700, str(exc.detail)), status=400)
    wait = await sync_to_async(api_key_rate_check)(api_key)
    if wait is not None:
        if isinstance(body, dict) and "id" not in body and isinstance(body.get("method"), str):
            return _accepted()  # a notification: not acted on
        return throttled_answer(body, wait)
    if refusal is not None:
        return refusal
    if not isinstance(body, dict) or body.get("jsonrpc") != "2.0":
        return json_response(_rpc_error(_id_echoed(body), -32600, _("Send one JSON-RPC 2.0 message.")), status=400)
    version = request.headers.get("MCP-Protocol-Version", "").strip()
    if version and version not in SERVER_VERSIONS and body.get("method") != "initialize":
        # MCP 2025-06-18: a version the server does not speak is a 400 (it was answered as if it were one). Quoted
        # as printable ASCII: a header's other bytes came back as Latin-1 mojibake.
        shown = "".join(ch if " " <= ch <= "~" else "?" for ch in version[:40])
        message = _("Unsupported MCP-Protocol-Version %(version)s; this server speaks %(versions)s.") % {
            "version": shown,
            "versions": ", ".join(SERVER_VERSIONS),
        }
        return json_response(_rpc_error(_id_echoed(body), -32600, message), status=400)
    session_id = request.headers.get("Mcp-Session-Id", "")[:100]
    method = body.get("method")
    if "method" in body and not isinstance(method, str):
        # JSON-RPC: a method is a string; anything else is an Invalid Request (as the A2A server answers), not a
        # method that was looked for and not found.
        return json_response(_rpc_error(_id_echoed(body), -32600, _("Expected a JSON-RPC 2.0 request.")), status=400)
    if "id" not in body or method is None:  # a notification, or a response to a request we never send
        if method == "notifications/cancelled" and isinstance(body.get("params"), dict):
            await sync_to_async(tool_call_cancel)(
                api_key=api_key, session_id=session_id, rpc_id=body["params"].get("requestId"), why="cancelled"
            )
        return _accepted()
    rpc_id = body["id"]
    if not _valid_id(rpc_id):
        # MCP: a request's id is a string or an integer (never null); any other could not be matched to its answer.
        # A 400, as every other invalid request's (a null id's was a 200).
        message = _("The request's 'id' must be a string (at most 200 characters) or an integer.")
        return json_response(_rpc_error(None, -32600, message), status=400)
    if method in ("initialize", "tools/call") and "params" in body and not isinstance(body["params"], dict):
        # JSON-RPC: params are an object (by name) where given; a string's call read as "Unknown tool: None".
        return json_response(_rpc_error(rpc_id, -32602, _("'params' must be an object.")))
    params: dict[str, Any] = body["params"] if isinstance(body.get("params"), dict) else {}
    if method == "initialize":
        # Always the server's own: a client's header was sent back unchecked, so it chose its session's id.
        headers = {"Mcp-Session-Id": secrets.token_urlsafe(24)}
        return json_response({"jsonrpc": "2.0", "id": rpc_id, "result": _initialize(params)}, headers=headers)
    if method == "ping":
        return json_response({"jsonrpc": "2.0", "id": rpc_id, "result": {}})
    if method == "tools/list":
        tools = await sync_to_async(tools_listed)(api_key=api_key)
        return json_response({"jsonrpc": "2.0", "id": rpc_id, "result": {"tools": tools}})
    if method != "tools/call":
        return json_response(_rpc_error(rpc_id, -32601, _("Method not found: %(method)s") % {"method": method}))
    meta: dict[str, Any] = params["_meta"] if isinstance(params.get("_meta"), dict) else {}
    token = meta.get("progressToken")
    if token is not None and (isinstance(token, bool) or not isinstance(token, str | int) or len(str(token)) > 200):
        # MCP: a string or an integer; it is echoed in every progress notification (a 100 kB one was, each time).
        message = _("'_meta.progressToken' must be a string (at most 200 characters) or an integer.")
        return json_response(_rpc_error(rpc_id, -32602, message))
    streaming = "text/event-stream" in request.headers.get("Accept", "")
    # The call's slot first, on an event stream or not (a JSON answer is held open as long, polling): a refused
    # call must not have started its run (a fast worker may have begun it, and a client retrying after
    # Retry-After would start another).
    slot = await sync_to_async(stream_slot_take)(api_key)
    if slot is None:
        # The call's own failure, not the session's: an HTTP 429 ends an MCP client's whole session (the
        # official client's task group dies), so the client is told, in the result, to call again later.
        busy = json.loads(too_many_streams().content)["error"]
        text = f"{busy['code']}: {busy['message']} " + _("Call again in a few seconds.")
        result = {"content": [{"type": "text", "text": text}], "isError": True}
        return json_response({"jsonrpc": "2.0", "id": rpc_id, "result": result})

    def abandon(run: Run) -> None:
        # The run this call made, by its id: never looked up by the request id, which may name another client's
        # call too (two clients without a session may both send id 1; the latest run would be cancelled).
        tool_call_run_cancel(api_key=api_key, run_id=run.pk, why="client gone")

    try:
        # A caller's trace context in ``_meta`` (where no header gave one): the run and its task join its trace.
        with telemetry.mcp_call_traced(meta, request.META):
            run = await _made_even_if_left(
                sync_to_async(tool_call_start)(api_key=api_key, params=params, session_id=session_id, rpc_id=rpc_id),
                abandon,
            )
    except BaseException as exc:
        await asyncio.shield(sync_to_async(stream_slot_release)(slot))
        if isinstance(exc, McpError):
            return json_response(_rpc_error(rpc_id, exc.code, exc.message))
        if isinstance(exc, ApplicationError):
            return json_response({"jsonrpc": "2.0", "id": rpc_id, "result": refusal_result(exc)})
        if not isinstance(exc, Exception):  # cancelled (the client went away), or the process is stopping
            raise
        logger.exception("MCP tools/call failed")
        return json_response(_rpc_error(rpc_id, -32603, _("Internal error.")))
    left = functools.partial(abandon, run)  # the client going away from here on cancels this run
    feed = CallFeed(
        run=run,
        rpc_id=rpc_id,
        progress_token=token,
        recheck=KeyRecheck(api_key, slot, run_id=run.pk),
        # On an event stream only: a JSON body, begun with its 200, must end with one JSON-RPC message.
        cancel_notice_actor=call_cancel_actor(api_key, "cancelled") if streaming else None,
    )
    poll = _answered_whatever_happens(feed.poll, rpc_id, run.pk)
    if not streaming:
        # A client that takes no event stream gets the JSON answer, sent as the body of a response that starts at
        # once: while the run goes, a space now and then (JSON's own whitespace) lets the server notice a client
        # gone, whose run is then cancelled as a stream client's is, not left to run for nobody.
        feed.progress_token = None
        answer = slot_stream(request, json_body(poll), slot, on_abandon=left)
        response = StreamingHttpResponse(answer, content_type="application/json; charset=utf-8")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"
        return response
    stream = slot_stream(request, poll, slot, on_abandon=left)
    response = StreamingHttpResponse(stream, content_type="text/event-stream; charset=utf-8")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


async def _made_even_if_left(making: Awaitable[Run], abandon: Callable[[Run], None]) -> Run:
    """The run a call submits, made even where the client goes away meanwhile (Django's ASGI handler then cancels
    the view, but not the thread that is making the run): once made, that run is handed to ``abandon``, to be
    cancelled as a leaving client's is, not left to run for nobody. A submission refused or failed has nothing to
    cancel."""
    making = asyncio.ensure_future(making)
    try:
        return await asyncio.shield(making)
    except asyncio.CancelledError:

        async def cancel_once_made() -> None:
            with contextlib.suppress(Exception):
                run = await making
                await sync_to_async(abandon)(run)

        await asyncio.shield(cancel_once_made())
        raise


def _answered_whatever_happens(poll: Poll, rpc_id: Any, run_id: Any) -> Poll:
    """``poll`` of a call's event stream that ends with an answer to the request whatever happens: a failure to
    read the run (the database hiccups) is a JSON-RPC error naming the run, which goes on (the client may read it
    at /api/v1/runs/{id} instead of calling again: a call has no idempotency key)."""

    def guarded() -> tuple[list[str], PollState]:
        try:
            return poll()
        except Exception:  # answered as an error; the run is not the client's to lose
            logger.exception("MCP tools/call: reading run %s failed", run_id)
            error = _rpc_error(
                rpc_id,
                -32603,
                _("Internal error while waiting for the run; it goes on: GET /api/v1/runs/%(run_id)s")
                % {"run_id": run_id},
            )
            error["error"]["data"] = {"run_id": str(run_id)}
            return [f"event: message\ndata: {dumps(error)}\n\n"], "done"

    return guarded
