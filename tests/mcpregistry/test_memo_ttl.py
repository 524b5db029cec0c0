"""The gate's cross-run memo: an entry is reused only while it is younger than the reader's own contract's
``memo_ttl_s`` (whoever wrote it, under whichever version's contract), and eval and shadow runs never put one."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.core.cache import cache

from agents.execution import run_execute
from agents.models import Agent, Run
from agents.services import agent_shadow_set, agent_version_publish, run_create
from audit.models import AuditEvent
from mcpregistry import gate
from mcpregistry.gate import GateCall, ToolResult, _memo_get, _memo_put
from mcpregistry.models import ToolContract

QUESTION = "A-1001 자산의 현재 상태를 알려주세요."
KEY = "sds-company-data\nget_asset_status\n{}"


class Clock:
    """``gate.memo_clock`` for tests: time moves only when the test says so."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[Clock]:
    cache.clear()
    ticking = Clock()
    monkeypatch.setattr(gate, "memo_clock", ticking, raising=False)
    yield ticking
    cache.clear()


def reads(ttl_s: int) -> ToolContract:
    return ToolContract(memo=True, memo_ttl_s=ttl_s, risk=ToolContract.Risk.READ)


def test_an_entry_written_under_a_longer_ttl_is_reused_only_within_the_readers_own(clock: Clock) -> None:
    # An A/B arm's version keeps the read for an hour; the other arm's contract allows a minute.
    _memo_put(GateCall(source="deterministic"), reads(3600), KEY, KEY, {"status": "ok"}, [])
    clock.now += 30
    assert _memo_get(GateCall(source="deterministic"), reads(60), KEY, KEY) == {"status": "ok"}
    clock.now += 31
    assert _memo_get(GateCall(source="deterministic"), reads(60), KEY, KEY) is None
    assert _memo_get(GateCall(source="deterministic"), reads(3600), KEY, KEY) == {"status": "ok"}


def test_a_run_with_writes_blocked_keeps_its_reads_to_itself(clock: Clock) -> None:
    shadow = GateCall(source="deterministic", writes_blocked=True, memo={})
    _memo_put(shadow, reads(3600), KEY, KEY, {"status": "ok"}, [])
    # Reused within the eval or shadow run, never by another run.
    assert shadow.memo == {KEY: ToolResult(ok=True, value={"status": "ok"})}
    assert _memo_get(shadow, reads(3600), KEY, KEY) == {"status": "ok"}
    assert _memo_get(GateCall(source="deterministic"), reads(3600), KEY, KEY) is None


@pytest.mark.slow
@pytest.mark.django_db
def test_a_shadow_does_not_feed_live_runs_data_older_than_their_contract_allows(
    demo_agent: Agent, clock: Clock
) -> None:
    contracts = ToolContract.objects.filter(tool__name="get_asset_status")
    contracts.update(memo=True, memo_ttl_s=30)  # the live version: reuse a read for half a minute at most
    agent_version_publish(agent=demo_agent, actor="test-admin", via="tests")
    contracts.update(memo_ttl_s=3600)  # the candidate: an hour
    candidate = agent_version_publish(agent=demo_agent, actor="test-admin", via="tests", make_live=False)
    agent_shadow_set(agent=demo_agent, actor="test-admin", via="tests", version=candidate, rate=1.0)

    def live_run() -> Run:
        run = run_create(agent_slug=demo_agent.slug, query=QUESTION, api_key=None)
        run_execute(run_id=str(run.id))
        return run

    def memo_hits(run: Run) -> int:
        return AuditEvent.objects.filter(run_id=run.id, action="tool.call", reason="memo:hit").count()

    first = live_run()
    cache.clear()  # the live run's own entry has expired when its shadow runs
    shadow = Run.objects.get(shadow_of=first)
    run_execute(run_id=str(shadow.id))  # it reads the tool, under the candidate's hour
    agent_shadow_set(agent=demo_agent, actor="test-admin", via="tests", version=None, rate=0.0)
    clock.now += 60  # past the live version's half minute
    second = live_run()
    assert memo_hits(second) == 0  # read afresh, not the shadow's minute-old value
    third = live_run()
    assert memo_hits(third) == 1  # the live version's own entry is reused within its half minute
