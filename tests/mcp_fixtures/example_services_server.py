"""The three servers of seed 000's examples in one program (bound three times: order-service, customer-crm,
knowledge-base): ``get_order``, ``get_customer_profile``, ``search_docs``. ``TOOLS`` (comma-separated) picks
which of them a binding exposes."""

from __future__ import annotations

import os

from fastmcp import FastMCP

mcp = FastMCP("seed000")
READ_ONLY = {"readOnlyHint": True}


@mcp.tool(annotations=READ_ONLY)
def get_order(query: str) -> dict:
    """주문을 조회한다."""
    return {"order_id": "O-1001", "status": "배송중", "query": query}


@mcp.tool(annotations=READ_ONLY)
def get_customer_profile(customer_id: str) -> dict:
    """고객 프로필을 조회한다."""
    return {"customer_id": customer_id, "grade": "premium", "name": "고객 " + customer_id}


@mcp.tool(annotations=READ_ONLY)
def search_docs(q: str) -> dict:
    """사내 문서를 검색한다."""
    return {"q": q, "hits": [{"title": "연차 규정", "score": 0.9}]}


wanted = {t for t in os.environ.get("TOOLS", "").split(",") if t}
for name in {"get_order", "get_customer_profile", "search_docs"} - wanted if wanted else set():
    mcp.remove_tool(name)

if __name__ == "__main__":
    mcp.run(transport="stdio", show_banner=False)
