"""Operations, as an operator runs them: a web server and a real Celery worker as separate processes on the
embedded broker, both exporting traces over OTLP/HTTP (the standard ``OTEL_*`` variables) to a collector this
test runs, and logging JSON lines (``LOG_FORMAT=json``).

One trace goes from the caller's ``traceparent`` through the web's request span, the broker and the worker's
task, run, rule and gate spans; ``/readyz`` turns ready when the worker's heartbeat arrives; ``/metrics`` counts
the run the worker finished (it reads the database, which both processes write)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.e2e.harness import wait_until
from tests.e2e.workers import Platform, platform_without_workers

pytestmark = [pytest.mark.e2e]

CALLER_TRACE = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN = "b7ad6b7169203331"


@dataclass
class ReceivedSpan:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]


class Collector:
    """An OTLP/HTTP trace receiver: decodes every ``ExportTraceServiceRequest`` posted to ``/v1/traces``."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.lock = threading.Lock()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                collector.receive(request)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def receive(self, request: ExportTraceServiceRequest) -> None:
        with self.lock:
            for resource_spans in request.resource_spans:
                service = next(
                    (a.value.string_value for a in resource_spans.resource.attributes if a.key == "service.name"), ""
                )
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        attributes = {a.key: _value(a.value) for a in span.attributes}
                        self.spans.append(
                            ReceivedSpan(
                                service=service,
                                name=span.name,
                                trace_id=span.trace_id.hex(),
                                span_id=span.span_id.hex(),
                                parent_span_id=span.parent_span_id.hex(),
                                attributes=attributes,
                            )
                        )

    def named(self, name: str) -> list[ReceivedSpan]:
        with self.lock:
            return [s for s in self.spans if s.name == name]


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind and kind != "array_value" else [_value(v) for v in value.array_value.values]


@pytest.fixture
def collector() -> Iterator[Collector]:
    receiver = Collector()
    receiver.thread.start()
    yield receiver
    receiver.server.shutdown()


@pytest.fixture
def platform(tmp_path: Path, collector: Collector) -> Iterator[Platform]:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url,
        "OTEL_BSP_SCHEDULE_DELAY": "200",
        "OTEL_SERVICE_NAME": "platform-web",
        "LOG_FORMAT": "json",
        "PLATFORM_WORKER_HEARTBEAT_S": "1",
        "PLATFORM_READY_WORKER_MAX_AGE_S": "30",
    }
    with platform_without_workers(tmp_path, broker_url="filesystem://", env=env) as running:
        yield running


def test_one_trace_crosses_web_broker_worker_and_the_probes_and_metrics_see_the_worker(
    platform: Platform, collector: Collector
) -> None:
    before = httpx.get(f"{platform.base_url}/readyz", timeout=30)
    assert before.status_code == 503 and before.json()["checks"]["worker"]["ok"] is False

    platform.start_worker("traced", env={"OTEL_SERVICE_NAME": "platform-worker"})
    wait_until(
        lambda: httpx.get(f"{platform.base_url}/readyz", timeout=30).status_code == 200,
        timeout=60,
        what="/readyz to see the worker",
    )

    with platform.client() as client:
        response = client.post(
            "/api/v1/runs?wait=60",
            json={"agent": "company-assistant", "query": "김하늘 님은 어느 팀 소속인가요?"},
            headers={"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"},
        )
    assert response.status_code in (200, 202), response.text
    run_id = response.json()["id"]
    wait_until(lambda: platform.run_row(run_id)["status"] == "succeeded", timeout=60, what="the run")

    def worker_spans_arrived() -> bool:
        return bool(collector.named("execute_tool search_employee")) and bool(
            collector.named("celery.task agents.run_agent")
        )

    wait_until(worker_spans_arrived, timeout=30, what="the worker's spans at the collector")
    wait_until(lambda: bool(collector.named("POST /api/v1/runs")), timeout=30, what="the web's span")

    (request_span,) = collector.named("POST /api/v1/runs")
    assert request_span.service == "platform-web"
    assert request_span.trace_id == CALLER_TRACE and request_span.parent_span_id == CALLER_SPAN
    (task,) = collector.named("celery.task agents.run_agent")
    assert task.service == "platform-worker"
    assert task.trace_id == CALLER_TRACE
    assert task.parent_span_id == request_span.span_id  # published inside the request: its child
    assert task.attributes["platform.run_id"] == run_id
    wait_until(lambda: bool(collector.named("invoke_agent company-assistant")), timeout=30, what="the run span")
    (invoke,) = collector.named("invoke_agent company-assistant")
    assert invoke.parent_span_id == task.span_id and invoke.attributes["platform.run.status"] == "succeeded"
    (tool,) = collector.named("execute_tool search_employee")
    assert tool.trace_id == CALLER_TRACE and tool.service == "platform-worker"
    assert tool.attributes["gen_ai.tool.name"] == "search_employee" and tool.attributes["platform.ok"] is True
    rules = collector.named("deterministic_rule")
    assert tool.parent_span_id in {r.span_id for r in rules}

    # The worker's log lines are JSON, and those of the run carry its id and the caller's trace id.
    lines = [
        json.loads(line)
        for line in platform.workers[0].log.read_text(encoding="utf-8").splitlines()
        if line.startswith("{")
    ]
    of_the_run = [line for line in lines if line.get("run_id") == run_id]
    assert of_the_run, lines[-10:]
    assert all(line["trace_id"] == CALLER_TRACE for line in of_the_run if "trace_id" in line)
    assert any("trace_id" in line for line in of_the_run)

    metrics = httpx.get(f"{platform.base_url}/metrics", timeout=30)
    assert metrics.status_code == 200
    text = metrics.text
    assert 'platform_runs{agent="company-assistant",status="succeeded"} 1.0' in text
    assert "platform_workers_alive 1.0" in text
    assert (
        'platform_tool_calls_total{mcp_id="sds-company-data",outcome="ok",reason="",tool="search_employee"} 1.0' in text
    )
