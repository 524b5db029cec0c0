"""The deterministic stage's writes, as a worker commits them: the decisions before a call are committed before
it is sent; a read call's audit event is committed with the call's result event and the decisions after it, in
one transaction; the chain holds them in the order they happened."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agents.execution import run_execute
from agents.models import Agent, Run
from audit.models import AuditEvent

QUESTION = "김하늘 님은 어느 팀 소속인가요?"


def transactions(sqls: list[str]) -> list[list[str]]:
    """The statements between each BEGIN and its COMMIT (SQLite: ``BEGIN IMMEDIATE``)."""
    blocks: list[list[str]] = []
    current: list[str] | None = None
    for sql in sqls:
        if sql.startswith("BEGIN"):
            current = []
        elif sql == "COMMIT":
            assert current is not None
            blocks.append(current)
            current = None
        elif current is not None:
            current.append(sql)
    return blocks


@pytest.mark.django_db(transaction=True)
def test_a_read_calls_audit_event_is_committed_with_its_result_and_the_decisions_after_it(demo_agent: Agent) -> None:
    run = Run.objects.create(agent=demo_agent, query=QUESTION)
    with CaptureQueriesContext(connection) as captured:
        run_execute(run_id=str(run.id))
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    blocks = transactions([q["sql"] for q in captured.captured_queries])
    audited = [
        [
            ("tool.call" in sql, "'rule.decision'" in sql)
            for sql in block
            if "audit_auditevent" in sql and "INSERT" in sql
        ]
        for block in blocks
    ]
    # The first rule's decision, committed before the call; then the call's audit event with its result event
    # and the decisions after it, in one insert, in one transaction.
    before, after = (i for i, block in enumerate(audited) if block)
    assert audited[before] == [(False, True)]
    assert audited[after] == [(True, True)]
    assert any("'deterministic_result'" in sql for sql in blocks[after])
    assert not any("'deterministic_result'" in sql for sql in blocks[before])
    rules = demo_agent.rules.count()
    chain = AuditEvent.objects.filter(run_id=run.id).order_by("seq")
    assert [(e.action, e.reason) for e in chain] == [
        ("rule.decision", "rule:matched"),
        ("tool.call", ""),
        *[("rule.decision", "rule:skipped")] * (rules - 1),
    ]
