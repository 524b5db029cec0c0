"""What a run reads of the configuration, cached per process while the configuration's generation holds.

A run needs its agent's servers (with their tools and contracts) and the rules it evaluates: five queries and the
decryption of the servers' secrets, the same for every run until an admin changes something. Every write of a
configuration model replaces the configuration's generation token in its own transaction
(``audit.change_guard.config_generation_bump``), so one primary-key read per run tells whether what this process
holds is still what the database holds: a change made by any process (an admin page, an import, a command on
another machine) is seen by the next run of every worker. A published version's frozen content never changes,
but it names servers by id, which are read as they are now: it is cached the same way.

The run's agent, its published version and its API key are configuration rows too (each an ``AuditedModel``:
writing one moves the generation): :func:`run_parts` gives this process's copies of them with the configuration,
so a run reads its own row and the generation, not its agent's. Only the configuration is cached: a server's
health and circuit breaker are read where they are used, and the run's own row is read per run.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from agents.budgets import budgets_for
from agents.deterministic import RuleSpec
from agents.models import Agent, AgentArm, AgentVersion, ApiKey, Budget, Run
from agents.selectors import deterministic_rule_specs
from agents.versions import version_contracts, version_rules, version_servers
from audit.change_guard import config_generation, rows_read_only
from mcpregistry.crypto import SecretDecryptionError
from mcpregistry.models import McpServer, McpTool, ToolContract
from mcpregistry.services import credential_like, readable_secrets

logger = logging.getLogger(__name__)

# Entries kept per process: one per (agent, version) that ran since the last change.
MAX_ENTRIES = 256


@dataclass(frozen=True)
class RunConfiguration:
    servers: list[McpServer]
    rules: list[RuleSpec]
    contracts: dict[str, ToolContract] | None  # a published version's frozen contracts; None: the live ones
    server_secrets: list[str]  # these servers' and the other bindings' credentials (``_masking_secrets``)


@dataclass(frozen=True)
class RunParts:
    """What a run works with besides its own row: its agent, its published version (None: the agent as stored),
    its API key's prefix (None: a local run) and its configuration. Shared by the runs of this process: read
    only."""

    agent: Agent
    version: AgentVersion | None
    api_key_prefix: str | None
    configuration: RunConfiguration


_lock = threading.Lock()
_entries: dict[Any, tuple[str, Any]] = {}  # (agent, version) -> (generation, RunConfiguration)
_rows: dict[Any, tuple[str, Any]] = {}  # (model, pk) -> (generation, row)


def run_parts(*, run: Run, generation: str | None) -> RunParts:
    """The run's agent, version, API key prefix and configuration, as this process holds them for the
    configuration's ``generation`` as the caller has just read it (``audit.change_guard.config_generation``; a
    run's claim reads it with the run's row); read again after any change."""
    agent = _row(Agent, run.agent_id, generation)
    version = _row(AgentVersion, run.version_id, generation) if run.version_id is not None else None
    api_key = _row(ApiKey, run.api_key_id, generation) if run.api_key_id is not None else None
    frozen = version is not None and bool(version.content)
    configuration = run_configuration(agent=agent, version=version if frozen else None, generation=generation)
    return RunParts(
        agent=agent,
        version=version,
        api_key_prefix=api_key.prefix if api_key is not None else None,
        configuration=configuration,
    )


def _row(model: type[Agent] | type[AgentVersion] | type[ApiKey], pk: Any, generation: str | None) -> Any:
    return _held(_rows, (model._meta.label, pk), generation, lambda: model.objects.get(pk=pk))


def run_configuration(*, agent: Agent, version: AgentVersion | None, generation: str | None) -> RunConfiguration:
    """The servers, rules and contracts a run of ``agent`` (of its published ``version``, if any) works with, for
    the configuration's ``generation`` as the caller has just read it."""
    key = (agent.pk, version.pk if version is not None else None)
    loaded: RunConfiguration = _held(
        _entries, key, generation, lambda: _load(agent=agent, version=version, generation=generation)
    )
    return loaded


def described_configuration(*, agent: Agent, version: AgentVersion | None, generation: str | None) -> RunConfiguration:
    """``run_configuration``, for what describes the agent (its A2A card, the platform's directory of agents): a
    bound server whose secrets this process cannot decrypt fails the agent's runs (``config:secret_unreadable``),
    not its card, nor every other agent's place in the directory. Such a configuration is masked with the secrets
    that can be read (the tools' texts were masked when they were discovered) and is not kept."""
    try:
        return run_configuration(agent=agent, version=version, generation=generation)
    except SecretDecryptionError:
        with rows_read_only():
            return _load(agent=agent, version=version, generation=generation, readable_only=True)


def _held(store: dict[Any, tuple[str, Any]], key: Any, generation: str | None, load: Callable[[], Any]) -> Any:
    """What ``store`` holds under ``key`` for this ``generation``, else ``load()``, kept for it (nothing is kept
    where there is no generation)."""
    if generation is not None:
        with _lock:
            held = store.get(key)
        if held is not None and held[0] == generation:
            return held[1]
    with rows_read_only():  # what is held here is read, never saved: its rows need not remember what they read
        loaded = load()
    if generation is not None:
        with _lock:
            if len(store) >= MAX_ENTRIES:
                store.clear()
            store[key] = (generation, loaded)
    return loaded


def run_configuration_forget() -> None:
    """Drop everything this process holds (tests that rebuild the database under a process)."""
    with _lock:
        _entries.clear()
        _rows.clear()
        _submissions.clear()


# --- what a submission reads (the web side) ---------------------------------------------------------------


