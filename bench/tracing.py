"""What tracing costs a gated tool call: ``gate.call`` of the demo server's ``search_employee`` with traces off
(OpenTelemetry's no-op tracer, the default) and on (the SDK's tracer with a batch processor and an exporter that
drops what it is given, so the network is not measured), alternating call by call on one live session.

Run from the repo root: ``python -m bench.tracing [--calls N]``. With traces on, each gate call makes a span with
one event per attempt and sends its ``traceparent`` to the server in the request's ``_meta``.
``traced_over_untraced_p50`` (last) is the ratio of the medians.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from bench._stats import median, percentile, positive_int


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=positive_int, default=1000)
    options = parser.parse_args()

    from bench._django import bind_bench_demo_server, setup_django

    setup_django()
    from opentelemetry import trace
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    import agent_platform.telemetry as telemetry
    from mcpregistry import gate
    from mcpregistry.pool import shutdown_default_pool

    class Dropped(SpanExporter):
        def __init__(self) -> None:
            self.count = 0

        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            self.count += len(spans)
            return SpanExportResult.SUCCESS

    exporter = Dropped()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    traced_tracer = provider.get_tracer(telemetry.TRACER_NAME)
    untraced_tracer = trace.NoOpTracer()

    server = bind_bench_demo_server()
    args = {"name": "김하늘"}
    who = gate.GateCall(source="admin", actor="bench")
    samples: dict[str, list[float]] = {"untraced": [], "traced": []}
    print(f"{options.calls} calls each, alternating…", file=sys.stderr)
    for i in range(options.calls + 20):
        for name, tracer in (("untraced", untraced_tracer), ("traced", traced_tracer)):
            telemetry._tracer = tracer
            who.memo = {}
            t0 = time.perf_counter()
            result = gate.call(server=server, tool_name="search_employee", args=args, who=who)
            elapsed_ms = (time.perf_counter() - t0) * 1000
            assert result.ok, result.message
            if i >= 20:  # the first calls warm the session and the caches
                samples[name].append(elapsed_ms)
        if (i + 1) % 250 == 0:
            print(f"  {i + 1}/{options.calls}", file=sys.stderr)
    provider.force_flush()
    shutdown_default_pool()
    untraced_p50, traced_p50 = median(samples["untraced"]), median(samples["traced"])
    print(f"spans_exported: {exporter.count}")
    print(f"untraced_p50_ms: {untraced_p50:.3f}")
    print(f"untraced_p95_ms: {percentile(samples['untraced'], 0.95):.3f}")
    print(f"traced_p50_ms: {traced_p50:.3f}")
    print(f"traced_p95_ms: {percentile(samples['traced'], 0.95):.3f}")
    print(f"tracing_overhead_ms_p50: {traced_p50 - untraced_p50:.3f}")
    print(f"traced_over_untraced_p50: {traced_p50 / untraced_p50:.3f}")


if __name__ == "__main__":
    main()
