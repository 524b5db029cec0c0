"""The MCP session pool: one live session per (worker process, server binding), reused across calls and runs.

MCP sessions belong to the event loop and the task that opened them, so the pool owns one long-lived event
loop on a background thread; every session is opened, used and closed there, and synchronous callers (the
run engine in a Celery worker, management commands) submit coroutines to it and wait. Opening a stdio
session costs a server process start (about a second); a call over a live session costs milliseconds. The
pool is why the platform is fast.

A session that died (the server exited, the transport broke) is dropped and opened again on the next call.
The pool never sends a tool call twice: a call whose request may have reached the server (it was written, and
then the session broke or the deadline passed) raises with ``sent=True`` and is not re-sent here; only the
caller (the gate, which audits every send and knows whether the tool may repeat) decides whether to send it
again. A call that found its session already dead (the request could not be written) is sent, once, over a
fresh session: nothing reached the server. Sessions idle for longer than ``idle_close_s`` (no call in flight, and
none ended within it) are closed; a session with a call in flight is never closed for idleness.
``shutdown()`` closes every session, which ends every stdio server process this pool started.

A session on which a call timed out is retired, as is one whose call its caller stopped waiting for (Celery's soft
time limit cancels the call): the request is left in a state nobody knows. Over streamable HTTP the SDK keeps that
call's HTTP request open (nothing in the protocol ends it, and a server's keep-alive comments keep resetting its read
timeout), and a session's HTTP client has a bounded number of connections, so after enough timeouts every call on the
session would wait for a connection that never frees. Over stdio a server
written with FastMCP whose tool works in a thread goes on working after ``notifications/cancelled``, and its late
answer to the cancelled request ends the server (modelcontextprotocol/python-sdk#2416): a call sent meanwhile is
lost, a write among them recorded as of unknown outcome. New calls open a fresh session at once; the retired one
is closed (its stuck requests, its process with its late work) when its last call in flight has ended: a call
still running on it keeps its own answer or its own timeout (with ``sent=True``), and is never sent again.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import dataclasses
import email.utils
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any, NoReturn, TypeVar, cast

import anyio
import anyio.abc
import anyio.lowlevel
import httpx
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from django.apps import apps
from django.conf import settings
from django.utils import translation
from mcp import McpError, StdioServerParameters, types
from mcp.client.sse import sse_client
from mcp.client.stdio import (
    PROCESS_TERMINATION_TIMEOUT,
    _create_platform_compatible_process,
    _get_executable_command,
    _terminate_process_tree,
    get_default_environment,
)
from mcp.client.streamable_http import RequestContext, StreamableHTTPTransport
from mcp.shared._httpx_utils import MCP_DEFAULT_TIMEOUT, create_mcp_http_client, next_request_within_origin
from mcp.shared.message import SessionMessage

import agent_platform.telemetry as telemetry
from audit.masking import mask_text, registered_secrets
from mcpregistry.binding_policy import binding_problem
from mcpregistry.client_session import ClientSession, ToolResultInvalid, ToolResultTooBig

logger = logging.getLogger(__name__)

T = TypeVar("T")


def _(message: str) -> str:
    """``message`` in the active language (gettext), or as written where Django is not set up: the pool also runs
    on its own (``bench/mcp_calls.py``)."""
    return translation.gettext(message) if settings.configured and apps.ready else message


async def _in_language(language: str | None, coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro`` with ``language`` active (None: no translation, as after ``deactivate_all``)."""
    with translation.override(language):
        return await coro


# The only variables of the worker's environment a stdio server inherits: never DATABASE_URL, keys or
# AWS credentials. The binding's own env is added on top.
SAFE_ENV_KEYS = ("PATH", "HOME", "LANG", "LC_ALL", "TZ")

# What is kept of a server's stderr: each line cut at this many characters (a server may write megabytes on one
# line), and the failure detail an error message quotes cut at as many.
STDERR_LINE_MAX = 4096
FAILURE_DETAIL_MAX = 4096
# A line is read and masked this much (and the longest known secret) past the cut before it is cut: a secret the
# cut would split is still whole when it is masked (its head alone matches neither its value nor any pattern).
STDERR_MASK_MARGIN = 4096

# An HTTP transport waits this much longer than the longest call it may carry before it gives up reading: a slow
# answer is the call's deadline's to end (a timeout, said as one), never the HTTP client's.
READ_TIMEOUT_MARGIN_S = 60.0

# The longest answer read from a server, in bytes (:func:`_answer_max_bytes`): a stdio server's line (an answer is one
# line), a streamable HTTP server's JSON body or one event of its event stream; and how much of the head and the tail
# of a longer line is kept, to read the id of the answer it is.
STDIO_LINE_MAX_BYTES = 16 * 1024 * 1024
LINE_TOO_LONG_KEPT = 64 * 1024

# A listing (tools, resources, prompts) follows the server's ``nextCursor`` for at most this many pages: a server
# whose cursor never ends fails its discovery with a message, not at the deadline with the listing grown meanwhile.
LIST_PAGES_MAX = 100

TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (
    anyio.ClosedResourceError,
    anyio.BrokenResourceError,
    anyio.EndOfStream,
    ConnectionError,
    EOFError,
    OSError,
)


class _CallError(Exception):
    """A call that got no answer. ``sent`` says whether the request may have reached the server: True (the
    default, and the safe assumption) when it was written, or when nobody can tell; False only when it is known
    that nothing was sent (the session could not be opened). A call with ``sent=True`` has an unknown outcome:
    the server may have carried it out."""

    def __init__(self, message: str = "", *, sent: bool = True) -> None:
        super().__init__(message)
        self.sent = sent


class McpTransportError(_CallError):
    """The server could not be reached, or the session broke. A retry (with a new session) may fix it."""


class McpTimeoutError(_CallError):
    """The server did not answer within the deadline."""


class McpRateLimited(McpTransportError):
    """The server refused the request with HTTP 429 Too Many Requests (seed 001's rate limit): it did not carry it
    out (``sent`` is False: a write is known not done), and the session goes on (over SSE, whose client sends
    nothing more after a refused POST, a fresh one is opened). ``retry_after_s``: how long the server asked to be
    left alone (its ``Retry-After``, in seconds or as an HTTP date), None where it did not say.

    A transport error to whoever does not know it (a discovery, a resource read); the gate reads it as the
    ``rate_limit`` it is: retried after ``Retry-After``, counted by the breaker as a rate limit."""

    def __init__(self, message: str, *, retry_after_s: float | None) -> None:
        super().__init__(message, sent=False)
        self.retry_after_s = retry_after_s


# What writing a request into a session that is already closed raises (the session's receive loop ended when
# the server went away, and closed the stream requests are written to): the request was not sent.
NOT_SENT_ERRORS: tuple[type[BaseException], ...] = (anyio.ClosedResourceError, anyio.BrokenResourceError)


@dataclass(frozen=True)
class ServerConnection:
    """How to reach one server. Holds secrets: never log it."""

    mcp_id: str
    transport: str
    command: str = ""
    args: tuple[str, ...] = ()
    cwd: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    url: str = ""
    headers: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ServerConnection:
        return cls(
            mcp_id=config["mcp_id"],
            transport=config["transport"],
            command=config.get("command") or "",
            args=tuple(str(a) for a in config.get("args") or ()),
            cwd=config.get("cwd") or None,
            env=tuple(sorted((str(k), str(v)) for k, v in (config.get("env") or {}).items())),
            url=config.get("url") or "",
            headers=tuple(sorted((str(k), str(v)) for k, v in (config.get("headers") or {}).items())),
        )

    @property
    def key(self) -> str:
        """Identifies the binding as configured: a changed binding gets a new session."""
        raw = json.dumps(
            [self.mcp_id, self.transport, self.command, self.args, self.cwd, self.env, self.url, self.headers]
        )
        return f"{self.mcp_id}:{hashlib.sha256(raw.encode()).hexdigest()[:16]}"


@dataclass
class ToolCallOutcome:
    """What the server answered to ``tools/call``: ``is_error`` is the server's own verdict; ``text`` its text
    blocks (what is parsed as JSON); ``notes`` what its other blocks say (an embedded text resource's text, a note
    of each image, audio or binary resource: never its bytes), for a result that has no text of its own.
    ``refused``: the ``args:*`` reason of arguments a local tool's own schema refused (``text`` then says what is
    wrong with them), set only by the platform's own local runner (``local_tools``), never read from a server's
    words; empty otherwise."""

    is_error: bool
    text: str
    structured: Any
    content: list[dict[str, Any]]
    notes: str = ""
    refused: str = ""


@dataclass
class ServerListing:
    protocol_version: str
    server_info: dict[str, Any]
    tools: list[dict[str, Any]]
    resources: list[dict[str, Any]] = field(default_factory=list)
    prompts: list[dict[str, Any]] = field(default_factory=list)


@dataclass(eq=False)  # compared and hashed by identity: held in a set while retired
class _PooledSession:
    connection: ServerConnection
    session: ClientSession | None = None
    protocol_version: str = ""
    server_info: dict[str, Any] = field(default_factory=dict)
    capabilities: dict[str, Any] = field(default_factory=dict)
    key: str = ""
    closing: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    dead: bool = False
    # Why the session ended, where its owner failed (an HTTP 502 on a request, a connection refused).
    error: BaseException | None = None
    last_used: float = field(default_factory=time.monotonic)
    # Calls (and listings) running on the session now: the idle reaper never closes a busy session.
    in_flight: int = 0
    # The HTTP client of a streamable HTTP session (its read timeout is raised for a call longer than it allows).
    http_client: httpx.AsyncClient | None = None
    stderr_tail: list[str] = field(default_factory=list)
    stderr_pipe: _StderrPipe | None = None
    # What the server wrote that was not MCP (a banner, a usage text): kept to explain a failed start.
    protocol_noise: list[str] = field(default_factory=list)
    # Why the session was failed from inside (an HTTP answer that is not MCP at all): what its owner raises.
    failure: McpTransportError | None = None
    # Taken out of the pool after a timeout (an HTTP session): closed when ``in_flight`` reaches 0.
    retired: bool = False
    # The ``notifications/cancelled`` being sent for calls that timed out: sent before the session is closed.
    cancel_notices: set[asyncio.Task[None]] = field(default_factory=set)

    def failure_detail(self) -> str:
        """The server's own last words, for an error message: stderr's tail and any non-protocol output."""
        if self.stderr_pipe is not None:
            self.stderr_pipe.join(timeout=1.0)
        parts = self.stderr_tail[-3:]
        if self.protocol_noise:
            if self.connection.transport == "stdio":
                parts.append(_("not MCP on stdout: %(output)s") % {"output": self.protocol_noise[0]})
            else:
                parts.append(_("not MCP over HTTP: %(output)s") % {"output": self.protocol_noise[0]})
        # Masked before it is cut (the lines are masked as they are read; the join is masked again all the same).
        detail = mask_text("; ".join(parts))
        return detail if len(detail) <= FAILURE_DETAIL_MAX else detail[:FAILURE_DETAIL_MAX] + " […]"


@dataclass
class _OpenLock:
    """Serialises the opening of one session key; ``users`` counts who holds it or waits for it."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


class _OwnerEnded(Exception):
    """The task that owns a session's transport ended while an operation waited on it."""

    def __init__(self, error: BaseException | None) -> None:
        super().__init__(repr(error))
        self.error = error


