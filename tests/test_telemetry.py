"""Traces: a span per API request, Celery task, run, deterministic rule, model call and gate call, linked into one
trace across the broker, with the GenAI attributes; the trace context reaches the MCP server in the request's
``_meta``; tool payloads stay out of spans unless enabled, and then masked. JSON log lines carry the run id and
the trace id. Spans are read with the SDK's ``InMemorySpanExporter`` (``spans`` in conftest)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from typing import Any

import pytest
from django.conf import settings
from kombu import Connection
from opentelemetry import trace

import agent_platform.telemetry as telemetry
from agents.models import Run
from agents.tasks import run_agent
from mcpregistry import gate
from mcpregistry.models import McpServer
from tests.conftest import DEMO_SECRET, bind_demo_server, discover_as_admin, make_agent

pytestmark = pytest.mark.django_db(transaction=True)

ASKS_FOR_META = [
    {"tool_calls": [{"name": "request_meta", "args": {}, "id": "call_meta"}]},
    {"content": "meta: {last_tool_result}"},
]


@pytest.fixture
def probe_agent(db: Any) -> Any:
    server = McpServer.objects.create(
        mcp_id="probe",
        name="probe",
        command=sys.executable,
        args=["-m", "tests.mcp_fixtures.probe_server"],
        cwd=str(settings.BASE_DIR),
        session_scope="shared",
    )
    assert discover_as_admin(server=server).ok
    return make_agent(slug="prober", servers=[server], provider="scripted", with_demo_rules=False, script=ASKS_FOR_META)


def by_name(finished: Any) -> dict[str, list[Any]]:
    named: dict[str, list[Any]] = {}
    for span in finished:
        named.setdefault(span.name, []).append(span)
    return named


@pytest.mark.slow
def test_a_run_is_one_trace_from_the_publisher_through_the_broker_to_the_worker_and_the_mcp_server(
    spans, probe_agent
) -> None:
    run = Run.objects.create(agent=probe_agent, query="what do you receive?")
    # Published through Celery's own path (the publish signal puts the trace context into the headers), to an
    # in-memory broker; the message is then handed to the task with its headers, as a worker does.
    with Connection("memory://") as broker, telemetry.span("client") as client_span:
        run_agent.apply_async(args=[str(run.id)], connection=broker)
        message = broker.SimpleQueue("celery").get(timeout=5)
    assert "traceparent" in message.headers
    run_agent.apply(args=[str(run.id)], headers=message.headers)

    run.refresh_from_db()
    assert run.status == "succeeded", run.error_message
    named = by_name(spans.get_finished_spans())
    trace_id = client_span.get_span_context().trace_id
    task = named["celery.task agents.run_agent"][0]
    assert task.context.trace_id == trace_id
    assert task.parent is not None and task.parent.span_id == client_span.get_span_context().span_id
    assert task.kind == trace.SpanKind.CONSUMER
    assert task.attributes["platform.run_id"] == str(run.id)

    invoke = named["invoke_agent prober"][0]
    assert invoke.parent.span_id == task.context.span_id
    assert invoke.attributes["gen_ai.agent.name"] == "prober"
    assert invoke.attributes["platform.run.status"] == "succeeded"

    chats = named["chat scripted"]
    assert len(chats) == 2
    assert all(c.parent.span_id == invoke.context.span_id for c in chats)
    assert all(c.attributes["gen_ai.request.model"] == "scripted" for c in chats)
    assert all(c.attributes["gen_ai.usage.input_tokens"] > 0 for c in chats)
    assert [tuple(c.attributes["gen_ai.response.finish_reasons"]) for c in chats] == [("tool_calls",), ("stop",)]

    tool = named["execute_tool request_meta"][0]
    assert tool.context.trace_id == trace_id
    assert tool.attributes["gen_ai.tool.name"] == "request_meta"
    assert tool.attributes["gen_ai.tool.call.id"] == "call_meta"
    assert tool.attributes["platform.run_id"] == str(run.id)
    assert tool.attributes["platform.ok"] is True
    assert [e.name for e in tool.events] == ["gate.attempt"]
    assert tool.events[0].attributes["platform.attempt"] == 1
    # The server received the gate call's span as its parent, in the request's _meta.
    received = json.loads(run.answer.removeprefix("meta: <tool_data>").removesuffix("</tool_data>"))
    _version, meta_trace_id, meta_span_id, _flags = received["traceparent"].split("-")
    assert int(meta_trace_id, 16) == trace_id
    assert int(meta_span_id, 16) == tool.context.span_id


def test_each_deterministic_rule_is_a_span_and_its_gate_call_a_child(spans, demo_agent) -> None:
    run = Run.objects.create(agent=demo_agent, query="김하늘 님은 어느 팀 소속인가요?")
    run_agent.apply(args=[str(run.id)])

    run.refresh_from_db()
    assert run.status == "succeeded", run.error_message
    named = by_name(spans.get_finished_spans())
    rules = named["deterministic_rule"]
    matched = [r for r in rules if r.attributes.get("platform.rule.matched")]
    assert len(matched) == 1 and matched[0].attributes["platform.rule"] == "직원 소속 조회"
    assert {r.attributes["platform.rule.matched"] for r in rules} == {True, False}
    call = named["execute_tool search_employee"][0]
    assert call.parent.span_id == matched[0].context.span_id
    assert call.attributes["platform.source"] == "deterministic"
    # Arguments and results stay out of spans by default.
    assert not any(k.startswith("gen_ai.tool.call.") and k != "gen_ai.tool.call.id" for k in call.attributes)


def test_tool_payloads_become_attributes_only_when_enabled_and_then_masked(spans, demo_server, settings) -> None:
    who = gate.GateCall(source="admin", actor="tester")
    settings.PLATFORM_TRACE_TOOL_PAYLOADS = True
    result = gate.call(server=demo_server, tool_name="search_employee", args={"name": DEMO_SECRET}, who=who)
    assert not result.ok or DEMO_SECRET not in json.dumps(result.value, ensure_ascii=False)
    (call,) = by_name(spans.get_finished_spans())["execute_tool search_employee"]
    assert DEMO_SECRET not in json.dumps(dict(call.attributes), ensure_ascii=False)
    assert "gen_ai.tool.call.arguments" in call.attributes
    assert json.loads(call.attributes["gen_ai.tool.call.arguments"]) == result.args


def test_a_refused_call_is_an_error_span_with_its_reason_code(spans, demo_server) -> None:
    who = gate.GateCall(source="admin", actor="tester")
    result = gate.call(server=demo_server, tool_name="search_employee", args={"unexpected": 1}, who=who)
    assert result.error and result.error.startswith("args:")
    (call,) = by_name(spans.get_finished_spans())["execute_tool search_employee"]
    assert call.status.status_code == trace.StatusCode.ERROR
    assert call.attributes["platform.reason_code"] == result.error
    assert call.events[0].attributes["platform.reason_code"] == result.error


def test_an_api_request_is_a_server_span_that_continues_the_callers_trace(spans, api_client, demo_agent) -> None:
    caller_trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    response = api_client.post(
        "/api/v1/runs",
        {"agent": "company-assistant", "query": "김하늘 님은 어느 팀 소속인가요?"},
        format="json",
        HTTP_TRACEPARENT=f"00-{caller_trace}-00f067aa0ba902b7-01",
    )
    assert response.status_code == 202
    (request_span,) = by_name(spans.get_finished_spans())["POST /api/v1/runs"]
    assert request_span.kind == trace.SpanKind.SERVER
    assert format(request_span.context.trace_id, "032x") == caller_trace
    assert request_span.parent.span_id == 0x00F067AA0BA902B7
    assert request_span.attributes["http.route"] == "/api/v1/runs"
    assert request_span.attributes["http.response.status_code"] == 202


def test_json_log_lines_carry_the_run_id_and_the_trace_id_and_mask_secrets(spans) -> None:
    from audit.masking import SecretMaskingFilter, register_secrets

    register_secrets([DEMO_SECRET])
    records: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(self.format(record))

    handler = Collect()
    handler.setFormatter(telemetry.JsonLogFormatter())
    handler.addFilter(SecretMaskingFilter())
    log = logging.getLogger("tests.json_lines")
    log.addHandler(handler)
    try:
        with telemetry.run_span(run_id="run-1", agent="a", provider="offline", model="") as current:
            log.warning("calling with %s 한글", DEMO_SECRET)
        log.warning("outside")
    finally:
        log.removeHandler(handler)
    inside, outside = (json.loads(line) for line in records)
    assert inside["run_id"] == "run-1"
    assert inside["trace_id"] == format(current.get_span_context().trace_id, "032x")
    assert DEMO_SECRET not in inside["message"] and "한글" in inside["message"]
    assert inside["level"] == "WARNING" and inside["logger"] == "tests.json_lines"
    assert "run_id" not in outside and "trace_id" not in outside


@pytest.mark.slow
def test_log_format_json_switches_the_platforms_log_lines_to_json(tmp_path) -> None:
    env = {"PLATFORM_VAR_DIR": str(tmp_path), "LOG_FORMAT": "json", "DJANGO_SETTINGS_MODULE": "agent_platform.settings"}
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", "import logging; logging.getLogger('ops').warning('준비됨')"],
        cwd=settings.BASE_DIR,
        env={**_inherited_env(), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    line = json.loads(done.stderr.strip().splitlines()[-1])
    assert line["message"] == "준비됨" and line["logger"] == "ops" and line["level"] == "WARNING"


def _inherited_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "LOG_FORMAT"))}


def test_a_loop_left_early_ends_its_item_span_cleanly_and_restores_the_outer_span(spans) -> None:
    def first_even(numbers: list[int]) -> int | None:
        for n in telemetry.spans_per_item(numbers, "item", lambda n: {"n": n}):
            if n % 2 == 0:
                return n
        return None

    with telemetry.span("outer") as outer:
        assert first_even([1, 3, 4, 5]) == 4
        assert trace.get_current_span() is outer
    items = by_name(spans.get_finished_spans())["item"]
    assert [s.attributes["n"] for s in items] == [1, 3, 4]
    assert all(s.status.status_code == trace.StatusCode.UNSET for s in items)
    assert all(s.parent.span_id == outer.get_span_context().span_id for s in items)


def test_tracing_is_opt_in_by_the_standard_variables() -> None:
    assert not telemetry.tracing_requested({})
    assert telemetry.tracing_requested({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert telemetry.tracing_requested({"OTEL_TRACES_EXPORTER": "console"})
    assert not telemetry.tracing_requested({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"})
    assert not telemetry.tracing_requested({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"})


def test_what_a_model_makes_up_reaches_no_span_audit_column_or_metric_label_as_it_was_written(
    spans, demo_server, client
) -> None:
    """An argument or a tool a model invented is the model's text: it may hold a credential it read somewhere, and
    every new name made a new metric series. The reason code names an argument only as a name; a tool's name (where
    the server lacks it) and the reason are masked, in the audit as in the span; the metric counts the kind."""
    from audit.models import AuditEvent
    from tests.test_probes import scrape

    credential = "sk-live-AbCdEf0123456789abcd"
    who = gate.GateCall(source="agent", actor="tester")
    sentence = gate.call(
        server=demo_server, tool_name="search_employee", args={f"what is the salary 0 {credential}": 1}, who=who
    )
    named = gate.call(server=demo_server, tool_name="search_employee", args={"regoin": 1}, who=who)
    invented = gate.call(server=demo_server, tool_name=f"lookup {credential}", args={}, who=who)

    assert (sentence.error, named.error) == ("args:unknown", "args:unknown:regoin")
    assert not invented.ok
    recorded = json.dumps(
        list(AuditEvent.objects.values_list("tool", "reason", "args", "result")), ensure_ascii=False, default=str
    )
    assert credential not in recorded and "lookup ***" in recorded
    exported = json.dumps(
        [(s.name, dict(s.attributes), [dict(e.attributes) for e in s.events]) for s in spans.get_finished_spans()],
        ensure_ascii=False,
    )
    assert credential not in exported and "execute_tool lookup ***" in exported
    labels = {dict(labels).get("reason") for (name, labels) in scrape(client) if name == "platform_tool_calls_total"}
    assert "args:unknown" in labels and not any(label and label.startswith("args:unknown:") for label in labels)


@pytest.mark.slow
def test_a_resource_read_and_a_prompt_carry_the_trace_context_to_the_server(spans) -> None:
    """tools/call sent the caller's traceparent in its _meta; resources/read and prompts/get sent none."""
    import sys

    from django.conf import settings as django_settings

    from agent_platform import telemetry
    from mcpregistry.pool import McpSessionPool

    config = {
        "mcp_id": "meta-probe",
        "transport": "stdio",
        "command": sys.executable,
        "args": ["-m", "tests.mcp_fixtures.probe_server"],
        "cwd": str(django_settings.BASE_DIR),
    }
    pool = McpSessionPool()
    try:
        with telemetry.span("caller") as current:
            trace_id = current.get_span_context().trace_id
            read = pool.read_resource(config, "meta://x", timeout_s=30)
            prompt = pool.get_prompt(config, "request_meta_prompt", {}, timeout_s=30)
    finally:
        pool.shutdown()
    for text in (read.text, prompt.text):
        traceparent = json.loads(text)["traceparent"]
        assert int(traceparent.split("-")[1], 16) == trace_id


