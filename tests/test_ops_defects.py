"""Operations defects a review found (traces, metrics, probes, logs), each checked as it should hold:

- ``/readyz`` answers (503) within seconds when a Redis broker accepts the connection and never answers, and a
  Redis broker's sockets are bounded in the settings;
- a call the open circuit refused was never sent: no latency, so no observation in the latency histogram;
- archiving audit events never makes ``/metrics``' tool-call counters or histogram go down;
- a call refused before the gate (unknown tool, not offered, withdrawn, unknown resource) and a resource read or
  prompt rendering are spans of their own, with their ``gate.attempt`` events;
- a request span is named by its method and matched route, never by the path asked for;
- a caller's ``baggage`` goes neither into Celery's headers nor into an MCP request's ``_meta``, nor is read in;
- under gunicorn with ``LOG_FORMAT=json`` every line the server writes is JSON.
"""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.test import RequestFactory
from django.utils import timezone
from opentelemetry import baggage, trace
from opentelemetry import context as otel_context

import agent_platform.telemetry as telemetry
from audit.models import AuditCheckpoint, AuditEvent
from audit.services import audit_event_record
from mcpregistry import gate
from mcpregistry.breaker import _seen_closed
from mcpregistry.models import McpServer
from tests.test_probes import scrape

pytestmark = pytest.mark.django_db(transaction=True)


# --- 1. /readyz and a broker that never answers -----------------------------------------------------------------


@pytest.fixture
def silent_redis() -> Any:
    """A port that accepts connections and never answers (a frozen Redis, a stuck proxy)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(listener.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    yield listener.getsockname()[1]
    listener.close()
    for connection in held:
        connection.close()


@pytest.mark.slow
def test_readyz_answers_promptly_when_the_broker_accepts_but_never_answers(client, silent_redis: int) -> None:
    from agent_platform.celery import app
    from agents.heartbeats import worker_heartbeat_record

    worker_heartbeat_record(worker="w1@host:2")
    saved = app.conf.broker_url, app.conf.broker_transport, app.conf.broker_transport_options
    # As settings.py configured a redis:// broker before: the platform's transport, visibility_timeout only.
    app.conf.broker_url = f"redis://127.0.0.1:{silent_redis}/0"
    app.conf.broker_transport = "agent_platform.redis_broker:Transport"
    app.conf.broker_transport_options = {"visibility_timeout": 3600}
    answer: list[Any] = []
    started = time.monotonic()
    probe = threading.Thread(target=lambda: answer.append(client.get("/readyz")), daemon=True)
    probe.start()
    probe.join(timeout=20)
    took = time.monotonic() - started
    app.conf.broker_url, app.conf.broker_transport, app.conf.broker_transport_options = saved
    assert answer, f"no answer after {took:.0f} s"
    assert answer[0].status_code == 503
    checks = answer[0].json()["checks"]
    assert checks["broker"]["ok"] is False and checks["database"]["ok"] and checks["worker"]["ok"]
    assert took < 10, took


@pytest.mark.slow
def test_a_redis_brokers_sockets_are_bounded_by_the_settings(tmp_path: Path) -> None:
    """kombu's Redis channel takes its socket timeouts from the transport options only; a worker's BRPOP waits
    kombu's brpop_timeout (1 s) on the server, so a command timeout far above it leaves consuming alone."""
    from kombu.transport.redis import Transport

    script = (
        "from django.conf import settings; import json; print(json.dumps(settings.CELERY_BROKER_TRANSPORT_OPTIONS))"
    )
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("CELERY_", "REDIS_URL"))},
        "PLATFORM_VAR_DIR": str(tmp_path),
        "CELERY_BROKER_URL": "redis://127.0.0.1:6379/0",
        "DJANGO_SETTINGS_MODULE": "agent_platform.settings",
    }
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", script],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    options = json.loads(done.stdout.strip().splitlines()[-1])
    assert options["visibility_timeout"] >= 3600
    assert 0 < options["socket_connect_timeout"] <= 10
    assert Transport.brpop_timeout * 5 <= options["socket_timeout"] <= 30


# --- 2. a call the open circuit refused ------------------------------------------------------------------------


def _open_circuit(server: McpServer) -> None:
    _seen_closed.clear()
    McpServer.objects.filter(pk=server.pk).update(
        breaker_state="open", breaker_failures=5, breaker_opened_at=timezone.now(), breaker_cooldown_s=600
    )
    server.refresh_from_db()


