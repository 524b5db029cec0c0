"""The session pool's defects found in review.

1. A call whose caller stopped waiting (Celery's soft time limit: ``submit`` cancels the call) sent
   ``notifications/cancelled`` but left its session pooled: the stopped call's late answer ends a FastMCP server
   (python-sdk#2416), and the next run's call on that worker, sent on it meanwhile, waited its whole timeout (a write:
   outcome unknown, though the server never saw it). Now it retires its session, as a timed-out call does.
2. The idle reaper checked the sessions of the list it took, and closed by key: while it waited for one session to
   close, another's server died and a fresh session of the same key carried a call, and the reaper closed that one
   mid-call (a transport error, ``sent=True``, for a call the server had). Now it closes the session it checked.
3. A streamable HTTP answer was read whole, whatever its size (200 MB: 1.5 GB of the worker's memory), where a stdio
   server's line is refused past 16 MiB. Now an HTTP answer (its body, or each event of an event stream; decoded, so a
   compressed one too) is read up to the same bound and its call fails as ``ToolResultTooBig`` (``result:too_big``).
4. A stdio server that ended on its own at stdin's close left its helper processes running (its process group was
   killed only when it did not end), with the thread that reads its stderr. Now what remains of the group is killed.
"""

from __future__ import annotations

import asyncio
import gzip
import http.server
import json
import os
import re
import signal
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from celery.exceptions import SoftTimeLimitExceeded

from mcpregistry import pool as pool_module
from mcpregistry.client_session import ToolResultTooBig
from mcpregistry.pool import McpSessionPool, _PooledSession

FIXTURES = Path(__file__).resolve().parents[1] / "mcp_fixtures"
SERVER = str(Path(__file__).resolve().parent / "fix_pool_stdio_server.py")


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not predicate():
        time.sleep(0.02)
    return predicate()


def stdio(mcp_id: str, **env: str) -> dict[str, Any]:
    return {"mcp_id": mcp_id, "transport": "stdio", "command": sys.executable, "args": [SERVER], "env": env}


@contextmanager
def soft_time_limit_in(seconds: float) -> Iterator[None]:
    """Celery's soft time limit, as its worker raises it: from a signal handler, in the thread that runs the task."""

    def soft_limit(signum: int, frame: Any) -> None:
        raise SoftTimeLimitExceeded()

    old = signal.signal(signal.SIGALRM, soft_limit)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# ---- 1. a call stopped by its caller retires its session -------------------------------------------------------


@pytest.mark.slow
def test_a_call_stopped_by_the_soft_time_limit_retires_its_session_as_a_timed_out_call_does() -> None:
    pool = McpSessionPool()
    config = {
        "mcp_id": "stalled",
        "transport": "stdio",
        "command": sys.executable,
        "args": [str(FIXTURES / "sync_sleep_server.py")],
    }
    try:
        others = set(pool.child_process_ids())  # this process's other children (another pool's servers)
        assert pool.call_tool(config, "echo", {"text": "before"}, timeout_s=20).text == "before"
        [first] = set(pool.child_process_ids()) - others
        with soft_time_limit_in(0.3), pytest.raises(SoftTimeLimitExceeded):
            pool.call_tool(config, "stalled_backend", {"seconds": 1}, timeout_s=60)

        # The next run's call, at once: out while the stopped call's late answer comes (which ends that server).
        outcome = pool.call_tool(config, "stalled_backend", {"seconds": 2}, timeout_s=10)

        assert outcome.is_error and "the backend gave no answer within 2 s" in outcome.text
        assert wait_for(lambda: first not in pool.child_process_ids())  # closed once its stopped call ended
    finally:
        pool.shutdown()


# ---- 2. the idle reaper closes the session it found idle, never the one that holds its key now ------------------


