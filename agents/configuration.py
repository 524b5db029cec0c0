"""Configuration as code: servers, contracts, agents and rules as one reviewable JSON (or YAML) document.

``config_import`` is idempotent (natural keys: a server's ``mcp_id``, a contract's ``mcp_id`` + ``tool``, an
agent's ``slug``, a rule's agent + ``name``) and all-or-nothing (one transaction; every error names its entry).
Secret values are given inline (``{"value": "..."}``, encrypted on import) or by reference
(``{"from_env": "NAME"}``, read on the worker); ``{"set": true}`` keeps the value already stored.
``config_export`` never writes a secret value: a stored value is exported as ``{"set": true}``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from django.core.exceptions import ValidationError
from django.db import transaction
from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic import ValidationError as PydanticValidationError

from agent_platform.errors import ApplicationError
from agents.models import Agent, DeterministicRule
from agents.services import agent_update, deterministic_rule_update
from mcpregistry.contract_document import ContractSpec, contract_entry, contract_fields
from mcpregistry.models import McpServer, McpTool, ToolContract
from mcpregistry.services import mcp_server_update, mcp_tool_create, tool_contract_update


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SecretSpec(_Strict):
    value: str | None = None
    from_env: str | None = None
    set: bool | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> SecretSpec:
        given = [k for k in ("value", "from_env", "set") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError('give exactly one of {"value": ...}, {"from_env": ...} or {"set": true}')
        return self


class ServerSpec(_Strict):
    mcp_id: str
    name: str | None = None
    transport: Literal["stdio", "streamable_http", "sse", "local"] = "stdio"
    command: str = ""
    args: list[str] = Field(default_factory=list)
    cwd: str = ""
    env: dict[str, SecretSpec] = Field(default_factory=dict)
    public_env: list[str] = Field(default_factory=list)
    url: str = ""
    headers: dict[str, SecretSpec] = Field(default_factory=dict)
    timeout_s: float = Field(default=30.0, gt=0, le=3600)
    session_scope: Literal["per_run", "shared"] = "per_run"
    enabled: bool = True
    tool_prefix: str = ""


class ModelSpec(_Strict):
    provider: Literal["offline", "bedrock", "scripted"] = "offline"
    model_id: str = ""
    params: dict[str, Any] = Field(default_factory=dict)


class AgentSpec(_Strict):
    slug: str
    name: str | None = None
    enabled: bool = True
    system_prompt: str = ""
    deterministic_instruction: str | None = None
    answer_template: str = ""
    model: ModelSpec = Field(default_factory=ModelSpec)
    servers: list[str] = Field(default_factory=list)
    max_iterations: int = Field(default=6, ge=1, le=100)
    mode: Literal["react", "flow"] = "react"
    flow_graph: str = ""
    answer_from_deterministic: bool = False
    caller_approves_model_writes: bool = False
    language: str = "ko"
    no_match_answer: str = ""
    time_limit_s: int = Field(default=300, ge=1, le=86400)


class RuleSpec(_Strict):
    agent: str | None = None
    name: str
    order: int = 100
    enabled: bool = True
    mcp_id: str | None = None
    tool: str = ""
    code: str = ""
    when: dict[str, Any] = Field(default_factory=dict)
    params: dict[str, Any] = Field(default_factory=dict)
    answer_template: str = ""


class ConfigDocument(_Strict):
    servers: list[ServerSpec] = Field(default_factory=list)
    contracts: list[ContractSpec] = Field(default_factory=list)
    agents: list[AgentSpec] = Field(default_factory=list)
    rules: list[RuleSpec] = Field(default_factory=list)


@dataclass
class ImportReport:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)


class _Problems:
    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, where: str, message: str) -> None:
        self.items.append(f"{where}: {message}")


def load_document(path: str | Path) -> dict[str, Any]:
    """Read a JSON or YAML configuration file."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        data = yaml.safe_load(text) if str(path).endswith((".yaml", ".yml")) else json.loads(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise ApplicationError(
            f"{path}: not valid {'YAML' if str(path).endswith(('.yaml', '.yml')) else 'JSON'}: {exc}",
            code="invalid_config",
        ) from exc
    if not isinstance(data, dict):
        raise ApplicationError(
            f"{path}: the document must be an object with servers, contracts, agents, rules", code="invalid_config"
        )
    return data


