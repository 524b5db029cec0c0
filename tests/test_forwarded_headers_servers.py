"""The web servers the platform ships with believe no forwarded header: the platform alone decides which to believe
(``PLATFORM_PROXY_HOPS``, ``PLATFORM_TRUSTED_PROXIES``). uvicorn believed ``X-Forwarded-For`` from any loopback
client by default (``bin/up``'s uvicorn, and gunicorn's uvicorn worker with the image's ``gunicorn.conf.py``) and
rewrote the client's address before the platform saw it: a new forged address at each try dodged the per-address
login lockout, and the forged addresses were audited. Each server is started as shipped, on a database of its own
(a copy of the session's seeded one, ``tests.e2e.harness.seeded``)."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from base64 import b64encode
from pathlib import Path

import pytest
from django.conf import settings

from tests.e2e.harness import seeded
from tests.test_ops_defects import _free_port

pytestmark = pytest.mark.slow

# The per-address lockout's threshold, set low for these servers (``PLATFORM_LOGIN_IP_MAX_FAILURES``, 20 by default):
# every failed login before the lockout hashes a password (about 0.2 s of CPU each), and the number is not the point:
# each forged address is new, so a server that believed them would never lock the one client out.
IP_MAX_FAILURES = 5


def bin_up_uvicorn(port: int) -> list[str]:
    """``bin/up``'s own uvicorn command line, on ``port``."""
    line = next(
        line
        for line in (Path(settings.BASE_DIR) / "bin" / "up").read_text().splitlines()
        if line.startswith("uvicorn ")
    )
    words = [word.replace('"$PORT"', str(port)).replace("$PORT", str(port)) for word in shlex.split(line, posix=False)]
    return [sys.executable, "-m", *words]


def gunicorn_as_shipped(port: int) -> list[str]:
    conf = str(Path(settings.BASE_DIR) / "gunicorn.conf.py")
    return [
        sys.executable,
        "-m",
        "gunicorn",
        "agent_platform.asgi:application",
        "--config",
        conf,
        "--worker-class",
        "uvicorn.workers.UvicornWorker",
        "--bind",
        f"127.0.0.1:{port}",
        "--workers",
        "1",
    ]


def answers_to_forged_addresses(command: list[str], tmp_path: Path) -> list[int]:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PLATFORM_PROXY", "DATABASE_URL"))},
        "PLATFORM_VAR_DIR": str(tmp_path / "var"),
        "HOME": str(tmp_path),
        "SQLITE_PATH": str(tmp_path / "db.sqlite3"),
        "DJANGO_SETTINGS_MODULE": "agent_platform.settings",
    }
    knobs = {"PLATFORM_LOGIN_IP_MAX_FAILURES": str(IP_MAX_FAILURES)}
    env.update(knobs)
    seeded(env, extra=knobs)  # migrated (and seeded): a copy of the session's database rather than a migrate of its own
    port = int(command[command.index("--port") + 1]) if "--port" in command else int(command[-3].rsplit(":", 1)[1])
    server = subprocess.Popen(
        command, cwd=settings.BASE_DIR, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5):
                    break
            except (urllib.error.URLError, ConnectionError):
                assert server.poll() is None and time.monotonic() < deadline
                time.sleep(0.3)
        codes = []
        for i in range(IP_MAX_FAILURES + 2):
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/api/v1/audit/events",
                headers={
                    "Authorization": "Basic " + b64encode(f"nobody{i}:wrong".encode()).decode(),
                    "X-Forwarded-For": f"198.51.100.{i + 1}",
                },
            )
            try:
                urllib.request.urlopen(request, timeout=10)
                codes.append(200)
            except urllib.error.HTTPError as exc:
                codes.append(exc.code)
        return codes
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)


@pytest.mark.parametrize("server", [bin_up_uvicorn, gunicorn_as_shipped], ids=["bin-up-uvicorn", "gunicorn-conf"])
def test_a_forged_forwarded_address_does_not_dodge_the_per_address_lockout(server, tmp_path: Path) -> None:
    codes = answers_to_forged_addresses(server(_free_port()), tmp_path)
    assert set(codes[: IP_MAX_FAILURES - 1]) == {401}, codes
    # The Nth failure from one address locks it, forged or not.
    assert codes[IP_MAX_FAILURES - 1 :] == [429, 429, 429], codes
