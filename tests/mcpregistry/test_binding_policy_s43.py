"""Inline code the binding policy let through: PowerShell's ``-Command`` (its check sat under a lookup ``pwsh`` is
no key of, so it never ran), and the code-running options of ``dc``, ``julia``, ``guile``, ``erl``, ``gdb`` and
``make``, directly or under a wrapper; a program or script given to them is still accepted."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from mcpregistry.binding_policy import command_problem
from mcpregistry.models import McpServer

REFUSED = [
    ("pwsh", ["-Command", "x"]),
    ("pwsh", ["-c", "x"]),
    ("pwsh", ["-NoProfile", "-ec", "ZQBjAGgAbwA="]),
    ("pwsh.exe", ["-EncodedCommand", "ZQBjAGgAbwA="]),
    ("powershell", ["-Command", "x"]),
    ("powershell.exe", ["-Command", "x"]),
    ("/usr/bin/pwsh", ["--command", "x"]),
    ("pwsh", ["/Command", "x"]),
    ("pwsh", ["-Command:x"]),
    ("pwsh", ["-CommandWithArgs", "x"]),
    ("pwsh", ["\u2013c", "x"]),  # an en dash: PowerShell reads it as "-"
    ("dc", ["-e", "!id"]),
    ("dc", ["calc.dc", "-e", "!id"]),  # getopt permutes: an option after a file is read
    ("dc", ["--expression=!id"]),
    ("dc", ["--expr", "!id"]),  # getopt_long takes a prefix
    ("julia", ["-e", "run(`id`)"]),
    ("julia", ["-E", "1"]),
    ("julia", ["--threads", "4", "--eval", "1"]),
    ("julia-1.10", ["--ev", "1"]),
    ("guile", ["-c", '(system "id")']),
    ("guile", ["-L", "/srv", "-c", "1"]),
    ("erl", ["-noshell", "-eval", 'os:cmd("id")']),
    ("erl", ["+P", "1000", "-pa", "ebin", "--", "x", "-eval", "1"]),
    ("gdb", ["-batch", "-ex", "shell id"]),
    ("gdb", ["--eval-command=shell id"]),
    ("gdb", ["prog", "-iex", "shell id"]),
    ("gdb", ["-eval", "shell id"]),
    ("make", ["--eval=x:=$(shell id)"]),
    ("make", ["-E", "x"]),
    ("gmake", ["all", "-C", "/srv", "--ev", "x"]),
    ("timeout", ["5", "julia", "-e", "1"]),
    ("env", ["FOO=1", "dc", "-e", "!id"]),
    ("nice", ["gdb", "-ex", "shell id"]),
    ("sudo", ["-u", "svc", "pwsh", "-c", "x"]),
]


@pytest.mark.parametrize(("command", "args"), REFUSED, ids=[" ".join([c, *a]) for c, a in REFUSED])
def test_inline_code_to_powershell_and_the_other_interpreters_is_refused(command: str, args: list[str]) -> None:
    assert "inline code" in (command_problem(command, args, []) or "")


ACCEPTED = [
    ("pwsh", ["-File", "server.ps1"]),
    ("pwsh", ["-NoProfile", "./server.ps1"]),
    ("dc", ["calc.dc"]),
    ("julia", ["--project=.", "server.jl", "-e"]),  # the script's own argument
    ("guile", ["-s", "server.scm", "-c", "x"]),
    ("guile", ["-e", "main", "-s", "server.scm"]),
    ("erl", ["-noshell", "-s", "server", "start"]),
    ("erl", ["-extra", "-eval", "x"]),
    ("gdb", ["-batch", "-x", "cmds.gdb", "--args", "prog", "-ex"]),
    ("gdb", ["-exec", "prog"]),
    ("make", ["-C", "/srv/server", "run"]),
    ("make", ["-f", "Makefile", "serve"]),
    ("timeout", ["5", "julia", "server.jl"]),
]


@pytest.mark.parametrize(("command", "args"), ACCEPTED, ids=[" ".join([c, *a]) for c, a in ACCEPTED])
def test_a_script_or_program_given_to_them_is_accepted(command: str, args: list[str]) -> None:
    assert command_problem(command, args, []) is None


def test_an_exact_allowlisted_line_is_accepted_and_the_model_refuses_the_others(db: None) -> None:
    assert command_problem("pwsh", ["-Command", "x"], ["pwsh -Command x"]) is None
    server = McpServer(mcp_id="ps", name="ps", transport="stdio", command="pwsh", args=["-Command", "Start-Server"])
    with pytest.raises(ValidationError) as refused:
        server.full_clean()
    assert "inline code" in str(refused.value.message_dict["command"])