def _parse(document: dict[str, Any]) -> ConfigDocument:
    try:
        return ConfigDocument.model_validate(document)
    except PydanticValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = list(err["loc"])
            where = ".".join(str(p) for p in loc)
            # Name the entry: servers[1] (docs)
            if len(loc) >= 2 and isinstance(loc[1], int):
                section, index = str(loc[0]), loc[1]
                entry = (document.get(section) or [None] * (index + 1))[index]
                label = _label(section, entry)
                where = f"{section}[{index}]{f' ({label})' if label else ''}" + (
                    "." + ".".join(str(p) for p in loc[2:]) if len(loc) > 2 else ""
                )
            lines.append(f"{where}: {err['msg']}")
        raise ApplicationError("configuration is not valid:\n" + "\n".join(lines), code="invalid_config") from None


def _label(section: str, entry: Any) -> str:
    if not isinstance(entry, dict):
        return ""
    keys = {"servers": ("mcp_id",), "contracts": ("mcp_id", "tool"), "agents": ("slug",), "rules": ("agent", "name")}
    return ".".join(str(entry.get(k)) for k in keys.get(section, ()) if entry.get(k) is not None)


def _secret_map(
    specs: dict[str, SecretSpec], stored: dict[str, Any], where: str, problems: _Problems
) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for name, spec in specs.items():
        if spec.value is not None:
            result[name] = spec.value
        elif spec.from_env is not None:
            result[name] = {"from_env": spec.from_env}
        elif name in stored:
            result[name] = stored[name]
        else:
            problems.add(where, f"'{name}' is {{\"set\": true}} but no value is stored to keep")
    return result


def _save(
    save: Callable[[], Any],
    obj: Any,
    key: str,
    report: ImportReport,
    created: bool,
    before: dict[str, Any] | None,
    where: str,
    problems: _Problems,
) -> None:
    """Save through ``save`` (a service, which validates and records the change); a validation error becomes a
    problem of the entry."""
    try:
        save()
    except ValidationError as exc:
        for name, messages in exc.message_dict.items():
            for message in messages:
                problems.add(where, f"{name}: {message}" if name != "__all__" else message)
        return
    after = _fields(obj)
    if created:
        report.created.append(key)
    elif before != after:
        report.updated.append(key)
    else:
        report.unchanged.append(key)


def _fields(obj: Any) -> dict[str, Any]:
    return {
        f.attname: getattr(obj, f.attname)
        for f in obj._meta.concrete_fields
        if f.attname not in {"created_at", "updated_at"}
    }


