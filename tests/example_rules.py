"""Seed 000's three example rules, as a rule author would write them (registered by dotted path)."""

from __future__ import annotations

from agents.tools import DeterministicContext, deterministic_tool


@deterministic_tool(mcp_id="order-service")
def route_order_lookup(ctx: DeterministicContext) -> dict | None:
    """'주문 조회' 키워드 감지 시 get_order tool을 확정 호출."""
    if "주문" in ctx.query and "조회" in ctx.query:
        return {
            "tool_name": "get_order",
            "params": {"query": ctx.query},
        }
    return None  # 매치 안 됨 → ReAct로 위임


@deterministic_tool(mcp_id="customer-crm")
def route_by_chatbot_id(ctx: DeterministicContext) -> dict | None:
    """A2A context의 chatbotId에 따라 CRM lookup을 확정 호출."""
    chatbot_id = ctx.context.get("chatbotId")
    if chatbot_id == "premium-support":
        return {
            "tool_name": "get_customer_profile",
            "params": {"customer_id": ctx.context.get("userId")},
        }
    return None


@deterministic_tool(mcp_id="knowledge-base")
def route_by_available_tool(ctx: DeterministicContext) -> dict | None:
    """mcp_tools에서 이름으로 동적 선택 후 호출."""
    tool_names = {t.name for t in ctx.mcp_tools}
    if "search_docs" in tool_names and "검색" in ctx.query:
        return {"tool_name": "search_docs", "params": {"q": ctx.query}}
    return None


@deterministic_tool(mcp_id="order-service")
def route_that_raises(ctx: DeterministicContext) -> dict | None:
    raise KeyError("orderId")


@deterministic_tool(mcp_id="order-service")
def route_to_a_typo(ctx: DeterministicContext) -> dict | None:
    return {"tool_name": "get_ordr", "params": {"query": ctx.query}}


@deterministic_tool(mcp_id="payments")
def route_to_an_unbound_server(ctx: DeterministicContext) -> dict | None:
    return {"tool_name": "refund", "params": {}}


def not_decorated(ctx: DeterministicContext) -> dict | None:
    return None
