"""The A2A server: each agent is an A2A agent at ``/a2a/<slug>/`` (protocol 1.0, JSON-RPC binding, as the
official ``a2a-sdk`` 1.x client speaks it).

- ``GET /a2a/<slug>/.well-known/agent-card.json``: the agent's card (what live traffic runs: its live version's
  prompt, rules and tools once published; skills from its rules and tools, streaming, our API key as a bearer
  security scheme); ``GET /.well-known/agent-card.json``: a card of the platform whose
  skills are the agents the key may use, each with its A2A base URL (``agents`` lists them too).
- ``POST /a2a/<slug>/``: JSON-RPC 2.0. ``SendMessage`` (waits, up to ``PLATFORM_API_MAX_WAIT_S``, until the
  run finishes or asks for input, unless ``configuration.returnImmediately``; the answer's body starts at once
  and is kept alive with JSON's whitespace meanwhile; its key is checked again as a stream's is, and before the
  task is sent), ``SendStreamingMessage`` and
  ``SubscribeToTask`` (server-sent events, one JSON-RPC response per event; the key is checked again every
  ``PLATFORM_SSE_AUTH_RECHECK_S``: a revoked one's stream ends with the error -32030 ``UNAUTHENTICATED``, and one
  that may no longer read the task (taken off its agent, or the agent disabled) with -32001 ``TASK_NOT_FOUND``, as
  ``GetTask`` then answers),
  ``GetTask``, ``CancelTask``, ``ListTasks``.

A task is a run: its id is the run's id; its status's ``timestamp`` is when the run reached its state (finished,
else its latest ``status`` event), which ``ListTasks`` orders and filters by; its ``contextId`` is the
conversation, kept in the run's ``context`` (``contextId``) with the caller's ``metadata.context`` (``userId``,
``sessionId``, ``chatbotId``…); a run kept without one (sent to REST without one, or by MCP) reports its own id,
and a message sent under that id goes on in its conversation (``agents.conversations``). A message's
parts map onto the run as the REST API maps an A2A message (``agents.api.a2a``): text → query, data → ``a2a_data``,
url/raw → ``a2a_files`` metadata. The message's ``messageId`` is the run's idempotency key (a retried send gets
the same task). ``awaiting_approval`` is ``TASK_STATE_INPUT_REQUIRED``: its status message names the pending calls
(where every one is past its expiry, not yet marked by the reconciler, nothing is asked: ``TASK_STATE_WORKING``);
a message on that task with a data part ``{"decision": "approve"|"reject", "approvalId"?, "reason"?}`` (or the text
``approve``/``reject``, ``승인``/``거절``/``거부``, as the whole message) decides them (all of them, or none where one is refused), as
``POST /runs/{id}/approvals/{id}`` would, and the task goes on; the same reply sent again under its ``messageId``
returns the task and decides nothing.
Our error codes become A2A errors (``run_not_found`` → -32001 TaskNotFound, ``run_finished`` on cancel → -32002,
invalid input → -32602, a refusal of what the caller may not do → -32031, …) with our code in the error's
``ErrorInfo`` metadata; a refusal to come back later (a spent budget, a key whose stream slots are all taken) is
-32029 in an HTTP 429 with ``Retry-After``, and the server's own failure (a 503 ``config:secret_unreadable``) is
-32603 in the REST API's status, with its ``Retry-After``. A message's
``contextId`` is compared and filtered on composed (NFC), as the run keeps it.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import inspect
import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.handlers.asgi import ASGIRequest
from django.db import transaction
from django.db.models import Exists, OuterRef, Q, Subquery
from django.db.models.functions import Coalesce
from django.http import HttpRequest, HttpResponseBase, StreamingHttpResponse
from django.utils import timezone, translation
from django.utils.dateparse import parse_datetime
from django.utils.translation import gettext as _
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions
from rest_framework.exceptions import ValidationError

from agent_platform.errors import ApplicationError
from agent_platform.text import grapheme_cut, nfc, strings_mapped
from agents.api.a2a import run_input_from_message
from agents.api.config import api_setting
from agents.api.protocol_http import (
    KeyRecheck,
    PollState,
    StreamLoss,
    caller_authenticate,
    charset_is_utf8,
    dumps,
    error_response,
    json_body,
    json_response,
    paced_async,
    paced_sync,
    retry_after,
    revoked_message,
    rpc_body,
    run_unreadable_message,
    slot_stream,
    stream_slot_take,
    throttled_message,
    too_many_streams,
    tool_progress_text,
)
from agents.api.serializers import (
    PART_CONTENTS,
    A2AMessageSerializer,
    A2APartField,
    BoundedListField,
    part_contents_message,
)
from agents.api.throttling import api_key_rate_check, stream_slot_release
from agents.approvals import approval_decide, approvals_waiting
from agents.config_cache import RunConfiguration, described_configuration, shown_secrets, tools_served
from agents.conversations import (
    context_id_of,
    context_id_problem,
    context_without_null_id,
    in_context,
    same_context,
)
from agents.error_texts import error_message_text
from agents.models import Agent, ApiKey, Approval, Run, RunEvent
from agents.run_state import RunEventWriter, run_row_lock
from agents.selectors import (
    agent_get_for_key,
    agent_list_for_key,
    run_end_recorded,
    run_events_after,
    run_get,
    run_tool_calls,
)
from agents.services import request_digest, run_cancel, run_submit
from audit.change_guard import config_generation
from audit.masking import mask_known, mask_text
from audit.visible import readable_text, visible_text
from mcpregistry.contracts import frozen_out_of_date
from mcpregistry.crypto import SecretDecryptionError

logger = logging.getLogger(__name__)

PROTOCOL_VERSION = "1.0"
PLATFORM_NAME = "Agent platform"
ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"
RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"

TASK_STATE = {
    Run.Status.QUEUED: "TASK_STATE_SUBMITTED",
    Run.Status.RUNNING: "TASK_STATE_WORKING",
    Run.Status.SUCCEEDED: "TASK_STATE_COMPLETED",
    Run.Status.FAILED: "TASK_STATE_FAILED",
    Run.Status.CANCELLED: "TASK_STATE_CANCELED",
    Run.Status.AWAITING_APPROVAL: "TASK_STATE_INPUT_REQUIRED",
}


# Every state of A2A 1.0's ``TaskState`` that ``ListTasks`` may filter on (``TASK_STATE_UNSPECIFIED``: no filter);
# ``TASK_STATE`` maps ours onto them, and some no run is ever in.
A2A_TASK_STATES = (
    "TASK_STATE_SUBMITTED",
    "TASK_STATE_WORKING",
    "TASK_STATE_COMPLETED",
    "TASK_STATE_FAILED",
    "TASK_STATE_CANCELED",
    "TASK_STATE_INPUT_REQUIRED",
    "TASK_STATE_REJECTED",
    "TASK_STATE_AUTH_REQUIRED",
)
SECURITY_REQUIREMENTS: list[dict[str, Any]] = [{"schemes": {"apiKey": {"list": []}}}]
# A run's events that are tool calls: the model's or a flow's (``tool_call``) and the deterministic rules'.
TOOL_EVENTS = frozenset({"tool_call", "deterministic_result"})
STOPPED = frozenset({Run.Status.SUCCEEDED, Run.Status.FAILED, Run.Status.CANCELLED, Run.Status.AWAITING_APPROVAL})


def security_schemes() -> dict[str, Any]:
    """A card's ``securitySchemes``: our API key as a bearer token, described in the caller's language."""
    return {
        "apiKey": {
            "httpAuthSecurityScheme": {
                "scheme": "bearer",
                "bearerFormat": "API key",
                "description": _("Authorization: Bearer <API key> (manage.py create_api_key)"),
            }
        }
    }


class A2AError(Exception):
    """A JSON-RPC error: its A2A code, message, reason (``ErrorInfo.reason``) and our code (metadata)."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        *,
        our_code: str = "",
        http_status: int = 200,
        headers: dict[str, str] | None = None,
        metadata: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.our_code = code, reason, message, our_code
        # JSON-RPC errors travel in a 200, but a refusal to retry later is an HTTP 429 with ``Retry-After``.
        self.http_status = http_status
        self.headers = headers or {}
        self.metadata = metadata or {}

    def as_error(self) -> dict[str, Any]:
        info: dict[str, Any] = {"@type": ERROR_INFO, "reason": self.reason, "domain": "a2a-protocol.org"}
        metadata = {**({"code": self.our_code} if self.our_code else {}), **self.metadata}
        if metadata:
            info["metadata"] = metadata
        data = [info]
        if "Retry-After" in self.headers:
            data.append({"@type": RETRY_INFO, "retryDelay": f"{self.headers['Retry-After']}s"})
        return {"code": self.code, "message": self.message, "data": data}


def invalid_params(message: str, our_code: str = "invalid_input") -> A2AError:
    return A2AError(-32602, "INVALID_PARAMS", message, our_code=our_code)


# Our error codes → (JSON-RPC code, ErrorInfo reason). Anything else a service raises is invalid params.
_ERRORS: dict[str, tuple[int, str]] = {
    "run_not_found": (-32001, "TASK_NOT_FOUND"),
    "run_finished": (-32002, "TASK_NOT_CANCELABLE"),
    "run_busy": (-32002, "TASK_NOT_CANCELABLE"),
    "agent_disabled": (-32004, "UNSUPPORTED_OPERATION"),
}