@transaction.atomic
def config_import(
    *, document: dict[str, Any], actor: Any, via: str = "import_config", dry_run: bool = False
) -> ImportReport:
    """Apply a configuration document. Raises ApplicationError naming every offending entry; then nothing
    was changed. With ``dry_run`` the changes are computed and rolled back, their audit events with them.

    Every entry is written by its service (``mcp_server_*``, ``tool_contract_*``, ``agent_*``,
    ``deterministic_rule_*``), so each change is one audit event naming ``actor`` and the path ``via``."""
    config = _parse(document)
    problems = _Problems()
    report = ImportReport()
    servers: dict[str, McpServer] = {s.mcp_id: s for s in McpServer.objects.all()}

    for i, spec in enumerate(config.servers):
        where = f"servers[{i}] ({spec.mcp_id})"
        server = servers.get(spec.mcp_id)
        created = server is None
        server = server or McpServer(mcp_id=spec.mcp_id)
        before = None if created else _fields(server)
        server.name = spec.name or server.name or spec.mcp_id
        server.transport = spec.transport
        server.command, server.args, server.cwd = spec.command, spec.args, spec.cwd
        server.url, server.timeout_s, server.enabled = spec.url, spec.timeout_s, spec.enabled
        server.session_scope, server.tool_prefix = spec.session_scope, spec.tool_prefix
        server.public_env = spec.public_env
        server.env = _secret_map(spec.env, server.env or {}, where, problems)
        server.headers = _secret_map(spec.headers, server.headers or {}, where, problems)
        _save(
            functools.partial(mcp_server_update, server=server, actor=actor, via=via),
            server,
            f"server {spec.mcp_id}",
            report,
            created,
            before,
            where,
            problems,
        )
        servers[spec.mcp_id] = server

    for i, cspec in enumerate(config.contracts):
        where = f"contracts[{i}] ({cspec.mcp_id}.{cspec.tool})"
        server = servers.get(cspec.mcp_id)
        if server is None or server.pk is None:
            problems.add(where, f"unknown server '{cspec.mcp_id}'")
            continue
        # A contract may come before discovery: the tool row is created now and filled in by discovery.
        tool = McpTool.objects.filter(server=server, name=cspec.tool).first() or mcp_tool_create(
            server=server, name=cspec.tool, actor=actor, via=via
        )
        contract = ToolContract.objects.filter(tool=tool).first()
        created = contract is None
        contract = contract or ToolContract(tool=tool)
        before = None if created else _fields(contract)
        for name, value in contract_fields(cspec).items():
            setattr(contract, name, value)
        _save(
            functools.partial(tool_contract_update, contract=contract, actor=actor, via=via),
            contract,
            f"contract {cspec.mcp_id}.{cspec.tool}",
            report,
            created,
            before,
            where,
            problems,
        )

    agents: dict[str, Agent] = {a.slug: a for a in Agent.objects.all()}
    for i, aspec in enumerate(config.agents):
        where = f"agents[{i}] ({aspec.slug})"
        agent = agents.get(aspec.slug)
        created = agent is None
        agent = agent or Agent(slug=aspec.slug)
        before = (
            None if created else {**_fields(agent), "servers": sorted(agent.servers.values_list("mcp_id", flat=True))}
        )
        agent.name = aspec.name or agent.name or aspec.slug
        agent.enabled, agent.system_prompt, agent.answer_template = (
            aspec.enabled,
            aspec.system_prompt,
            aspec.answer_template,
        )
        if aspec.deterministic_instruction is not None:
            agent.deterministic_instruction = aspec.deterministic_instruction
        agent.model_provider, agent.model_id, agent.model_params = (
            aspec.model.provider,
            aspec.model.model_id,
            aspec.model.params,
        )
        agent.max_iterations, agent.mode = aspec.max_iterations, aspec.mode
        agent.flow_graph, agent.answer_from_deterministic = aspec.flow_graph, aspec.answer_from_deterministic
        agent.caller_approves_model_writes = aspec.caller_approves_model_writes
        agent.language, agent.no_match_answer = aspec.language, aspec.no_match_answer
        agent.time_limit_s = aspec.time_limit_s
        missing = [m for m in aspec.servers if m not in servers or servers[m].pk is None]
        if missing:
            problems.add(where, f"unknown server(s): {', '.join(missing)}")
            continue
        try:
            agent_update(agent=agent, actor=actor, via=via, servers=[servers[m] for m in aspec.servers])
        except ValidationError as exc:
            for name, messages in exc.message_dict.items():
                problems.add(where, f"{name}: {'; '.join(messages)}")
            continue
        after = {**_fields(agent), "servers": sorted(aspec.servers)}
        (report.created if created else report.updated if before != after else report.unchanged).append(
            f"agent {aspec.slug}"
        )
        agents[aspec.slug] = agent

    for i, rspec in enumerate(config.rules):
        where = f"rules[{i}] ({rspec.agent or '*'}.{rspec.name})"
        agent = agents.get(rspec.agent) if rspec.agent else None
        if rspec.agent and agent is None:
            problems.add(where, f"unknown agent '{rspec.agent}'")
            continue
        server = servers.get(rspec.mcp_id) if rspec.mcp_id else None
        if rspec.mcp_id and (server is None or server.pk is None):
            problems.add(where, f"unknown server '{rspec.mcp_id}'")
            continue
        rule = DeterministicRule.objects.filter(agent=agent, name=rspec.name).first()
        created = rule is None
        rule = rule or DeterministicRule(agent=agent, name=rspec.name)
        before = None if created else _fields(rule)
        rule.order, rule.enabled, rule.server, rule.tool_name = rspec.order, rspec.enabled, server, rspec.tool
        rule.code = rspec.code
        rule.when, rule.params, rule.answer_template = rspec.when, rspec.params, rspec.answer_template
        _save(
            functools.partial(deterministic_rule_update, rule=rule, actor=actor, via=via),
            rule,
            f"rule {rspec.agent or '*'}.{rspec.name}",
            report,
            created,
            before,
            where,
            problems,
        )

    if problems.items:
        transaction.set_rollback(True)
        raise ApplicationError("configuration was not imported:\n" + "\n".join(problems.items), code="invalid_config")
    if dry_run:
        transaction.set_rollback(True)
    return report


