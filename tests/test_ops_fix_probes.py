"""``/readyz`` says why a database or a broker check failed (refused, a host name that does not resolve, wrong
credentials, no answer) in a few fixed words, and logs the errors' text at WARNING, masked, never a password (it
said ``OperationalError`` for all of them and logged nothing). ``/metrics`` matches an IPv4-mapped IPv6 client
(``::ffff:127.0.0.1``, what a dual-stack socket reports) as its IPv4 address, and a malformed
``PLATFORM_METRICS_ALLOWED_NETWORKS`` entry stops the settings, naming it (it was skipped: its scrapers got 403)."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import dj_database_url
import pytest
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.utils import ConnectionHandler
from django.test import Client

from agent_platform import probes
from agents.heartbeats import worker_heartbeat_record
from tests.e2e.harness import _SETUP_VARIABLES, ROOT, free_port, wait_until
from tests.postgres import postgres_url  # noqa: F401 - postgres_url is a fixture

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "hunter2-probe-password"


def closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    return free_port()


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never answers."""
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
    for accepted in held:
        accepted.close()


def accepting(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=1):
        return True


@pytest.fixture
def redis_with_a_password(tmp_path: Any) -> Iterator[int]:
    """A private redis-server that wants a password other than ``PASSWORD``."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed")
    port = free_port()
    options = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(tmp_path)]
    server = subprocess.Popen(
        [binary, "--port", str(port), *options, "--requirepass", "the-right-one-0123456789"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_until(lambda: accepting(port), timeout=20, what="redis-server")
        yield port
    finally:
        server.terminate()
        server.wait(timeout=10)


def readyz_with_broker(client: Client, url: str) -> dict[str, Any]:
    """``/readyz``'s checks with the broker at ``url`` (a Redis broker as settings.py configures one)."""
    from agent_platform.celery import app

    worker_heartbeat_record(worker="w1@host:2")
    saved = app.conf.broker_url, app.conf.broker_transport, app.conf.broker_transport_options
    app.conf.broker_url, app.conf.broker_transport, app.conf.broker_transport_options = url, None, {}
    try:
        response = client.get("/readyz")
    finally:
        app.conf.broker_url, app.conf.broker_transport, app.conf.broker_transport_options = saved
    assert response.status_code == 503
    assert PASSWORD not in response.content.decode()
    return response.json()["checks"]  # type: ignore[no-any-return]


def the_warning(caplog: pytest.LogCaptureFixture, check: str) -> str:
    (record,) = [r for r in caplog.records if r.name == "agent_platform.probes" and f"the {check} check" in r.message]
    assert record.levelno == logging.WARNING
    assert PASSWORD not in record.getMessage()
    return record.getMessage()


# --- the broker -------------------------------------------------------------------------------------------------


def test_readyz_says_the_broker_refused_the_connection(client: Client, caplog: pytest.LogCaptureFixture) -> None:
    checks = readyz_with_broker(client, f"redis://:{PASSWORD}@127.0.0.1:{closed_port()}/0")

    assert checks["broker"]["error"] == "connection refused"
    assert checks["database"]["ok"] and checks["worker"]["ok"]
    assert "Connection refused" in the_warning(caplog, "broker")


def test_readyz_says_the_brokers_host_name_does_not_resolve(client: Client, caplog: pytest.LogCaptureFixture) -> None:
    checks = readyz_with_broker(client, f"redis://:{PASSWORD}@no-such-host.invalid:6379/0")

    assert checks["broker"]["error"] == "host name not resolved"
    assert "no-such-host.invalid" in the_warning(caplog, "broker")


