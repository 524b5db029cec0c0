"""The demo agent as ``seed_demo`` builds it (the demo server, the local tools, their rules), with a real demo
server process; only the model is scripted where a test says so."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from django.core.management import call_command

from agents.configuration import config_import
from agents.management.commands.seed_demo import LOCAL_RULES, apply_local_contracts, seed_local_tools
from agents.models import Agent, DeterministicRule
from evals.models import EvalSet
from mcpregistry.models import McpServer
from mcpregistry.services import mcp_server_discover
from tests.conftest import bind_demo_server, discover_as_admin, make_agent

SEED_SET = Path(__file__).resolve().parents[2] / "evals" / "fixtures" / "seed_001_tool_questions.json"


def company_assistant(
    *,
    slug: str = "company-assistant",
    failure_mode: str = "none",
    provider: str = "offline",
    script: list[dict[str, Any]] | None = None,
    with_rules: bool = True,
) -> Agent:
    server = bind_demo_server(mcp_id=f"sds-{slug}"[:60], failure_mode=failure_mode)
    local = seed_local_tools()
    if not local.tools.exists():
        assert mcp_server_discover(server=local, actor="test", via="tests").ok
        apply_local_contracts(local)
    agent = make_agent(slug=slug, servers=[server, local], provider=provider, script=script, with_demo_rules=with_rules)
    if with_rules:
        for rule in LOCAL_RULES:
            DeterministicRule.objects.create(agent=agent, server=local, **rule)
    return agent


def import_seed_set(*, agent: str = "company-assistant") -> EvalSet:
    """The shipped set, imported as ``manage.py import_config`` imports it (its default agent: ``agent``)."""
    if agent == "company-assistant":
        call_command("import_config", str(SEED_SET), stdout=io.StringIO())
    else:
        document = json.loads(SEED_SET.read_text(encoding="utf-8"))
        document["eval_sets"][0]["agent"] = agent
        config_import(document=document, actor="test", via="tests")
    return EvalSet.objects.get(name="seed-001-tools")


def run_eval(*args: str) -> tuple[int, str, str]:
    """``manage.py run_eval`` in this process (cases executed inline); returns (exit status, stdout, stderr)."""
    from django.core.management.base import CommandError

    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("run_eval", *args, "--inline", stdout=out, stderr=err)
    except CommandError as exc:
        err.write(str(exc))
        return 1, out.getvalue(), err.getvalue()
    return 0, out.getvalue(), err.getvalue()


LOCAL_MODULE = "tests.local_tool_fixtures"


def bind_stock_server(settings: Any) -> McpServer:
    """The local test tools (``tests.local_tool_fixtures``: ``lookup_stock``, ``sleepy``…) bound as server
    ``stock``, their contracts read; their executions recorded afresh in ``EXECUTED``."""
    from mcpregistry.models import ToolContract
    from tests import local_tool_fixtures

    settings.PLATFORM_LOCAL_TOOL_MODULES = ["mcpregistry.builtin_tools", LOCAL_MODULE]
    local_tool_fixtures.EXECUTED.clear()
    server = McpServer(mcp_id="stock", name="stock", transport=McpServer.Transport.LOCAL, args=[LOCAL_MODULE])
    server.full_clean()
    server.save()
    assert discover_as_admin(server=server).ok
    ToolContract.objects.filter(tool__server=server).exclude(tool__name="send_notice").update(risk="read")
    return server


def scripted_agent(*, slug: str, server: McpServer, script: list[dict[str, Any]]) -> Agent:
    """An agent on ``server`` whose model replays ``script`` (each run from its start), no rules."""
    return make_agent(slug=slug, servers=[server], provider="scripted", script=script, with_demo_rules=False)
