"""A small OpenAI-compatible ``/embeddings`` HTTP server for tests and the bench: deterministic vectors (hashed
character bigrams and lower-cased words, 256 dimensions), so similar texts get similar vectors without a model
or a network. It counts the texts it embedded, so a test can tell a cached vector from a recomputed one."""

from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DIMENSIONS = 256


def hashed_vector(text: str) -> list[float]:
    vector = [0.0] * DIMENSIONS
    for word in re.findall(r"\w+", text.lower()):
        grams = [word] if len(word) < 2 else [word[i : i + 2] for i in range(len(word) - 1)] + [word]
        for gram in grams:
            slot = int(hashlib.md5(gram.encode(), usedforsecurity=False).hexdigest()[:8], 16) % DIMENSIONS
            vector[slot] += 1.0
    return vector


class EmbeddingServer:
    def __init__(self) -> None:
        self.embedded: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body: dict[str, Any] = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
                outer.embedded.extend(texts)
                data = [{"object": "embedding", "index": i, "embedding": hashed_vector(t)} for i, t in enumerate(texts)]
                payload = json.dumps(
                    {
                        "object": "list",
                        "data": data,
                        "model": body["model"],
                        "usage": {"prompt_tokens": 0, "total_tokens": 0},
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> EmbeddingServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
