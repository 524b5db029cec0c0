"""Services: every write to agents' models goes through here."""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, TypedDict

from django.conf import settings
from django.core.exceptions import NON_FIELD_ERRORS, FieldDoesNotExist, ValidationError
from django.db import connection, models, transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from agent_platform.errors import ApplicationError
from agent_platform.telemetry import traceparent_current
from agent_platform.text import nfc, nfc_value
from agents.budgets import budget_reserve
from agents.config_cache import SubmissionParts, submission_parts
from agents.decision_reasons import CANCELLED_APPROVAL
from agents.dispatch import run_dispatch, run_time_limits
from agents.flows import registered_flow_graphs
from agents.models import (
    RUN_IN_FLIGHT_STATUSES,
    Agent,
    AgentArm,
    AgentVersion,
    ApiKey,
    Approval,
    DeterministicRule,
    Run,
    empty_keyword_problems,
    rule_context_secret_problem,
    rule_params_secret_problem,
)
from agents.run_state import SECRET_UNREADABLE, RunEventWriter, approvals_interrupted, approvals_unused
from agents.selectors import rules_calling, servers_leaving
from agents.versions import (
    AGENT_FIELDS,
    VersionContent,
    caller_key,
    content_digest,
    pick_arm,
    version_content,
    version_rule_ids,
)
from audit.change_guard import actor_label
from audit.changes import audited_delete, audited_save, change_scope, config_change_record
from audit.masking import MASK, mask_text, mask_value
from audit.row_statements import RowInsert, RowRead
from audit.services import audit_event_record
from mcpregistry.crypto import SecretDecryptionError, readable
from mcpregistry.models import McpServer

logger = logging.getLogger(__name__)

API_KEY_PREFIX = "apk_"


def api_key_digest(raw_key: str) -> str:
    return hashlib.sha256(raw_key.encode("utf-8")).hexdigest()


def api_key_create(
    *,
    name: str,
    actor: Any,
    via: str,
    agents: Iterable[Agent] = (),
    rate: str = "",
    admin: bool = False,
    issue_token: str | None = None,
) -> tuple[ApiKey, str]:
    """Issue a key (recorded as ``config.api_key.create``: its name, prefix and agents, never the key or its
    digest). Returns the row and the raw key, which is shown once and never stored. ``issue_token``: the admin
    form's token, unique (a second key for the same form is an ``IntegrityError``)."""
    raw = API_KEY_PREFIX + secrets.token_urlsafe(32)
    key = ApiKey(
        name=name, prefix=raw[:12], digest=api_key_digest(raw), rate=rate, admin=admin, issue_token=issue_token
    )
    audited_save(key, actor=actor, via=via, m2m={"agents": list(agents)})
    return key, raw


def api_key_update(
    *,
    api_key: ApiKey,
    actor: Any,
    via: str,
    data: Mapping[str, Any] | None = None,
    agents: Iterable[Agent] | None = None,
) -> ApiKey:
    """Change a key's name, rate limit or agents. Raises ValidationError (``agents``, code ``key_scope_widened``)
    where ``agents`` is empty for a live key that has some: a key with no agents may use every agent, so that edit
    would open every agent to it, not narrow it (``api_key_widened``). Nothing is written or audited then. Checked
    under the configuration's lock, as ``agent_delete`` checks the keys an agent's delete would leave with none."""
    with transaction.atomic(), change_scope(actor=actor, via=via):
        m2m = None if agents is None else {"agents": list(agents)}
        if m2m is not None and api_key_widened(api_key=api_key, agents=m2m["agents"]):
            refusal = ValidationError(api_key_widening_refused(), code="key_scope_widened")
            raise ValidationError({"agents": [refusal]})
        return audited_save(api_key, actor=actor, via=via, data=data, m2m=m2m)


def api_key_widened(*, api_key: ApiKey, agents: list[Agent]) -> bool:
    """Whether giving ``api_key`` the agents ``agents`` would widen it to every agent: a stored key that may use
    some agents left with none. A key for every agent (none stored) keeps that scope on any edit; a revoked key
    uses nothing any more (as ``keys_left_without_agents`` reads it, and it is never live again)."""
    if agents or api_key.pk is None:
        return False
    return ApiKey.objects.filter(pk=api_key.pk, revoked_at__isnull=True, agents__isnull=False).exists()


def api_key_widening_refused() -> str:
    """Why a key's last agent cannot be taken off (``api_key_widened``), and what to do instead."""
    return _(
        "Without agents this key could use every agent: keep at least one, or revoke it and create a key for every "
        "agent."
    )


def api_key_delete(*, api_key: ApiKey, actor: Any, via: str) -> None:
    """Delete a key that has made no run. Refused (ApplicationError 409, nothing written) while it has runs: its
    delete would leave them with no key (``Run.api_key`` is set to NULL), and the record would not say which runs
    were its. Such a key is revoked instead (``api_key_revoke``); it keeps its runs."""
    with transaction.atomic(), change_scope(actor=actor, via=via):
        # Locked first: a run inserted meanwhile (its key read ``FOR KEY SHARE``) is committed, and seen, before this
        # reads the key's runs.
        ApiKey.objects.select_for_update().filter(pk=api_key.pk).values_list("pk", flat=True).first()
        if api_key.pk is not None and Run.objects.filter(api_key_id=api_key.pk).exists():
            raise ApplicationError(api_key_with_runs_refused(api_key), code="api_key_has_runs", status=409)
        audited_delete(api_key, actor=actor, via=via)


def api_key_with_runs_refused(api_key: ApiKey) -> str:
    """Why a key that has runs is not deleted (``api_key_delete``), and what to do instead."""
    return _(
        "API key %(name)s (%(prefix)s…) has runs: deleting it would take them off it. Revoke it instead; it keeps "
        "its runs."
    ) % {"name": api_key.name, "prefix": api_key.prefix}


# ``last_used_at`` is written at most this often per key (a write per request would be a commit per request).
API_KEY_LAST_USED_RESOLUTION = timedelta(seconds=60)


# Read on every API request, and the run inserted by every submission: statements made once rather than queries
# compiled each time (audit/row_statements.py; a run has no save signals).
_API_KEY_READ = RowRead(ApiKey)
_RUN_INSERT = RowInsert(Run, [field.name for field in Run._meta.concrete_fields])


def api_key_authenticate(*, raw_key: str) -> ApiKey | None:
    """The live key with this value, or None. Records its last use, to the minute."""
    key = _API_KEY_READ.get_where({"digest": api_key_digest(raw_key), "revoked_at": None})
    assert key is None or isinstance(key, ApiKey)
    if key is not None:
        now = timezone.now()
        if key.last_used_at is None or now - key.last_used_at >= API_KEY_LAST_USED_RESOLUTION:
            ApiKey.objects.filter(pk=key.pk).update(last_used_at=now)
            key.last_used_at = now
    return key


@transaction.atomic
def api_key_revoke(*, api_key: ApiKey, actor: Any, via: str) -> bool:
    """Revoke a key from now on (its next request is a 401). Compare-and-swap: returns False, and changes
    nothing, if it was already revoked. The revocation (``config.api_key.revoke``) is audited in the same
    transaction."""
    now = timezone.now()
    with change_scope(actor=actor, via=via):
        revoked = ApiKey.objects.filter(pk=api_key.pk, revoked_at__isnull=True).update(revoked_at=now) == 1
        if revoked:
            api_key.revoked_at = now
            config_change_record(obj=api_key, verb="revoke", diff={"revoked_at": [None, now.isoformat()]})
    return revoked


def _settings_checked(
    agent: Agent, data: Mapping[str, Any] | None, servers: list[McpServer] | None, *, creating: bool
) -> None:
    """Refuse (ValidationError per field) tool selection and MCP context settings that could never work with
    the servers the agent will bind: a tag no tool has, a pinned tool outside the filters, a prompt argument the
    prompt does not take, ``read_resource`` beside a server's tool of that name. Checked where one of the three
    changes (a later change of a server's tools does not make every other save of the agent fail, nor the import
    of an unchanged document), and only against servers discovered (a new installation's import binds servers it
    has not connected to yet: what they offer is not known)."""
    from agents.agent_settings_form import agent_settings_problems  # the form's checks; forms load with the admin

    names = ("tool_selection", "mcp_context")
    after = {name: (data or {}).get(name, getattr(agent, name)) for name in names}
    bound = servers if servers is not None else list(agent.servers.all()) if agent.pk else []
    if not creating and agent.pk is not None:
        stored = Agent.objects.filter(pk=agent.pk).values(*names).first() or {}
        same_servers = servers is None or {s.pk for s in servers} == set(agent.servers.values_list("pk", flat=True))
        if same_servers and all(stored.get(name) == after[name] for name in names):
            return
    if McpServer.objects.filter(pk__in=[s.pk for s in bound], last_checked_at__isnull=True).exists():
        return  # a server never discovered (an import into a new installation): its tools and resources are unknown
    problems = agent_settings_problems(
        tool_selection=after["tool_selection"], mcp_context=after["mcp_context"], servers=bound
    )
    if problems:
        raise ValidationError(problems)


