"""Third-party MCP servers for tests, installed on first use and reused afterwards.

* ``mcp-server-time`` and ``mcp-server-fetch`` (PyPI) run each from its own virtualenv, as ``uvx`` would: their
  releases need ``mcp`` 2.x, which the platform's environment (pinned to ``mcp`` 1.x) cannot hold.
* ``@modelcontextprotocol/server-everything`` (npm) runs with node, over stdio or streamable HTTP.

Both live under ``<PLATFORM_VAR_DIR or <repo>/var/test>/thirdparty``; an installation that already works is
reused, so only the first run pays for it (about a minute). When the tool is missing or the installation
fails, the test is skipped, or failed when ``CI`` is set.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import pytest

REPO = Path(__file__).resolve().parent.parent
TIME_PACKAGE = "mcp-server-time"
FETCH_PACKAGE = "mcp-server-fetch"
EVERYTHING_PACKAGE = "@modelcontextprotocol/server-everything"
# Pinned, as the Inspector is (below): a clean CI run installs the releases these tests were written against, not
# whatever was published last. Raise them deliberately, with the tests.
TIME_VERSION = "2026.10.19"
FETCH_VERSION = "2026.10.24"
EVERYTHING_VERSION = "2026.8.31"
INSTALL_TIMEOUT_S = 600


def thirdparty_dir() -> Path:
    """Where the third-party servers are installed: ``$PLATFORM_VAR_DIR/thirdparty`` or ``var/test/thirdparty``
    (one installation for every pytest-xdist worker: ``tests/worker_dirs.py``)."""
    base = os.environ.get("PLATFORM_TEST_SHARED_DIR") or os.environ.get("PLATFORM_VAR_DIR")
    return (Path(base) if base else REPO / "var" / "test") / "thirdparty"


@dataclass(frozen=True)
class StdioCommand:
    """What to bind as a stdio ``McpServer``: ``command``, ``args`` and (optionally) ``env``."""

    command: str
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class EverythingServer:
    """An installed ``server-everything``: node and the package's entry point (its ``bin``)."""

    node: str
    entry: Path
    version: str

    def stdio(self) -> StdioCommand:
        return StdioCommand(command=self.node, args=[str(self.entry), "stdio"])

    def streamable_http(self, port: int) -> StdioCommand:
        """The command that serves MCP at ``http://127.0.0.1:<port>/mcp`` (the port comes from ``PORT``)."""
        return StdioCommand(command=self.node, args=[str(self.entry), "streamableHttp"], env={"PORT": str(port)})


class Progress:
    """Prints progress lines the user sees even while pytest captures output."""

    def __init__(self, config: pytest.Config | None = None) -> None:
        self._capman = config.pluginmanager.getplugin("capturemanager") if config is not None else None
        self._first = True

    def __call__(self, message: str) -> None:
        context = self._capman.global_and_fixture_disabled() if self._capman is not None else contextlib.nullcontext()
        with context:
            # The first line starts on a line of its own (pytest's progress dots may be on the current one).
            print(f"{chr(10) if self._first and self._capman else ''}[thirdparty] {message}", flush=True)
        self._first = False


def unavailable(message: str) -> NoReturn:
    """A third-party server cannot be had here: fail under CI, skip elsewhere."""
    if os.environ.get("CI"):
        pytest.fail(f"{message} (CI is set, so this is a failure, not a skip)", pytrace=False)
    pytest.skip(message)


@contextlib.contextmanager
def _install_lock(name: str) -> Iterator[None]:
    """One installer at a time per package (parallel test processes share the directory)."""
    directory = thirdparty_dir()
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _run_streamed(argv: list[str], progress: Progress, *, env: dict[str, str] | None = None) -> tuple[int, list[str]]:
    """Run an installer, echoing its output as progress lines. Returns its exit status and its last lines."""
    tail: list[str] = []
    try:
        process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace", env=env
        )
    except OSError as exc:
        return 127, [f"{argv[0]}: {exc}"]
    deadline = time.monotonic() + INSTALL_TIMEOUT_S
    assert process.stdout is not None
    for line in process.stdout:
        line = line.rstrip()
        if line:
            progress(f"  {line}")
            tail = [*tail[-19:], line]
        if time.monotonic() > deadline:
            process.kill()
            tail.append(f"timed out after {INSTALL_TIMEOUT_S}s")
            break
    return process.wait(), tail


# ---- mcp-server-time ---------------------------------------------------------------------------------------


def time_venv() -> Path:
    return thirdparty_dir() / "time-venv"


def _imports(python: Path, module: str, package: str, version: str) -> bool:
    """Whether ``module`` imports in that python and ``package`` is installed there at ``version``."""
    if not python.exists():
        return False
    script = f"import {module}, importlib.metadata as m, sys; sys.exit(m.version({package!r}) != {version!r})"
    check = subprocess.run([str(python), "-c", script], capture_output=True, timeout=60, check=False)
    return check.returncode == 0


