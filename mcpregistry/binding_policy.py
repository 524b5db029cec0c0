"""What a binding may point at: refused before it is saved (``McpServer.clean``), whoever saves it.

Binding a server makes every worker connect to a URL or start a program with the worker's rights, so:

* **URLs** may not reach link-local, cloud metadata, loopback, private, reserved or multicast addresses (an IP
  literal in any of its spellings: ``127.1``, ``2130706433``, ``0x7f.1``, ``[::1]``, ``[::ffff:10.0.0.1]``), nor
  the names that mean them (``localhost``, ``*.localhost``, ``metadata.google.internal``, ...), unless
  ``PLATFORM_MCP_ALLOW_PRIVATE_URLS`` lists the host, ``host:port`` or a network (``10.1.0.0/16``). The host is
  read as the HTTP client reads it (IDNA: ``127。0。0。1`` with full-width or ideographic dots is ``127.0.0.1``).
  Names are not resolved here (no DNS at save time): an operator who lets bindings name internal hosts by DNS
  should also filter egress at the network.
* **stdio commands** may not be a shell or an interpreter given inline code (``bash -c``, ``sh -c``,
  ``python -c``, ``node -e``, ``perl -e``, ``env bash -c``, ...), unless ``PLATFORM_STDIO_COMMAND_ALLOWLIST``
  holds that exact command line (an entry with arguments, e.g. ``"python -c print(1)"``); an entry without
  arguments allows that program with any arguments that are not inline code.
* **``{"from_env": "VAR"}``** secret references may read only variables named in
  ``PLATFORM_MCP_ENV_PASSTHROUGH`` (otherwise a binding could hand the worker's ``DATABASE_URL`` to a server).
* **Secrets in settings**: a URL, an argument, a command (or a rule's params) holding what the audit hides as a
  secret (``audit.masking``: ``?api_key=…``, ``--api-key=…``, ``sk-…``) would be stored, shown and exported in
  clear; it belongs in a secret header or environment value. Nor is the audit's mask (``***``) a secret's value.

Pure functions over plain values; each returns a problem (a sentence naming what to change) or None.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shlex
import shutil
import socket
from collections.abc import Iterable
from typing import Any, Literal, NamedTuple
from urllib.parse import urlparse

import httpx
from django.utils.translation import gettext as _

from audit.masking import MASK, holds_secret

METADATA_HOSTS = frozenset(
    {
        "metadata",
        "metadata.google.internal",
        "metadata.goog",
        "instance-data",
        "instance-data.ec2.internal",
        "metadata.azure.com",
        "metadata.platformequinix.com",
    }
)
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a) for a in ("169.254.169.254", "169.254.170.2", "100.100.100.200", "fd00:ec2::254")
)

# What a program name means to the policy: ``/usr/bin/python3.11`` → ``python``, ``perl5.36.0`` → ``perl``,
# ``rbash`` → ``sh``. A name no pattern matches is itself (lower case, without ``.exe``).
_PROGRAM_NAMES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(pattern))
    for name, pattern in (
        ("python", r"(?:python|pypy|ipython|jython|graalpy)[\d.]*[a-z]?(?:-dbg)?"),
        ("node", r"node(?:js)?[\d.]*|tsx|ts-node(?:-esm)?"),
        ("perl", r"perl[\d.]*"),
        ("ruby", r"(?:j|truffle)?ruby[\d.]*"),
        ("php", r"php[\d.]*(?:-cli)?"),
        ("lua", r"(?:lua|luajit)[\d.]*"),
        ("rscript", r"r|rscript"),
        ("sh", r"(?:ba|rba|da|a|k|mk|pdk|ok|lk|z|tc|c|ya|po|o)?sh[\d.]*|ksh93|fish|elvish|xonsh|nu"),
        ("awk", r"[gmn]?awk"),
        ("sed", r"g?sed"),
        ("expect", r"expect"),
        ("pwsh", r"pwsh(?:-preview)?|powershell"),
        ("julia", r"julia[\d.-]*"),
        ("guile", r"guile[\d.-]*"),
        ("gdb", r"gdb(?:-multiarch)?"),
        ("make", r"g?make"),
        ("nc", r"nc|ncat|netcat(?:\.[a-z]+)?"),
    )
)


class _Interpreter(NamedTuple):
    """How an interpreter reads its options: ``code``, the short option letters whose value is inline code (also
    inside a cluster: ``-Ic``, ``-we``, ``-pe``); ``valued``, the letters that take the rest of the argument or the
    next one as their value (``-W error``, ``-Mstrict``); ``numbered``, those followed by digits only (perl's
    ``-0777``, ``-l``); ``long_code``, the long options whose value is code (with one dash for those that spell
    their long options so: ``erl -eval``, ``gdb -ex``); ``long_valued``, the long options that take the next
    argument; ``loaders``, the options that load a module, refused with a ``data:`` or ``http(s):`` URL (code
    written in the argument); ``abbreviated``, whether a long option may be shortened to any unambiguous prefix
    (getopt_long: ``dc --expr``, ``gdb -eval``); ``permuted``, whether options may follow the other arguments
    (getopt's permutation: ``dc FILE -e CODE``), up to one of ``ends`` (``--``; erl's ``-extra``)."""

    code: str
    valued: str = ""
    numbered: str = ""
    long_code: frozenset[str] = frozenset()
    long_valued: frozenset[str] = frozenset()
    loaders: frozenset[str] = frozenset()
    abbreviated: bool = False
    permuted: bool = False
    ends: frozenset[str] = frozenset({"--", "-"})


_NODE_VALUED = frozenset(
    "--" + o
    for o in [
        "allow-fs-read",
        "allow-fs-write",
        "build-snapshot-config",
        "conditions",
        "cpu-prof-dir",
        "cpu-prof-interval",
        "cpu-prof-name",
        "diagnostic-dir",
        "disable-proto",
        "disable-warning",
        "dns-result-order",
        "env-file",
        "env-file-if-exists",
        "experimental-default-type",
        "experimental-policy",
        "experimental-sea-config",
        "heap-prof-dir",
        "heap-prof-interval",
        "heap-prof-name",
        "heapsnapshot-near-heap-limit",
        "heapsnapshot-signal",
        "icu-data-dir",
        "import",
        "input-type",
        "inspect-publish-uid",
        "max-http-header-size",
        "openssl-config",
        "policy-integrity",
        "redirect-warnings",
        "report-filename",
        "report-signal",
        "require",
        "secure-heap",
        "secure-heap-min",
        "snapshot-blob",
        "test-concurrency",
        "test-name-pattern",
        "test-reporter",
        "test-reporter-destination",
        "test-shard",
        "test-timeout",
        "title",
        "tls-cipher-list",
        "tls-keylog",
        "trace-event-categories",
        "trace-event-file-pattern",
        "trace-require-module",
        "unhandled-rejections",
        "use-largepages",
        "v8-pool-size",
        "watch-path",
        "loader",
        "experimental-loader",
    ]
)
_JULIA_VALUED = frozenset(
    {"--home", "--load", "--sysimage", "--cpu-target", "--procs", "--threads", "--gcthreads", "--machine-file",
     "--color", "--history-file", "--startup-file", "--compile", "--depwarn", "--check-bounds", "--banner",
     "--math-mode", "--inline", "--module", "--handle-signals"}
)  # fmt: skip
# gdb reads its long options with one dash or two (getopt_long_only).
_GDB_CODE = frozenset(
    {"-ex", "--ex", "-iex", "--iex", "-eval-command", "--eval-command", "-init-eval-command", "--init-eval-command"}
)
_MAKE_VALUED = frozenset(
    {"--directory", "--file", "--makefile", "--include-dir", "--old-file", "--assume-old", "--what-if", "--new-file",
     "--assume-new"}
)  # fmt: skip
_SHELL = _Interpreter(code="c", valued="oO", long_valued=frozenset({"--rcfile", "--init-file"}))
INTERPRETERS: dict[str, _Interpreter] = {
    "sh": _SHELL,
    "python": _Interpreter(code="c", valued="WXm", long_valued=frozenset({"--check-hash-based-pycs"})),
    "node": _Interpreter(
        code="ep",
        valued="rC",
        long_code=frozenset({"--eval", "--print"}),
        long_valued=_NODE_VALUED,
        loaders=frozenset({"-r", "--require", "--import", "--loader", "--experimental-loader"}),
    ),
    "bun": _Interpreter(code="ep", valued="r", long_code=frozenset({"--eval", "--print"})),
    "deno": _Interpreter(code=""),
    "perl": _Interpreter(code="eE", valued="IMmxidDCV", numbered="0l"),
    "ruby": _Interpreter(code="e", valued="IrCEFiTWxX", numbered="0"),
    "php": _Interpreter(
        code="rBRE",
        valued="cdfzt",
        long_code=frozenset({"--run", "--process-begin", "--process-code", "--process-end"}),
    ),
    "lua": _Interpreter(code="e", valued="l"),
    "rscript": _Interpreter(code="e", long_code=frozenset({"--expr"})),
    "expect": _Interpreter(code="c", valued="fD"),
    "osascript": _Interpreter(code="e"),
    "pdb": _Interpreter(code="c", long_code=frozenset({"--command"})),
    "vim": _Interpreter(code="c", long_code=frozenset({"--cmd"})),
    "nc": _Interpreter(code="ec"),  # nc -e sh: a shell for whoever is at the other end
    # dc's "!" runs a shell command line.
    "dc": _Interpreter(
        code="e",
        valued="f",
        long_code=frozenset({"--expression"}),
        long_valued=frozenset({"--file"}),
        abbreviated=True,
        permuted=True,
        ends=frozenset({"--"}),
    ),
    "julia": _Interpreter(
        code="eE",
        valued="HLJCtpOgm",
        long_code=frozenset({"--eval", "--print"}),
        long_valued=_JULIA_VALUED,
        abbreviated=True,
    ),
    # -s FILE: a script, and what follows is its own.
    "guile": _Interpreter(code="c", valued="lLCxe"),
    # Options anywhere but after -extra (after "--" too, up to the next option); +flags are the emulator's.
    "erl": _Interpreter(code="", long_code=frozenset({"-eval"}), permuted=True, ends=frozenset({"-extra"})),
    "gdb": _Interpreter(
        code="",
        long_code=_GDB_CODE,
        abbreviated=True,
        permuted=True,
        ends=frozenset({"--", "--args", "-args"}),
    ),
    # make's --eval TEXT is read as a makefile: "$(shell …)" runs a shell command line.
    "make": _Interpreter(
        code="E",
        valued="CfIoW",
        long_code=frozenset({"--eval"}),
        long_valued=_MAKE_VALUED,
        abbreviated=True,
        permuted=True,
        ends=frozenset({"--"}),
    ),
}
# Programs whose (first) argument is a program of their own: refused unless it is read from a file.
_SCRIPT_FROM_FILE = {"awk": ("fE", "vFWil", ""), "sed": ("f", "l", "i")}
# Programs that run the program named among their arguments (``env VAR=1 prog``, ``timeout 10 prog``): the program
# they run is checked with its arguments. Those that take a shell command line are refused with the option that
# takes it.
WRAPPERS = frozenset(
    [
        "env",
        "timeout",
        "nice",
        "nohup",
        "setsid",
        "stdbuf",
        "xargs",
        "chroot",
        "strace",
        "ltrace",
        "sudo",
        "doas",
        "runuser",
        "ionice",
        "taskset",
        "time",
        "command",
        "exec",
        "builtin",
        "unbuffer",
        "chrt",
        "cgexec",
        "firejail",
        "bwrap",
        "nsenter",
        "unshare",
        "prlimit",
        "numactl",
        "catchsegv",
        "valgrind",
        "busybox",
        "toybox",
        "find",
        "flock",
        "script",
        "su",
        "sg",
        "newgrp",
        "pkexec",
        "proot",
        "fakeroot",
        "faketime",
        "torsocks",
        "proxychains",
        "proxychains4",
        "xvfb-run",
        "dbus-run-session",
        "systemd-run",
        "caffeinate",
    ]
)
_WRAPPER_SHELL_OPTIONS = {
    "flock": ("c", "--command"),
    "script": ("c", "--command"),
    "su": ("c", "--command", "--session-command"),
    "runuser": ("c", "--command", "--session-command"),
    "sudo": ("si", "--shell", "--login"),
    "sg": ("c",),
    "xvfb-run": ("", "--xauth-command"),
}
# Runners that fetch a package and run one of its programs (``npx -y pkg``, ``uvx mcp-server-time``): refused with
# the option that runs a shell command line; the program they run is checked like a wrapper's.
_RUNNERS: dict[str, tuple[str, ...]] = {
    "npx": ("c", "--call", "--shell-mode"),
    "pnpx": ("c", "--call", "--shell-mode"),
    "bunx": ("", "--call"),
    "uvx": ("",),
    "pipx": ("",),
    "uv": ("",),
}
_RUNNER_COMMANDS = {"npm": {"exec", "x"}, "pnpm": {"dlx", "exec"}, "yarn": {"dlx", "exec"}, "bun": {"x"}}
# A runner's words before the program it runs (``uv run``, ``uv tool run``, ``pipx run``), and its options that take
# the next argument as their value (``npx -p pkg``, ``uvx --from pkg``): the first other argument is the program
# (package) it runs, and what follows is that program's own (``npx -y server-filesystem /srv/watch`` is no
# ``watch``; ``npx -y pkg -c cfg`` is the package's ``-c``).
_RUNNER_WORDS = frozenset({"run", "tool", "exec", "x", "dlx"})
_RUNNER_VALUED = frozenset(
    {"-p", "--package", "--from", "--with", "--with-editable", "--with-requirements", "--python", "--spec",
     "--index", "--index-url", "--extra-index-url", "--default-index", "--find-links", "-f", "--constraints",
     "--overrides", "--pip-args", "-w", "--workspace", "--directory", "--project", "--env-file"}
)  # fmt: skip
# Programs whose arguments are code: ``python -m timeit CODE``, ``watch CMD`` (a shell command line),
# ``python -m idlelib -c CODE``.
_CODE_ARGUMENTS = frozenset({"timeit", "watch", "eval", "idlelib"})
# Python modules that run another module or script as Python does (``python -m cProfile -m timeit CODE``).
_PYTHON_RUNNING_MODULES = frozenset({"cprofile", "profile", "trace", "runpy"})
_CODE_URL = re.compile(r"(?:data|https?):", re.IGNORECASE)


def _program(command: str) -> str:
    """``/usr/bin/python3.11`` → ``python``; ``rbash`` → ``sh``; ``timeout`` → ``timeout``."""
    name = os.path.basename(command).lower().removesuffix(".exe")
    for canonical, pattern in _PROGRAM_NAMES:
        if pattern.fullmatch(name):
            return canonical
    return name


def _options(spec: _Interpreter, args: list[str]) -> tuple[str | None, list[str]]:
    """The argument of ``args`` that gives the interpreter inline code, or None; and, for ``python -m MODULE``, the
    module and its arguments (a program of its own: ``-m timeit CODE``)."""
    i = 0
    while i < len(args):
        arg = args[i]
        following = args[i + 1] if i + 1 < len(args) else ""
        if arg in spec.ends:
            return None, []
        if arg == "-" or not arg.startswith(("-", "+")) or (arg.startswith("+") and spec is not _SHELL):
            if spec.permuted:  # a file, a target: options may follow it
                i += 1
                continue
            return None, []  # the script: the arguments after it are its own
        if _long_option(spec, arg.partition("=")[0].lower(), spec.long_code):
            return arg, []
        if arg.startswith("--"):
            name, equals, value = arg.partition("=")
            name = name.lower()
            if not equals and _long_option(spec, name, spec.long_valued):
                value, i = following, i + 1
            if name in spec.loaders and _CODE_URL.match(value.strip()):
                return arg, []
            i += 1
            continue
        letters = arg[1:]
        j = 0
        while j < len(letters):
            letter = letters[j]
            if letter in spec.code and arg.startswith("-"):
                return arg, []
            if letter in spec.numbered:
                j += 1
                while j < len(letters) and (letters[j].isdigit() or letters[j] in "xX"):
                    j += 1
                continue
            if letter in spec.valued:
                value = letters[j + 1 :]
                if not value:
                    value, i = following, i + 1
                if f"-{letter}" in spec.loaders and _CODE_URL.match(value.strip()):
                    return arg, []
                if spec is INTERPRETERS["perl"] and letter in "Mm" and not _PERL_MODULE.fullmatch(value):
                    return arg, []  # -M'strict;system(...)': perl writes "use strict;system(...);"
                if spec is INTERPRETERS["python"] and letter == "m":
                    return None, [value, *args[i + 1 :]]
                break
            j += 1
        i += 1
    return None, []


_PERL_MODULE = re.compile(r"-?[\w:]+(?:=[\w,.:/+-]*)?")


def _long_option(spec: _Interpreter, name: str, options: frozenset[str]) -> bool:
    """Whether the long option ``name`` (lowercased, its ``=value`` cut) is one of ``options``, or, where ``spec``
    takes shortened long options, a prefix of one (an ambiguous prefix is an error there, taken alike here)."""
    return name in options or (
        spec.abbreviated and len(name.lstrip("-")) > 1 and any(option.startswith(name) for option in options)
    )


def _script_from_file(spec: tuple[str, str, str], args: list[str]) -> str | None:
    """For ``awk``/``sed`` (``spec``: the option letters that read the program from a file, those that take another
    value, those whose value can only follow in the same argument): the argument that gives the program inline, or
    None when it is read from a file."""
    file_letters, valued, attached = spec
    from_file, i = False, 0
    while i < len(args):
        arg = args[i]
        if arg == "--" or not arg.startswith("-") or arg == "-":
            break
        name = arg.partition("=")[0].lower()
        if name in {"--source", "--expression"}:
            return arg
        if name in {"--file", "--exec", "--include", "--load"}:
            from_file = from_file or name in {"--file", "--exec"}
            i += 1 if "=" in arg else 2
            continue
        if arg.startswith("--"):
            i += 1
            continue
        for j, letter in enumerate(arg[1:]):
            if letter == "e":
                return arg
            if letter in attached:
                break
            if letter in file_letters or letter in valued:
                from_file = from_file or letter in file_letters
                i += 0 if arg[j + 2 :] else 1
                break
        i += 1
    if from_file:
        return None
    return args[i] if i < len(args) else None


def _expanded(args: list[str]) -> list[str] | None:
    """``env``'s arguments with its ``-S STRING`` (``--split-string``) split as ``env`` splits it, or None where
    the string cannot be read (unbalanced quotes, a ``$`` to expand)."""
    out: list[str] = []
    i = 0
    while i < len(args):
        arg, string = args[i], None
        name, equals, value = arg.partition("=")
        if len(name) >= 3 and "--split-string".startswith(name):  # GNU getopt takes any unambiguous prefix: --s
            string = value if equals else (args[i + 1] if i + 1 < len(args) else "")
            i += 0 if equals else 1
        elif arg.startswith("-") and not arg.startswith("--") and "S" in arg:
            value = arg[arg.index("S") + 1 :]
            string = value if value else (args[i + 1] if i + 1 < len(args) else "")
            i += 0 if value else 1
        if string is None:
            out.append(arg)
        else:
            if "$" in string:
                return None
            try:
                out.extend(shlex.split(string))
            except ValueError:
                return None
        i += 1
    return out


def _inline_code(command: str, args: list[str], depth: int = 0) -> str | None:
    """The argument that runs inline code (or a shell command line) when ``command args`` runs, or None."""
    program = _program(command)
    if depth > 20:
        return command
    if program in _CODE_ARGUMENTS:
        return command
    if program in _PYTHON_RUNNING_MODULES:
        # Its own options, then ``-m MODULE`` or ``-c CODE`` as Python reads them: checked as Python would run them.
        at = next((i for i, a in enumerate(args) if a in {"-m", "-c"} or a.startswith(("-c", "--command"))), None)
        return None if at is None else _inline_code("python", args[at:], depth + 1)
    if program in _SCRIPT_FROM_FILE:
        return _script_from_file(_SCRIPT_FROM_FILE[program], args)
    if program == "pwsh":
        return next((a for a in args if _pwsh_command(a)), None)
    if (spec := INTERPRETERS.get(program)) is not None:
        if program == "deno":
            return _deno_inline_code(args)
        inline, module = _options(spec, args)
        if inline is None and module:
            return _inline_code(module[0], module[1:], depth + 1)
        return inline
    runner = program in _RUNNERS or (bool(args) and args[0] in _RUNNER_COMMANDS.get(program, ()))
    if program not in WRAPPERS and not runner:
        return None
    options = _RUNNERS.get(program) or _WRAPPER_SHELL_OPTIONS.get(program) or ("",)
    if runner and program in _RUNNER_COMMANDS:
        options = _RUNNERS["npx"]
    if program == "env":
        expanded = _expanded(args)
        if expanded is None:
            return next((a for a in args if "S" in a.partition("=")[0]), command)
        args = expanded
    if runner:
        return _runner_inline_code(program, args, options, depth)
    skip = False
    for arg in args:
        if arg == "--":
            break
        if skip:  # the value of env's -u NAME or -C DIR
            skip = False
            continue
        name = arg.partition("=")[0].lower()
        if program == "env" and arg in {"-u", "-C", "-a", "--unset", "--chdir", "--argv0"}:
            skip = True
            continue
        if arg.startswith("--") and _names_long_option(name, options[1:]):
            return arg
        if arg.startswith("-") and not arg.startswith("--") and any(letter in options[0] for letter in arg[1:]):
            return arg
        if program == "env" and arg.startswith("-") and not arg.startswith("--") and "P" in arg:
            return arg  # BSD env -P DIR: looks the program up in DIR
        if program == "env" and not arg.startswith("-") and "=" not in arg:
            break  # the program env runs: its own options follow
    # The program run is one of the arguments: each that may be one is checked with the arguments after it, up to
    # the one a wrapper whose options are known runs (found on this machine): what follows it is that program's own
    # (``env FOO=1 node server.js --mode watch`` was refused for ``watch``, ``timeout 1h uvx … /srv/eval`` for
    # ``eval``).
    known = _wrapped_program(program, args)
    for i, arg in enumerate(args[: None if known is None else known + 1]):
        if arg and not arg.startswith(("-", "+")) and (found := _inline_code(arg, args[i + 1 :], depth + 1)):
            return found
    return None


def _names_long_option(name: str, long_options: tuple[str, ...]) -> bool:
    """Whether the long option ``name`` (``--comm``, lowercased, its ``=value`` cut) is one of ``long_options`` or
    a shortening of one: getopt_long (util-linux's ``su``/``flock``/``script``, ``sudo``) and npm's parser take any
    unambiguous prefix, so ``su --comm CMD`` runs CMD as ``--command`` does (an ambiguous one is an error there,
    refused here alike)."""
    return len(name) > 2 and any(option.startswith(name) for option in long_options)


class _OptionSyntax(NamedTuple):
    """How a program reads its options (its man page or ``--help``): ``valued``, the short letters that take a value
    (the rest of the argument or the next one); ``flags``, those that take none; ``long_valued`` and ``long_flags``,
    the long names (one whose value is optional takes it only after ``=``: a flag here); ``positional``, the
    arguments before the program it runs (``timeout DURATION``); ``assignments``, whether ``NAME=VALUE`` arguments
    may come before it; ``abbreviated``, whether a long name may be shortened to any unambiguous prefix (GNU
    getopt: ``--u`` is ``--user``); ``flag_prefixes``, the beginnings of long names that take no value but after
    ``=`` (deno's ``--allow-read=/srv``)."""

    valued: str
    flags: str
    long_valued: frozenset[str] = frozenset()
    long_flags: frozenset[str] = frozenset({"--help", "--version"})
    positional: int = 0
    assignments: bool = False
    abbreviated: bool = True
    flag_prefixes: tuple[str, ...] = ()


# Wrappers whose options are known whole (GNU coreutils, util-linux, sudo's parse_args): an option not listed here
# stops the reading of their arguments (its value could be taken for the program), then each is looked at.
_WRAPPER_SYNTAX: dict[str, _OptionSyntax] = {
    "env": _OptionSyntax(
        "uCSaPLU", "i0v", frozenset({"--unset", "--chdir", "--split-string", "--argv0"}),
        frozenset({"--ignore-environment", "--null", "--debug", "--list-signal-handling", "--block-signal",
                   "--default-signal", "--ignore-signal", "--help", "--version"}), assignments=True),
    "timeout": _OptionSyntax(
        "ks", "vfp", frozenset({"--signal", "--kill-after"}),  # -f, -p: --foreground, --preserve-status (9.6)
        frozenset({"--preserve-status", "--foreground", "--verbose", "--help", "--version"}), positional=1),
    "nice": _OptionSyntax("n", "0123456789+", frozenset({"--adjustment"})),  # nice -10: an old spelling of -n 10
    "nohup": _OptionSyntax("", ""),
    "setsid": _OptionSyntax("", "cfwhV", long_flags=frozenset({"--ctty", "--fork", "--wait", "--help", "--version"})),
    "stdbuf": _OptionSyntax("ioe", "", frozenset({"--input", "--output", "--error"})),
    "ionice": _OptionSyntax(
        "cnpPu", "thV", frozenset({"--class", "--classdata", "--pid", "--pgid", "--uid"}),
        frozenset({"--ignore", "--help", "--version"})),
    # -h HOST takes the next argument unless it is an option (then it is --help): read as taking it.
    "sudo": _OptionSyntax(
        "aCcDghpRrTtUu", "AbBEeHiKklNnPSsVv",
        frozenset({"--auth-type", "--close-from", "--login-class", "--chdir", "--group", "--host", "--prompt",
                   "--chroot", "--role", "--type", "--command-timeout", "--other-user", "--user"}),
        frozenset({"--askpass", "--background", "--bell", "--preserve-env", "--edit", "--set-home", "--help",
                   "--login", "--remove-timestamp", "--reset-timestamp", "--list", "--no-update",
                   "--non-interactive", "--preserve-groups", "--stdin", "--shell", "--validate", "--version"}),
        assignments=True),
}  # fmt: skip


def _takes_value(syntax: _OptionSyntax, arg: str) -> bool | None:
    """Whether the option ``arg`` (``-a``, a cluster ``-ab``, ``-uNAME``, ``--name``, ``--name=VALUE``) takes the
    next argument as its value; None where ``syntax`` does not know it (nor, then, whether it does)."""
    if arg.startswith("--"):
        name, equals, _value = arg.partition("=")
        if name in syntax.long_flags:  # a name written whole is that option, also where it begins a longer one
            return False
        if name in syntax.long_valued or (syntax.abbreviated and any(n.startswith(name) for n in syntax.long_valued)):
            return not equals  # an ambiguous prefix is refused by the program: read as taking a value
        if (syntax.abbreviated and any(n.startswith(name) for n in syntax.long_flags)) or (
            syntax.flag_prefixes and name.startswith(syntax.flag_prefixes)
        ):
            return False
        return None
    letters = arg[1:]
    for j, letter in enumerate(letters):
        if letter in syntax.valued:
            return not letters[j + 1 :]
        if letter not in syntax.flags:
            return None
        if letters[j + 1 : j + 2] == "=":  # a flag's value after "=" (deno's -R=/srv)
            return False
    return False if letters else None


def _wrapped_program(wrapper: str, args: list[str]) -> int | None:
    """The index in ``args`` of the program a wrapper of :data:`_WRAPPER_SYNTAX` runs, where it is found on this
    machine; None where it is not, or where an option not known comes before it (its value could be taken for the
    program: ``sudo -a ls node -e CODE``): then every argument is looked at."""
    syntax = _WRAPPER_SYNTAX.get(wrapper)
    if syntax is None:
        return None
    positional, i = syntax.positional, 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            i += 1
            break
        if arg.startswith("-") and len(arg) > 1:
            takes = _takes_value(syntax, arg)
            if takes is None:
                return None
            i += 2 if takes else 1
            continue
        if syntax.assignments and "=" in arg:
            i += 1
            continue
        if positional:
            positional -= 1
            i += 1
            continue
        break
    if i >= len(args):
        return None
    program = args[i]
    if shutil.which(program) is None and not (os.path.isfile(program) and os.access(program, os.X_OK)):
        return None
    return i


# deno's options before its subcommand known here (``deno --help``: its global options, and those of ``deno run``
# that ``deno SCRIPT`` takes); a permission's value follows only after "=" (``-R=/srv``, ``--allow-net=host``).
_DENO_OPTIONS = _OptionSyntax(
    "Lc", "qhVvAPRWNESIr", frozenset({"--log-level", "--config"}),
    frozenset({"--quiet", "--help", "--version", "--allow-all", "--cached-only"}), abbreviated=False,
    # --reload[=URLS], --v8-flags[=FLAGS]: a value only after "="; --no-check, --no-remote, --no-prompt…
    flag_prefixes=("--allow-", "--deny-", "--unstable", "--reload", "--v8-flags", "--no-"),
)  # fmt: skip


def _deno_inline_code(args: list[str]) -> str | None:
    """``deno eval CODE``, ``deno repl --eval CODE``: deno's subcommand is its first argument that is no option nor
    an option's value (``deno -L info eval CODE``; ``deno run server.ts --mode eval`` runs a script). After an option
    not known here (the next argument may be its value), any later ``eval``, or ``repl`` then ``--eval``, is taken
    for the subcommand. A ``data:`` URL anywhere is code given inline too (``deno run data:text/javascript,…``
    runs it as the main module, as node's ``--import data:…`` would)."""
    if found := next((a for a in args if a.lower().startswith("data:")), None):
        return found
    i, known = 0, True
    while known and i < len(args) and args[i].startswith("-") and args[i] != "--":
        takes = _takes_value(_DENO_OPTIONS, args[i])
        known = takes is not None
        i += 2 if takes else 1
    if args[i : i + 1] == ["--"]:
        i += 1
    for at in range(i, len(args) if not known else min(i + 1, len(args))):
        if args[at] == "eval":
            return args[at]
        if args[at] == "repl" and (found := next((a for a in args[at + 1 :] if a.startswith("--eval")), None)):
            return found
    return None


def _runner_inline_code(program: str, args: list[str], options: tuple[str, ...], depth: int) -> str | None:
    """For a runner (``npx``, ``uvx``, ``uv run``, ``pipx run``, ``npm exec``): its option that runs a shell command
    line, or what the program it runs (its first argument that is no option, option value or runner word) does with
    the arguments after it."""
    i = 0
    while i < len(args):
        arg = args[i]
        name = arg.partition("=")[0].lower()
        if arg == "--":
            i += 1
            break
        if arg.startswith("--") and _names_long_option(name, options[1:]):
            return arg
        if arg.startswith("-") and not arg.startswith("--") and any(letter in options[0] for letter in arg[1:]):
            return arg
        if name in _RUNNER_VALUED and "=" not in arg:
            i += 2
            continue
        if arg.startswith("-") or arg.lower() in _RUNNER_WORDS:
            i += 1
            continue
        break
    if i >= len(args):
        return None
    return _inline_code(args[i], args[i + 1 :], depth + 1)


# What an option may begin with for PowerShell: one of these dashes (``-``, ``–``, ``—``, ``―``) or two, or ``/``.
_PWSH_DASHES = "-\u2013\u2014\u2015"


def _pwsh_command(arg: str) -> bool:
    """Whether the PowerShell argument ``arg`` is ``-Command``, ``-CommandWithArgs`` or ``-EncodedCommand`` (any
    prefix: ``-c``, ``-enc``; ``--command``, ``/Command``, ``-Command:…``)."""
    if not arg.startswith(("/", *_PWSH_DASHES)):
        return False
    option = arg[1:]
    if arg[0] != "/" and option.startswith(tuple(_PWSH_DASHES)):
        option = option[1:]
    option = option.partition(":")[0].lower()
    return bool(option) and (
        "command".startswith(option)
        or "commandwithargs".startswith(option)
        or "encodedcommand".startswith(option)
        or option in {"ec", "cwa"}
    )


def program_problem(command: str, allowlist: Iterable[str]) -> str | None:
    """Why the program ``command`` may not be bound where ``allowlist`` (``PLATFORM_STDIO_COMMAND_ALLOWLIST``)
    names the programs allowed, or None (an empty list allows any program): the command as written or as found on
    this machine's PATH must be an entry's program."""
    programs = {entry.split()[0] for entry in allowlist if entry.split()}
    if not programs or command in programs or (shutil.which(command) or "") in programs:
        return None
    return _("Command '%(cmd)s' is not in PLATFORM_STDIO_COMMAND_ALLOWLIST.") % {"cmd": command}


def command_problem(command: str, args: list[str], allowlist: Iterable[str]) -> str | None:
    """Why ``command args`` may not be bound, or None."""
    entries = [e for e in allowlist if e.strip()]
    line = [command, *args]
    exact = {tuple(shlex.split(e)) for e in entries if len(shlex.split(e)) > 1}
    if tuple(line) in exact:
        return None
    inline = _inline_code(command, list(args))
    if inline is not None:
        return _(
            "'%(command)s' with '%(option)s' runs inline code with the worker's rights; bind a program or script "
            "instead, or list this exact command line in PLATFORM_STDIO_COMMAND_ALLOWLIST"
        ) % {"command": command, "option": inline}
    return None


# Variables that change which program runs or what code it loads (a preloaded library, a startup file, options or
# a module path read by an interpreter, a shell's startup file or exported function), with the worker's rights.
ENV_NAMES_REFUSED = frozenset(
    [
        "PATH",
        "BASH_ENV",
        "ENV",
        "SHELLOPTS",
        "BASHOPTS",
        "PROMPT_COMMAND",
        "IFS",
        "PS4",
        "CDPATH",
        "GLOBIGNORE",
        "ZDOTDIR",
        "NODE_OPTIONS",
        "NODE_PATH",
        "PERL5OPT",
        "PERL5LIB",
        "PERLLIB",
        "PERL5DB",
        "RUBYOPT",
        "RUBYLIB",
        "PYTHONSTARTUP",
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONINSPECT",
        "PYTHONWARNINGS",
        "PYTHONUSERBASE",
        "PYTHONBREAKPOINT",
        "PYTHONEXECUTABLE",
        "PYTHONPYCACHEPREFIX",
        "PYTHONPLATLIBDIR",
        "JAVA_TOOL_OPTIONS",
        "_JAVA_OPTIONS",
        "JDK_JAVA_OPTIONS",
        "PHPRC",
        "PHP_INI_SCAN_DIR",
        "TCLLIBPATH",
        "R_PROFILE",
        "R_PROFILE_USER",
        "R_ENVIRON",
        "R_ENVIRON_USER",
        "GCONV_PATH",
        "GLIBC_TUNABLES",
        "OPENSSL_CONF",
        "OPENSSL_MODULES",
        "OPENSSL_ENGINES",
        "GIT_SSH",
        "GIT_SSH_COMMAND",
        "GIT_EXTERNAL_DIFF",
        "GIT_PAGER",
        "GIT_EDITOR",
        "GIT_ASKPASS",
        "SSH_ASKPASS",
        "GIT_EXEC_PATH",
        "GIT_TEMPLATE_DIR",
        "GIT_PROXY_COMMAND",
    ]
)
ENV_PREFIXES_REFUSED = ("LD_", "DYLD_", "BASH_FUNC_", "LUA_INIT", "LUA_PATH", "LUA_CPATH", "GIT_CONFIG", "NPM_CONFIG_")
# npm's settings that say where packages come from and how they are fetched, not what runs (``npx`` behind an
# internal mirror or proxy): allowed despite the ``NPM_CONFIG_`` prefix, whose other names can run a shell
# (``script_shell``, ``call``), load code (``node_options``, ``onload_script``) or read another config file.
NPM_CONFIG_ALLOWED = frozenset(
    "NPM_CONFIG_" + name
    for name in [
        "REGISTRY", "CACHE", "PROXY", "HTTPS_PROXY", "NOPROXY", "NO_PROXY", "STRICT_SSL", "CAFILE", "LOGLEVEL",
        "YES", "UPDATE_NOTIFIER", "FUND", "AUDIT", "PREFER_OFFLINE", "PREFER_ONLINE", "OFFLINE", "FETCH_RETRIES",
        "FETCH_TIMEOUT", "FETCH_RETRY_MINTIMEOUT", "FETCH_RETRY_MAXTIMEOUT", "PROGRESS", "COLOR",
    ]
)  # fmt: skip


def env_name_problem(name: Any) -> str | None:
    """Why a binding may not set the environment variable ``name`` for its server, or None."""
    upper = str(name).upper()
    if upper in NPM_CONFIG_ALLOWED or (upper not in ENV_NAMES_REFUSED and not upper.startswith(ENV_PREFIXES_REFUSED)):
        return None
    return _(
        "Environment variable %(name)s changes which program runs or what code it loads, with the worker's rights: "
        "a binding may not set it."
    ) % {"name": name}


def env_names_problem(names: Iterable[Any]) -> str | None:
    """The first refused name's problem among ``names`` (``env_name_problem``), or None."""
    return next((p for n in names if (p := env_name_problem(n)) is not None), None)


def binding_problem(config: dict[str, Any], settings: Any) -> str | None:
    """Why a stored binding's connection (``McpServer.connection_config``) may not be opened now, or None: its URL,
    or its program, arguments and environment's names, are checked again at use, for a binding saved while a setting allowed it, before
    a rule existed, restored from a dump or written around ``clean`` (``.update()``)."""
    if config.get("transport") == "stdio":
        command, args = str(config.get("command") or ""), [str(a) for a in config.get("args") or []]
        allowlist = list(getattr(settings, "PLATFORM_STDIO_COMMAND_ALLOWLIST", []))
        return (
            env_names_problem(config.get("env") or {})
            or program_problem(command, allowlist)
            or command_problem(command, args, allowlist)
        )
    if config.get("transport") in {"streamable_http", "sse"}:
        url = str(config.get("url") or "")
        # A user and password in the URL: httpx would send them as Basic auth, a secret stored and shown in clear.
        return url_problem(url, getattr(settings, "PLATFORM_MCP_ALLOW_PRIVATE_URLS", [])) or url_credentials_problem(
            url, _("a secret header (Authorization)")
        )
    return None


def _literal_address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """``host`` as an IP address if it is one in any spelling (no DNS), else None."""
    text = host.strip("[]")
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        pass
    try:  # 127.1, 2130706433, 0x7f.0.0.1, 017700000001: what inet_aton (and so most clients) accept
        return ipaddress.IPv4Address(socket.inet_aton(text))
    except OSError:
        return None


def _allowed(host: str, port: int | None, address: Any, allowed: Iterable[str]) -> bool:
    for entry in (e.strip().lower() for e in allowed):
        if not entry:
            continue
        if entry in {host, f"{host}:{port}"}:
            return True
        if address is not None and "/" in entry:
            try:
                if address in ipaddress.ip_network(entry, strict=False):
                    return True
            except ValueError:
                continue
        if address is not None and entry.strip("[]") == str(address):
            return True
    return False


def url_credentials_problem(url: str, where: str) -> str | None:
    """Why ``url`` may not be stored as configuration: it carries a user name and password, a secret that would be
    shown, exported and audited in clear (``where`` says where the secret goes instead). None when it carries none."""
    try:
        parsed = urlparse(url or "")
        credentials = parsed.username is not None or parsed.password is not None
    except ValueError:  # not a URL ("http://[x"): its own check says so where a URL is used
        return None
    if not credentials:
        return None
    return _("A URL's user and password are a secret: remove them from the URL and give them as %(where)s.") % {
        "where": where
    }


def setting_secret_problem(field: str, value: Any, where: str) -> str | None:
    """Why ``value`` may not be stored as the setting ``field`` (a binding's ``url``, ``args`` or ``command``, a
    rule's ``params``): it holds what the audit record hides as a secret (``audit.masking``: an API key in a
    URL's query, ``--api-key=…``, a value under a secret key), and a setting is stored, shown and exported in
    clear. ``where`` says where the secret goes instead. None when it holds none."""
    if not holds_secret({field: value}):
        return None
    return _(
        "This holds a secret (the audit record hides it), but the setting %(field)s is stored, shown and exported in "
        "clear: give the secret as %(where)s instead, which is encrypted at rest and never shown."
    ) % {"field": field, "where": where}


# What the audit and an export show in place of a secret: "***", and "***~2" where two masked keys met.
_MASKED = re.compile(re.escape(MASK) + r"(?:~[0-9]+)?")


def masked_secret_given(value: Any) -> bool:
    """Whether ``value``, given as a secret's value, is the mask the audit shows in place of one: stored, it
    replaced the real secret, and the audit record of that change showed the same "***" as before."""
    return isinstance(value, str) and _MASKED.fullmatch(value.strip()) is not None


def _client_host(url: str) -> tuple[str, str, int | None] | None:
    """The host an HTTP client connects to for ``url``, as (ASCII, as shown, port), or None where no client takes
    the URL. ASCII: lower case, an international name in its IDNA ``xn--`` form, no trailing dot; as shown: the
    same in Unicode (``한국.kr``); the port: the scheme's own where none is written.

    Read as httpx reads it (the MCP client's; the OpenAI SDK's httpx2 reads it alike), not as ``urlparse`` does:
    ``urlparse`` leaves ``127。0。0。1`` (U+3002), ``10．0．0．1`` (U+FF0E) or ``169｡254｡169｡254`` (U+FF61) as a
    name, which IDNA maps to the ASCII dots of the address the client then connects to."""
    try:
        parsed = httpx.URL(url)
        if not parsed.raw_host:
            return None
        host = parsed.raw_host.decode("ascii").lower().rstrip(".")
        shown = parsed.host.lower().rstrip(".")  # decodes IDNA: raises for a malformed "xn--" label
    except (httpx.InvalidURL, TypeError, ValueError):  # UnicodeError and idna.IDNAError are ValueErrors
        return None
    return host, shown, parsed.port if parsed.port is not None else {"http": 80, "https": 443}.get(parsed.scheme)


def url_problem(url: str, allowed: Iterable[str], *, target: Literal["server", "model"] = "server") -> str | None:
    """Why a server URL (``target="server"``, allowed by ``PLATFORM_MCP_ALLOW_PRIVATE_URLS``) or a model's base URL
    (``"model"``, allowed by ``PLATFORM_MODEL_ALLOW_PRIVATE_URLS``, the setting its refusal names) may not be used,
    or None. ``allowed`` is that setting's value."""
    try:
        parsed = urlparse(url or "")
    except ValueError:  # a bracket left open ("http://[::1/v1"): no URL, and not a crash of the form or import
        return _("Enter an http:// or https:// URL.")
    if parsed.scheme not in {"http", "https"} or not parsed.hostname:
        return _("Enter an http:// or https:// URL.")
    try:
        parsed.port  # noqa: B018 - raises for a port that is not a number
    except ValueError:
        return _("The URL's port is not a number.")
    found = _client_host(url)
    if found is None:
        return _("Enter an http:// or https:// URL.")
    ascii_host, host, port = found
    address = _literal_address(ascii_host)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if _allowed(ascii_host, port, address, allowed) or (host != ascii_host and _allowed(host, port, address, allowed)):
        return None
    if ascii_host in METADATA_HOSTS or (address is not None and address in METADATA_ADDRESSES):
        return _("'%(host)s' is a cloud metadata service.") % {"host": host}
    if ascii_host == "localhost" or ascii_host.endswith(".localhost"):
        if target == "model":
            return _(
                "'%(host)s' is this machine (loopback); list it in PLATFORM_MODEL_ALLOW_PRIVATE_URLS to use a model "
                "server there on purpose."
            ) % {"host": host}
        return _(
            "'%(host)s' is this machine (loopback); list it in PLATFORM_MCP_ALLOW_PRIVATE_URLS to bind a server "
            "there on purpose."
        ) % {"host": host}
    if address is not None and (
        address.is_loopback
        or address.is_link_local
        or address.is_private
        or address.is_reserved
        or address.is_multicast
        or address.is_unspecified
        or not address.is_global  # also 100.64.0.0/10 (shared address space: carrier NAT, Tailscale)
    ):
        if target == "model":
            return _(
                "'%(host)s' is a loopback, link-local, private or reserved address; list it in "
                "PLATFORM_MODEL_ALLOW_PRIVATE_URLS to use a model server there on purpose."
            ) % {"host": host}
        return _(
            "'%(host)s' is a loopback, link-local, private or reserved address; list it in "
            "PLATFORM_MCP_ALLOW_PRIVATE_URLS to bind a server there on purpose."
        ) % {"host": host}
    return None


def from_env_problem(entries: Iterable[Any], passthrough: Iterable[str]) -> str | None:
    """Why the ``{"from_env": VAR}`` references among ``entries`` may not be bound, or None."""
    allowed = set(passthrough)
    refused = sorted(
        str(e["from_env"]) for e in entries if isinstance(e, dict) and "from_env" in e and e["from_env"] not in allowed
    )
    if refused:
        return _("%(names)s: a binding may read only the worker variables named in PLATFORM_MCP_ENV_PASSTHROUGH") % {
            "names": ", ".join(refused)
        }
    return None


def readable_variables_text(passthrough: Iterable[str]) -> str:
    """The sentence a form shows beside a "read it on the worker" input: the variables it may name."""
    names = sorted(n for n in passthrough if n)
    if not names:
        return _("No worker variable may be read: PLATFORM_MCP_ENV_PASSTHROUGH names none.")
    return _("The worker variables a binding may read (PLATFORM_MCP_ENV_PASSTHROUGH): %(names)s.") % {
        "names": ", ".join(names)
    }
