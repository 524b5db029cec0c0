"""A FastMCP server (stdio) whose tools report their own errors as values (seed 002 §8: ``{"error": ...,
"fallback": "skip"|"retry"}``), and which writes down what it really did in ``LEDGER_FILE``, one line each:
``call <tool> <arguments as JSON>`` for every call it receives (the arguments as the server got them: an
idempotency key the gate added is there), ``wrote <to>:<amount> <key>`` for every transfer it carried out.

- ``transfer`` (a write): more than ``BALANCE`` (1000) is refused as a value, ``insufficient_funds`` with
  ``fallback: skip``, and nothing is written; a key seen before is answered ``already_done``, not written again.
- ``classify_term`` (a read): its first call answers ``classifier_unavailable`` with ``fallback: retry``, every
  later one a group; the term ``drift`` is answered in another shape (``{"label": ...}``), which is no error.
- ``classify_backup`` (a read): the fallback of ``classify_term``.
"""

from __future__ import annotations

import json
import os
from typing import Any

from fastmcp import FastMCP

mcp = FastMCP("error-value-ledger")
BALANCE = 1000


def _lines() -> list[str]:
    try:
        with open(os.environ["LEDGER_FILE"], encoding="utf-8") as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []


def _record(line: str) -> None:
    with open(os.environ["LEDGER_FILE"], "a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def _received(tool: str, args: dict[str, Any]) -> None:
    _record(f"call {tool} {json.dumps(args, ensure_ascii=False, sort_keys=True)}")


@mcp.tool(annotations={"destructiveHint": True})
def transfer(amount: int, to: str, idempotency_key: str = "") -> dict:
    """Transfer ``amount`` won to ``to``."""
    _received("transfer", {"amount": amount, "to": to, "idempotency_key": idempotency_key})
    if amount > BALANCE:
        return {"error": "insufficient_funds", "fallback": "skip"}
    if idempotency_key and any(line.endswith(f" {idempotency_key}") for line in _lines() if line.startswith("wrote")):
        return {"transfer_id": "", "status": "already_done"}
    _record(f"wrote {to}:{amount} {idempotency_key}")
    return {"transfer_id": f"T{sum(line.startswith('wrote') for line in _lines())}", "status": "done"}


@mcp.tool(annotations={"readOnlyHint": True})
def classify_term(term: str) -> dict:
    """The domain group of ``term``."""
    _received("classify_term", {"term": term})
    if term == "drift":
        return {"label": "환자정보"}
    if sum(line.startswith("call classify_term") for line in _lines()) == 1:
        return {"error": "classifier_unavailable", "fallback": "retry"}
    return {"group": "환자정보", "confidence": 0.87}


@mcp.tool(annotations={"readOnlyHint": True})
def classify_backup(term: str) -> dict:
    """The backup classifier: a group for any term."""
    _received("classify_backup", {"term": term})
    return {"group": "미분류", "confidence": 0.1}


if __name__ == "__main__":
    mcp.run(transport="stdio", show_banner=False)