async def _until_owner_ends(pooled: _PooledSession, awaitable: Awaitable[T], *, abandoned: Callable[[], None]) -> T:
    """``awaitable``'s result, or ``_OwnerEnded`` as soon as the session's owner task ends first (its transport
    failed: an HTTP transport's error ends the owner, and the request would otherwise wait for its timeout).

    Cancelled (the call's deadline, or its caller stopped waiting: Celery's soft time limit), it calls ``abandoned``
    at once, before it waits for the operation's own cancellation: a call submitted right after the cancelled one may
    already be looking for a session, and must not be sent on the one whose request was abandoned."""
    owner = pooled.task
    operation = asyncio.ensure_future(awaitable)
    try:
        if owner is None:
            return await operation
        done, _pending = await asyncio.wait({operation, owner}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        abandoned()
        operation.cancel()  # the operation is cancelled too, as it was when awaited directly
        with contextlib.suppress(BaseException):
            await operation
        raise
    if operation in done:
        return operation.result()
    operation.cancel()
    with contextlib.suppress(BaseException):
        await operation
    raise _OwnerEnded(pooled.error)


def _server_gone(pooled: _PooledSession) -> bool:
    """Whether the server's end of ``pooled`` is known to be closed: the stream its messages arrive on has no
    writer left (the transport's reader ended when the server's stdout or connection closed)."""
    session = pooled.session
    stream = getattr(session, "_read_stream", None) if session is not None else None
    statistics = getattr(stream, "statistics", None)
    if statistics is None:
        return False
    try:
        return bool(statistics().open_send_streams == 0)
    except Exception:  # noqa: BLE001 - a stream type without these statistics: assume alive
        return False


class _StderrPipe:
    """A pipe the server's stderr is written to; a thread forwards each line to our (masked) logging. Each line is
    masked (with the secrets registered in this process: whoever opens a session registers its server's first) and
    only then cut, so the tail and the log hold no secret, nor the head of one."""

    def __init__(self, mcp_id: str, tail: list[str]) -> None:
        read_fd, write_fd = os.pipe()
        self.writer = os.fdopen(write_fd, "w", encoding="utf-8", errors="replace")
        self._reader = os.fdopen(read_fd, encoding="utf-8", errors="replace")
        self._log = logging.getLogger(f"mcpregistry.server.{mcp_id}")
        self._tail = tail
        self._thread = threading.Thread(target=self._forward, name=f"mcp-stderr-{mcp_id}", daemon=True)
        self._thread.start()

    def _forward(self) -> None:
        with self._reader:
            skipping = False  # inside a line already cut: its rest is read (the pipe drained) and dropped
            while True:
                limit = STDERR_LINE_MAX + STDERR_MASK_MARGIN + max(map(len, registered_secrets()), default=0)
                chunk = self._reader.readline(limit)
                if not chunk:
                    break
                ended = chunk.endswith("\n")
                if skipping:
                    skipping = not ended
                    continue
                skipping = not ended and len(chunk) >= limit
                line = mask_text(chunk.rstrip())
                if skipping or len(line) > STDERR_LINE_MAX:
                    line = line[:STDERR_LINE_MAX] + " […]"
                if not line:
                    continue
                self._tail.append(line)
                del self._tail[:-20]
                self._log.debug("%s", line)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.writer.close()

    def join(self, timeout: float) -> None:
        """Wait (briefly) until every line the server wrote has been read."""
        self._thread.join(timeout=timeout)


class _LineTooLong(Exception):
    """A line a stdio server wrote that is longer than the pool reads: only its size, its head and its tail are kept
    (where the id of the answer it is can be read), and it is handed to the session's message handler as a line
    that could not be parsed is."""

    def __init__(self, size: int, line_max: int, head: bytes, tail: bytes) -> None:
        super().__init__(f"a line of {size} bytes, more than the {line_max} read")
        self.size = size
        self.line_max = line_max
        self.head = head
        self.tail = tail


def _answer_max_bytes() -> int:
    """The longest answer read from a server (a stdio server's line, an HTTP answer's body or event), in bytes:
    ``STDIO_LINE_MAX_BYTES``, or more where the platform's result cap asks for it (a character is up to 12 bytes as
    escaped JSON, and a tool may send its answer twice: as text and as structured content). A longer answer is refused
    unread (:class:`ToolResultTooBig`), whatever a contract's own ``max_chars`` allows."""
    chars = int(getattr(settings, "PLATFORM_TOOL_RESULT_MAX_CHARS", 0)) if settings.configured else 0
    return max(STDIO_LINE_MAX_BYTES, 24 * chars)


class _Line:
    """The pieces of the line being read: kept whole up to ``line_max`` bytes; past it, only its head and its tail
    (``LINE_TOO_LONG_KEPT`` bytes each), so that a line of any length costs bounded memory and linear time."""

    def __init__(self, line_max: int) -> None:
        self.line_max = line_max
        self._parts: list[bytes] | None = []
        self._size = 0
        self._head = self._tail = b""

    def add(self, piece: bytes) -> None:
        self._size += len(piece)
        if self._parts is None:
            self._tail = (self._tail + piece)[-LINE_TOO_LONG_KEPT:]
            return
        self._parts.append(piece)
        if self._size > self.line_max:
            whole = b"".join(self._parts)  # once per line: at most line_max and a chunk
            self._head, self._tail, self._parts = whole[:LINE_TOO_LONG_KEPT], whole[-LINE_TOO_LONG_KEPT:], None

    def end(self) -> bytes | _LineTooLong:
        """The line, now that its newline came (or what stands for it), and a fresh start for the next."""
        if self._parts is not None:
            line: bytes | _LineTooLong = b"".join(self._parts)
        else:
            line = _LineTooLong(self._size, self.line_max, self._head, self._tail)
        self._parts, self._size, self._head, self._tail = [], 0, b"", b""
        return line


async def _stdout_lines(stdout: anyio.abc.ByteReceiveStream, line_max: int) -> AsyncIterator[bytes | _LineTooLong]:
    """The lines ``stdout`` carries, without their newline (a last line without one is dropped, as the SDK drops
    it). The SDK's reader joins its whole buffer to every 64 KiB chunk again: a 30 MB answer took seconds of the
    pool's loop (every other server's call stalled meanwhile) and could pass its call's deadline while being read."""
    line = _Line(line_max)
    async for chunk in stdout:
        *ended, rest = chunk.split(b"\n")
        for piece in ended:
            line.add(piece)
            yield line.end()
        line.add(rest)


@contextlib.asynccontextmanager
async def _stdio_streams(
    server: StdioServerParameters, *, errlog: Any, line_max: int
) -> AsyncIterator[
    tuple[MemoryObjectReceiveStream[SessionMessage | Exception], MemoryObjectSendStream[SessionMessage]]
]:
    """The SDK's ``stdio_client`` (its process, its streams, its shutdown: stdin closed, then SIGTERM, then SIGKILL),
    its stdout read by :func:`_stdout_lines`: the SDK's function builds its reader itself."""
    read_stream_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_stream_reader = anyio.create_memory_object_stream[SessionMessage](0)
    try:
        process = await _create_platform_compatible_process(
            command=_get_executable_command(server.command),
            args=server.args,
            env={**get_default_environment(), **server.env} if server.env is not None else get_default_environment(),
            errlog=errlog,
            cwd=server.cwd,
        )
    except OSError:
        for stream in (read_stream, write_stream, read_stream_writer, write_stream_reader):
            await stream.aclose()
        raise

    async def stdout_reader() -> None:
        assert process.stdout, "Opened process is missing stdout"
        try:
            async with read_stream_writer:
                async for line in _stdout_lines(process.stdout, line_max):
                    await read_stream_writer.send(_stdio_message(line))
        except anyio.ClosedResourceError:
            await anyio.lowlevel.checkpoint()

    async def stdin_writer() -> None:
        assert process.stdin, "Opened process is missing stdin"
        try:
            async with write_stream_reader:
                async for session_message in write_stream_reader:
                    sent = session_message.message.model_dump_json(by_alias=True, exclude_none=True)
                    await process.stdin.send((sent + "\n").encode(server.encoding, server.encoding_error_handler))
        except anyio.ClosedResourceError:
            await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tg, process:
        tg.start_soon(stdout_reader)
        tg.start_soon(stdin_writer)
        try:
            yield read_stream, write_stream
        finally:
            try:
                if process.stdin:
                    with contextlib.suppress(Exception):  # already closed
                        await process.stdin.aclose()
                try:
                    with anyio.fail_after(PROCESS_TERMINATION_TIMEOUT):
                        await process.wait()
                except TimeoutError:
                    await _terminate_process_tree(process)
                except ProcessLookupError:
                    pass
            finally:
                # The server ended (or its end was cancelled: then it is killed, as anyio kills it), and so does
                # whatever it left running.
                _kill_process_group(process.pid)
            for stream in (read_stream, write_stream, read_stream_writer, write_stream_reader):
                await stream.aclose()


def _kill_process_group(group: int) -> None:
    """Kill what is left of a stdio server's process group once the server has ended (it was started in a session of
    its own, so the group's id is its pid): a helper it started and did not end would outlive it, an orphan nobody
    stops, holding the server's stderr open (and the thread that reads it alive), one more at each open and close.
    SIGKILL, not SIGTERM: the server, which alone knew how to end its helpers gracefully, is gone.

    The group's id stays taken while a member of it lives, so the signal reaches no other process; with none left, the
    id would have to come round again (pids are handed out in turn) between the server's end and this call for the
    signal to find another group."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signal.SIGKILL)


def _stdio_message(line: bytes | _LineTooLong) -> SessionMessage | Exception:
    """What a line from a stdio server is: a JSON-RPC message, or the error it is handed on as (as the SDK does).
    Parsed from its bytes (MCP's stdio is UTF-8), as an HTTP answer is: a byte that is not UTF-8 is a parse error
    that keeps the line, whose id is then read and its request failed at once (``_fail_unreadable_answer``);
    decoded first, the error held no line, and the request waited for its whole timeout."""
    if isinstance(line, _LineTooLong):
        return line
    try:
        return SessionMessage(types.JSONRPCMessage.model_validate_json(line))
    except Exception as exc:  # noqa: BLE001 - any line that is no message is handed on, as the SDK hands it
        return exc


def _request_meta() -> Any:
    """The caller's trace context (``traceparent``) as a request's ``_meta``, read on the caller's thread (its span is
    current there, not in the pool's loop); None without one."""
    from mcp import types

    meta = telemetry.mcp_request_meta()
    return types.RequestParams.Meta(**meta) if meta else None


class McpSessionPool:
    """Keeps live MCP sessions and runs calls over them. Thread-safe; every method is synchronous."""

    def __init__(self, *, idle_close_s: float = 300.0, call_timeout_max_s: float = 3600.0) -> None:
        self.idle_close_s = idle_close_s
        # The longest a call may run (``PLATFORM_TOOL_TIMEOUT_MAX_S``): what an HTTP transport's read waits, and more.
        self.call_timeout_max_s = call_timeout_max_s
        self._pid = os.getpid()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run_loop, name="mcp-pool", daemon=True)
        self._sessions: dict[str, _PooledSession] = {}
        # One lock per session key while a session of it is open or being opened (dropped with the session).
        self._open_locks: dict[str, _OpenLock] = {}
        # Sessions taken out of ``_sessions`` after a timeout, until their last call ends (then closed).
        self._retired: set[_PooledSession] = set()
        # The tasks closing retired sessions (held: the loop keeps only a weak reference to a task).
        self._closers: set[asyncio.Task[None]] = set()
        self._closed = False
        self._reaper: asyncio.Task[None] | None = None
        self._thread.start()
        self.submit(self._reaper_start())

    # ---- loop plumbing -------------------------------------------------------------------------
    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T], *, timeout: float | None = None) -> T:
        """Run ``coro`` on the pool's loop and wait for its result (or its exception).

        ``coro`` runs in the caller's language: the pool's error messages are translated when they are written,
        on the loop's thread, which has no request of its own. So a server's failure reads in the language of
        whoever met it: an admin's discovery or health check in that admin's language (the request's), a run in
        the worker's (``LANGUAGE_CODE``). ``McpServer.last_error`` keeps the text as it was written then: a
        reader in another language sees it in the writer's until the next check.

        Whatever stops the wait (the deadline, or an exception raised in the caller's thread such as Celery's
        ``SoftTimeLimitExceeded``) cancels ``coro``: nothing it has not sent yet is sent afterwards."""
        if self._closed:
            raise RuntimeError("the MCP session pool is shut down")
        if settings.configured and apps.ready:
            coro = _in_language(translation.get_language(), coro)
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise McpTimeoutError(_("no answer within the deadline")) from None
        except BaseException:
            # The caller was stopped while it waited (Celery's soft time limit): the coroutine is cancelled with it.
            # Left running on the loop, a call whose session was still opening went out after the run had ended
            # (an approved write, sent with no audit event, after its approval was recorded outcome_unknown).
            future.cancel()
            raise

    async def _reaper_start(self) -> None:
        self._reaper = self._loop.create_task(self._reap_idle_forever())

    async def _reap_idle_forever(self) -> None:
        while True:
            await asyncio.sleep(min(30.0, max(self.idle_close_s / 2, 0.05)))
            for pooled in list(self._sessions.values()):
                if self._idle(pooled):
                    await self._discard(pooled)

    def _idle(self, pooled: _PooledSession) -> bool:
        """Whether ``pooled`` is the live session of its key and has been idle for longer than ``idle_close_s``.

        Asked of each session as the reaper comes to it, not of the list it took: the reaper waits for each session it
        closes (a server slow to end takes seconds), and meanwhile another session of its list may have been replaced
        (its server died, a fresh one was opened under the same key, a call went out on it). The reaper closes the
        session it asked about, by identity: never the one that holds its key now."""
        # A call in flight may run for as long as its own timeout: its session is busy, not idle.
        return (
            self._sessions.get(pooled.key) is pooled
            and pooled.in_flight == 0
            and time.monotonic() - pooled.last_used > self.idle_close_s
        )

    def _read_timeout(self, call_timeout_s: float = 0.0) -> httpx.Timeout:
        """An HTTP transport's timeouts: the SDK's for connecting and writing, and a read that outlasts the longest
        call (the SDK's 300 s would end a slower answer as a broken read: an unknown outcome for a write)."""
        read = max(self.call_timeout_max_s, call_timeout_s) + READ_TIMEOUT_MARGIN_S
        return httpx.Timeout(MCP_DEFAULT_TIMEOUT, read=read)

    # ---- sessions ------------------------------------------------------------------------------
    async def _session_owner(self, pooled: _PooledSession, ready: asyncio.Future[None]) -> None:
        """Owns the transport and the session for their whole life: MCP's context managers must be
        entered and exited by the same task."""
        conn = pooled.connection
        stderr_pipe: _StderrPipe | None = None
        session: ClientSession | None = None

        async def fail_refused_post(response: httpx.Response) -> None:
            # Over SSE, each request is POSTed: the SDK only logs a refused POST (and stops sending), so its request
            # is failed here, at once, from the HTTP answer (an httpx response hook), not at its deadline.
            if session is not None:
                await _fail_refused_post(session, response)

        async def fail_request(request_id: int | str, error: types.ErrorData) -> None:
            # Over streamable HTTP, a request answered on its own POST with an answer that is not its own, or with
            # one longer than the pool reads.
            if session is not None:
                await _fail_pending_request(session, request_id, error)

        async def bound_answer(response: httpx.Response) -> None:
            # Over streamable HTTP, every answer is read up to the bound a stdio server's line is read to; a 4xx to a
            # request's POST is read now (the SDK raises its status unread), for the transport to read its body.
            if _refusal_to_keep(response):
                await _keep_refusal(response)
                return
            _bound_answer(response, max_bytes=_answer_max_bytes(), fail=fail_request)

        async def sse_answer(response: httpx.Response) -> None:
            # Over SSE, the answers come on the session's one event stream (a GET, carrying no request), each event
            # read to the same bound: a longer one fails the call it answers (its id read from the event's head) as
            # a result too long, and ends the stream (the session is opened afresh), instead of being read whole
            # into the worker's memory.
            await fail_refused_post(response)
            _bound_answer(response, max_bytes=_answer_max_bytes(), fail=fail_request)

        try:
            async with contextlib.AsyncExitStack() as stack:
                if conn.transport == "stdio":
                    stderr_pipe = pooled.stderr_pipe = _StderrPipe(conn.mcp_id, pooled.stderr_tail)
                    env = {k: os.environ[k] for k in SAFE_ENV_KEYS if k in os.environ}
                    env.update(dict(conn.env))
                    # The program is looked up on the worker's own PATH, not the binding's (the child's PATH is
                    # where the process is looked up: a binding's PATH would swap an allowed program for another).
                    command = conn.command
                    if os.path.basename(command) == command:
                        command = shutil.which(command, path=os.environ.get("PATH", os.defpath)) or command
                    params = StdioServerParameters(command=command, args=list(conn.args), env=env, cwd=conn.cwd)
                    read, write = await stack.enter_async_context(
                        _stdio_streams(params, errlog=stderr_pipe.writer, line_max=_answer_max_bytes())
                    )
                elif conn.transport == "streamable_http":
                    answers = _http_client_factory(on_response=bound_answer)
                    http_client = await stack.enter_async_context(
                        answers(headers=dict(conn.headers) or None, timeout=self._read_timeout())
                    )
                    pooled.http_client = http_client
                    read, write = await stack.enter_async_context(
                        _streamable_http_streams(conn.url, http_client, fail=fail_request)
                    )
                elif conn.transport == "sse":
                    read, write = await stack.enter_async_context(
                        sse_client(
                            conn.url,
                            headers=dict(conn.headers) or None,
                            sse_read_timeout=self._read_timeout().read or MCP_DEFAULT_TIMEOUT,
                            httpx_client_factory=_http_client_factory(on_response=sse_answer),
                        )
                    )
                else:
                    raise McpTransportError(f"unknown transport {conn.transport!r}")

                # Cancelled to fail the session from its message handler: ends the initialize or the wait below.
                failing = anyio.CancelScope()

                async def keep_noise(message: Any) -> None:
                    if not isinstance(message, Exception):
                        return
                    if isinstance(message, _AnswerTooLong):
                        return  # an HTTP answer too long to read: its request was failed as it was read
                    if conn.transport != "stdio" and (content_type := _unexpected_content_type(message)) is not None:
                        # The SDK hands the request's answer (a proxy's login page, an HTML error page) to this
                        # handler only: the request would wait for its whole deadline. Nothing MCP will come on
                        # this session: it fails now, and its pending requests with it.
                        pooled.failure = McpTransportError(f"unexpected HTTP content type: {content_type}")
                        failing.cancel()
                        return
                    if session is not None:
                        if isinstance(message, httpx.RequestError) and await _fail_lost_answer(session, message):
                            return  # an HTTP answer whose body was lost on the way: told to its request, at once
                        if await _fail_unreadable_answer(session, message):
                            return  # an answer the SDK could not parse: told to the request it answers, as its failure
                        if isinstance(message, _LineTooLong) and await _fail_too_long_answer(session, message):
                            return  # an answer too long to read: told to the request it answers, as its failure
                    if len(pooled.protocol_noise) < 3:
                        pooled.protocol_noise.append(_noise_of(message))

                session = await stack.enter_async_context(ClientSession(read, write, message_handler=keep_noise))
                with failing:
                    init = await session.initialize()
                    pooled.session = session
                    pooled.protocol_version = str(init.protocolVersion)
                    pooled.server_info = init.serverInfo.model_dump(mode="json", exclude_none=True)
                    pooled.capabilities = init.capabilities.model_dump(mode="json", exclude_none=True)
                    ready.set_result(None)
                    await pooled.closing.wait()
            if pooled.failure is not None:
                raise pooled.failure  # once the transport is closed: its requests end with it
        except BaseException as exc:
            pooled.error = exc
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else McpTransportError(repr(exc)))
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            pooled.dead = True
            if stderr_pipe is not None:
                stderr_pipe.close()

    async def _get(self, connection: ServerConnection, scope: str | None, open_timeout: float) -> _PooledSession:
        key = _session_key(connection, scope)
        pooled = self._sessions.get(key)
        if pooled is not None and not pooled.dead:
            return pooled
        lock = self._open_locks.setdefault(key, _OpenLock())
        lock.users += 1
        try:
            async with lock.lock:
                return await self._open(connection, key, scope, open_timeout)
        finally:
            lock.users -= 1
            self._forget_open_lock(key)

    def _forget_open_lock(self, key: str) -> None:
        """Drop ``key``'s open lock once no session of it is held and nobody holds or waits for the lock: a run's
        scope leaves nothing behind when its sessions close."""
        lock = self._open_locks.get(key)
        if lock is not None and lock.users == 0 and key not in self._sessions:
            del self._open_locks[key]

    async def _open(
        self, connection: ServerConnection, key: str, scope: str | None, open_timeout: float
    ) -> _PooledSession:
        """The live session of ``key``, opened now if there is none (under the key's open lock)."""
        pooled = self._sessions.get(key)
        if pooled is not None and not pooled.dead:
            return pooled
        # The binding policy again, as the connection is opened: a binding saved before a rule or while a setting
        # allowed it, restored from a dump or written around its checks (``.update()``) is not used.
        if settings.configured and apps.ready and (problem := binding_problem(_policy_view(connection), settings)):
            message = _("server '%(server)s' is refused by the binding policy: %(problem)s") % {
                "server": connection.mcp_id,
                "problem": problem,
            }
            raise McpTransportError(message, sent=False)
        # Close an older session of the same server in the same scope (its binding changed) first.
        for other_key, other in list(self._sessions.items()):
            if other.connection.mcp_id == connection.mcp_id and other_key != key and _scope_of(other_key) == scope:
                await self._drop(other_key)
        pooled = _PooledSession(connection=connection, key=key)
        ready: asyncio.Future[None] = self._loop.create_future()
        pooled.task = self._loop.create_task(self._session_owner(pooled, ready))
        try:
            await asyncio.wait_for(asyncio.shield(ready), timeout=open_timeout)
        except TimeoutError:
            # The owner is stuck in initialize and would not see `closing`: cancel it outright.
            ready.cancel()
            pooled.task.cancel()
            with contextlib.suppress(BaseException):
                await pooled.task
            detail = pooled.failure_detail()
            message = _("server '%(server)s' did not initialize within %(seconds)ss") % {
                "server": connection.mcp_id,
                "seconds": f"{open_timeout:g}",
            }
            raise McpTimeoutError(f"{message} ({detail})" if detail else message, sent=False) from None
        except asyncio.CancelledError:
            # The caller stopped waiting while the session opened (``submit``: the run's soft time limit): the
            # session is closed, not left open with nobody to close it (nor registered for a call never made).
            ready.cancel()
            pooled.task.cancel()
            with contextlib.suppress(BaseException):
                await pooled.task
            raise
        except McpError as exc:
            await self._finish(pooled)
            if (limited := _rate_limited_data(exc)) is not None:
                raise _rate_limited(connection, limited) from exc  # the server is there, and asks to wait
            detail = pooled.failure_detail()
            message = _("server '%(server)s' failed to initialize: %(error)s") % {
                "server": connection.mcp_id,
                "error": _describe(exc),
            }
            raise McpTransportError(f"{message} ({detail})" if detail else message, sent=False) from exc
        except Exception as exc:
            await self._finish(pooled)
            if (limited := _rate_limited_data(exc)) is not None:
                raise _rate_limited(connection, limited) from exc  # the server is there, and asks to wait
            detail = pooled.failure_detail()
            if exc is pooled.failure:  # it was reached: what answered is no MCP server
                sentence = _("server '%(server)s' did not answer as an MCP server: %(error)s")
            elif connection.transport == "stdio":
                sentence = _("server '%(server)s' could not be started: %(error)s")
            else:
                sentence = _("server '%(server)s' could not be reached: %(error)s")
            message = sentence % {"server": connection.mcp_id, "error": _describe(exc)}
            raise McpTransportError(f"{message} ({detail})" if detail else message, sent=False) from exc
        self._sessions[key] = pooled
        return pooled

    async def _finish(self, pooled: _PooledSession) -> None:
        pooled.closing.set()
        if pooled.task is not None and not pooled.task.done():
            try:
                await asyncio.wait_for(asyncio.shield(pooled.task), timeout=5)
            except Exception:  # noqa: BLE001 - a session that will not close cleanly is cancelled
                pooled.task.cancel()
                with contextlib.suppress(BaseException):
                    await pooled.task

    async def _drop(self, key: str) -> None:
        pooled = self._sessions.get(key)
        if pooled is None:
            self._forget_open_lock(key)
            return
        await self._discard(pooled)

    async def _discard(self, pooled: _PooledSession) -> None:
        """Close ``pooled`` and forget it, as the live session of its key or as a retired one. By the session, not
        by its key: a call that fails on a retired session must not close the fresh session of the same key."""
        if self._sessions.get(pooled.key) is pooled:
            del self._sessions[pooled.key]
            self._forget_open_lock(pooled.key)
        self._retired.discard(pooled)
        await self._finish(pooled)

    def _retire(self, pooled: _PooledSession) -> None:
        """Take ``pooled`` out of the pool (the next call opens a fresh session); it is closed when its last call
        in flight ends (``_release``), not before: such a call keeps its own answer or deadline."""
        if self._sessions.get(pooled.key) is pooled:
            del self._sessions[pooled.key]
            self._forget_open_lock(pooled.key)
        pooled.retired = True
        self._retired.add(pooled)

    def _release(self, pooled: _PooledSession) -> None:
        """One call on ``pooled`` ended: a retired session with none left is closed, in the background (the call
        that ended is not kept waiting for the server to end the session)."""
        pooled.in_flight -= 1
        pooled.last_used = time.monotonic()  # idle from when the call ended, not from when it began
        if not (pooled.retired and pooled.in_flight == 0 and pooled in self._retired):
            return

        async def close_retired() -> None:
            # The cancellations of its timed-out calls go out first (each gives up after 5 s).
            await asyncio.gather(*pooled.cancel_notices, return_exceptions=True)
            await self._discard(pooled)

        closer = self._loop.create_task(close_retired())
        self._closers.add(closer)
        closer.add_done_callback(self._closers.discard)

    async def _with_session(
        self,
        connection: ServerConnection,
        operation: Callable[[_PooledSession], Awaitable[T]],
        *,
        scope: str | None,
        timeout_s: float,
        open_timeout_s: float,
        resend: bool,
        after_answer: Callable[[], Awaitable[None]] | None = None,
    ) -> T:
        """Run ``operation`` over the live session, opening it if needed; then ``after_answer`` (what is done with
        the answer once it came, outside the deadline: it may raise what the answer is found to be, never a timeout
        or a transport error of the request, which was answered).

        A session found dead before anything was written (``NOT_SENT_ERRORS``) is replaced and the operation
        run on the fresh one. A session that broke after the request was written is dropped; the operation is
        run again on a fresh session only if ``resend`` (listing tools, which changes nothing); otherwise it
        raises ``McpTransportError(sent=True)``: the outcome is unknown and the caller decides."""
        for attempt in (1, 2):
            pooled = await self._get(connection, scope, open_timeout_s)
            if _server_gone(pooled):
                # The server's side of the session has ended (its process exited, its stream closed) since the
                # last call: nothing can be answered on it, so nothing is sent on it; a fresh session is opened.
                await self._discard(pooled)
                pooled = await self._get(connection, scope, open_timeout_s)
            pooled.last_used = time.monotonic()
            if pooled.http_client is not None and timeout_s + READ_TIMEOUT_MARGIN_S > (
                pooled.http_client.timeout.read or 0
            ):
                pooled.http_client.timeout = self._read_timeout(timeout_s)  # a call longer than the session allows
            pooled.in_flight += 1
            try:
                async with asyncio.timeout(timeout_s):
                    # Abandoned (its deadline passed, or its caller was stopped), the request is in a state nobody
                    # knows, as after a timeout: the session is retired (python-sdk#2416, the module's docstring).
                    answer = await _until_owner_ends(pooled, operation(pooled), abandoned=partial(self._retire, pooled))
                if after_answer is not None:
                    await after_answer()  # on the session still: it is in flight until this ends
                return answer
            except TimeoutError:
                self._retire(pooled)  # its request is in an unknown state: the session is closed once its calls end
                message = _("no answer from '%(server)s' within %(seconds)ss") % {
                    "server": connection.mcp_id,
                    "seconds": f"{timeout_s:g}",
                }
                raise McpTimeoutError(message) from None
            except _OwnerEnded as ended:
                # The session's transport failed while the request was out (an HTTP 5xx, the connection lost):
                # said at once, not after the whole timeout as "timeout". Its error is the session's, perhaps
                # another call's (a connection refused to a request beside this one): this request may have gone
                # out, and only what changes nothing is sent again.
                await self._discard(pooled)
                if attempt == 1 and resend:
                    continue
                if ended.error is None:
                    message = _("session to '%(server)s' ended") % {"server": connection.mcp_id}
                else:
                    message = _broke(connection, _describe(ended.error))
                raise McpTransportError(message) from ended.error
            except NOT_SENT_ERRORS as exc:
                await self._discard(pooled)
                if attempt == 1:
                    continue
                raise McpTransportError(_broke(connection, _describe(exc)), sent=False) from exc
            except McpError as exc:
                if (limited := _rate_limited_data(exc)) is not None:
                    if connection.transport == "sse":
                        self._retire(pooled)  # the SDK's SSE client sends nothing more after a refused POST
                    raise _rate_limited(connection, limited) from exc
                if isinstance(exc.error, _SessionEndedSeen):
                    # The transport saw the server answer this request's own POST, which carried the session's id, with
                    # 404 (or the TypeScript SDK's 400 for an unknown session: :func:`_session_not_valid`): the server
                    # restarted or ended the session, and the request was not taken, so it is sent again, once, on a
                    # fresh session (a write too). Never read from a server's words: its JSON-RPC error is no such
                    # error, whatever it says (a tool that carried out a write and then said "session terminated").
                    await self._discard(pooled)
                    if attempt == 1:
                        continue
                    message = _("session to '%(server)s' was ended by the server: %(error)s") % {
                        "server": connection.mcp_id,
                        "error": exc,
                    }
                    raise McpTransportError(message, sent=False) from exc
                if isinstance(exc.error, _RefusedSeen):
                    # The server refused this request's own POST with an HTTP 4xx and no JSON-RPC answer to it: not
                    # processed, and answered (the server is there): the server's refusal, as a JSON-RPC error is
                    # (the gate's ``protocol``: not sent again, not counted by the breaker; a 401 sent three times
                    # was three refusals). The session goes on for the calls beside it.
                    message = _("server '%(server)s' refused the request: %(error)s") % {
                        "server": connection.mcp_id,
                        "error": exc.error.message,
                    }
                    raise McpError(types.ErrorData(code=types.INVALID_REQUEST, message=message)) from exc
                if exc.error.data == ANSWER_LOST:
                    # The request went out and its answer was lost on the way (the connection dropped while its body
                    # was read; over SSE, the POST that carried it was refused): a broken transport, told at once,
                    # its outcome unknown. The session is retired, as after a timeout: over SSE it can send nothing
                    # more (the SDK stopped its writer); a call in flight on it keeps its own answer.
                    self._retire(pooled)
                    if attempt == 1 and resend:
                        continue
                    raise McpTransportError(_broke(connection, exc.error.message)) from exc
                if _session_broke(pooled, exc):
                    await self._discard(pooled)
                    if attempt == 1 and resend:
                        continue
                    why = pooled.failure or exc  # the session's own failure, where it was failed from inside
                    raise McpTransportError(_broke(connection, str(why))) from exc
                raise
            except TRANSPORT_ERRORS as exc:
                await self._discard(pooled)
                if attempt == 1 and resend:
                    continue
                raise McpTransportError(_broke(connection, _describe(exc))) from exc
            finally:
                self._release(pooled)
        raise AssertionError("unreachable")

    # ---- public, synchronous -------------------------------------------------------------------
    def call_tool(
        self,
        config: dict[str, Any],
        tool: str,
        arguments: dict[str, Any],
        *,
        timeout_s: float,
        scope: str | None = None,
    ) -> ToolCallOutcome:
        """Call ``tool`` on the server described by ``config``.

        Raises ``McpTimeoutError`` past ``timeout_s``, ``McpTransportError`` when the server cannot be reached
        or its session broke, and ``McpError`` for a protocol-level refusal (e.g. an unknown tool). The request is
        sent at most once: the two errors say with ``sent`` whether it may have reached the server (then its
        outcome is unknown, and re-sending it is the caller's decision, never the pool's).
        A tool's own failure is not an exception: it comes back with ``is_error=True``. ``scope`` None uses the
        worker's shared session of this server; any other value a session of that scope only (``close_scope``).
        """
        connection = ServerConnection.from_config(config)
        # The caller's trace context (``traceparent``), read on the caller's thread, for the request's ``_meta``.
        meta = telemetry.mcp_request_meta()
        # The answer call_tool could not check against the tool's output schema (not known yet on its session).
        unchecked: list[tuple[ClientSession, types.CallToolResult]] = []

        async def operation(pooled: _PooledSession) -> ToolCallOutcome:
            session = pooled.session
            assert session is not None
            # The id call_tool is about to use: nothing awaits between this read and its use.
            request_id = session._request_id
            try:
                result = await session.call_tool(tool, arguments, meta=meta)
                if not session.output_schema_known(tool):  # as call_tool found it: nothing awaited since
                    unchecked[:] = [(session, result)]
            except asyncio.CancelledError:
                # The deadline passed: tell the server to stop working on the request (before its session, retired
                # for it, is closed).
                notice = self._loop.create_task(_send_cancelled(session, request_id))
                pooled.cancel_notices.add(notice)
                notice.add_done_callback(pooled.cancel_notices.discard)
                raise
            except McpError as exc:
                if exc.error.data == UNREADABLE_ANSWER:
                    # The tool answered, with what cannot be read: a result that is not what it promised.
                    raise ToolResultInvalid(exc.error.message) from exc
                if (too_long := _too_long_answer_data(exc)) is not None:
                    # The tool answered, at a length the pool does not read: refused unread, never a timeout.
                    raise ToolResultTooBig(_too_long_answer_text(too_long)) from exc
                if (unmatched := _unmatched_answer_data(exc)) is not None:
                    # The server answered on the call's own POST, with an answer that names another request or none:
                    # the request went out and was answered; what came back is not the answer it asked for.
                    raise ToolResultInvalid(_unmatched_answer_text(unmatched)) from exc
                raise
            content = [block.model_dump(mode="json", exclude_none=True) for block in result.content]
            text = "\n".join(str(block.get("text", "")) for block in content if block.get("type") == "text")
            notes = "\n".join(filter(None, (_block_text(b) for b in content if b.get("type") != "text")))
            return ToolCallOutcome(
                is_error=bool(result.isError),
                text=text,
                structured=result.structuredContent,
                content=content,
                notes=notes,
            )

        async def check_answer() -> None:
            # The tools list it is checked against is read now, past the call's deadline: however slow the list, an
            # answered call is never a timeout (a read sent again, a write of unknown outcome).
            for session, result in unchecked:
                await session.check_tool_result(tool, result)

        return self._run_operation(
            connection, operation, scope=scope, timeout_s=timeout_s, resend=False, after_answer=check_answer
        )

    def _run_operation(
        self,
        connection: ServerConnection,
        operation: Any,
        *,
        scope: str | None,
        timeout_s: float,
        resend: bool,
        after_answer: Callable[[], Awaitable[None]] | None = None,
    ) -> ToolCallOutcome:
        """Run one request on a pooled session of ``connection`` (opened within ``max(timeout_s, 30)``), from the
        caller's thread; ``resend``: a broken session's request may be sent again on a fresh one (reads only)."""
        result: ToolCallOutcome = self.submit(
            self._with_session(
                connection,
                operation,
                scope=scope,
                timeout_s=timeout_s,
                open_timeout_s=max(timeout_s, 30.0),
                resend=resend,
                after_answer=after_answer,
            ),
            # The session opened, the call, and its answer's check (``OUTPUT_SCHEMA_WAIT_S`` at most), with room.
            timeout=timeout_s + max(timeout_s, 30.0) * 2 + 10,
        )
        return result

    def read_resource(
        self, config: dict[str, Any], uri: str, *, timeout_s: float, scope: str | None = None
    ) -> ToolCallOutcome:
        """Read an MCP resource: its text contents joined (a binary content is named, not included). Raises as
        ``call_tool`` does; reading changes nothing, so a broken session is retried once on a fresh one."""
        from mcp import types
        from pydantic import AnyUrl

        connection = ServerConnection.from_config(config)
        meta = _request_meta()

        async def operation(pooled: _PooledSession) -> ToolCallOutcome:
            assert pooled.session is not None
            # As ClientSession.read_resource sends it, with the trace context in ``_meta`` (which it does not take).
            request = types.ReadResourceRequest(params=types.ReadResourceRequestParams(uri=AnyUrl(uri), _meta=meta))
            result = await pooled.session.send_request(types.ClientRequest(request), types.ReadResourceResult)
            contents = [c.model_dump(mode="json", exclude_none=True) for c in result.contents]
            text = "\n".join(
                str(c["text"]) if "text" in c else f"[binary {c.get('mimeType', '')} content of {c.get('uri', uri)}]"
                for c in contents
            )
            return ToolCallOutcome(is_error=False, text=text, structured=None, content=contents)

        return self._run_operation(connection, operation, scope=scope, timeout_s=timeout_s, resend=True)

    def get_prompt(
        self,
        config: dict[str, Any],
        name: str,
        arguments: dict[str, str],
        *,
        timeout_s: float,
        scope: str | None = None,
    ) -> ToolCallOutcome:
        """Render an MCP prompt: ``structured`` is its messages as ``[{"role", "text"}]`` (text contents only),
        ``text`` those texts joined."""
        from mcp import types

        connection = ServerConnection.from_config(config)
        meta = _request_meta()

        async def operation(pooled: _PooledSession) -> ToolCallOutcome:
            assert pooled.session is not None
            request = types.GetPromptRequest(
                params=types.GetPromptRequestParams(name=name, arguments=arguments, _meta=meta)
            )
            result = await pooled.session.send_request(types.ClientRequest(request), types.GetPromptResult)
            messages = [
                {"role": m.role, "text": str(getattr(m.content, "text", ""))}
                for m in result.messages
                if getattr(m.content, "type", "") == "text"
            ]
            return ToolCallOutcome(
                is_error=False,
                text="\n\n".join(m["text"] for m in messages),
                structured={"messages": messages},
                content=[],
            )

        return self._run_operation(connection, operation, scope=scope, timeout_s=timeout_s, resend=True)

    def list_tools(self, config: dict[str, Any], *, timeout_s: float = 30.0, scope: str | None = None) -> ServerListing:
        """Initialize (or reuse) a session and list the server's tools, and its resources and prompts where the
        server offers them: every page of each (at most ``LIST_PAGES_MAX``: past that, an ``McpError``)."""
        connection = ServerConnection.from_config(config)

        async def every_page(method: str, list_page: Callable[..., Awaitable[Any]], items: str) -> list[dict[str, Any]]:
            listed: list[dict[str, Any]] = []
            cursor: str | None = None
            for _page in range(LIST_PAGES_MAX):
                page = await list_page(params=types.PaginatedRequestParams(cursor=cursor) if cursor else None)
                listed.extend(item.model_dump(mode="json", exclude_none=True) for item in getattr(page, items))
                cursor = page.nextCursor
                if not cursor:
                    return listed
            message = _("server '%(server)s' answered %(method)s with more than %(pages)s pages") % {
                "server": connection.mcp_id,
                "method": method,
                "pages": LIST_PAGES_MAX,
            }
            raise McpError(types.ErrorData(code=types.INTERNAL_ERROR, message=message))

        async def operation(pooled: _PooledSession) -> ServerListing:
            session = pooled.session
            assert session is not None
            tools = await every_page("tools/list", session.list_tools, "tools")
            listing = ServerListing(pooled.protocol_version, pooled.server_info, tools)
            if "resources" in pooled.capabilities:
                listing.resources = await every_page("resources/list", session.list_resources, "resources")
            if "prompts" in pooled.capabilities:
                listing.prompts = await every_page("prompts/list", session.list_prompts, "prompts")
            return listing

        return self.submit(
            self._with_session(
                connection, operation, scope=scope, timeout_s=timeout_s, open_timeout_s=timeout_s, resend=True
            ),
            timeout=timeout_s * 3 + 10,
        )

    def open(self, config: dict[str, Any], *, timeout_s: float = 30.0, scope: str | None = None) -> None:
        """Open a session of ``config``'s server (or find it open), so that the first call on it does not wait
        for the server to start. Sends nothing but the protocol's initialize: no tool is called."""
        self.submit(self._get(ServerConnection.from_config(config), scope, timeout_s), timeout=timeout_s + 10)

    def server_ended(self, mcp_id: str) -> bool:
        """Whether a session of ``mcp_id`` is held whose server's end has closed (its next call opens a fresh
        session instead of sending on it)."""
        return any(p.connection.mcp_id == mcp_id and _server_gone(p) for p in list(self._sessions.values()))

    def live_sessions(self) -> dict[str, dict[str, Any]]:
        """session key → what is known of its live session (for the admin and tests)."""
        return {
            key: {"mcp_id": p.connection.mcp_id, "protocol_version": p.protocol_version, "server_info": p.server_info}
            for key, p in self._sessions.items()
            if not p.dead
        }

    def close(self, mcp_id: str) -> None:
        """Close every live session of one server, whatever its scope."""

        async def close_matching() -> None:
            for key in [k for k, p in self._sessions.items() if p.connection.mcp_id == mcp_id]:
                await self._drop(key)
            for pooled in [p for p in self._retired if p.connection.mcp_id == mcp_id]:
                await self._discard(pooled)

        self.submit(close_matching(), timeout=30)

    def close_scope(self, scope: str) -> None:
        """Close every session opened for ``scope`` (a run's sessions, at its end). A scope without a session
        (most runs: their servers' sessions are shared) costs no hop to the pool's loop: the keys are read here
        (a copy of the dict's keys is taken whole), and a session of this scope is opened only by the run's own
        calls, which are over when it ends (one still opening is closed by the idle reaper)."""
        if not any(_scope_of(key) == scope for key in [*self._sessions, *(p.key for p in list(self._retired))]):
            return

        async def close_matching() -> None:
            await asyncio.gather(
                *(self._drop(k) for k in list(self._sessions) if _scope_of(k) == scope),
                *(self._discard(p) for p in list(self._retired) if _scope_of(p.key) == scope),
            )

        self.submit(close_matching(), timeout=30)

    @staticmethod
    def child_process_ids() -> list[int]:
        """Process ids of this process's live children (the stdio servers it started), read from /proc."""
        me = os.getpid()
        children = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == me and fields[0] != "Z":
                children.append(int(entry))
        return sorted(children)

    def shutdown(self) -> None:
        """Close every session (ending every stdio server process) and stop the loop."""
        if self._closed:
            return

        async def close_all() -> None:
            if self._reaper is not None:
                self._reaper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._reaper
            await asyncio.gather(
                *(self._drop(k) for k in list(self._sessions)),
                *(self._discard(p) for p in list(self._retired)),
                *list(self._closers),
                return_exceptions=True,
            )

        with contextlib.suppress(Exception):
            self.submit(close_all(), timeout=30)
        self._closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)


