"""Starts the platform as an operator would: migrate, seed_demo, create_api_key, a web server and a Celery
worker as separate processes, on their own SQLite file and broker (kombu's filesystem transport or Redis)."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(predicate, *, timeout: float, what: str, interval: float = 0.2) -> None:  # type: ignore[no-untyped-def]
    """Polls ``predicate`` until it is true (an exception counts as false), or fails the test after ``timeout``.
    The first polls come quickly (10 ms apart, then half as much again each time) and the gap grows to
    ``interval``: a condition met at once (a port that opens in a tenth of a second, a row just written) is
    seen at once, and a long wait costs no more polls than with ``interval`` alone."""
    deadline = time.monotonic() + timeout
    gap = min(0.01, interval)
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if predicate():
                return
        time.sleep(gap)
        gap = min(gap * 1.5, interval)
    raise AssertionError(f"timed out waiting for {what}")


T = TypeVar("T")


class SharedBetweenTests(Generic[T]):
    """One expensive set-up (a platform: its broker, web server and configuration) for the tests of a module that
    each leave it as they found it. ``make`` returns a context manager; :meth:`get` enters it on first use and
    returns what it gave; :meth:`discard` exits it, and the next :meth:`get` makes a new one: a test that could not
    leave the set-up as it found it (it failed midway) discards it, so that the next test does not inherit its
    state. A module-scoped fixture holds one and discards it at its end."""

    def __init__(self, make: Callable[[], contextlib.AbstractContextManager[T]]) -> None:
        self._make = make
        self._held: tuple[T, contextlib.ExitStack] | None = None

    def get(self) -> T:
        if self._held is None:
            with contextlib.ExitStack() as stack:
                value = stack.enter_context(self._make())
                self._held = (value, stack.pop_all())
        return self._held[0]

    def discard(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            held[1].close()


# --- a seeded database, made once per test session -----------------------------------------------------------

# Environment variables that change what ``migrate``, ``seed_demo`` or ``create_api_key`` write: a platform whose
# own variables name one of these is seeded from scratch instead of from the template.
_SEEDING_VARIABLES = ("DEMO_", "SQLITE_", "DATABASE_", "PLATFORM_VAR_DIR", "SDS_", "AUDIT_CHAIN_KEY", "SECRET")
_template: tuple[Path, str] | None = None  # the seeded folder (db.sqlite3, var/) and its API key


def run_bench(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``python -m <args>`` from the repository root (a benchmark), its output captured."""
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )


def bench_figures(stdout: str) -> dict[str, float]:
    """A benchmark's ``name: value`` lines."""
    found: dict[str, float] = {}
    for line in stdout.splitlines():
        name, _, value = line.partition(": ")
        if value:
            found[name] = float(value)
    return found


# Variables that choose the database and the broker: a settings check starts without this process's.
_SETUP_VARIABLES = ("DATABASE_URL", "DB_", "CELERY_BROKER_URL", "REDIS_URL")


