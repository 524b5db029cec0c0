"""A small OpenAI-compatible ``/embeddings`` HTTP server for tests and the bench: deterministic vectors (hashed
character bigrams and lower-cased words, 256 dimensions), so similar texts get similar vectors without a model
or a network. It counts the texts it embedded, so a test can tell a cached vector from a recomputed one. Its
``answer`` (settable while it serves) says what it answers: ``"hashed"`` (the vectors above), ``"nan"`` (vectors of
NaN, written as JSON's non-standard ``NaN`` as Python writes it), ``"empty"`` (``[]`` for each text) or
``"short"`` (hashed vectors of 8 dimensions: another model behind the same URL)."""

from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

DIMENSIONS = 256
SHORT_DIMENSIONS = 8

Answer = Literal["hashed", "nan", "empty", "short"]


def hashed_vector(text: str, dimensions: int = DIMENSIONS) -> list[float]:
    vector = [0.0] * dimensions
    for word in re.findall(r"\w+", text.lower()):
        grams = [word] if len(word) < 2 else [word[i : i + 2] for i in range(len(word) - 1)] + [word]
        for gram in grams:
            slot = int(hashlib.md5(gram.encode(), usedforsecurity=False).hexdigest()[:8], 16) % dimensions
            vector[slot] += 1.0
    return vector


def answered_vector(text: str, answer: Answer) -> list[float]:
    if answer == "nan":
        return [float("nan")] * DIMENSIONS
    if answer == "empty":
        return []
    return hashed_vector(text, SHORT_DIMENSIONS if answer == "short" else DIMENSIONS)


class EmbeddingServer:
    def __init__(self, answer: Answer = "hashed") -> None:
        self.embedded: list[str] = []
        self.answer: Answer = answer
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body: dict[str, Any] = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
                outer.embedded.extend(texts)
                data = [
                    {"object": "embedding", "index": i, "embedding": answered_vector(t, outer.answer)}
                    for i, t in enumerate(texts)
                ]
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