async def _send_cancelled(session: ClientSession, request_id: int) -> None:
    """MCP's cancellation notification for an abandoned request (best effort: the session may be gone)."""
    notification = types.ClientNotification(
        types.CancelledNotification(params=types.CancelledNotificationParams(requestId=request_id, reason="timeout"))
    )
    with contextlib.suppress(Exception):
        await asyncio.wait_for(session.send_notification(notification), timeout=5)


def _policy_view(connection: ServerConnection) -> dict[str, Any]:
    """``connection`` as the binding policy reads a binding (``binding_policy.binding_problem``)."""
    return {
        "transport": connection.transport,
        "command": connection.command,
        "args": list(connection.args),
        "env": dict(connection.env),
        "url": connection.url,
    }


def _session_key(connection: ServerConnection, scope: str | None) -> str:
    return f"{connection.key}|{scope}" if scope else connection.key


def _scope_of(key: str) -> str | None:
    return key.split("|", 1)[1] if "|" in key else None


def _block_text(block: dict[str, Any]) -> str:
    """What a result's content block says as text: a text block's text, an embedded text resource's text, and for
    what is not text (an image, audio, a binary resource, a link) a short note of what it is, never its bytes: a
    result made only of those reads as what it is, not as an empty answer (``ToolCallOutcome.notes``)."""
    kind = block.get("type")
    if kind == "text":
        return str(block.get("text", ""))
    if kind in ("image", "audio"):
        size = _base64_size(str(block.get("data") or ""))
        return f"[{kind}: {block.get('mimeType') or 'unknown type'}, {size} bytes, not shown]"
    if kind == "resource":
        resource = block.get("resource") or {}
        if isinstance(resource.get("text"), str):
            return str(resource["text"])
        size = _base64_size(str(resource.get("blob") or ""))
        return f"[resource {resource.get('uri', '')}: {resource.get('mimeType') or 'binary'}, {size} bytes, not shown]"
    if kind == "resource_link":
        return f"[resource link: {block.get('uri', '')} {block.get('name', '')}]".replace(" ]", "]")
    return f"[{kind} content, not shown]"


