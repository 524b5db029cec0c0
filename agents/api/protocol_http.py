"""What the A2A and MCP endpoints share: bearer-key authentication outside DRF, JSON answers with Korean kept
as it is, and the pacing of a stream that follows a run (asynchronously under ASGI, by a plain generator under
WSGI, as ``agents.api.events`` does)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, cast

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest, JsonResponse
from django.utils import translation
from django.utils.translation import gettext as _
from rest_framework import exceptions

from agent_platform.errors import ApplicationError
from agents.api.auth import ApiKeyAuthentication
from agents.api.config import api_setting
from agents.api.parsers import json_parse_bounded
from agents.api.throttling import (
    StreamSlot,
    api_key_rate_check,
    stream_slot_acquire,
    stream_slot_release,
    stream_slot_renew,
)
from agents.models import ApiKey, Run
from agents.selectors import api_key_is_live, run_get

PollState = Literal["more", "wait", "done"]  # "more": a whole batch was read, the next is read at once
# Why an open stream was closed by its recheck: its key was revoked, or the key may no longer read the run.
StreamLoss = Literal["revoked", "run_not_found"]


def json_response(body: Any, *, status: int = 200, headers: dict[str, str] | None = None) -> JsonResponse:
    response = JsonResponse(body, status=status, safe=False, json_dumps_params={"ensure_ascii": False})
    for name, value in (headers or {}).items():
        response[name] = value
    return response


def rpc_body(request: HttpRequest) -> Any:
    """A JSON-RPC request's body, parsed as the REST API parses its bodies (``agents/api/parsers.py``: bounded
    nesting, finite numbers, text a database stores). Raises DRF's ``ParseError`` (a JSON-RPC parse error)."""
    return json_parse_bounded(request.body, max_depth=int(api_setting("PLATFORM_API_MAX_JSON_DEPTH")))


def charset_is_utf8(request: HttpRequest) -> bool:
    """Whether the body's declared charset (``Content-Type: …; charset=…``) is UTF-8, or none is declared (JSON is
    UTF-8): a body said to be in another (Latin-1, EUC-KR) is refused with a 415 by the REST API, the MCP server and
    the A2A endpoint alike, never read as UTF-8 all the same (or read wrong)."""
    charset = str((request.content_params or {}).get("charset", "")).lower()
    return charset in ("", "utf-8", "utf8")


def dumps(value: Any) -> str:
    """One line of JSON, Korean text kept as it is (SSE ``data`` lines)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def error_response(code: str, message: str, status: int, *, headers: dict[str, str] | None = None) -> JsonResponse:
    """The API's error shape (``{"error": {"code", "message"}}``) for what happens before any protocol talk."""
    return json_response({"error": {"code": code, "message": message}}, status=status, headers=headers)


@dataclass(frozen=True)
class Caller:
    """An authenticated request's key, or the response that refuses it (401, or 429 with ``Retry-After``)."""

    api_key: ApiKey | None
    refusal: JsonResponse | None


def caller_authenticate(request: HttpRequest, *, counted: bool = True) -> Caller:
    """``Authorization: Bearer <api key>`` as the REST API reads it, counted against the key's rate limit (unless
    not ``counted``: the caller counts it, ``api_key_rate_check``, once it knows what the request is)."""
    auth = ApiKeyAuthentication()
    challenge = {"WWW-Authenticate": auth.authenticate_header(request)}  # type: ignore[arg-type]
    try:
        found = auth.authenticate(request)  # type: ignore[arg-type]
    except exceptions.Throttled as exc:
        wait_s = int(getattr(exc, "wait", None) or 1)
        return Caller(None, error_response("throttled", str(exc.detail), 429, headers={"Retry-After": str(wait_s)}))
    except exceptions.APIException as exc:
        return Caller(None, error_response("authentication_failed", str(exc.detail), 401, headers=challenge))
    if found is None:
        message = str(exceptions.NotAuthenticated.default_detail)
        return Caller(None, error_response("not_authenticated", message, 401, headers=challenge))
    api_key = found[0]
    wait = api_key_rate_check(api_key) if counted else None
    if wait is not None:
        return Caller(None, error_response("throttled", throttled_message(wait), 429, headers=retry_after(wait)))
    return Caller(api_key, None)


def throttled_message(wait: float) -> str:
    """What a request over its key's rate limit is told: when to ask again."""
    return _("Request was throttled. Expected available in %(wait)d seconds.") % {"wait": wait}


def retry_after(wait: float) -> dict[str, str]:
    return {"Retry-After": str(int(wait))}


def stream_timing() -> tuple[float, float]:
    """``(recheck_s, lease_s)`` of an open stream, as the run events API's (``agents.api.events``): its key is
    checked again every ``PLATFORM_SSE_AUTH_RECHECK_S`` (at most 15 s), and its slot is leased for two of those
    and a poll, renewed at each check, so a stream whose process died frees its slot within a minute."""
    recheck_s = min(15.0, float(api_setting("PLATFORM_SSE_AUTH_RECHECK_S")))
    return recheck_s, 2 * recheck_s + float(api_setting("PLATFORM_SSE_POLL_S")) + 5


