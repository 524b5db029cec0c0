"""Reads that carry rules (who may see which run)."""

from __future__ import annotations

import time
import unicodedata
import uuid
from collections.abc import Collection, Mapping
from datetime import timedelta
from typing import Any, cast

from django.db import connection
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils import timezone
from django.utils.translation import gettext as _

from agent_platform.errors import ApplicationError
from agents.deterministic import RuleSpec
from agents.dispatch import run_time_limits
from agents.models import Agent, AgentVersion, ApiKey, Approval, DeterministicRule, Run, RunEvent
from agents.run_wakeup import RunWatch
from audit.models import AuditEvent
from audit.row_statements import RowRead
from audit.services import audit_chain_catch_up
from mcpregistry.models import McpServer


def run_get(*, run_id: str, api_key: ApiKey) -> Run:
    """The caller's own run of an agent it may use now, with its agent and version (as ``select_related`` would
    give them); any other id (malformed, unknown, someone else's, or of an agent the key may no longer use: taken
    off its agents or disabled, as ``agent_get_for_key`` and A2A see it) is the same 404, so a key narrowed after it
    submitted a run can no longer read, cancel, approve or rate it."""
    try:
        key = uuid.UUID(str(run_id))
    except ValueError:
        key = None
    run = _run_of_key(key, api_key) if key else None
    if run is None:
        raise ApplicationError(_("Run not found."), code="run_not_found", status=404)
    return run


# The run's row as a statement made once (audit/row_statements.py): read here and by a worker's claim.
RUN_READ = RowRead(Run)
_AGENT_READ = RowRead(Agent)
_VERSION_READ = RowRead(AgentVersion)
_RUN_OF_KEY: dict[str, str] = {}


def _run_of_key(run_id: uuid.UUID, api_key: ApiKey) -> Run | None:
    """The run with its agent and version in one statement made once (an API caller reads its run again and
    again; the ORM would compile the join each time), if its agent is enabled and in the key's scope (a key with
    no agents may use every agent): the scope is read in the same statement, as it is now."""
    sql = _RUN_OF_KEY.get(connection.vendor)
    if sql is None:
        quote = connection.ops.quote_name
        table = {model: quote(model._meta.db_table) for model in (Run, Agent, AgentVersion)}
        column = {name: quote(str(Run._meta.get_field(name).column)) for name in ("id", "agent", "version", "api_key")}
        agent_pk, version_pk = (quote(str(model._meta.pk.column)) for model in (Agent, AgentVersion))  # type: ignore[union-attr]
        enabled = quote(str(Agent._meta.get_field("enabled").column))
        scope = ApiKey.agents.field
        scope_table = quote(scope.m2m_db_table())
        scope_key, scope_agent = quote(scope.m2m_column_name()), quote(scope.m2m_reverse_name())
        sql = _RUN_OF_KEY[connection.vendor] = (
            f"SELECT {RUN_READ.columns('r')}, {_AGENT_READ.columns('a')}, {_VERSION_READ.columns('v')} "  # noqa: S608 - the models' names
            f"FROM {table[Run]} r JOIN {table[Agent]} a ON a.{agent_pk} = r.{column['agent']} "
            f"LEFT JOIN {table[AgentVersion]} v ON v.{version_pk} = r.{column['version']} "
            f"WHERE r.{column['id']} = %s AND r.{column['api_key']} = %s AND a.{enabled} = %s "
            f"AND (NOT EXISTS (SELECT 1 FROM {scope_table} s WHERE s.{scope_key} = r.{column['api_key']}) "
            f"OR EXISTS (SELECT 1 FROM {scope_table} s WHERE s.{scope_key} = r.{column['api_key']} "
            f"AND s.{scope_agent} = r.{column['agent']}))"
        )
    id_field = Run._meta.get_field("id")
    with connection.cursor() as cursor:
        cursor.execute(sql, [id_field.get_db_prep_value(run_id, connection), api_key.pk, True])
        row = cursor.fetchone()
    if row is None:
        return None
    run_columns, agent_columns = len(Run._meta.concrete_fields), len(Agent._meta.concrete_fields)
    run = cast(Run, RUN_READ.instance(row))
    Run.agent.field.set_cached_value(run, _AGENT_READ.instance(row[run_columns:]))
    version = None if run.version_id is None else _VERSION_READ.instance(row[run_columns + agent_columns :])
    Run.version.field.set_cached_value(run, version)
    return run


