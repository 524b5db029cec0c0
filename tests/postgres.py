"""A private PostgreSQL cluster for tests (and benchmarks) that need the real thing.

:func:`private_postgres` runs ``initdb`` into a temporary folder and ``pg_ctl`` on a free port on 127.0.0.1
(trust authentication, reachable from this machine only), creates a database and yields its ``DATABASE_URL``;
the cluster is stopped and removed afterwards. As root, whom ``initdb`` refuses, the server runs as the
``postgres`` user (``runuser``). The pytest process itself stays on SQLite: tests hand the URL to the
platform's own processes (:func:`manage`), e.g. ``manage.py migrate`` and ``manage.py shell -c ...``.

The :func:`postgres_url` fixture (session-scoped, migrated once) skips when PostgreSQL is not installed, or
fails when ``CI`` is set (``.ci/run`` installs it). Use it from a test module with
``from tests.postgres import postgres_url  # noqa: F401``. A test that changes its database for good (a forged
chain head) takes :func:`migrated_postgres_url` as well: a database of its own in the same cluster, as a fresh
``migrate`` leaves one, copied from the session's migrate in a fraction of a second (a cluster and a migrate of
its own take 15 s).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
DATABASE = "platform"
# The session's database as its migrate left it, before any test wrote to it (:func:`migrated_postgres_url`).
MIGRATED_TEMPLATE = "platform_migrated"


class PostgresMissing(RuntimeError):
    """PostgreSQL's server binaries (``initdb``, ``pg_ctl``) are not installed, or cannot run here."""


def postgres_bindir() -> Path | None:
    """The folder of ``initdb`` and ``pg_ctl``: on the PATH, else Debian's ``/usr/lib/postgresql/<newest>/bin``."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl", path=str(Path(found).parent)):
        return Path(found).parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    return Path(candidates[-1]).parent if candidates else None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _as_server_user() -> list[str]:
    """The command prefix that runs PostgreSQL's programs as a user it accepts (not root)."""
    if os.geteuid() != 0:
        return []
    runuser = shutil.which("runuser")
    try:
        import pwd

        pwd.getpwnam("postgres")
    except KeyError:
        runuser = None
    if runuser is None:
        raise PostgresMissing("running as root and there is no 'postgres' user (or runuser) to run the server as")
    return [runuser, "-u", "postgres", "--"]


@contextlib.contextmanager
def private_postgres(*, durable: bool = False) -> Iterator[str]:
    """Start a throwaway cluster and yield a ``DATABASE_URL`` for a fresh, empty database in it.

    ``durable=False`` (tests) turns fsync and synchronous commit off: fast, and nothing here must survive a
    crash. Benchmarks pass ``durable=True`` to measure commits as a real server makes them.
    """
    bindir = postgres_bindir()
    if bindir is None:
        raise PostgresMissing("PostgreSQL is not installed (no initdb on PATH or in /usr/lib/postgresql/*/bin)")
    prefix = _as_server_user()
    workdir = Path(tempfile.mkdtemp(prefix="pg-"))
    data = workdir / "data"
    if prefix:
        shutil.chown(workdir, user="postgres")
    port = free_port()
    options = f"-c listen_addresses=127.0.0.1 -p {port} -k {workdir}"
    if not durable:
        options += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
    started = False
    try:
        try:
            # --no-sync: initdb's flush of its 40 MB to disk was most of its time (and made the removal afterwards
            # wait for the writes), for a cluster that must not survive a crash anyway.
            subprocess.run(
                [*prefix, str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"]
                + ([] if durable else ["--no-sync"]),
                check=True,
                capture_output=True,
                env={**os.environ, "LC_ALL": "C"},
            )
            pg_ctl = [*prefix, str(bindir / "pg_ctl"), "-D", str(data)]
            subprocess.run(
                [*pg_ctl, "-l", str(workdir / "server.log"), "-o", options, "-w", "-t", "60", "start"],
                check=True,
                capture_output=True,
            )
        except subprocess.CalledProcessError as exc:
            log = workdir / "server.log"
            detail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise PostgresMissing(f"{exc.cmd[len(prefix)]} failed: {exc.stderr!r} {detail}") from exc
        started = True
        _create_database(port)
        yield f"postgres://postgres@127.0.0.1:{port}/{DATABASE}"
    finally:
        if started:
            subprocess.run(
                [*prefix, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
                check=False,
                capture_output=True,
            )
        shutil.rmtree(workdir, ignore_errors=True)


def _create_database(port: int) -> None:
    import psycopg

    deadline = time.monotonic() + 30
    while True:
        try:
            _administer(port, f'CREATE DATABASE "{DATABASE}"')
            return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _administer(port: int, statement: str) -> None:
    """Run one statement on the cluster's ``postgres`` database (CREATE or DROP DATABASE: outside a transaction)."""
    import psycopg

    with psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres", autocommit=True) as db:
        db.execute(statement)


def _port(url: str) -> int:
    from urllib.parse import urlsplit

    port = urlsplit(url).port
    assert port is not None, url
    return port


def blocking_another(connection: Any) -> bool:
    """Whether another connection waits for a lock ``connection``'s transaction holds (read live from pg_locks, on
    the driver's cursor: no query of the platform's sees it). For the race scripts the tests run in a platform
    process: a first writer waits inside its transaction until the second waits on its lock, not a fixed pause."""
    connection.ensure_connection()
    with connection.connection.cursor() as cursor:
        cursor.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE NOT granted AND pg_backend_pid() = ANY(pg_blocking_pids(pid)))"
        )
        return bool(cursor.fetchone()[0])


