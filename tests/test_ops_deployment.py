"""Deployment defects a review found (s29), one section each:

1. ``docker-compose.yml`` declared a TLS proxy but counted no proxy hop: every client had the docker gateway's
   address, so one client's unknown API keys throttled every API client (and its wrong passwords locked the admin
   login for all); ``check --deploy`` said nothing (now ``audit.W004``).
2. ``/metrics`` took every request a proxy on the same machine forwarded for a loopback scraper.
3. An ``AUDIT_CHAIN_KEY`` too short or a ``SECRETS_ENCRYPTION_KEYS`` value that is no Fernet key passed
   ``check --deploy`` and ``/readyz`` and failed at every audited write (now ``audit.E001`` / ``audit.E003`` and
   ``/readyz``'s ``keys`` check).
4. ``LOG_LEVEL=info`` or an empty ``LOG_LEVEL`` stopped every process at start.
5. ``/healthz`` and ``/readyz`` answered a probe naming a host not in ``ALLOWED_HOSTS`` (a kubelet's pod IP) with
   an HTML 400 and an ERROR traceback.
6. Drift: a dead setting; ``service.name`` overriding ``OTEL_RESOURCE_ATTRIBUTES``; an OTLP protocol other than
   ``http/protobuf`` silently ignored; compose passing no metrics token, trusted proxies, Redis or ``OTEL_*``.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography.fernet import Fernet
from django.core.checks import Tags, run_checks
from django.test import Client
from opentelemetry import trace

import agent_platform.telemetry as telemetry
from agents.heartbeats import worker_heartbeat_record
from audit import checks as audit_checks
from tests.e2e.harness import settings_seen
from tests.test_deploy_check import check_deploy, compose_environment
from tests.test_ops_production import platform_process

ROOT = Path(__file__).resolve().parents[1]
# Where the TLS proxy in front of compose's web reaches it from: the published port on 127.0.0.1 arrives from the
# docker network's gateway.
DOCKER_GATEWAY = "172.18.0.1"


def compose_x_app_env() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))
    return dict(document["x-app-env"])


# --- 1. compose counts its TLS proxy --------------------------------------------------------------------------------


@pytest.mark.django_db
def test_behind_compose_s_proxy_one_clients_unknown_keys_do_not_throttle_another_client(
    settings: Any, api_caller: Any
) -> None:
    compose = compose_environment("web")
    settings.PLATFORM_TLS = compose["PLATFORM_TLS"]
    settings.PLATFORM_PROXY_HOPS = int(compose.get("PLATFORM_PROXY_HOPS", "0"))
    through_the_proxy = Client(REMOTE_ADDR=DOCKER_GATEWAY, HTTP_X_FORWARDED_PROTO="https")
    for n in range(25):
        through_the_proxy.get(
            "/api/v1/usage", HTTP_AUTHORIZATION=f"Bearer apk_bogus{n}", HTTP_X_FORWARDED_FOR="198.51.100.7"
        )

    victim = through_the_proxy.get(
        "/api/v1/usage", HTTP_AUTHORIZATION=f"Bearer {api_caller.raw_key}", HTTP_X_FORWARDED_FOR="203.0.113.20"
    )

    assert victim.status_code == 200, victim.content
    assert compose_x_app_env()["PLATFORM_PROXY_HOPS"] == "${PLATFORM_PROXY_HOPS:-1}"


def test_the_deploy_check_warns_of_a_tls_proxy_with_no_proxy_hops(settings: Any) -> None:
    settings.PLATFORM_TLS, settings.PLATFORM_PROXY_HOPS = "proxy", 0
    [warning] = audit_checks.check_proxy_hops()
    assert warning.id == "audit.W004" and "PLATFORM_PROXY_HOPS" in warning.msg

    settings.PLATFORM_PROXY_HOPS = 1
    assert audit_checks.check_proxy_hops() == []
    settings.PLATFORM_TLS, settings.PLATFORM_PROXY_HOPS = "django", 0  # no proxy said to be in front
    assert audit_checks.check_proxy_hops() == []


@pytest.mark.slow
def test_check_deploy_fails_where_compose_s_proxy_hop_is_taken_away(tmp_path: Path) -> None:
    done = check_deploy({**compose_environment("web"), "PLATFORM_PROXY_HOPS": "0"}, tmp_path)
    assert done.returncode != 0
    assert "audit.W004" in done.stdout + done.stderr


# --- 2. /metrics through a proxy on this machine ------------------------------------------------------------------


@pytest.mark.django_db
def test_metrics_refuse_a_client_a_proxy_on_this_machine_forwarded(settings: Any) -> None:
    settings.PLATFORM_TLS = "proxy"
    settings.PLATFORM_METRICS_TOKEN = "scrape-token-0123456789"
    via_local_proxy = Client(REMOTE_ADDR="127.0.0.1")
    forwarded: dict[str, Any] = {"HTTP_X_FORWARDED_FOR": "203.0.113.9", "HTTP_X_FORWARDED_PROTO": "https"}

    settings.PLATFORM_PROXY_HOPS = 0  # who the client is goes unread: the proxy's loopback is no scraper's
    assert via_local_proxy.get("/metrics", **forwarded).status_code == 403
    assert via_local_proxy.get("/metrics", HTTP_X_FORWARDED_PROTO="https").status_code == 403
    settings.PLATFORM_PROXY_HOPS = 1  # the client's own address, outside the allowed networks
    assert via_local_proxy.get("/metrics", **forwarded).status_code == 403
    assert via_local_proxy.get("/metrics", HTTP_X_FORWARDED_PROTO="https").status_code == 403  # no address given
    # An entry that is no address (a proxy writing "unknown"): the client stands for the proxy's loopback no more.
    assert via_local_proxy.get("/metrics", HTTP_X_FORWARDED_FOR="unknown").status_code == 403
    assert via_local_proxy.get("/metrics", HTTP_X_FORWARDED_FOR="127.0.0.1:5544").status_code == 200  # its host

    assert via_local_proxy.get("/metrics", HTTP_X_FORWARDED_FOR="127.0.0.1").status_code == 200  # a local scraper
    assert via_local_proxy.get("/metrics").status_code == 200  # straight to the web server, no proxy
    token: dict[str, Any] = {"HTTP_AUTHORIZATION": "Bearer scrape-token-0123456789"}
    assert via_local_proxy.get("/metrics", **forwarded, **token).status_code == 200
    settings.PLATFORM_PROXY_HOPS = 0
    assert via_local_proxy.get("/metrics", **forwarded, **token).status_code == 200


# --- 3. keys that are set but cannot be used ------------------------------------------------------------------------


def test_an_audit_chain_key_too_short_is_a_check_error_that_names_no_key(settings: Any) -> None:
    short = "short-chain-key-0123"
    settings.AUDIT_CHAIN_KEY = [secrets.token_urlsafe(32), short]

    [error] = audit_checks.check_audit_chain_key_usable()

    assert error.id == "audit.E001" and error.level >= 40
    assert "key 2 of 2" in error.msg and short not in error.msg + str(error.hint)
    assert "audit.E001" in {message.id for message in run_checks(tags=[Tags.security])}  # not --deploy only
    settings.AUDIT_CHAIN_KEY = [secrets.token_urlsafe(32)]
    assert audit_checks.check_audit_chain_key_usable() == []
    settings.AUDIT_CHAIN_KEY = []  # the local key: audit.W001's business
    assert audit_checks.check_audit_chain_key_usable() == []


def test_a_secrets_encryption_key_that_is_no_fernet_key_is_a_check_error_that_names_no_key(settings: Any) -> None:
    settings.SECRETS_ENCRYPTION_KEYS = f"{Fernet.generate_key().decode()}, not-a-fernet-key-secret"

    [error] = audit_checks.check_secrets_encryption_keys_usable()

    assert error.id == "audit.E003" and error.level >= 40
    assert "key 2 of 2" in error.msg and "not-a-fernet-key-secret" not in error.msg + str(error.hint)
    assert "audit.E003" in {message.id for message in run_checks(tags=[Tags.security])}
    settings.SECRETS_ENCRYPTION_KEYS = Fernet.generate_key().decode()
    assert audit_checks.check_secrets_encryption_keys_usable() == []


@pytest.mark.django_db
def test_readyz_is_not_ready_while_a_key_cannot_be_used_and_quotes_none(client: Client, settings: Any) -> None:
    worker_heartbeat_record(worker="w1@host:2")
    assert client.get("/readyz").json()["checks"]["keys"]["ok"] is True

    settings.AUDIT_CHAIN_KEY = ["short-chain-key-0123"]
    settings.SECRETS_ENCRYPTION_KEYS = "not-a-fernet-key-secret"
    response = client.get("/readyz")

    assert response.status_code == 503
    checks = response.json()["checks"]
    assert checks["database"]["ok"] and checks["worker"]["ok"]
    assert checks["keys"]["ok"] is False
    assert "AUDIT_CHAIN_KEY" in checks["keys"]["error"] and "SECRETS_ENCRYPTION_KEYS" in checks["keys"]["error"]
    body = response.content.decode()
    assert "short-chain-key-0123" not in body and "not-a-fernet-key-secret" not in body


# --- 4. LOG_LEVEL -------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_log_level_is_read_in_any_case_and_empty_means_info(tmp_path: Path) -> None:
    seen = "[settings.LOG_LEVEL, settings.LOGGING['root']['level']]"
    assert settings_seen(seen, tmp_path, LOG_LEVEL="info") == ["INFO", "INFO"]
    assert settings_seen(seen, tmp_path, LOG_LEVEL=" warning ") == ["WARNING", "WARNING"]
    assert settings_seen(seen, tmp_path, LOG_LEVEL="") == ["INFO", "INFO"]


def test_an_unknown_log_level_is_refused_naming_the_valid_ones(tmp_path: Path) -> None:
    done = platform_process("", tmp_path, LOG_LEVEL="verbose")

    assert done.returncode != 0
    assert "LOG_LEVEL must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL, not 'VERBOSE'" in done.stderr


# --- 5. probes whatever the Host ----------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_probes_answer_a_kubelet_that_names_the_pods_ip(client: Client, caplog: pytest.LogCaptureFixture) -> None:
    pod: dict[str, Any] = {"HTTP_HOST": "10.1.2.3:8000"}
    with caplog.at_level(logging.WARNING, logger="django.security"):
        healthz = client.get("/healthz", **pod)
        readyz = client.get("/readyz", **pod)
        head = client.head("/healthz", **pod)

    assert (healthz.status_code, healthz.json()) == (200, {"status": "ok"})
    assert readyz.status_code == 503 and readyz.json()["checks"]["database"]["ok"] is True  # no worker here
    assert head.status_code == 200
    assert not [r for r in caplog.records if r.name.startswith("django.security")]


@pytest.mark.django_db(transaction=True)
def test_only_the_two_probes_skip_the_host_check(client: Client) -> None:
    pod: dict[str, Any] = {"HTTP_HOST": "10.1.2.3:8000"}
    assert client.get("/metrics", **pod).status_code == 400
    assert client.get("/healthz/", **pod).status_code == 400
    assert client.post("/healthz", **pod).status_code == 400
    assert client.get("/admin/", **pod).status_code == 400
    assert client.post("/healthz").status_code == 405  # an allowed host: the view's own answer


# --- 6. drift -----------------------------------------------------------------------------------------------------


def test_the_dead_mcp_call_timeout_setting_is_gone(settings: Any) -> None:
    assert not hasattr(settings, "PLATFORM_MCP_CALL_TIMEOUT_S")


@pytest.fixture
def installed_provider(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """The tracer providers ``configure_tracing`` installs, caught instead of installed (a process keeps its first),
    and shut down after the test."""
    installed: list[Any] = []
    monkeypatch.setattr(telemetry, "_configured", False)
    monkeypatch.setattr(trace, "set_tracer_provider", installed.append)
    for name in ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES", "OTEL_SDK_DISABLED", "OTEL_EXPORTER_OTLP_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    for name in ("OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    yield installed
    for provider in installed:
        provider.shutdown()


def service_name(installed: list[Any]) -> str:
    assert telemetry.configure_tracing() is True
    return str(installed[-1].resource.attributes["service.name"])


def test_the_service_is_named_by_otel_resource_attributes_or_otel_service_name_else_by_default(
    installed_provider: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=billing-web,deployment.environment=prod")
    assert service_name(installed_provider) == "billing-web"

    monkeypatch.setattr(telemetry, "_configured", False)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "billing-worker")
    assert service_name(installed_provider) == "billing-worker"

    monkeypatch.setattr(telemetry, "_configured", False)
    monkeypatch.delenv("OTEL_SERVICE_NAME")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=prod")
    assert service_name(installed_provider) == "agent-platform"


@pytest.mark.parametrize("variable", ["OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"])
def test_an_otlp_protocol_the_exporter_does_not_speak_leaves_traces_off_saying_so(
    variable: str, installed_provider: list[Any], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")
    monkeypatch.setenv(variable, "grpc")

    with caplog.at_level(logging.WARNING, logger="agent_platform.telemetry"):
        assert telemetry.configure_tracing() is False

    assert installed_provider == []
    assert "traces are off" in caplog.text and "'grpc'" in caplog.text and "http/protobuf" in caplog.text
    monkeypatch.setenv(variable, "HTTP/protobuf")
    assert telemetry.configure_tracing() is True


@pytest.mark.slow
def test_compose_passes_the_metrics_token_proxies_redis_and_otel_variables_keeping_the_defaults(
    tmp_path: Path,
) -> None:
    environment = compose_x_app_env()
    for name in ("PLATFORM_METRICS_TOKEN", "PLATFORM_TRUSTED_PROXIES", "OTEL_EXPORTER_OTLP_ENDPOINT"):
        assert environment[name] == f"${{{name}:-}}"
    for name in ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES", "OTEL_TRACES_EXPORTER"):
        assert environment[name] == f"${{{name}:-}}"
    assert environment["REDIS_URL"] == "${REDIS_URL:-redis://redis:6379/1}"
    assert environment["CELERY_BROKER_URL"] == "${CELERY_BROKER_URL:-redis://redis:6379/0}"

    # What compose passes where the shell sets none of them: the settings' own defaults.
    resolved = compose_environment("web")
    assert resolved["PLATFORM_TRUSTED_PROXIES"] == "" and resolved["REDIS_URL"] == "redis://redis:6379/1"
    seen = settings_seen(
        "[settings.PLATFORM_TRUSTED_PROXIES, settings.PLATFORM_METRICS_TOKEN]",
        tmp_path,
        PLATFORM_TRUSTED_PROXIES="",
        PLATFORM_METRICS_TOKEN="",
    )
    assert seen == [
        ["127.0.0.0/8", "::1/128", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7", "unix"],
        "",
    ]
