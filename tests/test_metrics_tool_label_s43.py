"""``/metrics`` tells a server's tools apart (seed 002 §9: per-tool frequency, latency and error rate): the tool-call
counter and latency histogram carry a ``tool`` label, bounded (names no server lists fold into ``(unknown)``), and
the figures archived events leave behind keep it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from audit.models import AuditCheckpoint
from mcpregistry import gate
from mcpregistry.models import McpServer
from tests.test_probes import scrape

pytestmark = pytest.mark.django_db(transaction=True)

CALLS = "platform_tool_calls_total"
COUNT = "platform_tool_call_duration_seconds_count"


def _agent() -> gate.GateCall:
    return gate.GateCall(source="agent")


def _of(samples: dict[Any, float], name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: value for (sample, labels), value in samples.items() if sample == name}


def test_each_tool_of_a_server_is_counted_and_timed_apart(client, demo_server: McpServer) -> None:
    gate.call(server=demo_server, tool_name="search_employee", args={"name": "김하늘"}, who=_agent())
    gate.call(server=demo_server, tool_name="search_employee", args={"name": "이서준"}, who=_agent())
    gate.call(server=demo_server, tool_name="ping", args={}, who=_agent())
    gate.call(server=demo_server, tool_name="list_team_members", args={"unexpected": 1}, who=_agent())

    m = scrape(client)
    sds = ("mcp_id", demo_server.mcp_id)
    ok = (("outcome", "ok"), ("reason", ""))
    assert m[(CALLS, (sds, *ok, ("tool", "search_employee")))] == 2
    assert m[(CALLS, (sds, *ok, ("tool", "ping")))] == 1
    refused = {labels: v for labels, v in _of(m, CALLS).items() if ("outcome", "failed") in labels}
    assert [dict(labels)["tool"] for labels in refused] == ["list_team_members"]
    assert m[(COUNT, (sds, ("tool", "search_employee")))] == 2
    assert m[(COUNT, (sds, ("tool", "ping")))] == 1
    assert not [labels for labels in _of(m, COUNT) if ("tool", "list_team_members") in labels]  # never sent


def test_names_no_server_lists_fold_into_one_label_value(client, demo_server: McpServer) -> None:
    for made_up in ("search_employe", "delete_everything", "lookup"):
        # Refused by the gate on the bound server, and before it (a name no bound server offers: no server named).
        gate.call(server=demo_server, tool_name=made_up, args={}, who=_agent())
        gate.refuse_unknown(tool_name=made_up, args={}, who=_agent(), offered=["search_employee"])

    tools = {dict(labels).get("tool") for labels in _of(scrape(client), CALLS)}
    assert tools == {"(unknown)"}
    m = scrape(client)
    unknown = (("outcome", "failed"), ("reason", "tool:unknown"), ("tool", "(unknown)"))
    assert m[(CALLS, (("mcp_id", demo_server.mcp_id), *unknown))] == 3
    assert m[(CALLS, (("mcp_id", ""), *unknown))] == 3


def test_archived_figures_keep_the_tool_label_and_never_go_down(
    client, demo_server: McpServer, tmp_path: Path, settings: Any
) -> None:
    settings.AUDIT_ANCHOR_PATH = tmp_path / "anchors.jsonl"
    settings.AUDIT_ANCHOR_S3_BUCKET = ""
    gate.call(server=demo_server, tool_name="search_employee", args={"name": "김하늘"}, who=_agent())
    gate.call(server=demo_server, tool_name="ping", args={}, who=_agent())
    gate.call(server=demo_server, tool_name="made_up", args={}, who=_agent())
    before = {key: v for key, v in scrape(client).items() if key[0].startswith("platform_tool_call")}
    assert before[(COUNT, (("mcp_id", demo_server.mcp_id), ("tool", "ping")))] == 1

    call_command("archive_audit", "--older-than-days", "0", "--output", str(tmp_path / "a.jsonl.gz"))
    assert AuditCheckpoint.objects.count() == 1
    after = {key: v for key, v in scrape(client).items() if key[0].startswith("platform_tool_call")}
    assert after == before


def test_figures_a_checkpoint_saved_without_the_tool_still_count(client, demo_server: McpServer) -> None:
    # Saved before the figures kept the tool: rows of (server, outcome, reason, n) and (server, count, sum, le).
    saved = {
        "buckets_s": [0.01, 1.0],
        "calls": [[demo_server.mcp_id, "ok", "", 4]],
        "latency": [[demo_server.mcp_id, 4, 900.0, [1, 3]]],
    }
    AuditCheckpoint.objects.create(seq=0, hash="0" * 64, file_name="old.jsonl.gz", count=0, mac="", tool_calls=saved)
    gate.call(server=demo_server, tool_name="ping", args={}, who=_agent())

    m = scrape(client)
    sds = ("mcp_id", demo_server.mcp_id)
    ok = (("outcome", "ok"), ("reason", ""))
    assert m[(CALLS, (sds, *ok, ("tool", "(archived)")))] == 4
    assert m[(CALLS, (sds, *ok, ("tool", "ping")))] == 1
    assert m[(COUNT, (sds, ("tool", "(archived)")))] == 4
    assert m[(COUNT, (sds, ("tool", "ping")))] == 1