# A refusal to come back later (a spent budget, a rate limit): a server-defined JSON-RPC code (A2A has none) in an
# HTTP 429 with ``Retry-After`` and a ``google.rpc.RetryInfo``, as A2A's gRPC and REST bindings say
# RESOURCE_EXHAUSTED / 429. The a2a-sdk client raises ``A2AClientError("HTTP Error 429 …")`` with the httpx error
# (and its ``Retry-After``) as its cause; a plain HTTP client sees the 429 and the header.
RESOURCE_EXHAUSTED = (-32029, "RESOURCE_EXHAUSTED")
# The stream's API key was revoked while it was open: a server-defined code (A2A has none; its other bindings say
# UNAUTHENTICATED / 401), with our ``authentication_failed`` in the metadata, as the run events API says it.
UNAUTHENTICATED = (-32030, "UNAUTHENTICATED")
# The caller may not do this (a model's write only a reviewer may approve): a server-defined code, as A2A's other
# bindings say PERMISSION_DENIED / 403; it was "invalid params", which no change of the params would fix.
PERMISSION_DENIED = (-32031, "PERMISSION_DENIED")


def a2a_error_of(exc: ApplicationError) -> A2AError:
    """Our error as an A2A error, by its HTTP status as the REST API answers it: 429 ``RESOURCE_EXHAUSTED``; a
    5xx (a secret this process cannot decrypt: 503) the server's own ``INTERNAL`` error, in the same HTTP status
    with its ``Retry-After`` (and a ``RetryInfo``), as a 429 is; 403 ``PERMISSION_DENIED``; the codes of
    ``_ERRORS``; any other refusal invalid params."""
    if exc.status == 429:
        code, reason = RESOURCE_EXHAUSTED
        # A budget's: when it resets, and whether it is used up or held by runs in flight (``agents.budgets``).
        metadata = {k: str(v) for k, v in exc.fields.items() if k in ("resets_at", "reason")}
        return A2AError(
            code, reason, exc.message, our_code=exc.code, http_status=429, headers=exc.headers, metadata=metadata
        )
    if exc.status >= 500:
        # Not the caller's input: the same request may succeed later (it read as a bad request, with no wait).
        return A2AError(-32603, "INTERNAL", exc.message, our_code=exc.code, http_status=exc.status, headers=exc.headers)
    if exc.status == 403:
        code, reason = PERMISSION_DENIED
        return A2AError(code, reason, exc.message, our_code=exc.code)
    code, reason = _ERRORS.get(exc.code, (-32602, "INVALID_PARAMS"))
    return A2AError(code, reason, exc.message, our_code=exc.code)


# --- cards -----------------------------------------------------------------------------------------------


def base_url(request: HttpRequest) -> str:
    return request.build_absolute_uri("/").rstrip("/")


@dataclass(frozen=True)
class ServedAgent:
    """What live traffic to an agent runs, as its card describes it: the system prompt and the configuration
    (servers, rules, frozen contracts) a run of it reads."""

    system_prompt: str
    configuration: RunConfiguration


def agent_served(agent: Agent) -> ServedAgent:
    """What a caller who discovers ``agent`` gets: once it is published, its live version's frozen prompt, rules
    and tools (an unpublished draft edit, a rule renamed or a server bound since, is not what its runs do, and a
    card must not announce it); never published, the agent as stored. The configuration is the one a run of it
    reads (``config_cache.described_configuration``), so the card and the runs cannot tell two stories."""
    version = agent.live_version
    if version is not None and not version.content:
        version = None
    configuration = described_configuration(agent=agent, version=version, generation=config_generation())
    return ServedAgent(system_prompt=served_system_prompt(agent), configuration=configuration)


def served_system_prompt(agent: Agent) -> str:
    """The system prompt live traffic to ``agent`` runs with (``agent_served``'s): its live version's once it is
    published, else the agent's as stored. The agent's cards and its MCP tool (``mcp_server.tool_of``) describe
    the agent by it, never by an unpublished draft."""
    version = agent.live_version
    if version is None or not version.content:
        return agent.system_prompt or ""
    return str((version.content.get("agent") or {}).get("system_prompt") or "")


def agent_card(*, agent: Agent, root: str) -> dict[str, Any]:
    """The agent's A2A card (protocol 1.0 JSON names), of what live traffic runs (``agent_served``); what it says
    in words is in the caller's language (the agent's own name and prompt as they are)."""
    served = agent_served(agent)
    return {
        "name": agent.name,
        "description": agent_description(agent, served),
        "version": "1",
        "supportedInterfaces": [
            {"url": f"{root}/a2a/{agent.slug}/", "protocolBinding": "JSONRPC", "protocolVersion": PROTOCOL_VERSION}
        ],
        "provider": {"organization": PLATFORM_NAME, "url": root},
        "capabilities": {"streaming": True, "pushNotifications": False},
        "securitySchemes": security_schemes(),
        "securityRequirements": SECURITY_REQUIREMENTS,
        "defaultInputModes": ["text/plain", "application/json"],
        "defaultOutputModes": ["text/plain", "application/json"],
        "skills": agent_skills(served)
        or [
            {
                "id": "ask",
                "name": agent.name,
                "description": _("Ask the agent '%(name)s'.") % {"name": agent.name},
                "tags": ["ask"],
            }
        ],
    }


def agent_description(agent: Agent, served: ServedAgent) -> str:
    """What an agent does, for a card: the first line of the system prompt it runs with, masked as its runs are
    (``prompt_summary``), else its name."""
    secrets = description_secrets(agent, served.configuration)
    return prompt_summary(served.system_prompt, secrets=secrets, max_chars=500) or agent.name


def description_secrets(agent: Agent, configuration: RunConfiguration) -> list[str]:
    """The secrets a run of ``agent`` with ``configuration`` is masked with (as ``agents.execution`` collects
    them: the configuration's ``server_secrets``, its servers' and the other bindings' credentials, and the agent's
    model key), for what shows its system prompt to a caller: its cards and its MCP tool. An admin may have written
    a binding's token into the prompt, which every API caller was shown. A secret this process cannot decrypt is
    not known here, so not among them (``described_configuration`` says the same of the servers')."""
    try:
        own = agent.secret_values()
    except SecretDecryptionError:
        own = []
    return [*configuration.server_secrets, *own]


def prompt_summary(prompt: str, *, secrets: list[str], max_chars: int) -> str:
    """The first line of ``prompt`` ("" for none), masked (``audit.masking.mask_text``: ``secrets``, those this
    process registered, and what looks like a credential) before it is cut to ``max_chars``: a secret cut in two is
    not found. Cut where a reader sees a boundary (``grapheme_cut``)."""
    masked = mask_text(prompt.strip(), secrets=secrets)
    return grapheme_cut(masked.splitlines()[0], max_chars) if masked else ""


def agent_skills(served: ServedAgent) -> list[dict[str, Any]]:
    """What an agent is good at, for its card: the rules its runs evaluate (keywords as tags) and the tools its
    runs may call: callable tools of its enabled servers, and of a published version only those it froze (a tool
    approved after the publish waits for the next one: ``config_cache.tools_served``, what a run may call)."""
    configuration = served.configuration
    skills: list[dict[str, Any]] = []
    for rule in configuration.rules:
        when = rule.when or {}
        tags = [str(t) for t in [*when.get("all_keywords", []), *when.get("any_keywords", [])]][:20]
        skills.append(
            {"id": f"rule-{rule.rule_id}", "name": rule.name, "description": rule.name, "tags": tags or ["rule"]}
        )
    for server, tool in tools_served(configuration.servers, configuration.contracts):
        if frozen_out_of_date(configuration.contracts, server.mcp_id, tool):
            continue  # not offered to its runs until the agent is published again (``agents.engine.tools_left_out``)
        skills.append(
            {
                "id": f"tool-{server.mcp_id}-{tool.name}",
                "name": tool.exposed_name,
                "description": inspect.cleandoc(tool.description) if tool.description else tool.exposed_name,
                "tags": ["tool", server.mcp_id],
            }
        )
    return skills


def platform_card(*, agents: list[Agent], root: str) -> dict[str, Any]:
    """A directory card: one skill per agent the key may use; ``agents`` gives each one's base and card URL. Its
    ``supportedInterfaces`` are the agents' endpoints, in the order of ``agents`` (a card needs one: a client that
    discovers the domain's card connects to the first); a key that may use one agent gets that agent's card (with
    the directory's ``agents``)."""
    if len(agents) == 1:
        return {**agent_card(agent=agents[0], root=root), "agents": _directory(agents, root)}
    return {
        "name": PLATFORM_NAME,
        "description": _(
            "The agents this API key may use; each is an A2A agent at its own base URL (its supportedInterfaces "
            "entry, in the order of skills and agents)."
        ),
        "version": "1",
        "supportedInterfaces": [
            {"url": f"{root}/a2a/{a.slug}/", "protocolBinding": "JSONRPC", "protocolVersion": PROTOCOL_VERSION}
            for a in agents
        ],
        "provider": {"organization": PLATFORM_NAME, "url": root},
        "capabilities": {"streaming": True, "pushNotifications": False},
        "securitySchemes": security_schemes(),
        "securityRequirements": SECURITY_REQUIREMENTS,
        "defaultInputModes": ["text/plain", "application/json"],
        "defaultOutputModes": ["text/plain", "application/json"],
        "skills": [
            {"id": a.slug, "name": a.name, "description": agent_description(a, agent_served(a)), "tags": ["agent"]}
            for a in agents
        ],
        "agents": _directory(agents, root),
    }