# What ``RunSummarySerializer`` reads of a run, its agent and its version (any other column, read there, would be
# one more query per listed run).
RUN_SUMMARY_COLUMNS = (
    *("id", "status", "query", "answer", "error_code", "error_message", "arm", "created_at", "started_at"),
    *("finished_at", "agent", "agent__slug", "version", "version__number"),
)


def run_list(*, api_key: ApiKey, agent_slug: str | None = None, status: str | None = None) -> QuerySet[Run]:
    """The caller's runs of the agents it may use now (as ``run_get`` sees them), newest first, optionally of one
    agent and/or in one status: the columns a list shows (``RunSummarySerializer``) alone. Read whole, a run's JSON
    columns (its context, data, trace, conversation; its version's content) were decoded for every listed run,
    megabytes of them for a run sent a large ``a2a_data``, and none of them is shown."""
    runs = (
        Run.objects.select_related("agent", "version")
        .only(*RUN_SUMMARY_COLUMNS)
        .filter(api_key=api_key)
        .filter(_in_key_scope(api_key))
    )
    if agent_slug:
        runs = runs.filter(agent__slug=agent_slug)
    if status:
        runs = runs.filter(status=status)
    return runs.order_by("-created_at", "-id")


def _in_key_scope(api_key: ApiKey) -> Q:
    """Runs whose agent ``api_key`` may use now: enabled, and among the key's agents if it has any (one
    statement with the runs: no query of its own)."""
    scope = ApiKey.agents.through.objects.filter(apikey_id=api_key.pk)
    return Q(agent__enabled=True) & (~Exists(scope) | Exists(scope.filter(agent_id=OuterRef("agent_id"))))


# Events the platform writes for its own checks, never sent to a reader: an A2A answer's record
# (``agents.api.a2a_server.ANSWER_EVENT``: the answering key's id and the message's digests), by which a resent
# answer decides nothing.
BOOKKEEPING_EVENT_KINDS = ("approval_answer",)


def run_events_after(*, run_id: Any, after: int, limit: int = 500) -> list[RunEvent]:
    """A run's events numbered after ``after``, in order, at most ``limit`` of them: what every stream of a run
    sends (REST, A2A, MCP, the admin's run page). Bookkeeping events are left out (their numbers are skipped, as a
    reader resuming after any number expects)."""
    return list(
        RunEvent.objects.filter(run_id=run_id, seq__gt=after)
        .exclude(kind__in=BOOKKEEPING_EVENT_KINDS)
        .order_by("seq")[:limit]
    )


def run_status(*, run_id: Any) -> str | None:
    """The run's status now (None if it no longer exists)."""
    return Run.objects.filter(id=run_id).values_list("status", flat=True).first()


def cancellation_recorded(*, run_id: Any) -> bool:
    """Whether a cancelled run's last ``status`` event (``cancelled``) is written."""
    last = RunEvent.objects.filter(run_id=run_id, kind="status").order_by("-seq").values_list("data", flat=True).first()
    return isinstance(last, dict) and last.get("status") == Run.Status.CANCELLED


def run_end_recorded(*, run_id: Any) -> bool:
    """Whether a run's events are complete once it reads finished. They are, but for a run cancelled while it ran:
    it reads ``cancelled`` at once, while its worker finishes the call under way (a write, perhaps), records it,
    and then records the run's end (its last ``status`` event). Until that event, or until the worker's pass is
    past its hard time limit (the worker is gone then), more of its events may come."""
    row = (
        Run.objects.filter(id=run_id).values("status", "pass_started_at", "finished_at", "agent__time_limit_s").first()
    )
    if row is None or row["status"] != Run.Status.CANCELLED:
        return True
    if cancellation_recorded(run_id=run_id):
        return True
    _soft, hard = run_time_limits(row["agent__time_limit_s"])
    since = row["pass_started_at"] or row["finished_at"]
    return since is None or timezone.now() >= since + timedelta(seconds=hard)