def test_a_call_refused_by_an_open_circuit_is_no_latency_observation(client, demo_server: McpServer) -> None:
    _open_circuit(demo_server)
    result = gate.call(
        server=demo_server, tool_name="search_employee", args={"name": "김하늘"}, who=gate.GateCall(source="agent")
    )
    assert result.error == "circuit:open"
    (event,) = AuditEvent.objects.filter(reason="circuit:open")
    assert (event.attempt, event.latency_ms) == (1, None)  # the attempt it would have been, never sent
    m = scrape(client)
    sds, tool = ("mcp_id", demo_server.mcp_id), ("tool", "search_employee")
    assert m.get(("platform_tool_call_duration_seconds_count", (sds, tool)), 0) == 0
    assert m[("platform_tool_calls_total", (sds, ("outcome", "failed"), ("reason", "circuit:open"), tool))] == 1


def test_a_resource_read_refused_by_an_open_circuit_has_no_latency(demo_server: McpServer) -> None:
    McpServer.objects.filter(pk=demo_server.pk).update(resources=[{"uri": "demo://doc"}])
    _open_circuit(demo_server)
    result = gate.read_resource(server=demo_server, uri="demo://doc", who=gate.GateCall(source="admin"))
    assert result.error == "circuit:open"
    (event,) = AuditEvent.objects.filter(reason="circuit:open", action="resource.read")
    assert event.latency_ms is None


# --- 3. archiving never makes the counters go down ---------------------------------------------------------------


def _record_old(monkeypatch: pytest.MonkeyPatch, days_ago: int, **fields: Any) -> None:
    real_now = timezone.now
    with monkeypatch.context() as patch:
        patch.setattr(timezone, "now", lambda: real_now() - timedelta(days=days_ago))
        audit_event_record(**{"source": "agent", "tool": "t", "args": {}, "result": "r", **fields})


def _tool_figures(samples: dict[Any, float]) -> dict[Any, float]:
    return {key: value for key, value in samples.items() if key[0].startswith("platform_tool_call")}


