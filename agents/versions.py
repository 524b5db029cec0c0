"""Agent versions: what publishing freezes, how a run is planned from a frozen version, how two versions differ,
and how live traffic is split between A/B arms.

A version's ``content`` (``VersionContent``) holds everything that decides what a run does and that an admin
edits: the agent's prompt, model, parameters and mode (``AGENT_FIELDS``), the MCP servers it binds (by id), its
enabled rules in order (as the engine sees them, ``RuleSpec``) and the contracts of the bound servers' tools
(``mcpregistry.gate_records.contract_snapshot``). A run of a version reads all of these from the version; the
servers' connections (command, URL, secrets) and the tools' discovered schemas stay the registry's, since they
describe the outside world, not the agent.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from typing import Any, TypedDict

from agent_platform.text import nfc
from agents.deterministic import RuleSpec, same_value
from agents.models import Agent, AgentVersion
from agents.selectors import deterministic_rule_specs
from mcpregistry.gate_records import contract_from_snapshot, contract_snapshot
from mcpregistry.models import McpServer, ToolContract

AGENT_FIELDS = (
    "system_prompt",
    "deterministic_instruction",
    "answer_template",
    "model_provider",
    "model_id",
    "model_params",
    "max_iterations",
    "answer_from_deterministic",
    "language",
    "no_match_answer",
    "mode",
    "tool_selection",
    "mcp_context",
    "flow_graph",
)


class VersionContent(TypedDict):
    agent: dict[str, Any]
    servers: list[str]
    rules: list[dict[str, Any]]
    contracts: dict[str, dict[str, Any]]


def version_content(agent: Agent) -> VersionContent:
    """What publishing ``agent`` now would freeze (read from the stored rows, not from unsaved changes).

    Its reads are separate statements (the agent, its servers, tools and contracts, its rules): a caller that
    freezes the result holds the configuration's lock first (``agent_version_publish`` does:
    ``audit.change_guard.config_write_lock``), so that no change commits between them and the version is one
    configuration, never half of an import that changed a contract and a rule together."""
    fresh = Agent.objects.get(pk=agent.pk)
    servers = list(fresh.servers.order_by("mcp_id").prefetch_related("tools__contract"))
    return {
        "agent": {name: getattr(fresh, name) for name in AGENT_FIELDS},
        "servers": [s.mcp_id for s in servers],
        "rules": [asdict(rule) for rule in deterministic_rule_specs(agent=fresh)],
        "contracts": {
            f"{server.mcp_id}/{tool.name}": contract_snapshot(tool)
            for server in servers
            for tool in server.tools.all()
            if tool.callable
        },
    }


def content_digest(content: VersionContent | dict[str, Any]) -> str:
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def version_content_portable(content: VersionContent | dict[str, Any]) -> dict[str, Any]:
    """``content`` as another installation can take it (``export_config``): the rules without their ``rule_id``,
    which is this installation's row id (``agents.services.agent_version_import`` resolves it by name and
    occurrence: ``version_rule_ids``)."""
    return {
        **content,
        "rules": [{k: v for k, v in rule.items() if k != "rule_id"} for rule in content.get("rules", [])],
    }


def version_rule_ids(agent: Agent, content: VersionContent | dict[str, Any]) -> list[int | None]:
    """This installation's row id for each of ``content``'s rules (a version published elsewhere), in their
    order: each frozen rule takes the first rule of its name, not taken yet, that publishing ``agent`` with the
    content's servers would freeze here (enabled, its own and the global ones, by ``order`` then id:
    ``deterministic_rule_specs``) and that calls what it calls (server, tool, code), so rules of one name keep
    their occurrence as ``import_config`` matches them; None where there is none (``version_rules`` then numbers
    the rule by its place).

    Two frozen rules never get one id: a run keys each rule's calls (``rule:<id>``) and its result on resume
    on it. Matched by name alone, the second of two rules of one name was given the first one's id: an
    approved write there was answered with the first rule's read result and never sent."""
    server_ids = list(McpServer.objects.filter(mcp_id__in=content.get("servers") or []).values_list("pk", flat=True))
    local: dict[str, list[RuleSpec]] = {}
    for spec in deterministic_rule_specs(agent=agent, server_ids=server_ids):
        local.setdefault(nfc(spec.name), []).append(spec)
    ids: list[int | None] = []
    for rule in content.get("rules") or []:
        # The first rule of its name not yet taken that calls what it calls: in order, so two that call the same
        # keep their occurrence, and one disabled or renamed here shifts no other onto a rule calling another tool.
        unused = local.get(nfc(str(rule.get("name") or "")), [])
        match = next((spec for spec in unused if _calls_the_same(spec, rule)), None)
        if match is not None:
            unused.remove(match)
        ids.append(match.rule_id if match is not None else None)
    return ids


