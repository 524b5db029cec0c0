"""Where the machine's CPU went while a benchmark ran: per part of the platform, read from ``/proc`` (Linux).

A benchmark that runs the whole platform on one machine (``bench.load``) shares that machine's cores between its
own clients, the web server, the workers, the MCP servers they start, Redis and PostgreSQL. Its rate is bounded by
``cores / CPU seconds per run`` whatever the platform does with its share, so the benchmark reports each part's
CPU per run beside the rate: which part to make cheaper, and what rate this machine can give at all.

Each of the benchmark's processes (the benchmark itself, what it started, and what those started: its
descendants, plus the ``roots`` it names, such as a PostgreSQL server that detached) is put in one part by its
command line (:func:`part_of`). Every other process on the machine (another session's web server or worker, a
test suite) is ``outside``: it is not the platform's cost, whatever its command line says. CPU time (user and
system, the kernel's ``utime`` and ``stime``) is counted from the window's start or, for a process started inside
it, from its own start. A process that ended inside the window is not counted (a killed worker's last moments):
the difference between the machine's busy time (``/proc/stat``) and the sum of the parts is ``unaccounted``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

PARTS = ("client", "web", "workers", "mcp_servers", "redis", "postgres", "other", "outside")
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PROC = Path("/proc")


def part_of(argv: list[str], *, pid: int, client_pid: int) -> str:
    """The part a process belongs to, from its arguments (``/proc/<pid>/cmdline``)."""
    if pid == client_pid:
        return "client"
    if not argv:
        return "other"
    program = Path(argv[0]).name
    words = " ".join(argv)
    if program.startswith("redis-server"):
        return "redis"
    if program in ("postgres", "postmaster") or words.startswith("postgres:"):
        return "postgres"
    if "demo_server" in words or "mcp_server" in words or "mcp-server" in words:
        return "mcp_servers"  # before the workers: a worker's MCP servers are its children, not the worker
    if "celery" in words:
        return "workers"
    if "gunicorn" in words or "uvicorn" in words or "runserver" in words:
        return "web"
    return "other"


def _read(entry: Path) -> tuple[int, int, list[str], float] | None:
    """(parent pid, start time, arguments, CPU seconds so far) of one ``/proc/<pid>``; None when it ended while
    read."""
    try:
        stat = (entry / "stat").read_text()
        argv = [arg for arg in (entry / "cmdline").read_bytes().decode(errors="replace").split("\0") if arg]
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": the comm may hold spaces
    seconds = (int(fields[11]) + int(fields[12])) / _TICKS  # utime + stime
    return int(fields[1]), int(fields[19]), argv, seconds  # ppid, starttime (clock ticks after boot)


Snapshot = dict[int, tuple[str, int, float]]
"""pid → (part, start time, CPU seconds so far)."""


def _processes(client_pid: int, roots: frozenset[int] = frozenset(), known: Snapshot | None = None) -> Snapshot:
    """Every process now: pid → (part, start time, CPU seconds so far); ``outside`` for a process that descends
    neither from the benchmark nor from one of its ``roots``. A process ``known`` from an earlier snapshot (the
    same pid and start time) keeps its part there: a process re-parented since (its parent ended) is still the
    benchmark's. Processes that end while being read are skipped."""
    read: dict[int, tuple[int, int, list[str], float]] = {}
    for entry in _PROC.iterdir():
        if entry.name.isdigit() and (found := _read(entry)) is not None:
            read[int(entry.name)] = found
    own_roots = roots | {client_pid}
    own: dict[int, bool] = {}

    def is_own(pid: int) -> bool:
        chain: list[int] = []
        seen: set[int] = set()
        while pid not in own:
            if pid in own_roots:
                own[pid] = True
                break
            if pid not in read or pid <= 1 or pid in seen:  # the top, or a cycle (pids reused while read)
                own[pid] = False
                break
            seen.add(pid)
            chain.append(pid)
            pid = read[pid][0]
        for link in chain:
            own[link] = own[pid]
        return own[pid]

    snapshot: Snapshot = {}
    for pid, (_ppid, started, argv, seconds) in read.items():
        earlier = (known or {}).get(pid)
        if earlier is not None and earlier[1] == started:
            part = earlier[0]
        else:
            part = part_of(argv, pid=pid, client_pid=client_pid) if is_own(pid) else "outside"
        snapshot[pid] = (part, started, seconds)
    return snapshot


def pids_with(program: str, *words: str) -> frozenset[int]:
    """The processes running ``program`` with ``words`` in a row among their arguments (a detached server the
    benchmark started, found by its port: ``pids_with("postgres", "-p", "54321")``)."""
    found = set()
    for entry in _PROC.iterdir():
        if not entry.name.isdigit() or (read := _read(entry)) is None:
            continue
        argv = read[2]
        named = bool(argv) and Path(argv[0]).name == program
        if named and any(argv[i : i + len(words)] == list(words) for i in range(len(argv))):
            found.add(int(entry.name))
    return frozenset(found)


def _machine_busy() -> float:
    """CPU seconds the machine's cores spent busy so far (every state but idle and iowait)."""
    values = [int(value) for value in (_PROC / "stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    guests = sum(values[8:10]) if len(values) > 9 else 0  # guest time is counted in user time already
    return (sum(values) - idle - guests) / _TICKS


@dataclass
class CpuWindow:
    """CPU time spent between :meth:`start` and :meth:`stop`, per part (seconds)."""

    client_pid: int = field(default_factory=os.getpid)
    roots: frozenset[int] = frozenset()
    _start: Snapshot = field(default_factory=dict)
    _busy: float = 0.0

    @staticmethod
    def available() -> bool:
        return (_PROC / "stat").exists() and (_PROC / "self" / "stat").exists()

    def start(self) -> None:
        self._busy = _machine_busy()
        self._start = _processes(self.client_pid, self.roots)

    def stop(self) -> dict[str, float]:
        """Seconds per part, plus ``machine`` (the busy time of every core) and ``unaccounted`` (machine minus
        the parts: processes that ended inside the window, interrupts, rounding)."""
        busy = _machine_busy() - self._busy
        spent = dict.fromkeys(PARTS, 0.0)
        for pid, (part, started, seconds) in _processes(self.client_pid, self.roots, self._start).items():
            before = self._start.get(pid)
            if before is not None and before[1] != started:
                before = None  # the pid was taken again by a process started inside the window
            spent[part] += seconds - (before[2] if before is not None else 0.0)
        spent["machine"] = busy
        spent["unaccounted"] = busy - sum(spent[part] for part in PARTS)
        return spent
