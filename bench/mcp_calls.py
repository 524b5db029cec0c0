"""Per-call latency of the demo server's ``ping`` tool over stdio, three ways, plus a soak of the pool.

Run from the repo root: ``python -m bench.mcp_calls [--calls N] [--baseline-calls M] [--soak 10000]``.

- ``pool``: the platform's ``McpSessionPool.call_tool`` from a synchronous caller (after one warm-up call):
  the thread hop to the pool's loop, the session lookup and the call over the live session.
- ``session_per_call``: langchain-mcp-adapters' default (``MultiServerMCPClient`` + ``tool.ainvoke``), which
  opens a new session, i.e. starts a new server process, for every call.
- ``bare_session``: a hand-held ``mcp.ClientSession`` over ``stdio_client`` (after one warm-up call): the floor.
  Its calls alternate with the pool's, so that both see the same load on the machine.

Figures are milliseconds per call (p50, p95). ``pool_vs_bare_p50_ratio`` is the pool's overhead over the floor
(1.0 = none). The soak makes ``--soak`` pooled calls and reports this process's RSS before and after (MB), and
how many server processes are alive (children of this process) during and after: it must stay 1, and 0 once
the pool is shut down. The last line, ``pool_speedup_vs_session_per_call``, is what the pool buys over the
adapters' default (p50 over p50). Progress goes to stderr, figures to stdout as ``name: value`` lines.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from langchain_mcp_adapters.client import MultiServerMCPClient
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from bench._stats import median, percentile, positive_int
from mcpregistry.pool import SAFE_ENV_KEYS, McpSessionPool

REPO_ROOT = Path(__file__).resolve().parent.parent
SERVER_ARGS = ["-m", "mcpregistry.demo_server"]
# Every variant starts the server the same way: the pool's safe minimum of our environment plus FAILURE_MODE.
SERVER_ENV = {k: os.environ[k] for k in SAFE_ENV_KEYS if k in os.environ} | {"FAILURE_MODE": "none"}
POOL_CONFIG: dict[str, Any] = {
    "mcp_id": "bench-demo",
    "transport": "stdio",
    "command": sys.executable,
    "args": SERVER_ARGS,
    "cwd": str(REPO_ROOT),
    "env": {"FAILURE_MODE": "none"},
}
# Progress goes to a copy of stderr, so that stderr itself can be pointed elsewhere while the servers the
# adapters start (which inherit it) log each request.
PROGRESS = os.fdopen(os.dup(sys.stderr.fileno()), "w", buffering=1)


def progress(message: str) -> None:
    print(message, file=PROGRESS)


def report(name: str, value: float | int, digits: int = 2) -> None:
    print(f"{name}: {round(value, digits) if isinstance(value, float) else value}", flush=True)


def report_latencies(name: str, samples_ms: list[float]) -> float:
    p50 = median(samples_ms)
    report(f"{name}_p50_ms", p50)
    report(f"{name}_p95_ms", percentile(samples_ms, 0.95))  # one sample (``--baseline-calls 1``) is its own p95
    return p50


def rss_mb() -> float:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


@contextlib.contextmanager
def server_stderr_to_devnull() -> Iterator[None]:
    """Point fd 2 at /dev/null: the adapters give their servers no errlog of their own."""
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


async def time_session_per_call(calls: int) -> list[float]:
    client = MultiServerMCPClient(
        {
            "demo": {
                "transport": "stdio",
                "command": sys.executable,
                "args": SERVER_ARGS,
                "cwd": str(REPO_ROOT),
                "env": SERVER_ENV,
            }
        }
    )
    ping = next(t for t in await client.get_tools() if t.name == "ping")
    samples = []
    for i in range(calls):
        progress(f"session-per-call {i + 1}/{calls}…")
        start = time.perf_counter()
        result = await ping.ainvoke({})
        samples.append((time.perf_counter() - start) * 1000)
        assert "pong" in str(result), result
    return samples


async def time_pool_and_bare(pool: McpSessionPool, calls: int) -> tuple[list[float], list[float]]:
    """Time the bare session and the pool call by call, alternately, so that both see the same machine load."""
    params = StdioServerParameters(command=sys.executable, args=SERVER_ARGS, env=SERVER_ENV, cwd=str(REPO_ROOT))
    pool_ms: list[float] = []
    bare_ms: list[float] = []
    with open(os.devnull, "w") as devnull:
        async with stdio_client(params, errlog=devnull) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            # Warm-up: the pool starts its server; the client fetches the tools' output schemas once.
            pool.call_tool(POOL_CONFIG, "ping", {}, timeout_s=30)
            await session.call_tool("ping", {})
            for _ in range(calls):
                start = time.perf_counter()
                result = await session.call_tool("ping", {})
                bare_ms.append((time.perf_counter() - start) * 1000)
                assert not result.isError, result
                # The pool runs on its own loop's thread: blocking this (idle) loop meanwhile is harmless.
                start = time.perf_counter()
                outcome = pool.call_tool(POOL_CONFIG, "ping", {}, timeout_s=10)
                pool_ms.append((time.perf_counter() - start) * 1000)
                assert outcome.text == "pong", outcome
    return pool_ms, bare_ms


def soak(pool: McpSessionPool, calls: int) -> None:
    gc.collect()
    before = rss_mb()
    children_during = 0
    every = max(calls // 10, 1)
    for i in range(1, calls + 1):
        assert pool.call_tool(POOL_CONFIG, "ping", {}, timeout_s=10).text == "pong"
        if i % every == 0 or i == calls:
            children_during = max(children_during, len(pool.child_process_ids()))
            progress(f"soak {i}/{calls}…")
    gc.collect()
    after = rss_mb()
    report("soak_calls", calls)
    report("soak_rss_before_mb", before, 1)
    report("soak_rss_after_mb", after, 1)
    report("rss_growth_mb", after - before, 1)
    report("soak_server_processes_during_max", children_during)
    report("soak_server_processes_after", len(pool.child_process_ids()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=positive_int, default=1000, help="timed calls for pool and bare_session")
    parser.add_argument("--baseline-calls", type=positive_int, default=10, help="timed calls for session_per_call")
    parser.add_argument("--soak", type=positive_int, default=10_000, help="pooled calls in the soak")
    args = parser.parse_args()

    pool = McpSessionPool()
    try:
        progress(f"pool and bare session: {args.calls} calls each, interleaved…")
        pool_ms, bare_ms = asyncio.run(time_pool_and_bare(pool, args.calls))
        pool_p50 = report_latencies("pool", pool_ms)
        progress("session-per-call: listing tools…")
        with server_stderr_to_devnull():
            per_call_p50 = report_latencies("session_per_call", asyncio.run(time_session_per_call(args.baseline_calls)))
        bare_p50 = report_latencies("bare_session", bare_ms)
        soak(pool, args.soak)
    finally:
        pool.shutdown()
    report("server_processes_after_shutdown", len(McpSessionPool.child_process_ids()))
    report("pool_vs_bare_p50_ratio", pool_p50 / bare_p50)
    report("pool_speedup_vs_session_per_call", per_call_p50 / pool_p50, 1)


if __name__ == "__main__":
    main()
