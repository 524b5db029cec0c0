"""Deferred chaining on PostgreSQL with the chainer thread (``AUDIT_CHAIN_BACKGROUND``, on by default there): an
append outside a transaction is one statement (its insert and its commit), the process's chainer thread chains it
just after, a process that exits first waits for its events to be chained, and a reader (the audit API's selector)
finds events that no chainer has chained yet, because it chains them first. Real processes on a real cluster."""

from __future__ import annotations

import json
import uuid

import pytest

from tests.postgres import manage, migrated_postgres_url, postgres_url  # noqa: F401 - fixtures

pytestmark = pytest.mark.postgres

LONE_WRITER = """
import json
from django.db import connection
from django.test.utils import CaptureQueriesContext
from audit.models import AuditEvent, AuditPendingEvent
from audit.services import audit_chain_wait, audit_event_record, chain_background, chain_mode
with CaptureQueriesContext(connection) as captured:
    for i in range(5):
        audit_event_record(source="agent", tool={tag!r}, call_id=f"c{{i}}", args={{"i": i, "이름": "김하늘"}})
statements = [query["sql"].split()[0] for query in captured.captured_queries]
waited = audit_chain_wait(timeout=60)
rows = list(AuditEvent.objects.filter(tool={tag!r}).order_by("seq").values_list("seq", "call_id"))
pending = AuditPendingEvent.objects.filter(tool={tag!r}).count()
print(json.dumps({{"mode": chain_mode(), "background": chain_background(), "statements": statements,
                  "waited": waited, "rows": rows, "pending": pending}}))
"""

APPEND_AND_EXIT = """
from audit.services import audit_event_record
for i in range(3):
    audit_event_record(source="agent", tool={tag!r}, call_id=f"c{{i}}")
"""

READ_BACK = """
import json
from audit.models import AuditEvent, AuditPendingEvent
print(json.dumps({{
    "rows": list(AuditEvent.objects.filter(tool={tag!r}).order_by("seq").values_list("call_id", flat=True)),
    "pending": AuditPendingEvent.objects.filter(tool={tag!r}).count(),
}}))
"""

READER_CATCHES_UP = """
import json, os
import psycopg
from audit.models import AuditEvent, AuditPendingEvent
from audit.services import _CHAINER_LOCK_KEY, audit_chain_wait, audit_event_record
from auditor.selectors import AuditEventFilters, audit_event_list
# Another connection holds the chainer's lock and chains nothing (a chainer stalled or killed mid-way).
holder = psycopg.connect(os.environ["DATABASE_URL"], autocommit=True)
holder.execute("SELECT pg_advisory_lock(%s)", [_CHAINER_LOCK_KEY])
for i in range(3):
    audit_event_record(source="agent", tool={tag!r}, call_id=f"c{{i}}")
audit_chain_wait(timeout=60)  # this process's chainer found the lock taken
pending_while_held = AuditPendingEvent.objects.filter(tool={tag!r}).count()
chained_while_held = AuditEvent.objects.filter(tool={tag!r}).count()
holder.execute("SELECT pg_advisory_unlock(%s)", [_CHAINER_LOCK_KEY])
holder.close()
listed = list(audit_event_list(filters=AuditEventFilters(tool={tag!r})).values_list("call_id", flat=True))
print(json.dumps({{"pending_while_held": pending_while_held, "chained_while_held": chained_while_held,
                  "listed": listed, "pending_after": AuditPendingEvent.objects.filter(tool={tag!r}).count()}}))
"""


def last_json(done: object) -> dict:
    assert done.returncode == 0, done.stderr  # type: ignore[attr-defined]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[attr-defined]


def test_a_lone_writer_appends_with_one_statement_and_its_chainer_thread_chains_it_in_order(
    postgres_url: str,  # noqa: F811 - the fixture
) -> None:
    tag = f"lone-{uuid.uuid4().hex[:8]}"

    out = last_json(manage("shell", "-c", LONE_WRITER.format(tag=tag), database_url=postgres_url))

    assert (out["mode"], out["background"]) == ("deferred", True)
    assert out["statements"] == ["WITH"] * 5  # no BEGIN, no head read, no chaining: the insert is the commit
    assert out["waited"] is True
    assert [call_id for _, call_id in out["rows"]] == ["c0", "c1", "c2", "c3", "c4"]
    seqs = [seq for seq, _ in out["rows"]]
    assert seqs == sorted(seqs)
    assert out["pending"] == 0
    verified = manage("verify_audit", database_url=postgres_url)
    assert verified.returncode == 0, verified.stderr


