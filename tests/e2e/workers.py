"""The platform as an operator starts it, with its Celery workers under the caller's control: start one, kill
one (the whole machine: the worker, its pool processes and the MCP servers they started, with SIGKILL), kill
only a pool process, stop one. Used by the worker-loss tests and the load benchmark (``bench/load.py``).

Like ``tests.e2e.harness.running_platform``: migrated, seeded, a key issued, a web server, all on their own
SQLite file (a copy of the session's seeded one, ``harness.seeded``) and broker; the web server here is
``runserver`` (as in the harness), uvicorn (ASGI, as ``bin/up`` runs it) or gunicorn with threads (WSGI)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx

from tests.e2e.harness import ROOT, _stop, _stop_together, free_port, manage_in, seed_from_scratch, seeded, wait_until


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, their children, …), from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            parents.setdefault(ppid, []).append(int(entry.name))
    found: list[int] = []
    queue = [pid]
    while queue:
        for child in parents.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


def children(pid: int) -> list[int]:
    with contextlib.suppress(OSError):
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    return []


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@dataclass
class Worker:
    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def wait_ready(self, timeout: float = 60) -> None:
        wait_until(
            lambda: b" ready." in self.log.read_bytes() or self.process.poll() is not None,
            timeout=timeout,
            what=f"worker {self.name}",
        )
        assert self.process.poll() is None, f"worker {self.name} exited:\n{self.log.read_text(errors='replace')}"

    def pool_processes(self) -> list[int]:
        """The prefork pool's processes (the main process's children)."""
        return children(self.process.pid)

    def kill(self) -> None:
        """SIGKILL to the worker and everything it started (its pool processes, their MCP servers, which run in
        sessions of their own): what losing the machine looks like."""
        _kill([self.process.pid, *descendants(self.process.pid)])
        self.process.wait(timeout=10)

    def kill_pool_process(self) -> int:
        """SIGKILL to the pool process (and the MCP servers it started), as the OOM killer would: the main
        process survives, notices, and starts another pool process."""
        [pool_pid] = self.pool_processes()
        _kill([pool_pid, *descendants(pool_pid)])
        return pool_pid

    def stop(self) -> None:
        if self.process.poll() is None:
            _stop(self.process)


@dataclass
class Platform:
    workdir: Path
    env: dict[str, str]
    base_url: str
    api_key: str
    db_path: Path
    logs: Path
    workers: list[Worker] = field(default_factory=list)

    def client(self, **kwargs: Any) -> httpx.Client:
        options: dict[str, Any] = {"timeout": 30, **kwargs}
        return httpx.Client(base_url=self.base_url, headers={"Authorization": f"Bearer {self.api_key}"}, **options)

    def manage(self, *args: str, env: dict[str, str] | None = None) -> str:
        return manage_in({**self.env, **(env or {})}, *args)

    def import_config(self, document: dict[str, Any]) -> None:
        path = self.workdir / f"config-{len(list(self.workdir.glob('config-*.json')))}.json"
        path.write_text(json.dumps(document, ensure_ascii=False), encoding="utf-8")
        self.manage("import_config", str(path))

    def start_worker(
        self,
        name: str,
        *,
        concurrency: int = 1,
        env: dict[str, str] | None = None,
        wait: bool = True,
        queues: str = "",
        args: tuple[str, ...] = (),
    ) -> Worker:
        """``queues``: the Celery queues it consumes (``-Q``), e.g. ``shadow``; empty: the default queue.
        ``args``: more options of ``celery worker`` (e.g. ``--include=<module>``)."""
        log = self.logs / f"worker-{name}.log"
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "agent_platform",
                "worker",
                f"--concurrency={concurrency}",
                "--loglevel=INFO",
                "--without-gossip",
                "--without-mingle",
                f"--hostname={name}@%h",
                *([f"--queues={queues}"] if queues else []),
                *args,
            ],
            cwd=ROOT,
            env={**self.env, **(env or {})},
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        worker = Worker(name=name, process=process, log=log)
        self.workers.append(worker)
        if wait:
            worker.wait_ready()
        return worker

    def query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        with contextlib.closing(sqlite3.connect(self.db_path, timeout=30)) as db:
            return db.execute(sql, params).fetchall()

    def run_row(self, run_id: str) -> dict[str, Any]:
        with contextlib.closing(sqlite3.connect(self.db_path, timeout=30)) as db:
            db.row_factory = sqlite3.Row
            row = db.execute("SELECT * FROM agents_run WHERE id = ?", (run_id.replace("-", ""),)).fetchone()
        assert row is not None, f"no run {run_id}"
        return dict(row)

    def run_events(self, run_id: str, kind: str | None = None) -> list[dict[str, Any]]:
        rows = self.query(
            "SELECT kind, data FROM agents_runevent WHERE run_id = ? ORDER BY seq", run_id.replace("-", "")
        )
        return [{"kind": k, **json.loads(d)} for k, d in rows if kind is None or k == kind]

    def audit(self, run_id: str) -> list[tuple[str, str, int, int]]:
        """(action, tool, ok, attempt) of the run's audit events, in order."""
        return [
            (a, t, int(o), int(n))
            for a, t, o, n in self.query(
                "SELECT action, tool, ok, attempt FROM audit_auditevent WHERE run_id = ? ORDER BY id",
                run_id.replace("-", ""),
            )
        ]