@contextmanager
def _servers_given(agent: Agent, servers: list[McpServer] | None) -> Iterator[None]:
    """Within: ``agent``'s validation reads ``servers`` as those it binds (``Agent.servers_given``; None: the
    stored ones). The many-to-many is set after the row is validated: a flow's server was checked against the
    servers bound before the save (a new agent: every registered one), and a flow calling one the save leaves out
    was accepted, every run failing."""
    agent.servers_given = None if servers is None else [server.mcp_id for server in servers]
    try:
        yield
    finally:
        agent.servers_given = None


def agent_create(*, actor: Any, via: str, data: Mapping[str, Any], servers: Iterable[McpServer] = ()) -> Agent:
    """Define an agent with its bound servers (published at once when it is set to publish on save). Raises
    ValidationError where its tool selection or MCP context could never work with those servers, or its flow
    calls a server it does not bind."""
    servers = list(servers)
    _settings_checked(Agent(), data, servers, creating=True)
    with transaction.atomic(), change_scope(actor=actor, via=via):
        agent = Agent()
        with _servers_given(agent, servers):
            audited_save(agent, actor=actor, via=via, data=data, m2m={"servers": list(servers)})
        _publish_if_on_save(agent, actor=actor, via=via)
    return agent


def agent_update(
    *,
    agent: Agent,
    actor: Any,
    via: str,
    data: Mapping[str, Any] | None = None,
    servers: Iterable[McpServer] | None = None,
    check_rules: bool = True,
) -> Agent:
    """Change an agent (prompt, model, mode, limits) and, given ``servers``, the servers it binds. A published
    agent's change is a draft that live traffic does not run until it is published, unless the agent is set to
    publish on save: then the draft is published in the same transaction where this edit changed what a version
    freezes, or turned publish on save on (``_edit_publishes_on_save``). Raises ValidationError (``servers``) where
    the agent would stop binding a server its enabled rules call (``unbinding_refused``); ``check_rules=False``:
    the caller checks that once its rules are changed too (an import). Raises ValidationError
    (``tool_selection``, ``mcp_context``) where those settings, or the servers, change so that they could never
    work (``_settings_checked``), and (``model_params``) where the flow's options, mode or graph, or the servers,
    change so that the flow calls a server the agent does not bind (``Agent._flow_options_problems``). Raises
    ValidationError (``live_version``, ``shadow_version``) where the edit clears the live version of a published
    agent (``live_version_clearing_refused``) or points live traffic or the shadow at another version that can no
    longer run (``version_unrunnable_problem``); checked on the row as saved, and the transaction rolls back.

    Writes only what this change sets (``audit.changes.audited_save``): an admin's form instance read before a
    publish does not put back the ``live_version`` or ``shadow_version`` it was read with. The change scope takes
    the configuration's lock before the agent's row, as a publish does."""
    if servers is not None:
        servers = list(servers)
        leaving = servers_leaving(agent=agent, servers=servers)
        if check_rules and (needing := rules_calling(agent=agent, mcp_ids=leaving)):
            raise ValidationError({"servers": [unbinding_refused(needing)]})
    _settings_checked(agent, data, servers, creating=False)
    with transaction.atomic(), change_scope(actor=actor, via=via):
        before = _stored_before_edit(agent)
        with _servers_given(agent, servers):
            audited_save(
                agent, actor=actor, via=via, data=data, m2m=None if servers is None else {"servers": list(servers)}
            )
        _version_choices_checked(agent, before)
        if _edit_publishes_on_save(agent, before, live_named="live_version" in (data or {})):
            _publish_on_save(agent, actor=actor, via=via)
    return agent


def unbinding_refused(needing: list[str]) -> str:
    """Why the agent's servers cannot change so: ``needing`` are its enabled rules for a server it would stop
    binding (``agents.selectors.rules_calling``)."""
    return _(
        "These enabled rules call a server the agent would no longer bind: %(rules)s. Disable or change them and "
        "save, then unbind the server; or keep it."
    ) % {"rules": ", ".join(needing)}


def keys_left_without_agents(agents: Iterable[Agent]) -> list[ApiKey]:
    """The API keys that may use only agents among ``agents``: deleting those agents would leave each with no
    agent, which a key reads as "every agent"."""
    ids = {agent.pk for agent in agents}
    keys = (
        ApiKey.objects.filter(agents__in=ids, revoked_at__isnull=True)  # a revoked key uses nothing any more
        .distinct()
        .prefetch_related("agents")
        .order_by("name")
    )
    return [key for key in keys if {agent.pk for agent in key.agents.all()} <= ids]


def agent_delete(*, agent: Agent, actor: Any, via: str) -> None:
    """Delete an agent with its rules (its runs are kept: the delete is refused while it has runs). Refused while
    an API key may use this agent alone: without it the key's list of agents would be empty, which means every
    agent (ApplicationError 409, naming the keys)."""
    with transaction.atomic(), change_scope(actor=actor, via=via):
        lonely = keys_left_without_agents([agent])
        if lonely:
            raise ApplicationError(
                _(
                    "API keys that may use only this agent: %(keys)s. Without it they could use every agent: give "
                    "them other agents or revoke them first."
                )
                % {"keys": ", ".join(key.name for key in lonely)},
                code="agent_in_key_scope",
                status=409,
            )
        audited_delete(agent, actor=actor, via=via)


def deterministic_rule_create(*, actor: Any, via: str, data: Mapping[str, Any]) -> DeterministicRule:
    """Add a rule (validated: a code rule importable, an admin rule's tool known and its params fitting). Like
    every rule change, a draft for a published agent unless it publishes on save."""
    with transaction.atomic(), change_scope(actor=actor, via=via):
        agent = data.get("agent")
        before = _frozen_digests([agent.pk if isinstance(agent, Agent) else agent])
        rule = audited_save(DeterministicRule(), actor=actor, via=via, data=data)
        _publish_rule_agents_on_save([rule.agent_id], before=before, actor=actor, via=via)
    return rule


def deterministic_rule_update(
    *, rule: DeterministicRule, actor: Any, via: str, data: Mapping[str, Any] | None = None
) -> DeterministicRule:
    """Change a rule (``rule`` may carry the changes, as the admin's inline row does). The change scope opens
    first, taking the configuration's lock before the rule's row and then the agents it publishes on save
    (``audit.change_guard.config_write_lock``): the order a publish and an agent's edit keep too."""
    with transaction.atomic(), change_scope(actor=actor, via=via):
        stored = DeterministicRule.objects.filter(pk=rule.pk).values_list("agent_id", flat=True)
        was = [stored.get()] if rule.pk is not None and stored.exists() else []
        agent = (data or {}).get("agent", rule.agent_id)
        ids = [*was, agent.pk if isinstance(agent, Agent) else agent]
        before = _frozen_digests(ids)
        audited_save(rule, actor=actor, via=via, data=data)
        _publish_rule_agents_on_save([*ids, rule.agent_id], before=before, actor=actor, via=via)
    return rule


def deterministic_rule_delete(*, rule: DeterministicRule, actor: Any, via: str) -> None:
    with transaction.atomic(), change_scope(actor=actor, via=via):
        agent_id = rule.agent_id
        before = _frozen_digests([agent_id])
        audited_delete(rule, actor=actor, via=via)
        _publish_rule_agents_on_save([agent_id], before=before, actor=actor, via=via)


# --- versions ---------------------------------------------------------------------------------------------


# Agents whose publish on save is held back (``publish_on_save_deferred``): None outside such a block.
_deferred_publishes: ContextVar[set[int] | None] = ContextVar("deferred_publishes", default=None)


@contextmanager
def publish_on_save_deferred() -> Iterator[set[int]]:
    """Within the block, an edit that would publish an agent on save only notes the agent's id in the set it
    yields; the caller publishes them once at the end (``config_import``: a document applies many entries, and
    names the versions it wants itself)."""
    deferred: set[int] = set()
    token = _deferred_publishes.set(deferred)
    try:
        yield deferred
    finally:
        _deferred_publishes.reset(token)


def _publish_on_save(agent: Agent, *, actor: Any, via: str) -> None:
    """Publish ``agent``'s draft on save (held back inside ``publish_on_save_deferred``). A draft that cannot run
    (``agent_version_publish`` refuses it) stays a draft, logged: the edit is saved, as one that does not publish on
    save is, and the live version stays (refusing it refused every edit, and every discovery of a bound server,
    until the draft ran again)."""
    deferred = _deferred_publishes.get()
    if deferred is not None:
        deferred.add(agent.pk)
        return
    try:
        agent_version_publish(agent=agent, actor=actor, via=via, note="published on save")
    except ValidationError as exc:
        logger.warning("agent %s: not published on save, kept as a draft: %s", agent.slug, "; ".join(exc.messages))


