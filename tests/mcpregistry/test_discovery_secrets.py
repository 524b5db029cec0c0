"""A server careless with its binding's secret (it quotes it in a tool's description, writes it to its stderr)
cannot leak it through discovery: what is stored, audited and shown an admin is masked, a schema keeps its
shape (a property called ``api_key`` is no secret), and the server's stderr lines, logged at DEBUG by whatever
process discovers (the admin's, ``mcp_discover``), are masked too."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

import pytest
from django.conf import settings

from audit.models import AuditEvent
from mcpregistry.models import McpServer, McpTool
from mcpregistry.pool import get_default_pool
from mcpregistry.services import mcp_server_discover, mcp_server_health_check

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

TOKEN = "Zr8Kq2Wm5Tn7Xp4Lb9Vd"


@pytest.fixture
def careless(db: Any) -> Any:
    server = McpServer.objects.create(
        mcp_id="careless",
        name="careless",
        command=sys.executable,
        args=["-m", "tests.mcp_fixtures.probe_server"],
        cwd=str(settings.BASE_DIR),
        env={"PROBE_MODE": "tells_secret", "PROBE_TOKEN": TOKEN},
        public_env=["PROBE_MODE"],
        session_scope="shared",
    )
    yield server
    get_default_pool().close("careless")


def test_a_secret_a_server_quotes_in_its_listing_or_its_stderr_is_masked(
    careless: McpServer, masked_caplog: Any
) -> None:
    caplog = masked_caplog  # its handler masks as the platform's do
    with caplog.at_level(logging.DEBUG, logger="mcpregistry.server.careless"):
        report = mcp_server_discover(server=careless, actor="admin", via="admin")
        deadline = time.monotonic() + 5
        while "starting the probe" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.05)

    assert report.ok
    tool = McpTool.objects.get(server=careless, name="connect_backend")
    assert tool.description == "Connects to the backend (credentials in use: ***)."
    assert tool.input_schema["properties"]["api_key"]["type"] == "string"  # the schema's shape is kept
    created = AuditEvent.objects.get(action="config.mcp_tool.create", tool="connect_backend")
    assert TOKEN not in json.dumps([created.args, created.result], ensure_ascii=False)
    assert "credentials in use: ***" in json.dumps(created.args, ensure_ascii=False)
    assert "starting the probe with token ***" in caplog.text
    assert TOKEN not in caplog.text

    assert mcp_server_health_check(server=careless).ok  # a check lists the same tools: no change, nothing new
    assert mcp_server_discover(server=careless, actor="admin", via="admin").updated == []


def test_the_admin_pages_of_a_careless_server_show_no_secret(careless: McpServer, admin_client: Any) -> None:
    assert mcp_server_discover(server=careless, actor="admin", via="admin").ok
    tool = McpTool.objects.get(server=careless, name="connect_backend")
    for url in (
        f"/admin/mcpregistry/mcptool/{tool.pk}/change/",
        f"/admin/mcpregistry/mcpserver/{careless.pk}/change/",
        "/admin/audit/auditevent/",
    ):
        response = admin_client.get(url)
        assert response.status_code == 200, url
        assert TOKEN not in response.content.decode(), url


def test_a_result_remembered_across_runs_is_kept_masked_in_the_cache(careless: McpServer) -> None:
    from django.core.cache import cache

    from mcpregistry import gate
    from mcpregistry.models import ToolContract

    assert mcp_server_discover(server=careless, actor="admin", via="admin").ok
    ToolContract.objects.filter(tool__server=careless, tool__name="echo").update(risk="read", memo=True, memo_ttl_s=60)
    server = McpServer.objects.prefetch_related("tools__contract").get(pk=careless.pk)
    args = {"text": f"the backend said {TOKEN}"}

    first = gate.call(server=server, tool_name="echo", args=args, who=gate.GateCall(source="admin"))
    again = gate.call(server=server, tool_name="echo", args=args, who=gate.GateCall(source="admin"))

    assert first.value == again.value == "the backend said ***"
    assert again.memo_hit
    contract = ToolContract.objects.get(tool__server=careless, tool__name="echo")
    key = gate._shared_memo_key(
        gate.GateCall(source="admin"), server, contract, f"careless\necho\n{gate.canonical_args(args)}"
    )
    assert key is not None  # the server's session is shared: its answers are kept for later runs
    stored = cache.get(gate._cache_key(key))
    assert stored is not None and TOKEN not in stored


def test_a_server_that_dies_quoting_its_secret_as_a_worker_opens_it_at_start_is_logged_masked(
    masked_caplog: Any,
) -> None:
    """A worker opens its shared sessions as it starts (``agent_platform/celery.py``), before any run or discovery
    in that process has registered the server's secrets for log masking: its failure, logged with the server's
    last stderr lines, carried the credential the server quoted as it died."""
    from agent_platform.celery import _open_sessions_now
    from audit.masking import clear_registered_secrets
    from tests.conftest import make_agent

    secret = "UpstreamKey7f3a9c2e41d8"
    server = McpServer.objects.create(
        mcp_id="dies-at-start",
        name="dies-at-start",
        command=sys.executable,
        args=["-m", "tests.mcp_fixtures.probe_server"],
        cwd=str(settings.BASE_DIR),
        env={"PROBE_MODE": "refuses_token", "PROBE_TOKEN": secret},
        public_env=["PROBE_MODE"],
        session_scope="shared",
        timeout_s=5,
    )
    make_agent(slug="dies-at-start", servers=[server], with_demo_rules=False)
    clear_registered_secrets()  # a worker process that just started
    with masked_caplog.at_level(logging.DEBUG):
        _open_sessions_now()
    assert "dies-at-start: could not open a session at start" in masked_caplog.text
    assert "Invalid API key *** (401 from upstream)" in masked_caplog.text
    assert secret not in masked_caplog.text
