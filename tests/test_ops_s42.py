"""Operations defects (s42 ops):

1. A worker whose consumer cannot reach its broker still wrote its heartbeat (a timer thread of its main process),
   so ``/readyz`` and ``platform_workers_alive`` counted a worker that took no task. The heartbeat is now written
   only while the consumer is connected and consuming, and removed while it is not.
2. A gate call that raised (the run's soft time limit, the database) left an ``execute_tool `` span with an empty
   ``gen_ai.tool.name``: it was named only from the result.
3. ``/metrics`` was open through a proxy on this machine that names the client only in ``X-Real-IP`` (or
   ``True-Client-IP``, ``CF-Connecting-IP``, ``X-Client-IP``, ``X-Original-Forwarded-For``): only the
   ``X-Forwarded-*`` headers told that a proxy forwarded the request.
4. ``OTEL_TRACES_EXPORTER=console`` printed Korean as ``\\uXXXX`` escapes.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.test import Client

from mcpregistry import gate
from tests.conftest import bind_demo_server
from tests.e2e.harness import redis_server, wait_until
from tests.e2e.workers import Platform, Worker, platform_without_workers
from tests.mcpregistry.test_fix_pool_review import soft_time_limit_in

# --- 1. the heartbeat of a worker cut off from its broker ------------------------------------------------------


def heartbeats(platform: Platform) -> list[str]:
    return sorted(worker for (worker,) in platform.query("SELECT worker FROM agents_workerheartbeat"))


def its_heartbeat(worker: Worker) -> str:
    return f"{socket.gethostname()}:{worker.process.pid}"


def workers_alive(platform: Platform) -> float:
    for line in httpx.get(f"{platform.base_url}/metrics", timeout=30).text.splitlines():
        if line.startswith("platform_workers_alive "):
            return float(line.split()[1])
    raise AssertionError("no platform_workers_alive in /metrics")


@contextmanager
def redis_again(port: int, workdir: Path) -> Iterator[None]:
    """A redis-server on ``port`` again (the broker coming back), stopped at the end."""
    binary = shutil.which("redis-server")
    assert binary is not None
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(workdir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    try:
        yield
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=20)


@pytest.mark.e2e
@pytest.mark.redis
@pytest.mark.slow
def test_a_worker_that_cannot_reach_its_broker_has_no_heartbeat_until_it_reconnects(tmp_path: Path) -> None:
    import redis

    with (
        redis_server(tmp_path) as broker_url,
        # No run here: the worker's pool process need not start the demo MCP server as it starts.
        platform_without_workers(
            tmp_path,
            broker_url=broker_url,
            env={"PLATFORM_WORKER_HEARTBEAT_S": "1", "PLATFORM_MCP_OPEN_AT_START": "0"},
        ) as p,
    ):
        port = int(urlsplit(broker_url).port or 0)
        worker = p.start_worker("cut-off")
        wait_until(lambda: heartbeats(p) == [its_heartbeat(worker)], timeout=30, what="the first heartbeat")
        assert workers_alive(p) == 1

        redis.Redis(port=port).shutdown(nosave=True)  # the broker goes away; the worker's consumer retries
        wait_until(lambda: b"Cannot connect" in worker.log.read_bytes(), timeout=30, what="the consumer retrying")

        wait_until(lambda: heartbeats(p) == [], timeout=10, what="the heartbeat of a worker off its broker to go")
        readyz = httpx.get(f"{p.base_url}/readyz", timeout=30).json()
        assert readyz["checks"]["worker"]["ok"] is False
        assert workers_alive(p) == 0
        assert worker.process.poll() is None  # still running, retrying

        with redis_again(port, tmp_path):
            wait_until(lambda: heartbeats(p) == [its_heartbeat(worker)], timeout=60, what="the heartbeat back")
            assert workers_alive(p) == 1
            worker.stop()
        assert heartbeats(p) == []


# --- 2. the span of a gate call that raised ---------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_a_gate_call_cut_short_by_the_soft_time_limit_is_the_asked_tools_span(spans: Any) -> None:
    server = bind_demo_server(failure_mode="timeout", FAILURE_TIMEOUT_S="5")  # the backend stalls
    who = gate.GateCall(source="agent", call_id="call_stalled")
    with soft_time_limit_in(1.0), pytest.raises(SoftTimeLimitExceeded):
        gate.call(server=server, tool_name="get_asset_status", args={"asset_id": "A-1001"}, who=who)

    (call,) = [s for s in spans.get_finished_spans() if s.attributes.get("gen_ai.tool.call.id") == "call_stalled"]
    assert call.name == "execute_tool get_asset_status"
    assert call.attributes["gen_ai.tool.name"] == "get_asset_status"
    assert call.attributes["error.type"] == "SoftTimeLimitExceeded"


# --- 3. /metrics through a proxy that names the client in another header ---------------------------------------

CLIENT_ADDRESS_HEADERS = [
    "HTTP_X_REAL_IP",
    "HTTP_TRUE_CLIENT_IP",
    "HTTP_CF_CONNECTING_IP",
    "HTTP_X_CLIENT_IP",
    "HTTP_X_ORIGINAL_FORWARDED_FOR",
]


@pytest.mark.django_db
@pytest.mark.parametrize("header", CLIENT_ADDRESS_HEADERS)
def test_metrics_through_a_local_proxy_naming_the_client_in_another_header_are_refused(
    client: Client, settings: Any, header: str
) -> None:
    settings.PLATFORM_METRICS_TOKEN = "scrape-token-0123456789"
    local: dict[str, Any] = {"REMOTE_ADDR": "127.0.0.1"}
    assert client.get("/metrics", **local).status_code == 200  # a local scraper
    proxied: dict[str, Any] = {**local, header: "203.0.113.9"}
    assert client.get("/metrics", **proxied).status_code == 403
    # The token still lets a scraper behind it in.
    token = {**proxied, "HTTP_AUTHORIZATION": "Bearer scrape-token-0123456789"}
    assert client.get("/metrics", **token).status_code == 200


# --- 4. the console exporter keeps Korean as written -------------------------------------------------------------

PRINT_A_SPAN = """
import agent_platform.telemetry as telemetry
from opentelemetry import trace

with telemetry.span("사원 조회", {"platform.query": "김하늘 님은 어느 팀인가요?"}):
    pass
trace.get_tracer_provider().shutdown()
"""


@pytest.mark.slow
def test_the_console_exporter_prints_korean_as_written(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "LOG_FORMAT"))}
    env.update(
        PLATFORM_VAR_DIR=str(tmp_path),
        DJANGO_SETTINGS_MODULE="agent_platform.settings",
        OTEL_TRACES_EXPORTER="console",
        PYTHONIOENCODING="utf-8",
    )
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", PRINT_A_SPAN],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert '"name": "사원 조회"' in done.stdout, done.stdout
    assert '"platform.query": "김하늘 님은 어느 팀인가요?"' in done.stdout
    assert "\\u" not in done.stdout
