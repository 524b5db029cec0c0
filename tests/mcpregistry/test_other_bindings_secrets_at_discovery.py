"""Discovery and health checks mask what a run masks: a server's own secrets, and the other bindings' that look
like credentials. Masked with the server's own alone, a listing repeating a shared configuration's token of another
system (``crm``'s) was stored in the tool's description, schema and first contract, recorded in the append-only
audit, exported, shown on the admin's pages and offered to the model; a startup error quoting it was the server's
``last_error``. The server is real (``tests/mcp_fixtures/shared_config_server.py``)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator

import pytest
from django.conf import settings

from audit.models import AuditEvent
from mcpregistry.models import McpServer, McpTool, ToolContract
from mcpregistry.pool import get_default_pool
from mcpregistry.services import mcp_server_discover, mcp_server_health_check

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

TOKEN = "crmTok-Zq81Lw93Xp27Mv"


@pytest.fixture
def crm() -> McpServer:
    return McpServer.objects.create(mcp_id="crm", name="crm", command=sys.executable, env={"CRM_TOKEN": TOKEN})


def sharing(mcp_id: str, **env: str) -> McpServer:
    return McpServer.objects.create(
        mcp_id=mcp_id,
        name=mcp_id,
        command=sys.executable,
        args=["-m", "tests.mcp_fixtures.shared_config_server"],
        cwd=str(settings.BASE_DIR),
        env={"SHARED_TOKEN": TOKEN, **env},
        public_env=["SHARED_TOKEN", *env],  # the fixture reads the token as a setting: not this binding's secret
        session_scope="shared",
    )


@pytest.fixture
def lister(crm: McpServer) -> Iterator[McpServer]:
    server = sharing("lister")
    yield server
    get_default_pool().close("lister")


def test_another_bindings_token_in_a_listing_is_masked_everywhere_discovery_writes(lister: McpServer) -> None:
    report = mcp_server_discover(server=lister, actor="admin", via="tests")

    assert report.ok, report.error
    tool = McpTool.objects.get(server=lister, name="lookup")
    contract = ToolContract.objects.get(tool=tool)
    stored = json.dumps(
        [tool.description, tool.input_schema, contract.args],
        ensure_ascii=False,
    )
    assert TOKEN not in stored and "***" in stored
    assert not [e.pk for e in AuditEvent.objects.all() if TOKEN in json.dumps([e.args, e.result], ensure_ascii=False)]
    assert report.secrets_masked  # as for the server's own secret: the tool waits for a review


def test_a_startup_error_quoting_another_bindings_token_is_recorded_masked(crm: McpServer) -> None:
    failing = sharing("failing", SHARED_CONFIG_FAIL="1")
    try:
        discovered = mcp_server_discover(server=failing, actor="admin", via="tests")
        checked = mcp_server_health_check(server=failing)
    finally:
        get_default_pool().close("failing")

    assert not discovered.ok and not checked.ok
    assert TOKEN not in discovered.error and TOKEN not in checked.error
    assert TOKEN not in McpServer.objects.get(pk=failing.pk).last_error


def test_an_agents_model_key_in_a_listing_is_masked_as_a_run_masks_it() -> None:
    """Runs mask the agents' model keys too (``every_binding_secret``); discovery masked the bindings' alone, and a
    listing repeating a gateway key an agent holds stored it in clear."""
    from agents.models import Agent

    Agent.objects.create(slug="gateway-user", name="게이트웨이", model_secrets={"api_key": TOKEN})
    server = sharing("agent-key")
    try:
        assert mcp_server_discover(server=server, actor="admin", via="tests").ok
    finally:
        get_default_pool().close("agent-key")
    tool = McpTool.objects.get(server=server, name="lookup")
    assert TOKEN not in json.dumps([tool.description, tool.input_schema], ensure_ascii=False)