def agents_publish_held_on_save(
    *, agent_ids: Iterable[int], actor: Any, via: str, before: Mapping[int, str] | None = None
) -> dict[int, AgentVersion]:
    """The end of a block that held publish on save back (``publish_on_save_deferred``), in its transaction: each
    agent among ``agent_ids`` that still publishes on save, and whose frozen content the block changed (``before``:
    ``publish_on_save_digests`` read before it), publishes its draft once, as the whole block left it. The caller
    leaves out an agent whose live version the block chose (the admin's choice wins). Returns the live version of
    each agent published, by its id (the live one as it was where the draft holds nothing new)."""
    agents = Agent.objects.filter(pk__in=list(agent_ids), publish_on_save=True).order_by("slug")
    return {
        agent.pk: agent_version_publish(agent=agent, actor=actor, via=via, note="published on save")
        for agent in agents
        if publishes_after(agent, before)
    }


def _publish_if_on_save(agent: Agent | None, *, actor: Any, via: str) -> None:
    if agent is not None and Agent.objects.filter(pk=agent.pk, publish_on_save=True).exists():
        _publish_on_save(agent, actor=actor, via=via)


class _StoredBeforeEdit(TypedDict):
    publish_on_save: bool
    live_version_id: int | None
    shadow_version_id: int | None
    frozen_digest: str | None  # of what a version would freeze; read only where the agent publishes on save


def _stored_before_edit(agent: Agent) -> _StoredBeforeEdit | None:
    """The agent as an edit finds it (read under the configuration's lock, which ``agent_update`` holds), for
    ``_edit_publishes_on_save``; None for an agent not stored yet."""
    stored = (
        Agent.objects.filter(pk=agent.pk).values("publish_on_save", "live_version_id", "shadow_version_id").first()
        if agent.pk
        else None
    )
    if stored is None:
        return None
    return {
        "publish_on_save": stored["publish_on_save"],
        "live_version_id": stored["live_version_id"],
        "shadow_version_id": stored["shadow_version_id"],
        "frozen_digest": content_digest(version_content(agent)) if stored["publish_on_save"] else None,
    }


def _version_choices_checked(agent: Agent, before: _StoredBeforeEdit | None) -> None:
    """Refuse (ValidationError per field) an agent edit, ``agent`` as it saved it and ``before`` as it found it,
    that cleared the live version of a published agent (its runs would run the unpublished draft, recorded as
    never published) or pointed the live version or the shadow at another version that can no longer run. A
    version unchanged is not checked: an agent whose version went bad meanwhile still saves its other fields."""
    if before is None:
        return
    errors: dict[str, list[ValidationError]] = {}
    if agent.live_version_id is None and before["live_version_id"] is not None:
        errors["live_version"] = [ValidationError(live_version_clearing_refused(), code="live_version_required")]
    chosen = (
        ("live_version", agent.live_version_id, before["live_version_id"]),
        ("shadow_version", agent.shadow_version_id, before["shadow_version_id"]),
    )
    for name, now, was in chosen:
        if now is not None and now != was and (problem := version_unrunnable_problem(AgentVersion.objects.get(pk=now))):
            errors[name] = [ValidationError(problem, code="version_unrunnable")]
    if errors:
        raise ValidationError(errors)


def live_version_clearing_refused() -> str:
    """Why a published agent's live version cannot be left empty, and what to do instead: without it live traffic
    runs the stored draft, unreviewed, and its runs say "never published"."""
    return _(
        "Without a live version, live traffic would run the unpublished draft: choose the version to serve, or "
        "publish the draft to serve it."
    )


def version_unrunnable_problem(version: AgentVersion) -> str | None:
    """Why live traffic, an A/B arm or a shadow cannot be sent to ``version``: what in its content can no longer
    run (``version_content_problems``, as a roll back to it is refused: a flow graph or a code rule no longer
    registered, a base URL the address policy now refuses); None where it can run."""
    problems = version_content_problems(agent=version.agent, content=version.content, stored_here=True)
    if not problems:
        return None
    return _("v%(number)s can no longer run (choose another version): %(problems)s") % {
        "number": version.number,
        "problems": "; ".join(problems),
    }


def _version_change_checked(version: AgentVersion | None, *, before_id: int | None, field: str) -> None:
    """Refuse (ValidationError on ``field``) pointing an arm or a shadow at ``version`` where it is another version
    than ``before_id`` (the stored one) and can no longer run (``version_unrunnable_problem``)."""
    if version is None or version.pk == before_id:
        return
    if problem := version_unrunnable_problem(version):
        raise ValidationError({field: [ValidationError(problem, code="version_unrunnable")]})


def _edit_publishes_on_save(agent: Agent, before: _StoredBeforeEdit | None, *, live_named: bool) -> bool:
    """Whether an agent edit (``agent_update``; ``agent`` as now stored, ``before`` as the edit found it)
    publishes the draft on save. Only where the agent publishes on save, and then:

    - never where the edit chose the live version (``live_named``: ``data`` names it; or the form changed it):
      the admin's choice wins, as ``import_config``'s does when its document names the live version;
    - where it turned publish on save on (or created the agent): that asks for the draft to be live (nothing is
      published where it is the live version's content already);
    - else only where it changed what a version freezes (``version_content``: the frozen settings, the bound
      servers). After a roll back the draft differs from the live version: an edit of a setting no version holds
      (the shadow, the time limit) published that draft and undid the roll back."""
    if not agent.publish_on_save:
        return False
    if live_named or (before is not None and agent.live_version_id != before["live_version_id"]):
        return False
    if before is None or not before["publish_on_save"]:
        return True
    return content_digest(version_content(agent)) != before["frozen_digest"]


def _agents_publishing_on_save(agent_ids: Iterable[int | None]) -> list[Agent]:
    """The agents that publish on save among ``agent_ids``; every one of them where one is None (a global rule
    reaches the agents bound to its server or, a code rule, any agent)."""
    ids = list(agent_ids)
    agents = Agent.objects.filter(publish_on_save=True)
    if None not in ids:
        agents = agents.filter(pk__in=[pk for pk in ids if pk is not None])
    return list(agents.order_by("slug"))


def publish_on_save_digests(agents: Iterable[Agent]) -> dict[int, str]:
    """What a version of each of ``agents`` would freeze now (agent id → ``content_digest``): read before a change,
    so that only an agent whose frozen content the change changed publishes on save. After a roll back the draft
    still holds the newer content: an unchanged save (a rule's, a tool's, an agent page's, an unchanged export
    imported again) published that draft and undid the roll back."""
    return {agent.pk: content_digest(version_content(agent)) for agent in agents}


def publishes_after(agent: Agent, before: Mapping[int, str] | None) -> bool:
    """Whether ``agent``, which publishes on save, publishes after a change (``before``: ``publish_on_save_digests``
    read before it, None where not read): unless its frozen content is the one read."""
    return before is None or agent.pk not in before or content_digest(version_content(agent)) != before[agent.pk]


def _frozen_digests(agent_ids: Iterable[int | None]) -> dict[int, str]:
    """``publish_on_save_digests`` of the agents among ``agent_ids`` that publish on save, read before a rule
    change. Empty inside ``publish_on_save_deferred``: the block's end compares (``config_import``, the agent's
    admin page)."""
    if _deferred_publishes.get() is not None:
        return {}
    return publish_on_save_digests(_agents_publishing_on_save(agent_ids))


def _publish_rule_agents_on_save(
    agent_ids: Iterable[int | None], *, before: Mapping[int, str], actor: Any, via: str
) -> None:
    """After a rule changed (``agent_ids``: the agent it belonged to before and after, None for a global rule;
    ``before``: ``_frozen_digests`` read before the change): the agents that publish on save whose frozen content
    the change changed publish. One it left as it was does not: after a roll back its draft differs from the live
    version, and an unchanged save (an admin pressing Save) published that draft and undid the roll back."""
    for agent in _agents_publishing_on_save(agent_ids):
        if publishes_after(agent, before):
            _publish_on_save(agent, actor=actor, via=via)


def agents_frozen_before_registry_change(*, server_ids: Iterable[Any], **_signal: Any) -> dict[int, str]:
    """Receiver of ``mcpregistry.signals.registry_contracts_frozen`` (connected in ``AgentsConfig.ready``), before a
    change to the contracts or callable tools of ``server_ids``: what a version of each agent bound to one of them
    that publishes on save would freeze now (agent id → ``content_digest``), for
    ``agents_publish_on_registry_change`` to compare after it. Nothing inside ``publish_on_save_deferred``: the
    block's end compares (``config_import``)."""
    if _deferred_publishes.get() is not None:
        return {}
    return publish_on_save_digests(Agent.objects.filter(publish_on_save=True, servers__in=list(server_ids)).distinct())