def _directory(agents: list[Agent], root: str) -> list[dict[str, Any]]:
    return [
        {
            "slug": a.slug,
            "name": a.name,
            "url": f"{root}/a2a/{a.slug}/",
            "card": f"{root}/a2a/{a.slug}/.well-known/agent-card.json",
        }
        for a in agents
    ]


@csrf_exempt  # a bearer key, no cookie: a POST is the view's 405, not a CSRF 403
async def platform_card_view(request: HttpRequest) -> HttpResponseBase:
    if request.method != "GET":
        return error_response("method_not_allowed", _("Use GET."), 405, headers={"Allow": "GET"})
    caller = await sync_to_async(caller_authenticate)(request)
    if caller.api_key is None:
        return caller.refusal  # type: ignore[return-value]
    agents = await sync_to_async(agent_list_for_key)(api_key=caller.api_key)
    root = base_url(request)
    # One agent: its card, whose skills are read from its rules and tools.
    return json_response(await sync_to_async(platform_card)(agents=agents, root=root))


@csrf_exempt  # as platform_card_view
async def agent_card_view(request: HttpRequest, slug: str) -> HttpResponseBase:
    if request.method != "GET":
        return error_response("method_not_allowed", _("Use GET."), 405, headers={"Allow": "GET"})
    caller = await sync_to_async(caller_authenticate)(request)
    if caller.api_key is None:
        return caller.refusal  # type: ignore[return-value]

    def card() -> dict[str, Any]:
        return agent_card(agent=agent_get_for_key(slug=slug, api_key=caller.api_key), root=base_url(request))  # type: ignore[arg-type]

    try:
        return json_response(await sync_to_async(card)())
    except ApplicationError as exc:
        return error_response(exc.code, exc.message, exc.status)


# --- runs as tasks ---------------------------------------------------------------------------------------


def latest_status_change() -> Subquery:
    """An annotation of runs: when the run's latest ``status`` event was written (the run's last change of state
    with an event: queued again, running, parked for approval, finished), read backwards along the event index
    ``runevent_unique_run_seq`` (run, seq); null for a run without one."""
    events = RunEvent.objects.filter(run=OuterRef("pk"), kind="status").order_by("-seq")
    return Subquery(events.values("created_at")[:1])


def status_at_expression() -> Coalesce:
    """When a run reached its state, in SQL (``ListTasks`` filters and orders by it; ``_timestamp`` says the same
    of one run): finished, else its latest ``status`` event, else started, else submitted. Not the first start:
    a task parked for input after tool calls was stamped before them, a task queued again after an approval went
    back in time, and a poller's ``statusTimestampAfter`` missed both."""
    return Coalesce("finished_at", latest_status_change(), "started_at", "created_at")


def _timestamp(run: Run) -> str:
    """When the run reached its state (``status_at_expression``): the annotation where ``ListTasks`` read it, else
    finished, else its latest ``status`` event, else started, else submitted."""
    moment = getattr(run, "status_at", None) or run.finished_at
    if moment is None and run.pk is not None:
        moment = (
            RunEvent.objects.filter(run_id=run.pk, kind="status")
            .order_by("-seq")
            .values_list("created_at", flat=True)
            .first()
        )
    return _iso(moment or run.started_at or run.created_at or datetime.now(UTC))


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _agent_message(run: Run, suffix: str, parts: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "messageId": f"{run.id}-{suffix}",
        "role": "ROLE_AGENT",
        "taskId": str(run.id),
        "contextId": context_id_of(run),
        "parts": parts,
    }


def pending_approvals(run: Run) -> list[dict[str, Any]]:
    return [
        {
            "approvalId": str(a.pk),
            "mcpId": a.mcp_id,
            "tool": a.tool,
            "args": a.args,
            "expiresAt": _iso(a.expires_at),  # in A2A's form, as its other times
        }
        for a in approvals_waiting(run)
    ]


def task_status(run: Run) -> dict[str, Any]:
    status: dict[str, Any] = {"state": TASK_STATE[Run.Status(run.status)], "timestamp": _timestamp(run)}
    if run.status == Run.Status.AWAITING_APPROVAL:
        approvals = pending_approvals(run)
        if not approvals and approvals_lapsed(run):
            return {**status, "state": "TASK_STATE_WORKING", "message": approvals_lapsed_message(run)}
        # The arguments as the admin shows them to an approver: a character that hides itself (a direction override
        # that makes ``invoice‮fdp.exe`` read ``invoiceexe.pdf``) written out, in the very text the caller decides on.
        calls = ", ".join(f"{a['tool']} {visible_text(json.dumps(a['args'], ensure_ascii=False))}" for a in approvals)
        text = (
            _(
                "Approval needed before these calls: %(calls)s. Reply on this task with a data part "
                '{"decision": "approve" or "reject", "approvalId": "...", "reason": "..."}.'
            )
            % {"calls": calls}
            + " "
            + decision_words_text()
        )
        status["message"] = _agent_message(
            run,
            f"input-{len(approvals)}",
            [{"text": text}, {"data": {"approvals": approvals}, "mediaType": "application/json"}],
        )
    elif run.status in {Run.Status.FAILED, Run.Status.CANCELLED} and run.error_code:
        error = {"code": run.error_code, "message": run.error_message}
        status["message"] = _agent_message(
            run,
            "error",
            [
                {"text": f"{run.error_code}: {error_message_text(run.error_code, run.error_message)}"},
                {"data": {"error": error}, "mediaType": "application/json"},
            ],
        )
    return status


def approvals_lapsed_message(run: Run) -> dict[str, Any]:
    """The status message of a task parked for approvals none of which may still be decided (each past its expiry,
    which the reconciler has not marked yet): it asks for nothing. It read ``input-required`` with "Approval needed
    before these calls: ." and an empty list, and an answer to it was refused as expired; the reconciler expires
    them and the run goes on without those calls, as ``POST /runs/{id}/approvals/{id}`` would find them."""
    text = _("The calls this task waited on were not approved in time; it goes on without them.")
    return _agent_message(run, "approvals-lapsed", [{"text": text}])


def approvals_lapsed(run: Run) -> bool:
    """Whether ``run``, parked for approval, waits on approvals that are all past their expiry, not yet marked by
    the reconciler (``approvals_waiting`` offers none of them): it waits for the reconciler, not for anyone's
    input, and its task is ``TASK_STATE_WORKING`` (``task_status``)."""
    pending = run.approvals.filter(status=Approval.Status.PENDING)
    return pending.exists() and not approvals_waiting(run).exists()


def input_required(run: Run) -> bool:
    """Whether ``run`` waits for a caller's decision: parked for approval, its approvals not all lapsed."""
    return run.status == Run.Status.AWAITING_APPROVAL and not approvals_lapsed(run)


def answer_artifact(run: Run) -> dict[str, Any]:
    return {"artifactId": f"{run.id}-answer", "name": "answer", "parts": [{"text": run.answer}]}


def task_of(run: Run, *, history_length: int | None = None) -> dict[str, Any]:
    """The run as an A2A ``Task``: status, the answer as an artifact, the question as history, and in
    ``metadata`` the run's id, agent, tool calls (masked) and error."""
    task: dict[str, Any] = {
        "id": str(run.id),
        "contextId": context_id_of(run),
        "status": task_status(run),
        "metadata": {
            "runId": str(run.id),
            "agent": run.agent.slug,
            "status": run.status,
            "toolCalls": run_tool_calls(run=run),
            **({"error": {"code": run.error_code, "message": run.error_message}} if run.error_code else {}),
        },
    }
    if run.status == Run.Status.SUCCEEDED:
        task["artifacts"] = [answer_artifact(run)]
    if history_length != 0:
        task["history"] = [
            {
                "messageId": f"{run.id}-query",
                "role": "ROLE_USER",
                "taskId": str(run.id),
                "contextId": context_id_of(run),
                "parts": [{"text": run.query}],
            }
        ]
    return task


# --- messages --------------------------------------------------------------------------------------------


def _rest_part(part: Any, index: int) -> dict[str, Any]:
    """The message's part number ``index`` (A2A 1.0's, or 0.3's with ``kind``) as the REST API reads it: through
    its own field (``A2APartField``), so a member no part has, or a ``filename``, ``mediaType`` or ``metadata`` of
    the wrong type, is refused here as ``POST /api/v1/runs`` refuses it (converting first to the ``kind`` shape
    dropped every member but the content, unchecked). Returns the part ``kind``-shaped; raises A2AError (-32602)
    naming what is wrong, under ``parts`` and the part's number as REST's error names it."""
    if not isinstance(part, dict):
        raise invalid_params(_("Each part must be an object."))
    if sum(1 for key in PART_CONTENTS if key in part) > 1:  # a oneof: with two, one was dropped without a word
        raise invalid_params(part_contents_message())
    if "data" in part and "text" not in part and not isinstance(part["data"], dict):
        # A2A 1.0's ``Part.data`` is any JSON value; rules and tools read an object (``{"value": ...}``).
        part = {**part, "data": {"value": part["data"]}}
    try:
        return A2APartField().to_internal_value(part)
    except ValidationError as exc:
        errors = _fields_text({"parts": {str(index): exc.detail}})
        raise invalid_params(_("The message is not valid: %(errors)s") % {"errors": errors}) from None


