"""The operations review: a local tool runs in its caller's context (its log lines and spans are the run's); the
chain-lag gauges read the lag as it stood before the scrape chained anything; a JSON log line keeps its stack."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import pytest

import agent_platform.telemetry as telemetry
import audit.services as audit_services
from agent_platform.telemetry import current_run_id
from audit.services import audit_event_record, chain_lag
from mcpregistry.local_tools import LocalToolRunner

MODULE = "tests.local_tool_context_fixtures"


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(telemetry.JsonLogFormatter())
        self.lines: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(self.format(record)))


def test_a_local_tool_runs_in_its_callers_run_and_span(settings: Any, spans: Any) -> None:
    settings.PLATFORM_LOCAL_TOOL_MODULES = ["mcpregistry.builtin_tools", MODULE]
    runner, lines = LocalToolRunner(), Lines()
    logging.getLogger("tests.local_tool_context").addHandler(lines)
    token = current_run_id.set("run-7")
    try:
        with telemetry.span("caller"):
            outcome = runner.call_tool({"args": [MODULE]}, "which_run", {"note": "A-1"}, timeout_s=10)
    finally:
        current_run_id.reset(token)
        logging.getLogger("tests.local_tool_context").removeHandler(lines)
        runner._executor.shutdown(wait=False)
    assert outcome.structured == {"run_id": "run-7", "span_valid": True}, outcome
    [line] = lines.lines
    assert line["run_id"] == "run-7" and "trace_id" in line and line["message"] == "working on A-1"


@pytest.mark.django_db(transaction=True)
def test_the_chain_lag_gauges_read_the_lag_before_the_scrape_chains_it(
    client: Any, settings: Any, monkeypatch: Any
) -> None:
    settings.AUDIT_CHAIN_MODE = "deferred"
    monkeypatch.setattr(audit_services, "_chain_after_commit", lambda using: None)  # no chainer runs
    for number in range(3):
        audit_event_record(source="agent", mcp_id="demo", tool="t", call_id=f"c{number}")
    time.sleep(0.05)
    assert chain_lag().count == 3

    text = client.get("/metrics").content.decode()

    assert "platform_audit_chain_pending_events 3.0" in text.splitlines()
    lag = next(line for line in text.splitlines() if line.startswith("platform_audit_chain_lag_seconds "))
    assert float(lag.split()[1]) > 0
    assert chain_lag().count == 0  # the scrape still chained them, so that the tool-call counters count them


def test_a_json_log_line_keeps_its_stack() -> None:
    lines = Lines()
    logger = logging.getLogger("tests.stack_info")
    logger.addHandler(lines)
    try:
        logger.warning("where am I", stack_info=True)
    finally:
        logger.removeHandler(lines)
    [line] = lines.lines
    assert line["stack"].startswith("Stack (most recent call last)")
