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
import re
from collections.abc import Iterable, Sequence
from typing import Any

from django.utils.datastructures import MultiValueDict
from django.utils.translation import gettext_lazy as _
from pydantic import BaseModel
from pydantic import ValidationError as PydanticValidationError

from agent_platform.text import nfc
from agents.deterministic import PLACEHOLDER
from agents.mcp_context import READ_RESOURCE_TOOL, McpContextSettings
from agents.tool_selection import ToolSelectionSettings
from mcpregistry.contract_form import EditorWidget, _loads, _merge, _number
from mcpregistry.contracts import spec_problems
from mcpregistry.embeddings import embedding_service_configured
from mcpregistry.list_fields import key_fits, one_line
from mcpregistry.models import McpServer, McpTool

SELECTION_DEFAULTS: dict[str, Any] = ToolSelectionSettings().model_dump()
RANKER_CHOICES = [("lexical", _("lexical (BM25, no network)")), ("embedding", _("embedding (vectors of the tools)"))]


def _words(text: str) -> list[str]:
    return [w.strip() for w in text.split(",") if w.strip()]


def _in_stored_order(posted: list[Any], stored: Any, key: Any = None) -> list[Any]:
    """``posted`` (what a multiple choice sent, in the page's order: the tools', the servers') in the order
    ``stored`` keeps them, the newly chosen ones after: a page saved unchanged then saves the list unchanged (a
    pinned list reordered by the page was a change, audited as one). ``key`` says when two items are the same."""
    same = key or (lambda item: item)
    posted_by_key = {same(item): item for item in posted}
    kept = [item for item in stored if same(item) in posted_by_key] if isinstance(stored, list) else []
    kept_keys = {same(item) for item in kept}
    return [*kept, *(item for k, item in posted_by_key.items() if k not in kept_keys)]


def _switches_and_counts(model: type[BaseModel]) -> list[str]:
    """The keys of ``model`` that are a true/false or a whole number."""
    return [key for key, info in model.model_fields.items() if info.annotation in (bool, int)]


def _as_runs_read(settings: dict[str, Any], model: type[BaseModel]) -> dict[str, Any]:
    """``settings`` with their switches and numbers as a run reads them (pydantic's lax parsing: ``"false"`` is
    off), for the editor to show: a stored ``"false"`` was shown on, and the page saved back switched it on.
    Settings that do not validate are shown as they are (their check names what is wrong)."""
    try:
        parsed = model.model_validate(settings)
    except PydanticValidationError:
        return settings
    return {**settings, **{key: getattr(parsed, key) for key in _switches_and_counts(model) if key in settings}}


