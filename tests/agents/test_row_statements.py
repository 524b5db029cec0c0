"""``audit.row_statements``: the compiled insert a run's events and audit events are written with stores exactly
what the ORM stores, reads the primary keys back in order, and splits what one statement cannot carry; the run's
row read (``RowRead``) is the instance a queryset gives, its updates (``RowUpdate``) store what
``QuerySet.update`` stores and count the rows a compare-and-swap changed.
Checked on SQLite here and on a private PostgreSQL (the audit chain's other database) by the chain's tests, which
write every event through it."""

from __future__ import annotations

import contextlib
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import IntegrityError, connection, models, transaction

from agents.models import Agent, Run, RunEvent
from agents.run_state import RunEventWriter
from audit.models import AuditEvent
from audit.row_statements import _PLAIN_VALUE, RowInsert, RowRead, RowUpdate

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


# --- a run's row read and changed (agents.execution's claim and outcome) ---------------------------------------

RUN_READ = RowRead(Run)
OUTCOME = RowUpdate(
    Run, ("status", "answer", "messages", "timings", "finished_at", "tokens"), ("id", "status", "worker")
)
RESULT = {
    "status": "succeeded",
    "answer": "김하늘 님은 클라우드운영팀 소속입니다.",
    "messages": [{"type": "ai", "content": "소속: 클라우드운영팀", "n": 1.5, "none": None}],
    "timings": {"total_ms": 9.25},
    "finished_at": datetime(2026, 12, 1, 9, 30, 15, 123456, tzinfo=UTC),
    "tokens": 12,
}


def raw_run(pk: Any) -> tuple[Any, ...]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT status, answer, messages, timings, finished_at, tokens FROM agents_run WHERE id = %s",
            [Run._meta.get_field("id").get_db_prep_value(pk, connection)],
        )
        return tuple(cursor.fetchone())


def test_a_run_read_is_the_instance_a_queryset_gives(run: Run) -> None:
    Run.objects.filter(pk=run.pk).update(
        context={"contextId": "대화-1"}, a2a_data=[{"팀": "클라우드운영팀"}], started_at=RESULT["finished_at"]
    )
    ours, theirs = RUN_READ.get(run.pk), Run.objects.get(pk=run.pk)

    assert isinstance(ours, Run) and not ours._state.adding and ours._state.db == "default"
    for field in Run._meta.concrete_fields:
        assert getattr(ours, field.attname) == getattr(theirs, field.attname), field.name
    assert ours.context == {"contextId": "대화-1"} and ours.a2a_data == [{"팀": "클라우드운영팀"}]
    assert ours.started_at == RESULT["finished_at"] and ours.started_at.tzinfo is not None
    assert isinstance(ours.id, uuid.UUID) and ours.agent == run.agent
    assert RUN_READ.get(uuid.uuid4()) is None


def test_every_matching_row_comes_in_the_order_asked_then_by_primary_key_as_a_queryset_gives_it(run: Run) -> None:
    other = Run.objects.create(agent=run.agent, query="another run")
    made = datetime(2026, 12, 1, 9, 30, tzinfo=UTC)
    for minute, (run_id, tool, action) in enumerate(
        [
            (run.pk, "search_employee", "tool.call"),
            (other.pk, "search_employee", "tool.call"),
            (run.pk, "", "rule.matched"),
            (run.pk, "get_team", "tool.call"),
            (run.pk, "list_assets", "tool.call"),
        ]
    ):
        AuditEvent.objects.create(
            run_id=run_id, source="agent", action=action, tool=tool, args={"이름": "김하늘"}, seq=-minute - 1,
            created_at=made - timedelta(minutes=min(minute, 3)),  # the later, the earlier; the last two at one time
        )  # fmt: skip
    read = RowRead(AuditEvent)

    ours = read.all_where({"run_id": run.pk, "action": "tool.call"}, order_by="created_at")
    theirs = list(AuditEvent.objects.filter(run_id=run.pk, action="tool.call").order_by("created_at", "id"))

    assert [event.tool for event in ours] == ["get_team", "list_assets", "search_employee"]
    assert [event.pk for event in ours] == [event.pk for event in theirs]
    for mine, its in zip(ours, theirs, strict=True):
        for field in AuditEvent._meta.concrete_fields:
            assert getattr(mine, field.attname) == getattr(its, field.attname), field.name
    assert ours[-1].args == {"이름": "김하늘"} and ours[-1].created_at == made
    assert read.all_where({"run_id": uuid.uuid4(), "action": "tool.call"}, order_by="id") == []
    assert [e.pk for e in read.all_where({"run_id": run.pk}, order_by="id")] == sorted(
        AuditEvent.objects.filter(run_id=run.pk).values_list("pk", flat=True)
    )


def test_a_run_update_stores_what_the_orm_stores_and_counts_the_rows_it_changed(demo_agent: Agent) -> None:
    ours, theirs = (Run.objects.create(agent=demo_agent, query="q", status="running", worker="w1") for _ in "ab")
    assert OUTCOME.execute(RESULT, {"id": ours.pk, "status": "running", "worker": "w1"}) == 1
    Run.objects.filter(pk=theirs.pk).update(**RESULT)

    assert raw_run(ours.pk) == raw_run(theirs.pk)  # the same text, Korean kept as it is, the same time
    assert "김하늘" in raw_run(ours.pk)[1]
    stored = Run.objects.get(pk=ours.pk)
    assert (stored.status, stored.messages, stored.finished_at) == (
        "succeeded",
        RESULT["messages"],
        RESULT["finished_at"],
    )
    # A compare-and-swap whose condition no longer holds changes nothing.
    assert OUTCOME.execute({**RESULT, "answer": "late"}, {"id": ours.pk, "status": "running", "worker": "w1"}) == 0
    assert Run.objects.get(pk=ours.pk).answer == RESULT["answer"]


