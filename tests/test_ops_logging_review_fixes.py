"""Review fixes to logging and tracing settings:

1. Under plain uvicorn (the README's ``uvicorn agent_platform.asgi:application … --workers 2``) the server's own
   lines, its access log with a request's query string among them, were uvicorn's plain text and unmasked, with
   ``LOG_FORMAT=json`` too: they are masked now, and JSON under ``LOG_FORMAT=json``, through the server's own
   handlers (an operator's ``--log-config`` keeps its file and format), while uvicorn's ``--log-level warning``
   (bin/up's) and ``--no-access-log`` still hide the access log.
2. An ``OTEL_TRACES_EXPORTER`` the platform does not ship (``zipkin``, a typo) exported OTLP to the default
   endpoint without a word: traces are now off, with a warning naming the value and the supported ones; the
   spec's comma-separated list (``otlp,console``) exports to each.
3. A misspelt ``LOG_FORMAT`` (``jsonl``) meant plain without a word: it now stops the process, as ``LOG_LEVEL``'s.
"""

from __future__ import annotations

import functools
import io
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from opentelemetry import trace
from opentelemetry.sdk.trace import export

import agent_platform.telemetry as telemetry
from tests.e2e.harness import settings_seen
from tests.test_forwarded_headers_servers import bin_up_uvicorn
from tests.test_ops_defects import _free_port
from tests.test_ops_production import platform_process

API_KEY = "sk-live-abcdefgh12345678XYZ"
ACCESS_TOKEN = "tok_9f8e7d6c5b4a3210"
SECRET_QUERY = f"/healthz?api_key={API_KEY}&access_token={ACCESS_TOKEN}"


# --- 1. uvicorn's own lines -----------------------------------------------------------------------------------


def readme_uvicorn(*extra: str) -> Callable[[int], list[str]]:
    """The README's plain uvicorn command (its --host aside) on ``port``, with ``extra`` options."""

    def command(port: int) -> list[str]:
        return [
            sys.executable,
            "-m",
            "uvicorn",
            "agent_platform.asgi:application",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            *extra,
            "--no-proxy-headers",
        ]

    return command


def server_output(command: Callable[[int], list[str]], tmp_path: Path, **env: str) -> list[str]:
    """Every line (stdout, then stderr) of a real server started with ``command`` that answered
    :data:`SECRET_QUERY` once, then ended with SIGTERM."""
    port = _free_port()
    environment = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "LOG_", "DATABASE_URL"))},
        "PLATFORM_VAR_DIR": str(tmp_path / "var"),
        "HOME": str(tmp_path),
        "DJANGO_SETTINGS_MODULE": "agent_platform.settings",
        **env,
    }
    out_path, err_path = tmp_path / "out", tmp_path / "err"
    with out_path.open("w") as out, err_path.open("w") as err:
        server = subprocess.Popen(command(port), cwd=settings.BASE_DIR, env=environment, stdout=out, stderr=err)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5):
                        break
                except (urllib.error.URLError, ConnectionError):
                    assert server.poll() is None and time.monotonic() < deadline, err_path.read_text()
                    time.sleep(0.3)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{SECRET_QUERY}", timeout=10) as answer:
                assert answer.status == 200
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=30)
    return out_path.read_text().splitlines() + err_path.read_text().splitlines()


def as_json(line: str) -> dict[str, Any] | None:
    try:
        parsed = json.loads(line)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


@pytest.mark.slow
@pytest.mark.parametrize("workers", [["--workers", "2"], []], ids=["readme-workers-2", "one-process"])
def test_uvicorns_access_and_start_lines_are_masked_json_with_log_format_json(
    workers: list[str], tmp_path: Path
) -> None:
    lines = server_output(readme_uvicorn(*workers), tmp_path, LOG_FORMAT="json")

    assert not [line for line in lines if API_KEY in line or ACCESS_TOKEN in line], lines
    (access,) = [line for line in lines if "api_key=" in line]
    entry = as_json(access)
    assert entry is not None, access
    assert entry["logger"] == "uvicorn.access" and entry["level"] == "INFO"
    assert "GET /healthz?api_key=***&access_token=***" in entry["message"]
    started = [line for line in lines if "Started server process" in line]
    assert len(started) == (2 if workers else 1), lines
    assert all((as_json(line) or {}).get("logger") == "uvicorn.error" for line in started), started
    if not workers:
        # One process imports the application, so every line it writes is the platform's. (With --workers, the
        # supervising process, which never imports it, still writes its few lines of pids and signals as uvicorn's
        # plain text.)
        assert all(as_json(line) is not None for line in lines), lines


@pytest.mark.slow
def test_uvicorns_access_line_is_masked_plain_text_without_log_format(tmp_path: Path) -> None:
    lines = server_output(readme_uvicorn(), tmp_path)

    assert not [line for line in lines if API_KEY in line or ACCESS_TOKEN in line], lines
    (access,) = [line for line in lines if "api_key=" in line]
    assert as_json(access) is None
    assert access.startswith("INFO: ") and "GET /healthz?api_key=***&access_token=*** HTTP/1.1" in access  # uvicorn's


