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
import socket
from collections.abc import Iterable
from typing import Any, Literal
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

SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "fish", "csh", "tcsh", "ash", "busybox"})
# Interpreter → the options that take inline code.
INLINE_CODE_OPTIONS: dict[str, frozenset[str]] = {
    "python": frozenset({"-c"}),
    "node": frozenset({"-e", "--eval", "-p", "--print"}),
    "nodejs": frozenset({"-e", "--eval", "-p", "--print"}),
    "deno": frozenset({"eval"}),
    "bun": frozenset({"-e", "--eval", "-p", "--print"}),
    "perl": frozenset({"-e", "-E"}),
    "ruby": frozenset({"-e"}),
    "php": frozenset({"-r"}),
    "lua": frozenset({"-e"}),
    "rscript": frozenset({"-e"}),
    "pwsh": frozenset({"-c", "-command", "-encodedcommand", "-ec"}),
    "powershell": frozenset({"-c", "-command", "-encodedcommand", "-ec"}),
    "osascript": frozenset({"-e"}),
}


def _program(command: str) -> str:
    """``/usr/bin/python3.11`` → ``python``; ``bash`` → ``bash``."""
    name = os.path.basename(command).lower()
    for suffix in (".exe",):
        name = name.removesuffix(suffix)
    if name.startswith("python"):
        return "python"
    return name


def _inline_code(program: str, args: list[str]) -> str | None:
    """The option that gives ``program`` inline code in ``args``, or None."""
    if program in SHELLS:
        for arg in args:
            if arg == "--":
                break
            # -c, and combined short options such as -lc or -ec
            if arg.startswith("-") and not arg.startswith("--") and "c" in arg[1:]:
                return arg
        return None
    options = INLINE_CODE_OPTIONS.get(program)
    if options is None:
        return None
    for arg in args:
        lowered = arg.lower()
        if lowered in options or any(lowered.startswith(o + "=") for o in options if o.startswith("--")):
            return arg
        if program == "python" and lowered.startswith("-c") and len(lowered) > 2:  # python -cprint(1)
            return arg
    return None


def command_problem(command: str, args: list[str], allowlist: Iterable[str]) -> str | None:
    """Why ``command args`` may not be bound, or None."""
    entries = [e for e in allowlist if e.strip()]
    line = [command, *args]
    exact = {tuple(shlex.split(e)) for e in entries if len(shlex.split(e)) > 1}
    if tuple(line) in exact:
        return None
    # Look through wrappers that run another program: env VAR=x bash -c ...
    program, rest = _program(command), list(args)
    while program == "env" and rest:
        while rest and ("=" in rest[0] or rest[0].startswith("-")):
            rest = rest[1:]
        if not rest:
            break
        program, rest = _program(rest[0]), rest[1:]
    inline = _inline_code(program, rest)
    if inline is not None:
        return _(
            "'%(command)s' with '%(option)s' runs inline code with the worker's rights; bind a program or script "
            "instead, or list this exact command line in PLATFORM_STDIO_COMMAND_ALLOWLIST"
        ) % {"command": command, "option": inline}
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
        "This holds a secret (the audit record hides it), but %(field)s is stored, shown and exported in clear: "
        "give the secret as %(where)s instead, which is encrypted at rest and never shown."
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
    except (httpx.InvalidURL, TypeError, ValueError):
        return None
    if not parsed.raw_host:
        return None
    host = parsed.raw_host.decode("ascii").lower().rstrip(".")
    shown = parsed.host.lower().rstrip(".")
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
