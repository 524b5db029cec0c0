"""A tool's description is bounded as its results are (defect: discovery stored a 344,019-character description
whole, enabled, and every turn sent it to the model whole). It is stored cut to ``TOOL_DESCRIPTION_MAX_CHARS``,
the report names the tool, and the same long description listed again is no change to review."""

from __future__ import annotations

import io
import sys
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command

from agents.config_cache import tools_served
from agents.engine import model_tool_names, tool_specs
from mcpregistry.admin import discovery_message
from mcpregistry.models import McpServer, McpTool
from mcpregistry.pool import get_default_pool
from mcpregistry.services import (
    TOOL_DESCRIPTION_MAX_CHARS,
    DiscoveryReport,
    mcp_server_discover,
    mcp_server_health_check,
)
from tests.mcp_fixtures.fix_description_cap_server import order_description

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

LISTED = order_description()
KEPT = LISTED[: TOOL_DESCRIPTION_MAX_CHARS - 1] + "…"


@pytest.fixture
def long_server(db: Any) -> Any:
    server = McpServer.objects.create(
        mcp_id="long-description",
        name="long-description",
        command=sys.executable,
        args=["-m", "tests.mcp_fixtures.fix_description_cap_server"],
        cwd=str(settings.BASE_DIR),
        public_env=["ORDER_HEAD", "ORDER_TAIL"],  # the fixture's settings, not secrets
        session_scope="shared",
        timeout_s=30,
    )
    yield server
    get_default_pool().close(server.mcp_id)


def discover(server: McpServer, **env: str) -> DiscoveryReport:
    if server.env != env:
        server.env = env
        server.save()
        get_default_pool().close(server.mcp_id)  # the server lists with its new environment
    report = mcp_server_discover(server=server, actor="test", via="tests")
    assert report.ok, report.error
    return report


def test_a_description_longer_than_the_bound_is_stored_cut_and_the_report_names_the_tool(long_server) -> None:
    report = discover(long_server)

    assert len(LISTED) == 344_019
    tool = McpTool.objects.get(server=long_server, name="get_order")
    assert tool.description == KEPT and len(KEPT) == TOOL_DESCRIPTION_MAX_CHARS
    assert tool.enabled and not tool.review_required  # nothing hidden in it: cut, not held back
    assert McpTool.objects.get(server=long_server, name="ping").description == "Answers pong."
    assert report.descriptions_cut == ["get_order (344019 characters)"]
    assert report.warnings() == [
        "descriptions longer than 4000 characters, stored cut to that length: get_order (344019 characters)"
    ]
    assert report.health_problems() == []  # a warning: the server's health stays OK
    long_server.refresh_from_db()
    assert long_server.health == McpServer.Health.OK
    health = mcp_server_health_check(server=long_server)
    assert health.ok and health.error == "" and health.new == []

    # What the model is told of the tool on each turn is the cut text.
    served = list(tools_served([McpServer.objects.prefetch_related("tools__contract").get(pk=long_server.pk)], None))
    names = model_tool_names([t.exposed_name for _server, t in served])
    specs = tool_specs({names[t.exposed_name]: (s, t) for s, t in served})
    assert max(len(spec["function"]["description"]) for spec in specs) == TOOL_DESCRIPTION_MAX_CHARS


def test_the_same_long_description_listed_again_is_no_change_to_review(long_server) -> None:
    discover(long_server)
    again = discover(long_server)
    beyond_the_cut = discover(long_server, ORDER_TAIL="A sentence the registry never keeps.")

    for report in (again, beyond_the_cut):
        assert report.updated == [] and report.review_required == [], report
        assert [entry.split(" ")[0] for entry in report.descriptions_cut] == ["get_order"]
    tool = McpTool.objects.get(server=long_server, name="get_order")
    assert tool.enabled and not tool.review_required and tool.description == KEPT


def test_a_change_within_the_kept_text_is_still_reviewed(long_server) -> None:
    discover(long_server)
    report = discover(long_server, ORDER_HEAD="Refunds an order. ")

    assert report.review_required == ["get_order"]
    tool = McpTool.objects.get(server=long_server, name="get_order")
    assert not tool.enabled and tool.review_required
    assert tool.previous_description == KEPT
    assert tool.description.startswith("Refunds an order. ") and len(tool.description) == TOOL_DESCRIPTION_MAX_CHARS


def test_a_description_stored_whole_before_the_bound_is_not_taken_for_a_change(long_server) -> None:
    discover(long_server)
    McpTool.objects.filter(server=long_server, name="get_order").update(description=LISTED)  # as stored before

    report = discover(long_server)

    assert report.review_required == []
    tool = McpTool.objects.get(server=long_server, name="get_order")
    assert tool.enabled and not tool.review_required and tool.description == KEPT


def test_the_admin_and_mcp_discover_say_which_description_was_cut(long_server) -> None:
    assert discovery_message(discover(long_server)).endswith(
        "descriptions longer than 4000 characters, stored cut to that length: get_order (344019 characters)"
    )
    out = io.StringIO()
    call_command("mcp_discover", long_server.mcp_id, stdout=out)
    assert (
        "long-description: descriptions longer than 4000 characters, stored cut to that length: "
        "get_order (344019 characters)"
    ) in out.getvalue()
