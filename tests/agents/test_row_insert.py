"""``audit.row_insert.RowInsert``: the compiled insert a run's events and audit events are written with stores
exactly what the ORM stores, reads the primary keys back in order, and splits what one statement cannot carry.
Checked on SQLite here and on a private PostgreSQL (the audit chain's other database) by the chain's tests, which
write every event through it."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction

from agents.models import Agent, Run, RunEvent
from audit.row_insert import RowInsert

pytestmark = pytest.mark.django_db

EVENT_INSERT = RowInsert(RunEvent, ("run", "seq", "kind", "data", "created_at"))
DATA = {"rule": "직원 소속 조회", "params": {"name": "김하늘"}, "level": 4.0, "ok": True, "none": None}


@pytest.fixture
def run(demo_agent: Agent) -> Run:
    return Run.objects.create(agent=demo_agent, query="김하늘 님은 어느 팀 소속인가요?")


def stored(pk: Any) -> dict[str, Any]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT run_id, seq, kind, data, created_at FROM agents_runevent WHERE id = %s", [pk])
        row = cursor.fetchone()
    return dict(zip(("run_id", "seq", "kind", "data", "created_at"), row, strict=True))


def test_a_row_is_stored_as_the_orm_stores_it_and_gets_its_primary_key(run: Run) -> None:
    by_orm = RunEvent.objects.create(run=run, seq=1, kind="rule", data=DATA)
    ours = RunEvent(run_id=run.pk, seq=2, kind="rule", data=DATA)
    EVENT_INSERT.insert([ours])

    assert ours.pk is not None and ours.pk > by_orm.pk
    assert not ours._state.adding
    assert ours.created_at is not None  # auto_now_add, as the ORM's save sets it
    mine, theirs = stored(ours.pk), stored(by_orm.pk)
    assert mine["data"] == theirs["data"]  # the same JSON text, Korean kept as it is
    assert "김하늘" in mine["data"]
    assert (mine["run_id"], mine["seq"], mine["kind"]) == (theirs["run_id"], 2, "rule")
    assert RunEvent.objects.get(pk=ours.pk).data == DATA


def test_many_rows_keep_their_order_and_keys_across_statements(run: Run) -> None:
    rows = [RunEvent(run_id=run.pk, seq=i, kind="model_turn", data={"i": i}) for i in range(1, 451)]
    batch = connection.ops.bulk_batch_size(list(EVENT_INSERT.fields()), rows)
    assert batch < len(rows)  # more than one statement
    EVENT_INSERT.insert(rows)

    assert [row.pk for row in rows] == sorted(row.pk for row in rows)
    assert {row.pk: row.seq for row in rows} == dict(RunEvent.objects.filter(run=run).values_list("pk", "seq"))


def test_a_constraint_violation_is_django_s_integrity_error(run: Run) -> None:
    EVENT_INSERT.insert([RunEvent(run_id=run.pk, seq=1, kind="status", data={})])
    with pytest.raises(IntegrityError), transaction.atomic():
        EVENT_INSERT.insert([RunEvent(run_id=run.pk, seq=1, kind="status", data={})])
    assert RunEvent.objects.filter(run=run).count() == 1
