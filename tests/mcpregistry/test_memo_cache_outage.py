"""The gate's cross-run memo is a cache, never a dependency: a Redis cache that refuses connections or never
answers makes the memo miss (the tool is called, its answer kept for the run) instead of failing the call."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from agents.execution import run_execute
from agents.models import Agent, Run
from agents.services import run_create
from audit.models import AuditEvent
from mcpregistry.models import ToolContract

QUESTION = "A-1001 자산의 현재 상태를 알려주세요."


def cache_at(location: str) -> dict[str, dict[str, object]]:
    """The cache ``settings.py`` configures for ``REDIS_URL=location`` and ``REDIS_CACHE_TIMEOUT_S=0.2``."""
    environment = {**os.environ, "REDIS_URL": location, "REDIS_CACHE_TIMEOUT_S": "0.2"}
    loaded = subprocess.run(
        [sys.executable, "-c", "import json; from agent_platform import settings; print(json.dumps(settings.CACHES))"],
        env=environment,
        capture_output=True,
        text=True,
        check=True,
    )
    caches = json.loads(loaded.stdout)
    assert caches["default"]["OPTIONS"] == {"socket_connect_timeout": 0.2, "socket_timeout": 0.2}
    return caches


@pytest.fixture
def silent_redis() -> Iterator[str]:
    """A port that accepts connections and never answers (a frozen Redis, a black-holed proxy)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    yield f"redis://127.0.0.1:{listener.getsockname()[1]}/0"
    listener.close()


def memoized_run(demo_agent: Agent) -> Run:
    ToolContract.objects.filter(tool__name="get_asset_status").update(
        memo=True, memo_ttl_s=600, risk=ToolContract.Risk.READ
    )
    run = run_create(agent_slug=demo_agent.slug, query=QUESTION, api_key=None)
    run_execute(run_id=str(run.id))
    run.refresh_from_db()
    return run


def tool_calls(run: Run) -> list[tuple[bool, str]]:
    return [
        (event.ok, event.reason)
        for event in AuditEvent.objects.filter(run_id=run.id, action="tool.call", tool="get_asset_status")
    ]


@pytest.mark.slow
@pytest.mark.django_db
def test_a_cache_refusing_connections_makes_the_memo_miss(demo_agent: Agent, settings: object) -> None:
    settings.CACHES = cache_at("redis://127.0.0.1:1/0")  # type: ignore[attr-defined]
    run = memoized_run(demo_agent)
    assert run.status == Run.Status.SUCCEEDED
    assert tool_calls(run) == [(True, "")]


@pytest.mark.slow
@pytest.mark.django_db
def test_a_cache_that_never_answers_makes_the_memo_miss(demo_agent: Agent, settings: object, silent_redis: str) -> None:
    settings.CACHES = cache_at(silent_redis)  # type: ignore[attr-defined]
    run = memoized_run(demo_agent)
    assert run.status == Run.Status.SUCCEEDED
    assert tool_calls(run) == [(True, "")]