def _calls_the_same(local: RuleSpec, frozen: dict[str, Any]) -> bool:
    """Whether a local rule matched by name and occurrence calls what the frozen rule calls (its server, tool and
    code): one disabled or reordered here shifts the occurrence, and a frozen rule must never carry the id of a
    rule that calls something else (its audit events and the run page would name the wrong rule)."""
    return (local.mcp_id, local.tool_name, local.code) == (
        str(frozen.get("mcp_id") or ""),
        str(frozen.get("tool_name") or ""),
        str(frozen.get("code") or ""),
    )


def version_rules(content: VersionContent | dict[str, Any]) -> list[RuleSpec]:
    """The version's rules. A rule imported from another installation with no rule of its name and occurrence here
    has no row id (``version_rule_ids``): it is numbered by its place in the frozen version (-1, -2, …), so that
    its calls (``rule:<id>``, ``rule:<id>:call:<n>``) and its result on resume are its own, never another rule's
    (a row id is positive)."""
    return [
        RuleSpec(**{**rule, "rule_id": rule["rule_id"] if rule.get("rule_id") is not None else -position})
        for position, rule in enumerate(content.get("rules", []), start=1)
    ]


def version_contracts(content: VersionContent | dict[str, Any]) -> dict[str, ToolContract]:
    return {key: contract_from_snapshot(value) for key, value in (content.get("contracts") or {}).items()}


def version_servers(content: VersionContent | dict[str, Any]) -> list[McpServer]:
    """The bound servers the version names that still exist (a deleted binding cannot be called), tools
    prefetched, in the version's order."""
    ids = list(content.get("servers") or [])
    found = {s.mcp_id: s for s in McpServer.objects.filter(mcp_id__in=ids).prefetch_related("tools__contract")}
    return [found[mcp_id] for mcp_id in ids if mcp_id in found]


def path_key(key: Any) -> str:
    """One key of a dotted path: as written, or quoted as JSON where it holds a ``.`` or a ``"`` or is empty, so
    that a key ``"order.kind"`` and the key ``kind`` inside ``order`` get two paths (``"order.kind"`` and
    ``order.kind``), never one (a rule's ``when.data`` matches them differently)."""
    text = str(key)
    return json.dumps(text, ensure_ascii=False) if not text or "." in text or '"' in text else text


def flatten_leaves(value: Any, prefix: str = "") -> dict[str, Any]:
    """A nested object's leaves by their dotted paths (each key by ``path_key``), keys sorted (an empty object is
    a leaf)."""
    if isinstance(value, dict) and value:
        flat: dict[str, Any] = {}
        for key in sorted(value, key=str):
            flat.update(flatten_leaves(value[key], f"{prefix}.{path_key(key)}" if prefix else path_key(key)))
        return flat
    return {prefix: value}