@pytest.mark.slow
@pytest.mark.parametrize(
    "failure_mode, reason, attempts", [("bad_schema", "result:shape", 1), ("timeout", "timeout", 3)]
)
def test_a_call_its_fallback_answered_is_the_failed_tools_span_naming_the_backup(
    spans, failure_mode: str, reason: str, attempts: int
) -> None:
    """Searching the traces for a failing tool finds its calls, also those its fallback answered: the span is the
    asked tool's, with its own failure, and names the backup, whose own call is a span inside it."""
    from tests.mcpregistry.test_gate import call, contract

    server = bind_demo_server(mcp_id=f"fallback-{failure_mode}", failure_mode=failure_mode)
    contract(server, "get_asset_status", fallback_policy="call")
    result = call(server, "get_asset_status", {"asset_id": "A-1001"})
    assert (result.ok, result.tool, result.fallback_for) == (True, "get_asset_status_backup", "get_asset_status")

    named = by_name(spans.get_finished_spans())
    (asked,) = named["execute_tool get_asset_status"]
    assert asked.attributes["gen_ai.tool.name"] == "get_asset_status"
    assert asked.attributes["platform.fallback_tool"] == "get_asset_status_backup"
    assert (asked.attributes["platform.ok"], asked.attributes["platform.reason_code"]) == (False, reason)
    assert asked.attributes["platform.attempts"] == attempts
    assert asked.status.status_code == trace.StatusCode.ERROR
    tried = [(e.attributes["platform.action"], e.attributes["platform.reason_code"]) for e in asked.events]
    assert tried == [("tool.call", reason)] * attempts + [("tool.fallback", reason)]
    (backup,) = named["execute_tool get_asset_status_backup"]
    assert backup.parent.span_id == asked.context.span_id
    assert backup.attributes["gen_ai.tool.name"] == "get_asset_status_backup"
    assert (backup.attributes["platform.ok"], backup.attributes["platform.attempts"]) == (True, 1)
    assert "platform.fallback_tool" not in backup.attributes
