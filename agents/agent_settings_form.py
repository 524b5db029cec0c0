"""The structured editors of an agent's ``tool_selection`` and ``mcp_context`` JSON fields (the agent form).

As in the contract and rule editors (``mcpregistry.contract_form``, ``agents.rule_form``), each field keeps its
name and its model validation; its widget names every key the settings have (``ToolSelectionSettings``,
``McpContextSettings``) as an input, offers the agent's own tools, servers, resources and prompts as choices,
and reads the inputs back into the same JSON. Keys left at their defaults stay absent, so saving an unchanged
page records no change. The field's JSON is shown below the inputs: when an admin edits that text, it wins (a
script may post the JSON under the field's own name, as before).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from django.utils.datastructures import MultiValueDict
from django.utils.translation import gettext_lazy as _
from pydantic import ValidationError as PydanticValidationError

from agents.mcp_context import McpContextSettings
from agents.tool_selection import ToolSelectionSettings
from mcpregistry.contract_form import EditorWidget, _loads, _merge, _number
from mcpregistry.contracts import spec_problems
from mcpregistry.models import McpServer, McpTool

SELECTION_DEFAULTS: dict[str, Any] = ToolSelectionSettings().model_dump()
RANKER_CHOICES = [("lexical", _("lexical (BM25, no network)")), ("embedding", _("embedding (vectors of the tools)"))]


def _words(text: str) -> list[str]:
    return [w.strip() for w in text.split(",") if w.strip()]


def _json_view(value: Any) -> str:
    parsed = _loads(value)
    if parsed is None:  # text that is no JSON: shown as it was posted, so the admin can fix it
        return str(value)
    return json.dumps(parsed, ensure_ascii=False, indent=1)


class _SettingsWidget(EditorWidget):
    """Common to both editors: the stored JSON, the JSON view (``<name>__json``, winning when edited)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stored: dict[str, Any] = {}

    def get_context(self, name: str, value: Any, attrs: dict[str, Any] | None) -> dict[str, Any]:
        context = super().get_context(name, value, attrs)
        parsed = _loads(value)
        context["widget"].update(
            {"settings": parsed if isinstance(parsed, dict) else {}, "json_text": _json_view(value or {})}
        )
        return context

    def value_from_editor(self, data: MultiValueDict[str, Any], name: str) -> Any:
        raw = str(data.get(f"{name}__json", "")).strip()
        shown = str(data.get(f"{name}__json_shown", "")).strip()
        if raw and (raw.split() != shown.split()) and _loads(raw) != _loads(shown):
            return raw  # the JSON view was edited: it wins (text that is no JSON is refused naming the field)
        return json.dumps(self.value_from_inputs(data, name), ensure_ascii=False)

    def value_from_inputs(self, data: MultiValueDict[str, Any], name: str) -> dict[str, Any]:
        raise NotImplementedError


class ToolSelectionWidget(_SettingsWidget):
    """``tool_selection``: on/off, K, the ranker, hard filters (servers, tags), pinned tools, the forced first
    tool and the widening bounds."""

    template_name = "admin/agents/widgets/tool_selection.html"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tool_names: list[str] = []
        self.server_ids: list[str] = []
        self.known_tags: list[str] = []

    def get_context(self, name: str, value: Any, attrs: dict[str, Any] | None) -> dict[str, Any]:
        context = super().get_context(name, value, attrs)
        current = {**SELECTION_DEFAULTS, **context["widget"]["settings"]}
        pinned = [str(p) for p in current.get("pinned") or []]
        servers = [str(s) for s in current.get("servers") or []]
        forced = str(current.get("force_first_tool") or "")
        context["widget"].update(
            {
                "current": current,
                "rankers": RANKER_CHOICES,
                "tools": [(t, t in pinned) for t in dict.fromkeys([*self.tool_names, *pinned])],
                "servers": [(s, s in servers) for s in dict.fromkeys([*self.server_ids, *servers])],
                "tags_text": ", ".join(map(str, current.get("tags") or [])),
                "known_tags": ", ".join(self.known_tags),
                "force_choices": [
                    ("", _("— the model chooses —")),
                    ("any", _("any tool")),
                    *(
                        (t, t)
                        for t in dict.fromkeys([*self.tool_names, *([forced] if forced not in {"", "any"} else [])])
                    ),
                ],
                "forced": forced,
            }
        )
        return context

    def value_from_inputs(self, data: MultiValueDict[str, Any], name: str) -> dict[str, Any]:
        settings = dict(self.stored)

        def field(key: str) -> str:
            return str(data.get(f"{name}__{key}", "")).strip()

        def put(key: str, value: Any) -> None:
            _merge(settings, key, value, default=SELECTION_DEFAULTS[key])

        put("enabled", f"{name}__enabled" in data)
        for key in ("top_k", "widen_step", "max_widenings"):
            put(key, _number(field(key)) if field(key) else SELECTION_DEFAULTS[key])
        put("ranker", field("ranker") or SELECTION_DEFAULTS["ranker"])
        put("pinned", [p for p in data.getlist(f"{name}__pinned") if p])
        put("servers", [s for s in data.getlist(f"{name}__servers") if s])
        put("tags", _words(field("tags")))
        put("force_first_tool", field("force_first_tool"))
        return settings