def stream_slot_take(api_key: ApiKey) -> StreamSlot | None:
    """One of the key's stream slots (``PLATFORM_SSE_MAX_STREAMS_PER_KEY``, shared with the run events API), on
    the short lease a ``KeyRecheck`` renews."""
    return stream_slot_acquire(api_key, lease_s=stream_timing()[1])


class KeyRecheck:
    """An open stream's hold on its key and its run, as the run events API's: every
    ``PLATFORM_SSE_AUTH_RECHECK_S`` the key is asked again whether it is live and whether it may still read the
    run (``key_may_read_run``), so a revoked key, or one taken off the run's agent (or whose agent was disabled),
    loses its stream at once, not at ``PLATFORM_SSE_MAX_S``; the stream's slot is renewed otherwise."""

    def __init__(
        self,
        api_key: ApiKey,
        slot: StreamSlot | None,
        *,
        run_id: Any,
        clock: Callable[[], float] = time.monotonic,
        still_authorized: Callable[[], bool] | None = None,
        still_readable: Callable[[], bool] | None = None,
    ) -> None:
        api_key_id = api_key.pk
        self.slot = slot
        self.recheck_s, self.lease_s = stream_timing()
        self.clock = clock
        self.still_authorized = still_authorized or (lambda: api_key_is_live(api_key_id=api_key_id))
        self.still_readable = still_readable or (lambda: key_may_read_run(api_key=api_key, run_id=run_id))
        self.next_at = clock() + self.recheck_s

    def lost(self) -> StreamLoss | None:
        """Why the stream must end now (asked at most every ``recheck_s``, two queries then), or None (the slot
        renewed when asked)."""
        now = self.clock()
        if now < self.next_at:
            return None
        self.next_at = now + self.recheck_s
        if not self.still_authorized():
            return "revoked"
        if not self.still_readable():
            return "run_not_found"
        if self.slot is not None:
            stream_slot_renew(self.slot, lease_s=self.lease_s)
        return None


def key_may_read_run(*, api_key: ApiKey, run_id: Any) -> bool:
    """Whether ``api_key`` may still read the run, by the REST run views' own rule (``run_get``: the key's own run,
    of an enabled agent in its scope); an open stream of any protocol asks this at each recheck, so what a REST
    request is refused with a 404 a stream is not sent either."""
    try:
        run_get(run_id=str(run_id), api_key=api_key)
    except ApplicationError:
        return False
    return True


def revoked_message() -> str:
    """What a stream whose key was revoked is told last (the run events API's words)."""
    return _("The API key was revoked; the stream is closed.")


def run_unreadable_message() -> str:
    """What a stream is told last once its key may no longer read the run (``key_may_read_run``)."""
    return _("This API key may no longer read this run; the stream is closed.")


def too_many_streams() -> JsonResponse:
    limit = int(api_setting("PLATFORM_SSE_MAX_STREAMS_PER_KEY"))
    message = _("This API key already has %(max)d event streams open; close one first.") % {"max": limit}
    return error_response("too_many_streams", message, 429, headers={"Retry-After": "5"})


Poll = Callable[[], tuple[list[str], PollState]]


async def paced_async(
    poll: Poll, slot: StreamSlot | None, *, on_abandon: Callable[[], None] | None = None
) -> AsyncIterator[str]:
    """Chunks from ``poll`` every ``PLATFORM_SSE_POLL_S`` seconds (at once after a ``more``) until it says ``done``;
    the slot (if one is held) is released however the stream ends. ``on_abandon`` is called (in a thread) when the
    client goes away first."""
    poll_s = float(api_setting("PLATFORM_SSE_POLL_S"))
    try:
        while True:
            chunks, state = await sync_to_async(poll)()
            for chunk in chunks:
                yield chunk
            if state == "done":
                return
            if state == "wait":  # "more": the poll read a whole batch, and reads the next at once
                await asyncio.sleep(poll_s)
    except (GeneratorExit, asyncio.CancelledError):
        # The client went away (the server closed the stream, or cancelled its task): not the server's own error,
        # which leaves the run alone.
        if on_abandon is not None:
            await asyncio.shield(sync_to_async(on_abandon)())
        raise
    finally:
        if slot is not None:
            await sync_to_async(stream_slot_release)(slot)


def paced_sync(poll: Poll, slot: StreamSlot | None, *, on_abandon: Callable[[], None] | None = None) -> Iterator[str]:
    poll_s = float(api_setting("PLATFORM_SSE_POLL_S"))
    try:
        while True:
            chunks, state = poll()
            yield from chunks
            if state == "done":
                return
            if state == "wait":  # "more": the poll read a whole batch, and reads the next at once
                time.sleep(poll_s)
    except GeneratorExit:  # the client went away (the server closed the response)
        if on_abandon is not None:
            on_abandon()
        raise
    finally:
        if slot is not None:
            stream_slot_release(slot)