@contextlib.contextmanager
def platform_without_workers(
    workdir: Path,
    *,
    broker_url: str,
    database_url: str = "",
    env: dict[str, str] | None = None,
    web: Literal["runserver", "uvicorn", "gunicorn"] = "runserver",
    web_processes: int = 1,
) -> Iterator[Platform]:
    """Migrate, seed, issue a key, start the web server; the caller starts workers (all stopped at the end).
    The database is a SQLite file in ``workdir`` (``Platform.query`` reads it), or ``database_url``."""
    base_env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "CELERY_BROKER_URL", "REDIS_URL"}}
    base_env.update(
        PLATFORM_VAR_DIR=str(workdir / "var"),
        SQLITE_PATH=str(workdir / "db.sqlite3"),
        DJANGO_SETTINGS_MODULE="agent_platform.settings",
        DEMO_ADMIN_PASSWORD="e2e-admin-password",
        PYTHONUNBUFFERED="1",
        CELERY_BROKER_URL=broker_url,
        **(env or {}),
    )
    if database_url:
        base_env["DATABASE_URL"] = database_url
    if web == "gunicorn":
        # Threads that serve request after request keep their database connection, as the README advises for a
        # threaded WSGI server (opening one per request costs more than the request's own queries).
        base_env.setdefault("DB_CONN_MAX_AGE", "60")
    logs = workdir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    platform = Platform(
        workdir=workdir, env=base_env, base_url="", api_key="", db_path=workdir / "db.sqlite3", logs=logs
    )
    # PostgreSQL: its own database, seeded; SQLite: a copy of the session's seeded database and its keys.
    platform.api_key = seed_from_scratch(base_env) if database_url else seeded(base_env, extra=env)
    port = free_port()
    if web == "uvicorn":
        command = [
            sys.executable,
            "-m",
            "uvicorn",
            "agent_platform.asgi:application",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            str(web_processes),
            "--log-level",
            "warning",
        ]
    elif web == "gunicorn":
        # WSGI with threads: the API's views are synchronous, and under ASGI they take turns on one thread.
        command = [
            sys.executable,
            "-m",
            "gunicorn",
            "agent_platform.wsgi:application",
            f"--bind=127.0.0.1:{port}",
            f"--workers={web_processes}",
            "--worker-class=gthread",
            "--threads=16",
            "--backlog=2048",
        ]
    else:
        command = [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"]
    web_process = subprocess.Popen(
        command, cwd=ROOT, env=base_env, stdout=(logs / "web.log").open("wb"), stderr=subprocess.STDOUT
    )
    platform.base_url = f"http://127.0.0.1:{port}"
    try:
        wait_until(
            lambda: httpx.get(f"{platform.base_url}/healthz", timeout=2).status_code == 200,
            timeout=60,
            what="the web server",
        )
        yield platform
    finally:
        # All at once: a Celery worker's warm shutdown takes seconds (its consumer loop, its pool, its timers), and
        # one after the other they added up.
        _stop_together([*(worker.process for worker in platform.workers), web_process])