def _loose_value_problems(raw: Any, model: type[BaseModel]) -> list[str]:
    """A switch or a number given as what only lax parsing reads as one (``"false"``, ``"0"`` or ``1`` for
    ``enabled``; ``"5"`` or ``true`` for ``top_k``), refused naming the key, as ``model_params`` refuses a text or
    a bool for ``max_tokens``: stored as given, the editor and a reader of the JSON took ``"false"`` for on while
    runs took it for off. A whole number written ``5.0`` is a number (runs read 5)."""
    if not isinstance(raw, dict):
        return []

    def loose(key: str, value: Any) -> bool:
        if model.model_fields[key].annotation is bool:
            return not isinstance(value, bool)
        return isinstance(value, bool | str)

    keys = _switches_and_counts(model)
    given = {key: value for key, value in raw.items() if key in keys and loose(key, value)}
    if not given:
        return []
    try:
        model.model_validate(given, strict=True)
    except PydanticValidationError as exc:
        return spec_problems(exc, model)
    return []


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
        current = {**SELECTION_DEFAULTS, **_as_runs_read(context["widget"]["settings"], ToolSelectionSettings)}
        pinned = [str(p) for p in current.get("pinned") or []]
        servers = [str(s) for s in current.get("servers") or []]
        forced = str(current.get("force_first_tool") or "")
        # Tags are a list; anything else (a text typed in the JSON view) is shown as it is, not split into letters.
        tags = current.get("tags")
        tags_text = ", ".join(map(str, tags)) if isinstance(tags, list) else "" if tags is None else str(tags)
        context["widget"].update(
            {
                "current": current,
                "rankers": RANKER_CHOICES,
                "tools": [(t, t in pinned) for t in dict.fromkeys([*self.tool_names, *pinned])],
                "servers": [(s, s in servers) for s in dict.fromkeys([*self.server_ids, *servers])],
                "tags_text": tags_text,
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
        put("pinned", _in_stored_order([p for p in data.getlist(f"{name}__pinned") if p], self.stored.get("pinned")))
        put("servers", _in_stored_order([s for s in data.getlist(f"{name}__servers") if s], self.stored.get("servers")))
        put("tags", _words(field("tags")))  # composed in ``value_from_editor``
        put("force_first_tool", field("force_first_tool"))
        return settings

    def value_from_editor(self, data: MultiValueDict[str, Any], name: str) -> Any:
        """The settings, their tags composed (NFC) however they came (the inputs, the JSON view): a tag typed
        decomposed on macOS is the tag its tools carry."""
        value = super().value_from_editor(data, name)
        settings = _loads(value)
        tags = settings.get("tags") if isinstance(settings, dict) else None
        if isinstance(tags, list) and any(isinstance(t, str) and nfc(t) != t for t in tags):
            settings["tags"] = [nfc(t) if isinstance(t, str) else t for t in tags]
            return json.dumps(settings, ensure_ascii=False)
        return value


class McpContextWidget(_SettingsWidget):
    """``mcp_context``: the bound servers' resources to attach (checkboxes), the ``read_resource`` tool, and a
    prompt as the system prompt with its arguments (one ``NAME=template`` per line)."""

    template_name = "admin/agents/widgets/mcp_context.html"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.servers: list[McpServer] = []

    def get_context(self, name: str, value: Any, attrs: dict[str, Any] | None) -> dict[str, Any]:
        context = super().get_context(name, value, attrs)
        current = _as_runs_read(context["widget"]["settings"], McpContextSettings)
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
        given_prompt = current.get("prompt")
        prompt: dict[str, Any] = given_prompt if isinstance(given_prompt, dict) else {}
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
            owner = prompt.get("mcp_id") or _("(no server)")
            prompts.append((prompt_value, f"{owner}: {prompt.get('name')}", ""))
        stored_arguments = prompt.get("arguments")
        arguments: dict[str, Any] = stored_arguments if isinstance(stored_arguments, dict) else {}
        context["widget"].update(
            {
                "resources": resources,
                "read_resource_tool": bool(current.get("read_resource_tool")),
                "prompts": prompts,
                "prompt_value": prompt_value,
                "arguments_text": prompt_arguments_text(arguments),
            }
        )
        return context

    def value_from_inputs(self, data: MultiValueDict[str, Any], name: str) -> dict[str, Any]:
        settings = dict(self.stored)
        resources = [r for r in (_loads(v) for v in data.getlist(f"{name}__resources")) if isinstance(r, dict)]
        resources = _in_stored_order(resources, settings.get("resources"), key=_resource_key)
        _merge(settings, "resources", resources or None, default=[])
        _merge(settings, "read_resource_tool", (f"{name}__read_resource_tool" in data) or None, default=False)
        chosen = _loads(str(data.get(f"{name}__prompt", "") or ""))
        if isinstance(chosen, dict) and chosen.get("name"):
            arguments = prompt_arguments(str(data.get(f"{name}__prompt_arguments", "")))
            prompt = {"mcp_id": chosen.get("mcp_id"), "name": chosen["name"]}
            if arguments:
                prompt["arguments"] = arguments
            _merge(settings, "prompt", prompt)
        else:
            settings.pop("prompt", None)
        return settings


def prompt_arguments_text(arguments: dict[str, Any]) -> str:
    """A prompt's arguments as their text area shows them: ``NAME=template`` lines where each line reads back as
    its name and template, else the object as JSON (a template with a line break or spaces around it, a name
    with ``=``: set through JSON, an import or the API). As lines, the second line of a template written on two
    lines came back as an argument of its own, without a template, and the page could not be saved unchanged."""
    lines = [
        (key, value)
        for key, value in arguments.items()
        if key_fits(key) and isinstance(value, str) and one_line(value) and value == value.strip()
    ]
    if len(lines) == len(arguments) and not (lines and lines[0][0].startswith("{")):
        return "\n".join(f"{key}={value}" for key, value in lines)
    return json.dumps(arguments, ensure_ascii=False)


def prompt_arguments(text: str) -> Any:
    """The inverse of :func:`prompt_arguments_text`: a JSON object (a text starting with ``{``; one that is no
    object is kept as the text, refused by the settings' validation), or ``NAME=template`` lines; a line
    without ``=`` is kept as the name without a template, so the settings' validation names it."""
    if text.strip().startswith("{"):
        parsed = _loads(text)
        return parsed if isinstance(parsed, dict) else text
    arguments: dict[str, Any] = {}
    for line in text.splitlines():
        key, sep, template = line.partition("=")
        if key.strip():
            arguments[key.strip()] = template.strip() if sep else None
    return arguments


def _resource_key(resource: dict[str, Any]) -> tuple[str, str]:
    return str(resource.get("mcp_id")), str(resource.get("uri"))


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
    return sorted(_agent_tools(servers))


def agent_tool_tags(servers: Iterable[McpServer]) -> list[str]:
    """The tags of the servers' enabled tools, composed (NFC) as the tag filter compares them."""
    tags = McpTool.objects.filter(server__in=list(servers), enabled=True).values_list("tags", flat=True)
    return sorted({nfc(str(t)) for tag_list in tags for t in (tag_list or [])})


def _agent_tools(servers: Iterable[McpServer]) -> dict[str, tuple[str, set[str]]]:
    """The servers' tools as a run's index holds them (enabled, available), by the name the model sees: the
    server's id and the tool's tags (composed, NFC, as ``agents.tool_selection.select_tools`` compares them)."""
    tools = McpTool.objects.filter(server__in=list(servers), enabled=True, available=True).select_related("server")
    return {t.exposed_name: (t.server.mcp_id, {nfc(str(tag)) for tag in t.tags or []}) for t in tools}


def _outside_filters(settings: ToolSelectionSettings, tools: dict[str, tuple[str, set[str]]], name: str) -> bool:
    """Whether the tool ``name`` (one of ``tools``, from :func:`_agent_tools`) is outside the settings' hard
    filters (servers, tags): never offered when selection is on."""
    mcp_id, tags = tools[name]
    return bool(
        (settings.servers and mcp_id not in settings.servers)
        or (settings.tags and not tags & {nfc(t) for t in settings.tags})
    )


def tools_outside_filters(tool_selection: Any, servers: Sequence[McpServer]) -> list[str]:
    """The names of the ``servers``' tools that no turn of a run with this ``tool_selection`` offers: those
    outside its servers and tags, where selection is on (its filters are what a run applies then). Empty for
    settings that do not validate (their own check names what is wrong)."""
    try:
        settings = ToolSelectionSettings.model_validate(tool_selection or {})
    except PydanticValidationError:
        return []
    if not settings.enabled or not (settings.servers or settings.tags):
        return []
    tools = _agent_tools(servers)
    return sorted(name for name in tools if _outside_filters(settings, tools, name))


def rule_forcing_problems(forced: str, *, tool_selection: Any, servers: Sequence[McpServer]) -> list[str]:
    """Why a rule of an agent (its ``tool_selection``, its ``servers``) may not force ``forced`` as the model's
    first tool: the tool is outside the servers and tags the agent's tool selection keeps, so no turn would offer
    it and the run would drop the forcing (its trace says so). The check :func:`selection_problems` makes of the
    agent's own forced tool. A name that is no tool of the servers is left to its own check."""
    if forced in ("", "any") or forced not in tools_outside_filters(tool_selection, servers):
        return []
    settings = ToolSelectionSettings.model_validate(tool_selection or {})
    return [
        str(
            _(
                "'%(tool)s' is outside the servers and tags the agent's tool selection chooses (servers: "
                "%(servers)s; tags: %(tags)s), so the model would never be offered it; widen the agent's filters "
                "or choose another tool"
            )
        )
        % {
            "tool": forced,
            "servers": ", ".join(settings.servers) or "—",
            "tags": ", ".join(settings.tags) or "—",
        }
    ]


def selection_problems(
    raw: Any,
    *,
    tool_names: list[str],
    server_ids: list[str],
    servers: Sequence[McpServer] | None = None,
    check_embedding_service: bool = True,
) -> list[str]:
    """What is wrong with a ``tool_selection`` value, each naming the valid keys or values: names that are not
    the agent's (pinned and forced tools, servers, tags: a tag no tool of the agent has would offer nothing),
    pinned or forced tools outside the hard filters (never offered), and the ``embedding`` ranker where no
    embedding service is configured (``check_embedding_service``: a property of this host, not of the value,
    so a service importing configuration may leave it to the run, whose trace then says it ranked lexically).
    ``servers`` are the agent's (looked up by ``server_ids`` when not given)."""
    try:
        # None is no value given (the defaults); any other value that is no object (``[]``, ``0``) is refused as
        # ``5`` is, not read as the defaults and stored as it is.
        settings = ToolSelectionSettings.model_validate({} if raw is None else raw)
    except PydanticValidationError as exc:
        return spec_problems(exc, ToolSelectionSettings)
    problems = _loose_value_problems(raw, ToolSelectionSettings)
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
    if settings.tags or settings.servers or settings.pinned or settings.force_first_tool:
        bound = list(servers) if servers is not None else list(McpServer.objects.filter(mcp_id__in=server_ids))
        tools = _agent_tools(bound)
        known_tags = sorted({tag for _server, tags in tools.values() for tag in tags})
        missing = [t for t in settings.tags if nfc(t) not in known_tags]
        if missing:
            problems.append(
                str(_("tags: %(unknown)s is not a tag of this agent's tools; their tags are: %(tags)s"))
                % {"unknown": ", ".join(missing), "tags": ", ".join(known_tags) or "—"}
            )

        named = [*settings.pinned, *([settings.force_first_tool] if settings.force_first_tool != "any" else [])]
        hidden = [n for n in dict.fromkeys(named) if n in tools and _outside_filters(settings, tools, n)]
        if hidden:
            problems.append(
                str(
                    _(
                        "pinned, force_first_tool: %(tools)s is outside the servers and tags chosen, so it would "
                        "never be offered; widen the filters or choose another tool"
                    )
                )
                % {"tools": ", ".join(hidden)}
            )
    embedding = settings.enabled and settings.ranker == "embedding"
    if check_embedding_service and embedding and not embedding_service_configured():
        problems.append(
            str(
                _(
                    "ranker: the embedding ranker needs an embedding service (PLATFORM_EMBEDDINGS_URL and "
                    "PLATFORM_EMBEDDINGS_MODEL) and none is configured; choose the lexical ranker"
                )
            )
        )
    return problems


def context_problems(raw: Any, *, servers: Sequence[McpServer]) -> list[str]:
    """What is wrong with an ``mcp_context`` value: its shape; resources or a prompt outside the agent's servers
    (named with the valid ones); prompt arguments the prompt does not declare, required ones missing, and
    placeholders no run can fill; and the ``read_resource`` tool where a bound server has a tool of that name."""
    try:
        settings = McpContextSettings.model_validate({} if raw is None else raw)  # as in selection_problems
    except PydanticValidationError as exc:
        return spec_problems(exc, McpContextSettings)
    by_id = {s.mcp_id: s for s in servers}
    ids = ", ".join(by_id) or "—"
    problems = _loose_value_problems(raw, McpContextSettings)
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
            entries = {str(p.get("name")): p for p in server.prompts or [] if isinstance(p, dict)}
            entry = entries.get(settings.prompt.name)
            if entry is None:
                problems.append(
                    str(_("prompt: %(id)s has no prompt %(name)s; its prompts are: %(names)s"))
                    % {"id": server.mcp_id, "name": settings.prompt.name, "names": ", ".join(entries) or "—"}
                )
            else:
                problems += _prompt_argument_problems(settings.prompt.arguments, entry)
    clash = _agent_tools(servers).get(READ_RESOURCE_TOOL) if settings.read_resource_tool else None
    if clash is not None:
        problems.append(
            str(
                _(
                    "read_resource_tool: the server %(id)s has a tool named read_resource, which the platform's "
                    "tool would clash with; set a tool name prefix on that server or leave this off"
                )
            )
            % {"id": clash[0]}
        )
    return problems


# An opening brace followed by a name: a placeholder, or an attempt at one.
_PLACEHOLDER_ATTEMPT = re.compile(r"\{[A-Za-z_][^{}\s]*\}?")


def _prompt_argument_problems(arguments: dict[str, str], entry: dict[str, Any]) -> list[str]:
    """A prompt's arguments against what discovery listed for it: declared names only, every required one given,
    and placeholders a run can fill (``{query}``, ``{context.KEY}``, ``{data.PATH}``, each written whole)."""
    problems: list[str] = []
    declared = entry.get("arguments")
    if isinstance(declared, list):
        specs = {str(a.get("name")): a for a in declared if isinstance(a, dict) and a.get("name")}
        unknown = [name for name in arguments if name not in specs]
        if unknown:
            problems.append(
                str(_("prompt: %(name)s takes no argument %(unknown)s; its arguments are: %(names)s"))
                % {"name": entry.get("name"), "unknown": ", ".join(unknown), "names": ", ".join(specs) or "—"}
            )
        missing = [name for name, spec in specs.items() if spec.get("required") and name not in arguments]
        if missing:
            problems.append(
                str(_("prompt: %(name)s requires the argument(s) %(missing)s"))
                % {"name": entry.get("name"), "missing": ", ".join(missing)}
            )
    for name, template in arguments.items():
        valid = [m for m in PLACEHOLDER.finditer(template) if not m.group(1).startswith("match.")]
        left = template
        for found in valid:
            left = left.replace(found.group(0), "")
        for attempt in _PLACEHOLDER_ATTEMPT.finditer(left):
            problems.append(
                str(
                    _(
                        "prompt: %(argument)s: %(text)s is no placeholder a run can fill; use {query}, "
                        "{context.KEY} or {data.PATH}, each written whole"
                    )
                )
                % {"argument": name, "text": attempt.group(0)}
            )
    return problems


def agent_settings_problems(
    *, tool_selection: Any, mcp_context: Any, servers: Sequence[McpServer]
) -> dict[str, list[str]]:
    """The checks of the agent form's two settings, for a service (``agent_update``, a configuration import) to
    refuse with ``ValidationError(problems)``: per field, what :func:`selection_problems` and
    :func:`context_problems` find against the agent's ``servers``. The embedding service is not required (a
    host without one runs the agent with the lexical ranker, and its trace says so)."""
    bound = list(servers)
    problems = {
        "tool_selection": selection_problems(
            tool_selection,
            tool_names=agent_tool_names(bound),
            server_ids=[s.mcp_id for s in bound],
            servers=bound,
            check_embedding_service=False,
        ),
        "mcp_context": context_problems(mcp_context, servers=bound),
    }
    return {field: found for field, found in problems.items() if found}
