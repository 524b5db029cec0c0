"""A stored binding's program and arguments are checked again when its session opens, as its URL and environment's
names are: a row written around ``clean`` (``.update()``, a dump restored) or saved before the operator narrowed
``PLATFORM_STDIO_COMMAND_ALLOWLIST`` ran its inline code or its program at the next discovery or call."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as dj_settings

from mcpregistry.binding_policy import binding_problem, env_name_problem
from mcpregistry.models import McpServer
from mcpregistry.services import mcp_server_create, mcp_server_discover

pytestmark = pytest.mark.django_db


def test_inline_code_written_around_clean_never_runs(tmp_path: Path) -> None:
    mark = tmp_path / "ran"
    server = mcp_server_create(
        actor="t",
        via="t",
        data={"mcp_id": "around", "name": "a", "command": sys.executable, "args": ["-m", "mcpregistry.demo_server"]},
    )
    code = f"open({str(mark)!r}, 'w').write('ran')"
    McpServer.objects.filter(pk=server.pk).update(args=["-c", code])

    report = mcp_server_discover(server=McpServer.objects.get(pk=server.pk), actor="t", via="t")

    assert not report.ok and "-c" in (report.error or "") and "inline code" in (report.error or ""), report.error
    assert not mark.exists()


@pytest.mark.slow
def test_a_program_the_operator_took_off_the_allowlist_is_not_started(settings: Any, tmp_path: Path) -> None:
    data = {"mcp_id": "listed", "name": "l", "command": sys.executable, "args": ["-m", "mcpregistry.demo_server"]}
    server = mcp_server_create(actor="t", via="t", data=data | {"cwd": str(dj_settings.BASE_DIR)})
    assert mcp_server_discover(server=server, actor="t", via="t").ok

    settings.PLATFORM_STDIO_COMMAND_ALLOWLIST = ["npx"]
    from mcpregistry.pool import get_default_pool

    get_default_pool().close(server.mcp_id)  # the open session was made under the old setting
    report = mcp_server_discover(server=McpServer.objects.get(pk=server.pk), actor="t", via="t")

    assert not report.ok and "PLATFORM_STDIO_COMMAND_ALLOWLIST" in (report.error or ""), report.error


def test_an_exact_line_the_operator_listed_still_connects(settings: Any) -> None:
    line = [sys.executable, "-c", "print(1)"]
    config = {"transport": "stdio", "command": line[0], "args": line[1:], "env": {}}
    assert binding_problem(config, settings) is not None
    settings.PLATFORM_STDIO_COMMAND_ALLOWLIST = [f"{sys.executable} -c 'print(1)'"]
    assert binding_problem(config, settings) is None
    assert binding_problem(config | {"args": ["-c", "print(2)"]}, settings) is not None


@pytest.mark.parametrize("name", ["NPM_CONFIG_REGISTRY", "npm_config_registry", "NPM_CONFIG_HTTPS_PROXY"])
def test_an_npm_mirror_or_proxy_may_be_set(name: str) -> None:
    """An internal npm mirror is how ``npx`` servers are fetched in many companies: refused with every
    ``NPM_CONFIG_`` name, an old binding using one no longer imported nor connected."""
    assert env_name_problem(name) is None


@pytest.mark.parametrize(
    "name", ["NPM_CONFIG_SCRIPT_SHELL", "NPM_CONFIG_NODE_OPTIONS", "NPM_CONFIG_CALL", "NPM_CONFIG_USERCONFIG"]
)
def test_npm_settings_that_run_or_load_code_stay_refused(name: str) -> None:
    assert env_name_problem(name) is not None


def test_env_s_abbreviated_is_read_as_split_string_and_deno_s_eval_only_as_its_subcommand() -> None:
    from mcpregistry.binding_policy import command_problem

    assert command_problem("env", ["--s=sh -c id"], []) is not None  # GNU env reads --s as --split-string
    assert command_problem("deno", ["eval", "console.log(1)"], []) is not None
    assert command_problem("deno", ["repl", "--eval=Deno.exit()"], []) is not None
    assert command_problem("deno", ["run", "-A", "server.ts", "--mode", "eval"], []) is None  # the server's own


@pytest.mark.parametrize(
    ("command", "args"),
    [
        ("env", ["FOO=1", "node", "server.js", "--mode", "watch"]),
        ("env", ["LOG_LEVEL=info", "python3", "-m", "server", "--data-dir", "/var/lib/mcp/watch"]),
        ("nice", ["-n", "10", "node", "server.js", "--runtime", "python", "-c", "config.json"]),
        ("timeout", ["--signal", "KILL", "600", "node", "server.js", "--mode", "eval"]),
        ("sudo", ["-u", "mcp", "node", "server.js", "--mode", "watch"]),
    ],
)
def test_what_follows_the_program_a_known_wrapper_runs_is_that_program_s_own(command: str, args: list[str]) -> None:
    """A wrapper's every later argument was read as a program: ``watch``, ``/var/lib/mcp/watch`` or ``python -c
    config.json`` given to the server refused the binding, where the same line without ``env`` was accepted."""
    from mcpregistry.binding_policy import command_problem

    assert command_problem(command, args, []) is None


@pytest.mark.parametrize(
    ("command", "args"),
    [
        ("sudo", ["-u", "python", "sh", "-c", "id"]),  # an option's value named like an interpreter
        ("sudo", ["--close-from", "3", "sh", "-c", "id"]),
        ("timeout", ["--sig", "KILL", "600", "sh", "-c", "id"]),  # an abbreviated long option
        ("timeout", ["-k5", "600", "node", "-e", "1"]),
        ("nice", ["-10", "sh", "-c", "id"]),
        ("stdbuf", ["-oL", "python3", "-c", "1"]),
        ("timeout", ["600", "/nowhere/server", "sh", "-c", "id"]),  # a program not found here: every argument read
    ],
)
def test_a_known_wrapper_s_program_is_still_checked_with_its_arguments(command: str, args: list[str]) -> None:
    from mcpregistry.binding_policy import command_problem

    assert command_problem(command, args, []) is not None