def an_object(value: Any) -> dict[str, Any]:
    """``value`` if it is a JSON object, else an empty one (optional members of a request)."""
    return value if isinstance(value, dict) else {}


def _fields_text(errors: Any) -> str:
    return json.dumps(errors, ensure_ascii=False)


@dataclass(frozen=True)
class Decision:
    decision: str
    approval_id: str
    reason: str


# The members of a decision's data part; any other is refused.
DECISION_KEYS = frozenset({"decision", "approvalId", "reason"})


# A text reply that decides, as the whole text (composed, trimmed, in any case, a closing full stop or the like
# left out): English and Korean words.
DECISION_WORDS = {
    "approve": "approve",
    "reject": "reject",
    "승인": "approve",
    "승인합니다": "approve",
    "거절": "reject",
    "거절합니다": "reject",
    "거부": "reject",  # the word the Korean screens decide with ("거부…", "예, 거부합니다")
    "거부합니다": "reject",
}

# What may close a text reply after its word ("승인합니다.", "승인!", "거절합니다。", "승인~"): left out before the
# lookup, as the spaces around it. Not a question mark: "승인?" asks, it does not decide.
DECISION_WORD_END = ".!。~…！．"


def decision_words_text() -> str:
    """The sentence that names the words a text reply decides with (``DECISION_WORDS``), for the prompt of an
    ``input-required`` task and the error of an answer that decides nothing."""
    return _("Or reply with one of these words as the whole text: %(words)s.") % {"words": ", ".join(DECISION_WORDS)}


def decision_of(parts: list[dict[str, Any]]) -> Decision | None:
    """A reply to ``input-required``, its parts validated (``_rest_part``, ``kind``-shaped): a data part with
    ``decision``, or a text part that is one of ``DECISION_WORDS`` (``approve``/``reject``, ``승인``/``거절``/``거부``), a
    closing ``DECISION_WORD_END`` left out."""
    for part in parts:
        if isinstance(part, dict) and isinstance(part.get("data"), dict) and "decision" in part["data"]:
            data = part["data"]
            unknown = sorted(str(key) for key in data if key not in DECISION_KEYS)
            if unknown:  # as the REST API's strict serializer refuses them: a misspelt "approval_id" decided all
                raise invalid_params(
                    _("Unknown fields in the decision: %(fields)s. Send only decision, approvalId and reason.")
                    % {"fields": ", ".join(unknown)}
                )
            for key, limit in (("decision", 20), ("approvalId", 100), ("reason", 2000)):
                # As the REST API reads a decision: text, bounded (an object was stored as Python's text of it,
                # and the audit event kept a reason of any length).
                value = data.get(key)
                if value is not None and (not isinstance(value, str) or len(value) > limit):
                    raise invalid_params(
                        _("'%(key)s' must be text of at most %(max)d characters.") % {"key": key, "max": limit}
                    )
            if data["decision"] not in ("approve", "reject"):
                # Read before anything is looked up: a decision that decides nothing ({"decision": null}, "maybe")
                # was accepted where no call was left to decide, and recorded as the messageId's answer.
                raise invalid_params(_("'decision' must be 'approve' or 'reject'."))
            return Decision(data["decision"], str(data.get("approvalId") or ""), str(data.get("reason") or ""))
    for part in parts:
        if isinstance(part, dict) and isinstance(part.get("text"), str):
            # The whole text, never a part of it: "승인합니다." decides, "승인 안 함" does not.
            word = DECISION_WORDS.get(nfc(part["text"]).strip().rstrip(DECISION_WORD_END + " \t\r\n").lower())
            if word is not None:
                return Decision(word, "", "")
    return None


def message_send(*, agent: Agent, api_key: ApiKey, params: dict[str, Any]) -> Run:
    """Start a run from a ``SendMessageRequest`` (or answer a task that waits for input). Returns the run."""
    message = params.get("message")
    if not isinstance(message, dict):
        raise invalid_params(_("'message' is required."))
    if message.get("role") not in (None, "ROLE_USER", "user", "ROLE_UNSPECIFIED"):
        raise invalid_params(_("The message's role must be ROLE_USER."))
    for field in ("messageId", "contextId", "taskId"):
        value = message.get(field)
        if value is not None and (not isinstance(value, str) or len(value) > MESSAGE_ID_MAX_CHARS):
            raise invalid_params(
                _("The message's '%(field)s' must be text of at most %(max)d characters.")
                % {"field": field, "max": MESSAGE_ID_MAX_CHARS}
            )
    parts = message.get("parts")
    if not isinstance(parts, list) or not parts:
        raise invalid_params(_("The message needs at least one part."))
    _parts_bounded(parts)
    # Every part checked, an answer's too (its bogus member, or a part with two contents, decided all the same).
    rest_parts = [_rest_part(p, i) for i, p in enumerate(parts)]
    metadata = _object_param(params, "metadata")
    context = _request_context(metadata, message)
    if message.get("taskId"):
        # The conversation the answer names, in the message or in ``metadata.context`` (they agree, above).
        named = message.get("contextId") or an_object(metadata.get("context")).get("contextId")
        return _answer_input(
            agent=agent, api_key=api_key, message=message, parts=rest_parts, context_id=str(named or "")
        )
    rest_message = {"role": "user", "parts": rest_parts}
    serializer = A2AMessageSerializer(data=rest_message)
    if not serializer.is_valid():
        raise invalid_params(_("The message is not valid: %(errors)s") % {"errors": _fields_text(serializer.errors)})
    run_input = run_input_from_message(serializer.validated_data, context=context)
    if len(nfc(run_input.query)) > settings.PLATFORM_RUN_QUERY_MAX_CHARS:  # counted composed, as it is stored
        raise invalid_params(
            _("The query is longer than %(max)d characters.") % {"max": settings.PLATFORM_RUN_QUERY_MAX_CHARS},
            "query_too_long",
        )
    message_id = str(message.get("messageId") or "")
    try:
        submission = run_submit(
            agent_slug=agent.slug,
            query=run_input.query,
            api_key=api_key,
            context=run_input.context,
            a2a_data=run_input.a2a_data,
            a2a_files=run_input.a2a_files,
            idempotency_key=_idempotency_key(message_id),
            former_key=f"a2a:{message_id}"[:200] if message_id else "",  # the key's form before 2026-12-04
            digest=request_digest({"agent": agent.slug, "message": message, "metadata": metadata}),
        )
    except ApplicationError as exc:
        if exc.code == "idempotency_key_reused":
            raise message_id_reused() from None
        raise
    return submission.run


def _parts_bounded(parts: list[Any]) -> None:
    """Refuse a message of more parts than the REST API takes (``A2AMessageSerializer``'s bound, its words), before
    any part is read: each was validated first, seconds of work for thousands of them before the refusal."""
    # The declared field itself: a serializer made for it built every field again on each message.
    field = cast(BoundedListField, A2AMessageSerializer._declared_fields["parts"])
    if field.max_length is not None and len(parts) > field.max_length:
        errors = {"parts": [str(field.error_messages["max_length"]).format(max_length=field.max_length)]}
        raise invalid_params(_("The message is not valid: %(errors)s") % {"errors": _fields_text(errors)})


def _request_context(metadata: dict[str, Any], message: dict[str, Any]) -> dict[str, Any]:
    """The run's context from a ``SendMessageRequest``'s ``metadata.context`` (``userId``, ``sessionId``…), with
    its conversation: the message's ``contextId``, else the context's own, else a new one. As the REST API reads a
    request's ``context``: one that is not an object, a ``contextId`` in it that is not text, or one that differs
    from the message's, is refused (each was dropped without a word: the run went into another conversation). A
    ``null`` one is none (``context_without_null_id``), as a message's ``null`` contextId is."""
    context = metadata.get("context")
    if context is None:
        context = {}
    if not isinstance(context, dict):
        raise invalid_params(_("'%(field)s' must be an object.") % {"field": "metadata.context"})
    context = context_without_null_id(context)
    problem = context_id_problem(context, field="metadata.context.contextId")
    if problem is not None:
        raise invalid_params(problem)
    given = message.get("contextId")
    if given is not None:
        # Blank is no conversation's id: "   " put every blank-context message of a key into one history (one
        # user's turns reached another's model), and "" was quietly replaced by a new one; REST refuses both.
        problem = context_id_problem({"contextId": given}, field="message.contextId")
        if problem is not None:
            raise invalid_params(problem)
    if given and "contextId" in context and nfc(context["contextId"]) != nfc(given):
        raise invalid_params(
            _(
                "'message.contextId' and 'metadata.context.contextId' differ: send one of them, or the same value in "
                "both."
            )
        )
    return {**context, "contextId": str(given or context.get("contextId") or uuid.uuid4())}


def message_id_reused() -> ApplicationError:
    """A messageId (the run's idempotency key) sent again with another message: told in A2A's words, since the
    caller sent no ``Idempotency-Key`` (our code stays ``idempotency_key_reused``, as the REST API's)."""
    return ApplicationError(
        _("This messageId was used with another message."), code="idempotency_key_reused", status=409
    )