def run_seen_finished(run: Run) -> bool:
    """Whether a reader may take ``run`` (as read) as finished, its events complete: a run cancelled while its worker
    held it is not, until its end is recorded (``run_end_recorded``, asked only then: no query for any other run)."""
    return run.is_finished and (run.status != Run.Status.CANCELLED or run_end_recorded(run_id=run.pk))


def api_key_is_live(*, api_key_id: Any) -> bool:
    """Whether the key still exists and is not revoked (an open event stream asks this again and again)."""
    return ApiKey.objects.filter(pk=api_key_id, revoked_at__isnull=True).exists()


_AUDIT_EVENT_READ = RowRead(AuditEvent)
_APPROVAL_READ = RowRead(Approval)


def run_tool_calls(*, run: Run) -> list[dict[str, Any]]:
    """Every tool call of a run, deterministic and the model's, from the audit record (masked); what is not
    chained yet (deferred chaining) is chained first, as ``Run.audit_events`` does."""
    audit_chain_catch_up()
    events = cast(
        list[AuditEvent], _AUDIT_EVENT_READ.all_where({"run_id": run.pk, "action": "tool.call"}, order_by="id")
    )
    return [
        {
            "source": e.source,
            "mcp_id": e.mcp_id,
            "name": e.tool,
            "args": e.args,
            "ok": e.ok,
            "reason": e.reason,
            "attempt": e.attempt,
            "latency_ms": e.latency_ms,
        }
        for e in events
    ]


def run_approvals(*, run: Run) -> list[Approval]:
    """The run's approvals, oldest first."""
    return cast(list[Approval], _APPROVAL_READ.all_where({"run": run.pk}, order_by="created_at"))


def run_wait(*, run: Run, timeout_s: float, interval_s: float = 0.1) -> Run:
    """Wait until the run has finished (or awaits approval) or ``timeout_s`` has passed; returns it fresh.

    Woken by the run's change notification where there is one (``agents.run_wakeup``: Redis, PostgreSQL), and
    reading the run again at least every ``interval_s`` (a short adaptive pause where nothing notifies)."""
    deadline = time.monotonic() + timeout_s
    with RunWatch(run.pk, statuses_only=True) as watch:  # the run's other events do not end the wait
        while True:
            _reread(run)
            left = deadline - time.monotonic()
            if run.status == Run.Status.CANCELLED and left > 0 and not run_end_recorded(run_id=run.pk):
                pass  # cancelled while running: its worker still records the call it was making, and the end
            elif run.is_finished or run.status == Run.Status.AWAITING_APPROVAL or left <= 0:
                return run
            watch.wait(min(interval_s, left))


def _reread(run: Run) -> None:
    """``run.refresh_from_db()`` for a waiter, which reads the run again and again: one statement made once
    (``audit.row_statements``) instead of a query compiled each time. Its relations stay cached, as there (their
    keys do not change)."""
    fresh = RUN_READ.get(run.pk)
    if fresh is None:
        raise Run.DoesNotExist(f"run {run.pk} no longer exists")
    for field in Run._meta.concrete_fields:
        setattr(run, field.attname, getattr(fresh, field.attname))