def _base64_size(data: str) -> int:
    """The size in bytes of padded base64 ``data`` (not decoded)."""
    data = data.strip()
    return len(data) * 3 // 4 - data[-2:].count("=")


def _session_broke(pooled: _PooledSession, exc: McpError) -> bool:
    """Whether ``exc`` says the session broke (the SDK answers every pending request with ``CONNECTION_CLOSED``
    when its transport ends), not that the server refused the request: decided by the error's code and the
    session's state, never by its words (a server's "ticket T-1 is already closed" is the server's answer)."""
    if pooled.dead:
        return True
    error = getattr(exc, "error", None)
    return (
        getattr(error, "code", None) == types.CONNECTION_CLOSED and getattr(error, "message", "") == "Connection closed"
    )


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions)
    if isinstance(exc, _CallError):
        return str(exc)  # the pool's own words
    if isinstance(exc, httpx.HTTPStatusError):
        return _http_error_text(exc.response)
    if isinstance(exc, McpError) and (unmatched := _unmatched_answer_data(exc)) is not None:
        return _unmatched_answer_text(unmatched)
    # httpx appends "For more information check: https://developer.mozilla.org/…": noise in a health error.
    text = str(exc).split("\nFor more information check:")[0].strip()
    raw = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    words = _transport_failure_words(exc)
    return f"{words} ({raw})" if words else raw


