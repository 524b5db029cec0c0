"""Shadow and eval runs respect the server's circuit breaker but never move it: a candidate version's frozen contract
(a tighter timeout, say) that fails against a server live traffic finds healthy must not cut live runs off, and a
shadow's success must not close a circuit that live traffic's trial owns. The probe server over stdio, for real."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from audit.models import AuditEvent
from mcpregistry import breaker, gate
from mcpregistry.gate_records import contract_from_snapshot, contract_snapshot
from mcpregistry.models import McpServer, ToolContract
from mcpregistry.pool import get_default_pool
from tests.conftest import discover_as_admin

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def _one_probe_process() -> Iterator[None]:
    """The module's tests bind the same probe: the pool gives each the session (and process) the one before left,
    where no timeout retired it (a start of the probe is a second). Closed after the module's last test."""
    yield
    get_default_pool().close("probe")


@pytest.fixture
def probe_server(db, _one_probe_process: None) -> McpServer:
    server = McpServer.objects.create(
        mcp_id="probe",
        name="probe",
        command=sys.executable,
        args=["-m", "tests.mcp_fixtures.probe_server"],
        cwd=str(settings.BASE_DIR),
        env={"PROBE_MODE": "slow"},
        session_scope="shared",
        timeout_s=10,
        breaker_threshold=3,
        breaker_cooldown_s=30,
    )
    assert discover_as_admin(server=server).ok
    return server


def frozen_with_timeout(server: McpServer, timeout_s: float) -> dict[str, ToolContract]:
    """A candidate version's frozen contracts: the live ``sleep`` contract with a tighter timeout."""
    snap = contract_snapshot(server.tools.get(name="sleep"))
    snap["timeout_s"] = timeout_s
    return {"probe/sleep": contract_from_snapshot(snap)}


def call(server: McpServer, seconds: float, who: gate.GateCall) -> gate.ToolResult:
    server = McpServer.objects.prefetch_related("tools__contract").get(pk=server.pk)
    return gate.call(server=server, tool_name="sleep", args={"seconds": seconds}, who=who)


def state(server: McpServer) -> tuple[str, int]:
    server.refresh_from_db()
    return server.breaker_state, server.breaker_failures


@pytest.mark.slow
def test_a_candidates_timeouts_do_not_open_the_breaker_for_live_runs(probe_server) -> None:
    frozen = frozen_with_timeout(probe_server, 0.3)
    candidate = gate.GateCall(source="shadow", writes_blocked=True, contracts=frozen)
    # One call: its three attempts are three timeouts in a row, the breaker's threshold (each attempt counts: the
    # same call from live traffic opens it, test_live_failures_still_open_the_breaker_and_a_shadow_respects_it).
    # Each timeout retires its session, a probe process started again: more calls would prove nothing more.
    result = call(probe_server, 1.0, candidate)
    assert (result.ok, result.error, result.attempts) == (False, "timeout", 3)  # each sent; none refused
    assert state(probe_server) == ("closed", 0)
    # Every attempt is still audited, under the run's source.
    attempts = AuditEvent.objects.filter(tool="sleep", source="shadow", action="tool.call")
    assert set(attempts.values_list("reason", flat=True)) == {"timeout"}
    assert attempts.count() == 3  # the contract's three attempts

    live = call(probe_server, 0.1, gate.GateCall(source="agent"))
    assert (live.ok, live.value) == (True, "slept 0.1"), live.message


@pytest.mark.slow
def test_live_failures_still_open_the_breaker_and_a_shadow_respects_it(probe_server) -> None:
    ToolContract.objects.filter(tool__server=probe_server, tool__name="sleep").update(timeout_s=0.3)
    live = call(probe_server, 1.0, gate.GateCall(source="agent"))
    assert (live.error, live.attempts) == ("timeout", 3)
    assert state(probe_server)[0] == "open"
    # A shadow run's call (its contract would meet the server) is refused by the open circuit, never sent.
    frozen = frozen_with_timeout(probe_server, 10)
    shadow = call(probe_server, 0.1, gate.GateCall(source="shadow", writes_blocked=True, contracts=frozen))
    assert shadow.error == "circuit:open"
    assert AuditEvent.objects.filter(tool="sleep", source="shadow").get().latency_ms is None


@pytest.mark.slow
def test_a_shadow_or_eval_never_claims_the_trial_nor_closes_a_half_open_circuit(probe_server) -> None:
    frozen = frozen_with_timeout(probe_server, 10)
    shadow = gate.GateCall(source="shadow", writes_blocked=True, contracts=frozen)
    evaluation = gate.GateCall(source="eval", writes_blocked=True, contracts=frozen)
    opened = timezone.now() - timedelta(seconds=60)
    McpServer.objects.filter(pk=probe_server.pk).update(breaker_state="open", breaker_opened_at=opened)
    breaker._seen_closed.clear()  # as another worker opened it
    # The cool-down is over, but the trial is live traffic's: the shadow is refused and the circuit stays as it was.
    assert call(probe_server, 0.1, shadow).error == "circuit:open"
    assert call(probe_server, 0.1, evaluation).error == "circuit:open"
    probe_server.refresh_from_db()
    assert (probe_server.breaker_state, probe_server.breaker_opened_at) == ("open", opened)
    # A trial live traffic claimed (half open, just now): a shadow's call neither goes out nor closes it.
    McpServer.objects.filter(pk=probe_server.pk).update(breaker_state="half_open", breaker_opened_at=timezone.now())
    assert call(probe_server, 0.1, shadow).error == "circuit:open"
    assert call(probe_server, 0.1, evaluation).error == "circuit:open"
    assert state(probe_server)[0] == "half_open"
    # Live traffic's own trial (once the cool-down is over) closes it.
    McpServer.objects.filter(pk=probe_server.pk).update(breaker_opened_at=opened)
    assert call(probe_server, 0.1, gate.GateCall(source="agent")).ok
    assert state(probe_server) == ("closed", 0)
