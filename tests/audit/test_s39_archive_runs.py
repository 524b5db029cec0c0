"""``archive_audit`` runs that overlap or are interrupted (found in review): two runs at once picked the same events
and file, the later one overwrote the first's committed archive and its cleanup then removed it (events deleted,
file gone), or truncated the ``.partial`` the first was writing (the committed archive began with zeros); a run
killed after it named its file but before it committed left a file every rerun refused; the run recorded no event
of its own; ``verify_audit --archive-dir D`` did not say the file was not in D.

The overlapping runs are real processes on one database: one is paused at an exact point (a function of
``audit.archive`` wrapped in its ``manage.py shell``, which waits for a line on its stdin), the other runs whole.
"""

from __future__ import annotations

import gzip
import io
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from agent_platform.errors import ApplicationError
from audit.archive import ArchiveReport, _archive_commit, tool_call_figures_total
from audit.models import AuditCheckpoint, AuditEvent
from audit.services import audit_event_record
from tests.postgres import REPO, manage, platform_env, postgres_url  # noqa: F401 - postgres_url is a fixture

# A run of audit_events_archive whose function ``at`` of audit.archive waits for a line on stdin once it is reached
# (``after`` items into it, for a generator), saying "paused" first.
PAUSED_RUN = """
import sys
import audit.archive as archive
real = archive.{at}
def pause():
    print("paused", flush=True)
    sys.stdin.readline()
def paused(*args, **kwargs):
    pause()
    return real(*args, **kwargs)
def paused_after(*args, **kwargs):
    for n, item in enumerate(real(*args, **kwargs)):
        if n == {after}:
            pause()
        yield item
archive.{at} = paused_after if {after} else paused
report = archive.audit_events_archive(older_than_days=0, output={output!r})
print("archived", report.count, report.path, flush=True)
"""

WRITE_EVENTS = """
from audit.services import audit_chain_wait, audit_event_record
for i in range(30):
    audit_event_record(source="agent", mcp_id="demo", tool="s39", args={"i": i})
audit_chain_wait()
"""