def test_a_process_that_exits_just_after_appending_leaves_nothing_pending(
    postgres_url: str,  # noqa: F811 - the fixture
) -> None:
    tag = f"exit-{uuid.uuid4().hex[:8]}"

    ran = manage("shell", "-c", APPEND_AND_EXIT.format(tag=tag), database_url=postgres_url)
    assert ran.returncode == 0, ran.stderr

    assert last_json(manage("shell", "-c", READ_BACK.format(tag=tag), database_url=postgres_url)) == {
        "rows": ["c0", "c1", "c2"],
        "pending": 0,
    }


def test_a_reader_chains_what_no_chainer_has_chained_yet_before_it_reads(
    postgres_url: str,  # noqa: F811 - the fixture
) -> None:
    tag = f"reader-{uuid.uuid4().hex[:8]}"

    out = last_json(manage("shell", "-c", READER_CATCHES_UP.format(tag=tag), database_url=postgres_url))

    assert (out["pending_while_held"], out["chained_while_held"]) == (3, 0)
    assert out["listed"] == ["c0", "c1", "c2"]
    assert out["pending_after"] == 0


FORGED_HEAD = """
import json
from django.db import connection
from audit.models import AuditEvent, AuditPendingEvent
from audit.services import AuditChainHeadForged, audit_chain_wait, audit_event_record
audit_event_record(source="agent", tool="before-forgery")
audit_chain_wait(timeout=60)
with connection.cursor() as cursor:  # an intruder who can write the database, past the head's trigger
    cursor.execute("ALTER TABLE audit_auditchainhead DISABLE TRIGGER USER")
    cursor.execute("UPDATE audit_auditchainhead SET mac = 'deadbeef:00'")
    cursor.execute("ALTER TABLE audit_auditchainhead ENABLE TRIGGER USER")
try:
    audit_event_record(source="agent", tool="after-forgery")
    refused = None
except AuditChainHeadForged as exc:
    refused = str(exc)
audit_chain_wait(timeout=60)
print(json.dumps({"refused": refused, "pending": AuditPendingEvent.objects.filter(tool="after-forgery").count(),
                  "chained": AuditEvent.objects.filter(tool="after-forgery").count()}))
"""


@pytest.mark.slow
def test_an_append_outside_a_transaction_after_a_forged_head_raises_and_its_row_is_never_chained(
    migrated_postgres_url: str,  # noqa: F811 - a migrated database of its own: the head is forged for good
) -> None:
    out = last_json(manage("shell", "-c", FORGED_HEAD, database_url=migrated_postgres_url))
    verified = manage("verify_audit", database_url=migrated_postgres_url)

    assert out["refused"].startswith("the audit chain head (seq 1) has MAC by key deadbeef"), out
    assert (out["pending"], out["chained"]) == (1, 0)  # recorded, MAC'd, and never chained after that head
    assert verified.returncode != 0
    assert "chain head (seq 1): MAC by key deadbeef" in verified.stderr


STEADY_WRITER = """
import json, time
import audit.services as services
from audit.models import AuditEvent
batches = []
chain_batch = services._chain_batch_postgres
def counted(connection, batch):  # the real batch, counted
    chained, blocked = chain_batch(connection, batch)
    batches.append(chained)
    return chained, blocked
services._chain_batch_postgres = counted
started = time.monotonic()
for i in range(150):
    services.audit_event_record(source="agent", tool={tag!r}, call_id=f"c{{i}}")
    time.sleep(0.002)  # a writer that keeps appending, a little slower than the chainer could chase it
seconds = time.monotonic() - started
waited = services.audit_chain_wait(timeout=60)
print(json.dumps({{"waited": waited, "batches": batches, "seconds": seconds,
                  "chained": AuditEvent.objects.filter(tool={tag!r}).count()}}))
"""