def _exported_secrets(stored: dict[str, Any], *, public: list[str] | None = None) -> dict[str, Any]:
    """Secret values as ``{"set": true}`` (or their ``from_env`` reference); a non-secret env value (named in
    ``public``) as itself."""
    shown = set(public or [])
    return {
        k: (
            {"from_env": v["from_env"]}
            if isinstance(v, dict) and "from_env" in v
            else {"value": v}
            if k in shown and isinstance(v, str)
            else {"set": True}
        )
        for k, v in stored.items()
    }


def config_export() -> dict[str, Any]:
    """The whole configuration as a document ``config_import`` accepts. No secret value is written."""
    servers = [
        {
            "mcp_id": s.mcp_id,
            "name": s.name,
            "transport": s.transport,
            "command": s.command,
            "args": s.args,
            "cwd": s.cwd,
            "env": _exported_secrets(s.env or {}, public=s.public_env or []),
            "public_env": s.public_env or [],
            "url": s.url,
            "headers": _exported_secrets(s.headers or {}),
            "timeout_s": s.timeout_s,
            "session_scope": s.session_scope,
            "enabled": s.enabled,
            "tool_prefix": s.tool_prefix,
        }
        for s in McpServer.objects.order_by("mcp_id")
    ]
    contracts = [
        contract_entry(c)
        for c in ToolContract.objects.select_related("tool__server").order_by("tool__server__mcp_id", "tool__name")
    ]
    agents = [
        {
            "slug": a.slug,
            "name": a.name,
            "enabled": a.enabled,
            "system_prompt": a.system_prompt,
            "deterministic_instruction": a.deterministic_instruction,
            "answer_template": a.answer_template,
            "model": {"provider": a.model_provider, "model_id": a.model_id, "params": a.model_params},
            "servers": sorted(a.servers.values_list("mcp_id", flat=True)),
            "max_iterations": a.max_iterations,
            "mode": a.mode,
            "flow_graph": a.flow_graph,
            "answer_from_deterministic": a.answer_from_deterministic,
            "caller_approves_model_writes": a.caller_approves_model_writes,
            "language": a.language,
            "no_match_answer": a.no_match_answer,
            "time_limit_s": a.time_limit_s,
        }
        for a in Agent.objects.order_by("slug")
    ]
    rules = [rule_entry(r) for r in DeterministicRule.objects.select_related("agent", "server").order_by("order", "id")]
    return {"servers": servers, "contracts": contracts, "agents": agents, "rules": rules}


def rule_entry(rule: DeterministicRule) -> dict[str, Any]:
    """A rule as a document entry (``export_config``'s ``rules[]``; the rule editor's JSON view)."""
    return {
        "agent": rule.agent.slug if rule.agent else None,
        "name": rule.name,
        "order": rule.order,
        "enabled": rule.enabled,
        "mcp_id": rule.server.mcp_id if rule.server else None,
        "tool": rule.tool_name,
        "code": rule.code,
        "when": rule.when,
        "params": rule.params,
        "answer_template": rule.answer_template,
    }