def _idempotency_key(message_id: str) -> str:
    """The run's idempotency key for an A2A message id: ``a2a `` and the id (a space, which no REST
    ``Idempotency-Key`` has, keeps the two apart), or ``a2a#`` and the id's SHA-256 where it would not fit (two
    long ids never share a key by their first characters)."""
    if not message_id:
        return ""
    key = f"a2a {message_id}"
    return key if len(key) <= 200 else f"a2a#{hashlib.sha256(message_id.encode()).hexdigest()}"


# The run event that records an answer to a task waiting for input, sent with a ``messageId``: which approvals it
# decided, under the digest of the messageId and of the whole message, and the id of the API key that sent it.
ANSWER_EVENT = "approval_answer"


def _answer_input(
    *, agent: Agent, api_key: ApiKey, message: dict[str, Any], parts: list[dict[str, Any]], context_id: str
) -> Run:
    """Decide the approvals the task ``message`` answers waits for (``decision_of`` of its validated ``parts``: the
    one it names, else every pending one), as ``POST /runs/{id}/approvals/{id}`` decides one. ``context_id``: the
    conversation it names (its own or its ``metadata.context``'s), which must be the task's. Returns the run.

    All of them or none: one transaction, the run's row locked first (as every decision and expiry locks it), so
    that a refused one (decided meanwhile, expired, or a model's write the caller may not approve) leaves every
    other undecided and the run parked, never approved in part and queued again without it. An expired one is
    left for the reconciler to expire (its expiry is undone with the rest). Where nothing is waiting any more because
    every pending one is past its expiry (the sweep has not run yet), they are decided as the REST API decides
    them (``_expire_due``): expired, the run resumed, and the answer refused as REST's 409 is; nothing is recorded.

    With a ``messageId``, the answer is recorded (``ANSWER_EVENT``) in that transaction, and the same messageId
    from the same key again (a client's retry) returns the task as it is now and decides nothing: not "the task
    is not waiting" while the first answer was applied, and never what is pending by then, a call the person who
    answered never saw. Another message under that messageId is refused, as a new message's is."""
    run = run_get(run_id=str(message["taskId"]), api_key=api_key)
    if run.agent_id != agent.pk:
        raise ApplicationError(_("Run not found."), code="run_not_found", status=404)
    if context_id and not same_context(context_id, run):  # A2A §3.4.3: a message names its task's own context
        raise invalid_params(
            _("The message's contextId is not the task's (%(context)s).") % {"context": context_id_of(run)},
            "context_mismatch",
        )
    message_id = str(message.get("messageId") or "")
    answer = {
        "caller_id": api_key.pk,
        "message_id_sha256": hashlib.sha256(message_id.encode()).hexdigest(),
        "message_sha256": request_digest({"agent": agent.slug, "message": message}),
    }
    with transaction.atomic():
        run_row_lock(run.pk)
        run.refresh_from_db()
        if message_id and _answered_before(run=run, answer=answer):
            return run
        targets, decision = _answer_targets(run=run, parts=parts)
        refusal = None if targets else _expire_due(run=run, decision=decision, actor=f"api_key:{api_key.prefix}")
        for approval_id in targets:
            try:
                approval_decide(
                    run=run,
                    approval_id=approval_id,
                    decision=decision.decision,
                    actor=f"api_key:{api_key.prefix}",
                    reason=decision.reason,
                    by_caller=True,
                )
            except ApplicationError as exc:  # raised out of the transaction: the decisions before it are undone
                if len(targets) == 1:
                    raise
                raise ApplicationError(
                    _("Nothing was decided: the call %(approval_id)s was refused: %(message)s")
                    % {"approval_id": approval_id, "message": exc.message},
                    code=exc.code,
                    status=exc.status,
                ) from None
        if message_id and targets:  # an answer that decided nothing is no answer a retry should find
            decided = {"decision": decision.decision, "approval_ids": targets}
            RunEventWriter(run_id=run.pk, secrets=[]).emit(ANSWER_EVENT, {**answer, **decided})
    if refusal is not None:  # raised once the expiries are stored, as the REST API's 409 leaves them
        raise refusal
    run.refresh_from_db()
    return run


def _expire_due(*, run: Run, decision: Decision, actor: str) -> ApplicationError | A2AError:
    """An answer to a task none of whose approvals waits any more (each pending one past its expiry, which the
    periodic sweep has not marked yet; the run's row locked): each is decided through ``approval_decide``, as
    ``POST /runs/{id}/approvals/{id}`` decides it, which expires it and resumes the run (the model is told the call
    was not made). Returns the refusal to answer with, the REST API's (409 ``approval_expired``); the caller raises
    it once the transaction has stored the expiries (raised inside it, they were undone, and the answer was a
    success that decided nothing). A task with no pending approval at all is not waiting for input."""
    due = run.approvals.filter(status=Approval.Status.PENDING).order_by("created_at").values_list("pk", flat=True)
    refusal: ApplicationError | None = None
    for approval_id in due:
        try:
            approval_decide(
                run=run,
                approval_id=str(approval_id),
                decision=decision.decision,
                actor=actor,
                reason=decision.reason,
                by_caller=True,
            )
        except ApplicationError as exc:
            refusal = refusal or exc
    if refusal is None:
        return invalid_params(_("The task is not waiting for input."), "run_not_waiting")
    return refusal


def _answered_before(*, run: Run, answer: dict[str, Any]) -> bool:
    """Whether ``answer``'s messageId (from its key) already answered ``run``: True for the same message (a retry,
    which decides nothing); another message under that id is refused (409 ``idempotency_key_reused``)."""
    earlier = (
        RunEvent.objects.filter(
            run_id=run.pk,
            kind=ANSWER_EVENT,
            data__caller_id=answer["caller_id"],
            data__message_id_sha256=answer["message_id_sha256"],
        )
        .values_list("data", flat=True)
        .first()
    )
    if earlier is None:
        return False
    if earlier.get("message_sha256") != answer["message_sha256"]:
        raise message_id_reused()
    return True


def _answer_targets(*, run: Run, parts: list[dict[str, Any]]) -> tuple[list[str], Decision]:
    """The approvals an answer decides (the one it names, else every pending one) and its decision; refuses an
    answer to a task not waiting for input, or one that decides nothing."""
    if run.status != Run.Status.AWAITING_APPROVAL:
        if run.is_finished:
            raise A2AError(
                -32004,
                "UNSUPPORTED_OPERATION",
                _("The task has finished; send a new message (with the same contextId to stay in the conversation)."),
                our_code="run_finished",
            )
        raise invalid_params(_("The task is not waiting for input."), "run_not_waiting")
    decision = decision_of(parts)
    if decision is None:
        raise invalid_params(
            _('Answer with a data part {"decision": "approve" or "reject", "approvalId": "..."}.')
            + " "
            + decision_words_text(),
            "decision_missing",
        )
    if decision.approval_id:
        return [decision.approval_id], decision
    return [a["approvalId"] for a in pending_approvals(run)], decision


# --- streams ---------------------------------------------------------------------------------------------


class TaskFeed:
    """A run's progress as A2A stream responses, one JSON-RPC response per SSE event: the task first, then
    ``statusUpdate`` for each status change and tool call, ``artifactUpdate`` with the answer, and the final
    status; the stream ends when the task finishes or asks for input, or after ``PLATFORM_SSE_MAX_S``, or with a
    JSON-RPC error once its key is found revoked or no longer allowed to read the task (``recheck``, set by the
    view that holds the stream's slot)."""

    def __init__(self, *, run: Run, rpc_id: Any, after: int, send_task: bool = True) -> None:
        self.run_id = run.pk
        self.rpc_id = rpc_id
        self.recheck: KeyRecheck | None = None
        self.language = translation.get_language()  # the caller's (the stream outlives the request's translation)
        self.last_seq = after
        self.send_task = send_task
        # What the stream's results are masked with (``served``), read with its first event.
        self.secrets: list[str] | None = None
        self.deadline = time.monotonic() + float(api_setting("PLATFORM_SSE_MAX_S"))
        self.last_sent = time.monotonic()
        self.keepalive_s = float(api_setting("PLATFORM_SSE_KEEPALIVE_S"))

    def _event(self, result: dict[str, Any]) -> str:
        self.last_sent = time.monotonic()
        if self.secrets is None:
            self.secrets = shown_secrets()
        shown = mask_known(result, secrets=self.secrets)
        return f"data: {dumps({'jsonrpc': '2.0', 'id': self.rpc_id, 'result': shown})}\n\n"

    def _status_update(self, run: Run, status: dict[str, Any]) -> str:
        return self._event({"statusUpdate": {"taskId": str(run.id), "contextId": context_id_of(run), "status": status}})

    def poll(self) -> tuple[list[str], PollState]:
        with translation.override(self.language):
            try:
                loss = self.recheck.lost() if self.recheck is not None else None
                if loss is not None:
                    return [closing_event(self.rpc_id, loss)], "done"
                return self._poll()
            except Exception:  # the stream ends with an answer, as ``TaskWait``'s; the task is not the client's to lose
                logger.exception("A2A stream: reading run %s failed", self.run_id)
                return [internal_error_event(self.rpc_id, self.run_id)], "done"

    def _poll(self) -> tuple[list[str], PollState]:
        chunks: list[str] = []
        if self.send_task:
            self.send_task = False
            run, shown_seq = _run_with_last_seq(self.run_id)
            # After the task, only what came after it: its state and its tool calls (``metadata.toolCalls``) are in
            # it already, and an older event sent after it took the task back in time (an answer's own "queued",
            # SUBMITTED, after a task the worker had taken meanwhile, WORKING).
            self.last_seq = max(self.last_seq, shown_seq)
            chunks.append(self._event({"task": task_of(run)}))
        else:
            run = Run.objects.select_related("agent").get(pk=self.run_id)
        # Asked before the events are read, as the REST event stream asks it: a run cancelled while it ran reads
        # cancelled at once, and its worker records the call it was making (a write, perhaps) and its end later.
        ended = task_stopped(run)
        events = run_events_after(run_id=run.pk, after=self.last_seq, limit=200)
        for event in events:
            self.last_seq = event.seq
            if event.kind in TOOL_EVENTS:
                call = readable_call(event.data)
                progress = {
                    "state": "TASK_STATE_WORKING",
                    "timestamp": _iso(event.created_at),  # when this call ended, not when the run did
                    "message": _agent_message(
                        run,
                        f"event-{event.seq}",
                        [{"text": tool_progress_text(run, call)}, {"data": {"toolCall": call}}],
                    ),
                }
                chunks.append(self._status_update(run, progress))
            elif event.kind == "status" and event.data.get("status") in {"running", "queued"}:
                state = "TASK_STATE_WORKING" if event.data["status"] == "running" else "TASK_STATE_SUBMITTED"
                chunks.append(self._status_update(run, {"state": state, "timestamp": _iso(event.created_at)}))
        if len(events) == 200:
            return chunks, "wait"
        if ended:
            if run.status == Run.Status.SUCCEEDED:
                chunks.append(
                    self._event(
                        {
                            "artifactUpdate": {
                                "taskId": str(run.id),
                                "contextId": context_id_of(run),
                                "artifact": answer_artifact(run),
                                "lastChunk": True,
                            }
                        }
                    )
                )
            chunks.append(self._status_update(run, task_status(run)))
            return chunks, "done"
        if time.monotonic() >= self.deadline:
            return chunks, "done"
        if not chunks and time.monotonic() - self.last_sent >= self.keepalive_s:
            self.last_sent = time.monotonic()
            chunks.append(": keep-alive\n\n")
        return chunks, "wait"


