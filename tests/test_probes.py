"""``/healthz``, ``/readyz`` and ``/metrics``: the probes answer for the database, the broker and the workers'
heartbeats; the metrics are computed from the database at scrape time and only a scraper with the token, or
from an allowed network, may read them."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from agents.heartbeats import worker_heartbeat_record
from agents.models import Agent, Approval, Run
from agents.tasks import run_agent
from mcpregistry import gate
from mcpregistry.models import McpServer
from tests.postgres import manage, postgres_url  # noqa: F401 - postgres_url is a fixture

pytestmark = pytest.mark.django_db(transaction=True)

# The worker check's words where no worker wrote a heartbeat within PLATFORM_READY_WORKER_MAX_AGE_S (60 s).
NO_HEARTBEAT = (
    "no worker has written a heartbeat within 60 s (a worker cut off from its broker or database stops writing one)"
)


def scrape(client: Client, **extra: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = client.get("/metrics", **extra)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def test_healthz_answers_while_the_process_lives(client) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200 and response.json() == {"status": "ok"}


def test_readyz_wants_a_worker_that_answered_recently(client) -> None:
    response = client.get("/readyz")
    assert response.status_code == 503
    checks = response.json()["checks"]
    assert checks["database"]["ok"] and checks["broker"]["ok"]
    assert checks["worker"] == {
        "ok": False,
        "error": NO_HEARTBEAT,
        "ms": checks["worker"]["ms"],
    }

    worker_heartbeat_record(worker="old@host:1", now=timezone.now() - timedelta(minutes=5))
    stale = client.get("/readyz")
    assert stale.status_code == 503 and "ago" in stale.json()["checks"]["worker"]["error"]

    worker_heartbeat_record(worker="w1@host:2")
    ready = client.get("/readyz")
    assert ready.status_code == 200, ready.json()
    assert ready.json()["status"] == "ok"


def test_readyz_says_which_check_failed_without_quoting_the_broker_url(client, settings) -> None:
    from agent_platform.celery import app

    worker_heartbeat_record(worker="w1@host:2")
    secret_url = "redis://:hunter2-password@127.0.0.1:1/0"
    # A Redis broker as settings.py configures one: its URL, and no embedded transport class.
    saved = app.conf.broker_url, app.conf.broker_transport
    app.conf.broker_url, app.conf.broker_transport = secret_url, None
    try:
        response = client.get("/readyz")
    finally:
        app.conf.broker_url, app.conf.broker_transport = saved
    assert response.status_code == 503
    body = response.content.decode()
    assert response.json()["checks"]["broker"]["ok"] is False
    assert "hunter2" not in body and response.json()["checks"]["database"]["ok"] is True


def test_metrics_are_refused_outside_the_allowed_networks_without_the_token(client, settings) -> None:
    settings.PLATFORM_METRICS_TOKEN = "scrape-token-0123456789"
    outside = {"REMOTE_ADDR": "203.0.113.7"}
    assert client.get("/metrics", **outside).status_code == 403
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong", **outside).status_code == 403
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-token-0123456789", **outside).status_code == 200
    settings.PLATFORM_METRICS_ALLOWED_NETWORKS = ["203.0.113.0/24"]
    assert client.get("/metrics", **outside).status_code == 200
    settings.PLATFORM_METRICS_ALLOWED_NETWORKS = []
    settings.PLATFORM_METRICS_TOKEN = ""
    assert client.get("/metrics").status_code == 403  # loopback too, once no network is allowed


def test_the_metrics_refusal_speaks_the_callers_language(
    client: Client, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The 403's message goes through gettext (Korean for a Korean client); its code stays ``forbidden``."""
    from django.utils.translation import trans_real

    settings.PLATFORM_METRICS_ALLOWED_NETWORKS = []
    settings.PLATFORM_METRICS_TOKEN = ""
    english = client.get("/metrics", HTTP_ACCEPT_LANGUAGE="en").json()
    assert english == {"error": {"code": "forbidden", "message": "Not allowed to read the metrics."}}

    real = trans_real.translation

    class Bracketed:
        def __init__(self, language: str) -> None:
            self.base = real(language)

        def gettext(self, message: str) -> str:
            return f"[{self.base.gettext(message)}]"

        def __getattr__(self, name: str) -> Any:
            return getattr(self.base, name)

    monkeypatch.setattr(trans_real, "translation", Bracketed)
    bracketed = client.get("/metrics", HTTP_ACCEPT_LANGUAGE="en").json()["error"]
    assert bracketed == {"code": "forbidden", "message": "[Not allowed to read the metrics.]"}
    monkeypatch.undo()

    korean = client.get("/metrics", HTTP_ACCEPT_LANGUAGE="ko").json()["error"]
    assert korean == {"code": "forbidden", "message": "메트릭을 읽을 권한이 없습니다."}


