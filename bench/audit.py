"""What the audit hash chain costs: writes per second with it against the same inserts without it, and how fast
``verify_audit`` walks a long chain.

Run from the repo root: ``python -m bench.audit [--events N] [--verify-events N] [--no-postgres]``.

* ``chain``: ``audit_event_record`` as the gate calls it (masking, truncation, the chain head locked, its MAC
  checked and moved, the hash and its MAC), one event per transaction.
* ``plain``: the same masked event inserted with ``AuditEvent.objects.create`` and no chain work (a placeholder
  negative ``seq``, no head, no hash): what writing an event cost before the chain. The two alternate in
  rounds in the same run, so both see the same machine; the plain rows are deleted before verifying.
* ``verify``: the chain is topped up to ``--verify-events`` events (hashed, MAC'd and bulk-inserted, as the chain
  would have written them) and ``verify_audit`` (hashes, MACs, links) is timed over all of them. Target: 100,000
  events in under 10 s.

Both on a throwaway SQLite database and on PostgreSQL: ``DATABASE_URL`` if set (it must be a throwaway
database: the benchmark writes to it), else a private cluster started as the tests do (``tests/postgres.py``,
durable settings: fsync and synchronous commit on). The last line is ``verify_events_per_second`` on SQLite.
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PAYLOAD_ARGS = {"name": "김하늘", "api_key": "sk-live-abcdefgh12345678"}
PAYLOAD_RESULT = {
    "employees": [
        {"name": "김하늘", "team": "클라우드운영팀", "title": "팀장", "email": "haneul.kim@example.com", "level": 4.0},
        {"name": "이도윤", "team": "클라우드운영팀", "title": "매니저", "email": "doyun.lee@example.com", "level": 3.5},
    ]
}


def measure_writes(events: int, rounds: int = 10) -> dict[str, float]:
    """Events per second with and without the chain, alternating in rounds."""
    from django.conf import settings
    from django.db import connection, transaction

    from audit.append_only import archive_delete_allow, archive_delete_end
    from audit.masking import mask_value, truncate
    from audit.models import AuditEvent
    from audit.services import audit_event_record

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

    chain_write(-1)  # warm: connection, masking caches
    plain_write(-1)
    spent = {"chain": 0.0, "plain": 0.0}
    per_round = max(1, events // rounds)
    for _ in range(rounds):
        for name, write in (("chain", chain_write), ("plain", plain_write)):
            started = time.perf_counter()
            for i in range(per_round):
                write(i)
            spent[name] += time.perf_counter() - started
    with transaction.atomic(), connection.cursor() as cursor:  # the plain rows are not part of the chain
        archive_delete_allow(cursor, connection)  # past the append-only triggers, as archive_audit gets
        cursor.execute("DELETE FROM audit_auditevent WHERE seq < 0")
        archive_delete_end(cursor, connection)
    total = per_round * rounds
    chain_eps, plain_eps = total / spent["chain"], total / spent["plain"]
    return {
        "chain_events_per_second": chain_eps,
        "plain_events_per_second": plain_eps,
        "chain_vs_plain_ratio": chain_eps / plain_eps,
        "chain_added_ms_per_event": (spent["chain"] - spent["plain"]) / total * 1000,
    }


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

    seed_chain(until=events)  # no-op past it: the chain already holds the events written above
    out = io.StringIO()
    started = time.perf_counter()
    call_command("verify_audit", stdout=out, stderr=io.StringIO())
    seconds = time.perf_counter() - started
    verified = int(out.getvalue().strip().splitlines()[-1].split()[1])
    return {"verify_events": verified, "verify_seconds": seconds, "verify_events_per_second": verified / seconds}


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
    print(f"{connection.vendor}: verifying {options.verify_events} events…", file=sys.stderr)
    return {"writes": writes, "verify": measure_verify(options.verify_events)}


def run_postgres(options: argparse.Namespace) -> None:
    """The same measurements on PostgreSQL, in a child process (settings pick the database at start)."""
    from tests.postgres import PostgresMissing, private_postgres

    command = [sys.executable, "-m", "bench.audit", "--child", "--events", str(options.events)]
    command += ["--verify-events", str(options.verify_events)]

    def child(url: str) -> None:
        env = {**os.environ, "DATABASE_URL": url}
        done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, check=False)
        sys.stderr.write(done.stderr)
        if done.returncode != 0:
            raise SystemExit(f"the PostgreSQL run failed ({done.returncode})")
        for line in done.stdout.splitlines():
            print(f"postgres_{line}", flush=True)

    if os.environ.get("DATABASE_URL"):
        child(os.environ["DATABASE_URL"])
        return
    try:
        with private_postgres(durable=True) as url:
            child(url)
    except PostgresMissing as exc:
        print(f"postgres: skipped ({exc})", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=2000, help="events written each way (default 2000)")
    parser.add_argument("--verify-events", type=int, default=100_000, help="chain length verified (default 100000)")
    parser.add_argument("--no-postgres", action="store_true", help="SQLite only")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args()

    if options.child:  # run by run_postgres with DATABASE_URL set
        figures = run_on_this_database(options, keep_database_url=True)
        print_figures(figures["writes"])
        print_figures(figures["verify"])
        return
    if not options.no_postgres:
        run_postgres(options)
    figures = run_on_this_database(options, keep_database_url=False)
    print_figures(figures["writes"], prefix="sqlite_")
    print_figures(figures["verify"])  # the last line: verify_events_per_second on SQLite


if __name__ == "__main__":
    main()
