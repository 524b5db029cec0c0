"""A worker's cached configuration follows changes made by another process: a worker runs the demo question
(its servers, tools, contracts and rules are now cached in that process), a command in a separate process changes
the configuration through the services, and the same worker's next run works with the change."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.harness import workers_killed_at_exit
from tests.e2e.workers import Platform, platform_without_workers

pytestmark = [pytest.mark.e2e]

QUESTION = "김하늘 님은 어느 팀 소속인가요?"


def _ask(platform: Platform, status: str = "succeeded") -> dict:
    with platform.client(timeout=120) as client:
        done = client.post("/api/v1/runs?wait=60", json={"agent": "company-assistant", "query": QUESTION})
    body = done.json()
    assert body["status"] == status, done.text
    return body


def _change(platform: Platform, code: str) -> None:
    """A change made by another process (``manage.py shell``), through the services, as an admin's would be."""
    platform.manage("shell", "-c", code)


def test_a_workers_cached_configuration_follows_changes_made_by_another_process(tmp_path: Path) -> None:
    with platform_without_workers(tmp_path, broker_url="filesystem://") as platform, workers_killed_at_exit(platform):
        worker = platform.start_worker("one")
        first = _ask(platform)
        assert [r["tool"] for r in first["deterministic_results"]] == ["search_employee"]
        assert first["deterministic_results"][0]["ok"] is True
        assert _ask(platform)["deterministic_results"][0]["ok"] is True  # served from the worker's cache

        # A contract change: the argument is no longer allowed.
        _change(
            platform,
            "from mcpregistry.models import ToolContract; from mcpregistry.services import tool_contract_update; "
            "c = ToolContract.objects.get(tool__name='search_employee'); "
            "tool_contract_update(contract=c, actor='e2e', via='tests', data={'args': {'name': {'allowed': ['홍길동']}}})",
        )
        refused = _ask(platform, "failed")["deterministic_results"][0]  # the seed's text: the tool failed
        assert refused["ok"] is False and refused["error"] == "args:allowed:name", refused

        # A rule change: the rule that calls search_employee is disabled.
        _change(
            platform,
            "from agents.models import DeterministicRule; from agents.services import deterministic_rule_update; "
            "r = DeterministicRule.objects.get(tool_name='search_employee', agent__slug='company-assistant'); "
            "deterministic_rule_update(rule=r, actor='e2e', via='tests', data={'enabled': False})",
        )
        after = _ask(platform)
        assert "search_employee" not in [r["tool"] for r in after["deterministic_results"]]
        assert len(platform.workers) == 1 and worker.process.poll() is None  # the same worker process all along
