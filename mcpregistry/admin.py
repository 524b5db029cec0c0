"""Admin for MCP bindings. Secret env and header values are write-only: shown as set/unset, never rendered."""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext_lazy as _

from mcpregistry.models import McpServer, McpTool
from mcpregistry.services import mcp_server_discover


class SecretMapField(forms.CharField):
    """A JSON object of secret values, entered but never shown back. Empty keeps what is stored."""

    widget = forms.Textarea(attrs={"rows": 3, "autocomplete": "off", "placeholder": '{"NAME": "value"}'})

    def to_python(self, value: Any) -> dict[str, str] | None:
        if value in (None, ""):
            return None
        try:
            parsed = json.loads(value)
        except ValueError as exc:
            raise forms.ValidationError(_('Enter a JSON object, e.g. {"API_TOKEN": "..."}.')) from exc
        if not isinstance(parsed, dict) or not all(isinstance(v, str) for v in parsed.values()):
            raise forms.ValidationError(_("Enter a JSON object whose values are strings."))
        return parsed


class McpServerForm(forms.ModelForm):
    new_env = SecretMapField(
        label=_("environment (secret values)"),
        required=False,
        help_text=_("A JSON object. Leave empty to keep the stored values; they are never shown."),
    )
    new_headers = SecretMapField(
        label=_("headers (secret values)"),
        required=False,
        help_text=_("A JSON object. Leave empty to keep the stored values; they are never shown."),
    )
    url = forms.URLField(label=_("URL"), required=False, assume_scheme="https", max_length=500)
    clear_secrets = forms.BooleanField(label=_("clear all stored secret values"), required=False)

    class Meta:
        model = McpServer
        fields = ["mcp_id", "name", "transport", "enabled", "timeout_s", "tool_prefix", "command", "args", "cwd", "url"]

    def save(self, commit: bool = True) -> McpServer:
        server: McpServer = super().save(commit=False)
        if self.cleaned_data.get("clear_secrets"):
            server.env, server.headers = {}, {}
        if self.cleaned_data.get("new_env") is not None:
            server.env = self.cleaned_data["new_env"]
        if self.cleaned_data.get("new_headers") is not None:
            server.headers = self.cleaned_data["new_headers"]
        if commit:
            server.save()
        return server


class McpToolInline(admin.TabularInline):
    model = McpTool
    extra = 0
    fields = ["name", "enabled", "available", "description", "discovered_at"]
    readonly_fields = ["name", "available", "description", "discovered_at"]
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(McpServer)
class McpServerAdmin(admin.ModelAdmin):
    form = McpServerForm
    list_display = ["mcp_id", "name", "transport", "enabled", "health_badge", "last_checked_at", "tool_count"]
    list_filter = ["transport", "enabled", "health"]
    search_fields = ["mcp_id", "name"]
    readonly_fields = ["secrets_state", "health", "last_checked_at", "last_error", "protocol_version", "server_info"]
    inlines = [McpToolInline]
    actions = ["discover_tools"]
    fieldsets = [
        (None, {"fields": ["mcp_id", "name", "transport", "enabled", "timeout_s", "tool_prefix"]}),
        (_("stdio"), {"fields": ["command", "args", "cwd"]}),
        (_("HTTP"), {"fields": ["url"]}),
        (_("secrets"), {"fields": ["secrets_state", "new_env", "new_headers", "clear_secrets"]}),
        (_("health"), {"fields": ["health", "last_checked_at", "last_error", "protocol_version", "server_info"]}),
    ]

    @admin.display(description=_("secrets"))
    def secrets_state(self, obj: McpServer) -> str:
        names = [(f"env {k}",) for k in obj.env] + [(f"header {k}",) for k in obj.headers]
        if not names:
            return _("none set")
        return format_html_join(", ", "{}: set", names)

    @admin.display(description=_("health"), ordering="health")
    def health_badge(self, obj: McpServer) -> str:
        colour = {"ok": "green", "error": "#ba2121"}.get(obj.health, "gray")
        return format_html(
            '<b style="color:{}">{}</b>{}',
            colour,
            obj.get_health_display(),
            format_html(": {}", obj.last_error[:120]) if obj.last_error else "",
        )

    @admin.display(description=_("tools"))
    def tool_count(self, obj: McpServer) -> int:
        return obj.tools.filter(available=True).count()

    @admin.action(description=_("Discover tools (connect and list)"))
    def discover_tools(self, request: HttpRequest, queryset: QuerySet[McpServer]) -> None:
        for server in queryset:
            report = mcp_server_discover(server=server)
            if report.ok:
                self.message_user(request, _("%(id)s: %(n)d tools") % {"id": server.mcp_id, "n": report.tool_count})
            else:
                self.message_user(request, f"{server.mcp_id}: {report.error}", level=messages.ERROR)


@admin.register(McpTool)
class McpToolAdmin(admin.ModelAdmin):
    list_display = ["name", "server", "enabled", "available", "discovered_at"]
    list_filter = ["server", "enabled", "available"]
    search_fields = ["name", "description"]
    readonly_fields = ["server", "name", "description", "input_schema", "annotations", "available", "discovered_at"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False