def test_a_run_update_matches_null_and_refuses_a_partial_set_of_fields(demo_agent: Agent) -> None:
    run = Run.objects.create(agent=demo_agent, query="q", status="queued")
    lapsed = RowUpdate(Run, ("status",), ("id", "lease_expires_at"))
    assert lapsed.execute({"status": "running"}, {"id": run.pk, "lease_expires_at": RESULT["finished_at"]}) == 0
    assert lapsed.execute({"status": "running"}, {"id": run.pk, "lease_expires_at": None}) == 1
    assert Run.objects.get(pk=run.pk).status == "running"
    with pytest.raises(ValueError, match="set"):
        OUTCOME.execute({"status": "failed"}, {"id": run.pk, "status": "running", "worker": ""})


# --- a run's events numbered again after another writer's (agents.run_state.RunEventWriter) --------------------


@pytest.mark.parametrize("in_transaction", [False, True], ids=["autocommit", "in a transaction"])
def test_a_batch_that_meets_a_taken_number_is_written_whole_after_it(run: Run, in_transaction: bool) -> None:
    """Writer B believes the run's last event is 1; another writer has written 3 meanwhile. B's batch of three
    (2, 3, 4) meets the taken 3: the rows that went in (2 and 4) are taken out again in the same transaction,
    and the batch is written whole after 3, in its order — never in part, never around the other's event."""
    RunEventWriter(run_id=run.pk, secrets=[], last_seq=0).emit("status", {"status": "running"})
    RunEventWriter(run_id=run.pk, secrets=[], last_seq=2).emit("status", {"status": "cancelled"})
    b = RunEventWriter(run_id=run.pk, secrets=[], last_seq=1)
    with transaction.atomic() if in_transaction else contextlib.nullcontext():
        b.emit_many([("model_turn", {"b": 1}), ("model_turn", {"b": 2}), ("model_turn", {"b": 3})])
        b.emit("status", {"status": "succeeded"})

    rows = list(RunEvent.objects.filter(run=run).order_by("seq").values_list("seq", "kind", "data"))
    assert [(seq, data) for seq, kind, data in rows if kind == "model_turn"] == [
        (4, {"b": 1}),
        (5, {"b": 2}),
        (6, {"b": 3}),
    ]
    assert [seq for seq, _, _ in rows] == [1, 3, 4, 5, 6, 7]
    assert rows[-1][1:] == ("status", {"status": "succeeded"})
    assert b.seq == 7


def test_a_single_event_meets_a_taken_number_and_is_numbered_after_it(run: Run) -> None:
    a = RunEventWriter(run_id=run.pk, secrets=[], last_seq=0)
    b = RunEventWriter(run_id=run.pk, secrets=[], last_seq=0)
    a.emit("status", {"status": "running"})
    with transaction.atomic():
        b.emit("status", {"status": "cancelled"})
    assert list(RunEvent.objects.filter(run=run).order_by("seq").values_list("seq", "data")) == [
        (1, {"status": "running"}),
        (2, {"status": "cancelled"}),
    ]


# --- plain values passed as they are --------------------------------------------------------------------------

SAMPLES = {str: ["", "김하늘", "x" * 300], int: [0, -3, 2**40], bool: [True, False], float: [0.0, 4.25, -1e300]}


def test_a_plain_value_is_what_its_field_s_preparation_makes_of_it() -> None:
    """The insert passes a plain value of a plain field as it is: on this database that is exactly what the
    field's own preparation returns (same value, same type)."""
    for field_class, kind in _PLAIN_VALUE.items():
        field = field_class(max_length=300) if field_class is models.CharField else field_class()
        for value in SAMPLES[kind]:
            prepared = field.get_db_prep_save(value, connection)
            assert prepared == value and type(prepared) is kind, (field_class.__name__, value)


def test_integers_are_prepared_where_the_backend_adapts_them() -> None:
    """PostgreSQL (psycopg 3) wraps integers for their column type: there every integer is prepared."""
    from types import SimpleNamespace

    from django.db.backends.postgresql.operations import DatabaseOperations

    insert = RowInsert(AuditEvent, ("seq", "attempt", "ok", "action", "latency_ms", "args"))
    assert insert.plain_types(connection) == (int, int, bool, str, float, None)
    on_postgres = SimpleNamespace(vendor="postgresql", ops=DatabaseOperations(connection=None))
    assert insert.plain_types(on_postgres) == (None, None, bool, str, float, None)  # type: ignore[arg-type]


def test_a_run_inserted_keeps_its_uuid_as_the_orm_gives_it(demo_agent: Agent) -> None:
    """A primary key read back is the field's value (SQLite gives a UUID back as hex text)."""
    run = Run(agent=demo_agent, query="김하늘 님은 어느 팀 소속인가요?", context={"contextId": "대화-1"})
    chosen = run.pk
    RowInsert(Run, [field.name for field in Run._meta.concrete_fields]).insert([run])
    assert isinstance(run.pk, uuid.UUID) and run.pk == chosen and not run._state.adding
    stored = Run.objects.get(pk=chosen)
    assert (stored.query, stored.context, stored.status) == (run.query, {"contextId": "대화-1"}, Run.Status.QUEUED)
    assert stored.created_at is not None and stored.created_at == run.created_at