def platform_env(*, database_url: str | None = None, sqlite_path: str | None = None) -> dict[str, str]:
    """This process's environment for a platform process on the given database (PostgreSQL or an SQLite file)."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "agent_platform.settings"}
    env.pop("DATABASE_URL", None)
    if database_url:
        env["DATABASE_URL"] = database_url
    if sqlite_path:
        env["SQLITE_PATH"] = sqlite_path
    return env


def manage(
    *args: str,
    database_url: str | None = None,
    sqlite_path: str | None = None,
    timeout: float = 300,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``python manage.py ARGS`` in a fresh process on the given database (``env``: variables to set in it as
    well); returns it (never raises)."""
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=REPO,
        env={**platform_env(database_url=database_url, sqlite_path=sqlite_path), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def manage_popen(*args: str, database_url: str | None = None, sqlite_path: str | None = None) -> subprocess.Popen[str]:
    """Start ``python manage.py ARGS`` in the background on the given database (see :func:`manage`)."""
    return subprocess.Popen(
        [sys.executable, "manage.py", *args],
        cwd=REPO,
        env=platform_env(database_url=database_url, sqlite_path=sqlite_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


_shared: dict[str, Any] = {}


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A migrated PostgreSQL database in a private cluster, for the platform's processes (not this one).

    Each test module that imports this fixture gets its own session-scoped copy of it; they share one cluster
    (started by the first, stopped when the last is torn down), so tests must not expect an empty database.
    """
    if "url" not in _shared:
        stack = contextlib.ExitStack()
        try:
            url = stack.enter_context(private_postgres())
        except PostgresMissing as exc:
            if os.environ.get("CI"):
                pytest.fail(f"PostgreSQL is needed in CI (.ci/run installs it): {exc}")
            pytest.skip(str(exc))
        migrated = manage("migrate", "--noinput", database_url=url)
        if migrated.returncode != 0:
            stack.close()
            pytest.fail(f"migrate failed on PostgreSQL: {migrated.stdout}{migrated.stderr}")
        # Kept as migrate left it, for migrated_postgres_url. (CREATE DATABASE waits for the migrate's connection
        # to be gone: its server process may still be ending.)
        _administer(_port(url), f'CREATE DATABASE "{MIGRATED_TEMPLATE}" TEMPLATE "{DATABASE}"')
        _shared.update(url=url, stack=stack, users=0)
    _shared["users"] += 1
    try:
        yield _shared["url"]
    finally:
        _shared["users"] -= 1
        if _shared["users"] == 0:
            _shared.pop("stack").close()
            _shared.clear()


@pytest.fixture
def migrated_postgres_url(postgres_url: str) -> Iterator[str]:
    """A database of this test's own in the session's cluster, as a fresh ``manage.py migrate`` leaves one (a copy,
    ``CREATE DATABASE … TEMPLATE``, of the session's database made just after its migrate, before any test wrote
    to it); dropped afterwards. For a test that leaves its database unusable (a forged chain head) or needs it
    empty. The module imports it with :func:`postgres_url`, which it depends on."""
    port = _port(postgres_url)
    name = f"{DATABASE}_{uuid.uuid4().hex[:12]}"
    _administer(port, f'CREATE DATABASE "{name}" TEMPLATE "{MIGRATED_TEMPLATE}"')
    try:
        yield postgres_url.rsplit("/", 1)[0] + f"/{name}"
    finally:
        _administer(port, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