@pytest.mark.slow
def test_the_reaper_leaves_a_busy_fresh_session_that_replaced_one_it_found_idle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = McpSessionPool(idle_close_s=300)  # its reaper asleep: the pass below is the test's own
    first, second = stdio("reap-a"), stdio("reap-b")
    closing_first = threading.Event()
    first_closed = threading.Event()
    release_close = asyncio.Event()
    finish = pool._finish

    async def finish_slowly(pooled: _PooledSession) -> None:
        # The first server is slow to end: the reaper waits here, its list of idle sessions taken.
        if pooled.connection.mcp_id == "reap-a":
            closing_first.set()
            await release_close.wait()
        await finish(pooled)
        if pooled.connection.mcp_id == "reap-a":
            first_closed.set()

    async def reap_now() -> None:
        assert pool._reaper is not None
        pool._reaper.cancel()
        pool._reaper = asyncio.get_running_loop().create_task(pool._reap_idle_forever())

    try:
        pool.call_tool(first, "echo", {"text": "a"}, timeout_s=10)
        second_pid = int(pool.call_tool(second, "pid", {}, timeout_s=10).text)
        monkeypatch.setattr(pool, "_finish", finish_slowly)
        pool.idle_close_s = 0.0  # both sessions are idle now
        pool.submit(reap_now())
        assert closing_first.wait(10)

        # Meanwhile the second server dies; the next call on it opens a fresh session and is out on it.
        os.kill(second_pid, signal.SIGKILL)
        assert wait_for(lambda: pool.server_ended("reap-b"))
        release = tmp_path / "release"
        with ThreadPoolExecutor(max_workers=1) as executor:
            call = executor.submit(pool.call_tool, second, "wait_for_file", {"path": str(release)}, timeout_s=20)
            assert wait_for(lambda: any(p.in_flight for p in list(pool._sessions.values())))
            pool._loop.call_soon_threadsafe(release_close.set)
            assert first_closed.wait(10)
            pool.submit(asyncio.sleep(0))  # the reaper has gone on to the second session of its list
            assert "reap-b" in [session["mcp_id"] for session in pool.live_sessions().values()]
            release.touch()
            assert call.result(timeout=20).text == "released"
    finally:
        pool.shutdown()


# ---- 3. an HTTP answer is read up to the bound a stdio line is read to -----------------------------------------

BOUND = 1024 * 1024  # the tests' bound (the platform's: 16 MiB), set below
TOO_LONG = 2 * BOUND


def _message(message_id: Any, result: Any) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": message_id, "result": result}).encode()


def _text_answer(message_id: Any, text: str) -> bytes:
    return _message(message_id, {"content": [{"type": "text", "text": text}]})


def _event(body: bytes) -> bytes:
    return b"event: message\r\ndata: " + body + b"\r\n\r\n"


class LongAnswers:
    """A streamable HTTP MCP server, written by hand, served from a thread: what reached it is counted by method and
    tool. Its tools answer longer than the bound, each another way (``json``, ``chunked``, ``gzip``, ``event``), or
    short (``short``, and ``many_events``: many events together longer than the bound, each short)."""

    TOOLS = ("json", "chunked", "gzip", "event", "many_events", "short")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: Counter[str] = Counter()
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}/mcp"

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        state = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _send(self, data: bytes, content_type: str = "application/json", **headers: str) -> None:
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                for name, value in headers.items():
                    self.send_header(name.replace("_", "-"), value)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self.send_response(405)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_DELETE(self) -> None:
                self._send(b"")

            def do_POST(self) -> None:
                message = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                method, params = message.get("method", ""), message.get("params") or {}
                name = str(params.get("name", ""))
                with state.lock:
                    state.seen[f"{method}:{name}" if name else method] += 1
                if "id" not in message:
                    self.send_response(202)
                    self.send_header("Content-Length", "0")
                    return self.end_headers()
                if method == "initialize":
                    result = {
                        "protocolVersion": params["protocolVersion"],
                        "capabilities": {"tools": {}},
                        "serverInfo": {"name": "long-answers", "version": "1"},
                    }
                    return self._send(_message(message["id"], result), Mcp_Session_Id=uuid.uuid4().hex)
                if method == "tools/list":
                    tools = [{"name": tool, "inputSchema": {"type": "object"}} for tool in state.TOOLS]
                    return self._send(_message(message["id"], {"tools": tools}))
                if method == "tools/call":
                    try:
                        return self._call(name, message["id"])
                    except (BrokenPipeError, ConnectionResetError):
                        return None  # the pool stopped reading: it dropped the connection
                return self._send(_message(message["id"], {}))

            def _call(self, name: str, message_id: int) -> None:
                long_answer = _text_answer(message_id, "a" * TOO_LONG)
                if name == "json":
                    return self._send(long_answer)
                if name == "gzip":  # 2 MiB as about 2 kB on the wire
                    return self._send(gzip.compress(long_answer), Content_Encoding="gzip")
                if name == "event":
                    return self._send(_event(long_answer), "text/event-stream")
                if name == "many_events":  # 40 notifications of 40 kB (1.6 MB in all), then the answer
                    note = {"level": "info", "data": "n" * 40_000}
                    events = [
                        _event(
                            json.dumps({"jsonrpc": "2.0", "method": "notifications/message", "params": note}).encode()
                        )
                        for _ in range(40)
                    ]
                    return self._send(
                        b"".join([*events, _event(_text_answer(message_id, "fine"))]), "text/event-stream"
                    )
                if name == "chunked":  # no Content-Length: only reading tells how long it is
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for start in range(0, len(long_answer), 65536):
                        piece = long_answer[start : start + 65536]
                        self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                    self.wfile.write(b"0\r\n\r\n")
                    return None
                return self._send(_text_answer(message_id, "fine"))

        return Handler

    def count(self, what: str) -> int:
        with self.lock:
            return self.seen[what]