def _transport_failure_words(exc: BaseException) -> str | None:
    """What a transport library's own words for the commonest failures mean, in the reader's language (an admin
    met ``ConnectError: All connection attempts failed`` on a Korean page): said before them, which stay beside."""
    if isinstance(exc, httpx.ConnectTimeout):
        return _("nothing answered at that address in time")
    if isinstance(exc, httpx.ConnectError):
        return _("nothing answers at that address (the connection was refused, or the host cannot be reached)")
    if isinstance(exc, McpError) and "connection closed" in str(exc).lower():
        return _("the server closed the connection before it answered (its program may have exited, or it is no "
                 "MCP server)")  # fmt: skip
    return None


def _http_error_text(response: httpx.Response) -> str:
    """An HTTP answer that failed a request (an error status, or a redirect the SDK does not follow: one that leaves
    the server's origin or changes the method), said as its status and the address that answered, without that
    address's query, fragment and user-info (:func:`_address_shown`); of a redirect, also where it leads, cut the
    same way.

    httpx's own text ("Client error '403 Forbidden' for url '…'") quotes the URL whole: a key in its query or a
    password in its user-info is no secret the binding stores (those are its env and header values), and masking
    knows it only where the parameter's name gives it away (``?token=``, not ``?k=``)."""
    status = _http_status_text(response)
    address = _address_shown(response.request.url)
    location = response.headers.get("location")
    if response.is_redirect and location:
        with contextlib.suppress(httpx.InvalidURL):
            target = _address_shown(response.request.url.join(location))
            return _("%(status)s from %(url)s, a redirect to %(location)s that is not followed") % {
                "status": status,
                "url": address,
                "location": target,
            }
    return _("%(status)s from %(url)s") % {"status": status, "url": address}


def _address_shown(url: httpx.URL) -> str:
    """``url`` as a message may quote it: its scheme, host, port and path; never its query, fragment or user-info, the
    parts of a URL that carry credentials (``?token=…``, ``https://user:password@host``). An international name is
    shown as written (``사내도구.한국``, as ``binding_policy._client_host`` shows it), not in its ``xn--`` form."""
    try:
        host = url.host  # decodes IDNA: raises for a malformed "xn--" label (the binding policy refuses those)
    except ValueError:
        host = url.raw_host.decode("ascii", errors="replace")
    host = f"[{host}]" if ":" in host else host
    port = f":{url.port}" if url.port is not None else ""
    return f"{url.scheme}://{host}{port}{url.path}"


def _broke(connection: ServerConnection, error: str) -> str:
    """The pool's sentence for a session that broke under a request, ``error`` saying how."""
    return _("session to '%(server)s' broke: %(error)s") % {"server": connection.mcp_id, "error": error}


UNREADABLE_ANSWER = "platform:unreadable_answer"
"""The ``data`` of the JSON-RPC error a request is failed with when its answer could not be parsed."""

ANSWER_LOST = "platform:answer_lost"
"""The ``data`` of the JSON-RPC error a request is failed with when its answer was lost on the way (the connection
dropped while its body was read, or the POST that carried it was refused): the pool raises it as a transport error
of a request that went out (``sent=True``)."""

# A JSON text's strings and brackets, to read the top level of a line too deeply nested to parse.
_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[{}\[\]]')
_KEY_COLON = re.compile(r"\s*:")
_ID_VALUE = re.compile(r'\s*:\s*(-?[0-9]+|"(?:[^"\\]|\\.)*")')