def _install_python_server(package: str, version: str, module: str, venv: Path, progress: Progress) -> Path:
    """``package`` at ``version`` in the virtualenv ``venv`` (created, or reused when ``module`` already imports
    there at that version). Returns the virtualenv's python."""
    python = venv / "bin" / "python"
    with _install_lock(venv.name):
        if not _imports(python, module, package, version):
            started = time.monotonic()
            progress(f"installing {package} into {venv} (first run only; may take a minute)")
            if not python.exists():
                progress(f"creating a virtualenv with {sys.executable} -m venv")
                code, tail = _run_streamed([sys.executable, "-m", "venv", "--clear", str(venv)], progress)
                if code != 0:
                    unavailable(f"could not create a virtualenv for {package}: {' | '.join(tail[-5:])}")
            env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONHOME", "PYTHONPATH"}}
            code, tail = _run_streamed(
                [
                    str(python),
                    "-m",
                    "pip",
                    "install",
                    "--disable-pip-version-check",
                    "--progress-bar",
                    "off",
                    f"{package}=={version}",
                ],
                progress,
                env=env,
            )
            if code != 0 or not _imports(python, module, package, version):
                unavailable(f"pip could not install {package} (exit {code}): {' | '.join(tail[-5:])}")
            progress(f"{package} installed in {time.monotonic() - started:.1f}s")
    return python


def install_time_server(progress: Progress | None = None) -> StdioCommand:
    """``mcp-server-time`` in its own virtualenv (created, or reused when it already imports)."""
    python = _install_python_server(TIME_PACKAGE, TIME_VERSION, "mcp_server_time", time_venv(), progress or Progress())
    return StdioCommand(command=str(python), args=["-m", "mcp_server_time", "--local-timezone", "Asia/Seoul"])


def install_fetch_server(progress: Progress | None = None) -> StdioCommand:
    """``mcp-server-fetch`` in its own virtualenv, bound as seed 001 binds it (``-m mcp_server_fetch``). Tests
    fetch pages from their own loopback server, which has no robots.txt to honour: ``--ignore-robots-txt``."""
    venv = thirdparty_dir() / "fetch-venv"
    python = _install_python_server(FETCH_PACKAGE, FETCH_VERSION, "mcp_server_fetch", venv, progress or Progress())
    return StdioCommand(command=str(python), args=["-m", "mcp_server_fetch", "--ignore-robots-txt"])


# ---- @modelcontextprotocol/server-everything ---------------------------------------------------------------


def npm_prefix() -> Path:
    return thirdparty_dir() / "npm"


