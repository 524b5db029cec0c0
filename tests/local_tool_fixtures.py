"""Local tools for the tests: real Python functions, bound by dotted path and called through the gate.

Each keeps a record of its executions in ``EXECUTED`` (tool name → list of arguments), so a test can tell what
actually ran from what the gate answered itself (a memo hit, a refusal).
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from typing import Any

from langchain_core.tools import tool

from mcpregistry.local_tools import local_tool

EXECUTED: dict[str, list[dict[str, Any]]] = defaultdict(list)
_lock = threading.Lock()


def _ran(name: str, **args: Any) -> int:
    with _lock:
        EXECUTED[name].append(args)
        return len(EXECUTED[name])


@local_tool
def lookup_stock(sku: str, warehouse: int = 1) -> dict[str, Any]:
    """재고 수량을 조회한다. sku 는 상품 코드, warehouse 는 창고 번호(1-9)다."""
    _ran("lookup_stock", sku=sku, warehouse=warehouse)
    return {"sku": sku, "warehouse": warehouse, "count": 7}


@local_tool
def sleepy(seconds: float) -> str:
    """Sleeps ``seconds``, then answers."""
    _ran("sleepy", seconds=seconds)
    time.sleep(seconds)
    return f"slept {seconds}"


@local_tool
def slow_once(key: str) -> str:
    """Slow on its first call for ``key`` (past any short deadline), quick after that."""
    count = _ran("slow_once", key=key)
    if count == 1:
        time.sleep(1.5)
    return f"answer {count}"


@local_tool
def explode(reason: str) -> str:
    """Always raises."""
    _ran("explode", reason=reason)
    raise RuntimeError(f"backend exploded: {reason}")


@local_tool
def flaky_shout(text: str) -> str:
    """Always raises (a tool whose fallback, ``shout``, takes the same arguments)."""
    _ran("flaky_shout", text=text)
    raise RuntimeError("backend down")


@local_tool
def garbled(what: str) -> dict[str, Any]:
    """Answers with text no database stores: a NUL character and an unpaired surrogate, in a key and a value."""
    _ran("garbled", what=what)
    return {"name\x00": f"김\x00하늘 {what}", "team": "클라우드\ud800운영팀", "note": "backend said: \udc00\x00"}


@local_tool(name="send_notice", description="Sends a notice to a team (changes things: needs approval).")
def _send_notice(team: str, text: str) -> str:
    _ran("send_notice", team=team, text=text)
    return f"sent to {team}"


@tool
def shout(text: str) -> str:
    """Returns the text in upper case (a plain LangChain @tool, bound by its dotted path)."""
    _ran("shout", text=text)
    return text.upper()


def not_a_tool(text: str) -> str:
    """A plain function: no decorator, so it cannot be bound."""
    return text