def test_archiving_audit_events_never_makes_the_tool_call_figures_go_down(
    client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    settings.AUDIT_ANCHOR_PATH = tmp_path / "anchors.jsonl"
    settings.AUDIT_ANCHOR_S3_BUCKET = ""
    for latency in (3.0, 3.0, 40.0, 700.0, 7000.0):
        _record_old(monkeypatch, 60, mcp_id="m", ok=True, reason="", attempt=1, latency_ms=latency)
    _record_old(monkeypatch, 60, mcp_id="m", ok=False, reason="args:unknown:regoin", attempt=0)
    _record_old(monkeypatch, 60, mcp_id="m", ok=False, reason="args:unknown:colour", attempt=0)
    _record_old(monkeypatch, 60, mcp_id="m", ok=False, reason="circuit:open", attempt=1)
    _record_old(monkeypatch, 60, source="eval", mcp_id="m", ok=True, reason="", attempt=1, latency_ms=1.0)
    # An admin's trial (the rule tester's "also call"): not live traffic, as in the auditor's figures.
    _record_old(monkeypatch, 60, source="admin", mcp_id="m", ok=False, reason="approval:unavailable", attempt=0)
    _record_old(monkeypatch, 40, mcp_id="n", ok=True, reason="memo:hit", attempt=0, latency_ms=0.0)
    _record_old(monkeypatch, 40, mcp_id="m", ok=False, reason="timeout", attempt=1, latency_ms=12000.0)
    audit_event_record(source="agent", mcp_id="m", tool="t", args={}, result="r", ok=True, attempt=1, latency_ms=8.0)
    before = _tool_figures(scrape(client))
    m, t = ("mcp_id", "m"), ("tool", "t")
    labels = (m, ("outcome", "ok"), ("reason", ""), t)
    assert before[("platform_tool_calls_total", labels)] == 6
    assert before[("platform_tool_calls_total", (m, ("outcome", "failed"), ("reason", "args:unknown"), t))] == 2
    assert before[("platform_tool_call_duration_seconds_count", (m, t))] == 7
    assert not [key for key in before if ("reason", "approval:unavailable") in key[1]]

    call_command("archive_audit", "--older-than-days", "50", "--output", str(tmp_path / "a.jsonl.gz"))
    assert _tool_figures(scrape(client)) == before
    call_command("archive_audit", "--older-than-days", "30", "--output", str(tmp_path / "b.jsonl.gz"))
    assert AuditEvent.objects.exclude(action="audit.archive").count() == 1 and AuditCheckpoint.objects.count() == 2
    assert _tool_figures(scrape(client)) == before  # every sample: counts, buckets and sums

    audit_event_record(source="agent", mcp_id="m", tool="t", args={}, result="r", ok=True, attempt=1, latency_ms=1.0)
    audit_event_record(source="admin", mcp_id="m", tool="t", args={}, result="r", ok=True, attempt=1, latency_ms=1.0)
    after = scrape(client)
    assert after[("platform_tool_calls_total", labels)] == 7
    assert after[("platform_tool_call_duration_seconds_bucket", (("le", "0.005"), m, t))] == 3
    # The saved figures are outside the checkpoint's MAC: the chain and both checkpoints still verify.
    out = io.StringIO()
    call_command("verify_audit", stdout=out)
    assert out.getvalue().strip().splitlines()[-1].startswith("verified 5 events")  # and the archives' own two


def test_a_checkpoint_made_before_the_figures_were_saved_counts_as_none(client) -> None:
    from audit.archive import ToolCallFigures, tool_call_figures_total

    AuditCheckpoint.objects.create(seq=0, hash="0" * 64, file_name="old.jsonl.gz", count=0, mac="", tool_calls=None)
    audit_event_record(source="agent", mcp_id="m", tool="t", args={}, result="r", ok=True, attempt=1, latency_ms=8.0)
    figures = tool_call_figures_total()
    assert figures.calls == {("m", "t", "ok", ""): 1}
    assert ToolCallFigures.from_json(None).calls == {}


def test_figures_saved_with_other_buckets_stay_a_valid_histogram() -> None:
    from audit.archive import TOOL_CALL_BUCKETS_S, ToolCallFigures

    saved = {"buckets_s": [0.01, 1.0], "calls": [["m", "ok", "", 4]], "latency": [["m", 4, 900.0, [1, 3]]]}
    latency = ToolCallFigures.from_json(saved).latency[("m", "(archived)")]
    assert latency.count == 4 and len(latency.le) == len(TOOL_CALL_BUCKETS_S)
    assert latency.le == sorted(latency.le) and max(latency.le) <= latency.count


# --- 4. refusals and reads are spans of their own -------------------------------------------------------------


def _attempt_events(span: Any) -> list[dict[str, Any]]:
    return [dict(e.attributes) for e in span.events if e.name == "gate.attempt"]


@pytest.mark.parametrize(
    ("refuse", "reason"),
    [
        (lambda who: gate.refuse_unknown(tool_name="serch_employee", args={}, who=who, offered=["a"]), "tool:unknown"),
        (
            lambda who: gate.refuse_not_offered(tool_name="t", args={}, who=who, offered=["a"], mcp_id="m"),
            "tool:not_offered",
        ),
        (
            lambda who: gate.refuse_withdrawn(tool_name="t", args={}, who=who, mcp_id="m", corrections=3),
            "tool:withdrawn",
        ),
        (
            lambda who: gate.refuse_call(
                tool_name="read_resource", args={}, who=who, reason="resource:unknown", message="x"
            ),
            "resource:unknown",
        ),
    ],
)
def test_a_tool_call_refused_before_the_gate_is_still_an_execute_tool_span(spans, refuse: Any, reason: str) -> None:
    who = gate.GateCall(source="agent", run_id=None, call_id="c1")
    with telemetry.span("run") as run_span:
        result = refuse(who)
    assert result.error == reason
    finished = {s.name: s for s in spans.get_finished_spans()}
    (name,) = [n for n in finished if n.startswith("execute_tool")]
    call = finished[name]
    assert call.parent.span_id == run_span.get_span_context().span_id
    assert call.attributes["platform.reason_code"] == reason and call.attributes["gen_ai.tool.call.id"] == "c1"
    assert call.status.status_code == trace.StatusCode.ERROR
    assert [e["platform.reason_code"] for e in _attempt_events(call)] == [reason]
    assert _attempt_events(finished["run"]) == []


def test_a_resource_read_and_a_prompt_are_spans_with_their_attempt_events(spans, demo_server: McpServer) -> None:
    who = gate.GateCall(source="agent", call_id="r1")
    with telemetry.span("run"):
        unknown = gate.read_resource(server=demo_server, uri="demo://not-listed", who=who)
        prompt = gate.get_prompt(server=demo_server, name="no-such-prompt", arguments={}, who=who)
    assert (unknown.error, prompt.error) == ("resource:unknown", "prompt:unknown")
    finished = spans.get_finished_spans()
    names = [s.name for s in finished]
    assert "resources/read" in names and "prompts/get" in names, names
    read = next(s for s in finished if s.name == "resources/read")
    assert read.attributes["platform.reason_code"] == "resource:unknown"
    assert "mcp.resource.uri" not in read.attributes  # not listed: the caller's text
    assert [e["platform.reason_code"] for e in _attempt_events(read)] == ["resource:unknown"]
    (run,) = [s for s in finished if s.name == "run"]
    assert _attempt_events(run) == []


# --- 5. request span names -------------------------------------------------------------------------------------


def test_an_unmatched_path_does_not_become_a_span_name(spans, client) -> None:
    for i in range(3):
        client.get(f"/no-such-page/{i}-user@example.com")
    client.generic("PROPFIND", "/no-such-page/x")
    client.get("/healthz")
    finished = spans.get_finished_spans()
    names = sorted({s.name for s in finished})
    assert names == ["GET", "GET /healthz", "HTTP"], names
    paths = {s.attributes["url.path"] for s in finished}
    assert "/no-such-page/0-user@example.com" in paths
    other = next(s for s in finished if s.name == "HTTP")
    assert other.attributes["http.request.method"] == "_OTHER"
    assert other.attributes["http.request.method_original"] == "PROPFIND"


# --- 6. baggage stays out -------------------------------------------------------------------------------------


def _with_baggage() -> object:
    return otel_context.attach(baggage.set_baggage("user.email", "kim@example.com"))


def test_caller_baggage_is_not_forwarded_to_mcp_servers_or_the_broker(spans) -> None:
    token = _with_baggage()
    try:
        with telemetry.span("gate"):
            meta = telemetry.mcp_request_meta()
            headers: dict[str, Any] = {}
            telemetry._before_task_publish(headers=headers)
    finally:
        otel_context.detach(token)  # type: ignore[arg-type]
    assert meta is not None and "traceparent" in meta
    assert set(meta) <= {"traceparent", "tracestate"}, meta
    assert "traceparent" in headers and set(headers) <= {"traceparent", "tracestate"}, headers


def test_a_callers_baggage_header_is_not_read_in(spans) -> None:
    seen: list[dict[str, object]] = []

    def view(request: Any) -> Any:
        from django.http import HttpResponse

        seen.append(dict(baggage.get_all()))
        return HttpResponse("ok")

    request = RequestFactory().get(
        "/x",
        HTTP_TRACEPARENT="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        HTTP_BAGGAGE="user.email=kim%40example.com",
    )
    telemetry.TracingMiddleware(view)(request)
    assert seen == [{}]
    (server,) = spans.get_finished_spans()
    assert format(server.context.trace_id, "032x") == "4bf92f3577b34da6a3ce929d0e0e4736"


# --- 7. gunicorn's own lines ----------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.slow
def test_gunicorn_with_log_format_json_writes_only_json_lines(tmp_path: Path) -> None:
    port = _free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "LOG_FORMAT"))},
        "PLATFORM_VAR_DIR": str(tmp_path / "var"),
        "LOG_FORMAT": "json",
        "HOME": str(tmp_path),  # gunicorn's control socket
        "DJANGO_SETTINGS_MODULE": "agent_platform.settings",
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
    }
    out, err = (tmp_path / "out").open("w+"), (tmp_path / "err").open("w+")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "agent_platform.asgi:application",
            "--config",
            str(Path(settings.BASE_DIR) / "gunicorn.conf.py"),
            "--worker-class",
            "uvicorn.workers.UvicornWorker",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            "1",
        ],
        cwd=settings.BASE_DIR,
        env=env,
        stdout=out,
        stderr=err,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz?token=t0p-s3cret", timeout=5):
                    break
            except (urllib.error.URLError, ConnectionError):
                assert server.poll() is None and time.monotonic() < deadline, err.name
                time.sleep(0.3)
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/no-such-page", timeout=5)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    lines = [
        (name, line) for f, name in ((out, "stdout"), (err, "stderr")) for line in Path(f.name).read_text().splitlines()
    ]
    out.close()
    err.close()
    assert lines
    parsed = []
    for name, line in lines:
        try:
            parsed.append(json.loads(line))
        except ValueError:
            pytest.fail(f"not JSON on {name}: {line!r}")
    loggers = {entry["logger"] for entry in parsed}
    assert {"gunicorn.error", "uvicorn.error", "uvicorn.access"} <= loggers, loggers
    access = [entry["message"] for entry in parsed if entry["logger"] == "uvicorn.access"]
    assert any("/healthz" in m and "200" in m for m in access) and any("/no-such-page" in m for m in access)
    assert not any("t0p-s3cret" in m for m in access)
