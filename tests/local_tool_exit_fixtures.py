"""Local tools for the tests of local tools that raise what is no ``Exception``: ``SystemExit`` (argparse on bad
input, a library's ``sys.exit()``) and ``KeyboardInterrupt``, from a function or a coroutine, and a write that does
its side effect before its helper exits.

Each records its calls in ``EXECUTED`` (tool name → list of arguments): a test tells a tool that ran from one that
was never called.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections import defaultdict
from typing import Any

from mcpregistry.local_tools import local_tool

EXECUTED: dict[str, list[Any]] = defaultdict(list)


@local_tool
def parse_count(line: str) -> str:
    """Reads ``--count N`` from a command line (with argparse, which exits on bad input)."""
    EXECUTED["parse_count"].append(line)
    parser = argparse.ArgumentParser(prog="parse_count")
    parser.add_argument("--count", type=int, required=True)
    return f"count={parser.parse_args(line.split()).count}"


@local_tool
def exit_with(code: int) -> str:
    """Calls ``sys.exit(code)``, as a library might."""
    EXECUTED["exit_with"].append(code)
    sys.exit(code)


@local_tool
def interrupted() -> str:
    """Raises ``KeyboardInterrupt`` from the tool's own code."""
    EXECUTED["interrupted"].append({})
    raise KeyboardInterrupt


@local_tool
async def async_exit_with(code: int) -> str:
    """Calls ``sys.exit(code)`` after an await."""
    EXECUTED["async_exit_with"].append(code)
    await asyncio.sleep(0)
    sys.exit(code)


@local_tool
async def async_wait(seconds: float) -> str:
    """Awaits ``seconds``, then answers (cancelled at its await when the caller is interrupted)."""
    EXECUTED["async_wait"].append("started")
    await asyncio.sleep(seconds)
    EXECUTED["async_wait"].append("finished")
    return f"waited {seconds}"


@local_tool
def post_notice(text: str) -> str:
    """Posts a notice (a write), then its helper library exits."""
    EXECUTED["post_notice"].append(text)
    raise SystemExit(0)