def test_forwarded_headers_are_believed_only_from_a_trusted_proxy(client, settings) -> None:
    """Behind a proxy (``PLATFORM_PROXY_HOPS``) a client that reached the web server directly claimed 127.0.0.1 in
    ``X-Forwarded-For`` and read ``/metrics``; it could claim HTTPS in ``X-Forwarded-Proto`` too."""
    from django.test import RequestFactory

    from agent_platform.client_ip import ForwardedHeadersMiddleware, client_ip

    settings.PLATFORM_PROXY_HOPS = 1
    claimed = {"HTTP_X_FORWARDED_FOR": "127.0.0.1", "HTTP_X_FORWARDED_PROTO": "https"}
    assert client.get("/metrics", REMOTE_ADDR="203.0.113.7", **claimed).status_code == 403
    assert client.get("/metrics", REMOTE_ADDR="10.0.0.5", **claimed).status_code == 200  # our proxy says so

    seen = {}

    def view(request):  # type: ignore[no-untyped-def]
        seen.update(ip=client_ip(request.META), secure=request.is_secure())
        return None

    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    ForwardedHeadersMiddleware(view)(RequestFactory().get("/", REMOTE_ADDR="203.0.113.7", **claimed))
    assert seen == {"ip": "203.0.113.7", "secure": False}
    ForwardedHeadersMiddleware(view)(RequestFactory().get("/", REMOTE_ADDR="192.168.1.2", **claimed))
    assert seen == {"ip": "127.0.0.1", "secure": True}
    ForwardedHeadersMiddleware(view)(RequestFactory().get("/", REMOTE_ADDR="", **claimed))  # nginx on a unix socket
    assert seen == {"ip": "127.0.0.1", "secure": True}
    settings.PLATFORM_TRUSTED_PROXIES = ["10.0.0.5/32"]
    ForwardedHeadersMiddleware(view)(RequestFactory().get("/", REMOTE_ADDR="", **claimed))
    assert seen == {"ip": "unknown", "secure": False}


def test_metrics_count_runs_tool_calls_breakers_queue_approvals_and_workers(client, demo_agent: Agent) -> None:
    done = Run.objects.create(agent=demo_agent, query="김하늘 님은 어느 팀 소속인가요?")
    run_agent.apply(args=[str(done.id)])
    Run.objects.create(agent=demo_agent, query="queued one")
    server = McpServer.objects.get(mcp_id="sds-company-data")
    gate.call(server=server, tool_name="search_employee", args={"unexpected": 1}, who=gate.GateCall(source="agent"))
    # An admin's trial is not live traffic (as in the auditor's figures): not counted.
    gate.call(server=server, tool_name="search_employee", args={"unexpected": 2}, who=gate.GateCall(source="admin"))
    McpServer.objects.filter(pk=server.pk).update(breaker_state="open", breaker_failures=3)
    Approval.objects.create(
        run=done,
        mcp_id="sds-company-data",
        tool="x",
        args={},
        call_hash="h",
        expires_at=timezone.now() + timedelta(hours=1),
    )
    worker_heartbeat_record(worker="w1@host:2")

    m = scrape(client)
    agent = ("agent", "company-assistant")
    assert m[("platform_runs", (agent, ("status", "succeeded")))] == 1
    assert m[("platform_runs", (agent, ("status", "queued")))] == 1
    assert m[("platform_run_duration_seconds_count", (agent, ("status", "succeeded")))] == 1
    assert m[("platform_run_duration_seconds_bucket", (agent, ("le", "+Inf"), ("status", "succeeded")))] == 1
    assert m[("platform_run_duration_seconds_sum", (agent, ("status", "succeeded")))] > 0
    sds = ("mcp_id", "sds-company-data")
    tool = ("tool", "search_employee")
    assert m[("platform_tool_calls_total", (sds, ("outcome", "ok"), ("reason", ""), tool))] == 1
    refused = [
        v for (name, labels), v in m.items() if name == "platform_tool_calls_total" and ("outcome", "failed") in labels
    ]
    assert refused == [1]
    assert m[("platform_tool_call_duration_seconds_count", (sds, tool))] == 1
    assert m[("platform_tool_call_duration_seconds_bucket", (("le", "30.0"), sds, tool))] == 1
    assert m[("platform_breaker_state", (sds, ("state", "open")))] == 1
    assert m[("platform_breaker_state", (sds, ("state", "closed")))] == 0
    assert m[("platform_breaker_failures", (sds,))] == 3
    assert m[("platform_queue_depth", ())] == 1
    assert m[("platform_pending_approvals", ())] == 1
    assert m[("platform_audit_chain_lag_seconds", ())] == 0
    assert m[("platform_audit_chain_pending_events", ())] == 0
    assert m[("platform_workers_alive", ())] == 1