def test_readyz_says_the_broker_did_not_answer_in_time(
    client: Client, caplog: pytest.LogCaptureFixture, silent_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(probes, "BROKER_CHECK_TIMEOUT_S", 0.2)

    checks = readyz_with_broker(client, f"redis://:{PASSWORD}@127.0.0.1:{silent_port}/0")

    assert checks["broker"]["error"] == "timed out"
    the_warning(caplog, "broker")


@pytest.mark.redis
def test_readyz_says_the_broker_refused_the_password(
    client: Client, caplog: pytest.LogCaptureFixture, redis_with_a_password: int
) -> None:
    checks = readyz_with_broker(client, f"redis://:{PASSWORD}@127.0.0.1:{redis_with_a_password}/0")

    assert checks["broker"]["error"] == "authentication failed"
    assert "invalid username-password pair" in the_warning(caplog, "broker")


def test_a_url_an_error_quotes_is_logged_without_its_password() -> None:
    from kombu.exceptions import OperationalError

    message = probes._masked_causes(OperationalError(f"cannot reach redis://:{PASSWORD}@10.0.0.9:6379/0"))

    assert PASSWORD not in message and "redis://:" in message and "@10.0.0.9:6379/0" in message


# --- the database -----------------------------------------------------------------------------------------------


def postgres_at(url: str) -> BaseDatabaseWrapper:
    """A Django connection to the PostgreSQL ``url`` names, as the settings make one (not the test database)."""
    return ConnectionHandler({"default": {**dj_database_url.parse(url), "OPTIONS": {"connect_timeout": 2}}})["default"]


def readyz_with_database(client: Client, monkeypatch: pytest.MonkeyPatch, url: str) -> dict[str, Any]:
    database = postgres_at(url)
    monkeypatch.setattr(probes, "connection", database)
    try:
        response = client.get("/readyz")
    finally:
        database.close()
    assert response.status_code == 503
    assert PASSWORD not in response.content.decode()
    checks: dict[str, Any] = response.json()["checks"]
    assert checks["worker"]["error"] == "the database did not answer"
    return checks


def test_readyz_says_the_database_refused_the_connection(
    client: Client, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    checks = readyz_with_database(client, monkeypatch, f"postgres://platform:{PASSWORD}@127.0.0.1:{closed_port()}/db")

    assert checks["database"]["error"] == "connection refused"
    assert "Connection refused" in the_warning(caplog, "database")


def test_readyz_says_the_databases_host_name_does_not_resolve(
    client: Client, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    checks = readyz_with_database(client, monkeypatch, f"postgres://platform:{PASSWORD}@db.invalid:5432/db")

    assert checks["database"]["error"] == "host name not resolved"
    assert "db.invalid" in the_warning(caplog, "database")


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("user", "database", "reason"),
    [("nobody", "platform", "authentication failed"), ("postgres", "no_such_database", "database does not exist")],
)
def test_readyz_says_the_database_refused_the_credentials_or_lacks_the_database(
    client: Client,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    postgres_url: str,  # noqa: F811 - the fixture
    user: str,
    database: str,
    reason: str,
) -> None:
    server = dj_database_url.parse(postgres_url)
    url = f"postgres://{user}:{PASSWORD}@{server['HOST']}:{server['PORT']}/{database}"

    checks = readyz_with_database(client, monkeypatch, url)

    assert checks["database"]["error"] == reason
    the_warning(caplog, "database")


def test_a_failure_nothing_names_is_given_by_its_kind_only() -> None:
    assert probes.failure_reason(RuntimeError(f"postgres://platform:{PASSWORD}@db:5432/db broke")) == "RuntimeError"


# --- /metrics -----------------------------------------------------------------------------------------------------


def test_an_ipv4_mapped_client_is_matched_as_its_ipv4_address(client: Client, settings: Any) -> None:
    settings.PLATFORM_METRICS_TOKEN = ""

    assert client.get("/metrics", REMOTE_ADDR="::ffff:127.0.0.1").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="::ffff:203.0.113.7").status_code == 403
    settings.PLATFORM_METRICS_ALLOWED_NETWORKS = ["203.0.113.0/24"]
    assert client.get("/metrics", REMOTE_ADDR="::ffff:203.0.113.7").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="::ffff:127.0.0.1").status_code == 403


@pytest.mark.parametrize("network", ["::ffff:10.1.2.3/128", "::ffff:0:0/96", "::/0", "10.1.2.0/24"])
def test_an_ipv4_mapped_client_is_matched_by_an_entry_in_either_form(
    client: Client, settings: Any, network: str
) -> None:
    """A list written for a dual-stack socket names the mapped form (it let such a client in before the IPv4 form was
    matched too): both forms are tried."""
    settings.PLATFORM_METRICS_TOKEN = ""
    settings.PLATFORM_METRICS_ALLOWED_NETWORKS = [network]

    assert client.get("/metrics", REMOTE_ADDR="::ffff:10.1.2.3").status_code == 200
    every_mapped_client = network in {"::ffff:0:0/96", "::/0"}
    assert client.get("/metrics", REMOTE_ADDR="::ffff:192.0.2.1").status_code == (200 if every_mapped_client else 403)


def test_an_entry_in_mapped_form_does_not_let_in_a_plain_ipv6_client(client: Client, settings: Any) -> None:
    settings.PLATFORM_METRICS_TOKEN = ""
    settings.PLATFORM_METRICS_ALLOWED_NETWORKS = ["::ffff:0:0/96"]

    assert client.get("/metrics", REMOTE_ADDR="2001:db8::1").status_code == 403
    assert client.get("/metrics", REMOTE_ADDR="10.1.2.3").status_code == 403


def settings_loaded(**env: str) -> subprocess.CompletedProcess[str]:
    """The settings module loaded in a fresh process with ``env`` set."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(_SETUP_VARIABLES)}
    return subprocess.run(
        [sys.executable, "-c", "import agent_platform.settings"],
        cwd=ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("entry", ["10.0.0.0/33", "192.168.1.0-24"])
def test_a_malformed_metrics_network_stops_the_settings_naming_it(entry: str, tmp_path: Any) -> None:
    done = settings_loaded(PLATFORM_VAR_DIR=str(tmp_path), PLATFORM_METRICS_ALLOWED_NETWORKS=f"127.0.0.1,{entry}")

    assert done.returncode != 0
    assert f"ImproperlyConfigured: PLATFORM_METRICS_ALLOWED_NETWORKS: {entry!r} is not a network" in done.stderr


def test_well_formed_metrics_networks_load(tmp_path: Any) -> None:
    done = settings_loaded(PLATFORM_VAR_DIR=str(tmp_path), PLATFORM_METRICS_ALLOWED_NETWORKS="10.0.0.0/8, ::1, 1.2.3.4")

    assert done.returncode == 0, done.stderr


# --- heartbeats -----------------------------------------------------------------------------------------------------


def test_a_worker_forgetting_its_heartbeat_leaves_the_others(client: Client) -> None:
    from agents.heartbeats import worker_heartbeat_forget
    from agents.models import WorkerHeartbeat

    worker_heartbeat_record(worker="host:1")
    worker_heartbeat_record(worker="host:2")

    worker_heartbeat_forget(worker="host:1")

    assert list(WorkerHeartbeat.objects.values_list("worker", flat=True)) == ["host:2"]
    assert client.get("/readyz").json()["checks"]["worker"]["ok"] is True
