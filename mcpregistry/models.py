"""MCP server bindings, the tools they expose, and the contracts those tools are called under."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any
from urllib.parse import urlparse

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator
from django.db import models
from django.utils.translation import gettext_lazy as _
from pydantic import ValidationError as PydanticValidationError

from agent_platform.json import UnicodeJSONEncoder
from agent_platform.slugs import validate_ascii_slug
from agent_platform.text import nfc
from audit.change_guard import AuditedModel, ChangeAudit, NotConfiguration, stored_value
from audit.masking import holds_secret
from mcpregistry.binding_policy import (
    command_problem,
    env_name_problem,
    from_env_problem,
    masked_secret_given,
    program_problem,
    setting_secret_problem,
    url_credentials_problem,
    url_problem,
)
from mcpregistry.contracts import ArgSpec, RetrySpec, ReturnsSpec, argument_names, spec_problems
from mcpregistry.crypto import EncryptedJSONField, readable
from mcpregistry.signals import tool_name_problems

# langchain-mcp-adapters expands ${VAR} in env values from the worker's environment: refuse them at save.
PLACEHOLDER = re.compile(r"\$\{[^}]*\}")


# The largest value of a 32-bit integer column: PostgreSQL's ``integer`` holds no more, while SQLite stores 64 bits;
# the bound keeps a value accepted on one database storable on the other (the admin's fields, ``import_config``).
INT32_MAX = 2**31 - 1
# The most argument corrections a contract may allow a run (the configuration document's bound too).
CORRECTION_CAP_MAX = 100


def readable_map(value: Any) -> dict[str, Any]:
    """A secret map to check, or ``{}``: one this process cannot decrypt is not checked (it saves back unchanged,
    as stored), nor is a value that is not a map (refused on its own)."""
    return value if isinstance(value, dict) and readable(value) else {}


def secret_entry_value(entry: Any) -> str | None:
    """A stored secret entry is a literal string or ``{"from_env": "NAME"}`` (read on the worker)."""
    if isinstance(entry, dict) and "from_env" in entry:
        name = str(entry["from_env"])
        # Checked at save too; a variable the passthrough no longer names is not read.
        return os.environ.get(name) if name in settings.PLATFORM_MCP_ENV_PASSTHROUGH else None
    if isinstance(entry, dict) and "value" in entry:
        return str(entry["value"])
    return None if entry is None else str(entry)


# A variable's name that names a credential: its last word is one (DB_PASSWORD, API_TOKEN, INTERNAL_API_KEY,
# CLIENT_SECRET). Not a name that merely holds such a word (TOKEN_TTL_S, AUTH_MODE, OAUTH_ISSUER, TOKEN_URL,
# PASSWORD_MIN_LENGTH, GOOGLE_APPLICATION_CREDENTIALS: a path): those are settings, whose values are judged as values.
_CREDENTIAL_NAME = re.compile(
    r"(?:^|[_.-])(?:PASS(?:WORD|WD)?|PWD|SECRET|TOKEN|(?:API|ACCESS|PRIVATE|SECRET|SIGNING|MASTER)[_-]?KEY|AUTH"
    r"|AUTHORIZATION|COOKIE|SESSION[_-]?ID|CREDENTIAL)$",
    re.IGNORECASE,
)


def _setting_secret_problem(name: str, entry: Any) -> str | None:
    """Why the environment value ``name`` may not be a setting (``public_env``: stored, shown and exported in clear,
    never masked), or None: its name names a secret (``API_TOKEN``, ``DB_PASSWORD``), or its value holds what the
    audit hides as one (``sk-live-…``: the check a URL's, an argument's and a command's value pass; ``AUTH_MODE=none``
    and ``TOKEN_TTL_S=3600`` are settings). A value read
    on the worker (``from_env``) is judged by its name only: its value is not stored here."""
    # Two whole sentences, not one spliced: a translation orders its parts as its language does.
    if _CREDENTIAL_NAME.search(name):
        return _(
            "%(name)s: its name says it is a secret, but an environment setting is stored, shown and exported in "
            "clear: give it as a secret environment value instead (the box “set environment values”; in a "
            "configuration document, leave its name out of public_env), which is encrypted at rest and never shown."
        ) % {"name": name}
    if isinstance(entry, str) and holds_secret({name: entry}):
        return _(
            "%(name)s: its value holds a secret (the audit record hides it), but an environment setting is stored, "
            "shown and exported in clear: give it as a secret environment value instead (the box “set environment "
            "values”; in a configuration document, leave its name out of public_env), which is encrypted at rest "
            "and never shown."
        ) % {"name": name}
    return None


def _http_url(url: str) -> bool:
    """Whether ``url`` reads as an http(s) URL with a host part. One ``urlparse`` refuses (a bracket left open:
    ``http://[::1/mcp``) is not one: it raised out of ``clean``, a traceback for an import, a 500 for the admin."""
    try:
        parsed = urlparse(url)
    except ValueError:
        return False
    return parsed.scheme in {"http", "https"} and bool(parsed.netloc)


_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110's token
_HEADER_VALUE = re.compile(r"[\x20-\x7e\t]*")  # visible ASCII, spaces and tabs


class McpServer(AuditedModel):
    """A binding to one MCP server: how to start or reach it, and its secrets.

    Transport ``local`` binds Python functions (``mcpregistry.local_tools``) instead: ``args`` lists their
    dotted paths, and there is no process, URL or session; its tools pass the same gate.

    ``env`` (stdio) and ``headers`` (HTTP) hold secret values, encrypted at rest: never shown back by the admin
    or the API, masked by the audit wherever their exact values appear.
    """

    class Transport(models.TextChoices):
        STDIO = "stdio", _("stdio")
        STREAMABLE_HTTP = "streamable_http", _("Streamable HTTP")
        SSE = "sse", _("SSE")
        LOCAL = "local", _("local (Python functions in the worker)")

    class Health(models.TextChoices):
        UNKNOWN = "unknown", _("unknown")
        OK = "ok", _("ok")
        ERROR = "error", _("error")

    class BreakerState(models.TextChoices):
        CLOSED = "closed", _("closed (calls flow)")
        OPEN = "open", _("open (calls refused)")
        HALF_OPEN = "half_open", _("half-open (one trial call)")

    class SessionScope(models.TextChoices):
        PER_RUN = "per_run", _("per run (a session for each run, closed at its end)")
        SHARED = "shared", _("shared (one session per worker, reused across runs)")

    mcp_id = models.CharField(
        _("MCP id"),
        max_length=64,
        unique=True,
        validators=[validate_ascii_slug],
        help_text=_(
            "ASCII letters (a–z, A–Z), digits, _ and - only, e.g. sds-company-data: the id names the server in "
            "mcp_discover, in the audit log and in configuration documents."
        ),
    )
    name = models.CharField(_("name"), max_length=200)
    transport = models.CharField(_("transport"), max_length=20, choices=Transport.choices, default=Transport.STDIO)
    command = models.CharField(_("command"), max_length=500, blank=True)
    args = models.JSONField(encoder=UnicodeJSONEncoder, verbose_name=_("arguments"), default=list, blank=True)
    cwd = models.CharField(_("working directory"), max_length=500, blank=True)
    env = EncryptedJSONField(_("environment (secret values)"), default=dict, blank=True)
    public_env = models.JSONField(
        encoder=UnicodeJSONEncoder,
        verbose_name=_("non-secret environment names"),
        default=list,
        blank=True,
        help_text=_(
            'Names of environment values that are settings, not secrets (e.g. ["FAILURE_MODE"]): shown to admins '
            "and not masked. Every other env and header value is a secret."
        ),
    )
    url = models.URLField(_("URL"), max_length=500, blank=True)
    headers = EncryptedJSONField(_("headers (secret values)"), default=dict, blank=True)
    timeout_s = models.FloatField(_("call timeout (seconds)"), default=30.0)
    session_scope = models.CharField(
        _("session scope"), max_length=10, choices=SessionScope.choices, default=SessionScope.PER_RUN
    )
    enabled = models.BooleanField(_("enabled"), default=True)
    tool_prefix = models.CharField(_("tool name prefix"), max_length=40, blank=True)
    health = models.CharField(_("health"), max_length=10, choices=Health.choices, default=Health.UNKNOWN)
    last_checked_at = models.DateTimeField(_("last checked"), null=True, blank=True)
    last_error = models.TextField(_("last error"), blank=True)
    breaker_threshold = models.PositiveIntegerField(
        _("circuit breaker: failures to open"),
        default=5,
        help_text=_("Consecutive failures that open the circuit."),
        validators=[MaxValueValidator(INT32_MAX)],
    )
    breaker_cooldown_s = models.FloatField(
        _("circuit breaker: cool-down (seconds)"), default=30.0, help_text=_("Then one trial call is let through.")
    )
    breaker_state = models.CharField(
        _("circuit"), max_length=10, choices=BreakerState.choices, default=BreakerState.CLOSED, editable=False
    )
    breaker_failures = models.PositiveIntegerField(_("consecutive failures"), default=0, editable=False)
    breaker_opened_at = models.DateTimeField(_("circuit opened"), null=True, blank=True, editable=False)
    protocol_version = models.CharField(_("MCP protocol version"), max_length=40, blank=True)
    server_info = models.JSONField(encoder=UnicodeJSONEncoder, verbose_name=_("server info"), default=dict, blank=True)
    resources = models.JSONField(encoder=UnicodeJSONEncoder, verbose_name=_("resources"), default=list, blank=True)
    prompts = models.JSONField(encoder=UnicodeJSONEncoder, verbose_name=_("prompts"), default=list, blank=True)
    created_at = models.DateTimeField(_("created"), auto_now_add=True)
    updated_at = models.DateTimeField(_("updated"), auto_now=True)

    change_audit = ChangeAudit(
        entity="mcp_server",
        operational_fields=frozenset(
            {
                "health",
                "last_checked_at",
                "last_error",
                "breaker_state",
                "breaker_failures",
                "breaker_opened_at",
                "protocol_version",
                "server_info",
                "resources",
                "prompts",
                "updated_at",
            }
        ),
    )

    class Meta:
        verbose_name = _("MCP server")
        verbose_name_plural = _("MCP servers")
        ordering = ["mcp_id"]

    def __str__(self) -> str:
        return self.mcp_id

    def audit_target(self) -> tuple[str, str]:
        return self.mcp_id, ""

    def clean(self) -> None:
        errors: dict[str, list[str]] = {}
        if self.transport == self.Transport.LOCAL:
            # No process and no URL: the arguments are the dotted paths of the tools (imported to check them; the
            # tools' module loads LangChain and the MCP SDK, which a process that only reads models never needs).
            from mcpregistry.local_tools import local_paths_problem

            problem = local_paths_problem(self.args)
            if problem:
                errors.setdefault("args", []).append(problem)
        elif self.transport == self.Transport.STDIO:
            if not self.command:
                errors.setdefault("command", []).append(_("A stdio server needs a command."))
            else:
                resolved = shutil.which(self.command)
                if resolved is None:
                    errors.setdefault("command", []).append(
                        _("Command not found: '%(cmd)s' is not an executable on this machine's PATH.")
                        % {"cmd": self.command}
                    )
                allowlist = settings.PLATFORM_STDIO_COMMAND_ALLOWLIST
                if problem := program_problem(self.command, allowlist):
                    errors.setdefault("command", []).append(problem)
                args = self.args if isinstance(self.args, list) else []
                problem = command_problem(self.command, [str(a) for a in args], allowlist)
                if problem:
                    errors.setdefault("command", []).append(problem)
            if not isinstance(self.args, list) or not all(isinstance(a, str) for a in self.args):
                errors.setdefault("args", []).append(_("Arguments must be a JSON list of strings."))
            if self.url and (url_credentials_problem(self.url, "") or setting_secret_problem("url", self.url, "")):
                # A stdio server uses no URL; one left from another transport (its field hidden on the page) that
                # holds a user and password or another secret would be stored, shown and exported in clear: it is
                # dropped.
                self.url = ""
        else:
            if not _http_url(self.url or ""):
                errors.setdefault("url", []).append(_("Enter an http:// or https:// URL."))
            elif problem := url_problem(self.url, settings.PLATFORM_MCP_ALLOW_PRIVATE_URLS) or (
                # Where the URL changes: a server stored before the check still saves as it is.
                (self.pk is None or self.url != stored_value(self, "url"))
                and url_credentials_problem(self.url, str(_("a secret header (Authorization)")))
            ):
                errors.setdefault("url", []).append(problem)
        # A secret in a setting is stored, shown and exported in clear while the audit hides it: refused where the
        # value changes (a server stored before the check still saves as it is).
        header, env_value = _("a secret header (e.g. Authorization or X-Api-Key)"), _("a secret environment value")
        for field_name, value, where in (
            ("url", self.url, header),
            ("args", self.args, env_value),
            ("command", self.command, env_value),
            ("cwd", self.cwd, env_value),
        ):
            if field_name in errors or not value or (self.pk is not None and value == stored_value(self, field_name)):
                continue
            if problem := setting_secret_problem(field_name, value, str(where)):
                # Named as the page names the field (a list under "args" is judged as a command line: by its name).
                shown = str(self._meta.get_field(field_name).verbose_name)
                errors.setdefault(field_name, []).append(setting_secret_problem(shown, value, str(where)) or problem)
        # "***" is what the audit shows in place of a secret: stored as one, it replaced the real value unseen.
        public = set(self.public_env or []) if isinstance(self.public_env, list) else set()
        for field_name, entries in (("env", self.env), ("headers", self.headers)):
            if not isinstance(entries, dict):
                continue
            stored = readable_map(stored_value(self, field_name) if self.pk is not None else None)
            for name, entry in entries.items():
                shown = field_name == "env" and name in public  # a setting: "***" is its value as any other
                if not shown and masked_secret_given(entry) and stored.get(name) != entry:
                    errors.setdefault(field_name, []).append(
                        _(
                            '%(name)s: "***" is how the audit shows a secret, not a value: leave the name out to keep '
                            'the stored value (in a configuration document, {"set": true}).'
                        )
                        % {"name": name}
                    )
        for name in self._settings_changed():
            if problem := _setting_secret_problem(name, (self.env if isinstance(self.env, dict) else {}).get(name)):
                errors.setdefault("public_env", []).append(problem)
        if (
            self.tool_prefix
            and not re.fullmatch(r"[A-Za-z0-9_-]+", self.tool_prefix)
            and (self.pk is None or self.tool_prefix != stored_value(self, "tool_prefix"))
        ):
            # The model sees each tool as prefix + name: Bedrock (and OpenAI) take tool names of letters, digits,
            # _ and - only, and refuse a whole request that offers another.
            errors.setdefault("tool_prefix", []).append(
                _("Use letters, digits, _ and - only (e.g. hr_): the model's provider refuses other tool names.")
            )
        elif self.pk is not None and self.tool_prefix != stored_value(self, "tool_prefix"):
            # The prefix renames every tool of the server in the agents binding it: two tools of one name there
            # failed every run of the agent (``config:tool_name_conflict``), found only at run time.
            problems = tool_name_problems(server_ids=[self.pk], prefixes={self.pk: self.tool_prefix})
            if problems:
                errors.setdefault("tool_prefix", []).extend(problems)
        # A process's environment has no variable named "" or "A=B" (and a C string ends at a NUL): the server
        # failed every start ("illegal environment variable name"). A name stored before the check stays as it is.
        illegal = [
            name
            for name in (self.env if isinstance(self.env, dict) else {})
            if not isinstance(name, str) or not name or "=" in name or "\x00" in name
        ]
        if illegal and self.pk is not None:
            stored_names = set(readable_map(stored_value(self, "env")))
            illegal = [name for name in illegal if name not in stored_names]
        for name in illegal:
            errors.setdefault("env", []).append(
                _("Environment variable %(name)s: a name may not be empty or hold '=' or a NUL character.")
                % {"name": json.dumps(name, ensure_ascii=False)}
            )
        # A variable that swaps the program or loads code into it (PATH, LD_PRELOAD, BASH_ENV, NODE_OPTIONS, ...):
        # refused whenever it is stored (the pool refuses it at use too).
        for name in self.env if isinstance(self.env, dict) and self.transport == self.Transport.STDIO else {}:
            if isinstance(name, str) and (problem := env_name_problem(name)):
                errors.setdefault("env", []).append(problem)
        stored_headers = readable_map(stored_value(self, "headers") if self.pk is not None else None)
        for name, entry in (self.headers or {}).items() if isinstance(self.headers, dict) else ():
            # HTTP sends a header's name as a token and its value as ASCII (httpx refuses other text at the first
            # call, long after the save: "'ascii' codec can't encode…").
            if not _HEADER_NAME.fullmatch(str(name)):
                errors.setdefault("headers", []).append(
                    _("Header %(name)s: a header's name is letters, digits and - (e.g. X-Api-Key).") % {"name": name}
                )
            elif isinstance(entry, str) and not _HEADER_VALUE.fullmatch(entry):
                errors.setdefault("headers", []).append(
                    _(
                        "Header %(name)s: a header's value can be sent only as ASCII text on one line (no Korean, no "
                        "line break)."
                    )
                    % {"name": name}
                )
            elif isinstance(entry, str) and entry != entry.strip(" \t") and stored_headers.get(name) != entry:
                # A pasted token's trailing space: h11 refuses the value at every connection ("Illegal header
                # value"), long after the save. Named, never quoted (a secret). A value stored before the check
                # still saves as it is.
                errors.setdefault("headers", []).append(
                    _(
                        "Header %(name)s: a header's value may not begin or end with a space or a tab (remove "
                        "them; a copied token often ends with one)."
                    )
                    % {"name": name}
                )
        for field_name, stored in (("env", self.env), ("headers", self.headers)):
            problem = from_env_problem(readable_map(stored).values(), settings.PLATFORM_MCP_ENV_PASSTHROUGH)
            if problem:
                errors.setdefault(field_name, []).append(problem)
        if not isinstance(self.public_env, list) or not all(isinstance(n, str) for n in self.public_env):
            errors.setdefault("public_env", []).append(_('Enter a JSON list of names, e.g. ["FAILURE_MODE"].'))
        for field_name, values in (
            ("args", self.args if isinstance(self.args, list) else []),
            ("env", list(readable_map(self.env).values())),
            ("headers", list(readable_map(self.headers).values())),
            ("command", [self.command]),
        ):
            if any(isinstance(v, str) and PLACEHOLDER.search(v) for v in values):
                errors.setdefault(field_name, []).append(
                    _("${VAR} placeholders are not allowed: they would be expanded from the worker's environment.")
                )
        cap = settings.PLATFORM_TOOL_TIMEOUT_MAX_S
        if self.timeout_s is not None and not 0 < self.timeout_s <= cap:
            errors.setdefault("timeout_s", []).append(
                _("The timeout must be more than 0 and at most %(cap)s seconds.") % {"cap": f"{cap:g}"}
            )
        if self.breaker_threshold is not None and self.breaker_threshold < 1:
            errors.setdefault("breaker_threshold", []).append(
                _("At least 1: with 0 the circuit opens before any call is made.")
            )
        if self.breaker_cooldown_s is not None and not 0 <= self.breaker_cooldown_s <= 86_400:
            errors.setdefault("breaker_cooldown_s", []).append(_("Enter 0 to 86400 seconds."))
        if errors:
            raise ValidationError(errors)

    def _settings_changed(self) -> list[str]:
        """The names ``public_env`` marks as settings (shown, exported, never masked) that are new or whose value
        changed since the row was stored: a setting stored before a check was added still saves as it is."""
        public = [n for n in self.public_env if isinstance(n, str)] if isinstance(self.public_env, list) else []
        if self.pk is None:
            return public
        env = self.env if isinstance(self.env, dict) else {}
        stored_public = stored_value(self, "public_env")
        stored_public = set(stored_public) if isinstance(stored_public, list) else set()
        stored_env = stored_value(self, "env")
        stored_env = stored_env if isinstance(stored_env, dict) else {}
        return [n for n in public if n not in stored_public or env.get(n) != stored_env.get(n)]

    def secrets_readable(self) -> bool:
        """Whether this process can decrypt the binding's env and headers (``mcpregistry.crypto.UnreadableSecrets``:
        stored with a key missing from ``SECRETS_ENCRYPTION_KEYS``)."""
        return readable(self.env) and readable(self.headers)

    def secret_values(self) -> list[str]:
        """The secret values of this binding, for masking: every env and header value, except the env values an
        admin marked non-secret (``public_env``). The masker ignores values under 4 characters and also masks
        encoded forms of long ones (``audit.masking``)."""
        public = set(self.public_env or [])
        values = []
        for key, entry in (self.env or {}).items():
            value = secret_entry_value(entry)
            if value and str(key) not in public:
                values.append(value)
        for entry in (self.headers or {}).values():
            value = secret_entry_value(entry)
            if value:
                values.append(value)
        return values

    def connection_config(self) -> dict[str, Any]:
        """The pool's connection description of this binding (contains secrets: never log or show it)."""
        return {
            "mcp_id": self.mcp_id,
            "transport": self.transport,
            "command": self.command,
            "args": list(self.args or []),
            "cwd": self.cwd or None,
            "env": {k: v for k, e in (self.env or {}).items() if (v := secret_entry_value(e)) is not None},
            "url": self.url,
            "headers": {k: v for k, e in (self.headers or {}).items() if (v := secret_entry_value(e)) is not None},
        }

    def unread_secrets(self) -> list[str]:
        """The secrets this process could not read: an env entry or header ``{"from_env": NAME}`` whose variable
        is unset here or no longer in ``PLATFORM_MCP_ENV_PASSTHROUGH`` (it is left out of the connection), as
        ``"Authorization (from MCP_TOKEN)"``."""
        return [
            f"{key} (from {entry['from_env']})"
            for values in (self.env or {}, self.headers or {})
            for key, entry in values.items()
            if isinstance(entry, dict) and "from_env" in entry and secret_entry_value(entry) is None
        ]

    def pool_scope(self, run_id: Any) -> str | None:
        """The pool scope of a call in ``run_id``: None (shared) or the run's own scope."""
        if self.session_scope == self.SessionScope.SHARED or run_id is None:
            return None
        return f"run:{run_id}"


class McpTool(AuditedModel):
    """A tool a server exposes, as last discovered. Admins may disable a tool.

    If the description or input schema of an enabled tool changes at a later discovery (a "rug pull"), the
    tool is disabled and flagged for review; the previous version is kept so the admin can see the diff.
    """

    server = models.ForeignKey(McpServer, on_delete=models.CASCADE, related_name="tools", verbose_name=_("server"))
    name = models.CharField(_("name"), max_length=200)
    description = models.TextField(_("description"), blank=True)
    input_schema = models.JSONField(
        encoder=UnicodeJSONEncoder, verbose_name=_("input schema"), default=dict, blank=True
    )
    annotations = models.JSONField(encoder=UnicodeJSONEncoder, verbose_name=_("annotations"), default=dict, blank=True)
    enabled = models.BooleanField(_("enabled"), default=True)
    available = models.BooleanField(
        _("available"), default=True, help_text=_("Unticked when the last discovery no longer listed this tool.")
    )
    review_required = models.BooleanField(
        _("review required"),
        default=False,
        help_text=_(
            "The tool's description or schema changed after it was discovered; it stays disabled until reviewed."
        ),
    )
    # Whether the tool was enabled when its review began: approving the review restores that (an admin's "off"
    # stays off).
    enabled_before_review = models.BooleanField(_("enabled before the review"), default=True, editable=False)
    previous_description = models.TextField(_("previous description"), blank=True)
    previous_input_schema = models.JSONField(
        encoder=UnicodeJSONEncoder, verbose_name=_("previous input schema"), null=True, blank=True
    )
    schema_error = models.TextField(
        _("input schema error"),
        blank=True,
        help_text=_("Why the discovered input schema is unusable; such a tool is never offered to a model."),
    )
    discovered_at = models.DateTimeField(_("discovered"), null=True, blank=True)
    # Written by admins for top-K tool selection (agents.tool_selection): ranked with the description.
    tags = models.JSONField(
        encoder=UnicodeJSONEncoder,
        verbose_name=_("tags"),
        default=list,
        blank=True,
        help_text=_('Words for tool selection and the agents\' tag filters, e.g. ["asset", "자산"].'),
    )
    example_queries = models.JSONField(
        encoder=UnicodeJSONEncoder,
        verbose_name=_("example queries"),
        default=list,
        blank=True,
        help_text=_("Questions this tool answers; tool selection ranks a query against them."),
    )

    change_audit = ChangeAudit(entity="mcp_tool", operational_fields=frozenset({"discovered_at"}))

    class Meta:
        verbose_name = _("MCP tool")
        verbose_name_plural = _("MCP tools")
        ordering = ["server__mcp_id", "name"]
        constraints = [models.UniqueConstraint(fields=["server", "name"], name="mcptool_unique_server_name")]

    def __str__(self) -> str:
        return f"{self.server.mcp_id}.{self.name}"

    def audit_target(self) -> tuple[str, str]:
        return self.server.mcp_id, self.name

    def clean(self) -> None:
        """Tags and example queries are lists of non-empty strings, stored without surrounding whitespace (as an
        import stores them: kept, each import of the tool's own export changed them) and composed (NFC), as the
        agents' tag filters and the rankers compare them (Korean typed on macOS comes decomposed, and its vector
        missed the composed query's)."""
        errors: dict[str, list[str]] = {}
        for field_name in ("tags", "example_queries"):
            if getattr(self, field_name) is None:  # an emptied admin field
                setattr(self, field_name, [])
            value = getattr(self, field_name)
            if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
                errors[field_name] = [str(_("Every item must be a non-empty text."))]
        if self.pk is not None and self.enabled and stored_value(self, "enabled") is False:
            # Switched on, its name may be one another server of an agent's already offers (every run of the agent
            # failed, ``config:tool_name_conflict``, found only at run time).
            problems = tool_name_problems(server_ids=[self.server_id], enabling=[self.pk])
            if problems:
                errors["enabled"] = problems
        if errors:
            raise ValidationError(errors)
        self.tags = [nfc(tag.strip()) for tag in self.tags]
        self.example_queries = [nfc(query.strip()) for query in self.example_queries]

    @property
    def exposed_name(self) -> str:
        """The name the model sees: the server's prefix plus the tool's own name."""
        return f"{self.server.tool_prefix}{self.name}"

    @property
    def callable(self) -> bool:
        return self.enabled and not self.review_required and self.callable_once_enabled

    @property
    def callable_once_enabled(self) -> bool:
        """Whether switching the tool on (its review approved, where it waits for one) makes it callable: nothing
        else holds it back."""
        return self.available and not self.schema_error


class ToolContract(AuditedModel):
    """How a tool may be called and what it must return (seed 004), enforced by the gate on every call.

    ``args``: per argument ``{"type": "str|int|float|bool|list|dict", "required", "allowed", "min", "max",
    "min_length", "max_length", "pattern"}`` (a length counts a text's characters, a list's items). ``returns``:
    ``{"type", "required" (keys), "non_empty", "max_items", "max_chars", "fields": {key: {"type", "non_empty",
    "max_items", "min", "max"}}}``. ``retry``: ``{"max_attempts", "on": [reasons], "backoff_base_s",
    "backoff_cap_s", "honor_retry_after"}``.
    """

    class Risk(models.TextChoices):
        READ = "read", _("read")
        WRITE = "write", _("write (needs approval)")

    class UnknownArgs(models.TextChoices):
        REFUSE = "refuse", _("refuse the call")
        DROP = "drop", _("drop them and call")

    class FallbackPolicy(models.TextChoices):
        SUGGEST = "suggest", _("suggest it to the model")
        CALL = "call", _("call it in the gate")

    tool = models.OneToOneField(McpTool, on_delete=models.CASCADE, related_name="contract", verbose_name=_("tool"))
    args = models.JSONField(
        encoder=UnicodeJSONEncoder, verbose_name=_("argument constraints"), default=dict, blank=True
    )
    unknown_args = models.CharField(
        _("unknown arguments"), max_length=10, choices=UnknownArgs.choices, default=UnknownArgs.REFUSE
    )
    returns = models.JSONField(
        encoder=UnicodeJSONEncoder, verbose_name=_("result constraints"), default=dict, blank=True
    )
    retry = models.JSONField(encoder=UnicodeJSONEncoder, verbose_name=_("retry policy"), default=dict, blank=True)
    timeout_s = models.FloatField(_("timeout (seconds)"), null=True, blank=True, help_text=_("Empty: the server's."))
    fallback_tool = models.CharField(_("fallback tool"), max_length=200, blank=True)
    fallback_policy = models.CharField(
        _("fallback policy"), max_length=10, choices=FallbackPolicy.choices, default=FallbackPolicy.SUGGEST
    )
    risk = models.CharField(_("risk"), max_length=10, choices=Risk.choices, default=Risk.READ)
    memo = models.BooleanField(_("memoize successes within a run"), default=True)
    memo_ttl_s = models.PositiveIntegerField(
        _("memo TTL across runs (seconds)"),
        null=True,
        blank=True,
        help_text=_("Read tools only. Empty: off."),
        validators=[MaxValueValidator(INT32_MAX)],
    )
    idempotency_arg = models.CharField(
        _("idempotency key argument"),
        max_length=100,
        blank=True,
        help_text=_(
            "If set, write calls pass their idempotency key in this argument: <run id>:<approval id> (a write "
            "with no approval: <run id>:<call id>)."
        ),
    )
    correction_cap = models.PositiveIntegerField(
        _("argument corrections per run"),
        default=3,
        validators=[MaxValueValidator(CORRECTION_CAP_MAX)],
        help_text=_(
            "After this many refused calls with bad arguments in one run, the tool is withdrawn from the model "
            "for the rest of the run."
        ),
    )
    updated_at = models.DateTimeField(_("updated"), auto_now=True)

    change_audit = ChangeAudit(entity="tool_contract", operational_fields=frozenset({"updated_at"}))

    class Meta:
        verbose_name = _("tool contract")
        verbose_name_plural = _("tool contracts")

    def __str__(self) -> str:
        return _("contract of %(tool)s") % {"tool": self.tool}

    def audit_target(self) -> tuple[str, str]:
        return self.tool.server.mcp_id, self.tool.name

    def clean(self) -> None:
        """The JSON fields must have the shapes the gate reads (see the class docstring); every error names the
        key and the valid keys. The timeout is > 0 and at most ``PLATFORM_TOOL_TIMEOUT_MAX_S``. The fallback tool
        is another tool of the same server whose required arguments this tool's arguments cover (the gate sends
        it the same arguments); the gate calls it itself (policy "call") only where both only read."""
        errors: dict[str, list[str]] = {}
        if not isinstance(self.args, dict):
            errors["args"] = [str(_("Enter a JSON object: argument name → its constraints."))]
        else:
            for name, spec in self.args.items():
                try:
                    ArgSpec.model_validate(spec)
                except PydanticValidationError as exc:
                    errors.setdefault("args", []).extend(spec_problems(exc, ArgSpec, prefix=str(name)))
            declared = argument_names({}, self.tool.input_schema) if self.tool_id else None
            # Names added here (one kept since the tool's schema dropped it is the page's "not in the input schema"
            # mark: the contract still saves and imports as it is).
            unknown = sorted(str(n) for n in self.args if declared is not None and n not in declared)
            if unknown:  # the stored contract is read only then (a save reads no more rows than it must)
                before = stored_value(self, "args") or {}
                unknown = [n for n in unknown if n not in before]
            if unknown:
                # The model is shown the contract's arguments: one the tool does not take would be offered to it,
                # and every call that used it refused by the server.
                errors.setdefault("args", []).append(
                    str(
                        _("%(names)s: the tool's input schema has no such argument (its arguments: %(known)s).")
                        % {"names": ", ".join(unknown), "known": ", ".join(sorted(declared or ())) or "-"}
                    )
                )
        for field_name, model in (("returns", ReturnsSpec), ("retry", RetrySpec)):
            value = getattr(self, field_name)
            if not isinstance(value or {}, dict):
                errors[field_name] = [str(_("Enter a JSON object."))]
                continue
            try:
                model.model_validate(value or {})
            except PydanticValidationError as exc:
                errors[field_name] = spec_problems(exc, model, prefix=field_name)
        cap = settings.PLATFORM_TOOL_TIMEOUT_MAX_S
        if self.timeout_s is not None and not 0 < self.timeout_s <= cap:
            errors["timeout_s"] = [
                str(
                    _("The timeout must be more than 0 and at most %(cap)s seconds (empty: the server's).")
                    % {"cap": f"{cap:g}"}
                )
            ]
        if self.tool_id:
            for field_name, problem in self.tool_problems(self.tool).items():
                errors.setdefault(field_name, []).append(problem)
        if self.risk == self.Risk.WRITE and self.fallback_policy == self.FallbackPolicy.CALL:
            # The gate never calls a write's fallback: after a failed write it cannot know the work was not done, and
            # a second write tool would do it again.
            errors.setdefault("fallback_policy", []).append(
                str(
                    _(
                        "A write tool's fallback is never called by the gate: a failed write may have been carried "
                        "out, and its fallback would do it again. Choose 'suggest it to the model'."
                    )
                )
            )
        elif not _fallback_checks_deferred.get():
            became_write = self.risk == self.Risk.WRITE and (
                self.pk is None or stored_value(self, "risk") != self.Risk.WRITE
            )
            for field_name, problem in fallback_call_problems(self, became_write=became_write):
                errors.setdefault(field_name, []).append(problem)
        if errors:
            raise ValidationError(errors)

    def tool_problems(self, tool: McpTool) -> dict[str, str]:
        """What this contract's fallback and idempotency argument say that ``tool`` (its own, or, for a version
        brought in from another installation, the tool of that name here) does not take, by field: a fallback
        that is the tool itself or cannot be called with its arguments, an idempotency argument that is not one
        of its arguments."""
        problems: dict[str, str] = {}
        args = self.args if isinstance(self.args, dict) else {}
        if self.fallback_tool:
            if self.fallback_tool == tool.name:
                problems["fallback_tool"] = str(_("A tool cannot be its own fallback: choose another tool."))
            elif problem := fallback_problem(tool, self.fallback_tool, args):
                problems["fallback_tool"] = problem
        if self.idempotency_arg and self.idempotency_arg not in (names := idempotency_choices(tool, args)):
            # The gate adds the key after the arguments are checked: a name the tool does not take would be sent to
            # the server unnoticed, and the write retried with a key the server never reads.
            problems["idempotency_arg"] = str(
                _("'%(name)s' is not an argument of %(tool)s; choose one of: %(names)s.")
                % {"name": self.idempotency_arg, "tool": tool.name, "names": ", ".join(names) or "-"}
            )
        return problems


# Set while ``import_config`` saves its contracts: the checks between contracts (``fallback_call_problems``) are
# made once all are saved, on what the document leaves, not on each entry's predecessors in the document.
_fallback_checks_deferred: ContextVar[bool] = ContextVar("fallback_checks_deferred", default=False)


@contextmanager
def fallback_checks_deferred() -> Iterator[None]:
    """Within: ``ToolContract.clean`` leaves out the checks that read other contracts; the caller makes them with
    ``fallback_call_problems`` once its contracts are saved (in the same transaction). Checked entry by entry, an
    import passed or failed by the order of its entries: A calling B as its fallback passed before B became a
    write, and was refused after."""
    token = _fallback_checks_deferred.set(True)
    try:
        yield
    finally:
        _fallback_checks_deferred.reset(token)


def fallback_call_problems(contract: ToolContract, *, became_write: bool) -> list[tuple[str, str]]:
    """Where ``contract`` and the other contracts of its server, as saved, would have the gate call a write nobody
    asked for (field, message): its fallback, called in the gate (policy "call"), is a write; or, where
    ``became_write`` (the contract is a write now, and was not), another contract calls it so. The gate refuses such
    a call at run time too; a tool with no saved contract is applied as a read (``gate_records.contract_of``)."""
    if not contract.tool_id:
        return []
    found: list[tuple[str, str]] = []
    server_contracts = ToolContract.objects.filter(tool__server_id=contract.tool.server_id)
    if (
        contract.risk != ToolContract.Risk.WRITE
        and contract.fallback_policy == ToolContract.FallbackPolicy.CALL
        and contract.fallback_tool
        and server_contracts.filter(tool__name=contract.fallback_tool, risk=ToolContract.Risk.WRITE).exists()
    ):
        # The gate calls only a read fallback itself: a write nobody asked for is never done (a person would be
        # asked for an approval the run never waits on, and a sandboxed eval would carry it out unasked).
        found.append(
            (
                "fallback_policy",
                str(
                    _(
                        "The fallback tool '%(tool)s' writes: the gate never calls a write that nobody asked for. "
                        "Choose 'suggest it to the model' (the model may then ask for it, with its own approval), "
                        "or mark that tool as read if it only reads."
                    )
                    % {"tool": contract.fallback_tool}
                ),
            )
        )
    if became_write:
        callers = sorted(
            server_contracts.filter(fallback_tool=contract.tool.name, fallback_policy=ToolContract.FallbackPolicy.CALL)
            .exclude(pk=contract.pk)
            .values_list("tool__name", flat=True)
        )
        if callers:
            found.append(
                (
                    "risk",
                    str(
                        _(
                            "The gate calls this tool as the fallback of %(tools)s, and it never calls a write that "
                            "nobody asked for: set their fallback policy to 'suggest it to the model' first."
                        )
                        % {"tools": ", ".join(f"'{name}'" for name in callers)}
                    ),
                )
            )
    return found


def idempotency_choices(tool: McpTool, contract_args: dict[str, Any]) -> list[str]:
    """The arguments that may carry a write call's idempotency key: the input schema's and the contract's."""
    properties = (tool.input_schema or {}).get("properties") if isinstance(tool.input_schema, dict) else None
    return sorted({*(properties if isinstance(properties, dict) else {}), *contract_args})


class ToolEmbedding(models.Model):
    """A tool's vector for the embedding tool ranker (``mcpregistry.embeddings``), cached per embedding model.
    ``text_digest`` is the SHA-256 of the text that was embedded: a changed description, tag or example query
    makes it stale and it is recomputed."""

    tool = models.ForeignKey(McpTool, on_delete=models.CASCADE, related_name="embeddings", verbose_name=_("tool"))
    model = models.CharField(_("embedding model"), max_length=200)
    text_digest = models.CharField(_("text digest"), max_length=64)
    vector = models.JSONField(verbose_name=_("vector"), default=list)
    computed_at = models.DateTimeField(_("computed"), auto_now=True)

    change_audit = NotConfiguration("a cache derived from a tool's description, recomputed when it changes")

    class Meta:
        verbose_name = _("tool embedding")
        verbose_name_plural = _("tool embeddings")
        constraints = [models.UniqueConstraint(fields=["tool", "model"], name="toolembedding_unique_tool_model")]

    def __str__(self) -> str:
        return f"{self.tool} @ {self.model}"


class RequestCategory(AuditedModel):
    """One row of the ``classify_request`` local tool's table (seed 001): a support request that mentions any of
    ``keywords`` belongs to ``department``. The request goes to the department whose keywords it mentions most;
    a tie goes to the lower ``order``. Admins edit the table; changes are audited."""

    department = models.CharField(_("department"), max_length=100, unique=True)
    keywords = models.JSONField(
        encoder=UnicodeJSONEncoder,
        verbose_name=_("keywords"),
        default=list,
        help_text=_('A JSON list of words, e.g. ["프린터", "노트북"].'),
    )
    order = models.PositiveIntegerField(_("order"), default=100, validators=[MaxValueValidator(INT32_MAX)])
    enabled = models.BooleanField(_("enabled"), default=True)

    change_audit = ChangeAudit(entity="request_category")

    class Meta:
        verbose_name = _("request category")
        verbose_name_plural = _("request categories")
        ordering = ["order", "department"]

    def __str__(self) -> str:
        return self.department

    def audit_target(self) -> tuple[str, str]:
        return "local", self.department

    def clean(self) -> None:
        """The department and keywords are stored composed (NFC), on every path that writes them (the admin,
        the services): a keyword typed decomposed would never match a request, and a department typed decomposed
        would be a second row of the same name (the unique check, which runs after this, sees it composed)."""
        if isinstance(self.department, str):
            self.department = nfc(self.department)
        keywords = self.keywords
        if (
            not isinstance(keywords, list)
            or not keywords
            or not all(isinstance(k, str) and k.strip() for k in keywords)
        ):
            raise ValidationError({"keywords": [_('Enter a JSON list of words, e.g. ["프린터", "노트북"].')]})
        self.keywords = list(dict.fromkeys(nfc(k.strip()) for k in keywords))  # the same word once


def tool_argument_names(tool: McpTool, contract_args: dict[str, Any] | None = None) -> set[str]:
    """The arguments a call of ``tool`` may carry: its contract's, else its input schema's (as the gate reads
    them, ``contracts.argument_names``); where the schema lets other names through too, those it declares."""
    names = argument_names(contract_args or {}, tool.input_schema)
    if names is not None:
        return set(names)
    properties = (tool.input_schema or {}).get("properties") if isinstance(tool.input_schema, dict) else None
    return set(properties) if isinstance(properties, dict) else set()


def tool_required_arguments(tool: McpTool) -> set[str]:
    """The arguments ``tool`` requires: its contract's required ones, else its input schema's ``required``."""
    contract = ToolContract.objects.filter(tool=tool).first()
    if contract is not None and contract.args:
        return {name for name, spec in contract.args.items() if isinstance(spec, dict) and spec.get("required")}
    required = (tool.input_schema or {}).get("required") if isinstance(tool.input_schema, dict) else None
    return {str(name) for name in required} if isinstance(required, list) else set()


def fallback_problem(tool: McpTool, fallback: str, contract_args: dict[str, Any] | None = None) -> str | None:
    """Why ``fallback`` cannot stand in for ``tool`` (it gets the same arguments), or None. Before the server's
    first discovery its tools are not known yet (a contract imported as code): nothing is checked then."""
    server_tools = tool.server.tools.filter(discovered_at__isnull=False)
    if not server_tools.exists():
        return None
    backup = server_tools.filter(name=fallback).first()
    if backup is None:
        names = sorted(server_tools.exclude(pk=tool.pk).values_list("name", flat=True))
        return str(
            _("The server has no tool '%(tool)s'; its other tools are: %(names)s")
            % {"tool": fallback, "names": ", ".join(names) or "—"}
        )
    missing = sorted(tool_required_arguments(backup) - tool_argument_names(tool, contract_args))
    if missing:
        return str(
            _(
                "'%(tool)s' requires %(missing)s, which this tool's arguments do not include: it gets the same arguments."
            )
            % {"tool": fallback, "missing": ", ".join(missing)}
        )
    return None
