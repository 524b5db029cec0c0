"""The race of a decision and the pass that asked for it, on PostgreSQL, where transactions really overlap (SQLite
serialises them): a reviewer approves while the pass is still storing the run's park. The decision locks the run's
row first, so the pass's store waits for it and then finds nothing pending, and queues the run itself. Without the
lock both miss each other: the decision found the run still running and could not queue it, the pass (reading
before the decision committed) parked it, and the run stayed parked for good."""

from __future__ import annotations

import json

import pytest

from tests.postgres import manage, postgres_url  # noqa: F401 - postgres_url is a fixture

pytestmark = [pytest.mark.postgres]

DECIDED_WHILE_THE_PASS_STORES = r"""
import json, sys, threading, time, uuid
from django.conf import settings
from django.db import connection
import agents.approvals as approvals_module
from agents import execution
from agents.approvals import approval_decide
from agents.models import Approval, Run
from agents.services import agent_create
from mcpregistry.services import mcp_server_create, mcp_server_discover

tag = uuid.uuid4().hex[:8]
server = mcp_server_create(actor="test", via="tests", data={
    "mcp_id": f"notes-{tag}", "name": "notes", "command": sys.executable,
    "args": ["-m", "tests.mcp_fixtures.probe_server"], "cwd": str(settings.BASE_DIR),
    "env": {"NOTES_FILE": f"/tmp/pg-race-{tag}.txt"}, "session_scope": "shared",
})
assert mcp_server_discover(server=server, actor="test", via="tests").ok
script = [{"tool_calls": [{"name": "append_note", "args": {"text": "x"}}]}, {"content": "done"}]
agent = agent_create(actor="test", via="tests", servers=[server], data={
    "slug": f"race-{tag}", "name": "race", "model_provider": "scripted", "model_params": {"script": script},
})
run = Run.objects.create(agent=agent, query="q")

resumed_nothing = threading.Event()
run_resume = approvals_module.run_resume

def blocking_another():
    from tests.postgres import blocking_another as waits_on_us  # read live from pg_locks
    return waits_on_us(connection)

def decision_pauses_after_finding_the_run_running(**kwargs):
    queued = run_resume(**kwargs)  # the run is still running: nothing to queue
    resumed_nothing.set()
    # The decision's transaction stays open while the pass stores its park: until the store waits for the run's
    # row this transaction holds (it cannot go on before this one ends, however long it waited), or 1.5 s (the
    # store, not waiting, has had ample time to park the run).
    deadline = time.monotonic() + 1.5
    while not blocking_another() and time.monotonic() < deadline:
        time.sleep(0.02)
    return queued

approvals_module.run_resume = decision_pauses_after_finding_the_run_running
store = execution._store_outcome

def store_once_the_decision_is_under_way(claim, *args, **kwargs):
    if resumed_nothing.is_set() or not Approval.objects.filter(run_id=claim.run_id, status="pending").exists():
        return store(claim, *args, **kwargs)
    def reviewer():
        try:
            [approval] = Approval.objects.filter(run_id=claim.run_id, status="pending")
            approval_decide(run=Run.objects.get(pk=claim.run_id), approval_id=str(approval.pk), decision="approve", actor="admin:quick")
        finally:
            connection.close()
    reviewers.append(threading.Thread(target=reviewer))
    reviewers[-1].start()
    assert resumed_nothing.wait(timeout=30)
    return store(claim, *args, **kwargs)

reviewers = []
execution._store_outcome = store_once_the_decision_is_under_way
execution.run_execute(run_id=str(run.id))
for thread in reviewers:  # the reviewer's transaction has committed
    thread.join(timeout=60)
assert reviewers and not any(thread.is_alive() for thread in reviewers)
run.refresh_from_db()
print(json.dumps({
    "status": run.status,
    "approvals": list(Approval.objects.filter(run=run).values_list("status", flat=True)),
}))
"""


def test_a_decision_racing_the_pass_that_asked_for_it_never_strands_the_run_on_postgres(
    postgres_url: str,  # noqa: F811 - the fixture
) -> None:
    done = manage(
        "shell",
        "-c",
        DECIDED_WHILE_THE_PASS_STORES,
        database_url=postgres_url,
        timeout=300,
        env={"PLATFORM_ALLOW_SCRIPTED_MODEL": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # Queued again (its task sent; no worker here), the approval approved and waiting to be carried out.
    assert result == {"status": "queued", "approvals": ["approved"]}, result