def _rule_identities(rules: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """What tells a version's rules apart, in their order: the rule's row id where the version froze one, else
    (a rule imported from another installation) its name and which of that name it is. Names are not unique."""
    seen: dict[tuple[Any, ...], int] = {}
    identities = []
    for rule in rules:
        base: tuple[Any, ...] = (
            ("id", rule["rule_id"]) if rule.get("rule_id") is not None else ("name", rule.get("name") or "")
        )
        seen[base] = seen.get(base, 0) + 1
        identities.append((*base, seen[base]))
    return identities


def _rule_labels(identities: list[tuple[Any, ...]], names: dict[tuple[Any, ...], str]) -> dict[tuple[Any, ...], str]:
    """A label per rule for the diff's paths, the same on both sides: the rule's name where no other rule has it;
    else the name with ``#<row id>`` (a frozen rule) or ``(<n>)`` (the n-th imported rule of that name); a rule
    without a name is ``#<row id>`` or ``(<n>)``. A label that is some other rule's name is made unique."""
    count: dict[str, int] = {}
    for identity in identities:
        count[names[identity]] = count.get(names[identity], 0) + 1
    labels: dict[tuple[Any, ...], str] = {}
    taken: set[str] = set()
    # The plainly named first, so that a suffixed label never takes a rule's own name from it.
    plain = {i for i in identities if names[i] and count[names[i]] == 1}
    for identity in sorted(identities, key=lambda i: i not in plain):
        name = names[identity]
        if identity in plain:
            label = name
        else:
            kind, key, nth = identity
            suffix = f"#{key}" if kind == "id" else f"({nth})"
            label = f"{name} {suffix}" if name else suffix
        # A rule literally named "x (2)" beside two imported rules named "x" (or one row id frozen twice).
        while label in taken:
            label += "'"
        taken.add(label)
        labels[identity] = label
    return labels


def version_diff(old: dict[str, Any], new: dict[str, Any]) -> list[dict[str, Any]]:
    """What changed from ``old`` to ``new`` (two versions' content), one row per changed leaf: ``{"path", "old",
    "new"}`` with ``None`` where the leaf is absent on one side. A rule is matched by its row id (frozen with it;
    by name where it has none) and shown under its name, or, where names repeat, its name and id
    (``_rule_labels``): a change to one of two rules of one name is a change of that one. A reordered rule shows as
    a change of its ``position``. Leaves are compared as JSON values (``same_value``): ``true`` is not ``1``, which
    Python's ``==`` calls equal, and a rule's condition matches them differently."""
    old_rules, new_rules = list(old.get("rules", [])), list(new.get("rules", []))
    old_ids, new_ids = _rule_identities(old_rules), _rule_identities(new_rules)
    # A renamed rule is labelled by its new name.
    names = {i: str(rule.get("name") or "") for i, rule in zip(old_ids, old_rules, strict=True)}
    names.update({i: str(rule.get("name") or "") for i, rule in zip(new_ids, new_rules, strict=True)})
    labels = _rule_labels([*old_ids, *(i for i in new_ids if i not in old_ids)], names)

    def keyed(content: dict[str, Any], identities: list[tuple[Any, ...]]) -> dict[str, Any]:
        return {
            "agent": content.get("agent", {}),
            "servers": sorted(content.get("servers", [])),
            "rules": {
                labels[identity]: {**{k: v for k, v in rule.items() if k != "rule_id"}, "position": i + 1}
                for i, (identity, rule) in enumerate(zip(identities, content.get("rules", []), strict=True))
            },
            "contracts": content.get("contracts", {}),
        }

    before, after = flatten_leaves(keyed(old, old_ids), ""), flatten_leaves(keyed(new, new_ids), "")
    rows = []
    for path in sorted(set(before) | set(after)):
        if not same_value(before.get(path), after.get(path)):
            rows.append({"path": path, "old": before.get(path), "new": after.get(path)})
    return rows


# --- A/B arms --------------------------------------------------------------------------------------------


def caller_key(*, agent_slug: str, api_key_id: Any, context: dict[str, Any] | None) -> str:
    """Who the caller is, for sticky arms: the API key, and the A2A ``userId`` (else ``sessionId``) when given,
    composed (``nfc``: a Korean id typed on macOS comes decomposed, and the same person would land in either arm by
    the keyboard they typed on; the stored context is composed too)."""
    context = context or {}
    person = context.get("userId") or context.get("sessionId") or ""
    return f"{agent_slug}\n{api_key_id or ''}\n{nfc(str(person))}"


def pick_arm(arms: Sequence[tuple[str, int]], key: str) -> str | None:
    """The arm (by name) for the caller ``key``: the key's hash places it on ``[0, total weight)``, the arms
    share that line by weight in name order. The same key lands in the same arm while the arms and weights stay
    the same; arms with weight 0 get no one. None when no arm has weight."""
    live = sorted((name, weight) for name, weight in arms if weight > 0)
    total = sum(weight for _name, weight in live)
    if not total:
        return None
    point = int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") / 2**64 * total
    for name, weight in live:
        if point < weight:
            return name
        point -= weight
    return live[-1][0]


def versions_of(agent: Agent) -> Iterable[AgentVersion]:
    return AgentVersion.objects.filter(agent=agent).order_by("-number")