def agents_publish_on_registry_change(
    *, server_ids: Iterable[Any], actor: Any, via: str, before: Mapping[int, str] | None = None, **_signal: Any
) -> None:
    """Receiver of ``mcpregistry.signals.registry_contracts_changed`` (connected in ``AgentsConfig.ready``), in
    the transaction of the contract change: the agents bound to one of ``server_ids`` that publish on save publish
    a version that freezes the changed contracts. Where the service read what they froze before the change
    (``before``, ``agents_frozen_before_registry_change``), only those whose frozen content the change changed: a
    tool or contract saved unchanged after a roll back published the draft and undid the roll back."""
    agents = Agent.objects.filter(publish_on_save=True, servers__in=list(server_ids)).distinct().order_by("slug")
    for agent in agents:
        if publishes_after(agent, before):
            _publish_on_save(agent, actor=actor, via=via)


@transaction.atomic
def agent_version_publish(
    *,
    agent: Agent,
    actor: Any,
    via: str,
    note: str = "",
    content: VersionContent | None = None,
    make_live: bool = True,
) -> AgentVersion:
    """Freeze the agent as it is stored now (or ``content``, for a roll back) as its next version and make that
    the version live traffic runs (``make_live=False``: a candidate for a shadow or an A/B arm, live traffic
    unchanged). Publishing content identical to the live version's changes nothing and returns the live version;
    a candidate identical to a version the agent has returns that version (a second ``--candidate`` made a twin).
    Audited as ``config.agent_version.publish`` (with the content) and ``config.agent.update`` (``live_version``),
    in one transaction.

    Raises ValidationError (``content``) where ``version_content_problems`` finds any, as a roll back does, and
    publishes nothing: a draft whose code rule no longer loads was made live and every run failed
    ``deterministic:rule_error``.

    The change scope opens first, taking the configuration's lock before the agent's row (the order every
    configuration write keeps: ``audit.change_guard.config_write_lock``; locking the agent first deadlocked with a
    contract or rule edit publishing on save). Holding it, the publish reads the configuration as one whole: no
    change (an import changing contracts and rules together) commits between the reads of ``version_content``.
    Concurrent publishes of one agent are serialized on it, and on the agent's row. Raises ValidationError for a
    note longer than a version keeps (it was cut short unsaid)."""
    limit = AgentVersion._meta.get_field("note").max_length
    if limit is not None and len(note) > limit:
        raise ValidationError(
            {
                "note": _("A version's note has at most %(limit)s characters; this one has %(length)s.")
                % {"limit": limit, "length": len(note)}
            }
        )
    with change_scope(actor=actor, via=via):
        locked = Agent.objects.select_for_update().get(pk=agent.pk)
        frozen = content if content is not None else version_content(locked)
        digest = content_digest(frozen)
        live = locked.live_version
        if live is not None and live.digest == digest:
            return live
        twins = AgentVersion.objects.filter(agent=locked, digest=digest).order_by("-number")
        if not make_live and (twin := twins.first()) is not None:
            return twin
        if content is None and (
            problems := version_content_problems(agent=locked, content=frozen, stored_here=True, draft=True)
        ):
            raise ValidationError({"content": problems})
        last = AgentVersion.objects.filter(agent=locked).order_by("-number").values_list("number", flat=True).first()
        version = AgentVersion(
            agent=locked,
            number=(last or 0) + 1,
            content=frozen,
            digest=digest,
            note=note,
            published_by=actor_label(actor),
        )
        audited_save(version, actor=actor, via=via, verb="publish")
        if make_live:
            audited_save(locked, actor=actor, via=via, data={"live_version": version}, validate=False)
            agent.live_version = version
    return version


def agent_version_import(
    *,
    agent: Agent,
    number: int,
    content: VersionContent,
    note: str,
    actor: Any,
    via: str,
    warn: Callable[[str], None] | None = None,
) -> AgentVersion:
    """Store a version another installation published (``import_config``) under its own number, so that a
    document's live version, shadow candidate and arms can name it. ``content`` is taken as frozen there; its
    rules' ``rule_id`` are this installation's rules of the same name and occurrence (``version_rule_ids``; None
    where there is none). Audited as ``config.agent_version.import``. Raises ApplicationError 409 when the agent
    has that number already, ValidationError where ``version_content_problems`` finds any.

    A server the content names that this installation does not have is no refusal: the version is stored as
    published and its runs leave that server out (``version_servers``), as the runs of the installation that
    exported it do once the server was deleted there; that installation's own export was refused. ``warn`` is
    told of each such server, naming the version and where the content names it."""
    if AgentVersion.objects.filter(agent=agent, number=number).exists():
        raise ApplicationError(
            _("Agent '%(slug)s' has a version %(number)s already.") % {"slug": agent.slug, "number": number},
            code="version_exists",
            status=409,
        )
    if problems := version_content_problems(agent=agent, content=content):
        raise ValidationError({"content": problems})
    if warn is not None:
        for warning in [
            *_missing_servers_warnings(agent, number, content),
            *_unlisted_tools_warnings(agent, number, content),
        ]:
            warn(warning)
    rule_ids = version_rule_ids(agent, content)
    frozen: VersionContent = {
        **content,
        "rules": [{**rule, "rule_id": rule_id} for rule, rule_id in zip(content["rules"], rule_ids, strict=True)],
    }
    version = AgentVersion(
        agent=agent,
        number=number,
        content=frozen,
        digest=content_digest(frozen),
        note=note[:500],
        published_by=actor_label(actor),
    )
    return audited_save(version, actor=actor, via=via, verb="import")


def version_content_problems(
    *, agent: Agent, content: VersionContent | dict[str, Any], stored_here: bool = False, draft: bool = False
) -> list[str]:
    """What a version's frozen content holds that its runs could not use or must not: checked as the agent's own
    settings, rules and contracts are when they are saved (a run takes a version's values as they are). The agent
    settings are validated as the agent's would be (the model's base URL against the address policy, a flow graph
    that loads, the parameters' keys and types); each rule as a rule (its conditions, a params object, a code
    rule that loads); each contract's values as a contract's. An imported version used to be stored unchecked:
    its base URL received the agent's model key, a wrong type failed every run as ``internal``.

    Each value must have its field's type exactly (text a ``str``, a whole number an ``int`` and not a ``bool``):
    ``clean_fields`` converts ``"5"`` to 5 for its check, but the content is stored, and run, as written. A server
    the content names that does not exist is no problem here (``agent_version_import`` warns of it): its runs
    leave it out, as the runs of the installation that published it do.

    ``stored_here``: the content is a version this installation stores (a rollback), not one brought in: its
    rules skip the checks that came after versions were frozen (``_frozen_rule_check``'s ``brought_in``), as a
    stored rule skips them where its value is unchanged; a rule stored before them is frozen as it saves.

    ``draft``: the content is the agent's stored draft, being published: its settings are checked as the stored
    agent's (a check added later applies where a value changes: an agent stored before it publishes as it saves,
    where it was refused at every publish), but for what fails every run whatever its age, a flow graph no longer
    registered."""
    from mcpregistry.gate_records import contract_from_snapshot
    from mcpregistry.models import McpTool, ToolContract

    problems: list[str] = []

    def collect(where: str, exc: ValidationError) -> None:
        for name, messages in exc.message_dict.items():
            problems.extend(f"{where}{'' if name == NON_FIELD_ERRORS else '.' + name}: {m}" for m in messages)

    frozen_agent = content.get("agent") or {}
    probe = Agent(slug=agent.slug, name=agent.name, model_secrets=agent.model_secrets, time_limit_s=agent.time_limit_s)
    if draft:
        probe.pk = agent.pk
        mode, graph = frozen_agent.get("mode"), frozen_agent.get("flow_graph")
        if mode == Agent.Mode.FLOW and graph and graph not in registered_flow_graphs():
            problems.append(
                "agent.flow_graph: "
                + _("flow graph '%(path)s' is not registered; the registered ones are: %(graphs)s")
                % {"path": graph, "graphs": ", ".join(registered_flow_graphs())}
            )
    probe.checked_as_frozen = True  # its max_tokens read as its runs read it (a version frozen with "100")
    # Its flow's server must be one the version binds, as an agent's must be one the agent binds.
    probe.servers_given = [str(mcp_id) for mcp_id in content.get("servers") or []]
    mistyped = _mistyped_fields(Agent, {name: frozen_agent[name] for name in AGENT_FIELDS if name in frozen_agent})
    for name, message in mistyped.items():
        problems.append(f"agent.{name}: {message}")
    for name in AGENT_FIELDS:
        if name in frozen_agent and name not in mistyped:
            setattr(probe, name, frozen_agent[name])
    try:
        probe.clean_fields(
            exclude=[f.name for f in Agent._meta.fields if f.name not in AGENT_FIELDS or f.name in mistyped]
        )
        if not mistyped:  # clean() compares the values; a value of another type would fail it as a TypeError
            probe.clean()
    except ValidationError as exc:
        collect("agent", exc)
    for i, rule in enumerate(content.get("rules") or []):
        where = f"rules[{i}] ({rule.get('name', '')})"
        try:
            _frozen_rule_check(rule, brought_in=not stored_here)
        except ValidationError as exc:
            collect(where, exc)
    for key, snapshot in (content.get("contracts") or {}).items():
        mistyped = _mistyped_fields(ToolContract, snapshot)
        for name, message in mistyped.items():
            problems.append(f"contracts.{key}.{name}: {message}")
        if mistyped:
            continue
        contract = contract_from_snapshot(snapshot)
        try:
            contract.clean_fields(exclude=[f.name for f in ToolContract._meta.fields if f.name not in snapshot])
            contract.clean()
        except ValidationError as exc:
            collect(f"contracts.{key}", exc)
            continue
        except (TypeError, ValueError, AttributeError) as exc:
            problems.append(f"contracts.{key}: {exc}")
            continue
        # The frozen contract has no tool, so what only a tool can say (its fallback, its idempotency argument) is
        # checked against the tool of that name here, where there is one: a key its tool does not take made each
        # unanswered send of an approved write a new write.
        mcp_id, _sep, tool_name = str(key).partition("/")
        tool = None if stored_here else McpTool.objects.filter(server__mcp_id=mcp_id, name=tool_name).first()
        if tool is not None:
            problems.extend(f"contracts.{key}.{name}: {m}" for name, m in contract.tool_problems(tool).items())
    return problems