@dataclass(frozen=True)
class SubmissionParts:
    """What admitting a new run of an agent reads of the configuration, for one caller: the agent (None: no agent
    has this slug), whether the caller's API key may use it, its A/B arms of positive weight (their versions
    loaded) and live version, its servers' secrets (the input guardrail masks them) and the budgets of the key
    and the agent. Shared by the requests of this process: read only."""

    agent: Agent | None
    key_may_use: bool
    arms: dict[str, AgentArm]
    live_version: AgentVersion | None
    server_secrets: list[str]
    budgets: list[Budget]


_submissions: dict[Any, tuple[str, Any]] = {}  # (agent slug, API key) -> (generation, SubmissionParts)


def submission_parts(*, agent_slug: str, api_key: ApiKey | None) -> SubmissionParts:
    """:class:`SubmissionParts` as this process holds them while the configuration's generation holds (one
    primary-key read), read again after any change: the agent, its arms, versions, servers and budgets, the key's
    agents (a many-to-many change moves the generation too) are all configuration rows."""
    key = (agent_slug, api_key.pk if api_key is not None else None)
    generation = config_generation()
    loaded: SubmissionParts = _held(
        _submissions,
        key,
        generation,
        lambda: _submission_load(agent_slug=agent_slug, api_key=api_key, generation=generation),
    )
    return loaded


def _submission_load(*, agent_slug: str, api_key: ApiKey | None, generation: str | None) -> SubmissionParts:
    agent = Agent.objects.select_related("live_version").filter(slug=agent_slug).first()
    if agent is None:
        return SubmissionParts(None, False, {}, None, [], [])
    # Its model key, read by the worker that runs it: one this process cannot decrypt is refused now (a 503
    # config:secret_unreadable), not accepted for a run that would fail (its servers' secrets are read below).
    agent.secret_values()
    may_use = api_key is None or not api_key.agents.exists() or api_key.agents.filter(pk=agent.pk).exists()
    arms = {arm.name: arm for arm in agent.arms.filter(weight__gt=0).select_related("version")}
    return SubmissionParts(
        agent=agent,
        key_may_use=may_use,
        arms=arms,
        live_version=agent.live_version,
        server_secrets=_masking_secrets(list(agent.servers.all()), generation),
        budgets=budgets_for(agent=agent, api_key=api_key),
    )


def _load(
    *, agent: Agent, version: AgentVersion | None, generation: str | None, readable_only: bool = False
) -> RunConfiguration:
    frozen: dict[str, Any] | None = version.content if version is not None else None
    if frozen:
        servers = version_servers(frozen)
        rules = version_rules(frozen)
        contracts: dict[str, ToolContract] | None = version_contracts(frozen)
    else:
        servers = list(agent.servers.prefetch_related("tools__contract"))
        rules = deterministic_rule_specs(agent=agent, server_ids=[server.pk for server in servers])
        contracts = None
    masked_by = [server for server in servers if server.secrets_readable()] if readable_only else servers
    return RunConfiguration(
        servers=servers, rules=rules, contracts=contracts, server_secrets=_masking_secrets(masked_by, generation)
    )


def _masking_secrets(servers: list[McpServer], generation: str | None) -> list[str]:
    """What masks a run: its own servers' secrets, every one (``McpServer.secret_values``), and the other bindings'
    that look like credentials (``credential_like``): a tool may answer with another server's token. A short or
    numeric secret of another server (``none``, ``3600``: a setting an admin kept secret) would hide words and
    numbers in the answers of every agent."""
    own = [value for server in servers for value in server.secret_values()]
    others = _held(_rows, ("every_binding_secret",), generation, every_binding_secret)
    return list(dict.fromkeys([*own, *(value for value in others if credential_like(value))]))


def shown_secrets() -> list[str]:
    """The credentials the configuration binds now (every binding's and every agent's model key that look like one,
    ``credential_like``), as this process holds them while the configuration's generation holds (one primary-key
    read): what a run's records served to its caller are masked again with. They were masked with the secrets known
    when they were written; a value bound as a secret after (a token a caller typed, then given to a server) was in
    none of them."""
    every = _held(_rows, ("every_binding_secret",), config_generation(), every_binding_secret)
    return [value for value in every if credential_like(value)]


def every_binding_secret() -> list[str]:
    """The secrets of every MCP binding and every agent's model key, not only those of the run's agent: a tool of
    one server may answer with another's token (a shared configuration file, a log line it read), which was masked
    only in a process that had happened to use that other binding before. Read with the configuration, so once
    per change."""
    found = [*readable_secrets(McpServer.objects.all()), *readable_secrets(Agent.objects.all())]
    return list(dict.fromkeys(found))


def agents_model_secrets(**_signal: Any) -> list[str]:
    """The receiver of ``mcpregistry.signals.secrets_elsewhere`` (connected in ``AgentsConfig.ready``): every
    agent's model secrets this process can read, for discovery to mask as runs do (``every_binding_secret``)."""
    return readable_secrets(Agent.objects.all())


def tools_served(servers: Iterable[McpServer], frozen: Mapping[str, Any] | None) -> Iterator[tuple[McpServer, McpTool]]:
    """Every callable tool of the enabled ``servers``; for a published version (``frozen``: its contracts), only
    those it froze (a tool approved after the publish waits for the next one). What a run may call, and what an
    agent's A2A card lists."""
    for server in servers:
        if server.enabled:
            for mcp_tool in server.tools.all():
                if mcp_tool.callable and (frozen is None or f"{server.mcp_id}/{mcp_tool.name}" in frozen):
                    yield server, mcp_tool
