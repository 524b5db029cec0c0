"""The OpenAI-compatible models share one pair of HTTP clients per process, whatever their key: those kept the
cookies a gateway set (LiteLLM, Kong, an oauth2-proxy's session), and agent B's requests carried the session cookie
set for agent A's key (identified, rate-limited or billed as A). The clients take no cookies."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from langchain_core.messages import HumanMessage

from agents.providers import build_provider_model


class CookieGateway(BaseHTTPRequestHandler):
    """A chat completions endpoint that sets a session cookie naming the key that asked, and records what each
    request sent."""

    seen: list[dict[str, Any]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        who = (self.headers.get("authorization") or "").split()[-1]
        CookieGateway.seen.append({"key": who, "cookie": self.headers.get("cookie")})
        body = json.dumps(
            {
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": "m",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "네"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        ).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("set-cookie", f"gw_session=session-of-{who}; Path=/")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def gateway() -> Iterator[str]:
    CookieGateway.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), CookieGateway)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def test_one_agents_gateway_cookie_never_goes_with_another_agents_requests(gateway: str) -> None:
    for key in ("sk-tenant-alpha-000000000001", "sk-tenant-beta-000000000002", "sk-tenant-alpha-000000000001"):
        model = build_provider_model(
            provider="openai_compatible", model_id="m", params={"base_url": gateway}, api_key=key
        )
        model.invoke([HumanMessage(content="안녕")])

    assert [request["cookie"] for request in CookieGateway.seen] == [None, None, None]
