"""Two ways around the refusal of inline code a review found: a wrapper's option whose value the policy did not know
it takes (``sudo -a ls node -e CODE``: ``ls``, found on the machine, was taken for the program sudo runs, and what
followed for ls's own arguments), and deno's log level read as its subcommand (``deno -L info eval CODE``). An
option the policy does not know makes it look at every later argument; legitimate bindings stay accepted."""

from __future__ import annotations

import shutil

import pytest

from mcpregistry.binding_policy import command_problem

# The bypass needs a program found on the machine for the option's value: ls.
pytestmark = pytest.mark.skipif(shutil.which("ls") is None, reason="no ls on PATH")


@pytest.mark.parametrize(
    "command,args",
    [
        ("sudo", ["-a", "ls", "node", "-e", "require('child_process').execSync('id')"]),
        ("sudo", ["--auth-type", "ls", "node", "-e", "x"]),
        ("sudo", ["-c", "ls", "python3", "-c", "import os"]),
        ("sudo", ["--login-class", "ls", "bash", "-c", "id"]),
        ("sudo", ["--login-c", "ls", "bash", "-c", "id"]),  # GNU getopt takes an unambiguous prefix
        ("sudo", ["-na", "ls", "node", "-e", "x"]),  # a valued letter ending a cluster takes the next argument
        ("sudo", ["-h", "ls", "node", "-e", "x"]),  # -h HOST
        # An option the table does not know: its value may be what was taken for the program.
        ("sudo", ["-X", "ls", "bash", "-c", "id"]),
        ("sudo", ["--new-option", "ls", "bash", "-c", "id"]),
        ("env", ["--frobnicate", "ls", "bash", "-c", "id"]),
        ("env", ["-L", "ls", "bash", "-c", "id"]),  # BSD env -L user
        ("timeout", ["-Z", "ls", "30", "bash", "-c", "id"]),
        ("nice", ["-x", "ls", "bash", "-c", "id"]),
        ("setsid", ["-q", "ls", "bash", "-c", "id"]),
        ("stdbuf", ["-z", "ls", "bash", "-c", "id"]),
        ("ionice", ["-k", "ls", "bash", "-c", "id"]),
        ("nohup", ["-q", "ls", "bash", "-c", "id"]),
        # deno's global options' values are no subcommand.
        ("deno", ["-L", "info", "eval", "CODE"]),
        ("deno", ["--log-level", "debug", "eval", "CODE"]),
        ("deno", ["--log-level=debug", "eval", "CODE"]),
        ("deno", ["-qL", "info", "eval", "CODE"]),
        ("deno", ["-c", "deno.json", "eval", "CODE"]),
        ("deno", ["-L", "info", "repl", "--eval=Deno.exit()"]),
        # An option deno's table does not know before the subcommand: any later eval (or repl --eval) is refused.
        ("deno", ["--seed", "run", "eval", "CODE"]),
        ("deno", ["--location", "https://x.test", "eval", "CODE"]),
        ("deno", ["--import-map", "repl", "repl", "--eval", "CODE"]),
    ],
)
def test_an_option_s_value_is_not_taken_for_the_program_or_subcommand(command: str, args: list[str]) -> None:
    assert "inline code" in (command_problem(command, args, []) or ""), (command, args)


@pytest.mark.parametrize(
    "command,args",
    [
        ("sudo", ["-u", "mcp", "/usr/local/bin/server", "--flag"]),
        ("sudo", ["-u", "mcp", "ls", "--mode", "eval"]),
        ("sudo", ["-a", "bsdauth", "ls", "--mode", "eval"]),
        ("sudo", ["--login-class", "staff", "ls", "--mode", "eval"]),
        ("sudo", ["-nu", "mcp", "ls", "bash", "-c", "id"]),  # sudo runs ls: bash, -c, id are ls's arguments
        ("sudo", ["-E", "--preserve-env=HOME", "FOO=1", "ls", "eval"]),
        ("env", ["FOO=1", "python3", "server.py"]),
        ("env", ["-i", "FOO=1", "ls", "eval"]),
        ("env", ["--block-signal", "ls", "--mode", "eval"]),  # its value only after "=": ls is the program
        ("timeout", ["30", "uvx", "mcp-server-time"]),
        ("timeout", ["-s", "KILL", "--foreground", "30", "ls", "eval"]),
        ("timeout", ["--kill-after=5", "-v", "30", "ls", "eval"]),
        ("nice", ["-10", "ls", "eval"]),
        ("nice", ["-n", "5", "ls", "eval"]),
        ("ionice", ["-c", "3", "-t", "ls", "eval"]),
        ("setsid", ["-w", "ls", "eval"]),
        ("stdbuf", ["-oL", "-e", "0", "ls", "eval"]),
        ("nohup", ["ls", "eval"]),
        ("npx", ["-y", "@modelcontextprotocol/server-filesystem", "/srv/watch"]),
        ("deno", ["run", "server.ts", "--mode", "eval"]),
        ("deno", ["-L", "info", "run", "-A", "server.ts", "--mode", "eval"]),
        ("deno", ["--log-level=debug", "run", "server.ts", "eval"]),
        ("deno", ["-q", "-A", "server.ts", "eval"]),
        ("deno", ["--allow-net=api.test", "-R=/srv", "--unstable-kv", "run", "server.ts", "eval"]),
        ("deno", ["--config", "deno.json", "serve", "main.ts", "repl", "--eval"]),
    ],
)
def test_legitimate_look_alikes_are_still_accepted(command: str, args: list[str]) -> None:
    assert command_problem(command, args, []) is None
