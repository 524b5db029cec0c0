"""What an API request costs as its key's history grows: ``POST /api/v1/runs`` with a new Idempotency-Key (the
key's earlier run with the same Idempotency-Key is looked up on every such POST) and ``GET /api/v1/runs`` (the
newest page of the key's runs), first with a short history, then with a long one.

Run from the repo root: ``python -m bench.history [--requests N] [--history RUNS]``. The demo's agent on a
throwaway SQLite database, a key issued by the service, Django's test client in this process (the whole request:
middleware, authentication, rate limit, validation, the run's rows, its publication on the embedded broker),
``N`` requests of each kind at each size. The short history is the key's first requests; the long one adds
``RUNS`` finished runs of the key (written in bulk). Each figure is the median wall time of a request, in ms;
the ratios compare the long history with the short one, measured in this run (1.0: the cost does not grow).
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
from typing import Any

from bench._stats import median, positive_int


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=positive_int, default=200)
    parser.add_argument("--history", type=positive_int, default=20_000)
    options = parser.parse_args()

    os.environ["PLATFORM_API_RATE"] = "100000000/min"
    from bench._django import setup_django

    setup_django()
    from django.core.management import call_command
    from django.test import Client

    from agents.models import Agent, Run
    from agents.services import api_key_create

    call_command("seed_demo", "--no-discover", verbosity=0, stdout=io.StringIO())  # not its admin password
    agent = Agent.objects.get(slug="company-assistant")
    key, raw = api_key_create(name="bench-history", actor="system:bench", via="bench", agents=[agent])
    client = Client(HTTP_AUTHORIZATION=f"Bearer {raw}")
    body = {"agent": agent.slug, "query": "김하늘 님은 어느 팀 소속인가요?"}

    def timed(label: str, size: str) -> dict[str, float]:
        post: list[float] = []
        page: list[float] = []
        for i in range(options.requests):
            started = time.perf_counter()
            answer: Any = client.post(
                "/api/v1/runs", body, content_type="application/json", HTTP_IDEMPOTENCY_KEY=f"{size}-{i}"
            )
            post.append((time.perf_counter() - started) * 1000)
            assert answer.status_code == 202, answer.content
            started = time.perf_counter()
            answer = client.get("/api/v1/runs?page_size=20")
            page.append((time.perf_counter() - started) * 1000)
            assert answer.status_code == 200, answer.content
        runs = Run.objects.filter(api_key=key).count()
        print(f"  {label}: {runs} runs of the key", file=sys.stderr)
        return {"runs": runs, "post": median(post), "page": median(page)}

    print(f"{options.requests} requests of each kind per size…", file=sys.stderr)
    for i in range(20):  # warm: the first requests load what the process caches
        client.post("/api/v1/runs", body, content_type="application/json", HTTP_IDEMPOTENCY_KEY=f"warm-{i}")
    short = timed("short history", "short")
    template = Run.objects.filter(api_key=key).order_by("created_at").first()
    assert template is not None
    Run.objects.bulk_create(
        [
            Run(
                agent=template.agent,
                api_key=key,
                query=template.query,
                status=Run.Status.SUCCEEDED,
                idempotency_key=f"history-{i}",
                request_digest=template.request_digest,
            )
            for i in range(options.history)
        ],
        batch_size=2000,
    )
    long = timed("long history", "long")

    print(f"runs_of_key_short: {short['runs']}")
    print(f"runs_of_key_long: {long['runs']}")
    print(f"post_ms_p50_short: {short['post']:.3f}")
    print(f"post_ms_p50_long: {long['post']:.3f}")
    print(f"page_ms_p50_short: {short['page']:.3f}")
    print(f"page_ms_p50_long: {long['page']:.3f}")
    print(f"page_ms_ratio_long_over_short: {long['page'] / short['page']:.2f}")
    print(f"post_ms_ratio_long_over_short: {long['post'] / short['post']:.2f}")


if __name__ == "__main__":
    main()
