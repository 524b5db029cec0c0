"""``GET /api/v1/runs/{id}/events``: a run's progress as server-sent events.

An async Django view (DRF's views are sync, and a sync view would hold a worker thread for as long as a stream
is open): it authenticates with the API's bearer key and answers errors in the API's shape, then streams the
run's ``RunEvent`` rows, replayed from ``Last-Event-ID`` (or ``?after=``) and then followed by polling the
database (woken by the run's change notification, ``agents.run_wakeup``), until the run has finished (a final ``event: end``), the client goes away, or the stream has been
open ``PLATFORM_SSE_MAX_S`` seconds (it then closes without ``end``; the client reconnects with
``Last-Event-ID``), or its API key is revoked or may no longer read the run (taken off the run's agent, or the agent
disabled: what the REST run views answer with a 404; both checked again every ``PLATFORM_SSE_AUTH_RECHECK_S`` ≤ 15 s;
a final ``event: error``, ``authentication_failed`` or ``run_not_found``, then says so). One key holds at most ``PLATFORM_SSE_MAX_STREAMS_PER_KEY`` streams open at once
(slots in the cache, ``agents.api.throttling.StreamSlot``); one more is a ``429 too_many_streams``. Served by an ASGI server (uvicorn, gunicorn's uvicorn workers) it streams asynchronously;
under WSGI (``runserver``, the test client) the same feed is served by a plain generator.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Any

from asgiref.sync import sync_to_async
from django.core.exceptions import TooManyFieldsSent
from django.core.handlers.asgi import ASGIRequest
from django.db import DatabaseError, InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse, StreamingHttpResponse
from django.urls import reverse
from django.utils import translation
from django.utils.translation import gettext as _
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions

from agent_platform.errors import ApplicationError, database_unreachable
from agents.api.auth import ApiKeyAuthentication
from agents.api.config import api_setting
from agents.api.errors import DATABASE_RETRY_AFTER_S, too_many_fields_message
from agents.api.protocol_http import (
    AsyncSlotStream,
    PollState,
    SyncSlotStream,
    key_may_read_run,
    run_unreadable_message,
)
from agents.api.throttling import (
    StreamSlot,
    api_key_rate_check,
    stream_slot_acquire,
    stream_slot_release,
    stream_slot_renew,
)
from agents.api.views import query_params_check
from agents.config_cache import shown_secrets
from agents.decision_reasons import reason_text
from agents.models import ApiKey, Run, RunEvent
from agents.run_wakeup import RunWatch
from agents.selectors import api_key_is_live, run_end_recorded, run_events_after, run_get, run_status
from audit.masking import mask_known

RECONNECT_MS = 3000
BATCH = 200
FINISHED = frozenset({Run.Status.SUCCEEDED, Run.Status.FAILED, Run.Status.CANCELLED})

logger = logging.getLogger(__name__)


def format_event(event: RunEvent, *, language: str | None = None, secrets: Iterable[str] = ()) -> str:
    """One event as SSE: ``id``, ``event`` and a one-line JSON ``data`` (Korean text kept as it is). A rule
    decision's stored ``reason`` (stable English) comes with ``reason_text``, the same in the caller's language.

    ``data`` is masked again with ``secrets`` (the secrets bound now, ``RunEventFeed``) and the registered ones
    (``mask_known``: its shape kept, its numbers as they are): it was masked with those known when it was
    recorded, and a value bound as a secret after (a token the caller typed, then given to a server) was in none
    of them."""
    kind = "".join(c for c in event.kind if c not in "\r\n") or "message"
    payload = mask_known(event.data, secrets=secrets)
    if event.kind == "rule" and isinstance(payload, dict) and isinstance(payload.get("reason"), str):
        with translation.override(language):
            payload = {**payload, "reason_text": reason_text(payload["reason"])}
    data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return f"id: {event.seq}\nevent: {kind}\ndata: {data}\n\n"


def format_end(status: str | None) -> str:
    return f"event: end\ndata: {json.dumps({'status': status}, ensure_ascii=False)}\n\n"


def format_error(code: str, message: str) -> str:
    """A stream's last event when it is closed on its reader: ``event: error`` with the API's error body."""
    body = {"code": code, "message": message}
    return f"event: error\ndata: {json.dumps(body, ensure_ascii=False)}\n\n"


def format_revoked(message: str | None = None) -> str:
    """The stream's last event once its reader may no longer read it: ``message`` says why, in the reader's
    words (an API key's revocation unless told: the admin's session-authorised stream says its own)."""
    return format_error("authentication_failed", message or _("The API key was revoked; the stream is closed."))


class RunEventFeed:
    """What to send next on one stream. ``poll`` reads the database (sync); the generators below pace it."""

    def __init__(
        self,
        *,
        run_id: Any,
        after: int,
        poll_s: float,
        keepalive_s: float,
        max_s: float,
        clock: Callable[[], float] = time.monotonic,
        still_authorized: Callable[[], bool] | None = None,
        still_readable: Callable[[], bool] | None = None,
        auth_recheck_s: float = 10.0,
        on_recheck: Callable[[], None] | None = None,
        language: str | None = None,
        revoked_message: str | None = None,
    ) -> None:
        """``still_authorized`` is asked at most every ``auth_recheck_s`` seconds (and ``on_recheck`` then
        called, to renew the stream's slot); once it answers False the stream ends with ``event: error`` saying
        ``revoked_message`` (translated when the stream opened; the API key's revocation by default). Then
        ``still_readable`` (whether the reader may still read this run) is asked, and once it answers False the
        stream ends with an ``event: error`` ``run_not_found``, as a REST request would be answered."""
        self.run_id = run_id
        self.revoked_message = revoked_message
        self.language = language  # the caller's, read from the request (the stream outlives its translation)
        self.still_authorized = still_authorized
        self.still_readable = still_readable
        self.auth_recheck_s = auth_recheck_s
        self.on_recheck = on_recheck
        self.next_recheck = clock() + auth_recheck_s
        self.last_seq = after
        # The secrets bound now, which every event sent is masked with (``format_event``): read on the first poll
        # (in the database's thread) and again at each recheck, so a secret bound while the stream is open is
        # masked within ``auth_recheck_s``, and a poll reads no more than its events.
        self.secrets: list[str] | None = None
        self.poll_s = poll_s
        self.keepalive_s = keepalive_s
        self.clock = clock
        self.deadline = clock() + max_s
        self.last_sent = clock()

    def opening(self) -> str:
        return f"retry: {RECONNECT_MS}\n\n"

    def poll(self) -> tuple[list[str], PollState]:
        """The chunks to send now, and whether to poll again at once (``more``), after a pause (``wait``), or
        to close (``done``).

        The run's status is read before its events: the worker writes a run's last event before it marks the
        run finished, so a run seen finished here has all its events in the read that follows. A run cancelled
        while it ran is the exception (it reads cancelled before its worker records the call it was making and
        its end): it is followed on until that end is recorded (``run_end_recorded``, asked before the read)."""
        now = self.clock()
        if now >= self.next_recheck:
            self.next_recheck = now + self.auth_recheck_s
            with translation.override(self.language):  # the stream outlives the request's translation
                if self.still_authorized is not None and not self.still_authorized():
                    return [format_revoked(self.revoked_message)], "done"
                if self.still_readable is not None and not self.still_readable():
                    return [format_error("run_not_found", run_unreadable_message())], "done"
            if self.on_recheck is not None:
                self.on_recheck()
            self.secrets = None
        if self.secrets is None:
            self.secrets = shown_secrets()
        status = run_status(run_id=self.run_id)
        ended = status is None or (
            status in FINISHED and (status != Run.Status.CANCELLED or run_end_recorded(run_id=self.run_id))
        )  # only a cancelled run's end is read again (one more query); the others' is the status just read
        events = run_events_after(run_id=self.run_id, after=self.last_seq, limit=BATCH)
        chunks = [format_event(e, language=self.language, secrets=self.secrets) for e in events]
        if events:
            self.last_seq = events[-1].seq
            self.last_sent = now
        if len(events) == BATCH:
            return chunks, "more"
        if ended:
            return [*chunks, format_end(status)], "done"
        if now >= self.deadline:
            return [*chunks, ": open too long; reconnect with Last-Event-ID\n\n"], "done"
        if not chunks and now - self.last_sent >= self.keepalive_s:
            self.last_sent = now
            chunks.append(": keep-alive\n\n")
        return chunks, "wait"


def polled(feed: RunEventFeed) -> tuple[list[str], PollState]:
    """``feed.poll``, or, where the database fails while the stream is open, the stream's last event: an
    ``event: error`` ``unavailable`` for a database that cannot answer now (the client reconnects with
    ``Last-Event-ID``, as after any other close), ``server_error`` for any other database error (a bug: logged with
    its traceback). Uncaught, the error cut the stream off with no word of why."""
    try:
        return feed.poll()
    except DatabaseError as exc:
        with translation.override(feed.language):  # the stream outlives the request's translation
            if database_unreachable(exc):
                logger.warning("API event stream: the database did not answer: %s", exc)
                last = format_error("unavailable", _("The database is not available right now. Try again shortly."))
            else:
                logger.exception("API event stream: a database error ended the stream of run %s", feed.run_id)
                last = format_error("server_error", _("The run's events could not be read; the stream is closed."))
        return [last], "done"


async def stream_async(feed: RunEventFeed, slot: StreamSlot) -> AsyncIterator[str]:
    """The feed, paced; the slot is released however the stream ends (finished, revoked, client gone)."""
    watch = await sync_to_async(RunWatch)(feed.run_id)
    try:
        await sync_to_async(watch.__enter__, thread_sensitive=False)()
        yield feed.opening()
        while True:
            chunks, state = await sync_to_async(polled)(feed)
            for chunk in chunks:
                yield chunk
            if state == "done":
                return
            if state == "wait":
                await watch.wait_async(feed.poll_s)
    finally:
        await sync_to_async(watch.__exit__)()
        await sync_to_async(stream_slot_release)(slot)


def stream_sync(feed: RunEventFeed, slot: StreamSlot) -> Iterator[str]:
    try:
        with RunWatch(feed.run_id) as watch:
            yield feed.opening()
            while True:
                chunks, state = polled(feed)
                yield from chunks
                if state == "done":
                    return
                if state == "wait":
                    watch.wait(feed.poll_s)
    finally:
        stream_slot_release(slot)


def _error(
    code: str, message: str, status: int, *, headers: dict[str, str] | None = None, **extra: Any
) -> JsonResponse:
    body: dict[str, Any] = {"code": code, "message": message, **extra}
    response = JsonResponse({"error": body}, status=status, json_dumps_params={"ensure_ascii": False})
    for name, value in (headers or {}).items():
        response[name] = value
    return response


def _authenticate(request: HttpRequest) -> ApiKey:
    """The request's API key. Raises DRF's NotAuthenticated / AuthenticationFailed."""
    found = ApiKeyAuthentication().authenticate(request)  # type: ignore[arg-type]
    if found is None:
        raise exceptions.NotAuthenticated()
    return found[0]


def _after(request: HttpRequest) -> int:
    """``Last-Event-ID`` (what an EventSource sends on reconnecting) or ``?after=``; 0 for the whole stream. Both
    are checked, whichever is read (``Last-Event-ID`` first): a bad ``?after=`` is a 400 with a good header too."""
    given: list[int] = []
    for name, raw in (("Last-Event-ID", request.headers.get("Last-Event-ID")), ("after", request.GET.get("after"))):
        if raw is None or raw.strip() == "":
            continue
        # At most 18 digits (a 64-bit number: every event number fits); Python refuses to read one of 4,300 or more.
        if not raw.strip().isdigit() or not raw.strip().isascii() or len(raw.strip()) > 18:
            raise ApplicationError(
                _("'%(name)s' must be an event number (an integer, 0 or more).") % {"name": name},
                code="invalid_input",
                status=400,
                fields={name: [_("Invalid value.")]},
            )
        given.append(int(raw.strip()))
    return given[0] if given else 0


@csrf_exempt  # a bearer key's API (no cookie is read): any other method is told its 405, not Django's CSRF 403
async def run_events(request: HttpRequest, run_id: str) -> HttpResponseBase:
    """The stream, or the error that keeps it from opening. A database that cannot answer while it opens is a
    ``503 unavailable`` with ``Retry-After``, as the REST views answer it (``agents.api.errors``), not a 500."""
    try:
        return await _open_stream(request, run_id)
    except (OperationalError, InterfaceError) as exc:
        if not database_unreachable(exc):
            raise  # a bug, not an outage: a 500 with its traceback
        logger.warning("API event stream: the database did not answer: %s", exc)
        return _error(
            "unavailable",
            _("The database is not available right now. Try again shortly."),
            503,
            headers={"Retry-After": str(DATABASE_RETRY_AFTER_S)},
        )


# As every REST endpoint of the API: HEAD is GET without a body (here: the stream's headers, no stream opened),
# OPTIONS its description. Each is authenticated and counted as GET is.
ALLOWED = "GET, HEAD, OPTIONS"


async def _open_stream(request: HttpRequest, run_id: str) -> HttpResponseBase:
    if request.method not in ALLOWED.split(", "):
        refused = exceptions.MethodNotAllowed(request.method)  # the REST views' words
        return _error("method_not_allowed", str(refused.detail), 405, headers={"Allow": ALLOWED})
    auth = ApiKeyAuthentication()
    try:
        api_key = await sync_to_async(_authenticate)(request)
    except exceptions.Throttled as exc:  # too many unknown keys from this address
        wait_s = int(getattr(exc, "wait", None) or 1)
        return _error("throttled", str(exc.detail), 429, headers={"Retry-After": str(wait_s)})
    except exceptions.APIException as exc:
        code = "not_authenticated" if isinstance(exc, exceptions.NotAuthenticated) else "authentication_failed"
        return _error(code, str(exc.detail), 401, headers={"WWW-Authenticate": auth.authenticate_header(request)})  # type: ignore[arg-type]
    wait = await sync_to_async(api_key_rate_check)(api_key)
    if wait is not None:
        throttled = exceptions.Throttled(wait=wait)  # the REST views' words
        return _error("throttled", str(throttled.detail), 429, headers={"Retry-After": str(throttled.wait)})
    if request.method == "OPTIONS":
        return JsonResponse(
            {
                "name": "Run Events",
                "description": _("Described in the OpenAPI schema: %(url)s") % {"url": reverse("api-schema")},
                "renders": ["text/event-stream"],
                "parses": [],
            },
            headers={"Allow": ALLOWED},
            json_dumps_params={"ensure_ascii": False},
        )
    try:
        query_params_check(request.GET, accepted=("after",))
        after = _after(request)
        run = await sync_to_async(run_get)(run_id=run_id, api_key=api_key)
    except ApplicationError as exc:
        extra = {"fields": exc.fields} if exc.fields else {}
        return _error(exc.code, exc.message, exc.status, **extra)
    except TooManyFieldsSent:
        # A caller's mistake, answered as the REST views answer it: left to Django, it was logged as a security
        # error with its traceback.
        return _error("too_many_fields", too_many_fields_message(), 400)
    if request.method == "HEAD":
        return _stream_headers(HttpResponse(content_type=EVENT_STREAM))
    poll_s = float(api_setting("PLATFORM_SSE_POLL_S"))
    recheck_s = min(15.0, float(api_setting("PLATFORM_SSE_AUTH_RECHECK_S")))
    lease_s = 2 * recheck_s + poll_s + 5
    slot = await sync_to_async(stream_slot_acquire)(api_key, lease_s=lease_s)
    if slot is None:
        limit = int(api_setting("PLATFORM_SSE_MAX_STREAMS_PER_KEY"))
        return _error(
            "too_many_streams",
            _("This API key already has %(max)d event streams open; close one first.") % {"max": limit},
            429,
            headers={"Retry-After": str(int(recheck_s))},
        )
    held = slot
    feed = RunEventFeed(
        run_id=run.pk,
        after=after,
        poll_s=poll_s,
        keepalive_s=float(api_setting("PLATFORM_SSE_KEEPALIVE_S")),
        max_s=float(api_setting("PLATFORM_SSE_MAX_S")),
        still_authorized=lambda: api_key_is_live(api_key_id=api_key.pk),
        still_readable=lambda: key_may_read_run(api_key=api_key, run_id=run.pk),
        auth_recheck_s=recheck_s,
        on_recheck=lambda: stream_slot_renew(held, lease_s=lease_s),
        language=translation.get_language(),
    )
    stream: SyncSlotStream | AsyncSlotStream
    if isinstance(request, ASGIRequest):
        stream = AsyncSlotStream(stream_async(feed, slot), slot)
    else:
        stream = SyncSlotStream(stream_sync(feed, slot), slot)
    return _stream_headers(StreamingHttpResponse(stream, content_type=EVENT_STREAM))


EVENT_STREAM = "text/event-stream; charset=utf-8"


def _stream_headers(response: HttpResponseBase) -> HttpResponseBase:
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response
