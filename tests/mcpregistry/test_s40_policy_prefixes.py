"""The final review of the wrapper tables: a shortened long option that runs a shell command line got past the
binding policy (getopt_long and npm take any unambiguous prefix: ``su --comm CMD`` is ``su --command CMD``), and
options the new tables did not know refused legitimate lines (``deno --reload run server.ts``, coreutils 9.6's
``timeout -p``)."""

from __future__ import annotations

import shutil

import pytest

from mcpregistry.binding_policy import command_problem

# The programs the wrappers run are looked for on the machine that checks.
pytestmark = pytest.mark.skipif(shutil.which("python3") is None, reason="no python3 on PATH")


@pytest.mark.parametrize(
    "line",
    [
        "su --comm id mcp",
        "su --session-comm id mcp",
        "flock --comm id /tmp/lock",
        "runuser --comm id mcp",
        "script --comm id",
        "sudo --sh node s.js",
        "sudo --logi node s.js",
        "npx --ca id some-package",
        "npx --shell pkg",
    ],
)
def test_a_shortened_option_that_runs_a_shell_command_line_is_refused(line: str) -> None:
    program, *args = line.split()
    assert command_problem(program, args, []) is not None


@pytest.mark.parametrize(
    "line",
    [
        "timeout -p 30 python3 server.py --mode eval",
        "timeout -f 30 python3 server.py --mode eval",
        "deno --reload run server.ts --mode eval",
        "deno -r run server.ts --mode eval",
        "deno --no-check run server.ts --mode eval",
        "deno --cached-only run server.ts --mode eval",
        "deno --v8-flags=--max-old-space-size=100 run server.ts --mode eval",
        "npx --cache /tmp/npm -y @modelcontextprotocol/server-filesystem /srv/watch",
        "sudo -u mcp /usr/local/bin/server --flag",
    ],
)
def test_legitimate_lines_with_those_options_are_accepted(line: str) -> None:
    program, *args = line.split()
    assert command_problem(program, args, []) is None


@pytest.mark.parametrize(
    "line",
    [
        "deno --reload eval CODE",
        "deno -rL info eval CODE",
        "deno --no-check eval CODE",
        "deno run data:text/javascript,Deno.exit(0)",  # a data: URL is the main module, inline
        "deno run -A DATA:text/javascript;base64,RGVubw==",
    ],
)
def test_deno_eval_after_those_options_is_still_refused(line: str) -> None:
    program, *args = line.split()
    assert command_problem(program, args, []) is not None