def tool_name_conflicts(
    servers: list[McpServer], *, prefixes: Mapping[Any, str] | None = None, enabling: Collection[Any] = ()
) -> dict[str, list[str]]:
    """Tool names (as the model sees them, prefix included, in NFC: ``same_tool_name``) that more than one of
    ``servers`` exposes; as they would be with the servers' tool name ``prefixes`` (pk → prefix) and the tools
    ``enabling`` (pks) switched on."""
    owners: dict[str, list[str]] = {}
    for server in servers:
        prefix = (prefixes or {}).get(server.pk, server.tool_prefix)
        for tool in server.tools.all():
            if tool.callable or (tool.pk in enabling and tool.callable_once_enabled):
                owners.setdefault(same_tool_name(f"{prefix}{tool.name}"), []).append(server.mcp_id)
    return {name: ids for name, ids in owners.items() if len(ids) > 1}


def same_tool_name(name: str) -> str:
    """The form in which two tool names are compared: NFC. ``직원검색`` written on macOS arrives decomposed (NFD),
    another server sends it composed; a person and a model read one name, which the raw strings would not be."""
    return unicodedata.normalize("NFC", name)


def _conflicts_text(conflicts: Mapping[str, list[str]]) -> str:
    return "; ".join(f"{name} ({', '.join(ids)})" for name, ids in conflicts.items())


def tool_name_conflict_problem(servers: list[McpServer]) -> str:
    """Why ``servers`` may not be bound to one agent together ("": they may): two of them expose a tool of the same
    name, and every run of the agent would fail (``config:tool_name_conflict``). The admin's agent form and
    ``import_config`` refuse it in these words."""
    conflicts = tool_name_conflicts(servers)
    if not conflicts:
        return ""
    return _(
        "These servers expose the same tool name: %(conflicts)s. Give one of them a tool name "
        "prefix, or disable the duplicate tool."
    ) % {"conflicts": _conflicts_text(conflicts)}


def agent_tool_name_conflicts(
    *,
    server_ids: Collection[Any] | None = None,
    prefixes: Mapping[Any, str] | None = None,
    enabling: Collection[Any] = (),
) -> dict[str, dict[str, set[str]]]:
    """Per agent (slug), the tool names it would be offered by more than one server (name → their ids) with the
    servers' tool name ``prefixes`` (pk → prefix) and the tools ``enabling`` (pks) switched on: by the servers it
    binds, or those of a version it serves (live, shadow, an A/B arm); of the agents that use one of
    ``server_ids`` (None: every agent). Agents with none are left out."""
    return _conflicts_by_agent(_agent_bindings(server_ids), prefixes=prefixes, enabling=enabling)


def _agent_bindings(server_ids: Collection[Any] | None) -> list[tuple[str, list[McpServer]]]:
    """Each agent's server lists (slug, servers with their tools): the servers it binds and those of each version it
    serves; only the lists holding one of ``server_ids`` (None: all). Read in a fixed number of queries."""
    servers = {s.mcp_id: s for s in McpServer.objects.prefetch_related("tools")}
    agents = Agent.objects.prefetch_related("servers", "arms__version").select_related("live_version", "shadow_version")
    found: list[tuple[str, list[McpServer]]] = []
    for agent in agents.order_by("slug"):
        versions = [agent.live_version, agent.shadow_version, *(arm.version for arm in agent.arms.all())]
        lists = [sorted(s.mcp_id for s in agent.servers.all())] + [
            list((v.content or {}).get("servers") or []) for v in versions if v is not None
        ]
        for mcp_ids in lists:
            bound = [servers[m] for m in mcp_ids if m in servers]
            if server_ids is None or any(s.pk in server_ids for s in bound):
                found.append((agent.slug, bound))
    return found


def _conflicts_by_agent(
    bindings: list[tuple[str, list[McpServer]]],
    *,
    prefixes: Mapping[Any, str] | None = None,
    enabling: Collection[Any] = (),
) -> dict[str, dict[str, set[str]]]:
    found: dict[str, dict[str, set[str]]] = {}
    for slug, bound in bindings:
        for name, ids in tool_name_conflicts(bound, prefixes=prefixes, enabling=enabling).items():
            found.setdefault(slug, {}).setdefault(name, set()).update(ids)
    return found