def _mistyped_fields(model: type[models.Model], values: Mapping[str, Any]) -> dict[str, str]:
    """The values (field name → value) that are not of their model field's type, exactly, each with why: a
    frozen version's value is used as it is written, where ``clean_fields`` would have converted it."""
    mistyped: dict[str, str] = {}
    for name, value in values.items():
        try:
            field = model._meta.get_field(name)
        except FieldDoesNotExist:
            continue
        if not isinstance(field, models.Field):  # a relation's reverse side: no value of its own
            continue
        if value is None:
            if not field.null:
                mistyped[name] = str(field.error_messages["null"])
            continue
        if isinstance(field, models.BooleanField):
            expected, message = isinstance(value, bool), _("Enter true or false.")
        elif isinstance(field, models.IntegerField):
            expected, message = isinstance(value, int) and not isinstance(value, bool), _("Enter a whole number.")
        elif isinstance(field, models.FloatField):
            expected, message = isinstance(value, int | float) and not isinstance(value, bool), _("Enter a number.")
        elif isinstance(field, models.CharField | models.TextField):
            expected, message = isinstance(value, str), _("Enter a text.")
        else:
            continue
        if not expected:
            mistyped[name] = str(message)
    return mistyped


def _missing_servers_warnings(agent: Agent, number: int, content: VersionContent | dict[str, Any]) -> list[str]:
    """A warning for each server the content names (its ``servers``, its rules' and its contracts') that does not
    exist here, naming the version and the places (``agents.versions.version_servers`` leaves such a server out
    of its runs, silently). A server its agent no longer binds is no matter: a version is frozen as published,
    and a rollback re-publishes it so."""
    named: dict[str, list[str]] = {}
    for mcp_id in content.get("servers") or []:
        named.setdefault(str(mcp_id), []).append("servers")
    for i, rule in enumerate(content.get("rules") or []):
        if isinstance(rule, dict) and rule.get("mcp_id"):
            named.setdefault(str(rule["mcp_id"]), []).append(f"rules[{i}] ({rule.get('name', '')})")
    for key in content.get("contracts") or {}:
        named.setdefault(str(key).split("/", 1)[0], []).append(f"contracts.{key}")
    existing = set(McpServer.objects.filter(mcp_id__in=list(named)).values_list("mcp_id", flat=True))
    return [
        _(
            "version %(agent)s v%(number)s names MCP server '%(mcp_id)s' (%(places)s), which does not exist here: "
            "imported as published; its runs leave that server out"
        )
        % {
            "agent": agent.slug,
            "number": number,
            "mcp_id": mcp_id,
            "places": ", ".join(places[:3]) + (", …" if len(places) > 3 else ""),
        }
        for mcp_id, places in sorted(named.items())
        if mcp_id not in existing
    ]


def _unlisted_tools_warnings(agent: Agent, number: int, content: VersionContent | dict[str, Any]) -> list[str]:
    """A warning for each tool the content's rules call that their server, discovered here, does not list, naming
    the version and the rules (``_missing_servers_warnings`` names a server missing altogether). No refusal: an
    old version may name a tool since renamed. But made live, each query such a rule matches fails with
    ``deterministic:tool_unknown``; the same rule in a document's rules section is refused. A server not
    discovered yet has no list to check against."""
    from mcpregistry.models import McpTool

    calls: dict[tuple[str, str], list[str]] = {}
    for i, rule in enumerate(content.get("rules") or []):
        if not isinstance(rule, dict) or rule.get("code") or not rule.get("mcp_id") or not rule.get("tool_name"):
            continue
        calls.setdefault((str(rule["mcp_id"]), str(rule["tool_name"])), []).append(
            f"rules[{i}] ({rule.get('name', '')})"
        )
    listed: dict[str, set[str]] = {}
    discovered: set[str] = set()
    tools = McpTool.objects.filter(server__mcp_id__in={mcp_id for mcp_id, _tool in calls})
    for mcp_id, name, discovered_at in tools.values_list("server__mcp_id", "name", "discovered_at"):
        listed.setdefault(mcp_id, set()).add(name)
        if discovered_at is not None:
            discovered.add(mcp_id)
    return [
        _(
            "version %(agent)s v%(number)s calls tool '%(tool)s' of MCP server '%(mcp_id)s' (%(places)s), which "
            "that server does not list (its tools are: %(names)s): imported as published; made live, each query "
            "that rule matches fails with deterministic:tool_unknown"
        )
        % {
            "agent": agent.slug,
            "number": number,
            "tool": tool,
            "mcp_id": mcp_id,
            "places": ", ".join(places[:3]) + (", …" if len(places) > 3 else ""),
            "names": ", ".join(sorted(listed[mcp_id])),
        }
        for (mcp_id, tool), places in sorted(calls.items())
        if mcp_id in discovered and tool not in listed[mcp_id]
    ]


def _frozen_rule_check(rule: dict[str, Any], *, brought_in: bool) -> None:
    """A frozen rule's values, as ``DeterministicRule.clean`` checks a rule's (without its server's tools: the
    version's run reads those). ``brought_in`` (an imported version, taken unchecked from another installation):
    also as a new rule's, a server and a tool named, no empty keyword (it matched every query), no secret in its
    params (stored, shown on the version's page and exported in clear). A version this installation froze from its
    own stored rules skips those: a rule stored before them saves as it is, and a rollback to the version it was
    frozen in was refused. A rule for a server the version does not bind is no problem here: it stays, and its
    runs fail it as seed 000 says (``agents.selectors.deterministic_rule_specs``)."""
    from pydantic import ValidationError as PydanticValidationError

    from agents.deterministic import WhenSpec, placeholder_problems
    from agents.tools import CodeRuleError, load_code_rule
    from mcpregistry.contracts import spec_problems

    errors: dict[str, list[str]] = {}
    for name in ("name", "mcp_id", "tool_name", "code", "answer_template", "force_first_tool"):
        if not isinstance(rule.get(name, ""), str):
            errors[name] = [str(_("Enter a text."))]
    if rule.get("code"):
        try:
            load_code_rule(str(rule["code"]))
        except CodeRuleError as exc:
            errors["code"] = [str(exc)]
    else:
        # Exactly as given: a run reads them as they are stored (null or a list failed it as ``internal``).
        when, params = rule.get("when", {}), rule.get("params", {})
        if not isinstance(when, dict):
            errors["when"] = [str(_("Enter a JSON object."))]
        else:
            try:
                WhenSpec.model_validate(when)
            except PydanticValidationError as exc:
                errors["when"] = spec_problems(exc, WhenSpec)
        if not isinstance(params, dict):
            errors["params"] = [str(_("Enter a JSON object."))]
        elif isinstance(when, dict) and not errors:
            for field_name, found in placeholder_problems(when, params, str(rule.get("answer_template") or "")).items():
                errors.setdefault(field_name, []).extend(found)
        if brought_in:
            if "when" not in errors and isinstance(when, dict) and (empty := empty_keyword_problems(when)):
                errors["when"] = empty
            if "mcp_id" not in errors and not rule.get("mcp_id"):
                errors["mcp_id"] = [_("Choose the server (or give a code rule).")]
            if "tool_name" not in errors and not rule.get("tool_name"):
                errors["tool_name"] = [_("Name the tool to call (or give a code rule).")]
    params = rule.get("params")
    if brought_in and isinstance(params, dict) and params and (problem := rule_params_secret_problem(params)):
        errors.setdefault("params", []).append(problem)
    if brought_in and "when" not in errors and (problem := rule_context_secret_problem(rule.get("when"))):
        errors.setdefault("when", []).append(problem)
    if errors:
        raise ValidationError(errors)


