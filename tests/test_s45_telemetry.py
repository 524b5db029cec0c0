"""Traces and log lines, as the reviewer found them (session 45):

1. a write call waiting for a person's approval is no error span (``platform.parked``, its status unset);
2. an MCP ``tools/call`` whose ``_meta`` carries a caller's ``traceparent`` joins the caller's trace (the run and
   its task), a malformed one ignored and a header's taking precedence;
3. Django's own lines about a response (``django.request``) carry the request's trace and say its path as written
   (control characters still escaped), and a probe's 503 is no ERROR line of ``django.request``;
4. a deterministic rule's span holds a stable code in ``platform.reason_code``, the sentence in
   ``platform.rule.reason``;
5. a caller's trace continued where this process does not record (traces off) names no trace in the log lines, and
   is still passed on to an MCP server.

Spans are read with the SDK's ``InMemorySpanExporter`` (``spans`` in conftest); the MCP servers are real (stdio)."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

import agent_platform.telemetry as telemetry
from agent_platform.celery import app as celery_app
from agent_platform.telemetry import PlainLogFormatter
from agents.execution import run_execute
from agents.models import Agent, DeterministicRule, Run
from agents.tasks import run_agent
from audit.masking import SecretMaskingFilter
from tests.agents.test_approvals import a_rule_that_saves_the_notes, notes, writer  # noqa: F401 - fixtures
from tests.conftest import ApiCaller

CALLER_TRACE = "dddddddddddddddddddddddddddddddd"
CALLER_SPAN = "1111111111111111"


def by_name(finished: Any) -> dict[str, list[Any]]:
    named: dict[str, list[Any]] = {}
    for span in finished:
        named.setdefault(span.name, []).append(span)
    return named


@pytest.fixture
def json_lines() -> Iterator[tuple[list[dict[str, Any]], list[logging.LogRecord]]]:
    """The lines ``django.request`` and ``tests.s45`` write as ``LOG_FORMAT=json`` writes them (masked, then
    formatted), and their records."""
    lines: list[dict[str, Any]] = []
    records: list[logging.LogRecord] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)
            text = self.format(record)
            assert "\n" not in text
            lines.append(json.loads(text))

    handler = Collect(level=logging.INFO)
    handler.setFormatter(telemetry.JsonLogFormatter())
    handler.addFilter(SecretMaskingFilter())
    loggers = [logging.getLogger("django.request"), logging.getLogger("tests.s45")]
    for log in loggers:
        log.addHandler(handler)
    try:
        yield lines, records
    finally:
        for log in loggers:
            log.removeHandler(handler)


# --- 1. an approval awaited is no error ------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db
def test_a_rules_write_waiting_for_approval_is_a_parked_span_not_an_error(spans, writer) -> None:  # noqa: F811
    run, _client = writer
    a_rule_that_saves_the_notes(run)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert run.status == Run.Status.AWAITING_APPROVAL

    (call,) = by_name(spans.get_finished_spans())["execute_tool append_note"]
    assert call.attributes["platform.reason_code"] == "approval:pending"
    assert call.attributes["platform.parked"] is True
    assert call.status.status_code == trace.StatusCode.UNSET
    assert "error.type" not in call.attributes
    assert [e.attributes["platform.action"] for e in call.events] == ["approval.request"]


# --- 2. an MCP tools/call's _meta -----------------------------------------------------------------------------


@pytest.fixture
def eager_tasks() -> Iterator[None]:
    celery_app.conf.task_always_eager = True
    yield
    celery_app.conf.task_always_eager = False


def mcp_tools_call(caller: ApiCaller, meta: dict[str, Any], **headers: str) -> None:
    client = Client(HTTP_AUTHORIZATION=f"Bearer {caller.raw_key}")
    initialized = client.post(
        "/mcp/",
        json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18"}}),
        content_type="application/json",
    )
    assert initialized.status_code == 200, initialized.content
    body = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {
            "name": "ask_company-assistant",
            "arguments": {"query": "김하늘 님은 어느 팀 소속인가요?"},
            "_meta": meta,
        },
    }
    response = client.post(
        "/mcp/",
        json.dumps(body),
        content_type="application/json",
        headers={"Accept": "application/json", "Mcp-Session-Id": initialized["Mcp-Session-Id"], **headers},
    )
    # The run is made; its answer is not waited for (nor the response closed: that ends the request, and with it
    # the test's database connection).
    assert response.status_code == 200 and response.streaming, response


@pytest.mark.django_db(transaction=True)
def test_a_tools_call_whose_meta_names_a_trace_joins_it_with_its_run_and_task(
    spans, api_caller: ApiCaller, demo_agent: Agent, eager_tasks: None
) -> None:
    mcp_tools_call(api_caller, {"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01", "tracestate": "vendor=1"})

    run = Run.objects.get()
    assert run.traceparent.split("-")[1] == CALLER_TRACE
    named = by_name(spans.get_finished_spans())
    (called,) = named["tools/call"]
    assert format(called.context.trace_id, "032x") == CALLER_TRACE
    assert format(called.parent.span_id, "016x") == CALLER_SPAN
    assert called.kind == trace.SpanKind.SERVER
    assert called.context.trace_state.get("vendor") == "1"
    # The request's own span (no header: a trace of its own) is linked to.
    request_span = next(s for s in named["POST /mcp/"] if s.context.span_id == called.links[0].context.span_id)
    assert request_span.context.trace_id != called.context.trace_id
    assert run.traceparent.split("-")[2] == format(called.context.span_id, "016x")
    # The dispatch continued it: the run's task (eager, in-process) is in the caller's trace.
    (task,) = named["celery.task agents.run_agent"]
    assert task.context.trace_id == called.context.trace_id
    assert task.parent.span_id == called.context.span_id


@pytest.mark.django_db
@pytest.mark.parametrize(
    "traceparent", [f"00-{'z' * 32}-{CALLER_SPAN}-01", f"00-{'0' * 32}-{CALLER_SPAN}-01", f"00-{CALLER_TRACE}-x-01"]
)
def test_a_malformed_meta_traceparent_is_ignored(spans, api_caller: ApiCaller, demo_agent: Agent, traceparent) -> None:
    mcp_tools_call(api_caller, {"traceparent": traceparent})

    named = by_name(spans.get_finished_spans())
    assert "tools/call" not in named
    called = [s for s in named["POST /mcp/"] if s.attributes.get("http.response.status_code") == 200][-1]
    assert Run.objects.get().traceparent.split("-")[1] == format(called.context.trace_id, "032x") != CALLER_TRACE


@pytest.mark.django_db
def test_a_traceparent_header_is_taken_before_the_meta(spans, api_caller: ApiCaller, demo_agent: Agent) -> None:
    header_trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    mcp_tools_call(
        api_caller,
        {"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"},
        traceparent=f"00-{header_trace}-00f067aa0ba902b7-01",
    )
    assert "tools/call" not in by_name(spans.get_finished_spans())
    assert Run.objects.get().traceparent.split("-")[1] == header_trace


# --- 3. Django's own lines -------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_djangos_not_found_line_carries_the_requests_trace_and_its_path_as_written(spans, json_lines) -> None:
    lines, _records = json_lines
    response = Client().get("/api/v1/nonexistent-좌표", HTTP_TRACEPARENT=f"00-{CALLER_TRACE}-{CALLER_SPAN}-01")
    assert response.status_code == 404
    (request_span,) = by_name(spans.get_finished_spans())["GET"]
    (line,) = [line for line in lines if line["logger"] == "django.request"]
    assert line["message"] == "Not Found: /api/v1/nonexistent-좌표"
    assert line["trace_id"] == CALLER_TRACE == format(request_span.context.trace_id, "032x")
    assert line["span_id"] == format(request_span.context.span_id, "016x")


@pytest.mark.django_db
def test_a_path_with_control_characters_stays_escaped(spans, json_lines) -> None:
    lines, _records = json_lines
    assert Client().get("/nowhere-%E2%80%A8-%0A-%1B[31m-한").status_code == 404
    (line,) = [line for line in lines if line["logger"] == "django.request"]
    assert line["message"] == "Not Found: /nowhere-\\u2028-\\n-\\x1b[31m-한"


@pytest.mark.django_db
def test_a_failing_readyz_is_no_error_line_of_django_request(spans, json_lines) -> None:
    _lines, records = json_lines
    assert Client().get("/readyz").status_code == 503  # no worker has a heartbeat here
    assert [r for r in records if r.name == "django.request"] == []
    # Other 5xx are still Django's to log.


# --- 4. a rule's reason code -----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_rules_span_holds_a_stable_reason_code_and_the_sentence_beside_it(spans, demo_agent: Agent) -> None:
    DeterministicRule.objects.create(
        agent=demo_agent,
        name="급여 규칙",
        server=demo_agent.servers.get(),
        tool_name="search_employee",
        when={"all_keywords": ["급여"]},
        params={"name": "김하늘"},
    )
    run = Run.objects.create(agent=demo_agent, query="김하늘 님은 어느 팀 소속인가요?")
    run_agent.apply(args=[str(run.id)])
    run.refresh_from_db()
    assert run.status == "succeeded", run.error_message

    rules = by_name(spans.get_finished_spans())["deterministic_rule"]
    assert all(re.fullmatch(r"rule:[a-z_]+", r.attributes["platform.reason_code"]) for r in rules), [
        dict(r.attributes) for r in rules
    ]
    (salary,) = [r for r in rules if r.attributes["platform.rule"] == "급여 규칙"]
    assert salary.attributes["platform.reason_code"] == "rule:keyword"
    assert salary.attributes["platform.rule.reason"] == "keyword missing: 급여"
    (matched,) = [r for r in rules if r.attributes["platform.rule.matched"]]
    assert (matched.attributes["platform.reason_code"], matched.attributes["platform.rule.reason"]) == (
        "rule:matched",
        "matched",
    )
    # The run's own trace keeps the sentence, as before.
    assert "keyword missing: 급여" in [e.get("reason") for e in run.messages if e.get("type") == "rule"]


# --- 5. traces off: a caller's ids are not ours ----------------------------------------------------------------


def test_a_callers_trace_continued_without_recording_names_no_trace_in_log_lines_but_is_passed_on(
    json_lines,
) -> None:
    lines, _records = json_lines
    caller = SpanContext(
        trace_id=int("e" * 32, 16), span_id=int(CALLER_SPAN, 16), is_remote=True, trace_flags=TraceFlags(1)
    )
    # What TracingMiddleware's span is with traces off (OpenTelemetry's no-op tracer continuing the header).
    with trace.use_span(NonRecordingSpan(caller)):
        logging.getLogger("tests.s45").warning("여기")
        meta = telemetry.mcp_request_meta()
    (line,) = lines
    assert line["message"] == "여기"
    assert "trace_id" not in line and "span_id" not in line
    assert meta is not None and meta["traceparent"] == f"00-{'e' * 32}-{CALLER_SPAN}-01"


@pytest.mark.django_db
def test_the_plain_line_says_a_korean_path_as_written_and_keeps_control_characters_escaped() -> None:
    """``LOG_FORMAT`` unset: Django's line about a response says the path as the JSON line does (Django escapes its
    arguments to ASCII: ``Not Found: /api/v1/\\uc88c\\ud45c`` was what an operator read); a control character stays
    escaped, so a path cannot start a line of its own."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(PlainLogFormatter("%(levelname)s %(name)s %(message)s"))
    logger = logging.getLogger("django.request")
    logger.addHandler(handler)
    try:
        assert Client().get("/api/v1/nonexistent-좌표").status_code == 404
        assert Client().get("/nowhere-%0A-%1B[31m-한").status_code == 404
    finally:
        logger.removeHandler(handler)
    assert stream.getvalue().splitlines() == [
        "WARNING django.request Not Found: /api/v1/nonexistent-좌표",
        "WARNING django.request Not Found: /nowhere-\\n-\\x1b[31m-한",
    ]


def test_the_settings_plain_format_is_the_platforms_formatter() -> None:
    from django.conf import settings

    assert settings.LOGGING["formatters"]["plain"]["()"] == "agent_platform.telemetry.PlainLogFormatter"
