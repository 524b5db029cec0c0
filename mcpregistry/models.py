"""MCP server bindings and the tools they expose."""

from __future__ import annotations

from typing import Any

from django.db import models
from django.utils.translation import gettext_lazy as _

from agent_platform.json import UnicodeJSONEncoder


class McpServer(models.Model):
    """A binding to one MCP server: how to start or reach it, and its secrets.

    ``env`` (stdio) and ``headers`` (HTTP) hold secret values: they are never shown back by the admin or
    the API, and the audit masks their exact values wherever they appear.
    """

    class Transport(models.TextChoices):
        STDIO = "stdio", _("stdio")
        STREAMABLE_HTTP = "streamable_http", _("Streamable HTTP")
        SSE = "sse", _("SSE")

    class Health(models.TextChoices):
        UNKNOWN = "unknown", _("unknown")
        OK = "ok", _("ok")
        ERROR = "error", _("error")

    mcp_id = models.SlugField(_("MCP id"), max_length=64, unique=True)
    name = models.CharField(_("name"), max_length=200)
    transport = models.CharField(_("transport"), max_length=20, choices=Transport.choices, default=Transport.STDIO)
    command = models.CharField(_("command"), max_length=500, blank=True)
    args = models.JSONField(encoder=UnicodeJSONEncoder, verbose_name=_("arguments"), default=list, blank=True)
    cwd = models.CharField(_("working directory"), max_length=500, blank=True)
    env = models.JSONField(
        encoder=UnicodeJSONEncoder, verbose_name=_("environment (secret values)"), default=dict, blank=True
    )
    url = models.URLField(_("URL"), max_length=500, blank=True)
    headers = models.JSONField(
        encoder=UnicodeJSONEncoder, verbose_name=_("headers (secret values)"), default=dict, blank=True
    )
    timeout_s = models.FloatField(_("call timeout (seconds)"), default=30.0)
    enabled = models.BooleanField(_("enabled"), default=True)
    tool_prefix = models.CharField(_("tool name prefix"), max_length=40, blank=True)
    health = models.CharField(_("health"), max_length=10, choices=Health.choices, default=Health.UNKNOWN)
    last_checked_at = models.DateTimeField(_("last checked"), null=True, blank=True)
    last_error = models.TextField(_("last error"), blank=True)
    protocol_version = models.CharField(_("MCP protocol version"), max_length=40, blank=True)
    server_info = models.JSONField(encoder=UnicodeJSONEncoder, verbose_name=_("server info"), default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = _("MCP server")
        verbose_name_plural = _("MCP servers")
        ordering = ["mcp_id"]

    def __str__(self) -> str:
        return self.mcp_id

    def secret_values(self) -> list[str]:
        """The secret values of this binding, for masking: every env or header value under a secret-looking name
        (token, password, api_key, authorization…) and any value of 16 characters or more. Short settings such
        as ``FAILURE_MODE=none`` are not secrets (masking "none" everywhere would garble text)."""
        from audit.masking import is_secret_key

        pairs = [*self.env.items(), *self.headers.items()]
        return [str(v) for k, v in pairs if v and (is_secret_key(str(k)) or len(str(v)) >= 16)]

    def connection_config(self) -> dict[str, Any]:
        """The pool's connection description of this binding (contains secrets: never log or show it)."""
        return {
            "mcp_id": self.mcp_id,
            "transport": self.transport,
            "command": self.command,
            "args": list(self.args or []),
            "cwd": self.cwd or None,
            "env": dict(self.env or {}),
            "url": self.url,
            "headers": dict(self.headers or {}),
        }


class McpTool(models.Model):
    """A tool a server exposes, as last discovered. Admins may disable a tool."""

    server = models.ForeignKey(McpServer, on_delete=models.CASCADE, related_name="tools", verbose_name=_("server"))
    name = models.CharField(_("name"), max_length=200)
    description = models.TextField(_("description"), blank=True)
    input_schema = models.JSONField(
        encoder=UnicodeJSONEncoder, verbose_name=_("input schema"), default=dict, blank=True
    )
    annotations = models.JSONField(encoder=UnicodeJSONEncoder, verbose_name=_("annotations"), default=dict, blank=True)
    enabled = models.BooleanField(_("enabled"), default=True)
    available = models.BooleanField(
        _("available"), default=True, help_text=_("False when the last discovery no longer listed this tool.")
    )
    discovered_at = models.DateTimeField(_("discovered"), null=True, blank=True)

    class Meta:
        verbose_name = _("MCP tool")
        verbose_name_plural = _("MCP tools")
        ordering = ["server__mcp_id", "name"]
        constraints = [models.UniqueConstraint(fields=["server", "name"], name="mcptool_unique_server_name")]

    def __str__(self) -> str:
        return f"{self.server.mcp_id}.{self.name}"

    @property
    def exposed_name(self) -> str:
        """The name the model sees: the server's prefix plus the tool's own name."""
        return f"{self.server.tool_prefix}{self.name}"
