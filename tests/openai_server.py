"""A small OpenAI-compatible chat-completions server for the tests: a real HTTP server on a free port that answers
``POST /v1/chat/completions`` with scripted turns, in the plain JSON form or, when the request asks for
``"stream": true``, as server-sent events (``data: {chunk}`` lines, then ``data: [DONE]``), the way vLLM, Ollama
and OpenAI do. Only the model is scripted: the platform's client (langchain-openai over httpx) talks real HTTP.

A turn is ``{"content": str}``, ``{"tool_calls": [{"name", "args"}]}``, or ``{"status": 429, "error": str}`` (an
error response, e.g. to test retries), or ``{"error_object": {...}}`` (HTTP 200 with ``{"error": {...}}`` as the
body, or as the one event of a stream, as some servers and gateways answer a failure); ``"delay_s"`` makes a turn
answer late (a timeout). ``{last_tool_result}`` in content is replaced by the latest tool message.
Every request is kept (``requests``: method, path, headers, JSON body) for the tests to check what was sent.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class ScriptedOpenAIServer:
    def __init__(self, turns: list[dict[str, Any]], *, usage: dict[str, int] | None = None) -> None:
        self.turns = list(turns)
        self.usage = usage or {"prompt_tokens": 100, "completion_tokens": 10, "cached_tokens": 40}
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None

    @property
    def base_url(self) -> str:
        assert self._httpd is not None
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def next_turn(self) -> dict[str, Any]:
        with self._lock:
            return self.turns.pop(0) if self.turns else {"content": "(the script is used up)"}

    def completion(self, body: dict[str, Any], turn: dict[str, Any]) -> dict[str, Any]:
        last_tool = next((str(m.get("content")) for m in reversed(body["messages"]) if m.get("role") == "tool"), "")
        message: dict[str, Any] = {"role": "assistant", "content": None}
        if turn.get("tool_calls"):
            message["tool_calls"] = [
                {
                    "id": f"call_{uuid.uuid4().hex[:10]}",
                    "type": "function",
                    # ``raw_arguments``: the text as a model wrote it, JSON or not (a call cut short, say).
                    "function": {
                        "name": c["name"],
                        "arguments": c["raw_arguments"]
                        if "raw_arguments" in c
                        else json.dumps(c.get("args", {}), ensure_ascii=False),
                    },
                }
                for c in turn["tool_calls"]
            ]
        else:
            message["content"] = str(turn.get("content", "")).replace("{last_tool_result}", last_tool)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:10]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", ""),
            "choices": [
                {"index": 0, "message": message, "finish_reason": "tool_calls" if turn.get("tool_calls") else "stop"}
            ],
            "usage": {
                "prompt_tokens": self.usage["prompt_tokens"],
                "completion_tokens": self.usage["completion_tokens"],
                "total_tokens": self.usage["prompt_tokens"] + self.usage["completion_tokens"],
                "prompt_tokens_details": {"cached_tokens": self.usage.get("cached_tokens", 0)},
            },
        }

    def chunks(self, completion: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """The completion as streaming chunks: role, then content or tool-call pieces, then finish, then usage."""
        base = {k: completion[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
        choice = completion["choices"][0]
        message = choice["message"]
        yield base | {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
        if message.get("tool_calls"):
            for i, call in enumerate(message["tool_calls"]):
                head = {"index": i, "id": call["id"], "type": "function"}
                args = call["function"]["arguments"]
                first = head | {"function": {"name": call["function"]["name"], "arguments": args[: len(args) // 2]}}
                yield base | {"choices": [{"index": 0, "delta": {"tool_calls": [first]}}]}
                rest = {"index": i, "function": {"arguments": args[len(args) // 2 :]}}
                yield base | {"choices": [{"index": 0, "delta": {"tool_calls": [rest]}}]}
        else:
            text = message["content"] or ""
            for start in range(0, len(text), 8):
                yield base | {"choices": [{"index": 0, "delta": {"content": text[start : start + 8]}}]}
        yield base | {"choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]}
        yield base | {"choices": [], "usage": completion["usage"]}

    @contextmanager
    def running(self) -> Iterator[ScriptedOpenAIServer]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_POST(self) -> None:
                try:
                    self._answer()
                except (BrokenPipeError, ConnectionResetError):
                    return  # the client gave up (a timeout test): nothing to answer

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                with server._lock:
                    server.requests.append(
                        {"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}, "body": body}
                    )
                if self.path.rstrip("/") != "/v1/chat/completions":
                    self._json(404, {"error": {"message": "not found"}})
                    return
                turn = server.next_turn()
                if turn.get("delay_s"):
                    time.sleep(float(turn["delay_s"]))
                if "status" in turn:
                    self._json(int(turn["status"]), {"error": {"message": turn.get("error", "error"), "type": "x"}})
                    return
                if "error_object" in turn:
                    completion = {"error": turn["error_object"]}
                    chunks: Iterator[dict[str, Any]] = iter([completion])
                else:
                    completion = server.completion(body, turn)
                    chunks = server.chunks(completion)
                if not body.get("stream"):
                    self._json(200, completion)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.end_headers()
                for chunk in chunks:
                    self.wfile.write(f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n".encode())
                    self.wfile.flush()
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                self.close_connection = True

            def _json(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload, ensure_ascii=False).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._httpd.shutdown()
            self._httpd.server_close()
            thread.join(timeout=5)