class SlotStream:
    """A stream's chunks whose ``close`` gives its slot back, and calls ``on_abandon`` where the client left before
    the body began. Django closes the response when its client has gone (or the stream is done), but a generator
    that never started runs no ``finally`` and no ``except GeneratorExit``: a client that left before the first
    chunk (while the response's head was being sent) held the key's slot until its lease ran out, the key's other
    streams refused meanwhile, and an MCP call's run went on for nobody. Giving the slot back twice is harmless
    (``stream_slot_release`` frees only a slot it still holds). As the run events API's stream
    (``agents.api.events``)."""

    def __init__(
        self,
        chunks: Iterator[str] | AsyncIterator[str],
        slot: StreamSlot | None,
        on_abandon: Callable[[], None] | None = None,
    ) -> None:
        self.chunks = chunks
        self.slot = slot
        self.on_abandon = on_abandon
        self.started = False  # whether the body's sending began (the generator's own handlers run from then)

    def close(self) -> None:
        close = getattr(self.chunks, "close", None)
        if close is not None:
            close()  # a sync generator under way: its own ``finally`` runs now
        if not self.started and self.on_abandon is not None:
            self.on_abandon()
        if self.slot is not None:
            stream_slot_release(self.slot)


class SyncSlotStream(SlotStream):
    # Its own iterator: Django asks for the iterator as it makes the response, long before the body's first chunk.
    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        self.started = True
        return next(cast(Iterator[str], self.chunks))


class AsyncSlotStream(SlotStream):
    def __aiter__(self) -> AsyncIterator[str]:
        return self

    async def __anext__(self) -> str:
        self.started = True
        return await anext(cast(AsyncIterator[str], self.chunks))


def slot_stream(
    request: HttpRequest, poll: Poll, slot: StreamSlot | None, *, on_abandon: Callable[[], None] | None = None
) -> SyncSlotStream | AsyncSlotStream:
    """``poll``'s chunks paced (``paced_async`` under ASGI, else ``paced_sync``) as a response's body whose close
    gives ``slot`` back and, where the client left before the body began, calls ``on_abandon``
    (:class:`SlotStream`)."""
    if isinstance(request, ASGIRequest):
        return AsyncSlotStream(paced_async(poll, slot, on_abandon=on_abandon), slot, on_abandon)
    return SyncSlotStream(paced_sync(poll, slot, on_abandon=on_abandon), slot, on_abandon)


def json_body(poll: Poll) -> Poll:
    """``poll`` of an event stream that ends with one JSON-RPC message, as the chunks of a JSON body: a space at
    once (so that a WSGI server sends the response's head now, not with the first keep-alive), a space where the
    stream would send a keep-alive comment, the message's JSON when it is done, nothing else. For an answer that
    waits for a run (MCP's ``tools/call`` to a client that takes no event stream, A2A's blocking ``SendMessage``):
    JSON's own whitespace keeps a client's read timeout from expiring while the run goes (the SDK clients' httpx
    gives up after 5 s without a byte) and lets the server notice a client gone. The status is sent with the first
    space: whatever the wait ends in, an error included, is a 200 whose body is a JSON-RPC message."""
    started = False

    def as_json() -> tuple[list[str], PollState]:
        nonlocal started
        chunks, state = poll()
        if state == "done":
            return [chunks[-1].split("data: ", 1)[1].rstrip("\n")], state
        spaces = [" " for chunk in chunks if chunk.startswith(":")]
        if not started:
            started = True
            spaces = spaces or [" "]
        return spaces, state

    return as_json


def tool_progress_text(run: Run, call: dict[str, Any]) -> str:
    """A tool call's progress line for A2A and MCP clients, in the run's language (its version's, ``Run.language``):
    ``tool search_employee: ok``; a call that waits for approval, or a rule's call that was skipped, is said so
    (the run's trace says "awaiting approval" and "rule skipped"), not that it failed."""
    tool = call.get("name") or call.get("tool") or ""
    reason = call.get("reason") or call.get("error") or ""
    with translation.override(run.language or None):
        if call.get("ok"):
            return _("tool %(tool)s: ok") % {"tool": tool}
        if "approval:pending" in (call.get("error"), call.get("reason")):
            return _("tool %(tool)s: waiting for approval") % {"tool": tool}
        if "rule:skipped" in (call.get("error"), call.get("reason")):
            return _("tool %(tool)s: skipped") % {"tool": tool}
        if not reason:
            return _("tool %(tool)s: failed") % {"tool": tool}
        return _("tool %(tool)s: failed (%(reason)s)") % {"tool": tool, "reason": reason}


def status_progress_text(run: Run, status: str) -> str:
    """A run's status change as a progress line, in the run's language (the status by its label)."""
    with translation.override(run.language or None):
        label = Run.Status(status).label if status in Run.Status.values else status
        return _("status: %(status)s") % {"status": label}
