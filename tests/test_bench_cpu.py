"""``bench/_cpu.py``: the CPU a benchmark's window cost, per part of the platform, read from ``/proc``: each process
is put in its part by its command line, and a process that works inside the window is counted in its part."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from bench._cpu import PARTS, CpuWindow, part_of

pytestmark = pytest.mark.skipif(not CpuWindow.available(), reason="no /proc here")

ME = os.getpid()


@pytest.mark.parametrize(
    ("argv", "part"),
    [
        (["/usr/bin/redis-server", "127.0.0.1:6379"], "redis"),
        (["/usr/lib/postgresql/15/bin/postgres", "-D", "/tmp/pg/data"], "postgres"),
        (["postgres: postgres bench 127.0.0.1(50412) idle"], "postgres"),
        ([sys.executable, "-m", "mcpregistry.demo_server"], "mcp_servers"),
        (["/venv/bin/mcp-server-time"], "mcp_servers"),
        ([sys.executable, "-m", "celery", "-A", "agent_platform", "worker", "--concurrency=1"], "workers"),
        ([sys.executable, "-m", "gunicorn", "agent_platform.wsgi:application"], "web"),
        ([sys.executable, "-m", "uvicorn", "agent_platform.asgi:application"], "web"),
        (["/usr/bin/bash"], "other"),
        ([], "other"),
    ],
)
def test_a_process_is_put_in_its_part_by_its_command_line(argv: list[str], part: str) -> None:
    assert part_of(argv, pid=ME + 1, client_pid=ME) == part


def test_the_benchmark_itself_is_the_client_whatever_its_command_line() -> None:
    assert part_of([sys.executable, "-m", "celery"], pid=ME, client_pid=ME) == "client"


def test_a_process_that_works_inside_the_window_is_counted_in_its_part() -> None:
    window = CpuWindow()
    window.start()
    # A stand-in "worker" started inside the window (its command line names celery), busy for about 0.4 s of CPU.
    # It stays until its input closes, so that it is still there when the window ends.
    busy = "import sys, time\nend = time.process_time() + 0.4\nwhile time.process_time() < end: pass\nsys.stdin.read()"
    worker = subprocess.Popen([sys.executable, "-c", busy, "celery"], stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not _spent_enough(worker.pid):
            time.sleep(0.05)
        spent = window.stop()
    finally:
        worker.communicate(timeout=30)

    assert set(spent) == {*PARTS, "machine", "unaccounted"}
    assert spent["workers"] >= 0.3, spent
    assert spent["machine"] >= spent["workers"] * 0.9, spent
    assert all(spent[part] >= 0 for part in PARTS), spent


def _spent_enough(pid: int) -> bool:
    """Whether the process has used 0.35 s of CPU."""
    try:
        stat = open(f"/proc/{pid}/stat").read()  # noqa: SIM115 - one read of a /proc file
    except OSError:
        return True
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK") >= 0.35
