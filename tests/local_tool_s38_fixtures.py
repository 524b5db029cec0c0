"""Local tools for ``tests/mcpregistry/test_s38_local_tools.py``: a function that hangs until released, values no
JSON can hold, and a tool written as a ``BaseTool`` subclass (bound with its module).

``hang`` and ``hang_write`` keep the keys they started with in ``STARTED`` and wait on ``RELEASE`` (at most 30 s);
``FINISHED`` counts those that returned, so a test can wait for its worker threads to be free again.
"""

from __future__ import annotations

import threading
from typing import Any

from langchain_core.tools import BaseTool

from mcpregistry.local_tools import local_tool

STARTED: list[str] = []
FINISHED: list[str] = []
RELEASE = threading.Event()
EXECUTED: list[str] = []


def _hang(key: str) -> str:
    STARTED.append(key)
    try:
        RELEASE.wait(30)
    finally:
        FINISHED.append(key)
    return "released"


@local_tool
def hang(key: str) -> str:
    """Hangs until the test releases it."""
    return _hang(key)


@local_tool
def hang_write(key: str) -> str:
    """Writes ``key`` after hanging until the test releases it."""
    return _hang(key)


@local_tool
def tuple_keys(key: str) -> dict[Any, str]:
    """Answers a dict whose key is a tuple (no JSON object has one)."""
    EXECUTED.append(key)
    return {(1, 2): key}


@local_tool
def circular(key: str) -> dict[str, Any]:
    """Answers a dict that holds itself."""
    EXECUTED.append(key)
    value: dict[str, Any] = {"key": key}
    value["self"] = value
    return value


class EchoTool(BaseTool):
    name: str = "echo_cls"
    description: str = "Answers its text as it is."

    def _run(self, text: str) -> str:
        return text


echo_cls = EchoTool()