def settings_seen(expression: str, var_dir: Path, **env: str) -> Any:
    """The JSON value of ``expression`` (over ``settings``) in a fresh process whose settings load with ``env`` set
    (and this process's database and broker variables unset), its local state under ``var_dir``."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(_SETUP_VARIABLES)}
    script = f"import json, django; django.setup(); from django.conf import settings; print(json.dumps({expression}))"
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**base, "DJANGO_SETTINGS_MODULE": "agent_platform.settings", "PLATFORM_VAR_DIR": str(var_dir), **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def manage_in(env: dict[str, str], *args: str) -> str:
    """``python manage.py ARGS`` in ``env``; returns its stdout (a failure fails the test with both outputs)."""
    done = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, f"manage.py {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def seed_as_an_operator(env: dict[str, str]) -> str:
    """What an operator runs: ``migrate``, ``seed_demo``, ``create_api_key e2e``, three commands; returns the API
    key."""
    manage_in(env, "migrate", "--noinput", "-v0")
    manage_in(env, "seed_demo")
    return manage_in(env, "create_api_key", "e2e").strip().splitlines()[-1]


# The three commands of ``seed_as_an_operator`` in one process (``call_command``): Django starts once, not three
# times (about a second of CPU each). The key is the last line, as ``create_api_key`` prints it.
_SEED_IN_ONE_PROCESS = (
    "import django; django.setup(); from django.core.management import call_command; "
    "call_command('migrate', interactive=False, verbosity=0); call_command('seed_demo'); "
    "call_command('create_api_key', 'e2e')"
)


def seed_from_scratch(env: dict[str, str]) -> str:
    """``migrate``, ``seed_demo`` and ``create_api_key e2e`` (the commands :func:`seed_as_an_operator` runs) in one
    process with ``env``: a fresh database (PostgreSQL's, the session's template); returns the API key."""
    done = subprocess.run(
        [sys.executable, "-c", _SEED_IN_ONE_PROCESS],
        cwd=ROOT,
        env={"DJANGO_SETTINGS_MODULE": "agent_platform.settings", **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"seeding failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout.strip().splitlines()[-1]


def seeded(env: dict[str, str], *, extra: dict[str, str] | None = None) -> str:
    """:func:`seed_from_scratch` for a platform whose SQLite file and var folder are ``env``'s ``SQLITE_PATH`` and
    ``PLATFORM_VAR_DIR``, from a copy; returns the API key.

    The three commands cost about 13 s of CPU on two cores (in one process, :func:`seed_from_scratch`); they run
    once per test session (in the environment without the caller's ``extra`` variables, which are the run-time
    knobs of its test), and each platform gets a copy of the result: the database (with SQLite's backup API) and
    the keys under var/ that its secrets and audit chain were written with. A platform whose ``extra`` names a variable
    that seeding reads is seeded from scratch. ``tests/e2e/test_platform_e2e.py`` seeds with the three commands, as
    an operator does (:func:`seed_as_an_operator`)."""
    global _template
    if any(name.startswith(_SEEDING_VARIABLES) for name in extra or {}):
        return seed_from_scratch(env)
    if _template is None:
        folder = Path(tempfile.mkdtemp(prefix="seeded-platform-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        base = {k: v for k, v in env.items() if k not in (extra or {})}
        base.update(PLATFORM_VAR_DIR=str(folder / "var"), SQLITE_PATH=str(folder / "db.sqlite3"))
        _template = (folder, seed_from_scratch(base))
    folder, api_key = _template
    var = Path(env["PLATFORM_VAR_DIR"])
    var.mkdir(mode=0o700, parents=True, exist_ok=True)
    for key in (folder / "var").iterdir():
        if key.is_file():
            shutil.copy2(key, var / key.name)
    with (
        contextlib.closing(sqlite3.connect(folder / "db.sqlite3")) as source,
        contextlib.closing(sqlite3.connect(env["SQLITE_PATH"])) as copy,
    ):
        source.backup(copy)
    os.chmod(env["SQLITE_PATH"], 0o600)
    return api_key


@dataclass
class RunningPlatform:
    base_url: str
    api_key: str
    db_path: Path
    logs: Path
    # ``manage.py`` against this platform's database (e.g. ``create_api_key``); returns its stdout.
    manage: Callable[..., str]

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, headers={"Authorization": f"Bearer {self.api_key}"}, timeout=30)


def publish_with_twin_candidate(manage: Callable[..., str], agent: str = "company-assistant") -> str:
    """``agent`` published (v1, live) and a candidate that behaves as v1 does (its system prompt, which the offline
    model never reads, written otherwise), for a shadow: a live run is never shadowed on the version it ran, which
    agreed with itself by construction. Returns the candidate's number."""
    manage("agent_version", "publish", agent)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False, encoding="utf-8") as document:
        json.dump(
            {"agents": [{"slug": agent, "system_prompt": "섀도 후보: 같은 규칙, 다른 시스템 프롬프트."}]}, document
        )
    try:
        manage("import_config", document.name)
    finally:
        os.unlink(document.name)
    return manage("agent_version", "publish", agent, "--candidate").strip().lstrip("v")