def agent_shadow_set(*, agent: Agent, actor: Any, via: str, version: AgentVersion | None, rate: float) -> Agent:
    """Name the candidate version sampled live runs are shadowed on (None: no shadow) and the sample rate. Raises
    ValidationError (``shadow_version``) for another version than the stored one that can no longer run
    (``version_unrunnable_problem``): every shadow run would fail."""
    with transaction.atomic(), change_scope(actor=actor, via=via):
        stored = Agent.objects.filter(pk=agent.pk).values_list("shadow_version_id", flat=True).first()
        _version_change_checked(version, before_id=stored, field="shadow_version")
        return audited_save(agent, actor=actor, via=via, data={"shadow_version": version, "shadow_sample_rate": rate})


def agent_version_rollback(*, version: AgentVersion, actor: Any, via: str) -> AgentVersion:
    """Roll back to ``version``: its content is published again as a new version (the history only grows; the
    agent's draft is left as it is).

    Raises ValidationError where ``version_content_problems`` finds any: content frozen long ago is checked as an
    imported version's is (a flow graph or a code rule no longer registered, a base URL the address policy now
    refuses), since its runs would fail or do what is no longer allowed. Its rules are not judged as new ones
    (``stored_here``): the version is stored here, frozen from this installation's rules or checked on import,
    and a rule stored before a check is frozen as it saves."""
    if problems := version_content_problems(agent=version.agent, content=version.content, stored_here=True):
        raise ValidationError({"content": problems})
    return agent_version_publish(
        agent=version.agent,
        actor=actor,
        via=via,
        note=f"roll back to v{version.number}",
        content=version.content,  # type: ignore[arg-type]
    )


def agent_arm_create(*, actor: Any, via: str, data: Mapping[str, Any]) -> AgentArm:
    """Add an A/B arm (a version of the agent and its weight). An agent with arms of positive weight splits
    its live traffic between them, sticky per caller; without, it runs its live version. Raises ValidationError
    (``version``) for a version that can no longer run (``version_unrunnable_problem``): every run of the arm
    would fail."""
    with transaction.atomic(), change_scope(actor=actor, via=via):
        arm = audited_save(AgentArm(), actor=actor, via=via, data=data)
        _version_change_checked(arm.version, before_id=None, field="version")  # on the row as validated
    return arm


def agent_arm_update(*, arm: AgentArm, actor: Any, via: str, data: Mapping[str, Any] | None = None) -> AgentArm:
    """Change an arm (``arm`` may carry the changes, as the admin's form instance does). Raises ValidationError
    (``version``) where it moves to another version that can no longer run; an arm whose version went bad
    meanwhile still saves a change of its weight or name (a weight of 0 takes it off live traffic)."""
    with transaction.atomic(), change_scope(actor=actor, via=via):
        before = AgentArm.objects.filter(pk=arm.pk).values_list("version_id", flat=True).first()
        audited_save(arm, actor=actor, via=via, data=data)
        _version_change_checked(arm.version, before_id=before, field="version")
    return arm


def agent_arm_delete(*, arm: AgentArm, actor: Any, via: str) -> None:
    audited_delete(arm, actor=actor, via=via)


def run_version_choice(
    *,
    agent: Agent,
    api_key: ApiKey | None,
    context: dict[str, Any] | None,
    version: int | None,
    purpose: str,
    parts: SubmissionParts | None = None,
) -> tuple[AgentVersion | None, str]:
    """Which version a new run runs, and under which A/B arm: the version asked for (``version``: its number;
    an eval's choice), else for live traffic the caller's sticky arm when the agent has arms of positive
    weight, else the agent's live version (None: never published, the run runs the agent as stored).
    ``parts``: the agent's arms and live version as the caller has them (``agents.config_cache``).

    Raises ApplicationError 404 for a version number the agent does not have."""
    if version is not None:
        chosen = AgentVersion.objects.filter(agent=agent, number=version).first()
        if chosen is None:
            raise ApplicationError(
                _("Agent '%(slug)s' has no version %(number)s.") % {"slug": agent.slug, "number": version},
                code="version_not_found",
                status=404,
            )
        return chosen, ""
    if purpose == Run.Purpose.LIVE:
        if parts is not None:
            arms = parts.arms
        else:
            arms = {arm.name: arm for arm in agent.arms.filter(weight__gt=0).select_related("version")}
        if arms:
            key = caller_key(agent_slug=agent.slug, api_key_id=api_key.pk if api_key else None, context=context)
            name = pick_arm([(arm.name, arm.weight) for arm in arms.values()], key)
            if name is not None:
                return arms[name].version, name
    return (parts.live_version if parts is not None else agent.live_version), ""


