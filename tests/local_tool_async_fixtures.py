"""Local tools for the tests of defects s29 local 1 and 3: ``async def`` tools made by the platform's decorator and by
LangChain's ``@tool``, and a tool this module only imports (``lookup_stock``, defined in
``tests.local_tool_fixtures``), which a dotted path through this module must not bind where only this module is
allowed.

Each records in ``EXECUTED`` (tool name → list of what happened) that it started and, after its ``await``, that it
finished: a test tells a coroutine that ran to its end from one cancelled at its ``await``.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

from langchain_core.tools import tool

from mcpregistry.local_tools import local_tool
from tests.local_tool_fixtures import lookup_stock

__all__ = ["EXECUTED", "async_lookup", "async_raise", "async_shout", "async_sleepy", "lookup_stock"]

EXECUTED: dict[str, list[Any]] = defaultdict(list)


@local_tool
async def async_lookup(sku: str, warehouse: int = 1) -> dict[str, Any]:
    """재고 수량을 비동기로 조회한다. sku 는 상품 코드, warehouse 는 창고 번호(1-9)다."""
    EXECUTED["async_lookup"].append("started")
    await asyncio.sleep(0)
    EXECUTED["async_lookup"].append({"sku": sku, "warehouse": warehouse})
    return {"sku": sku, "warehouse": warehouse, "count": 7, "팀": "클라우드운영팀"}


@tool
async def async_shout(text: str) -> str:
    """Returns the text in upper case (a plain LangChain @tool on an async def)."""
    await asyncio.sleep(0)
    EXECUTED["async_shout"].append(text)
    return text.upper()


@local_tool
async def async_sleepy(seconds: float) -> str:
    """Awaits ``seconds``, then answers."""
    EXECUTED["async_sleepy"].append("started")
    await asyncio.sleep(seconds)
    EXECUTED["async_sleepy"].append("finished")
    return f"slept {seconds}"


@local_tool
async def async_raise(reason: str) -> str:
    """Always raises, after an await."""
    await asyncio.sleep(0)
    raise RuntimeError(f"backend exploded: {reason}")
