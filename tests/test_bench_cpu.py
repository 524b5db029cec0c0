"""``bench/_cpu.py``: the CPU a benchmark's window cost, per part of the platform, read from ``/proc``: each process
is put in its part by its command line, and a process that works inside the window is counted in its part."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

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


@pytest.mark.slow
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


def _fake_proc(root: Any, processes: dict[int, tuple[int, int, str, float]], busy_ticks: int) -> None:
    """A /proc of ``pid → (ppid, start time, command line, CPU seconds)`` and a machine busy so many ticks."""
    ticks = os.sysconf("SC_CLK_TCK")
    for path in list(root.iterdir()):
        if path.is_dir():
            for f in path.iterdir():
                f.unlink()
            path.rmdir()
    (root / "stat").write_text(f"cpu {busy_ticks} 0 0 1000 0 0 0 0 0 0\n")
    for pid, (ppid, started, argv, seconds) in processes.items():
        folder = root / str(pid)
        folder.mkdir()
        cpu = int(seconds * ticks)
        fields = ["S", str(ppid), *["0"] * 9, str(cpu), "0", *["0"] * 6, str(started)]
        (folder / "stat").write_text(f"{pid} (x) {' '.join(fields)}\n")
        (folder / "cmdline").write_bytes(argv.replace(" ", "\0").encode())


def test_a_process_re_parented_inside_the_window_stays_the_benchmarks(tmp_path: Any, monkeypatch: Any) -> None:
    """A worker's MCP server whose pool process ended is re-parented (to init): it is still the benchmark's,
    counted from where it was at the window's start, not charged its whole life as outside."""
    import bench._cpu as cpu

    monkeypatch.setattr(cpu, "_PROC", tmp_path)
    ticks = os.sysconf("SC_CLK_TCK")
    _fake_proc(tmp_path, {100: (1, 10, "bench", 1.0), 200: (100, 20, "python -m celery", 5.0),
                          300: (200, 30, "python -m mcpregistry.demo_server", 50.0)}, 0)  # fmt: skip
    window = cpu.CpuWindow(client_pid=100)
    window.start()
    _fake_proc(tmp_path, {100: (1, 10, "bench", 1.5), 300: (1, 30, "python -m mcpregistry.demo_server", 51.0)},
               int(3 * ticks))  # fmt: skip
    spent = window.stop()
    assert spent["mcp_servers"] == pytest.approx(1.0) and spent["outside"] == 0.0, spent
    assert spent["client"] == pytest.approx(0.5), spent


def test_a_pid_taken_again_inside_the_window_is_counted_from_its_start(tmp_path: Any, monkeypatch: Any) -> None:
    import bench._cpu as cpu

    monkeypatch.setattr(cpu, "_PROC", tmp_path)
    _fake_proc(tmp_path, {100: (1, 10, "bench", 1.0), 200: (100, 20, "python -m celery", 40.0)}, 0)
    window = cpu.CpuWindow(client_pid=100)
    window.start()
    # 200 ended; another process got its pid: started later, 2 s of CPU so far, all inside the window.
    _fake_proc(tmp_path, {100: (1, 10, "bench", 1.0), 200: (100, 90, "python -m gunicorn", 2.0)}, 500)
    spent = window.stop()
    assert spent["web"] == pytest.approx(2.0) and spent["workers"] == 0.0, spent


def test_a_cycle_of_parents_ends(tmp_path: Any, monkeypatch: Any) -> None:
    """Pids reused between the reads of one sweep can make a loop of parents: it is nobody's, and it ends."""
    import bench._cpu as cpu

    monkeypatch.setattr(cpu, "_PROC", tmp_path)
    _fake_proc(tmp_path, {100: (1, 10, "bench", 1.0), 400: (500, 40, "a", 1.0), 500: (400, 50, "b", 1.0)}, 0)
    snapshot = cpu._processes(100)
    assert snapshot[400][0] == snapshot[500][0] == "outside"