class McpContextWidget(_SettingsWidget):
    """``mcp_context``: the bound servers' resources to attach (checkboxes), the ``read_resource`` tool, and a
    prompt as the system prompt with its arguments (one ``NAME=template`` per line)."""

    template_name = "admin/agents/widgets/mcp_context.html"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.servers: list[McpServer] = []

    def get_context(self, name: str, value: Any, attrs: dict[str, Any] | None) -> dict[str, Any]:
        context = super().get_context(name, value, attrs)
        current = context["widget"]["settings"]
        chosen = [r for r in current.get("resources") or [] if isinstance(r, dict)]
        chosen_keys = {(str(r.get("mcp_id")), str(r.get("uri"))) for r in chosen}
        resources: list[dict[str, Any]] = []
        for server in self.servers:
            for resource in server.resources or []:
                if isinstance(resource, dict) and resource.get("uri"):
                    resources.append(_resource_row(server.mcp_id, resource, chosen_keys))
        offered = {(r["mcp_id"], r["uri"]) for r in resources}
        resources += [
            _resource_row(str(r.get("mcp_id")), {"uri": r.get("uri")}, chosen_keys)
            for r in chosen
            if (str(r.get("mcp_id")), str(r.get("uri"))) not in offered
        ]
        prompt = current.get("prompt") if isinstance(current.get("prompt"), dict) else {}
        prompt_value = _prompt_value(prompt) if prompt else ""
        prompts: list[tuple[str, str, str]] = [("", str(_("— none (the agent's system prompt) —")), "")]
        for server in self.servers:
            for entry in server.prompts or []:
                if isinstance(entry, dict) and entry.get("name"):
                    declared = [a.get("name") for a in entry.get("arguments") or [] if isinstance(a, dict)]
                    label = f"{server.mcp_id}: {entry['name']}"
                    prompts.append(
                        (
                            _prompt_value({"mcp_id": server.mcp_id, "name": entry["name"]}),
                            label,
                            ", ".join(map(str, declared)),
                        )
                    )
        if prompt_value and prompt_value not in {p[0] for p in prompts}:
            prompts.append((prompt_value, f"{prompt.get('mcp_id')}: {prompt.get('name')}", ""))
        stored_arguments = prompt.get("arguments")
        arguments: dict[str, Any] = stored_arguments if isinstance(stored_arguments, dict) else {}
        context["widget"].update(
            {
                "resources": resources,
                "read_resource_tool": bool(current.get("read_resource_tool")),
                "prompts": prompts,
                "prompt_value": prompt_value,
                "arguments_text": "\n".join(f"{k}={v}" for k, v in arguments.items()),
            }
        )
        return context

    def value_from_inputs(self, data: MultiValueDict[str, Any], name: str) -> dict[str, Any]:
        settings = dict(self.stored)
        resources = [r for r in (_loads(v) for v in data.getlist(f"{name}__resources")) if isinstance(r, dict)]
        _merge(settings, "resources", resources or None, default=[])
        _merge(settings, "read_resource_tool", (f"{name}__read_resource_tool" in data) or None, default=False)
        chosen = _loads(str(data.get(f"{name}__prompt", "") or ""))
        if isinstance(chosen, dict) and chosen.get("name"):
            arguments: dict[str, Any] = {}
            for line in str(data.get(f"{name}__prompt_arguments", "")).splitlines():
                key, sep, template = line.partition("=")
                if key.strip():
                    # A line without "=" is kept as it is, so the settings' validation names it.
                    arguments[key.strip()] = template.strip() if sep else None
            prompt = {"mcp_id": chosen.get("mcp_id"), "name": chosen["name"]}
            if arguments:
                prompt["arguments"] = arguments
            _merge(settings, "prompt", prompt)
        else:
            settings.pop("prompt", None)
        return settings


