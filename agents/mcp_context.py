"""An agent's MCP resources and prompt (seed 003 §3.1): resources read at run start and attached as context,
an MCP prompt as the system-prompt template, and a ``read_resource`` tool limited to the bound servers'
resources. Everything is read through the gate (``gate.read_resource`` / ``gate.get_prompt``): audited,
masked, size-capped, behind the breaker. No ORM here; the engine hands in the bound servers.

What a resource says, and a prompt rendered with what the run was asked, is data, never instructions: it reaches
the system message inside the same ``<tool_data>`` block as deterministic results (escaped so nothing in it can
close the block) after the notice that says so. A prompt whose arguments are the admin's own text or the calling
system's context (``{context.KEY}``: which chatbot, which locale) is the system prompt; one that takes the query
(``{query}``) or the data sent with it (``{data.PATH}``) is not: the agent's own system prompt stays, and the
rendered prompt is attached as data.
"""

from __future__ import annotations

from typing import Any

from django.utils.translation import gettext as _
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agents.answers import TOOL_DATA_NOTICE
from agents.deterministic import PLACEHOLDER
from audit.visible import tool_data_block
from mcpregistry.contracts import spec_message

READ_RESOURCE_TOOL = "read_resource"


class ResourceRef(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mcp_id: str = Field(min_length=1)
    uri: str = Field(min_length=1)


class PromptRef(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mcp_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    # Argument → template (``{query}``, ``{context.KEY}``, ``{data.PATH}``), rendered for each run.
    arguments: dict[str, str] = Field(default_factory=dict)

    def takes_run_input(self) -> bool:
        """Whether an argument takes what the run was asked (``{query}``: an end user's words) or the data sent
        with it (``{data.PATH}``): the rendered prompt is then data, not the system prompt. The calling system's
        ``{context.KEY}`` (a chatbot id, a locale, a user id it vouches for) may choose a prompt's variant as
        the admin's own text does."""
        return any(
            found.group(1) == "query" or found.group(1).startswith("data.")
            for template in self.arguments.values()
            for found in PLACEHOLDER.finditer(template)
        )


class McpContextSettings(BaseModel):
    """An agent's ``mcp_context`` JSON."""

    model_config = ConfigDict(extra="forbid")

    resources: list[ResourceRef] = Field(default_factory=list)
    prompt: PromptRef | None = None
    read_resource_tool: bool = False


def mcp_context_settings(raw: Any) -> McpContextSettings:
    """The settings from an agent's stored JSON. Raises ``ValueError`` naming the bad field."""
    try:
        return McpContextSettings.model_validate(raw or {})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "mcp_context"
        raise ValueError(f"{where}: {spec_message(first, McpContextSettings)}") from exc


def read_resource_spec(uris: list[str]) -> dict[str, Any]:
    """The ``read_resource`` tool as the model is told of it: the URIs it may read, as an enum."""
    return {
        "type": "function",
        "function": {
            "name": READ_RESOURCE_TOOL,
            "description": "Read one of the MCP resources available to this agent (documents, data) by its URI.",
            "parameters": {
                "type": "object",
                "properties": {"uri": {"type": "string", "enum": sorted(uris)}},
                "required": ["uri"],
            },
        },
    }


def context_block(*, resources: list[dict[str, Any]], prompt: dict[str, Any] | None) -> str:
    """The resources read at run start (``{"mcp_id", "uri", "text"}``) and a prompt rendered with the caller's text
    (``{"mcp_id", "name", "text"}``), for the system message: a heading, the notice that they are data, and one
    ``<tool_data>`` block. ``""`` when there is neither."""
    data: dict[str, Any] = {}
    if resources:
        data["resources"] = resources
    if prompt:
        data["prompt"] = prompt
    if not data:
        return ""
    heading = _("MCP resources and prompt for this run (reference material):")
    return f"{heading}\n{TOOL_DATA_NOTICE}\n{tool_data_block(data)}"
