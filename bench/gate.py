"""The gate's own cost per call: contract checks, memo lookup, circuit breaker and the audit write.

Run from the repo root: ``python -m bench.gate [--calls N]``. It binds the demo server (stdio, shared session)
on a throwaway SQLite database and times, alternately on the same live session, (a) ``direct``: the pool's
``call_tool`` of ``search_employee`` and (b) ``gate``: ``gate.call`` of the same tool with the same arguments
(a fresh memo each time, so every call really goes out and is audited). ``gate_overhead_ms_p50`` is the
difference of the medians: what the gate adds to a pooled call. Target: under 1 ms on SQLite.

Figures (``name: value`` lines; the database's engine goes to stderr): ``direct_p50_ms`` / ``_p95``,
``gate_p50_ms`` / ``_p95``, ``gate_overhead_ms_p50``, and last the headline ``gate_over_direct_p50``: the gate's
median over the direct call's, both measured in this run.
"""

from __future__ import annotations

import argparse
import sys
import time

from bench._stats import median, percentile, positive_int


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=positive_int, default=1000)
    options = parser.parse_args()

    from bench._django import bind_bench_demo_server, setup_django

    setup_django()
    from django.conf import settings

    from mcpregistry import gate
    from mcpregistry.pool import get_default_pool, shutdown_default_pool

    server = bind_bench_demo_server()
    pool = get_default_pool()
    config = server.connection_config()
    args = {"name": "김하늘"}
    who = gate.GateCall(source="admin", actor="bench")
    pool.call_tool(config, "search_employee", args, timeout_s=10)  # warm
    direct: list[float] = []
    gated: list[float] = []
    print(f"{options.calls} calls each, alternating…", file=sys.stderr)
    for i in range(options.calls):
        t0 = time.perf_counter()
        pool.call_tool(config, "search_employee", args, timeout_s=10)
        direct.append((time.perf_counter() - t0) * 1000)
        who.memo = {}
        t0 = time.perf_counter()
        result = gate.call(server=server, tool_name="search_employee", args=args, who=who)
        gated.append((time.perf_counter() - t0) * 1000)
        assert result.ok, result.message
        if (i + 1) % 250 == 0:
            print(f"  {i + 1}/{options.calls}", file=sys.stderr)
    shutdown_default_pool()
    direct_p50, gate_p50 = median(direct), median(gated)
    print(f"database: {settings.DATABASES['default']['ENGINE'].rsplit('.', 1)[-1]}", file=sys.stderr)
    print(f"direct_p50_ms: {direct_p50:.3f}")
    print(f"direct_p95_ms: {percentile(direct, 0.95):.3f}")
    print(f"gate_p50_ms: {gate_p50:.3f}")
    print(f"gate_p95_ms: {percentile(gated, 0.95):.3f}")
    print(f"gate_overhead_ms_p50: {gate_p50 - direct_p50:.3f}")
    print(f"gate_over_direct_p50: {gate_p50 / direct_p50:.3f}")


if __name__ == "__main__":
    main()