def tool_name_clashes_made(
    before: Mapping[str, Mapping[str, set[str]]], after: Mapping[str, Mapping[str, set[str]]]
) -> dict[str, str]:
    """The agents (slug → why) that ``after`` gives a clash ``before`` did not have: a name two servers share that
    was not shared, or now by a server that did not share it. A clash that was there already (stored before such
    changes were refused, or made by discovery) is not the change's: it does not refuse the prefix that undoes
    part of it, nor an import that does not touch it."""
    made: dict[str, str] = {}
    for slug, conflicts in after.items():
        new = {name: ids for name, ids in conflicts.items() if not ids <= set(before.get(slug, {}).get(name, set()))}
        if new:
            made[slug] = _(
                "Agent %(agent)s would be offered two tools of one name: %(conflicts)s; every run of it would "
                "fail. Give one of the servers another tool name prefix, or disable the duplicate tool."
            ) % {"agent": slug, "conflicts": _conflicts_text({name: sorted(ids) for name, ids in new.items()})}
    return made


def agents_tool_name_problems(*, server_ids: Collection[Any], **check: Any) -> list[str]:
    """The receiver of ``mcpregistry.signals.tool_names_check`` (connected in ``AgentsConfig.ready``): a server's
    tool name prefix changed or a tool switched on is refused where it would offer an agent two tools of one name
    that it was not offered before (``tool_name_clashes_made``)."""
    bindings = _agent_bindings(server_ids)  # read once: before and after differ only by the change asked
    before = _conflicts_by_agent(bindings)
    after = _conflicts_by_agent(bindings, prefixes=check.get("prefixes"), enabling=check.get("enabling") or ())
    return list(tool_name_clashes_made(before, after).values())


def rules_refused_by_tool_contract(*, tool: Any, **_signal: Any) -> list[str]:
    """The receiver of ``mcpregistry.signals.contract_rules_check`` (connected in ``AgentsConfig.ready``): the
    enabled rules that call ``tool`` with parameters its contract, as stored, refuses (``call_problems``), a text
    each naming the rule, its agent and why. The rule editor refuses such parameters; a contract may tighten them
    on purpose, and its page says which rules to mend."""
    from mcpregistry.models import McpTool

    stored = McpTool.objects.select_related("contract").filter(pk=tool.pk).first()
    if stored is None:
        return []
    rules = DeterministicRule.objects.filter(server_id=stored.server_id, tool_name=stored.name, enabled=True)
    found = []
    for rule in rules.select_related("agent").order_by("agent__slug", "order", "id"):
        if problems := rule.call_problems(stored):
            owner = rule.agent.slug if rule.agent is not None else _("every agent bound to its server")
            found.append(
                _("Rule '%(rule)s' (%(agent)s) calls this tool with parameters the contract refuses: %(problems)s")
                % {"rule": rule.name, "agent": owner, "problems": "; ".join(problems)}
            )
    return found


def tool_names_taken_by_agents(*, server_id: Any, names: Collection[str], **_: Any) -> dict[str, list[str]]:
    """The receiver of ``mcpregistry.signals.tool_names_taken`` (connected in ``AgentsConfig.ready``): of the tool
    ``names`` the server ``server_id`` would offer (its prefix added), those another server it is bound beside
    already offers an agent (by the servers it binds, or a version it serves), each with those agents."""
    taken: dict[str, set[str]] = {}
    for slug, bound in _agent_bindings([server_id]):
        server = next(s for s in bound if s.pk == server_id)
        offered = {
            same_tool_name(f"{s.tool_prefix}{t.name}")
            for s in bound
            if s.pk != server_id
            for t in s.tools.all()
            if t.callable
        }
        for name in names:
            if same_tool_name(f"{server.tool_prefix}{name}") in offered:
                taken.setdefault(name, set()).add(slug)
    return {name: sorted(slugs) for name, slugs in taken.items()}


def servers_leaving(*, agent: Agent, servers: list[McpServer]) -> set[str]:
    """The ids of the servers ``agent`` binds now and would no longer bind with ``servers``."""
    if agent.pk is None:
        return set()
    return set(agent.servers.values_list("mcp_id", flat=True)) - {server.mcp_id for server in servers}