@pytest.mark.slow
def test_an_operators_log_config_keeps_its_handlers_and_format_masked(tmp_path: Path) -> None:
    """``uvicorn --log-config``: the operator's file and format stay theirs (the platform only masks them), under
    LOG_FORMAT=json too, as gunicorn.conf.py's formats stay gunicorn's."""
    log_file = tmp_path / "access.log"
    config = {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"custom": {"format": "CUSTOM %(message)s"}},
        "handlers": {"file": {"class": "logging.FileHandler", "filename": str(log_file), "formatter": "custom"}},
        "loggers": {"uvicorn.access": {"handlers": ["file"], "level": "INFO", "propagate": False}},
    }
    config_path = tmp_path / "log.json"
    config_path.write_text(json.dumps(config))

    server_output(readme_uvicorn("--log-config", str(config_path)), tmp_path, LOG_FORMAT="json")

    (access,) = [line for line in log_file.read_text().splitlines() if "api_key=" in line]
    assert access.startswith("CUSTOM ") and "GET /healthz?api_key=***&access_token=*** HTTP/1.1" in access


@pytest.mark.slow
@pytest.mark.parametrize(
    "command", [bin_up_uvicorn, readme_uvicorn("--no-access-log")], ids=["bin-up-log-level-warning", "no-access-log"]
)
def test_an_access_log_the_server_hides_stays_hidden(command: Callable[[int], list[str]], tmp_path: Path) -> None:
    lines = server_output(command, tmp_path, LOG_FORMAT="json")

    assert not [line for line in lines if "/healthz" in line or API_KEY in line], lines


# --- 2. OTEL_TRACES_EXPORTER ----------------------------------------------------------------------------------


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """The tracer providers ``configure_tracing`` installs, caught instead of installed, shut down afterwards."""
    providers: list[Any] = []
    monkeypatch.setattr(telemetry, "_configured", False)
    monkeypatch.setattr(trace, "set_tracer_provider", providers.append)
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)
    yield providers
    for provider in providers:
        provider.shutdown()


@pytest.mark.parametrize("value", ["zipkin", "Jaeger", "otlp_http", "otlp,zipkin", "none,otlp"])
def test_an_unsupported_traces_exporter_leaves_traces_off_saying_so(
    value: str, installed: list[Any], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", value)

    with caplog.at_level(logging.WARNING, logger="agent_platform.telemetry"):
        assert telemetry.configure_tracing() is False

    assert installed == []
    (warning,) = [r for r in caplog.records if r.name == "agent_platform.telemetry"]
    message = warning.getMessage()
    assert "traces are off" in message and repr(value) in message and "otlp or console" in message


def test_the_otlp_http_exporters_registered_name_is_otlp() -> None:
    """``otlp_proto_http`` is the entry point name of the OTLP/HTTP exporter the platform uses: it exported
    before the unknown names were refused, and must still."""
    assert telemetry.traces_exporters({"OTEL_TRACES_EXPORTER": "otlp_proto_http, console"}) == ["otlp", "console"]


def test_none_and_an_empty_list_leave_traces_off_without_a_warning(
    installed: list[Any], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for value in ("none", " None ", " , "):
        monkeypatch.setenv("OTEL_TRACES_EXPORTER", value)
        with caplog.at_level(logging.WARNING, logger="agent_platform.telemetry"):
            assert telemetry.configure_tracing() is False
    assert installed == [] and not caplog.records


class _Collector:
    """An OTLP/HTTP receiver that counts the requests posted to it."""

    def __init__(self) -> None:
        self.posts: list[str] = []
        posts = self.posts

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                posts.append(self.path)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_a_comma_separated_list_exports_to_each_exporter_named(
    installed: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    printed = io.StringIO()  # the console exporter's stdout (its default is bound when the SDK is imported)
    monkeypatch.setattr(export, "ConsoleSpanExporter", functools.partial(export.ConsoleSpanExporter, out=printed))
    collector = _Collector()
    try:
        monkeypatch.setenv("OTEL_TRACES_EXPORTER", " OTLP , console ")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url)
        assert telemetry.configure_tracing() is True

        (provider,) = installed
        provider.get_tracer("review").start_span("exported-twice").end()
        assert provider.force_flush(10_000)
    finally:
        collector.server.shutdown()

    assert collector.posts == ["/v1/traces"]
    assert '"name": "exported-twice"' in printed.getvalue()


# --- 3. LOG_FORMAT --------------------------------------------------------------------------------------------


def test_an_unknown_log_format_is_refused_naming_the_valid_ones(tmp_path: Path) -> None:
    done = platform_process("", tmp_path, LOG_FORMAT="jsonl")

    assert done.returncode != 0
    assert "LOG_FORMAT must be one of json, plain, not 'jsonl'" in done.stderr


@pytest.mark.slow
def test_log_format_is_read_in_any_case_and_empty_means_plain(tmp_path: Path) -> None:
    seen = "[settings.LOG_FORMAT, settings.LOGGING['handlers']['console']['formatter']]"
    assert settings_seen(seen, tmp_path, LOG_FORMAT=" JSON ") == ["json", "json"]
    assert settings_seen(seen, tmp_path, LOG_FORMAT="Plain") == ["plain", "plain"]
    assert settings_seen(seen, tmp_path, LOG_FORMAT="") == ["plain", "plain"]
