"""A streamable-HTTP MCP server that tells what HTTP headers reached it: ``python -m
tests.mcp_fixtures.headers_server PORT [FILE] [--forget-after-call]``. With a FILE, its write tool ``record``
appends a line to it (the file counts what the server really did). With ``--forget-after-call``, a session is
forgotten once a ``tools/call`` on it has been answered (as by a restart, or a replica behind a load balancer
that never saw the session): every later request on its id is answered 404, as the SDK answers an unknown one.
With ``--bad-gateway-on-record``, a ``tools/call`` of ``record`` is answered HTTP 502 by a gateway in front of it
(the tool never runs)."""

from __future__ import annotations

import json
import sys
from typing import Any

from fastmcp import FastMCP
from fastmcp.server.dependencies import get_http_headers

mcp = FastMCP("headers")


@mcp.tool(annotations={"readOnlyHint": True})
def request_headers() -> str:
    """The headers of this request, as JSON."""
    return json.dumps(get_http_headers(include_all=True))


@mcp.tool(annotations={"readOnlyHint": False, "destructiveHint": True})
def record(text: str) -> str:
    """Appends ``text`` to the server's file."""
    with open(sys.argv[2], "a", encoding="utf-8") as f:
        f.write(text + "\n")
    return "recorded"


def forgetting_app(*, forget: bool = True, bad_gateway_on: str = "") -> Any:
    inner = mcp.http_app()
    forgotten: set[str] = set()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            return await inner(scope, receive, send)
        session_id = dict(scope.get("headers", [])).get(b"mcp-session-id", b"").decode()
        messages = []
        while True:
            message = await receive()
            messages.append(message)
            if not message.get("more_body"):
                break
        if session_id in forgotten:
            body = {"jsonrpc": "2.0", "id": "server-error", "error": {"code": -32600, "message": "Session not found"}}
            await send(
                {"type": "http.response.start", "status": 404, "headers": [(b"content-type", b"application/json")]}
            )
            await send({"type": "http.response.body", "body": json.dumps(body).encode()})
            return
        try:
            request = json.loads(b"".join(m.get("body", b"") for m in messages) or b"{}")
        except ValueError:
            request = {}
        calling = isinstance(request, dict) and request.get("method") == "tools/call"
        if calling and bad_gateway_on and (request.get("params") or {}).get("name") == bad_gateway_on:
            await send({"type": "http.response.start", "status": 502, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"bad gateway"})
            return
        if forget and session_id and calling:
            forgotten.add(session_id)  # answered below; forgotten from the next request on

        async def receive_again() -> Any:
            return messages.pop(0) if messages else await receive()

        await inner(scope, receive_again, send)

    return app


if __name__ == "__main__":
    if "--forget-after-call" in sys.argv or "--bad-gateway-on-record" in sys.argv:
        import uvicorn

        app = forgetting_app(
            forget="--forget-after-call" in sys.argv,
            bad_gateway_on="record" if "--bad-gateway-on-record" in sys.argv else "",
        )
        uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", lifespan="on")
    else:
        mcp.run(transport="http", host="127.0.0.1", port=int(sys.argv[1]), show_banner=False)