def request_digest(body: Any) -> str:
    """SHA-256 of a JSON body in canonical form (keys sorted, no insignificant whitespace): two bodies that
    mean the same have the same digest, whatever their key order or spacing."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class RunSubmission:
    run: Run
    # True when an earlier request with the same Idempotency-Key created the run: nothing new was queued.
    replayed: bool


# A submission refused for a secret that cannot be decrypted: asking again helps only once an operator has fixed the
# keys, so not sooner than this (the API's every 503 says when to ask again).
SECRET_UNREADABLE_RETRY_AFTER_S = 60


@contextmanager
def secrets_readable_or_refused() -> Iterator[None]:
    """A submission that meets a secret this process cannot decrypt (the agent's model key, a binding's env or
    headers, read with the configuration: ``SecretDecryptionError``) is refused as what it is, a 503
    ``config:secret_unreadable`` telling an operator to check ``SECRETS_ENCRYPTION_KEYS``, not a 500; neither the
    answer nor the log holds the secret (the error names the setting; the log, for the operator, also the servers
    and agents whose secrets cannot be decrypted)."""
    try:
        yield
    except SecretDecryptionError as exc:
        rows = _secrets_unreadable_rows()
        logger.error("a run submission was refused: %s%s", exc, f" (the secrets of {rows})" if rows else "")
        raise secret_unreadable_refusal() from None


def _secrets_unreadable_rows(most: int = 20) -> str:
    """The servers (by ``mcp_id``) and agents (by slug) whose stored secrets this process cannot decrypt, for the
    log line of a refused submission: the error raised where a secret was used names no row."""
    rows = [
        *(f"server {s.mcp_id}" for s in McpServer.objects.only("mcp_id", "env", "headers") if not s.secrets_readable()),
        *(f"agent {a.slug}" for a in Agent.objects.only("slug", "model_secrets") if not readable(a.model_secrets)),
    ]
    return ", ".join(rows[:most]) + (" …" if len(rows) > most else "")


def secret_unreadable_refusal(message: str | None = None) -> ApplicationError:
    """The 503 ``config:secret_unreadable`` (with ``Retry-After``) of a request that needs a secret this process
    cannot decrypt: ``message``, by default the configuration's (an operator must check
    ``SECRETS_ENCRYPTION_KEYS``)."""
    return ApplicationError(
        message
        or _(
            "A secret stored in the platform's configuration cannot be decrypted with this server's keys; an "
            "operator must check SECRETS_ENCRYPTION_KEYS."
        ),
        code=SECRET_UNREADABLE,
        status=503,
        headers={"Retry-After": str(SECRET_UNREADABLE_RETRY_AFTER_S)},
    )


@secrets_readable_or_refused()
def run_submit(
    *,
    agent_slug: str,
    query: str,
    api_key: ApiKey | None,
    context: dict[str, Any] | None = None,
    a2a_data: list[dict[str, Any]] | None = None,
    a2a_files: list[dict[str, Any]] | None = None,
    idempotency_key: str = "",
    digest: str = "",
    former_key: str = "",
    former_digests: tuple[str, ...] = (),
) -> RunSubmission:
    """Create a queued run (``run_create``), once per ``(api_key, idempotency_key)``.

    The same key with the same ``digest`` (of the request body) returns the run the first request created;
    with another digest it is a 409. ``former_key``: the key the same request was stored under before its form
    changed (A2A's ``a2a:<messageId>``): a run found there is replayed only for the same digest (another request
    may have used that text as its own key), so a retry across an upgrade is not run twice. ``former_digests``:
    what the same request's digest was before its form changed (the REST API took it of the body's bytes until
    2026-12-07): a run stored with one of them is the same request's, replayed, not a 409.

    Two identical requests racing are serialized on the API key's row (``SELECT … FOR UPDATE`` on PostgreSQL;
    SQLite's ``BEGIN IMMEDIATE`` takes the write lock at the start of the transaction), so only one of them
    creates the run.

    A replay is answered only while the key may still submit to the agent (``run_submission_parts``, as
    ``run_create`` checks a new submission): a key taken off the agent, or an agent disabled since, gets the 404 or
    409 a new submission gets, never the earlier run's answer by replaying its request.

    Raises ApplicationError 503 ``config:secret_unreadable`` where a stored secret cannot be decrypted
    (``secrets_readable_or_refused``)."""
    if not idempotency_key or api_key is None:
        run = run_create(
            agent_slug=agent_slug,
            query=query,
            api_key=api_key,
            context=context,
            a2a_data=a2a_data,
            a2a_files=a2a_files,
            digest=digest,
        )
        return RunSubmission(run=run, replayed=False)
    with transaction.atomic():
        if connection.features.has_select_for_update:  # SQLite's transaction holds the write lock already
            # FOR NO KEY UPDATE: it serialises the key's idempotent submissions, but not the key-share lock a
            # submission without an Idempotency-Key takes on the key's row when its run's (deferred) foreign key is
            # checked at commit, after it reserved its budget: FOR UPDATE made the two a deadlock, one of them a
            # 503 "database not available", whenever a budgeted key was used with and without the header at once.
            ApiKey.objects.select_for_update(no_key=True).filter(pk=api_key.pk).values_list("pk", flat=True).first()
        earlier = _earlier_submission(api_key_id=api_key.pk, idempotency_key=idempotency_key)
        if earlier is None and former_key:
            former = _earlier_submission(api_key_id=api_key.pk, idempotency_key=former_key)
            earlier = former if former is not None and former[1] == digest else None
        if earlier is not None:
            run_submission_parts(agent_slug=agent_slug, api_key=api_key)
            earlier_pk, earlier_digest = earlier
            if earlier_digest != digest and earlier_digest not in former_digests:
                raise ApplicationError(
                    _("This Idempotency-Key was used with another request body."),
                    code="idempotency_key_reused",
                    status=409,
                )
            return RunSubmission(run=Run.objects.select_related("agent").get(pk=earlier_pk), replayed=True)
        run = run_create(
            agent_slug=agent_slug,
            query=query,
            api_key=api_key,
            context=context,
            a2a_data=a2a_data,
            a2a_files=a2a_files,
            idempotency_key=idempotency_key,
            digest=digest,
        )
        return RunSubmission(run=run, replayed=False)


_EARLIER_SUBMISSION: dict[str, str] = {}


def _earlier_submission(*, api_key_id: Any, idempotency_key: str) -> tuple[Any, str] | None:
    """The id and request digest of the run this API key created with this Idempotency-Key, if any (the whole run,
    with its agent for the answer, is read for a replay alone): a statement made once per database, read from the
    index ``run_key_idempotency_idx`` (the ORM would compile it on every POST that sends a key)."""
    sql = _EARLIER_SUBMISSION.get(connection.vendor)
    if sql is None:
        quote = connection.ops.quote_name
        column = {name: quote(str(Run._meta.get_field(name).column)) for name in _EARLIER_COLUMNS}
        sql = _EARLIER_SUBMISSION[connection.vendor] = (
            f"SELECT {column['id']}, {column['request_digest']} FROM {quote(Run._meta.db_table)} "  # noqa: S608 - the model's names
            f"WHERE {column['api_key']} = %s AND {column['idempotency_key']} = %s ORDER BY {column['created_at']} LIMIT 1"
        )
    with connection.cursor() as cursor:
        cursor.execute(sql, [api_key_id, idempotency_key])
        row = cursor.fetchone()
    if row is None:
        return None
    return Run._meta.get_field("id").to_python(row[0]), row[1]


_EARLIER_COLUMNS = ("id", "request_digest", "api_key", "idempotency_key", "created_at")


def run_input_guarded(value: Any, secrets: list[str]) -> Any:
    """A caller's input (a query, its context, its data or files) as a run stores and the rules read it: composed
    (``agents.deterministic.nfc``: the same words typed on any keyboard meet the same rules and reach the tools the
    same) and masked (``_caller_input_masked``). The rule tester reads its input through this too."""
    return _caller_input_masked(nfc_value(value), secrets)


def _caller_input_masked(value: Any, secrets: list[str]) -> Any:
    """``value`` masked by the audit's own rules (``audit.masking.mask_value``: secret key names, name/value
    entries and header pairs, one-time codes, known secrets and value patterns), so the run a caller reads back
    hides what its audit rows hide. One exemption: the value under a session's id (``sessionId``, ``session_id``)
    is masked as any other value, not hidden whole: it names a conversation, not a credential, and rules and
    tool params read it (``{context.sessionId}``); a key that merely holds "session" (``session_token``) is one."""
    masked = mask_value(value, secrets=secrets)
    # Walk the input and its masked copy side by side (the copy keeps every container's order and length).
    pairs: list[tuple[Any, Any]] = [(value, masked)]
    while pairs:
        given, shown = pairs.pop()
        if isinstance(given, dict) and isinstance(shown, dict) and len(given) == len(shown):
            for (key, item), shown_key in zip(given.items(), list(shown), strict=True):
                if shown[shown_key] == MASK and _session_id_key(key):
                    shown[shown_key] = mask_value(item, secrets=secrets)
                else:
                    pairs.append((item, shown[shown_key]))
        elif isinstance(given, list) and isinstance(shown, list) and len(given) == len(shown):
            pairs.extend(zip(given, shown, strict=True))
    return masked


def run_context_id_check(*, given: Mapping[str, Any], guarded: Mapping[str, Any]) -> None:
    """Refuse a conversation's id (``contextId``) that the input guardrail would change (``guarded``: ``given`` as
    ``run_input_guarded`` keeps it): one that looks like a secret (``sk-…``, ``ghp_…``, ``AKIA…``, ``password=…``)
    or holds a bound one. Stored masked it named another conversation: every such id of a key became "***", one
    conversation, whose history each of them was given, and none was found again by its own id. Every door
    (REST, A2A, MCP, a command, an eval) submits through ``run_create``, so each refuses it, in its own words for
    bad input. Raises ApplicationError 400 ``invalid_input`` naming ``context.contextId``; never echoes the id."""
    context_id = given.get("contextId")
    if not isinstance(context_id, str) or guarded.get("contextId") == nfc_value(context_id):
        return
    message = _(
        "The contextId looks like a secret (an API key, a token or a password), which the platform never stores: "
        "name the conversation with an id that holds none."
    )
    raise ApplicationError(message, code="invalid_input", status=400, fields={"context": {"contextId": [message]}})


def _session_id_key(key: Any) -> bool:
    """Whether a key names a session's id (``sessionId``, ``session_id``, ``SESSION-ID``)."""
    return isinstance(key, str) and key.lower().replace("_", "").replace("-", "") == "sessionid"


def run_query_check(query: Any) -> None:
    """Raises ApplicationError 413 for a query longer than ``PLATFORM_RUN_QUERY_MAX_CHARS``, whoever submits it (an
    API caller, A2A, MCP, an eval, a command). Counted as it is stored, composed (``nfc``): Korean typed decomposed
    (macOS) was refused at some 40% of the limit, told it was past it."""
    if isinstance(query, str) and len(nfc(query)) > settings.PLATFORM_RUN_QUERY_MAX_CHARS:
        raise ApplicationError(
            _("The query is longer than %(max)d characters.") % {"max": settings.PLATFORM_RUN_QUERY_MAX_CHARS},
            code="query_too_long",
            status=413,
        )


def run_submission_parts(*, agent_slug: str, api_key: ApiKey | None) -> tuple[Agent, SubmissionParts]:
    """The agent and the configuration a submission to it reads (``submission_parts``), once the key may use the
    agent and the agent is enabled. Raises ApplicationError 404 (no such agent, or not one this key may use: the same
    answer, so a key learns nothing of agents outside its scope) and 409 (agent disabled)."""
    parts = submission_parts(agent_slug=agent_slug, api_key=api_key)
    agent = parts.agent
    if agent is None or not parts.key_may_use:
        raise ApplicationError(
            _("Agent '%(slug)s' not found.") % {"slug": agent_slug}, code="agent_not_found", status=404
        )
    if not agent.enabled:
        raise ApplicationError(
            _("Agent '%(slug)s' is disabled.") % {"slug": agent_slug}, code="agent_disabled", status=409
        )
    return agent, parts


