"""What the audit hash chain costs: writes per second with it against the same inserts without it, from one writer
and from several at once, in both ways events join the chain, and how fast ``verify_audit`` walks a long chain.

Run from the repo root: ``python -m bench.audit [--events N] [--verify-events N] [--writers N] [--no-postgres]``.

* one writer (``--events``): ``audit_event_record`` as the gate calls it (masking, truncation, the hash and its
  MAC), one event per transaction, alternating in rounds: ``inline_1_writer`` (the chain head locked, its MAC
  checked and moved in the writer's transaction), ``deferred_1_writer`` (one statement: the MAC'd pending row;
  the process's chainer thread chains it; a round ends when its events are chained), and ``plain``: the same
  masked event inserted with ``AuditEvent.objects.create`` and no chain work (a placeholder negative ``seq``, no
  head, no hash): what writing an event cost before the chain. ``chain_vs_plain_ratio`` is the database's default
  mode (deferred on PostgreSQL, inline on SQLite) against plain. The plain rows are deleted before verifying.
* ``concurrent`` (``--writers``, default 8, ``--concurrent-events`` in all): that many writer processes append at
  once through ``audit_event_record``, one event per transaction, first with the chain ``inline`` (every append
  locks the chain head for its transaction), then ``deferred`` (see ``audit/services.py``), in the same run.
  Events per second is every event written *and chained* over the wall time from the start signal until the
  chain's lag is 0.
* ``verify``: the chain is topped up to ``--verify-events`` events (at least 20,000; hashed, MAC'd and
  bulk-inserted, as the chain would have written them) and ``verify_audit`` (hashes, MACs, links) is timed over
  all of them: the events read through the ORM (``verify_orm_events_per_second``, the reading path before the
  raw one), read raw by the verifier alone in the command's own process (``verify_one_process_events_per_second``,
  ``--workers 0``: the default before segments), then as the command runs by default
  (``verify_events_per_second``: in segments, by one worker process per core up to 8, ``verify_workers``).
  Target: 50,000 events/s.

Both on PostgreSQL (``DATABASE_URL`` if set: it must be a throwaway database, the benchmark writes to it, and it
refuses, before writing anything, one that holds an audit event or a run; else a private cluster started as the tests do, ``tests/postgres.py``, with durable settings: fsync and synchronous
commit on), lines prefixed ``postgres_``, then on a throwaway SQLite database, prefixed ``sqlite_``. The last
line is the headline: ``postgres_deferred_vs_inline_8_writers_ratio``, eight PostgreSQL writers with the
deferred chain against the inline one, measured in the same run (``sqlite_`` where PostgreSQL is not there; with
``--writers 0``, one writer's: ``postgres_deferred_vs_inline_1_writer_ratio``).
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import time
from pathlib import Path

from bench._stats import non_negative_int, positive_int

REPO = Path(__file__).resolve().parent.parent
PAYLOAD_ARGS = {"name": "김하늘", "api_key": "sk-live-abcdefgh12345678"}
PAYLOAD_RESULT = {
    "employees": [
        {"name": "김하늘", "team": "클라우드운영팀", "title": "팀장", "email": "haneul.kim@example.com", "level": 4.0},
        {"name": "이도윤", "team": "클라우드운영팀", "title": "매니저", "email": "doyun.lee@example.com", "level": 3.5},
    ]
}


def measure_writes(events: int, rounds: int = 10) -> dict[str, float]:
    """Events per second from one writer: the chain inline, the chain deferred, and no chain, alternating in
    rounds. A deferred round ends when its events are chained (the process's chainer thread has caught up)."""
    from django.conf import settings
    from django.db import connection, transaction

    from audit.append_only import archive_delete_allow, archive_delete_end
    from audit.masking import mask_value, truncate
    from audit.models import AuditEvent
    from audit.services import audit_chain_pending, audit_chain_wait, audit_event_record, chain_mode

    def chain_write(i: int) -> None:
        audit_event_record(
            source="agent", mcp_id="bench", tool="search_employee", call_id=f"c{i}", args=PAYLOAD_ARGS,
            result=PAYLOAD_RESULT, latency_ms=2.5, actor="bench",
        )  # fmt: skip

    plain_seq = [0]

    def plain_write(i: int) -> None:
        plain_seq[0] -= 1
        AuditEvent.objects.create(
            source="agent", mcp_id="bench", tool="search_employee", call_id=f"c{i}", args=mask_value(PAYLOAD_ARGS),
            result=truncate(mask_value(PAYLOAD_RESULT), max_chars=settings.PLATFORM_AUDIT_RESULT_MAX_CHARS),
            latency_ms=2.5, actor="bench", seq=plain_seq[0], prev_hash="", hash="",
        )  # fmt: skip

    def chained() -> None:  # the round's events all in the chain
        audit_chain_wait(timeout=600)
        audit_chain_pending(rounds=None)

    default_mode = chain_mode()
    kept = settings.AUDIT_CHAIN_MODE
    spent = {"inline": 0.0, "deferred": 0.0, "plain": 0.0}
    try:
        for mode in ("inline", "deferred"):  # warm: connection, masking caches, the chainer thread
            settings.AUDIT_CHAIN_MODE = mode
            chain_write(-1)
        chained()
        plain_write(-1)
        per_round = max(1, events // rounds)
        for _ in range(rounds):
            for name in ("inline", "deferred", "plain"):
                settings.AUDIT_CHAIN_MODE = name
                started = time.perf_counter()
                for i in range(per_round):
                    (plain_write if name == "plain" else chain_write)(i)
                if name == "deferred":
                    chained()
                spent[name] += time.perf_counter() - started
    finally:
        settings.AUDIT_CHAIN_MODE = kept
    with transaction.atomic(), connection.cursor() as cursor:  # the plain rows are not part of the chain
        archive_delete_allow(cursor, connection)  # past the append-only triggers, as archive_audit gets
        cursor.execute("DELETE FROM audit_auditevent WHERE seq < 0")
        archive_delete_end(cursor, connection)
    total = per_round * rounds
    chain_eps, plain_eps = total / spent[default_mode], total / spent["plain"]
    return {
        "inline_1_writer_events_per_second": total / spent["inline"],
        "deferred_1_writer_events_per_second": total / spent["deferred"],
        "deferred_vs_inline_1_writer_ratio": spent["inline"] / spent["deferred"],
        "plain_events_per_second": plain_eps,
        "chain_vs_plain_ratio": chain_eps / plain_eps,  # the database's default mode against no chain
        "chain_added_ms_per_event": (spent[default_mode] - spent["plain"]) / total * 1000,
    }


def _concurrent_writer(mode: str, count: int, start: object, done: object, tag: str = "") -> None:
    """One writer process (forked after Django is set up; its connection is its own)."""
    from django.conf import settings
    from django.db import connections

    from audit.services import audit_event_record

    connections.close_all()
    settings.AUDIT_CHAIN_MODE = mode
    audit_event_record(source="agent", mcp_id="bench", tool="warm", args={}, actor="bench")  # connected, warm
    start.wait()  # type: ignore[attr-defined]
    for i in range(count):
        audit_event_record(
            source="agent", mcp_id="bench", tool="search_employee", call_id=f"{tag or mode}:{i}", args=PAYLOAD_ARGS,
            result=PAYLOAD_RESULT, latency_ms=2.5, actor="bench",
        )  # fmt: skip
    connections.close_all()
    done.put(count)  # type: ignore[attr-defined]


def measure_concurrent(writers: int, events: int) -> dict[str, float]:
    """Events per second with ``writers`` processes appending at once, inline against deferred, in one run."""
    import multiprocessing

    from django.db import connections

    from audit.models import AuditEvent
    from audit.services import audit_chain_pending, chain_lag

    context = multiprocessing.get_context("fork")
    per_writer = max(1, events // writers)
    figures: dict[str, float] = {}
    for mode in ("inline", "deferred"):
        connections.close_all()
        start, done = context.Barrier(writers + 1), context.Queue()
        tag = f"{mode}-{time.time_ns()}"  # this run's events, whatever the database held before
        processes = [
            context.Process(target=_concurrent_writer, args=(mode, per_writer, start, done, tag))
            for _ in range(writers)
        ]
        for process in processes:
            process.start()
        connections.close_all()
        start.wait()
        started = time.perf_counter()
        written = sum(done.get(timeout=600) for _ in processes)
        for process in processes:
            process.join()
        audit_chain_pending()  # what a writer killed after its commit would leave (none here): the lag to 0
        seconds = time.perf_counter() - started
        assert chain_lag().count == 0
        chained = AuditEvent.objects.filter(call_id__startswith=f"{tag}:").count()
        assert chained == written, (chained, written)
        figures[f"{mode}_{writers}_writers_events_per_second"] = written / seconds
    figures[f"deferred_vs_inline_{writers}_writers_ratio"] = (
        figures[f"deferred_{writers}_writers_events_per_second"]
        / figures[f"inline_{writers}_writers_events_per_second"]
    )
    return figures


def seed_chain(until: int, batch: int = 5000) -> None:
    """Append hashed events in bulk until the chain has ``until`` events (as the service would write them)."""
    from django.db import transaction
    from django.utils import timezone

    from audit.chain import event_hash, head_message
    from audit.chain_keys import chain_keyring
    from audit.masking import mask_value
    from audit.models import AuditChainHead, AuditEvent

    keyring = chain_keyring()
    head = AuditChainHead.objects.get()
    seq, prev_hash = head.seq, head.hash
    args = mask_value(PAYLOAD_ARGS)
    while seq < until:
        rows = []
        for _ in range(min(batch, until - seq)):
            seq += 1
            fields = {
                "seq": seq, "prev_hash": prev_hash, "created_at": timezone.now(), "run_id": None, "source": "agent",
                "action": "tool.call", "mcp_id": "bench", "tool": "search_employee", "call_id": f"s{seq}",
                "args": args, "result": PAYLOAD_RESULT, "ok": True, "reason": "", "attempt": 1, "latency_ms": 2.5,
                "actor": "bench",
            }  # fmt: skip
            fields["hash"] = prev_hash = event_hash(fields)
            fields["mac"] = keyring.sign("event", prev_hash)
            rows.append(AuditEvent(**fields))
        with transaction.atomic():
            AuditEvent.objects.bulk_create(rows)
            head_mac = keyring.sign("head", head_message(seq, prev_hash))
            AuditChainHead.objects.filter(pk=1).update(seq=seq, hash=prev_hash, mac=head_mac)


def measure_verify(events: int) -> dict[str, float]:
    from django.core.management import call_command

    import audit.verification

    seed_chain(until=events)  # no-op past it: the chain already holds the events written above

    def timed(*options: str) -> tuple[int, float]:
        out = io.StringIO()
        started = time.perf_counter()
        call_command("verify_audit", *options, stdout=out, stderr=io.StringIO())
        seconds = time.perf_counter() - started
        return int(out.getvalue().strip().splitlines()[-1].split()[1]), seconds

    fast_vendors = audit.verification._RAW_VENDORS
    audit.verification._RAW_VENDORS = ()  # the events read through the ORM, as before the raw path
    try:
        verified, orm_seconds = timed("--workers", "0")
    finally:
        audit.verification._RAW_VENDORS = fast_vendors
    verified, alone_seconds = timed("--workers", "0")  # the verifier alone, in the command's own process
    # As ``manage.py verify_audit`` runs by default (one worker process per core, up to 8, each a segment of the
    # chain): asked for explicitly, as this process runs threads (the chainer's), where the default is none.
    workers = min(os.cpu_count() or 1, audit.verification._AUTO_WORKERS)
    verified, seconds = timed("--workers", str(workers))
    return {
        "verify_events": verified,
        "verify_orm_events_per_second": verified / orm_seconds,
        "verify_one_process_events_per_second": verified / alone_seconds,
        "verify_workers": workers,
        "verify_seconds": seconds,
        "verify_events_per_second": verified / seconds,
    }


def print_figures(figures: dict[str, float], prefix: str = "") -> None:
    for name, value in figures.items():
        shown = f"{value:.3f}" if isinstance(value, float) and value < 100 else f"{value:.0f}"
        print(f"{prefix}{name}: {shown}", flush=True)


def run_on_this_database(options: argparse.Namespace, *, keep_database_url: bool) -> dict[str, dict[str, float]]:
    from bench._django import setup_django

    setup_django(keep_database_url=keep_database_url)
    from django.db import connection

    print(f"{connection.vendor}: {options.events} events each way…", file=sys.stderr)
    writes = measure_writes(options.events)
    concurrent: dict[str, float] = {}
    if options.writers > 0:
        print(f"{connection.vendor}: {options.writers} writers at once, inline then deferred…", file=sys.stderr)
        concurrent = measure_concurrent(options.writers, options.concurrent_events)
    print(f"{connection.vendor}: verifying {options.verify_events} events…", file=sys.stderr)
    return {"writes": writes, "concurrent": concurrent, "verify": measure_verify(options.verify_events)}


def run_postgres(options: argparse.Namespace) -> list[str]:
    """The same measurements on PostgreSQL, in a child process (settings pick the database at start); printed as
    they come, and returned (``name: value`` lines, prefixed ``postgres_``)."""
    from tests.postgres import PostgresMissing, private_postgres

    command = [sys.executable, "-m", "bench.audit", "--child", "--events", str(options.events)]
    command += ["--verify-events", str(options.verify_events), "--writers", str(options.writers)]
    command += ["--concurrent-events", str(options.concurrent_events)]
    lines: list[str] = []

    def child(url: str) -> None:
        env = {**os.environ, "DATABASE_URL": url}
        done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, check=False)
        sys.stderr.write(done.stderr)
        if done.returncode != 0:
            raise SystemExit(f"the PostgreSQL run failed ({done.returncode})")
        for line in done.stdout.splitlines():
            lines.append(f"postgres_{line}")
            print(lines[-1], flush=True)

    if os.environ.get("DATABASE_URL"):
        child(os.environ["DATABASE_URL"])
        return lines
    try:
        with private_postgres(durable=True) as url:
            child(url)
    except PostgresMissing as exc:
        print(f"postgres: skipped ({exc})", file=sys.stderr)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=positive_int, default=2000, help="events written each way (default 2000)")
    parser.add_argument(
        "--verify-events",
        type=positive_int,
        default=100_000,
        help="chain length verified (default 100000, at least 20000)",
    )
    parser.add_argument(
        "--writers", type=non_negative_int, default=8, help="concurrent writer processes (default 8; 0: skip)"
    )
    parser.add_argument(
        "--concurrent-events",
        type=positive_int,
        default=8000,
        help="events written by the writers in all (default 8000)",
    )
    parser.add_argument("--no-postgres", action="store_true", help="SQLite only")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args()
    options.verify_events = max(20_000, options.verify_events)  # verify_audit's rate means little on fewer

    if options.child:  # run by run_postgres with DATABASE_URL set
        figures = run_on_this_database(options, keep_database_url=True)
        print_figures(figures["writes"])
        print_figures(figures["concurrent"])
        print_figures(figures["verify"])
        return
    postgres = [] if options.no_postgres else run_postgres(options)
    figures = run_on_this_database(options, keep_database_url=False)
    print_figures(figures["writes"], prefix="sqlite_")
    print_figures(figures["concurrent"], prefix="sqlite_")
    print_figures(figures["verify"], prefix="sqlite_")
    # The headline, last: eight PostgreSQL writers with the deferred chain against the inline one, in this run
    # (SQLite's when PostgreSQL is not there); with ``--writers 0``, one writer's.
    if options.writers > 0:
        headline, part = f"deferred_vs_inline_{options.writers}_writers_ratio", "concurrent"
    else:
        headline, part = "deferred_vs_inline_1_writer_ratio", "writes"
    found = [line for line in postgres if line.startswith(f"postgres_{headline}:")]
    if found:
        print(found[-1], flush=True)
    elif headline in figures[part]:
        print_figures({headline: figures[part][headline]}, prefix="sqlite_")


if __name__ == "__main__":
    main()