async def _fail_unreadable_answer(session: ClientSession, exc: Exception) -> bool:
    """Fail the pending request that the line the SDK could not parse (``exc``, its parse error) answers, with a
    JSON-RPC error marked :data:`UNREADABLE_ANSWER`. Returns whether there was one.

    The SDK hands such an error to the message handler only (a structured content nested deeper than pydantic's
    parser goes, about 200 levels): the request it answers would wait for its whole timeout, be taken for
    unanswered (retried; for a write, its outcome unknown) though the server answered. The line's ``id`` is read
    from its top level without parsing it; the SDK's pending requests (``_response_streams``) are private to it."""
    line = _unparsed_line(exc)
    request_id = _response_id(line) if line is not None else None
    if request_id is None:
        return False
    why = _parse_error_reason(exc)
    error = types.ErrorData(
        code=types.PARSE_ERROR, message=f"the server's answer could not be read: {why}", data=UNREADABLE_ANSWER
    )
    return await _fail_pending_request(session, request_id, error)


ANSWER_TOO_LONG = "platform:answer_too_long"
"""The ``data["platform"]`` of the JSON-RPC error a request is failed with when its answer is longer than the pool
reads: a stdio server's line (:class:`_LineTooLong`), a streamable HTTP answer or event (:class:`_BoundedAnswer`)."""

# The id of a JSON-RPC answer that ends a line, as its last key (the object's closing brace the only one after it).
# How much of a too-long answer's head is read for its id (servers write it before the result): the reading
# restarts at each escaped quote of a string the cut leaves open, its time growing with the square of what it reads
# (64 KiB of a JSON text quoted in the result held the pool's loop, every session of the worker, for 18 s).
ANSWER_ID_HEAD_BYTES = 2048

_LAST_ID = re.compile(rb'(?<!\\)"id"\s*:\s*(-?[0-9]+|"(?:[^"\\]|\\.)*")\s*\}\s*$')


def _too_long_answer_id(line: _LineTooLong) -> int | str | None:
    """The ``id`` of the answer ``line`` is: read from its head (where servers write it, before the result), else
    as the last key of its tail; None where neither shows one (its request then waits for its deadline)."""
    found = _response_id(line.head[:ANSWER_ID_HEAD_BYTES].decode("utf-8", errors="replace"))
    if found is None and (last := _LAST_ID.search(line.tail)) is not None:
        with contextlib.suppress(ValueError):
            found = json.loads(last[1])
    return found if isinstance(found, (int, str)) and not isinstance(found, bool) else None


async def _fail_too_long_answer(session: ClientSession, line: _LineTooLong) -> bool:
    """Fail the pending request that ``line`` (an answer too long to read) answers, with a JSON-RPC error marked
    :data:`ANSWER_TOO_LONG`. Returns whether there was one: the request is answered, not left to time out."""
    request_id = _too_long_answer_id(line)
    if request_id is None:
        return False
    return await _fail_pending_request(session, request_id, _answer_too_long_error(str(line), line.size, line.line_max))


def _answer_too_long_error(message: str, size: int | None, max_bytes: int) -> types.ErrorData:
    """The error a request is failed with when its answer is longer than the pool reads: ``size`` its size in bytes,
    None where it is not known (an HTTP answer cut as it was read)."""
    return types.ErrorData(
        code=types.INTERNAL_ERROR,
        message=message,
        data={"platform": ANSWER_TOO_LONG, "bytes": size, "max_bytes": max_bytes},
    )


def _too_long_answer_data(exc: McpError) -> dict[str, Any] | None:
    """The data of an :data:`ANSWER_TOO_LONG` error; None for any other."""
    data = exc.error.data
    return data if isinstance(data, dict) and data.get("platform") == ANSWER_TOO_LONG else None


def _too_long_answer_text(data: dict[str, Any]) -> str:
    """The pool's sentence for an answer too long to read."""
    if data["bytes"] is None:
        return _("the answer is longer than the %(max_bytes)s bytes read; refused unread") % {
            "max_bytes": data["max_bytes"]
        }
    return _("the answer is %(bytes)s bytes long, more than the %(max_bytes)s bytes read; refused unread") % {
        "bytes": data["bytes"],
        "max_bytes": data["max_bytes"],
    }


async def _fail_lost_answer(session: ClientSession, exc: httpx.RequestError) -> bool:
    """Fail the pending request whose HTTP answer ``exc`` lost (the connection dropped while its body was read), with
    a JSON-RPC error marked :data:`ANSWER_LOST`. Returns whether there was one.

    The streamable HTTP client hands such an error to the message handler only: the request would wait for its whole
    timeout, then be taken for unanswered. Which request it was is read from the body of the HTTP request that
    carried it (``exc.request``): the error itself names none."""
    try:
        request = exc.request
    except RuntimeError:  # an error raised outside a request (httpx sets it on those raised while one is sent)
        return False
    request_id = _carried_request_id(request)
    if request_id is None:
        return False
    return await _fail_pending_request(session, request_id, _answer_lost_error(_describe(exc)))


async def _fail_refused_post(session: ClientSession, response: httpx.Response) -> None:
    """Fail the pending request whose POST the server refused (a 403, a 500: an SSE session's POSTs, where
    ``response`` is the HTTP answer to one), with a JSON-RPC error marked :data:`ANSWER_LOST` naming the status.

    The SDK's SSE client logs the HTTP error and stops sending on the session, but the request would wait for its
    whole timeout. The status is said, never the URL (its query may hold a key). A redirect the SDK follows is not a
    refusal."""
    if response.request.method != "POST" or response.is_success or next_request_within_origin(response) is not None:
        return
    request_id = _carried_request_id(response.request)
    if request_id is None:
        return  # a notification, or the answer to a server's request: nobody waits for it
    if response.status_code == HTTP_TOO_MANY_REQUESTS:
        # Refused, not lost: the server did not carry it out (the URL is not said: its query may hold a key).
        await _fail_pending_request(session, request_id, _rate_limited_error(response, address=False))
        return
    status = _http_status_text(response)
    await _fail_pending_request(session, request_id, _answer_lost_error(status))


def _http_status_text(response: httpx.Response) -> str:
    """``HTTP 403 Forbidden``: an answer's status as the pool's messages name it."""
    return f"HTTP {response.status_code} {httpx.codes.get_reason_phrase(response.status_code)}".strip()


HTTP_TOO_MANY_REQUESTS = 429
HTTP_NOT_FOUND = 404
HTTP_BAD_REQUEST = 400

# How much of the body of an HTTP 4xx answer to a request's POST is read (:func:`_keep_refusal`): a JSON-RPC error is
# short; a longer body is no answer the pool hands on.
REFUSAL_MAX_BYTES = 64 * 1024

# The TypeScript SDK's answer to a POST whose ``mcp-session-id`` it does not know (its example servers' and
# server-everything's, after a restart): HTTP 400 with this JSON-RPC error, its id null, the request's, or left out
# (server-everything's ``id: req?.body?.id``, its body not parsed there). The Python SDK's servers answer 404 (MCP's
# word for it).
TS_SESSION_NOT_VALID = (-32000, "Bad Request: No valid session ID provided")


class _TransportSeen(types.ErrorData):
    """A request's failure as this pool's HTTP transport saw it: the status of the HTTP answer to the request's own POST
    (a 429, a 404, a refusal), never what a server wrote. The transport hands it to the waiting request itself, so
    the caller's ``McpError`` holds this very object; every JSON-RPC error a server sends is parsed into a plain
    ``ErrorData``: whatever its code, its words or its ``data``, a server cannot make one of these."""


class _SessionEndedSeen(_TransportSeen):
    """The server answered the request's own POST, which carried the session's id, with 404 (MCP: the session is not
    known; the client must open a new one), or with the TypeScript SDK's 400 that says the same
    (:func:`_session_not_valid`): the request was refused before it was processed."""


class _RefusedSeen(_TransportSeen):
    """The server refused the request's own POST with an HTTP 4xx (other than 429, or 404 to a session's request) and
    no JSON-RPC answer to it: the request was not processed (a 4xx is the client's error, refused as it came)."""


def _refused_seen(response: httpx.Response) -> _RefusedSeen:
    return _RefusedSeen(code=types.INVALID_REQUEST, message=_http_error_text(response))


def _session_not_valid(response: httpx.Response) -> bool:
    """Whether ``response`` is the TypeScript SDK's answer to a POST carrying an ``mcp-session-id`` it does not know
    (a server that restarted): HTTP 400 whose whole body is the JSON-RPC error :data:`TS_SESSION_NOT_VALID` (its id
    null, the request's, or none). Read from the status and the SDK's fixed body, as a 404 is read from its status.

    It cannot stand for a request that was processed: an answer after processing is HTTP 200 (or an event stream); a
    4xx refuses the request as it came (every other 4xx fails its request as not processed too:
    :class:`_RefusedSeen`). A server's JSON-RPC error in a 200 answer, whatever its words, is its answer, and never
    read so."""
    request = response.request
    if (
        response.status_code != HTTP_BAD_REQUEST
        or request.method != "POST"
        or not request.headers.get("mcp-session-id")
    ):
        return False
    try:
        body = json.loads(response.content)
    except (httpx.ResponseNotRead, ValueError):
        return False
    if not isinstance(body, dict) or body.keys() - {"id"} != {"jsonrpc", "error"} or body["jsonrpc"] != "2.0":
        return False
    error, answered = body["error"], body.get("id")
    carried = _carried_request_id(request)
    return (
        isinstance(error, dict)
        and error.keys() == {"code", "message"}
        and (error["code"], error["message"]) == TS_SESSION_NOT_VALID
        and (answered is None or (carried is not None and _is_request_id(answered, carried)))
    )


def _error_answer(response: httpx.Response, request_id: int | str) -> types.JSONRPCError | None:
    """The JSON-RPC error for ``request_id`` that a 4xx ``response`` carries as its body (read by :func:`_keep_refusal`),
    or None where its body is no such error (an HTML page, an error for another id or none)."""
    try:
        message = types.JSONRPCMessage.model_validate_json(response.content)
    except (httpx.ResponseNotRead, ValueError):  # pydantic's ValidationError is a ValueError
        return None
    answer = message.root
    if isinstance(answer, types.JSONRPCError) and _is_request_id(answer.id, request_id):
        return answer
    return None


def _refusal_to_keep(response: httpx.Response) -> bool:
    """Whether ``response`` is an HTTP 4xx to a POST whose body :class:`_StreamableHttpTransport` reads (the SDK raises
    its status unread): not a 404 or a 429, which say all in their status and headers."""
    return (
        response.request.method == "POST"
        and 400 <= response.status_code < 500
        and response.status_code not in (HTTP_NOT_FOUND, HTTP_TOO_MANY_REQUESTS)
    )


async def _keep_refusal(response: httpx.Response) -> None:
    """Read the body of ``response`` (an HTTP 4xx: :func:`_refusal_to_keep`, a response hook, before the SDK sees it)
    up to :data:`REFUSAL_MAX_BYTES`, decoded, so that its content is there once the SDK has raised its status and
    closed it. A longer body is cut (no JSON-RPC error then); a connection dropped while it is read leaves what came."""
    decoded = httpx.Response(
        response.status_code, headers=response.headers, stream=response.stream, request=response.request
    )
    kept = b""
    try:
        async for chunk in decoded.aiter_bytes():
            kept += chunk
            if len(kept) > REFUSAL_MAX_BYTES:
                break
    except httpx.HTTPError:
        pass  # the status refused the request already: its body is only what the server said of it
    finally:
        await decoded.aclose()
    response.stream = httpx.ByteStream(kept[:REFUSAL_MAX_BYTES])
    response.headers.pop("content-encoding", None)
    await response.aread()


RATE_LIMITED = "platform:rate_limited"
"""The ``data["platform"]`` of the JSON-RPC error a request is failed with when the server answered its HTTP request
with 429 Too Many Requests: the pool raises it as :class:`McpRateLimited`."""

_DELAY_SECONDS = re.compile(r"[0-9]+(?:\.[0-9]+)?")  # RFC 9110 says whole seconds; "1.5" is read too