PG_SCRAPE = """
from datetime import timedelta
from django.db.models import F
from django.test import Client
from agents.models import Run
from agents.services import agent_create
from audit.services import audit_event_record
agent = agent_create(actor="test", via="tests", data={"slug": "pg-metrics", "name": "pg-metrics"})
run = Run.objects.create(agent=agent, query="q", status="succeeded")
Run.objects.filter(pk=run.pk).update(finished_at=F("created_at") + timedelta(seconds=2))
audit_event_record(source="agent", run_id=run.id, mcp_id="pg-metrics-server", tool="t", args={}, result="r",
                   ok=True, reason="", attempt=1, latency_ms=12.0)
print("--- metrics ---")
print(Client().get("/metrics").content.decode())
"""


@pytest.mark.postgres
def test_metrics_are_computed_the_same_way_on_postgresql(postgres_url: str) -> None:  # noqa: F811 - the fixture
    done = manage("shell", "-c", PG_SCRAPE, database_url=postgres_url)
    assert done.returncode == 0, done.stderr
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(done.stdout.split("--- metrics ---\n", 1)[1])
        for s in family.samples
    }
    agent = ("agent", "pg-metrics")
    assert samples[("platform_runs", (agent, ("status", "succeeded")))] == 1
    assert samples[("platform_run_duration_seconds_bucket", (agent, ("le", "1.0"), ("status", "succeeded")))] == 0
    assert samples[("platform_run_duration_seconds_bucket", (agent, ("le", "2.5"), ("status", "succeeded")))] == 1
    assert samples[("platform_run_duration_seconds_sum", (agent, ("status", "succeeded")))] == pytest.approx(2.0)
    server, tool = ("mcp_id", "pg-metrics-server"), ("tool", "t")
    assert samples[("platform_tool_call_duration_seconds_bucket", (("le", "0.01"), server, tool))] == 0
    assert samples[("platform_tool_call_duration_seconds_bucket", (("le", "0.025"), server, tool))] == 1
    assert samples[("platform_tool_calls_total", (server, ("outcome", "ok"), ("reason", ""), tool))] == 1


def test_the_address_bin_up_prints_leads_to_the_admin_not_a_404() -> None:
    response = Client().get("/")
    assert (response.status_code, response["Location"]) == (302, "/admin/")
    assert Client().get("/admin/").status_code == 302  # then its login page


def test_a_page_that_is_not_there_says_so_in_the_readers_language() -> None:
    response = Client().get("/nowhere/", HTTP_ACCEPT_LANGUAGE="ko")
    assert response.status_code == 404
    page = response.content.decode()
    assert "페이지를 찾을 수 없습니다" in page and 'href="/admin/"' in page


def test_a_page_an_account_may_not_use_says_so_in_its_language(admin_client: Client) -> None:
    response = admin_client.get("/admin/audit/auditevent/add/", HTTP_ACCEPT_LANGUAGE="ko")  # the record is read-only
    assert response.status_code == 403
    assert "허용되지 않음" in response.content.decode()