def served(result: Any) -> Any:
    """A method's result (a task, a list of them) as it is answered: masked again with the credentials bound now
    (``shown_secrets``). A run's records were masked with those known when they were written; a value bound as a
    secret since (a token the caller typed, then given to a server) was in none of them. A stream's results are
    masked as each is sent (``TaskFeed``)."""
    return mask_known(result, secrets=shown_secrets()) if isinstance(result, dict) else result


def task_stopped(run: Run) -> bool:
    """Whether the task of ``run`` (as just read) has stopped, for an A2A stream or a blocking ``SendMessage``:
    ``run_stopped``, where a run parked for approval stops only while one may still be decided (``input_required``):
    one parked on approvals past their expiry goes on once the reconciler marks them, and its stream follows it
    there rather than end on a ``TASK_STATE_WORKING`` it was about to leave."""
    if run.status == Run.Status.AWAITING_APPROVAL:
        return input_required(run)
    return run_stopped(run)


def run_stopped(run: Run) -> bool:
    """Whether ``run`` (as just read) has stopped, its events all written: finished or asking for input, and, where
    it was cancelled while it ran, its worker's end recorded (``run_end_recorded``: the call it was making, which
    may have written something, comes first; bounded by the worker's hard time limit)."""
    if run.status not in STOPPED:
        return False
    return run.status != Run.Status.CANCELLED or run_end_recorded(run_id=run.pk)


# The members of a tool call's event a calling agent's model reads as text: the tool and its arguments (a direction
# override in an argument read reversed), a value, a tool's error text, a message.
READABLE_CALL_KEYS = ("tool", "args", "value", "tool_error_text", "message")


def readable_value(value: Any) -> Any:
    """``value`` with each string in it (keys too, at any depth) as ``readable_text`` writes it: a character that
    does not show itself (a tag character, a zero-width space) written out, as the answer writes it."""
    return strings_mapped(value, readable_text)


def readable_call(call: dict[str, Any]) -> dict[str, Any]:
    """A tool call's run event as an A2A message carries it to the caller (an agent whose model reads it): its value,
    error text and message ``readable_value``; the run's events and the audit keep them as they came."""
    return {key: readable_value(item) if key in READABLE_CALL_KEYS else item for key, item in call.items()}


def last_seq_of(run: Run) -> int:
    return int(run.events.order_by("-seq").values_list("seq", flat=True).first() or 0)


def _run_with_last_seq(run_id: Any) -> tuple[Run, int]:
    """The run and the seq of its latest event, read in one statement, so both are of the same moment (on
    PostgreSQL two statements may each see another commit): every event up to that seq is in the run as read."""
    latest = RunEvent.objects.filter(run=OuterRef("pk")).order_by("-seq").values("seq")[:1]
    run = Run.objects.select_related("agent").annotate(shown_seq=Subquery(latest)).get(pk=run_id)
    return run, int(getattr(run, "shown_seq", None) or 0)


def closing_event(rpc_id: Any, loss: StreamLoss) -> str:
    """The last response of a stream, or of a blocking ``SendMessage``'s wait, once its key recheck ends it: the
    error a request of the key would get now (``UNAUTHENTICATED`` for a revoked key; ``TASK_NOT_FOUND``, as
    ``GetTask`` answers, for a task it may no longer read)."""
    if loss == "revoked":
        code, reason = UNAUTHENTICATED
        error = A2AError(code, reason, revoked_message(), our_code="authentication_failed")
    else:
        code, reason = _ERRORS["run_not_found"]
        error = A2AError(code, reason, run_unreadable_message(), our_code="run_not_found")
    return f"data: {dumps(_rpc_error(rpc_id, error))}\n\n"


def internal_error_event(rpc_id: Any, run_id: Any) -> str:
    """The last response of a stream, or of a blocking ``SendMessage``'s wait, that failed to read its task (the
    database hiccups): an ``INTERNAL`` error naming the task, which goes on (the client reads it with ``GetTask``
    or subscribes again, rather than sending its message again)."""
    message = _("Internal error while waiting for the task; it goes on: GetTask %(task_id)s") % {"task_id": run_id}
    error = A2AError(-32603, "INTERNAL", message, metadata={"taskId": str(run_id)})
    return f"data: {dumps(_rpc_error(rpc_id, error))}\n\n"


# --- JSON-RPC --------------------------------------------------------------------------------------------


@dataclass
class Stream:
    """A method's answer that is a stream: the feed to pace."""

    feed: TaskFeed


def _task_id(params: dict[str, Any]) -> str:
    task_id = params.get("id")
    if not isinstance(task_id, str) or not task_id:
        raise invalid_params(_("'id' (the task's id) is required."))
    return task_id


def _own_run(*, agent: Agent, api_key: ApiKey, task_id: str) -> Run:
    run = run_get(run_id=task_id, api_key=api_key)
    if run.agent_id != agent.pk:
        raise ApplicationError(_("Run not found."), code="run_not_found", status=404)
    return run


LIST_PAGE_SIZE, LIST_PAGE_MAX = 50, 100


def tasks_list(*, agent: Agent, api_key: ApiKey, params: dict[str, Any]) -> dict[str, Any]:
    """``ListTasks``: the key's tasks of this agent, the latest status change first (A2A 1.0): filtered by
    ``contextId``, ``status`` (a ``TASK_STATE_*``) and ``statusTimestampAfter``; ``pageSize`` (1–100, 50) and the
    ``nextPageToken`` of the page before (a cursor: the last task's status time and id); ``totalSize`` counts every
    task the filters keep; artifacts only with ``includeArtifacts``, history only as ``historyLength`` asks (none
    by default)."""
    runs = (
        Run.objects.select_related("agent")
        .filter(api_key=api_key, agent=agent)
        .annotate(status_at=status_at_expression())
    )
    context_id = params.get("contextId")
    if context_id is not None:
        if (
            not isinstance(context_id, str) or not context_id.strip() or len(nfc(context_id)) > MESSAGE_ID_MAX_CHARS
        ):  # {"a": 1} found nothing, and "" found the tasks of every blank-context message
            raise invalid_params(
                _("'%(key)s' must be text of at most %(max)d characters.")
                % {"key": "contextId", "max": MESSAGE_ID_MAX_CHARS}
            )
        runs = runs.filter(in_context(runs, context_id))
    state = params.get("status")
    if state not in (None, "", "TASK_STATE_UNSPECIFIED"):
        if state not in A2A_TASK_STATES:
            raise invalid_params(_("'status' must be one of: %(states)s.") % {"states": ", ".join(A2A_TASK_STATES)})
        # A state A2A has that no run is ever in (TASK_STATE_REJECTED, TASK_STATE_AUTH_REQUIRED): no task, not an
        # error (a client that asks for each state in turn was refused one).
        runs = runs.filter(task_state_filter(state))
    if params.get("statusTimestampAfter") is not None:  # at or after, as the A2A SDK's task store reads it
        runs = runs.filter(status_at__gte=_timestamp_param(params["statusTimestampAfter"], "statusTimestampAfter"))
    size = LIST_PAGE_SIZE if params.get("pageSize") is None else params["pageSize"]
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= LIST_PAGE_MAX:
        raise invalid_params(_("'pageSize' must be a whole number from 1 to %(max)d.") % {"max": LIST_PAGE_MAX})
    include_artifacts = _flag_param(params, "includeArtifacts")
    total = runs.count()
    ordered = runs.order_by("-status_at", "-id")
    if params.get("pageToken"):
        at, last_id = _page_cursor(params["pageToken"])
        ordered = ordered.filter(Q(status_at__lt=at) | Q(status_at=at, id__lt=last_id))
    page = list(ordered[: size + 1])
    more, page = len(page) > size, page[:size]
    history = _history_length(params)
    tasks = []
    for run in page:
        task = task_of(run, history_length=0 if history is None else history)
        if not include_artifacts:
            task.pop("artifacts", None)
        tasks.append(task)
    token = _page_token(page[-1]) if more and page else ""
    return {"tasks": tasks, "nextPageToken": token, "pageSize": size, "totalSize": total}


