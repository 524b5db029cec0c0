"""A hostile MCP server (stdio) for the at-most-once tests: it carries out a call's side effect, then fails to
answer. Every execution of a tool body appends one line to ``SIDE_EFFECT_FILE`` *before* anything else, so the
file counts what the server really did, whatever the client saw.

``SIDE_EFFECT_MODE`` picks what happens after the side effect:

- ``exit`` (default): the process dies (``os._exit``) before it answers: the client's session drops.
- ``hang``: it never answers (the client's deadline passes).
- ``report-timeout``: it answers with its own error, that its backend timed out (the work may be done).
- ``report-rate-limit``: it answers with its own error, an HTTP 429 of a backend it called after the work.
- ``report-echo``: it answers with its own error that quotes the call's text (which may hold a number such as
  429) and says another backend timed out after the work.
- ``ok``: it answers.

``append_line`` is a write tool with an optional idempotency key: a key seen before (in the file) is not
carried out again, and is answered at once, as an idempotent backend would. ``append_line_backup`` does the
same, its lines marked ``backup:`` (a fallback for ``append_line``). ``record_read`` is a read tool
that misbehaves the same way (it only logs that it ran).
"""

from __future__ import annotations

import os
import time

from fastmcp import FastMCP
from fastmcp.exceptions import ToolError

mcp = FastMCP("side-effect")
mode = os.environ.get("SIDE_EFFECT_MODE", "exit")


def _lines() -> list[str]:
    try:
        with open(os.environ["SIDE_EFFECT_FILE"], encoding="utf-8") as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []


def _record(line: str) -> None:
    with open(os.environ["SIDE_EFFECT_FILE"], "a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def _then_misbehave() -> None:
    if mode == "exit":
        os._exit(19)
    if mode == "hang":
        time.sleep(3600)
    if mode == "report-timeout":
        raise ToolError("the ledger backend timed out after 30s")
    if mode == "report-rate-limit":
        raise ToolError("429 Too Many Requests: the notification backend's limit was hit")


def _misbehave_about(text: str) -> None:
    if mode == "report-echo":
        raise ToolError(f"ledger entry '{text}' saved but the notification backend timed out")
    _then_misbehave()


@mcp.tool(annotations={"readOnlyHint": False, "destructiveHint": True})
def append_line(text: str, idempotency_key: str = "") -> str:
    """Appends ``text`` (and the idempotency key) to the side-effect file, once per idempotency key."""
    if idempotency_key and any(line.endswith(f"\t{idempotency_key}") for line in _lines()):
        return f"already done: {idempotency_key}"
    _record(f"{text}\t{idempotency_key}")
    _misbehave_about(text)
    return f"lines: {len(_lines())}"


@mcp.tool(annotations={"readOnlyHint": False, "destructiveHint": True})
def append_line_backup(text: str, idempotency_key: str = "") -> str:
    """Appends ``text`` to the side-effect file as ``append_line`` does, marked as the backup's."""
    _record(f"backup:{text}\t{idempotency_key}")
    _then_misbehave()
    return f"lines: {len(_lines())}"


@mcp.tool(annotations={"readOnlyHint": True})
def not_json_read(key: str) -> str:
    """A read tool whose answer looks like JSON but holds NaN and Infinity (Python's parser takes them; no JSON
    column stores them)."""
    return '{"key": "' + key + '", "ratio": NaN, "limit": Infinity}'


@mcp.tool(annotations={"readOnlyHint": True})
def record_read(key: str) -> str:
    """A read tool that logs each time its body runs, then misbehaves like the write tool."""
    _record(f"read:{key}")
    _then_misbehave()
    return f"read {key}"


if __name__ == "__main__":
    mcp.run(transport="stdio", show_banner=False)