def test_while_a_writer_keeps_appending_the_chainer_thread_chains_what_gathered_not_a_pass_per_commit(
    postgres_url: str,  # noqa: F811 - the fixture
) -> None:
    tag = f"steady-{uuid.uuid4().hex[:8]}"

    out = last_json(manage("shell", "-c", STEADY_WRITER.format(tag=tag), database_url=postgres_url))

    assert out["waited"] is True
    assert out["chained"] == 150
    assert sum(out["batches"]) == 150
    # A pass waits AUDIT_CHAIN_GATHER_S (50 ms) before it re-reads, so there is at most one pass each 50 ms
    # while the writer writes (and one after it); ~20 events a batch at this pace, however slow the machine.
    passes = len([chained for chained in out["batches"] if chained])
    assert passes <= out["seconds"] / 0.05 + 2, out


# Notes when each of the chainer's passes starts (the real batch, timed).
PASS_TIMES = """
passes = []
chain_batch = services._chain_batch_postgres
def counted(connection, batch):
    passes.append(time.monotonic())
    return chain_batch(connection, batch)
services._chain_batch_postgres = counted
"""

HELD_OFF = (
    """
import json, time
import audit.services as services
from audit.models import AuditEvent
"""
    + PASS_TIMES
    + """def chained():
    return AuditEvent.objects.filter(tool={tag!r}).count()
with services.audit_chain_held_off():
    for i in range(3):
        services.audit_event_record(source="agent", tool={tag!r}, call_id=f"c{{i}}")
    if {until} is None:
        time.sleep({block_s})  # AUDIT_CHAIN_GATHER_S is 50 ms: without the hold-off, chained by now
    else:  # until the chainer has chained {until} events, for at most block_s
        deadline = time.monotonic() + {block_s}
        while chained() < {until} and time.monotonic() < deadline:
            time.sleep(0.02)
    during = chained()
left = time.monotonic()
waited = services.audit_chain_wait(timeout=30)
print(json.dumps({{"during": during, "after": chained(), "waited": waited, "after_s": time.monotonic() - left,
                  "passes_before_leaving": len([at for at in passes if at < left])}}))
"""
)


def held_off(database_url: str, *, hold_off_s: float, block_s: float, until: int | None = None) -> dict:
    """A run that appends 3 events and holds its chainer off for ``block_s`` (``until``: or until that many of them
    are chained, whichever comes first)."""
    tag = f"held-{uuid.uuid4().hex[:8]}"
    script = HELD_OFF.format(tag=tag, block_s=block_s, until=until)
    done = manage("shell", "-c", script, database_url=database_url, env={"AUDIT_CHAIN_HOLD_OFF_S": str(hold_off_s)})
    return last_json(done)


def test_a_run_in_progress_holds_its_process_s_chainer_off_until_it_ends(
    postgres_url: str,  # noqa: F811 - the fixture
) -> None:
    out = held_off(postgres_url, hold_off_s=5.0, block_s=0.3)

    assert out["during"] == 0 and out["passes_before_leaving"] == 0, out
    assert out["waited"] is True and out["after"] == 3
    assert out["after_s"] < 2.0, out  # chained as soon as the run let go, not at the end of the hold-off


def test_a_run_longer_than_the_hold_off_has_its_events_chained_while_it_runs(
    postgres_url: str,  # noqa: F811 - the fixture
) -> None:
    out = held_off(postgres_url, hold_off_s=0.2, block_s=10.0, until=3)  # chained by ~0.25 s: no need to wait 10

    assert out["during"] == 3 and out["passes_before_leaving"] >= 1, out