def run_create(
    *,
    agent_slug: str,
    query: str,
    api_key: ApiKey | None,
    context: dict[str, Any] | None = None,
    a2a_data: list[dict[str, Any]] | None = None,
    a2a_files: list[dict[str, Any]] | None = None,
    idempotency_key: str = "",
    digest: str = "",
    version: int | None = None,
    purpose: str = Run.Purpose.LIVE,
    write_sandbox: Iterable[str] = (),
    dispatch: bool = True,
) -> Run:
    """Create a queued run and dispatch it to a worker once the transaction commits (``run_dispatch``: with the
    agent's time limits; a broker that cannot be reached leaves the run queued for the reconciler, never an
    error to the caller, since the run exists). ``dispatch=False``: the caller executes it itself
    (``run_query --inline``; a worker took the run first and ran it under its own code and settings, and with
    none running the message waited on the broker for the next); a caller that dies first leaves it queued for the
    reconciler.

    The run records the version it runs (``run_version_choice``): ``version`` (a number) runs that published
    version, e.g. for an eval (``purpose="eval"``, whose writes the gate blocks outside ``write_sandbox``, a list
    of MCP server ids); otherwise live traffic runs the caller's A/B arm or the agent's live version.

    Raises ApplicationError 400 (a ``contextId`` that looks like a secret: ``run_context_id_check``), 404 (no such
    agent, not one this key may use, or no such version) and 409 (agent disabled). What it reads of the
    configuration (the agent, the key's agents, arms, versions, servers' secrets, budgets) is this process's copy
    while the configuration has not changed (``agents.config_cache``)."""
    run_query_check(query)
    agent, parts = run_submission_parts(agent_slug=agent_slug, api_key=api_key)
    # Input guardrail: a secret a caller pastes (or one bound to the platform) is never stored or shown.
    secrets = parts.server_secrets
    guarded_context = run_input_guarded(context or {}, secrets)
    run_context_id_check(given=context or {}, guarded=guarded_context)
    chosen, arm = run_version_choice(
        agent=agent, api_key=api_key, context=context, version=version, purpose=purpose, parts=parts
    )
    with transaction.atomic():
        run = Run(
            version=chosen,
            arm=arm,
            purpose=purpose,
            write_sandbox=sorted(write_sandbox),
            agent=agent,
            api_key=api_key,
            query=run_input_guarded(query, secrets),
            context=guarded_context,
            a2a_data=run_input_guarded(a2a_data or [], secrets),
            a2a_files=run_input_guarded(a2a_files or [], secrets),
            idempotency_key=idempotency_key,
            request_digest=digest,
            # The trace that created it (the request's span), for its later passes to link to: part of the INSERT.
            traceparent=traceparent_current(),
        )
        _RUN_INSERT.insert([run])
        # Refused (429 budget_exceeded, rolling the run back) when a budget of the key or the agent is spent.
        budget_reserve(run=run, agent=agent, api_key=api_key, budgets=parts.budgets)
        time_limit_s, run_purpose = agent.time_limit_s, run.purpose
        if dispatch:
            transaction.on_commit(
                lambda: run_dispatch(run_id=str(run.id), time_limit_s=time_limit_s, purpose=run_purpose)
            )
    return run


CANCELLABLE = RUN_IN_FLIGHT_STATUSES


@transaction.atomic
def run_cancel(*, run: Run, actor: str, source: Literal["admin", "api", "eval"] = "admin") -> Run:
    """Cancel a run that has not finished. Compare-and-swap on the status (and lease) it was read with (read again
    if it changed in between), so that what follows depends on the status it really had:

    - ``queued``: it never starts (a worker's claim only takes ``queued`` runs);
    - ``awaiting_approval``: its pending approvals expire (a later decision is a 409) and it is not resumed;
    - ``running``: its worker stops at the next step (the engine checks between model and tool steps); a
      tool call already under way finishes first. The worker's final write only applies to a ``running`` run
      it holds, so it never overwrites the cancellation (``agents.execution``). A run whose lease has lapsed has
      no worker left to stop (it died): it is cancelled as a parked run is.

    The approvals it will never use end ``expired`` ("the run was cancelled"), each audited ``approval.unused``
    (``agents.run_state.approvals_unused``): those waiting for a person, and, where no live worker holds the run,
    those approved and not carried out (and one its dead worker claimed ends ``outcome_unknown``).

    A ``status`` event (``cancelled``) is appended where no live worker holds the run; a live worker appends its own
    when it stops, and the run's ``lease_expires_at`` is left at the end of that worker's hard time limit, by which
    the reconciler appends it if the worker died first (``agents.reconciler``). Its budgets are settled likewise: at
    once where no live worker holds the run, else by that worker as it stops (a model call it has out still spends
    the reservation) or by the reconciler at that limit. Audited as ``run.cancel`` under
    ``source`` (``api`` when an API caller cancels, the key as ``actor``), with the approvals it ended. Returns the
    run, fresh. Raises ApplicationError 409 for a finished run."""
    now = timezone.now()
    cancelled_from: str | None = None
    worker_due: datetime | None = None  # when a live worker that holds the run is surely gone (its hard limit)
    for _attempt in range(5):
        current = (
            Run.objects.filter(pk=run.pk)
            .values("status", "lease_expires_at", "pass_started_at", "agent__time_limit_s")
            .first()
        )
        if current is None or current["status"] not in CANCELLABLE:
            run.refresh_from_db()
            raise ApplicationError(
                _("The run has already finished (%(status)s).") % {"status": Run.Status(run.status).label},
                code="run_finished",
                status=409,
            )
        lease = current["lease_expires_at"]
        worker_due = None
        if current["status"] == Run.Status.RUNNING and lease is not None and lease > now:
            _soft, hard = run_time_limits(current["agent__time_limit_s"])
            worker_due = (current["pass_started_at"] or now) + timedelta(seconds=hard)
        # On the lease too: whether a live worker holds the run is decided on the lease as read.
        swapped = Run.objects.filter(pk=run.pk, status=current["status"], lease_expires_at=lease).update(
            status=Run.Status.CANCELLED,
            finished_at=now,
            lease_expires_at=worker_due,
            error_code="cancelled",
            error_message=f"cancelled by {actor}",  # stored: not translated
        )
        if swapped == 1:
            cancelled_from = current["status"]
            break
    if cancelled_from is None:  # its status kept changing under us
        raise ApplicationError(_("The run is changing state; try again."), code="run_busy", status=409)
    # A run that will never run again takes its approvals with it: those waiting for a person, and, where no live
    # worker holds the run (queued to resume, parked, its worker dead), those approved but not yet carried out
    # (they used to stay "approved" for good). A live worker may be claiming one: it finishes that call first, and
    # ends what it leaves when it stops (``agents.execution._stopped_by_cancellation``).
    if worker_due is None and cancelled_from == Run.Status.RUNNING:
        approvals_interrupted(run_id=run.pk, why="cancelled")  # its worker is gone mid-call
    carried_on = (
        list(Approval.objects.filter(run_id=run.pk, status=Approval.Status.APPROVED).values_list("pk", flat=True))
        if worker_due is not None
        else []
    )
    expired = approvals_unused(run_id=run.pk, why="cancelled", keep=carried_on, reason=CANCELLED_APPROVAL)
    ended = Approval.objects.filter(run_id=run.pk, status=Approval.Status.EXPIRED, reason=CANCELLED_APPROVAL)
    # Settled with the ``cancelled`` event (``RunEventWriter.emit_cancelled``): now where no worker holds the run,
    # charged for the model calls it made (their events). A live worker may have a model call out that spends up to
    # what the reservation allows: released now, that room was let to a new run while the call still spent it, and
    # the period passed its limit. Its reservation holds until that worker records the run's end, or the reconciler
    # does once that worker's time is up (step 7).
    if worker_due is None:
        RunEventWriter(run_id=run.pk, secrets=[]).emit_cancelled()
    audit_event_record(
        source=source,
        action="run.cancel",
        run_id=run.pk,
        args={
            "from_status": cancelled_from,
            "approvals_expired": expired,
            "approval_ids": [str(pk) for pk in ended.order_by("created_at").values_list("pk", flat=True)],
        },
        actor=actor,
    )
    run.refresh_from_db()
    return run


FeedbackScale = Literal["signed", "five"]


def feedback_normalized(*, score: float, scale: FeedbackScale | None) -> tuple[float, FeedbackScale]:
    """A caller's satisfaction score on -1..1 (``signed``) or 1..5 (``five``, whole numbers), as -1..1. Without
    a scale, a score within -1..1 is read as ``signed`` and a whole 2..5 as ``five`` (a five-point 1 must say
    ``"scale": "five"``). Raises ApplicationError 400 for anything else."""
    if scale is None:
        scale = "signed" if -1.0 <= score <= 1.0 else "five"
    if scale == "signed" and -1.0 <= score <= 1.0:
        return float(score), scale
    if scale == "five" and float(score).is_integer() and 1 <= score <= 5:
        return (float(score) - 3.0) / 2.0, scale
    raise ApplicationError(
        _("A score is a number from -1 to 1, or a whole number from 1 to 5."),
        code="invalid_input",
        status=400,
        fields={"score": [_("Out of range for its scale.")]},
    )


def run_feedback_record(*, run: Run, score: float, scale: FeedbackScale | None, comment: str, actor: str) -> Run:
    """Record a caller's satisfaction with a finished run (a later score replaces an earlier one), normalized to
    -1..1, with the comment masked. Audited as ``run.feedback`` under source ``api`` with the caller's key as
    ``actor``. Raises ApplicationError 400 (bad score) and
    409 (the run has not finished)."""
    value, used = feedback_normalized(score=score, scale=scale)
    if not run.is_finished:
        raise ApplicationError(_("Feedback is given on a finished run."), code="run_not_finished", status=409)
    # Its servers' secrets, those this process can read (one it cannot is no value it could leak).
    secrets = [v for server in run.agent.servers.all() if server.secrets_readable() for v in server.secret_values()]
    with transaction.atomic():
        Run.objects.filter(pk=run.pk).update(
            feedback_score=value,
            feedback_scale=used,
            feedback_comment=mask_text(comment, secrets=secrets),
            feedback_at=timezone.now(),
        )
        audit_event_record(
            source="api",
            action="run.feedback",
            run_id=run.pk,
            args={"score": value, "scale": used, "arm": run.arm},
            actor=actor,
        )
    run.refresh_from_db()
    return run
