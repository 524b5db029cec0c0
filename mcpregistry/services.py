"""Services for MCP bindings: discovery and health."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from django.db import transaction
from django.utils import timezone

from audit.masking import mask_text
from mcpregistry.contracts import contract_defaults, schema_problem
from mcpregistry.models import McpServer, McpTool, ToolContract
from mcpregistry.pool import get_default_pool

logger = logging.getLogger(__name__)


@dataclass
class DiscoveryReport:
    mcp_id: str
    ok: bool
    error: str = ""
    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    vanished: list[str] = field(default_factory=list)
    review_required: list[str] = field(default_factory=list)
    schema_errors: list[str] = field(default_factory=list)
    tool_count: int = 0


def mcp_server_discover(*, server: McpServer) -> DiscoveryReport:
    """Connect (or reuse the pooled session), list the server's tools and update the registry.

    New tools are added enabled; changed ones updated; tools no longer listed are marked unavailable; an
    admin's per-tool enable/disable is kept. The server's health is recorded either way. Never raises for
    the server's failure: the report and the binding's health carry it.
    """
    report = DiscoveryReport(mcp_id=server.mcp_id, ok=False)
    # A per-run server gets a session for this discovery alone; a shared one warms this process's session.
    scope = server.pool_scope("discovery")
    try:
        listing = get_default_pool().list_tools(
            server.connection_config(), timeout_s=max(server.timeout_s, 30.0), scope=scope
        )
    except Exception as exc:  # noqa: BLE001 - recorded as the binding's health
        report.error = mask_text(str(exc) or type(exc).__name__, secrets=server.secret_values())[:2000]
        McpServer.objects.filter(pk=server.pk).update(
            health=McpServer.Health.ERROR, last_error=report.error, last_checked_at=timezone.now()
        )
        return report
    finally:
        if scope is not None:
            get_default_pool().close_scope(scope)
    now = timezone.now()
    with transaction.atomic():
        existing = {t.name: t for t in server.tools.all()}
        seen: set[str] = set()
        for listed in listing.tools:
            name = listed["name"]
            seen.add(name)
            description = listed.get("description") or ""
            input_schema = listed.get("inputSchema") or {}
            problem = schema_problem(input_schema)
            if problem:
                report.schema_errors.append(f"{name}: {problem}")
            tool = existing.get(name)
            if tool is None:
                tool = McpTool.objects.create(
                    server=server,
                    name=name,
                    description=description,
                    input_schema=input_schema,
                    annotations=listed.get("annotations") or {},
                    schema_error=problem or "",
                    discovered_at=now,
                )
                ToolContract.objects.create(tool=tool, **contract_defaults(input_schema, tool.annotations))
                report.added.append(name)
                continue
            if not ToolContract.objects.filter(tool=tool).exists():
                ToolContract.objects.create(
                    tool=tool, **contract_defaults(input_schema, listed.get("annotations") or {})
                )
            changed = tool.description != description or tool.input_schema != input_schema
            updates: dict[str, object] = {
                "description": description,
                "input_schema": input_schema,
                "annotations": listed.get("annotations") or {},
                "available": True,
                "schema_error": problem or "",
                "discovered_at": now,
            }
            if changed:
                report.updated.append(name)
                if tool.enabled and tool.discovered_at is not None:
                    # A tool an admin enabled changed under them: keep the old text and park it for review.
                    updates.update(
                        enabled=False,
                        review_required=True,
                        previous_description=tool.description,
                        previous_input_schema=tool.input_schema,
                    )
                    report.review_required.append(name)
            McpTool.objects.filter(pk=tool.pk).update(**updates)
        for name, tool in existing.items():
            if name not in seen and tool.available:
                McpTool.objects.filter(pk=tool.pk).update(available=False)
                report.vanished.append(name)
        schema_error = (
            "tools with an unusable input schema (never offered to a model): " + "; ".join(report.schema_errors)
            if report.schema_errors
            else ""
        )
        McpServer.objects.filter(pk=server.pk).update(
            health=McpServer.Health.ERROR if schema_error else McpServer.Health.OK,
            last_error=schema_error,
            last_checked_at=now,
            protocol_version=listing.protocol_version,
            server_info=listing.server_info,
            resources=listing.resources,
            prompts=listing.prompts,
        )
    report.ok = True
    report.tool_count = len(listing.tools)
    return report