def retry_after_seconds(response: httpx.Response) -> float | None:
    """How long an HTTP answer's ``Retry-After`` asks the client to wait, in seconds (RFC 9110 §10.2.3): its
    delay-seconds, or the time from the answer's own ``Date`` to its HTTP date (the server's clock against itself:
    the worker's may differ from it by more than the wait), from now where the answer has no ``Date``; never below
    0. None where it has no ``Retry-After`` or one that is neither."""
    value = response.headers.get("retry-after", "").strip()
    if _DELAY_SECONDS.fullmatch(value):
        return float(value)
    until = _http_date(value)
    if until is None:
        return None
    now = _http_date(response.headers.get("date", "")) or datetime.now(UTC)
    return max((until - now).total_seconds(), 0.0)


def _http_date(value: str) -> datetime | None:
    """An HTTP date (``Wed, 21 Oct 2015 07:28:00 GMT``, or one of the older forms) as an aware datetime; None for
    anything else."""
    try:
        parsed = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)  # HTTP dates are GMT


def _rate_limited_error(response: httpx.Response, *, address: bool) -> types.ErrorData:
    """The error a request is failed with when its HTTP answer was 429 (:data:`RATE_LIMITED`): the status, where
    ``address`` the address that answered (never its query: :func:`_address_shown`), and the ``Retry-After`` in
    seconds, read when the answer came (an HTTP date counts down from then). The sentence is made in the caller's
    language by :func:`_rate_limited`."""
    status = _http_status_text(response)
    data = {
        "platform": RATE_LIMITED,
        "status": status,
        "url": _address_shown(response.request.url) if address else "",
        "retry_after_s": retry_after_seconds(response),
    }
    return _TransportSeen(code=types.INTERNAL_ERROR, message=status, data=data)


def _rate_limited_data(exc: BaseException) -> dict[str, Any] | None:
    """The data of a :data:`RATE_LIMITED` error, ``exc`` or one in its group (a session's opening fails in its
    task group); None for any other."""
    if isinstance(exc, BaseExceptionGroup):
        return next(filter(None, map(_rate_limited_data, exc.exceptions)), None)
    # Only the pool's own error (:class:`_TransportSeen`): a server's JSON-RPC error with the same ``data`` is its answer.
    data = exc.error.data if isinstance(exc, McpError) and isinstance(exc.error, _TransportSeen) else None
    return data if isinstance(data, dict) and data.get("platform") == RATE_LIMITED else None


def _rate_limited(connection: ServerConnection, data: dict[str, Any]) -> McpRateLimited:
    """The pool's error for a request the server refused with HTTP 429 (``data``: :func:`_rate_limited_error`'s)."""
    status = data["status"]
    if data["url"]:
        status = _("%(status)s from %(url)s") % {"status": status, "url": data["url"]}
    retry_after_s = data["retry_after_s"]
    if retry_after_s is None:
        message = _("server '%(server)s' refused the request as rate limited: %(error)s") % {
            "server": connection.mcp_id,
            "error": status,
        }
    else:
        message = _("server '%(server)s' refused the request as rate limited: %(error)s; retry after %(seconds)s s") % {
            "server": connection.mcp_id,
            "error": status,
            "seconds": f"{retry_after_s:g}",
        }
    return McpRateLimited(message, retry_after_s=retry_after_s)


def _answer_lost_error(detail: str) -> types.ErrorData:
    return types.ErrorData(code=types.CONNECTION_CLOSED, message=detail, data=ANSWER_LOST)


def _carried_request_id(request: httpx.Request) -> int | str | None:
    """The id of the JSON-RPC request an HTTP request's body carried (None for a notification, an answer, or a body
    that is not JSON-RPC)."""
    try:
        message = json.loads(request.content)
    except (httpx.RequestNotRead, ValueError):
        return None
    if not isinstance(message, dict) or "method" not in message:
        return None
    request_id = message.get("id")
    return request_id if isinstance(request_id, (int, str)) and not isinstance(request_id, bool) else None


async def _fail_pending_request(session: ClientSession, request_id: int | str, error: types.ErrorData) -> bool:
    """Answer ``session``'s pending request ``request_id`` with ``error`` (its caller raises it as ``McpError``).
    Returns whether it was pending. The SDK's pending requests (``_response_streams``) are private to it."""
    if isinstance(request_id, str) and request_id.lstrip("-").isdigit():
        request_id = int(request_id)  # as the SDK matches an answer's id to its request's
    stream = session._response_streams.pop(request_id, None)
    if stream is None:
        return False
    with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):  # its caller gave up already
        await stream.send(types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error))
    return True


def _http_client_factory(
    *, on_response: Callable[[httpx.Response], Awaitable[None]]
) -> Callable[..., httpx.AsyncClient]:
    """The SDK's HTTP client factory (``create_mcp_http_client``), with ``on_response`` called on every answer."""

    def factory(
        headers: dict[str, str] | None = None, timeout: httpx.Timeout | None = None, auth: httpx.Auth | None = None
    ) -> httpx.AsyncClient:
        client = create_mcp_http_client(headers=headers, timeout=timeout, auth=auth)
        client.event_hooks = {**client.event_hooks, "response": [*client.event_hooks["response"], on_response]}
        return client

    return factory