def paused_run(at: str, output: Path, *, after: int = 0, **database: Any) -> subprocess.Popen[str]:
    """Start a run paused at ``at``; returns once it is paused there."""
    process = subprocess.Popen(
        [sys.executable, "manage.py", "shell", "-c", PAUSED_RUN.format(at=at, after=after, output=f"{output}/")],
        cwd=REPO,
        env=platform_env(**database),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    for line in process.stdout:
        if line.strip() == "paused":
            return process
    raise AssertionError(process.communicate())


def go_on(process: subprocess.Popen[str]) -> str:
    out, err = process.communicate("go\n", timeout=300)
    assert process.returncode == 0, out + err
    return out


def killed(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=60)


def last_line(ran: subprocess.CompletedProcess[str]) -> str:
    return (ran.stdout + ran.stderr).strip().splitlines()[-1]


def record(count: int) -> None:
    for i in range(count):
        audit_event_record(source="agent", mcp_id="demo", tool="s39", args={"i": i}, latency_ms=1.0)


def files(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.iterdir())


def assert_second_run_refused_and_first_kept(paused: subprocess.Popen[str], folder: Path, **database: Any) -> None:
    second = manage("archive_audit", "--older-than-days", "0", "--output", f"{folder}/", **database)

    assert second.returncode == 1, second.stdout
    assert last_line(second) == (
        "CommandError: Another archive_audit is running on this database; nothing was archived. Run it again when it "
        "has ended."
    )
    said = go_on(paused).strip().splitlines()[-1]
    assert said.startswith("archived ")
    (archive,) = folder.iterdir()
    assert said.endswith(str(archive))
    with gzip.open(archive) as lines:
        assert lines.read().startswith(b'{"action": ')  # an event's line first, not the zeros of a truncation
    verified = manage("verify_audit", **database)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert manage("verify_audit", "--archive", str(archive), **database).returncode == 0


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_second_run_while_one_runs_is_refused_and_the_first_archive_is_kept_on_sqlite(tmp_path: Path) -> None:
    record(30)
    database: dict[str, Any] = {"sqlite_path": connection.settings_dict["NAME"]}
    folder = tmp_path / "archives"
    paused = paused_run("_nonce_problem", folder, **database)  # the range and the file name chosen, not written

    assert_second_run_refused_and_first_kept(paused, folder, **database)
    assert AuditCheckpoint.objects.count() == 1


@pytest.mark.slow
@pytest.mark.postgres
def test_a_second_run_while_one_writes_is_refused_and_the_first_archive_is_whole_on_postgres(
    postgres_url: str,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    written = manage("shell", "-c", WRITE_EVENTS, database_url=postgres_url)
    assert written.returncode == 0, written.stderr
    folder = tmp_path / "archives"
    paused = paused_run("_events_as_stored", folder, after=10, database_url=postgres_url)  # its partial half written

    assert_second_run_refused_and_first_kept(paused, folder, database_url=postgres_url)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_run_killed_before_it_committed_leaves_no_archive_and_the_next_run_archives(tmp_path: Path) -> None:
    record(30)
    database: dict[str, Any] = {"sqlite_path": connection.settings_dict["NAME"]}
    folder = tmp_path / "archives"
    killed(paused_run("_archive_commit", folder, **database))  # the file written and synced

    assert files(folder) == ["audit-000000000001-000000000030.jsonl.gz.partial"]  # no archive without a checkpoint
    again = manage("archive_audit", "--older-than-days", "0", "--output", f"{folder}/", **database)

    assert again.returncode == 0, again.stdout + again.stderr
    assert f"removing {folder}/audit-000000000001-000000000030.jsonl.gz.partial, left by an archive_audit run" in (
        again.stderr
    )
    assert files(folder) == ["audit-000000000001-000000000030.jsonl.gz"]
    assert manage("verify_audit", **database).returncode == 0


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_run_killed_after_it_committed_has_its_archive_named_by_the_next_run(tmp_path: Path) -> None:
    record(30)
    database: dict[str, Any] = {"sqlite_path": connection.settings_dict["NAME"]}
    folder = tmp_path / "archives"
    killed(paused_run("_archive_publish", folder, **database))
    archive = folder / "audit-000000000001-000000000030.jsonl.gz"
    assert AuditCheckpoint.objects.get().file_name == str(archive)
    assert files(folder) == [f"{archive.name}.partial"]

    again = manage("archive_audit", "--older-than-days", "0", "--output", f"{folder}/", **database)

    assert again.returncode == 0, again.stdout + again.stderr
    assert f"naming {archive}: the archive_audit run that committed it was interrupted" in again.stderr
    assert files(folder) == [archive.name]  # seq 31, the first's own event, alone is nothing to archive
    verified = manage("verify_audit", **database)
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_an_archive_records_its_own_event_which_stays_and_is_no_tool_call(db: Any, tmp_path: Path) -> None:
    record(5)
    archive = tmp_path / "a.jsonl.gz"
    calls_before = sum(tool_call_figures_total().calls.values())

    call_command("archive_audit", "--older-than-days", "0", "--output", str(archive), stdout=io.StringIO())

    (event,) = AuditEvent.objects.all()
    checkpoint = AuditCheckpoint.objects.get()
    assert (event.seq, event.action, event.actor, event.source, event.prev_hash) == (
        6,
        "audit.archive",
        "system:archive_audit",
        "admin",
        checkpoint.hash,
    )
    assert event.args == {"first_seq": 1, "last_seq": 5, "count": 5, "file": str(archive), "hash": checkpoint.hash}
    assert sum(tool_call_figures_total().calls.values()) == calls_before == 5
    out = io.StringIO()
    call_command("verify_audit", stdout=out)
    assert out.getvalue().strip().splitlines()[-1] == f"verified 1 events, head {event.hash}"


def test_a_commit_after_another_archive_committed_is_refused_and_deletes_nothing(db: Any, tmp_path: Path) -> None:
    record(5)
    call_command(
        "archive_audit", "--older-than-days", "0", "--output", str(tmp_path / "a.jsonl.gz"), stdout=io.StringIO()
    )
    event = AuditEvent.objects.get()
    stale = ArchiveReport(count=6, first_seq=1, last_seq=6, hash=event.hash, path=tmp_path / "b.jsonl.gz")

    with pytest.raises(ApplicationError) as refused:
        _archive_commit(stale, start_seq=0)

    assert refused.value.message == (
        "Another archive committed while this one ran (the latest checkpoint is seq 5, this run started after seq 0); "
        "nothing was deleted."
    )
    assert list(AuditEvent.objects.values_list("seq", flat=True)) == [6]
    assert AuditCheckpoint.objects.count() == 1


def test_verify_audit_says_an_archive_is_not_in_the_archive_dir_given(db: Any, tmp_path: Path) -> None:
    record(3)
    (tmp_path / "elsewhere").mkdir()
    call_command(
        "archive_audit", "--older-than-days", "0", "--output", str(tmp_path / "a.jsonl.gz"), stdout=io.StringIO()
    )

    with pytest.raises(CommandError) as failed:
        call_command("verify_audit", "--archive-dir", str(tmp_path / "elsewhere"), stdout=io.StringIO())

    assert str(failed.value).endswith(
        f"archive checkpoint seq 3: its archive file a.jsonl.gz is not in {tmp_path / 'elsewhere'} (--archive-dir)"
    )


def test_archives_of_nothing_but_archives_own_events_archive_nothing(db: Any, tmp_path: Path) -> None:
    """``--older-than-days 0`` run again and again archived the previous run's own event each time, never
    "nothing to archive"."""
    from audit.archive import audit_events_archive
    from audit.services import audit_event_record

    audit_event_record(source="agent", mcp_id="m", tool="t", args={}, result="r", ok=True)
    assert audit_events_archive(older_than_days=0, output=tmp_path / "a.jsonl.gz").count == 1
    again = audit_events_archive(older_than_days=0, output=tmp_path / "b.jsonl.gz")
    assert again.count == 0 and not (tmp_path / "b.jsonl.gz").exists()


def test_a_folder_without_hard_links_still_gets_its_archive_named(
    db: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """exFAT and some network mounts make no hard links: the archive was left ``.partial`` after its events were
    deleted, and every later run was refused."""
    import errno
    import os

    from audit.archive import audit_events_archive
    from audit.services import audit_event_record

    def no_links(*_args: object, **_kwargs: object) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    audit_event_record(source="agent", mcp_id="m", tool="t", args={}, result="r", ok=True)
    report = audit_events_archive(older_than_days=0, output=tmp_path / "a.jsonl.gz")
    assert report.path == (tmp_path / "a.jsonl.gz").resolve() and report.path.is_file()
    assert not list(tmp_path.glob("*.partial"))
    audit_event_record(source="agent", mcp_id="m", tool="t", args={}, result="r", ok=True)
    assert audit_events_archive(older_than_days=0, output=tmp_path / "b.jsonl.gz").count == 2