@pytest.fixture
def long_answers(monkeypatch: pytest.MonkeyPatch) -> Iterator[LongAnswers]:
    monkeypatch.setattr(pool_module, "STDIO_LINE_MAX_BYTES", BOUND)  # above the result cap's own (24 × 20,000 chars)
    server = LongAnswers()
    thread = threading.Thread(target=server.server.serve_forever, name="long-answers", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.server.shutdown()
        server.server.server_close()


CUT_WHILE_READ = f"the answer is longer than the {BOUND} bytes read; refused unread"


@pytest.mark.parametrize(
    ("tool", "said"),
    [
        # Its Content-Length says how long it is: refused before it is read.
        ("json", rf"the answer is \d+ bytes long, more than the {BOUND} bytes read; refused unread"),
        ("chunked", CUT_WHILE_READ),
        ("gzip", CUT_WHILE_READ),  # bounded as it unpacks
        ("event", CUT_WHILE_READ),
    ],
)
def test_an_http_answer_longer_than_a_stdio_line_may_be_is_refused_and_its_session_goes_on(
    long_answers: LongAnswers, tool: str, said: str
) -> None:
    pool = McpSessionPool()
    config = {"mcp_id": "long-answers", "transport": "streamable_http", "url": long_answers.url, "headers": {}}
    try:
        with pytest.raises(ToolResultTooBig) as refused:
            pool.call_tool(config, tool, {}, timeout_s=10)
        after = pool.call_tool(config, "short", {}, timeout_s=10)
    finally:
        pool.shutdown()

    assert re.fullmatch(said, str(refused.value))
    assert after.text == "fine"
    # Sent once, answered as refused (no timeout, no second send); the session went on: one initialize.
    assert long_answers.count(f"tools/call:{tool}") == 1 and long_answers.count("initialize") == 1


def test_an_event_stream_is_bounded_by_each_event_not_by_all_of_them(long_answers: LongAnswers) -> None:
    pool = McpSessionPool()
    config = {"mcp_id": "long-answers", "transport": "streamable_http", "url": long_answers.url, "headers": {}}
    try:
        assert pool.call_tool(config, "many_events", {}, timeout_s=10).text == "fine"
    finally:
        pool.shutdown()


@pytest.mark.parametrize(
    ("chunks", "sizes"),
    [
        ([b"data: a\n\nxyz"], [3]),
        ([b"data: a\r\n", b"\r\nxy"], [9, 2]),  # the blank line split between two chunks
        ([b"data: a\r", b"\nmore"], [8, 13]),  # "\r\n" split: one line end, no blank line
        ([b"data: a\n\r", b"\nxy"], [0, 2]),
        ([b"data: a\r\rx"], [1]),
    ],
)
def test_an_event_s_size_is_counted_from_the_last_blank_line_whichever_line_ends_it_uses(
    chunks: list[bytes], sizes: list[int]
) -> None:
    size, seen, counted = 0, b"", []
    for chunk in chunks:
        size, seen = pool_module._event_size(size, seen, chunk)
        counted.append(size)
    assert counted == sizes


# ---- 4. what a stdio server left running ends with its session -------------------------------------------------


def _live_in_group(group: int) -> list[int]:
    """The processes of process group ``group`` that live (a zombie has ended: its parent has yet to reap it)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text(errors="replace").rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            members.append(int(entry))
    return members


@pytest.mark.slow
def test_a_server_that_ends_at_stdin_s_close_leaves_no_helper_and_no_stderr_reader_behind(tmp_path: Path) -> None:
    pool = McpSessionPool()
    pids = tmp_path / "pids"
    server_pid = helper_pid = 0
    try:
        assert pool.call_tool(stdio("with-helper", HELPER_PIDS=str(pids)), "echo", {"text": "hi"}, timeout_s=10).text
        server_pid, helper_pid = map(int, pids.read_text().split())
        assert helper_pid in _live_in_group(server_pid)

        pool.close("with-helper")

        assert wait_for(lambda: not _live_in_group(server_pid))
        assert wait_for(lambda: not any(t.name == "mcp-stderr-with-helper" for t in threading.enumerate()))
    finally:
        pool.shutdown()
        if helper_pid in _live_in_group(server_pid):  # the old code's leftover: ended here, by its id
            os.kill(helper_pid, signal.SIGKILL)