def _everything_installed(node: str) -> EverythingServer | None:
    package_dir = npm_prefix() / "node_modules" / Path(EVERYTHING_PACKAGE)
    try:
        package = json.loads((package_dir / "package.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    bin_field: Any = package.get("bin")
    relative = bin_field if isinstance(bin_field, str) else (bin_field or {}).get("mcp-server-everything")
    entry = package_dir / (relative or "dist/index.js")
    if not entry.is_file() or package.get("version") != EVERYTHING_VERSION:
        return None
    return EverythingServer(node=node, entry=entry, version=str(package.get("version", "")))


def install_everything_server(progress: Progress | None = None) -> EverythingServer:
    """``server-everything`` under ``<thirdparty>/npm`` (installed, or reused when its entry point is there)."""
    progress = progress or Progress()
    node = shutil.which("node")
    if node is None:
        unavailable(f"node is not on PATH: {EVERYTHING_PACKAGE} cannot run")
    with _install_lock("npm"):
        installed = _everything_installed(node)
        if installed is None:
            npm = shutil.which("npm")
            if npm is None:
                unavailable(f"npm is not on PATH: {EVERYTHING_PACKAGE} cannot be installed")
            started = time.monotonic()
            prefix = npm_prefix()
            progress(f"installing {EVERYTHING_PACKAGE} into {prefix} (first run only; may take a minute)")
            prefix.mkdir(parents=True, exist_ok=True)
            code, tail = _run_streamed(
                [
                    npm,
                    "install",
                    "--prefix",
                    str(prefix),
                    "--no-audit",
                    "--no-fund",
                    f"{EVERYTHING_PACKAGE}@{EVERYTHING_VERSION}",
                ],
                progress,
            )
            installed = _everything_installed(node)
            if code != 0 or installed is None:
                unavailable(f"npm could not install {EVERYTHING_PACKAGE} (exit {code}): {' | '.join(tail[-5:])}")
            progress(f"{EVERYTHING_PACKAGE} {installed.version} installed in {time.monotonic() - started:.1f}s")
    return installed


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _port_answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


@contextlib.contextmanager
def everything_http_server(server: EverythingServer, *, start_timeout_s: float = 20.0) -> Iterator[str]:
    """Run ``server-everything`` over streamable HTTP on 127.0.0.1 and yield its MCP URL; always stopped after.

    The package listens on every interface (``app.listen(PORT)``: no host option), on the port ``PORT`` names.
    """
    log_path = thirdparty_dir() / "everything-http.log"
    last_error = ""
    for _attempt in range(3):  # a free port can be taken between our probe and node's bind: try another
        port = free_port()
        command = server.streamable_http(port)
        env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG") if k in os.environ} | command.env
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [command.command, *command.args], stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env
            )
        try:
            deadline = time.monotonic() + start_timeout_s
            while process.poll() is None and not _port_answers(port) and time.monotonic() < deadline:
                time.sleep(0.05)
            if process.poll() is None and _port_answers(port):
                yield f"http://127.0.0.1:{port}/mcp"
                return
            last_error = log_path.read_text(encoding="utf-8", errors="replace")[-1000:]
        finally:
            _stop(process)
    pytest.fail(f"{EVERYTHING_PACKAGE} did not answer over HTTP on 127.0.0.1: {last_error}", pytrace=False)


# ---- fixtures ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def time_server_command(pytestconfig: pytest.Config) -> StdioCommand:
    """``<time-venv>/bin/python -m mcp_server_time --local-timezone Asia/Seoul``, installed on first use."""
    return install_time_server(Progress(pytestconfig))


@pytest.fixture(scope="session")
def fetch_server_command(pytestconfig: pytest.Config) -> StdioCommand:
    """``<fetch-venv>/bin/python -m mcp_server_fetch --ignore-robots-txt``, installed on first use."""
    return install_fetch_server(Progress(pytestconfig))


@pytest.fixture(scope="session")
def everything_server(pytestconfig: pytest.Config) -> EverythingServer:
    """The installed ``server-everything`` (``.stdio()``, ``.streamable_http(port)``)."""
    return install_everything_server(Progress(pytestconfig))


@pytest.fixture
def everything_http_url(everything_server: EverythingServer) -> Iterator[str]:
    """A ``server-everything`` process serving streamable HTTP on 127.0.0.1 for one test: its MCP URL."""
    with everything_http_server(everything_server) as url:
        yield url


# ---- @modelcontextprotocol/inspector (its CLI, as an MCP client we did not write) --------------------------

# 0.17.5: the newest release that runs on Node 20 (later ones need Node 22, so npm would pick 0.15, whose
# CLI cannot send an Authorization header; 0.17.0 ships a broken --cli). Pinned: every run drives the same client.
INSPECTOR_PACKAGE = "@modelcontextprotocol/inspector"
INSPECTOR_VERSION = "0.17.5"


@dataclass(frozen=True)
class InspectorCli:
    node: str
    entry: Path
    version: str

    def argv(self, *args: str) -> list[str]:
        return [self.node, str(self.entry), "--cli", *args]


def _inspector_installed(node: str, prefix: Path) -> InspectorCli | None:
    package_dir = prefix / "node_modules" / Path(INSPECTOR_PACKAGE)
    try:
        package = json.loads((package_dir / "package.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    bin_field: Any = package.get("bin")
    relative = bin_field if isinstance(bin_field, str) else (bin_field or {}).get("mcp-inspector")
    entry = package_dir / (relative or "cli/build/cli.js")
    if package.get("version") != INSPECTOR_VERSION or not entry.is_file():
        return None
    return InspectorCli(node=node, entry=entry, version=str(package["version"]))


def install_inspector(progress: Progress | None = None) -> InspectorCli:
    """The MCP Inspector (pinned) under ``<thirdparty>/inspector``, installed from npm on first use."""
    progress = progress or Progress()
    node = shutil.which("node")
    if node is None:
        unavailable(f"node is not on PATH: {INSPECTOR_PACKAGE} cannot run")
    prefix = thirdparty_dir() / "inspector"
    with _install_lock("inspector"):
        installed = _inspector_installed(node, prefix)
        if installed is None:
            npm = shutil.which("npm")
            if npm is None:
                unavailable(f"npm is not on PATH: {INSPECTOR_PACKAGE} cannot be installed")
            started = time.monotonic()
            progress(f"installing {INSPECTOR_PACKAGE}@{INSPECTOR_VERSION} into {prefix} (first run only)")
            prefix.mkdir(parents=True, exist_ok=True)
            spec = f"{INSPECTOR_PACKAGE}@{INSPECTOR_VERSION}"
            code, tail = _run_streamed(
                [npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund", spec], progress
            )
            installed = _inspector_installed(node, prefix)
            if code != 0 or installed is None:
                unavailable(f"npm could not install {spec} (exit {code}): {' | '.join(tail[-5:])}")
            progress(f"{spec} installed in {time.monotonic() - started:.1f}s")
    return installed