RUN_HELD_OFF = (
    """
import json, time
from django.core.management import call_command
import audit.services as services
from audit.models import AuditEvent, AuditPendingEvent
from agents.execution import run_execute
from agents.models import Agent, Run
call_command("seed_demo", verbosity=0)
agent = Agent.objects.get(slug="company-assistant")
warm = Run.objects.create(agent=agent, query="김하늘 님은 어느 팀 소속인가요?")
run_execute(run_id=str(warm.id))  # the MCP server started, the configuration read
assert services.audit_chain_wait(timeout=60)
"""
    + PASS_TIMES
    + """run = Run.objects.create(agent=agent, query="김하늘 님은 어느 팀 소속인가요?")
began = time.monotonic()
run_execute(run_id=str(run.id))
ended = time.monotonic()
waited = services.audit_chain_wait(timeout=60)
print(json.dumps({"status": Run.objects.get(id=run.id).status, "waited": waited,
                  "passes_during": len([at for at in passes if began <= at < ended]),
                  "passes_after": len([at for at in passes if at >= ended]),
                  "chained": AuditEvent.objects.filter(run_id=run.id).count(),
                  "pending": AuditPendingEvent.objects.filter(run_id=run.id).count()}))
"""
)


def test_a_worker_s_run_is_chained_after_it_not_while_it_runs(
    postgres_url: str,  # noqa: F811 - the fixture
) -> None:
    # A chainer woken by the run's first commit would start its pass 1 ms later, in the middle of the run.
    env = {"AUDIT_CHAIN_GATHER_S": "0.001", "AUDIT_CHAIN_HOLD_OFF_S": "10"}
    out = last_json(manage("shell", "-c", RUN_HELD_OFF, database_url=postgres_url, env=env))

    assert out["status"] == "succeeded" and out["waited"] is True
    assert out["passes_during"] == 0 and out["passes_after"] >= 1, out
    assert out["chained"] >= 8 and out["pending"] == 0, out  # the rule decisions and the tool call


ODD_TEXT = """
import json
from django.db import DataError, transaction
from audit.models import AuditEvent
from audit.services import audit_chain_wait, audit_event_record
# A tab, a newline, a backslash and COPY's own null marker in text: what the chainer's COPY has to escape.
odd = "탭" + chr(9) + "줄" + chr(10) + "역슬래시" + chr(92) + " " + chr(92) + "N 끝 🙂"
for i in range(3):
    audit_event_record(source="agent", tool={tag!r}, call_id=f"c{{i}}", reason=odd, args={{"v": odd, "n": [1.5, None]}},
                       result=odd, latency_ms=0.5)
errors = []
for inside in (False, True):  # too long for the column: the driver's error, as Django's, in or out of a transaction
    try:
        if inside:
            with transaction.atomic():
                audit_event_record(source="x" * 30, tool={tag!r})
        else:
            audit_event_record(source="x" * 30, tool={tag!r})
    except DataError as exc:
        errors.append(type(exc).__module__)
audit_event_record(source="agent", tool={tag!r}, call_id="after")  # the connection is still usable
waited = audit_chain_wait(timeout=60)
rows = [list(row) for row in AuditEvent.objects.filter(tool={tag!r}).order_by("seq").values_list(
    "call_id", "reason", "args", "result", "latency_ms")]
print(json.dumps({{"waited": waited, "errors": errors, "rows": rows, "odd": odd}}, ensure_ascii=False))
"""


def test_appends_and_the_chainer_s_copy_keep_every_character_and_a_failed_append_raises_django_s_error(
    postgres_url: str,  # noqa: F811 - the fixture
) -> None:
    """An append outside Django's query logging goes through a kept psycopg cursor and the chainer copies the
    events in (``COPY``): text that COPY escapes survives both, and a statement that fails raises Django's error
    (callers catch ``DatabaseError``), inside a transaction or not, leaving the connection usable."""
    tag = f"odd-{uuid.uuid4().hex[:8]}"

    out = last_json(manage("shell", "-c", ODD_TEXT.format(tag=tag), database_url=postgres_url))
    verified = manage("verify_audit", database_url=postgres_url)

    odd = out["odd"]
    assert "\t" in odd and "\n" in odd and "\\N" in odd
    assert out["waited"] is True
    assert out["errors"] == ["django.db.utils", "django.db.utils"]
    assert out["rows"] == [
        *([f"c{i}", odd, {"n": [1.5, None], "v": odd}, odd, 0.5] for i in range(3)),
        ["after", "", {}, None, None],
    ]
    assert verified.returncode == 0, verified.stderr
