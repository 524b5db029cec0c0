"""The platform in its production configuration, as an operator runs it (the defects a reviewer found there):

1. A PostgreSQL server that accepts connections and never answers held ``/readyz`` and the entrypoint's wait for
   the database (psycopg's own limit is over two minutes): ``DB_CONNECT_TIMEOUT`` bounds every connection.
2. ``check --deploy`` was silent where ``SECRET_KEY`` or ``SECRETS_ENCRYPTION_KEYS`` fell back to a key of this
   machine's own (``audit.W002``, ``audit.W003``).
3. With the database down the API answered ``500 server_error`` and ``/metrics`` Django's HTML 500: both are a
   ``503 unavailable`` with ``Retry-After`` now.
4. With ``PLATFORM_TLS=django`` the probes answered ``301`` (a probe counts a redirect as success).
5. ``docker-compose.yml`` fixed ``ALLOWED_HOSTS`` and ``CSRF_TRUSTED_ORIGINS``; a request refused for its Host
   header was a bare "HTTP 400" on the API.
6. The log masking read "Unauthorized" and "Authorized" as secret key names: Django's "Unauthorized: /path"
   lost its path.
7. With ``LOG_FORMAT=json`` Python's warnings were plain text on stderr.

The settings are read when a process starts, so most of these run the platform in a fresh process of its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.core.exceptions import DisallowedHost
from django.db import InterfaceError, OperationalError
from django.test import Client
from rest_framework import status

from agents.api.errors import exception_handler
from audit.masking import mask_text
from tests.e2e.harness import settings_seen
from tests.postgres import manage, postgres_url  # noqa: F401 - postgres_url is a fixture
from tests.test_deploy_check import check_deploy, compose_environment

ROOT = Path(__file__).resolve().parents[1]
# Variables of this process that choose the database, the broker or the settings: a platform started here
# starts without them.
_SETUP_VARIABLES = ("DATABASE_URL", "DB_", "CELERY_BROKER_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE", "LOG_")
# Generous: the guard against a hang, not a measure of speed.
HANG_GUARD_S = 30


@contextlib.contextmanager
def silent_database() -> Iterator[str]:
    """A ``DATABASE_URL`` whose server accepts every connection and never sends a byte (a frozen PostgreSQL, a
    stuck proxy)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                held.append(listener.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"postgres://platform:platform@127.0.0.1:{listener.getsockname()[1]}/platform"
    finally:
        listener.close()
        for connection in held:
            connection.close()


@contextlib.contextmanager
def refusing_database() -> Iterator[str]:
    """A ``DATABASE_URL`` whose port refuses connections (the database is down); the port stays bound meanwhile,
    so that nothing else takes it."""
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        yield f"postgres://platform:platform@127.0.0.1:{bound.getsockname()[1]}/platform"


def platform_process(
    script: str, tmp_path: Path, *, argv: list[str] | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    """Run ``script`` (after ``django.setup()``), or ``argv``, in a fresh platform process with ``env`` set;
    fails the test if it has not ended within :data:`HANG_GUARD_S`."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(_SETUP_VARIABLES)}
    base["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{base.get('PATH', '')}"
    command = argv or [sys.executable, "-c", f"import django\ndjango.setup()\n{script}"]
    try:
        return subprocess.run(
            command,
            cwd=ROOT,
            env={
                **base,
                "DJANGO_SETTINGS_MODULE": "agent_platform.settings",
                "PLATFORM_VAR_DIR": str(tmp_path / "var"),
                **env,
            },
            capture_output=True,
            text=True,
            timeout=HANG_GUARD_S,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"still waiting after {HANG_GUARD_S} s: {exc.stderr!r}")


def last_json(done: subprocess.CompletedProcess[str]) -> Any:
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


# --- 1. a database that never answers ---------------------------------------------------------------------------


@pytest.mark.slow
def test_postgresql_connections_give_up_after_db_connect_timeout(tmp_path: Path) -> None:
    url = "postgres://platform@db.invalid:5432/platform"  # read, never connected to
    options = "settings.DATABASES['default']['OPTIONS']['connect_timeout']"

    assert settings_seen(options, tmp_path, DATABASE_URL=url) == 5
    assert settings_seen(options, tmp_path, DATABASE_URL=url, DB_CONNECT_TIMEOUT="12") == 12
    assert settings_seen(options, tmp_path, DATABASE_URL=f"{url}?connect_timeout=3") == 3  # the URL's own wins


@pytest.mark.parametrize("value", ["0", "301", "five"])
def test_a_db_connect_timeout_that_is_no_bound_is_refused_at_start(value: str, tmp_path: Path) -> None:
    done = platform_process("", tmp_path, DB_CONNECT_TIMEOUT=value)

    assert done.returncode != 0
    assert "DB_CONNECT_TIMEOUT must be a whole number of seconds from 2 to 300" in done.stderr


@pytest.mark.slow
def test_readyz_answers_not_ready_while_the_database_accepts_connections_and_never_answers(tmp_path: Path) -> None:
    script = (
        "import json\nfrom django.test import Client\n"
        "response = Client().get('/readyz')\n"
        "print(json.dumps([response.status_code, response.json()]))"
    )
    with silent_database() as url:
        done = platform_process(script, tmp_path, DATABASE_URL=url, DB_CONNECT_TIMEOUT="2")

    status_code, body = last_json(done)
    assert status_code == 503
    assert body["checks"]["database"]["ok"] is False
    assert body["checks"]["worker"] == {"ok": False, "error": "the database did not answer", "ms": 0.0}
    assert "platform:platform" not in done.stdout


# /readyz on a live PostgreSQL, then what the request's connection says of its statement_timeout afterwards.
PG_READYZ = (
    "import json\nfrom django.db import connection\nfrom django.test import Client\n"
    "from agent_platform import probes\n"
    "seen = []\n"
    "def note(execute, sql, params, many, context):\n"
    "    seen.append(sql)\n"
    "    return execute(sql, params, many, context)\n"
    "with connection.execute_wrapper(note):\n"
    "    probes._check_database()\n"
    "with connection.cursor() as cursor:\n"
    "    cursor.execute('SHOW statement_timeout')\n"
    "    after = cursor.fetchone()[0]\n"
    "database = Client().get('/readyz').json()['checks']['database']\n"
    "print(json.dumps([seen, after, database['ok']]))"
)


@pytest.mark.postgres
def test_readyz_bounds_its_select_on_postgresql_for_its_own_transaction_only(
    postgres_url: str,  # noqa: F811 - the fixture
) -> None:
    done = manage("shell", "-c", PG_READYZ, database_url=postgres_url, env={"DB_CONN_MAX_AGE": "60"}, timeout=120)

    assert done.returncode == 0, done.stderr
    statements, after, ok = json.loads(done.stdout.strip().splitlines()[-1])
    assert statements == ["SET LOCAL statement_timeout = 2000", "SELECT 1"]
    assert after == "0"  # the connection, kept for later requests, carries no limit away
    assert ok is True


@pytest.mark.slow
def test_the_entrypoint_stops_waiting_for_a_database_that_never_answers_at_its_deadline(tmp_path: Path) -> None:
    with silent_database() as url:
        done = platform_process(
            "",
            tmp_path,
            argv=["bash", "deploy/entrypoint.sh", "true"],
            DATABASE_URL=url,
            DB_WAIT_TIMEOUT="1",
            DB_CONNECT_TIMEOUT="2",
        )

    assert done.returncode == 1, done.stdout + done.stderr
    assert "database still unreachable after 1s" in done.stderr


# --- 2. keys of this machine's own ------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_deploy_check_warns_where_sessions_and_stored_secrets_would_use_keys_of_this_machine(
    tmp_path: Path,
) -> None:
    environment = compose_environment("worker")
    environment.pop("SECRET_KEY")
    environment.pop("SECRETS_ENCRYPTION_KEYS")

    done = check_deploy(environment, tmp_path)

    assert done.returncode != 0
    output = done.stdout + done.stderr
    assert "audit.W002" in output and "SECRET_KEY is not set" in output
    assert "audit.W003" in output and "SECRETS_ENCRYPTION_KEYS is not set" in output
    assert "audit.W001" not in output  # AUDIT_CHAIN_KEY is set


def test_only_the_secret_key_generated_into_its_file_is_warned_about(settings: Any, tmp_path: Path) -> None:
    from audit.checks import check_secret_key_shared

    generated = "generated-for-this-machine-" + "x" * 40
    settings.SECRET_KEY_FILE = tmp_path / "secret_key"
    settings.SECRET_KEY_FILE.write_text(generated + "\n", encoding="utf-8")
    settings.SECRET_KEY = "a-key-from-the-environment-" + "y" * 40
    assert check_secret_key_shared() == []

    settings.SECRET_KEY = generated
    assert [message.id for message in check_secret_key_shared()] == ["audit.W002"]

    settings.SECRET_KEY_FILE = tmp_path / "never-made"
    assert check_secret_key_shared() == []


# --- 3. the database down -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("error", [OperationalError, InterfaceError])
def test_the_api_answers_503_with_retry_after_when_the_database_fails(error: type[Exception]) -> None:
    response = exception_handler(error('connection to server at "10.0.0.5", port 5432 failed'), {})

    assert response is not None
    assert response.status_code == status.HTTP_503_SERVICE_UNAVAILABLE
    assert response.data == {
        "error": {"code": "unavailable", "message": "The database is not available right now. Try again shortly."}
    }
    assert response["Retry-After"] == "5"


def test_a_database_error_that_is_the_platforms_own_is_no_outage() -> None:
    """A missing table or column (a migration not run, a bad query) raises an OperationalError too: a bug, told as
    a 500, not a 503 that has the caller try again for ever. A locked SQLite file is an outage."""
    import sqlite3

    from django.db import OperationalError as DjangoOperationalError

    from agent_platform.errors import database_unreachable

    def wrapped(message: str) -> Exception:
        try:
            try:
                raise sqlite3.OperationalError(message)
            except sqlite3.OperationalError as cause:
                raise DjangoOperationalError(message) from cause
        except DjangoOperationalError as exc:
            return exc

    assert not database_unreachable(wrapped("no such column: agents_run.idempotency_key"))
    assert not database_unreachable(wrapped("no such table: agents_run"))
    assert database_unreachable(wrapped("database is locked"))
    assert exception_handler(wrapped("no such table: agents_run"), {}) is None  # Django's 500, its traceback logged


@pytest.mark.slow
def test_a_run_submitted_and_a_scrape_while_the_database_is_down_answer_503(tmp_path: Path) -> None:
    script = (
        "import json\nfrom django.test import Client\n"
        "client = Client()\n"
        "run = client.post('/api/v1/runs', {'agent': 'demo', 'query': '삼성전자 매출'}, content_type='application/json',"
        " HTTP_AUTHORIZATION='Bearer apk_0123456789abcdef')\n"
        "scrape = client.get('/metrics')\n"
        "print(json.dumps([[r.status_code, r.get('Retry-After'), r['Content-Type'], r.content.decode()]"
        " for r in (run, scrape)]))"
    )
    with refusing_database() as url:
        done = platform_process(script, tmp_path, DATABASE_URL=url)

    for status_code, retry_after, content_type, body in last_json(done):
        assert (status_code, retry_after, content_type.split(";")[0]) == (503, "5", "application/json"), body
        assert json.loads(body) == {
            "error": {"code": "unavailable", "message": "The database is not available right now. Try again shortly."}
        }
    # The scrape's 503 is told once, by the platform's warning; Django's ERROR line for it would be written at every
    # scrape for as long as the outage lasts.
    assert "metrics: the database did not answer" in done.stderr
    assert "Service Unavailable: /metrics" not in done.stderr, done.stderr


# --- 4. probes under PLATFORM_TLS=django ---------------------------------------------------------------------------


@pytest.mark.slow  # ≥ 1.5 s: the fast loop stays under five minutes
def test_the_probes_answer_on_plain_http_where_django_redirects_to_https(tmp_path: Path) -> None:
    script = (
        "import json\nfrom django.test import Client\n"
        "client = Client(raise_request_exception=False)\n"  # an unmigrated database: /metrics is a 500 there
        "print(json.dumps({p: client.get(p).status_code for p in ('/healthz', '/readyz', '/metrics', '/admin/',"
        " '/healthz/', '/api/v1/healthz')}))"
    )
    done = platform_process(script, tmp_path, PLATFORM_TLS="django")

    answers = last_json(done)
    assert answers["/healthz"] == 200
    assert answers["/readyz"] != 301 and answers["/metrics"] != 301
    # Only the probes themselves: everything else still goes to HTTPS.
    assert answers["/admin/"] == answers["/healthz/"] == answers["/api/v1/healthz"] == 301


# --- 5. host names ------------------------------------------------------------------------------------------------


def test_compose_takes_the_host_names_and_trusted_origins_from_the_environment_with_the_old_defaults() -> None:
    environment = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))["x-app-env"]

    assert environment["ALLOWED_HOSTS"] == "${ALLOWED_HOSTS:-localhost,127.0.0.1,web}"
    assert environment["CSRF_TRUSTED_ORIGINS"] == (
        "${CSRF_TRUSTED_ORIGINS:-http://localhost:8000,http://127.0.0.1:8000}"
    )
    assert compose_environment("web")["ALLOWED_HOSTS"] == "localhost,127.0.0.1,web"


def test_an_api_request_for_a_host_not_allowed_says_so_without_repeating_it() -> None:
    client = Client()

    refused = client.get("/api/v1/runs", HTTP_HOST="evil.example<script>")

    assert refused.status_code == 400
    assert refused.json() == {
        "error": {"code": "bad_request", "message": "The request's host name is not allowed on this server."}
    }
    assert b"evil" not in refused.content
    page = client.get("/admin/", HTTP_HOST="evil.example")
    assert page.status_code == 400 and page["Content-Type"].startswith("text/html")


def test_the_api_400_handler_is_generic_for_other_refusals() -> None:
    from django.test import RequestFactory

    from agents.api.errors import bad_request

    response = bad_request(RequestFactory().get("/api/v1/runs"), DisallowedHost("x"))
    assert json.loads(response.content)["error"]["message"] == "The request's host name is not allowed on this server."
    other = bad_request(RequestFactory().get("/api/v1/runs"), ValueError("x"))
    assert json.loads(other.content) == {"error": {"code": "bad_request", "message": "The request failed (HTTP 400)."}}


# --- 6. log masking ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        "Unauthorized: /api/v1/runs",
        "UNAUTHORIZED: /api/v1/runs",
        "Unauthorised: /api/v1/runs",
        "Authorized: yes",
        "authorized=true",
    ],
)
def test_authorized_and_unauthorized_are_not_secret_key_names(line: str) -> None:
    assert mask_text(line) == line


@pytest.mark.parametrize(
    ("line", "masked"),
    [
        ("auth: hunter2-secret", "auth: ***"),
        ("Authorization: Bearer abcdef0123456789", "Authorization: Bearer ***"),
        ("x-auth-token: abcdef0123456789", "x-auth-token: ***"),
        ("AUTH_TOKEN=abcdef0123456789", "AUTH_TOKEN=***"),
        ("oauth: abcdef0123456789", "oauth: ***"),
        ("authorize: abcdef0123456789", "authorize: ***"),
        # Credentials named "authorized …" (OpenID for credential issuance's pre-authorized code).
        ("authorized_code=abcdefghijklmnop123", "authorized_code=***"),
        ("pre-authorized_code: abcdefghijklmnop123", "pre-authorized_code: ***"),
        ("authorised_key=abcdefghijklmnop123", "authorised_key=***"),
    ],
)
def test_auth_keys_are_still_masked(line: str, masked: str) -> None:
    assert mask_text(line) == masked


# --- 7. warnings as JSON ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_python_warnings_are_json_log_lines_with_log_format_json(tmp_path: Path) -> None:
    script = (
        "import warnings\n"
        "warnings.warn('StreamingHttpResponse must consume synchronous iterators (password=hunter2)', Warning)"
    )
    done = platform_process(script, tmp_path, LOG_FORMAT="json")

    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    warning = next(record for record in records if record["logger"] == "py.warnings")
    assert warning["level"] == "WARNING"
    assert re.search(r"StreamingHttpResponse must consume synchronous iterators", warning["message"])
    assert "hunter2" not in done.stderr