def task_state_filter(state: str) -> Q:
    """The runs whose task is in ``state`` (a ``TASK_STATE_*``), as ``task_status`` tells it: a run parked for
    approval is ``TASK_STATE_INPUT_REQUIRED``, but ``TASK_STATE_WORKING`` where its approvals all lapsed
    (``approvals_lapsed``)."""
    pending = Approval.objects.filter(run=OuterRef("pk"), status=Approval.Status.PENDING)
    waiting = pending.filter(Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now()))
    parked = Run.Status.AWAITING_APPROVAL
    lapsed = Q(Exists(pending), ~Exists(waiting), status=parked)
    statuses = Q(status__in=[s for s, name in TASK_STATE.items() if name == state and s != parked])
    if state == "TASK_STATE_INPUT_REQUIRED":
        return Q(status=parked) & ~lapsed
    if state == "TASK_STATE_WORKING":
        return statuses | lapsed
    return statuses


def _in_utc(moment: datetime) -> datetime:
    """``moment`` in UTC (a naive one taken as UTC). Raises OverflowError for one whose UTC time is outside years
    1–9999 (``0001-01-01T00:00:00+01:00``), which the database layer would fail to convert."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _timestamp_param(value: Any, name: str) -> datetime:
    try:
        moment = parse_datetime(value) if isinstance(value, str) else None
        if moment is not None:
            return _in_utc(moment)
    except (ValueError, OverflowError):  # well formed, no date ("2024-13-45T00:00:00Z"), or out of range in UTC
        pass
    raise invalid_params(_("'%(name)s' must be a timestamp (RFC 3339).") % {"name": name})


def _page_token(run: Run) -> str:
    cursor = f"{run.status_at.astimezone(UTC).isoformat()}|{run.id}"  # type: ignore[attr-defined]
    return base64.urlsafe_b64encode(cursor.encode()).decode().rstrip("=")


def _page_cursor(token: Any) -> tuple[datetime, uuid.UUID]:
    try:
        at, last_id = base64.urlsafe_b64decode(str(token) + "=" * (-len(str(token)) % 4)).decode().split("|")
        moment = parse_datetime(at)
        if moment is None:
            raise ValueError(at)
        return _in_utc(moment), uuid.UUID(last_id)
    except (ValueError, OverflowError, UnicodeDecodeError):
        raise invalid_params(_("'pageToken' is not one this server gave.")) from None


def _flag_param(params: dict[str, Any], name: str) -> bool:
    """A boolean member of ``params``: absent (or null) is false; anything but true or false ("false", "yes", 1)
    is refused, as A2A's own JSON binding refuses it, not read as one or the other."""
    value = params.get(name)
    if value is not None and not isinstance(value, bool):
        raise invalid_params(_("'%(name)s' must be true or false.") % {"name": name})
    return bool(value)


def _object_param(params: dict[str, Any], name: str) -> dict[str, Any]:
    """An object member of ``params`` (``configuration``, ``metadata``): absent (or null) is an empty one; anything
    else (a list, a string) is refused: what it asked for was silently not done."""
    value = params.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise invalid_params(_("'%(field)s' must be an object.") % {"field": name})
    return value


def _history_length(params: dict[str, Any]) -> int | None:
    """``historyLength``: absent (the whole history), or a whole number 0 or more; anything else (-1, "3", 1.5)
    is refused, not taken for absent."""
    value = params.get("historyLength")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise invalid_params(_("'historyLength' must be a whole number, 0 or more."))
    return value


# A message's ids (messageId, contextId, taskId) are text of at most this many characters.
MESSAGE_ID_MAX_CHARS = 200
# A request's string id: at most this many characters (as the MCP server's; its message names the number).
RPC_ID_MAX_CHARS = 200

# The methods that answer with an event stream (``rpc_call`` returns a ``Stream`` for them, and only for them).
_STREAMING = frozenset({"SendStreamingMessage", "SubscribeToTask"})


def rpc_call(*, agent: Agent, api_key: ApiKey, method: str, params: dict[str, Any], rpc_id: Any) -> Any:
    """One JSON-RPC call (sync: it reads and writes the database). Returns the result, a ``Stream``, or a
    ``("wait", run, history_length)`` tuple for a blocking ``SendMessage`` (the view waits without holding a thread).
    Raises A2AError or ApplicationError."""
    if method == "SendMessage":
        configuration = _object_param(params, "configuration")
        history_length = _history_length(configuration)  # refused before the run exists, never after
        return_immediately = _flag_param(configuration, "returnImmediately")  # "false" is no yes
        run = message_send(agent=agent, api_key=api_key, params=params)
        if return_immediately or run.status in STOPPED:
            return {"task": task_of(run, history_length=history_length)}
        return ("wait", run, history_length)
    if method == "SendStreamingMessage":
        _object_param(params, "configuration")  # as SendMessage reads it: a list is refused, not ignored
        before = 0
        message = an_object(params.get("message"))
        if message.get("taskId"):  # answering input: follow the task from where it is now
            before = last_seq_of(_own_run(agent=agent, api_key=api_key, task_id=str(message["taskId"])))
        run = message_send(agent=agent, api_key=api_key, params=params)
        return Stream(TaskFeed(run=run, rpc_id=rpc_id, after=before))
    if method == "SubscribeToTask":
        run = _own_run(agent=agent, api_key=api_key, task_id=_task_id(params))
        if run.is_finished:
            raise A2AError(-32004, "UNSUPPORTED_OPERATION", _("The task has finished."), our_code="run_finished")
        return Stream(TaskFeed(run=run, rpc_id=rpc_id, after=last_seq_of(run)))
    if method == "GetTask":
        run = _own_run(agent=agent, api_key=api_key, task_id=_task_id(params))
        return task_of(run, history_length=_history_length(params))
    if method == "CancelTask":
        run = _own_run(agent=agent, api_key=api_key, task_id=_task_id(params))
        run = run_cancel(run=run, actor=f"api_key:{api_key.prefix}", source="api")
        return task_of(run)
    if method == "ListTasks":
        return tasks_list(agent=agent, api_key=api_key, params=params)
    if "PushNotification" in method:
        raise A2AError(-32003, "PUSH_NOTIFICATION_NOT_SUPPORTED", _("Push notifications are not supported."))
    if method == "GetExtendedAgentCard":
        raise A2AError(-32007, "EXTENDED_AGENT_CARD_NOT_CONFIGURED", _("There is no extended agent card."))
    raise A2AError(-32601, "METHOD_NOT_FOUND", _("Method not found: %(method)s") % {"method": method})


def streams_busy_error() -> A2AError:
    """The key's stream slots are all taken: ``too_many_streams`` (its words and ``Retry-After``, one refusal for
    every protocol) as a JSON-RPC error, answered as a spent budget is (``RESOURCE_EXHAUSTED`` in an HTTP 429 with
    ``Retry-After``): an A2A client reads JSON-RPC, not the REST API's error body."""
    refusal = too_many_streams()
    busy = json.loads(refusal.content)["error"]
    code, reason = RESOURCE_EXHAUSTED
    headers = {"Retry-After": refusal["Retry-After"]}
    return A2AError(code, reason, busy["message"], our_code=busy["code"], http_status=429, headers=headers)


def throttled_error(wait: float) -> A2AError:
    """The key is over its rate limit: the REST API's ``throttled`` (its words and ``Retry-After``) as a JSON-RPC
    error, answered as a spent budget and busy stream slots are (``RESOURCE_EXHAUSTED`` in an HTTP 429 with
    ``Retry-After``), as the MCP server answers it in JSON-RPC too: the REST error body had no ``jsonrpc`` or
    ``id`` for an A2A client to read."""
    code, reason = RESOURCE_EXHAUSTED
    return A2AError(
        code, reason, throttled_message(wait), our_code="throttled", http_status=429, headers=retry_after(wait)
    )


def utf8_refusal() -> A2AError:
    """A body said to be in a charset other than UTF-8 (``charset_is_utf8``): refused with a 415, as the REST API
    and the MCP server refuse it, before it is read (it was read as UTF-8 all the same)."""
    return A2AError(-32600, "INVALID_REQUEST", _("Send the message as application/json in UTF-8."), http_status=415)


def _rpc_error(rpc_id: Any, error: A2AError) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rpc_id, "error": error.as_error()}


def _guarded(call: Callable[[], Any]) -> tuple[Any, A2AError | None]:
    """The call's result, or its A2A error: ours mapped, anything unexpected an opaque -32603 (logged)."""
    try:
        return call(), None
    except A2AError as exc:
        return None, exc
    except ApplicationError as exc:
        return None, a2a_error_of(exc)
    except Exception:
        logger.exception("A2A call failed")
        return None, A2AError(-32603, "INTERNAL", _("Internal error."))


