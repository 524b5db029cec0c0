"""The audit record in the admin: read-only, for everyone."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.translation import gettext_lazy as _

from audit.models import AuditEvent


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    list_display = ["id", "created_at", "source", "mcp_id", "tool", "ok", "reason", "attempt", "latency_ms", "run"]
    list_filter = ["source", "ok", "mcp_id", "tool", "reason"]
    search_fields = ["tool", "mcp_id", "reason", "run__id"]
    date_hierarchy = "created_at"
    readonly_fields = [
        "id",
        "created_at",
        "run",
        "source",
        "action",
        "mcp_id",
        "tool",
        "call_id",
        "args_pretty",
        "result_pretty",
        "ok",
        "reason",
        "attempt",
        "latency_ms",
        "actor",
    ]
    exclude = ["args", "result"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description=_("arguments (masked)"))
    def args_pretty(self, obj: AuditEvent) -> str:
        return format_html("<pre>{}</pre>", json.dumps(obj.args, ensure_ascii=False, indent=2))

    @admin.display(description=_("result (masked)"))
    def result_pretty(self, obj: AuditEvent) -> str:
        return format_html(
            "<pre style='white-space:pre-wrap'>{}</pre>", json.dumps(obj.result, ensure_ascii=False, indent=2)
        )