def rules_calling(*, agent: Agent, mcp_ids: set[str]) -> list[str]:
    """The agent's own enabled rules for one of ``mcp_ids`` (an admin rule's server, a code rule's
    ``@deterministic_tool(mcp_id=...)``), as ``"rule (server)"``: if the agent stopped binding it, each would fail
    the runs it decides (``mcp:not_loaded``)."""
    from agents.tools import CodeRuleError, load_code_rule

    if agent.pk is None or not mcp_ids:
        return []
    calling = []
    for rule in agent.rules.filter(enabled=True).select_related("server").order_by("order", "id"):
        if rule.code:
            try:
                _fn, mcp_id = load_code_rule(rule.code)
            except CodeRuleError:
                continue
        else:
            mcp_id = rule.server.mcp_id if rule.server else ""
        if mcp_id in mcp_ids:
            calling.append(f"{rule.name} ({mcp_id})")
    return calling


def deterministic_rule_specs(
    *, agent: Agent, server_ids: list[Any] | None = None, enabled: bool = True
) -> list[RuleSpec]:
    """The enabled rules a run of ``agent`` evaluates, in order: its own, and the global ones for its servers: an
    admin rule's server, a code rule's ``@deterministic_tool(mcp_id=...)`` (a global code rule whose function does
    not load is kept: the stage reports it). An agent's own code rule for a server it does not bind stays, and
    fails as seed 000 says (``mcp:not_loaded``). ``server_ids``: the agent's servers' ids where the caller has
    them already (one query fewer). ``enabled`` False: the disabled rules it would evaluate, were they enabled
    (the rule tester names them)."""
    bound = list(agent.servers.values_list("pk", flat=True)) if server_ids is None else server_ids
    rules = list(
        DeterministicRule.objects.filter(enabled=enabled)
        .filter(Q(agent=agent) | Q(agent__isnull=True, server__in=bound) | Q(agent__isnull=True, code__gt=""))
        .select_related("server")
        .order_by("order", "id")
    )
    if any(r.agent_id is None and r.code for r in rules):
        bound_ids = set(McpServer.objects.filter(pk__in=bound).values_list("mcp_id", flat=True))
        rules = [r for r in rules if r.agent_id is not None or not r.code or _routes_to(r.code, bound_ids)]
    return [
        RuleSpec(
            rule_id=r.pk,
            name=r.name,
            mcp_id=r.server.mcp_id if r.server else "",
            tool_name=r.tool_name,
            code=r.code,
            when=r.when or {},
            params=r.params or {},
            answer_template=r.answer_template,
            force_first_tool=r.force_first_tool,
        )
        for r in rules
    ]


def agent_list_for_key(*, api_key: ApiKey) -> list[Agent]:
    """The enabled agents ``api_key`` may use (all of them for a key not scoped to agents), by slug."""
    agents = Agent.objects.filter(enabled=True)
    if api_key.agents.exists():
        agents = agents.filter(pk__in=api_key.agents.values("pk"))
    return list(agents.order_by("slug"))


def agent_get_for_key(*, slug: str, api_key: ApiKey) -> Agent:
    """An enabled agent ``api_key`` may use; any other slug (unknown, disabled, out of the key's scope) is a 404
    (``agent_not_found``), so a scoped key learns nothing of the agents it may not use."""
    agent = next((a for a in agent_list_for_key(api_key=api_key) if a.slug == slug), None)
    if agent is None:
        raise ApplicationError(_("Agent '%(slug)s' not found.") % {"slug": slug}, code="agent_not_found", status=404)
    return agent


def _routes_to(path: str, mcp_ids: set[str]) -> bool:
    """Whether a global code rule's function routes to one of ``mcp_ids``; True when it does not load (the stage
    reports that)."""
    from agents.tools import CodeRuleError, load_code_rule

    try:
        return load_code_rule(path)[1] in mcp_ids
    except CodeRuleError:
        return True