def _resource_row(mcp_id: str, resource: dict[str, Any], chosen: set[tuple[str, str]]) -> dict[str, Any]:
    uri = str(resource.get("uri"))
    return {
        "mcp_id": mcp_id,
        "uri": uri,
        "label": resource.get("name") or uri,
        "description": resource.get("description") or "",
        "value": json.dumps({"mcp_id": mcp_id, "uri": uri}, ensure_ascii=False),
        "checked": (mcp_id, uri) in chosen,
    }


def _prompt_value(prompt: dict[str, Any]) -> str:
    return json.dumps({"mcp_id": prompt.get("mcp_id"), "name": prompt.get("name")}, ensure_ascii=False)


def agent_tool_names(servers: Iterable[McpServer]) -> list[str]:
    """The names the model sees of the servers' tools (enabled, available, as in a run's tool index)."""
    tools = McpTool.objects.filter(server__in=list(servers), enabled=True, available=True).select_related("server")
    return sorted({t.exposed_name for t in tools})


def agent_tool_tags(servers: Iterable[McpServer]) -> list[str]:
    tags = McpTool.objects.filter(server__in=list(servers), enabled=True).values_list("tags", flat=True)
    return sorted({str(t) for tag_list in tags for t in (tag_list or [])})


def selection_problems(raw: Any, *, tool_names: list[str], server_ids: list[str]) -> list[str]:
    """What is wrong with a ``tool_selection`` value, each naming the valid keys or values."""
    try:
        settings = ToolSelectionSettings.model_validate(raw or {})
    except PydanticValidationError as exc:
        return spec_problems(exc, ToolSelectionSettings)
    problems: list[str] = []
    names = ", ".join(tool_names) or "—"
    unknown = [p for p in settings.pinned if p not in tool_names]
    if unknown:
        problems.append(
            str(_("pinned: %(unknown)s is not a tool of this agent; its tools are: %(names)s"))
            % {"unknown": ", ".join(unknown), "names": names}
        )
    if settings.force_first_tool not in {"", "any", *tool_names}:
        problems.append(
            str(_('force_first_tool: "%(tool)s" is not a tool of this agent; choose "", "any" or one of: %(names)s'))
            % {"tool": settings.force_first_tool, "names": names}
        )
    outside = [s for s in settings.servers if s not in server_ids]
    if outside:
        problems.append(
            str(_("servers: %(unknown)s is not bound to this agent; its servers are: %(ids)s"))
            % {"unknown": ", ".join(outside), "ids": ", ".join(server_ids) or "—"}
        )
    return problems


def context_problems(raw: Any, *, servers: list[McpServer]) -> list[str]:
    """What is wrong with an ``mcp_context`` value: its shape, and resources or a prompt outside the agent's
    servers (named with the valid ones)."""
    try:
        settings = McpContextSettings.model_validate(raw or {})
    except PydanticValidationError as exc:
        return spec_problems(exc, McpContextSettings)
    by_id = {s.mcp_id: s for s in servers}
    ids = ", ".join(by_id) or "—"
    problems: list[str] = []
    for ref in settings.resources:
        server = by_id.get(ref.mcp_id)
        if server is None:
            problems.append(
                str(_("resources: %(id)s is not bound to this agent; its servers are: %(ids)s"))
                % {"id": ref.mcp_id, "ids": ids}
            )
            continue
        uris = [str(r.get("uri")) for r in server.resources or [] if isinstance(r, dict)]
        if ref.uri not in uris:
            problems.append(
                str(_("resources: %(id)s has no resource %(uri)s; its resources are: %(uris)s"))
                % {"id": ref.mcp_id, "uri": ref.uri, "uris": ", ".join(uris) or "—"}
            )
    if settings.prompt is not None:
        server = by_id.get(settings.prompt.mcp_id)
        if server is None:
            problems.append(
                str(_("prompt: %(id)s is not bound to this agent; its servers are: %(ids)s"))
                % {"id": settings.prompt.mcp_id, "ids": ids}
            )
        else:
            names = [str(p.get("name")) for p in server.prompts or [] if isinstance(p, dict)]
            if settings.prompt.name not in names:
                problems.append(
                    str(_("prompt: %(id)s has no prompt %(name)s; its prompts are: %(names)s"))
                    % {"id": server.mcp_id, "name": settings.prompt.name, "names": ", ".join(names) or "—"}
                )
    return problems