def _parse_request(request: HttpRequest) -> tuple[Any, str, dict[str, Any]] | dict[str, Any]:
    """``(id, method, params)``, or the JSON-RPC error answer for a body that is not a request."""
    try:
        body = rpc_body(request)
    except exceptions.ParseError as exc:
        return _rpc_error(None, A2AError(-32700, "PARSE_ERROR", str(exc.detail)))
    if not isinstance(body, dict):
        return _rpc_error(None, A2AError(-32600, "INVALID_REQUEST", _("Send one JSON-RPC request object.")))
    if "id" not in body:
        # A notification (JSON-RPC: no answer is owed, so none could carry a task's id): every A2A method is a
        # request, and nothing is done for one sent as a notification.
        return _rpc_error(
            None, A2AError(-32600, "INVALID_REQUEST", _("Give the request an 'id': A2A has no notifications."))
        )
    rpc_id = body.get("id")
    if (
        isinstance(rpc_id, bool)
        or not isinstance(rpc_id, str | int | type(None))
        or (isinstance(rpc_id, str) and len(rpc_id) > RPC_ID_MAX_CHARS)
    ):
        # Not an id a client could match the answer to (JSON-RPC: a string, an integer or null), or one too long to
        # echo (it is in every event of a stream), as the MCP server bounds it: nothing is done.
        message = _("The request's 'id' must be a string (at most 200 characters) or an integer.")
        return _rpc_error(None, A2AError(-32600, "INVALID_REQUEST", message))
    if body.get("jsonrpc") != "2.0" or not isinstance(body.get("method"), str):
        return _rpc_error(rpc_id, A2AError(-32600, "INVALID_REQUEST", _("Expected a JSON-RPC 2.0 request.")))
    params = body.get("params", {})
    if not isinstance(params, dict):
        return _rpc_error(rpc_id, invalid_params(_("'params' must be an object.")))
    return rpc_id, body["method"], params


@csrf_exempt
async def rpc_view(request: HttpRequest, slug: str) -> HttpResponseBase:
    if request.method == "GET":
        return error_response(
            "method_not_allowed",
            _("POST JSON-RPC here; the agent's card is at .well-known/agent-card.json."),
            405,
            headers={"Allow": "POST"},
        )
    if request.method != "POST":
        return error_response("method_not_allowed", _("Use POST."), 405, headers={"Allow": "POST"})
    # Counted here, as the MCP server counts it, so that a request over the key's rate limit is answered in
    # JSON-RPC (``throttled_error``), under the request's own id where its body has one.
    caller = await sync_to_async(caller_authenticate)(request, counted=False)
    if caller.api_key is None:
        return caller.refusal  # type: ignore[return-value]
    api_key = caller.api_key
    utf8 = charset_is_utf8(request)
    wait = await sync_to_async(api_key_rate_check)(api_key)
    if wait is not None:
        throttled = throttled_error(wait)
        parsed = _parse_request(request) if utf8 else None
        rpc_id = parsed[0] if isinstance(parsed, tuple) else None
        return json_response(_rpc_error(rpc_id, throttled), status=throttled.http_status, headers=throttled.headers)
    try:
        agent = await sync_to_async(agent_get_for_key)(slug=slug, api_key=api_key)
    except ApplicationError as exc:
        return error_response(exc.code, exc.message, exc.status)
    if not utf8:
        refused = utf8_refusal()
        return json_response(_rpc_error(None, refused), status=refused.http_status)
    version = request.headers.get("A2A-Version", "").strip()
    parsed = _parse_request(request)
    if isinstance(parsed, dict):
        return json_response(parsed)
    rpc_id, method, params = parsed
    # A2A §3.6.2: no header means 0.3; a 0.3 method name (message/send, tasks/get) is a 0.3 client's, told so.
    if (version and not version.startswith("1.")) or (not version and "/" in method):
        unsupported = A2AError(-32009, "VERSION_NOT_SUPPORTED", _("This server speaks A2A 1.0."), our_code="version")
        return json_response(_rpc_error(rpc_id, unsupported))
    slot = None
    if method in _STREAMING:
        # The stream's slot first: a refused stream must not have submitted its message (a run, an approval's
        # decision) already, or a client that retries after Retry-After would send it twice.
        slot = await sync_to_async(stream_slot_take)(api_key)
        if slot is None:
            busy = streams_busy_error()
            return json_response(_rpc_error(rpc_id, busy), status=busy.http_status, headers=busy.headers)
    try:
        result, error = await sync_to_async(_guarded)(
            lambda: served(rpc_call(agent=agent, api_key=api_key, method=method, params=params, rpc_id=rpc_id))
        )
    except BaseException:  # cancelled (the client went away) or stopping: the slot is not held for its lease
        if slot is not None:
            await asyncio.shield(sync_to_async(stream_slot_release)(slot))
        raise
    if slot is not None and (error is not None or not isinstance(result, Stream)):
        await sync_to_async(stream_slot_release)(slot)
        slot = None
    if error is not None:
        return json_response(_rpc_error(rpc_id, error), status=error.http_status, headers=error.headers)
    if isinstance(result, Stream) and slot is not None:
        result.feed.recheck = KeyRecheck(api_key, slot, run_id=result.feed.run_id)
        poll = result.feed.poll
        stream = slot_stream(request, poll, slot)
        response = StreamingHttpResponse(stream, content_type="text/event-stream; charset=utf-8")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"
        return response
    if isinstance(result, tuple):
        # Every error that can be told by its HTTP status was found above; the wait's answer is a 200 whose body
        # starts at once (JSON's whitespace until the task is ready: ``json_body``).
        _wait, run, history_length = result
        recheck = KeyRecheck(api_key, None, run_id=run.pk)  # no slot: a blocking SendMessage holds none
        poll = json_body(TaskWait(run=run, rpc_id=rpc_id, history_length=history_length, recheck=recheck).poll)
        body = paced_async(poll, None) if isinstance(request, ASGIRequest) else paced_sync(poll, None)
        response = StreamingHttpResponse(body, content_type="application/json")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"
        return response
    return json_response({"jsonrpc": "2.0", "id": rpc_id, "result": result})


class TaskWait:
    """A blocking ``SendMessage``'s wait, as an event stream that ``json_body`` turns into a JSON body: a
    keep-alive every ``PLATFORM_SSE_KEEPALIVE_S`` (a space in the body; the SDK client's httpx gives up after 5 s
    without a byte, before it learnt the task's id), then one JSON-RPC response once the run stops or
    ``PLATFORM_API_MAX_WAIT_S`` has passed: the task (the run as it is then), or, where reading it fails, an
    ``INTERNAL`` error naming the task, which goes on (the response's 200 was sent with its first space). A client
    that leaves meanwhile leaves the task to go on, as ``returnImmediately`` would.

    Its key is checked again as a stream's is (``recheck``, every ``PLATFORM_SSE_AUTH_RECHECK_S``), and once more
    before the task is sent: a key revoked (or taken off the agent) while it waited gets the error a stream would
    end with (``closing_event``), never the task's answer; the task goes on."""

    def __init__(self, *, run: Run, rpc_id: Any, history_length: int | None, recheck: KeyRecheck | None = None) -> None:
        self.run_id = run.pk
        self.rpc_id = rpc_id
        self.history_length = history_length
        self.recheck = recheck
        self.language = translation.get_language()  # the caller's (the body outlives the request's translation)
        self.deadline = time.monotonic() + float(api_setting("PLATFORM_API_MAX_WAIT_S"))
        self.keepalive_s = float(api_setting("PLATFORM_SSE_KEEPALIVE_S"))
        self.last_sent = time.monotonic()

    def poll(self) -> tuple[list[str], PollState]:
        with translation.override(self.language):
            try:
                loss = self.recheck.lost() if self.recheck is not None else None
                if loss is not None:
                    return [closing_event(self.rpc_id, loss)], "done"
                run = Run.objects.select_related("agent").get(pk=self.run_id)
                if task_stopped(run) or time.monotonic() >= self.deadline:
                    loss = self._loss_before_answer()
                    if loss is not None:
                        return [closing_event(self.rpc_id, loss)], "done"
                    task = task_of(run, history_length=self.history_length)
                    answer = {"jsonrpc": "2.0", "id": self.rpc_id, "result": served({"task": task})}
                    return [f"data: {dumps(answer)}\n\n"], "done"
            except Exception:  # answered as an error; the task is not the client's to lose
                logger.exception("A2A SendMessage: reading run %s failed", self.run_id)
                return [internal_error_event(self.rpc_id, self.run_id)], "done"
        if time.monotonic() - self.last_sent >= self.keepalive_s:
            self.last_sent = time.monotonic()
            return [": keep-alive\n\n"], "wait"
        return [], "wait"

    def _loss_before_answer(self) -> StreamLoss | None:
        """Why the task must not be sent now, asked whatever the recheck's interval (the questions and their order
        of ``KeyRecheck.lost``): the answer is sent whole, at once, so a key revoked a moment before it must not get
        it, as a stream would have sent it nothing more after its next check."""
        if self.recheck is None:
            return None
        if not self.recheck.still_authorized():
            return "revoked"
        if not self.recheck.still_readable():
            return "run_not_found"
        return None