def _parse_errors(exc: Exception) -> list[dict[str, Any]]:
    """The entries of a parse error (pydantic's ``ValidationError``, as the SDK's stdio reader raises it); none for
    any other exception."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        with contextlib.suppress(Exception):
            return list(errors())
    return []


def _parse_error_reason(exc: Exception) -> str:
    """Why the SDK could not parse a line ("Invalid JSON: recursion limit exceeded at line 1 column 1270"), without
    the line itself (a server's text, which the error's own ``str`` quotes)."""
    return next((str(error.get("msg", "")) for error in _parse_errors(exc)), type(exc).__name__)


def _unparsed_line(exc: Exception) -> str | None:
    """The line a parse error refused. An HTTP answer is parsed from bytes: decoded here, a byte that is not UTF-8
    replaced (an answer that is not UTF-8 is one the SDK refused, its id still readable)."""
    for error in _parse_errors(exc):
        unparsed = error.get("input")
        if isinstance(unparsed, bytes):
            return unparsed.decode("utf-8", errors="replace")
        if isinstance(unparsed, str):
            return unparsed
    return None


def _response_id(line: str) -> int | str | None:
    """The ``id`` of the JSON-RPC answer ``line`` is (an object with an ``id`` and a ``result`` or an ``error`` at
    its top level, and no ``method``: a server's own request has an id of its own), read without parsing it; None
    where it is no such answer."""
    answer = _answer_in_line(line)
    found = answer.request_id if answer is not None else None
    return found if isinstance(found, (int, str)) else None


@dataclass(frozen=True)
class _AnswerSeen:
    """A JSON-RPC answer (a ``result`` or an ``error``; not a server's own request or notification) as far as it could
    be read: its ``id`` (None where it has none), and for an error the server's message (where it could be parsed)."""

    request_id: Any
    error: str | None = None


def _answer_in_line(line: str) -> _AnswerSeen | None:
    """The JSON-RPC answer ``line`` is (a ``result`` or an ``error`` at its top level, and no ``method``), read without
    parsing it (it may be nested too deeply to parse); None where it is no such answer."""
    if not line.lstrip().startswith("{"):
        return None
    depth, keys, found = 0, set[str](), None
    for token in _JSON_TOKEN.finditer(line):
        text = token[0]
        if text[0] == '"':
            if depth == 1 and _KEY_COLON.match(line, token.end()):
                keys.add(text[1:-1])
                if text == '"id"' and (value := _ID_VALUE.match(line, token.end())) is not None:
                    found = json.loads(value[1])
        elif text in "{[":
            depth += 1
        else:
            depth -= 1
    if "method" in keys or not keys & {"result", "error"}:
        return None
    return _AnswerSeen(found)


def _answer_in(item: SessionMessage | Exception) -> _AnswerSeen | None:
    """The JSON-RPC answer the transport hands on: a parsed one, or one the SDK could not parse (read from its parse
    error: the object it refused, or the text where it was no JSON); None for anything else (a server's request or
    notification, an HTTP error)."""
    if isinstance(item, SessionMessage):
        root = item.message.root
        if isinstance(root, types.JSONRPCError):
            return _AnswerSeen(root.id, root.error.message)
        return _AnswerSeen(root.id) if isinstance(root, types.JSONRPCResponse) else None
    for error in _parse_errors(item):
        refused = error.get("input")
        if isinstance(refused, dict):  # JSON, but no JSON-RPC message: an answer without an id, say
            if "method" in refused or not refused.keys() & {"result", "error"}:
                return None
            server_error = refused.get("error")
            said = server_error.get("message") if isinstance(server_error, dict) else None
            return _AnswerSeen(refused.get("id"), said if isinstance(said, str) else None)
    line = _unparsed_line(item)
    return _answer_in_line(line) if line is not None else None


def _is_request_id(answered: object, request_id: int | str) -> bool:
    """Whether an answer's id names ``request_id``, as the SDK matches them (a string of digits is that number)."""
    if isinstance(answered, bool) or not isinstance(answered, (int, str)):
        return False
    if isinstance(answered, str) and isinstance(request_id, int):
        with contextlib.suppress(ValueError):
            return int(answered) == request_id
    return answered == request_id


UNMATCHED_ANSWER = "platform:unmatched_answer"
"""The ``data["platform"]`` of the JSON-RPC error a request is failed with when the answer that came back on its own
HTTP request names another request, or none (:class:`_OwnAnswerWriter`)."""


def _unmatched_answer_error(answer: _AnswerSeen, request_id: int | str) -> types.ErrorData:
    """The error ``request_id`` is failed with for ``answer``: what is shown of it is masked and cut here (the server
    wrote it), and said in words where it is shown (:func:`_unmatched_answer_text`, in the caller's language)."""
    answered = None if answer.request_id is None else json.dumps(answer.request_id, ensure_ascii=False, default=str)
    data = {
        "platform": UNMATCHED_ANSWER,
        "request_id": request_id,
        "answered_id": mask_text(answered[:4096])[:50] if answered is not None else None,
        "server_error": mask_text(answer.error[:4096])[:200] if answer.error else None,
    }
    # The error's own message is English (the request may be another caller's, in another language): the words are
    # said again, in the caller's language, where they are shown.
    with translation.override(None) if settings.configured and apps.ready else contextlib.nullcontext():
        message = _unmatched_answer_text(data)
    return types.ErrorData(code=types.INVALID_REQUEST, message=message, data=data)


def _unmatched_answer_data(exc: McpError) -> dict[str, Any] | None:
    """The data of an :data:`UNMATCHED_ANSWER` error; None for any other."""
    data = exc.error.data
    return data if isinstance(data, dict) and data.get("platform") == UNMATCHED_ANSWER else None


def _unmatched_answer_text(data: dict[str, Any]) -> str:
    """The pool's sentence for a request whose answer named another request, or none."""
    if data["answered_id"] is None:
        said = _("the server's answer to request %(request)s carries no id") % {"request": data["request_id"]}
    else:
        said = _("the server's answer to request %(request)s carries another id: %(answered)s") % {
            "request": data["request_id"],
            "answered": data["answered_id"],
        }
    if data["server_error"]:
        said = _("%(answer)s; the server said: %(error)s") % {"answer": said, "error": data["server_error"]}
    return said


class _OwnAnswerWriter:
    """Where the streamable HTTP transport hands what came back on one request's POST (its JSON answer, or the messages
    of its event stream) on to the session: an answer there is that request's (MCP: the server answers the request
    it was POSTed, on that POST).

    An answer that names another request, or none, fails the request at once (:data:`UNMATCHED_ANSWER`) and is handed
    to no one: the SDK would take it for the answer to whichever request has its id (another call's), or drop it as
    of an unknown request and leave this one waiting for its whole deadline, to end as a timeout (for a write: of
    unknown outcome) though the server answered. Everything else (the right answer, the server's own requests and
    notifications, errors) is handed on as it came."""

    def __init__(
        self,
        writer: MemoryObjectSendStream[SessionMessage | Exception],
        request_id: int | str,
        fail: Callable[[int | str, types.ErrorData], Awaitable[None]],
    ) -> None:
        self._writer = writer
        self._request_id = request_id
        self._fail = fail

    async def send(self, item: SessionMessage | Exception) -> None:
        answer = _answer_in(item)
        if answer is None or _is_request_id(answer.request_id, self._request_id):
            await self._writer.send(item)
        else:
            await self._fail(self._request_id, _unmatched_answer_error(answer, self._request_id))


class _AnswerTooLong(Exception):
    """An HTTP answer (a JSON body, or one event of an event stream) longer than the pool reads: read no further, and
    its request failed as it was read (:class:`_BoundedAnswer`). ``size`` is the answer's whole size where its
    ``Content-Length`` said it, None where it was cut while it was read."""

    def __init__(self, size: int | None, max_bytes: int) -> None:
        said = f"an HTTP answer of {size} bytes" if size is not None else "an HTTP answer"
        super().__init__(f"{said}, more than the {max_bytes} bytes read")
        self.size = size
        self.max_bytes = max_bytes


# Where one event of an event stream ends: a blank line, that is two line ends in a row ("\r\n" is one line end).
_EVENT_END = re.compile(rb"(?:\r\n|\r(?!\n)|\n){2}")


class _BoundedAnswer(httpx.AsyncByteStream):
    """The body of one streamable HTTP answer, read up to ``max_bytes``, as a stdio server's line is (:class:`_Line`):
    a JSON body whole, an event stream each of its events (a stream carries any number of them). Counted decoded: a
    compressed answer is bounded as it unpacks, not as it came. A body whose ``Content-Length`` already says more is
    refused before it is read. Past the bound, the request the answer is to (named by the body of the POST that
    carried it) is failed with :data:`ANSWER_TOO_LONG` through ``fail`` (the call raises :class:`ToolResultTooBig`,
    as for a stdio line), and the read raises :class:`_AnswerTooLong`, which ends that one HTTP answer (its connection
    dropped); the session goes on, as after a stdio server's long line.

    The SDK's HTTP client has no bound of its own: a 200 MB answer was read and parsed (1.5 GB of the worker's memory)
    while a stdio server's longer line was refused unread. Installed by :func:`_bound_answer`, a response hook."""

    def __init__(
        self,
        response: httpx.Response,
        *,
        max_bytes: int,
        fail: Callable[[int | str, types.ErrorData], Awaitable[None]],
    ) -> None:
        # A response of its own reads and decodes the body (httpx's decoders, whatever the encoding); the response
        # the SDK reads is handed the decoded bytes, its ``Content-Encoding`` taken away (:func:`_bound_answer`).
        self._decoded = httpx.Response(
            response.status_code, headers=response.headers, stream=response.stream, request=response.request
        )
        self._request = response.request
        self._max_bytes = max_bytes
        self._fail = fail
        content_type = response.headers.get("content-type", "").lower()
        self._events = content_type.startswith("text/event-stream")
        encoded = response.headers.get("content-encoding", "identity").strip().lower() != "identity"
        declared = response.headers.get("content-length", "")
        self._declared = int(declared) if declared.isdigit() and not encoded and not self._events else None

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._declared is not None and self._declared > self._max_bytes:
            await self._refuse(self._declared)
        size, seen, head = 0, b"", b""
        async for chunk in self._decoded.aiter_bytes():
            if self._events:
                head = _event_head(head, seen, chunk)
                size, seen = _event_size(size, seen, chunk)
            else:
                size += len(chunk)
            if size > self._max_bytes:
                await self._refuse(None, event_head=head)
            yield chunk

    async def aclose(self) -> None:
        await self._decoded.aclose()

    async def _refuse(self, size: int | None, *, event_head: bytes = b"") -> NoReturn:
        too_long = _AnswerTooLong(size, self._max_bytes)
        # The request the POST carried; on a session's own event stream (a GET: SSE's, where every answer comes),
        # the one the event answers, read from its head (servers write the id before the result). Failed so, the
        # call is a result too long (not retried, not counted by the breaker), not a transport failure.
        request_id = _carried_request_id(self._request)
        if request_id is None and event_head:
            request_id = _event_answer_id(event_head)
        if request_id is not None:
            await self._fail(request_id, _answer_too_long_error(str(too_long), size, self._max_bytes))
        raise too_long


def _event_size(size: int, seen: bytes, chunk: bytes) -> tuple[int, bytes]:
    """The size of the event being read once ``chunk`` is read (``size`` before it), and the last bytes read: a blank
    line may begin in one chunk and end in the next (``seen`` is the last 3 bytes of the chunks before)."""
    read = seen + chunk
    ends = [end.end() for end in _EVENT_END.finditer(read)]
    size = len(read) - ends[-1] if ends else size + len(chunk)
    return size, read[-3:]


def _event_head(head: bytes, seen: bytes, chunk: bytes) -> bytes:
    """The first bytes (at most ``LINE_TOO_LONG_KEPT``) of the event being read once ``chunk`` is read: ``head`` of
    the event before it, ``seen`` the last bytes of the chunks before (a blank line may span two chunks)."""
    read = seen + chunk
    ends = [end.end() for end in _EVENT_END.finditer(read)]
    if ends:
        return read[ends[-1] :][:LINE_TOO_LONG_KEPT]
    return head if len(head) >= LINE_TOO_LONG_KEPT else (head + chunk)[:LINE_TOO_LONG_KEPT]


def _event_answer_id(head: bytes) -> int | str | None:
    """The id of the JSON-RPC answer an event's first bytes begin (its ``data:`` lines joined), if they show one."""
    lines = head[:ANSWER_ID_HEAD_BYTES].decode("utf-8", errors="replace").splitlines()
    data = [line[5:].removeprefix(" ") for line in lines if line.startswith("data:")]
    return _response_id("\n".join(data)) if data else None


def _bound_answer(
    response: httpx.Response, *, max_bytes: int, fail: Callable[[int | str, types.ErrorData], Awaitable[None]]
) -> None:
    """Have ``response`` (a streamable HTTP answer, not read yet: a response hook) read through a
    :class:`_BoundedAnswer`, which hands on its bytes decoded."""
    response.stream = _BoundedAnswer(response, max_bytes=max_bytes, fail=fail)
    response.headers.pop("content-encoding", None)


class _StreamableHttpTransport(StreamableHTTPTransport):
    """The SDK's streamable HTTP transport, each request's POST answered by that request's answer only
    (:class:`_OwnAnswerWriter`; the SDK offers no hook for it, so its private ``_handle_post_request`` is wrapped), and
    an HTTP error status on one request's POST that request's failure alone (the SDK raises it, which ends the whole
    session: every call in flight on it failed as a broken transport, a finished write's outcome made unknown).

    What it saw is told to the request as a :class:`_TransportSeen` (a server cannot forge one): a 404 to a request
    that carried the session's id, or the TypeScript SDK's 400 for an unknown session, as the session's end
    (:class:`_SessionEndedSeen`: the pool opens a new one and sends the request there, once); another 4xx as the
    request's refusal, handed on as its answer where the body is a JSON-RPC error for it, else
    :class:`_RefusedSeen` (not processed); a 5xx as an answer lost (:data:`ANSWER_LOST`: the request may have been
    processed, its outcome unknown). An error status on the ``initialize`` request, or on a notification, still ends
    the session, as the SDK has it (nothing else is in flight on a session that is opening)."""

    def __init__(self, url: str, *, fail: Callable[[int | str, types.ErrorData], Awaitable[None]]) -> None:
        super().__init__(url)
        self._fail = fail

    async def _handle_post_request(self, ctx: RequestContext) -> None:
        request = ctx.session_message.message.root
        if isinstance(request, types.JSONRPCRequest):
            writer = _OwnAnswerWriter(ctx.read_stream_writer, request.id, self._fail)
            # Only ``send`` is asked of the writer (the JSON answer, the event stream, a reconnection, a 404).
            ctx = dataclasses.replace(ctx, read_stream_writer=cast(Any, writer))
        try:
            await super()._handle_post_request(ctx)
        except httpx.HTTPStatusError as exc:
            response = exc.response
            if not isinstance(request, types.JSONRPCRequest):
                raise
            if response.status_code == HTTP_TOO_MANY_REQUESTS:
                # A 429 refuses this request only: it fails as a rate limit.
                await self._fail(request.id, _rate_limited_error(response, address=True))
                return
            if self._is_initialization_request(ctx.session_message.message) or not 400 <= response.status_code < 600:
                raise
            if _session_not_valid(response):
                await self._fail(
                    request.id, _SessionEndedSeen(code=types.INVALID_REQUEST, message=_http_status_text(response))
                )
            elif response.status_code >= 500:
                # A gateway's 502, a server's 500: the request may have been processed (outcome unknown).
                await self._fail(request.id, _answer_lost_error(_http_error_text(response)))
            elif (answer := _error_answer(response, request.id)) is not None:
                await ctx.read_stream_writer.send(SessionMessage(types.JSONRPCMessage(answer)))  # the server's answer
            else:
                await self._fail(request.id, _refused_seen(response))

    async def _send_session_terminated_error(self, read_stream_writer: Any, request_id: types.RequestId) -> None:
        """What the SDK does on a 404 to a request: it calls this, and reads nothing more of the answer. To a request
        that carried the session's id (every request once ``initialize`` gave one), the session's end; to one that
        carried none (the ``initialize`` itself, a server that keeps no sessions), a refusal: the address is wrong."""
        status = f"HTTP {HTTP_NOT_FOUND} {httpx.codes.get_reason_phrase(HTTP_NOT_FOUND)}"
        if self.get_session_id():
            await self._fail(request_id, _SessionEndedSeen(code=types.INVALID_REQUEST, message=status))
        else:
            address = _address_shown(httpx.URL(self.url))
            message = _("%(status)s from %(url)s") % {"status": status, "url": address}
            await self._fail(request_id, _RefusedSeen(code=types.INVALID_REQUEST, message=message))


@contextlib.asynccontextmanager
async def _streamable_http_streams(
    url: str, http_client: httpx.AsyncClient, *, fail: Callable[[int | str, types.ErrorData], Awaitable[None]]
) -> AsyncIterator[
    tuple[MemoryObjectReceiveStream[SessionMessage | Exception], MemoryObjectSendStream[SessionMessage]]
]:
    """The SDK's ``streamable_http_client`` (its streams, its tasks, its ``DELETE`` of the session at the end) over
    :class:`_StreamableHttpTransport`: the SDK's function builds its transport itself."""
    read_stream_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_stream_reader = anyio.create_memory_object_stream[SessionMessage](0)
    transport = _StreamableHttpTransport(url, fail=fail)
    async with anyio.create_task_group() as tg:
        try:

            def start_get_stream() -> None:
                tg.start_soon(transport.handle_get_stream, http_client, read_stream_writer)

            tg.start_soon(
                transport.post_writer,
                http_client,
                write_stream_reader,
                read_stream_writer,
                write_stream,
                start_get_stream,
                tg,
            )
            try:
                yield read_stream, write_stream
            finally:
                if transport.get_session_id():
                    await transport.terminate_session(http_client)
                tg.cancel_scope.cancel()
        finally:
            await read_stream_writer.aclose()
            await write_stream.aclose()


def _unexpected_content_type(exc: Exception) -> str | None:
    """The content type of an HTTP answer that is neither JSON nor an event stream, as the streamable HTTP client
    reports it to the message handler (a ``ValueError`` it words "Unexpected content type: text/html"; the SDK has
    no class of its own for it); None for any other error."""
    prefix = "Unexpected content type:"
    text = str(exc)
    if not isinstance(exc, ValueError) or not text.startswith(prefix):
        return None
    return mask_text(text[len(prefix) :].strip()[:4096])[:200] or "none"  # masked before it is cut


def _noise_of(exc: Exception) -> str:
    """The text a server wrote instead of a JSON-RPC message, as far as the parse error shows it."""
    noise = _unparsed_line(exc)
    if noise is not None:
        return mask_text(noise[:4096])[:200]  # masked before it is cut: a cut secret is not found
    return mask_text(str(exc).splitlines()[0][:4096])[:200]


_default_pool: McpSessionPool | None = None
_default_lock = threading.Lock()


def get_default_pool() -> McpSessionPool:
    """This process's pool (a forked child gets its own: sessions and loops do not survive a fork)."""
    global _default_pool
    with _default_lock:
        if _default_pool is None or _default_pool._pid != os.getpid() or _default_pool._closed:
            from django.conf import settings

            _default_pool = McpSessionPool(
                idle_close_s=settings.PLATFORM_MCP_IDLE_CLOSE_S,
                call_timeout_max_s=settings.PLATFORM_TOOL_TIMEOUT_MAX_S,
            )
            atexit.register(shutdown_default_pool)
        return _default_pool


def shutdown_default_pool() -> None:
    global _default_pool
    with _default_lock:
        if _default_pool is not None and _default_pool._pid == os.getpid():
            _default_pool.shutdown()
        _default_pool = None
