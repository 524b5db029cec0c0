"""A FastMCP server whose tools return what FastMCP wraps or sends without text: a list (no content block at all
for an empty one, the value as structured content {"result": [...]}), a string (one empty text block for ""), and
seed 002 §8's error dict (a backend failure returned as a value the model acts on)."""

from fastmcp import FastMCP

mcp = FastMCP("list-server")


@mcp.tool(annotations={"readOnlyHint": True})
def stock_rows(sku: str, n: int) -> list[dict]:
    """Stock rows of ``sku``: ``n`` of them (0: none in stock)."""
    return [{"region": "seoul", "qty": 3}] * n


@mcp.tool(annotations={"readOnlyHint": True})
def note_text(n: int) -> str:
    """A note of ``n`` characters (0: the empty string)."""
    return "가" * n


_calls = {"n": 0}


@mcp.tool(annotations={"readOnlyHint": True})
def classify_domain_group(term_korean: str) -> dict:
    """Seed 002 section 8: a backend failure returned as a dict the model acts on (retry)."""
    _calls["n"] += 1
    if _calls["n"] == 1:
        return {"error": "domain_classifier_unavailable", "fallback": "retry"}
    return {"group": "환자정보", "confidence": 0.87}


if __name__ == "__main__":
    mcp.run(transport="stdio", show_banner=False)