def _stop(process: subprocess.Popen[bytes]) -> None:
    _stop_together([process])


def _stop_together(processes: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to each process still running, all at once, then each is waited for (20 s for them all; one still
    running then is killed): their shutdowns (a Celery worker's warm shutdown takes seconds) overlap."""
    running = [process for process in processes if process.poll() is None]
    for process in running:
        process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 20
    for process in running:
        try:
            process.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


@contextlib.contextmanager
def running_platform(
    workdir: Path,
    *,
    broker_url: str = "",
    config: Path | None = None,
    discover: tuple[str, ...] = (),
    asgi: bool = False,
    as_an_operator: bool = False,
) -> Iterator[RunningPlatform]:
    """``config``: a file for ``import_config`` (then ``mcp_discover`` of the ``discover`` servers) before the
    processes start. ``asgi``: serve with uvicorn, as ``bin/up`` and the image do, instead of ``runserver``.
    ``as_an_operator``: migrate, seed and issue the key with the commands, in this platform's own folders,
    instead of copying the session's seeded database (:func:`seeded`)."""
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "CELERY_BROKER_URL", "REDIS_URL"}}
    env.update(
        PLATFORM_VAR_DIR=str(workdir / "var"),
        SQLITE_PATH=str(workdir / "db.sqlite3"),
        DJANGO_SETTINGS_MODULE="agent_platform.settings",
        DEMO_ADMIN_PASSWORD="e2e-admin-password",
        PYTHONUNBUFFERED="1",
    )
    if broker_url:
        env["CELERY_BROKER_URL"] = broker_url
    logs = workdir / "logs"
    logs.mkdir(parents=True, exist_ok=True)

    def manage(*args: str) -> str:
        return manage_in(env, *args)

    api_key = seed_as_an_operator(env) if as_an_operator else seeded(env)
    if config is not None:
        manage("import_config", str(config))
    if discover:
        manage("mcp_discover", *discover)
    port = free_port()
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "agent_platform",
                "worker",
                "--concurrency=1",
                "--loglevel=INFO",
                "--without-gossip",
                "--without-mingle",
            ],
            cwd=ROOT,
            env=env,
            stdout=(logs / "worker.log").open("wb"),
            stderr=subprocess.STDOUT,
        ),
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "agent_platform.asgi:application",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ]
            if asgi
            else [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"],
            cwd=ROOT,
            env=env,
            stdout=(logs / "web.log").open("wb"),
            stderr=subprocess.STDOUT,
        ),
    ]
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_until(
            lambda: httpx.get(f"{base_url}/healthz", timeout=2).status_code == 200, timeout=60, what="the web server"
        )
        yield RunningPlatform(
            base_url=base_url, api_key=api_key, db_path=workdir / "db.sqlite3", logs=logs, manage=manage
        )
    finally:
        _stop_together(processes)


@contextlib.contextmanager
def workers_killed_at_exit(platform: Any) -> Iterator[Any]:
    """``platform`` (a ``tests.e2e.workers.Platform``), whose workers still running at the exit are killed
    (SIGKILL, with the pool processes and MCP servers they started, ``Worker.kill``) before the platform stops:
    for a test that asserts nothing of how its workers stop, which would otherwise stop one after another with a
    warm shutdown (seconds each)."""
    try:
        yield platform
    finally:
        for worker in platform.workers:
            if worker.process.poll() is None:
                worker.kill()


@contextlib.contextmanager
def redis_server(workdir: Path) -> Iterator[str]:
    """A private redis-server on a free port. Skipped where Redis is not installed, except in CI."""
    binary = shutil.which("redis-server")
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is not installed: .ci/run must install it")
        pytest.skip("redis-server is not installed")
    port = free_port()
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(workdir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    try:
        import redis

        wait_until(lambda: redis.Redis(port=port).ping(), timeout=20, what="redis-server")
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        _stop(process)
