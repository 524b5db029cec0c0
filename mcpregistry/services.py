"""Services for MCP bindings: every change to a server, its secrets, its tools and their contracts, and
discovery (which changes tools) — each writes the change and its audit event in one transaction.

Every function takes ``actor`` (a user, an API key or ``"system:<command>"``) and ``via`` (the path:
``admin``, ``import_config``, ``seed_demo``, ``mcp_discover``, ...). ``data`` maps field names to new values;
validation errors are Django's ``ValidationError`` (nothing is written then).
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from cryptography.fernet import InvalidToken
from django.apps import apps
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, models, transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from agent_platform.text import grapheme_cut, nfc, plain_text
from audit.change_guard import policy_of
from audit.changes import (
    CONFIG_ACTION_PREFIX,
    ChangeAudit,
    audited_delete,
    audited_save,
    change_scope,
    config_change_record,
    instance_changes,
)
from audit.masking import (
    MASK,
    MIN_SECRET_LENGTH,
    credential_like,
    mask_known,
    mask_text,
    register_secrets,
    storable_text,
)
from audit.services import audit_event_record
from audit.visible import invisible_characters
from mcpregistry.contracts import SCHEMA_MAX_DEPTH, argument_constraints, contract_defaults, schema_problem
from mcpregistry.crypto import PREFIX, EncryptedJSONField, SecretDecryptionError, decrypt_json, rotate_token
from mcpregistry.embeddings import refresh_after_discovery
from mcpregistry.models import McpServer, McpTool, RequestCategory, ToolContract
from mcpregistry.signals import (
    registry_contracts_changed_send,
    registry_contracts_changing,
    rules_left_failing,
    secrets_kept_elsewhere,
    tool_name_problems,
    tool_names_taken_elsewhere,
)


def mcp_server_create(*, actor: Any, via: str, data: Mapping[str, Any]) -> McpServer:
    """Bind a server. ``data`` holds its fields (``env``/``headers`` as maps of secret values)."""
    return audited_save(McpServer(), actor=actor, via=via, data=data)


def mcp_server_update(*, server: McpServer, actor: Any, via: str, data: Mapping[str, Any] | None = None) -> McpServer:
    """Change a binding (``server`` may already carry the changes, as an admin form's instance does). A secret
    shows in the audit as ``set``/``changed``/``cleared`` per name, never as a value.

    Raises ValidationError (``mcp_id``, nothing written) for a change of the server's id: published agent
    versions, code rules, agents' context and flow options, configuration documents and the audit name the server
    by it, so a renamed server was lost to all of them (every run of a live version failed
    ``mcp:not_loaded:<old id>``, the save said nothing). A server under another id is bound anew."""
    stored_id = McpServer.objects.filter(pk=server.pk).values_list("mcp_id", flat=True).first()
    asked_id = (data or {}).get("mcp_id", server.mcp_id)
    if stored_id is not None and asked_id != stored_id:
        raise ValidationError({"mcp_id": [mcp_id_fixed_text()]})
    return audited_save(server, actor=actor, via=via, data=data)


def mcp_id_fixed_text() -> str:
    """Why a bound server's MCP id cannot change (``mcp_server_update``; the server's page shows the id read-only)."""
    return str(
        _(
            "A bound server's MCP id cannot be changed: published agent versions, code rules, configuration "
            "documents and the audit name the server by it. Bind a new server under the new id instead."
        )
    )


def mcp_server_delete(*, server: McpServer, actor: Any, via: str) -> None:
    """Unbind a server, with its tools and their contracts (the event counts what went)."""
    audited_delete(server, actor=actor, via=via)


def _encrypted_fields(model: type[models.Model]) -> list[Any]:
    """The encrypted fields stored in ``model``'s own table (a proxy or unmanaged model has none of its own)."""
    if model._meta.proxy or not model._meta.managed:
        return []
    return [f for f in model._meta.local_concrete_fields if isinstance(f, EncryptedJSONField)]


ROTATE_BATCH = 500


@dataclass
class SecretsRotation:
    """What ``secrets_rotate`` did, per model label: rows re-encrypted (not those the newest key encrypted already),
    and the rows that no configured key decrypts (left as they were: their key is missing from
    ``SECRETS_ENCRYPTION_KEYS``), each named by its id and, a configuration row, its natural key: ``3 (billing)``."""

    rotated: dict[str, int] = field(default_factory=dict)
    unreadable: dict[str, list[str]] = field(default_factory=dict)


@transaction.atomic
def secrets_rotate(*, actor: Any, via: str) -> SecretsRotation:
    """Re-encrypt every stored secret with the newest key of ``SECRETS_ENCRYPTION_KEYS``: every encrypted field of
    every model (``EncryptedJSONField``: a binding's env and headers, an agent's model secrets, an approval's exact
    arguments, whichever app declares them), so that the older keys can be retired. The values do not change.
    Works on the stored ciphertext (Fernet's own rotation), column by column, row by row (locked where the database
    can). A row whose secrets the newest key encrypted already is left alone (neither written nor recorded): run
    twice, the second run re-encrypts nothing. Returns the rows re-encrypted per model (each model that has
    encrypted fields), and the rows that no configured key decrypts: those are left as they are and reported, never
    a reason to stop the others.

    Recorded: a configuration row (a binding, an agent) whose secrets hold names gets its own event
    (``config.<entity>.rotate_secrets``, naming the re-encrypted names, never a value); rows that are not
    configuration (approvals) one event per model, counting them (``config.<model>.rotate_secrets``)."""
    report = SecretsRotation()
    counts = report.rotated
    quote = connection.ops.quote_name
    lock = " FOR UPDATE" if connection.features.has_select_for_update else ""
    with change_scope(actor=actor, via=via) as scope:
        for model in apps.get_models():
            fields = _encrypted_fields(model)
            if not fields:
                continue
            label = model._meta.label_lower
            table, pk = quote(model._meta.db_table), model._meta.pk
            assert pk is not None
            key = quote(str(pk.column))
            columns = [quote(f.column) for f in fields]
            configuration = isinstance(policy_of(model), ChangeAudit)
            counts[label], last = 0, None
            while True:
                where = f" WHERE {key} > %s" if last is not None else ""
                with connection.cursor() as cursor:
                    cursor.execute(
                        f"SELECT {key}, {', '.join(columns)} FROM {table}{where}"  # noqa: S608
                        f" ORDER BY {key} LIMIT {ROTATE_BATCH}{lock}",
                        [last] if last is not None else [],
                    )
                    rows = cursor.fetchall()
                for row_pk, *stored in rows:
                    last = row_pk
                    try:
                        rotated = [_rotated(v) for v in stored]
                    except InvalidToken:
                        report.unreadable.setdefault(label, []).append(_row_named(model, row_pk, configuration))
                        continue
                    if rotated == stored:
                        continue
                    with connection.cursor() as cursor:
                        cursor.execute(
                            f"UPDATE {table} SET {', '.join(f'{c} = %s' for c in columns)}"  # noqa: S608
                            f" WHERE {key} = %s",
                            [*rotated, row_pk],
                        )
                    counts[label] += 1
                    if configuration:
                        _record_row_rotation(model, row_pk, fields, rotated)
                if len(rows) < ROTATE_BATCH:
                    break
            if counts[label] and not configuration:
                unreadable = len(report.unreadable.get(label, []))
                audit_event_record(
                    source="admin",
                    action=f"{CONFIG_ACTION_PREFIX}{model._meta.model_name}.rotate_secrets",
                    args={"rows": counts[label], **({"unreadable": unreadable} if unreadable else {})},
                    result={"model": label, "count": counts[label], "via": scope.via},
                    actor=scope.actor,
                )
    return report


def _row_named(model: type[models.Model], row_pk: Any, configuration: bool) -> str:
    """A row of ``secrets_rotate``'s report: its id, and a configuration row's natural key (a server's ``mcp_id``,
    an agent's slug: what it is shown as) where it has one."""
    obj = model._base_manager.filter(pk=row_pk).first() if configuration else None
    name = str(obj) if obj is not None else ""
    return f"{row_pk} ({name})" if name and name != str(row_pk) else str(row_pk)


def _rotated(value: Any) -> Any:
    """A stored secret column's value re-encrypted with the newest key (as it is where that key encrypted it
    already); a map with nothing in it stored empty, as a save now stores it (encrypted before that, a row with no
    secret was named unreadable once its key was lost). Raises InvalidToken where no configured key decrypts it."""
    if not (isinstance(value, str) and value.startswith(PREFIX)):
        return value
    rotated = rotate_token(value)
    return "" if decrypt_json(rotated) == {} else rotated


def _record_row_rotation(model: type[models.Model], row_pk: Any, fields: list[Any], tokens: list[Any]) -> None:
    """The event of one configuration row's re-encryption: the names its secret maps hold (none: no event)."""
    names = {}
    for model_field, token in zip(fields, tokens, strict=True):
        value = decrypt_json(token) if isinstance(token, str) and token.startswith(PREFIX) else {}
        if isinstance(value, dict) and value:
            names[model_field.name] = sorted(value)
    obj = model._base_manager.filter(pk=row_pk).first()
    if names and obj is not None:
        config_change_record(obj=obj, verb="rotate_secrets", diff={k: {"re-encrypted": v} for k, v in names.items()})


def mcp_tool_create(
    *, server: McpServer, name: str, actor: Any, via: str, data: Mapping[str, Any] | None = None
) -> McpTool:
    """Register a tool before discovery has listed it (a contract imported as code); discovery fills it in.
    Raises ValidationError (nothing written) for a name discovery would not take from a server either
    (``tool_name_problem``). Whether the server has the tool is the caller's to check: ``import_config`` refuses a
    name a discovered server did not list."""
    if problem := tool_name_problem(name):
        raise ValidationError({"name": [problem]})
    return audited_save(McpTool(server=server, name=name), actor=actor, via=via, data=data, validate=False)


# A change of a contract or of whether a tool can be called is announced (``mcpregistry.signals``) in its
# transaction: agents that publish on save freeze a new version with it.


# A tool's own settings, what a person (the tool's admin page) or a document (``import_config``, which sets what
# approving a pending review restores) changes; the rest of the row is what discovery found on the server.
TOOL_SETTINGS = frozenset({"enabled", "enabled_before_review", "tags", "example_queries"})


def tool_enable_refused() -> str:
    """Why a tool waiting for a review cannot be enabled by a save (the tool's page and ``mcp_tool_update``)."""
    return _(
        "This tool waits for a review of what its server changed or added; only approving the review (the action "
        "“Approve reviewed changes” in the list of tools) enables it."
    )


@transaction.atomic
def mcp_tool_update(*, tool: McpTool, actor: Any, via: str, data: Mapping[str, Any] | None = None) -> McpTool:
    """Change a tool's settings as an admin may (``TOOL_SETTINGS``: enabled, tags, example questions). ``tool``
    may carry the changes (the admin form's instance, an import's); of those only its settings are written, onto
    the row as stored now (the change scope holds the configuration's lock, which discovery takes too): a changed
    description and a pending review that discovery wrote since ``tool`` was read stay as discovery left them,
    never the copy ``tool`` holds (an admin's save used to clear a rug-pull review and restore the reviewed text).

    Raises ValidationError (``enabled``, nothing written) where the change would enable a tool that waits for a
    review: only approving it (``mcp_tool_review_approve``) does, after an admin has seen what changed."""
    with change_scope(actor=actor, via=via):
        stored = McpTool.objects.filter(pk=tool.pk).first()
        if stored is not None:
            asked = {name: getattr(tool, name) for name in instance_changes(tool, stored) & TOOL_SETTINGS}
            asked.update(data or {})
            if asked.get("enabled") and not stored.enabled and stored.review_required:
                raise ValidationError({"enabled": [tool_enable_refused()]})
        with registry_contracts_changing(server_ids=[tool.server_id], actor=actor, via=via):
            audited_save(tool, actor=actor, via=via, data=data, only=TOOL_SETTINGS)
    return tool


@transaction.atomic
def mcp_tool_review_approve(*, tool: McpTool, actor: Any, via: str) -> bool:
    """Accept a tool's changed description/schema (a rug-pull review): enabled again if it was when its review
    began (an admin's "off" stays off). Returns False (and records nothing) if the tool awaits no review. Raises
    ValidationError (``enabled``, nothing written) where enabling it again would offer an agent two tools of one
    name (``mcpregistry.signals.tool_name_problems``). ``tool``
    is read again under the configuration's lock (an admin action's rows were read before it): a review approved
    meanwhile is not approved twice, and the approval is of the row as stored."""
    with change_scope(actor=actor, via=via):
        tool.refresh_from_db()
        if not tool.review_required:
            return False
        if tool.enabled_before_review and (
            problems := tool_name_problems(server_ids=[tool.server_id], enabling=[tool.pk])
        ):
            # Enabled again by the approval, its name would be one another server of an agent's already offers.
            raise ValidationError({"enabled": problems})
        previous_schema = tool.previous_input_schema
        audited_save(
            tool,
            actor=actor,
            via=via,
            data={
                "review_required": False,
                "enabled": tool.enabled_before_review,
                "previous_description": "",
                "previous_input_schema": None,
            },
            validate=False,
            verb="review_approve",
        )
        _contract_fitted_to_schema(tool, previous_schema=previous_schema, actor=actor, via=via)
    registry_contracts_changed_send(server_ids=[tool.server_id], actor=actor, via=via)
    return True


def _contract_fitted_to_schema(tool: McpTool, *, previous_schema: Any, actor: Any, via: str) -> None:
    """An approved schema change carried into the contract's arguments, the closed list the gate accepts (left as
    they were, the new arguments were refused, ``args:unknown``, and the approved tool could never be called):
    an argument the new schema added joins with the schema's constraints, one it removed leaves (the
    idempotency argument with it), and one that stays takes the schema's type and whether it is required,
    keeping the admin's narrowing (allowed values, range, length, pattern). An argument the admin left out of the
    contract on purpose stays out. Audited as the contract's update, in the approval's transaction."""
    contract = ToolContract.objects.filter(tool=tool).first()
    if contract is None or not isinstance(contract.args, dict) or not contract.args or previous_schema is None:
        return
    before, after = argument_constraints(previous_schema or {}), argument_constraints(tool.input_schema or {})
    args: dict[str, Any] = {}
    for name, spec in contract.args.items():
        if name in after:
            schema = {key: after[name][key] for key in ("type", "required") if key in after[name]}
            args[name] = {**spec, **schema}
        elif name not in before:
            args[name] = spec  # not the schema's before either: the admin's own, left as written
    for name, spec in after.items():
        if name not in before and name not in args:
            args[name] = _without_masked_values(spec)  # a masked secret is no value to allow (``_first_contract``)
    if args == contract.args:
        return
    data: dict[str, Any] = {"args": args}
    if contract.idempotency_arg and contract.idempotency_arg not in args:
        data["idempotency_arg"] = ""
    audited_save(contract, actor=actor, via=via, data=data, validate=False)


@transaction.atomic
def mcp_tool_delete(*, tool: McpTool, actor: Any, via: str) -> None:
    """Remove a tool row (and its contract); a later discovery lists it again if the server still has it."""
    with registry_contracts_changing(server_ids=[tool.server_id], actor=actor, via=via):
        audited_delete(tool, actor=actor, via=via)


@transaction.atomic
def tool_contract_create(*, tool: McpTool, actor: Any, via: str, data: Mapping[str, Any]) -> ToolContract:
    with registry_contracts_changing(server_ids=[tool.server_id], actor=actor, via=via):
        contract = audited_save(ToolContract(tool=tool), actor=actor, via=via, data=data)
    return contract


@transaction.atomic
def tool_contract_update(
    *, contract: ToolContract, actor: Any, via: str, data: Mapping[str, Any] | None = None
) -> ToolContract:
    """Change a contract: its argument and result constraints, retries, timeout, fallback, risk, memo. Agents
    bound to its server that publish on save get a new version in the same transaction."""
    with registry_contracts_changing(server_ids=[contract.tool.server_id], actor=actor, via=via):
        audited_save(contract, actor=actor, via=via, data=data)
    return contract


@transaction.atomic
def tool_contract_delete(*, contract: ToolContract, actor: Any, via: str) -> None:
    with registry_contracts_changing(server_ids=[contract.tool.server_id], actor=actor, via=via):
        audited_delete(contract, actor=actor, via=via)


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
    # Tools of the listing that were not registered (a name that cannot be one, a name listed twice), each as
    # "name: why"; they are among ``schema_errors`` too (never offered to a model), where the pages show them.
    rejected: list[str] = field(default_factory=list)
    # Tools whose input schema held a secret of the binding (an allowed value, a default), stored masked: each
    # waits for a review, and the mask is no allowed value of its first contract (``_first_contract``).
    secrets_masked: list[str] = field(default_factory=list)
    # Tools left off although they would be switched on (new at a binding's first discovery, or listed again after
    # vanishing), because another server bound beside this one offers an agent a tool of that name: "name (agents)".
    name_taken: list[str] = field(default_factory=list)
    # Tools whose description was longer than ``TOOL_DESCRIPTION_MAX_CHARS``, stored cut to it (what a model reads
    # of a tool on every turn is bounded, as its results are): "name (length as listed)".
    descriptions_cut: list[str] = field(default_factory=list)
    # Tools whose input schema held a ``description`` or ``title`` longer than ``TOOL_SCHEMA_TEXT_MAX_CHARS`` (an
    # argument's, a definition's), stored cut to it: "name (length of the longest as listed)".
    schema_texts_cut: list[str] = field(default_factory=list)
    # Tools whose input schema is longer than ``TOOL_SCHEMA_MAX_CHARS`` of JSON even so (its texts cut): each is
    # stored off and waits for a review, as a tool with hidden characters does: "name (length)".
    schemas_oversized: list[str] = field(default_factory=list)
    # Of the tools added, those that say they only read (MCP's ``readOnlyHint``): every added tool starts as a
    # write (each call waits for a person) until an admin marks it read, and the hint is the server's word only.
    added_read_only_hinted: list[str] = field(default_factory=list)
    # The enabled rules that fail every run they decide now that this discovery took their tool out of the runs'
    # reach (vanished, or held for a review), as the tool's page names them (``tool_rules_check``): plain text each.
    rules_left: list[str] = field(default_factory=list)
    tool_count: int = 0

    def warnings(self) -> list[str]:
        """What the discoverer should know although nothing failed, in their language: the descriptions and the
        input schemas' texts cut, the input schemas too long to offer unreviewed."""
        warnings = []
        if self.descriptions_cut:
            warnings.append(
                _("descriptions longer than %(n)s characters, stored cut to that length: %(tools)s")
                % {"n": TOOL_DESCRIPTION_MAX_CHARS, "tools": "; ".join(self.descriptions_cut)}
            )
        if self.schema_texts_cut:
            warnings.append(
                _(
                    "input schema descriptions or titles longer than %(n)s characters, stored cut to that length: "
                    "%(tools)s"
                )
                % {"n": TOOL_SCHEMA_TEXT_MAX_CHARS, "tools": "; ".join(self.schema_texts_cut)}
            )
        if self.schemas_oversized:
            warnings.append(
                _("input schemas longer than %(n)s characters, stored off until a review: %(tools)s")
                % {"n": TOOL_SCHEMA_MAX_CHARS, "tools": "; ".join(self.schemas_oversized)}
            )
        warnings.extend(self.rules_left)
        return warnings

    def health_problems(self) -> list[str]:
        """What makes the server's health an error after this listing, in the discoverer's language (the server's
        ``last_error``, ``mcp_discover``'s lines): the tools not registered, then those with an unusable input
        schema (a rejected name is among the schema errors too, and told once, with its reason)."""
        problems = []
        if self.rejected:
            problems.append(
                _("tools not registered (never offered to a model): %(tools)s") % {"tools": "; ".join(self.rejected)}
            )
        if unusable := [problem for problem in self.schema_errors if problem not in self.rejected]:
            problems.append(
                _("tools with an unusable input schema (never offered to a model): %(tools)s")
                % {"tools": "; ".join(unusable)}
            )
        return problems


def mcp_server_discover(*, server: McpServer, actor: Any, via: str) -> DiscoveryReport:
    """Connect (or reuse the pooled session), list the server's tools and update the registry.

    New tools are added (enabled at the binding's first discovery; disabled and flagged for review when they
    appear later), with a contract of risk ``write`` until an admin marks them ``read``; changed ones updated; tools no longer listed are marked unavailable; an
    admin's per-tool enable/disable is kept. The server's health is recorded either way. Never raises for
    the server's failure: the report and the binding's health carry it.

    The tool drift is audited in the same transaction as the registry's update: one event per tool added
    (``config.mcp_tool.create``, with its contract), changed (``config.mcp_tool.update``, with the diff; a
    rug pull also shows ``review_required``) or vanished (``config.mcp_tool.vanish``).
    """
    report = DiscoveryReport(mcp_id=server.mcp_id, ok=False)
    if not server.secrets_readable():
        report.error = _health_error_record(server, _secrets_undecryptable_error())
        return report
    # A per-run server gets a session for this discovery alone; a shared one warms this process's session.
    scope = server.pool_scope("discovery")
    from mcpregistry.local_tools import runner_for  # the session pool and the MCP SDK: loaded when one is called

    runner = runner_for(server.transport)
    secrets = discovery_secrets(server)
    register_secrets(secrets)  # what the server writes to its stderr (logged at DEBUG) is masked in this process
    try:
        listing = runner.list_tools(server.connection_config(), timeout_s=max(server.timeout_s, 30.0), scope=scope)
    except Exception as exc:  # noqa: BLE001 - recorded as the binding's health
        error = _with_unread_secrets(server, mask_text(str(exc) or type(exc).__name__, secrets=secrets))
        report.error = _health_error_record(server, error)
        return report
    finally:
        if scope is not None:
            runner.close_scope(scope)
    masked = _listing_without_secrets(listing, secrets)
    report.secrets_masked = _tools_with_masked_schema(listing.tools, masked.tools)
    listing = _listing_checked(masked, report)
    now = timezone.now()
    # The rules failing already for want of one of the server's tools: not this discovery's doing, not named.
    failing_before = set(_rules_left_text(server, list(server.tools.values_list("name", flat=True))))
    try:
        _discovery_apply(server, listing, report, now=now, actor=actor, via=via)
    except IntegrityError as exc:
        # Another discovery of this server added the same tool first (the server's row lock serialises them on
        # PostgreSQL; SQLite's writer lock does not stop both reading the tools first): its result stands.
        if "unique" not in str(exc).lower():  # SQLite's "UNIQUE constraint failed", PostgreSQL's "unique constraint"
            raise
        logger.warning("discovery of %s lost a race: %s", server.mcp_id, exc)
        error = str(_("Another discovery of this server ran at the same time; its result stands."))
        return DiscoveryReport(mcp_id=server.mcp_id, ok=False, error=error)  # nothing of this one was kept
    report.ok = True
    report.tool_count = len(listing.tools)
    if taken_out := sorted({*report.vanished, *report.review_required}):
        report.rules_left = [text for text in _rules_left_text(server, taken_out) if text not in failing_before]
    refresh_after_discovery([t for t in server.tools.all() if t.available])
    return report


def _rules_left_text(server: McpServer, tool_names: list[str]) -> list[str]:
    """The enabled rules that fail their runs for want of one of ``tool_names`` of ``server`` now, as the tool's
    page names them (``tool_rules_check``), as plain text (a command's line, a message): their links left out."""
    if not tool_names:
        return []
    return [plain_text(text) for text in rules_left_failing(server_id=server.pk, tool_names=tool_names)]


def readable_secrets(rows: Any) -> list[str]:
    """The secrets of ``rows``, less those of a row this process cannot decrypt (read one by one where one fails):
    it cannot use (so cannot leak) them, and one such row must not fail the runs of every other agent; its own
    runs fail with ``config:secret_unreadable``."""
    try:
        return [value for row in rows for value in row.secret_values()]
    except SecretDecryptionError:
        found: list[str] = []
        for pk in rows.values_list("pk", flat=True):
            try:
                found += rows.get(pk=pk).secret_values()
            except SecretDecryptionError:
                logger.warning(
                    "%s %s: its secrets cannot be decrypted; not among those masked", rows.model.__name__, pk
                )
        return found


def discovery_secrets(server: McpServer) -> list[str]:
    """What discovery, a health check and the pages showing what they found mask in what ``server`` tells: its
    own secrets, every one, and the other bindings' that look like credentials (``credential_like``), as a run
    masks its tools' answers (``agents.config_cache``). Masked with the server's own alone, a listing or a startup
    error repeating a shared configuration's token of another system was stored, audited (for good), exported,
    shown and offered to the model. The agents' model keys too (``secrets_elsewhere``). A binding this process
    cannot decrypt adds nothing (it cannot leak what it cannot read)."""
    others = readable_secrets(McpServer.objects.exclude(pk=server.pk))
    kept = [value for value in [*others, *secrets_kept_elsewhere()] if credential_like(value)]
    return list(dict.fromkeys([*server.secret_values(), *kept]))


def _discovery_apply(server: McpServer, listing: Any, report: Any, *, now: Any, actor: Any, via: str) -> None:
    """What a listing changes in the registry: tools added, changed (reviewed), vanished; the server's health,
    resources and prompts. One transaction, in the discovery's change scope.

    The scope takes the configuration's lock before anything is read (``audit.change_guard.config_write_lock``;
    every writer of configuration takes it first, an admin's tool save too), so the tools are read as the last
    change left them and none changes before this transaction ends; each tool's save writes only the fields of
    its ``updates``. An admin's "disable" committed while the server was listing is read here and kept (a copy
    of each tool read before the listing used to write its old ``enabled`` back)."""
    with transaction.atomic(), change_scope(actor=actor, via=via):
        McpServer.objects.select_for_update().filter(pk=server.pk).first()  # one discovery of a server at a time
        existing = {t.name: t for t in server.tools.all()}
        # The first discovery of a binding an admin has just made enables its tools; a tool that appears later
        # (the server grew one) starts disabled until an admin reviews it.
        first_discovery = not any(t.discovered_at is not None for t in existing.values())
        # A tool switched on here that another server bound beside this one offers an agent by the same name would
        # fail every run of that agent (``config:tool_name_conflict``): it stays off, and the report says why.
        taken = tool_names_taken_elsewhere(
            server_id=server.pk, names=_names_switched_on(listing, existing, first_discovery=first_discovery)
        )
        seen: set[str] = set()
        for listed in listing.tools:
            name = listed["name"]
            seen.add(name)
            description = listed.get("description") or ""
            input_schema = listed.get("inputSchema") or {}
            problem = schema_problem(input_schema)
            if problem:
                report.schema_errors.append(f"{name}: {problem}")
            # Text a model reads but a person does not see (Unicode tag characters, direction overrides,
            # zero-width characters): such a tool is reviewed first, even on a binding's first discovery, its
            # page writing them out (``audit.visible``). So is one whose schema quoted the binding's secret (now
            # masked): the server wrote it where a model reads what to send, and a value it listed is unusable. So
            # is one whose schema is too long (``TOOL_SCHEMA_MAX_CHARS``): a model would read it on every turn.
            secret_masked = name in report.secrets_masked
            schema_text = json.dumps(input_schema, ensure_ascii=False)
            reviewed_first = (
                secret_masked
                or len(schema_text) > TOOL_SCHEMA_MAX_CHARS
                or bool(invisible_characters(description + schema_text))
            )
            tool = existing.get(name)
            if tool is None:
                tool = audited_save(
                    McpTool(
                        server=server,
                        name=name,
                        description=description,
                        input_schema=input_schema,
                        annotations=listed.get("annotations") or {},
                        schema_error=problem or "",
                        discovered_at=now,
                        enabled=first_discovery and not reviewed_first and name not in taken,
                        review_required=not first_discovery or reviewed_first,
                    ),
                    actor=actor,
                    via=via,
                    validate=False,
                )
                audited_save(
                    ToolContract(
                        tool=tool, **_first_contract(input_schema, tool.annotations, secret_masked=secret_masked)
                    ),
                    actor=actor,
                    via=via,
                    validate=False,
                )
                report.added.append(name)
                if isinstance(tool.annotations, dict) and tool.annotations.get("readOnlyHint") is True:
                    report.added_read_only_hinted.append(name)
                if not first_discovery or reviewed_first:
                    report.review_required.append(name)
                elif name in taken:
                    report.name_taken.append(f"{name} ({', '.join(taken[name])})")
                continue
            if not ToolContract.objects.filter(tool=tool).exists():
                audited_save(
                    ToolContract(
                        tool=tool,
                        **_first_contract(input_schema, listed.get("annotations") or {}, secret_masked=secret_masked),
                    ),
                    actor=actor,
                    via=via,
                    validate=False,
                )
            # A description stored whole before descriptions were cut is compared cut: the same text listed again
            # is no change to review.
            changed = description_bounded(tool.description) != description or tool.input_schema != input_schema
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
            if changed and tool.discovered_at is not None:
                # A tool changed under the admin, enabled or not (one turned off now could be turned on later, with
                # no diff shown): keep the text they last reviewed (the oldest, where a review is pending already)
                # and park it for review.
                updates.update(enabled=False, review_required=True)
                if not tool.review_required:
                    updates.update(
                        previous_description=tool.description,
                        previous_input_schema=tool.input_schema,
                        enabled_before_review=tool.enabled,
                    )
                report.review_required.append(name)
            elif tool.discovered_at is None and (not first_discovery or reviewed_first):
                # Named before the server listed it (an import, a form), on a server discovered before: the server
                # grew it, as a new tool, and it is reviewed as one.
                updates.update(enabled=False, review_required=True)
                report.review_required.append(name)
            elif not tool.available and tool.enabled and name in taken:
                # Listed again after it vanished, while another server took its name for an agent: not back on.
                updates.update(enabled=False)
                report.name_taken.append(f"{name} ({', '.join(taken[name])})")
            audited_save(tool, actor=actor, via=via, data=updates, validate=False)
        for name, tool in existing.items():
            if name not in seen and tool.available:
                audited_save(tool, actor=actor, via=via, data={"available": False}, validate=False, verb="vanish")
                report.vanished.append(name)
        schema_error = "; ".join(report.health_problems())
        _record_listing_changes(server, resources=listing.resources, prompts=listing.prompts)
        McpServer.objects.filter(pk=server.pk).update(
            health=McpServer.Health.ERROR if schema_error else McpServer.Health.OK,
            last_error=schema_error,
            last_checked_at=now,
            protocol_version=listing.protocol_version,
            server_info=listing.server_info,
            resources=listing.resources,
            prompts=listing.prompts,
        )
        if report.added or report.updated or report.vanished:
            registry_contracts_changed_send(server_ids=[server.pk], actor=actor, via=via)


def _names_switched_on(listing: Any, existing: Mapping[str, McpTool], *, first_discovery: bool) -> list[str]:
    """The listed tools a discovery would switch on: the new ones at a binding's first discovery, and the enabled
    ones listed again after they vanished."""
    names = []
    for listed in listing.tools:
        tool = existing.get(listed["name"])
        if (tool is None and first_discovery) or (tool is not None and tool.enabled and not tool.available):
            names.append(listed["name"])
    return names


TOOL_NAME_MAX = 200  # McpTool.name's max_length


def tool_name_problem(name: Any) -> str:
    """Why ``name`` cannot be a tool's name (stored, shown, called), or "": what discovery refuses from a listing and
    ``mcp_tool_create`` from a name given before discovery."""
    if not isinstance(name, str) or not name:
        return str(_("no name"))
    if len(name) > TOOL_NAME_MAX:
        return str(_("a name longer than %(n)d characters") % {"n": TOOL_NAME_MAX})
    if any(unicodedata.category(c) == "Cc" for c in name):
        return str(_("a name with control characters"))
    if any(unicodedata.category(c) == "Cs" for c in name):
        return str(_("a name that is not valid text (an unpaired surrogate)"))
    return ""


def _shown_name(name: Any) -> str:
    """A listed name as a report may show it: control characters escaped, at most 60 characters, cut where a
    reader sees a boundary (``grapheme_cut``: a Korean name listed decomposed ended in another syllable)."""
    text = name if isinstance(name, str) else repr(name)
    cut = grapheme_cut(text, 60)
    shown = "".join(c if unicodedata.category(c) not in ("Cc", "Cs") else ascii(c)[1:-1] for c in cut)
    return shown + ("…" if len(cut) < len(nfc(text)) else "")


def _storable(value: Any) -> Any:
    """``value`` (JSON, as a server listed it) as the registry can store it: every string (keys included) through
    ``audit.masking.storable_text``, and a float that is not finite (no JSON column takes NaN or infinity) as its text."""
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {_storable(k): _storable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_storable(item) for item in value]
    return value


# The most of a tool's description the registry stores: a model reads it on every turn the tool is offered, as
# ``PLATFORM_TOOL_RESULT_MAX_CHARS`` bounds what it reads of a result (a server listed a 344,019-character
# description repeating "call another tool"). Generous for a description written for a reader.
TOOL_DESCRIPTION_MAX_CHARS = 4000


def description_bounded(description: str) -> str:
    """``description`` as the registry stores it: at most ``TOOL_DESCRIPTION_MAX_CHARS`` characters, a longer one
    cut and ending with "…" (a reader, the model too, sees that it goes on). The same text gives the same cut, so
    a long description listed again is no change (no rug pull to review)."""
    if len(description) <= TOOL_DESCRIPTION_MAX_CHARS:
        return description
    return description[: TOOL_DESCRIPTION_MAX_CHARS - 1] + "…"


def _with_description_bounded(listed: dict[str, Any], report: DiscoveryReport) -> dict[str, Any]:
    """A listed tool with its description cut (``description_bounded``), the cut named in the report. Cut after
    the binding's secrets are masked: a secret across the cut is masked whole, not left half."""
    description = listed.get("description")
    if not isinstance(description, str) or len(description) <= TOOL_DESCRIPTION_MAX_CHARS:
        return listed
    report.descriptions_cut.append(
        _("%(tool)s (%(n)d characters)") % {"tool": _shown_name(listed["name"]), "n": len(description)}
    )
    return {**listed, "description": description_bounded(description)}


# The most of each ``description`` and ``title`` of a tool's input schema (an argument's, a nested object's, a
# definition's) the registry stores, and of the whole schema's JSON text: a model reads them with the tool's
# description (``TOOL_DESCRIPTION_MAX_CHARS``) on every turn the tool is offered (a local tool's argument was
# described in 90,005 characters). Texts are cut; a schema still longer is stored off, waiting for a review.
TOOL_SCHEMA_TEXT_MAX_CHARS = 1000
TOOL_SCHEMA_MAX_CHARS = 32_000
_SCHEMA_TEXT_KEYS = frozenset({"description", "title"})
# Where a schema holds schemas: one (``items`` of older drafts: a list too), a list, or a map of them. Never the
# values it validates against (``enum``, ``const``, ``default``, ``examples``): those are kept as listed.
_SUBSCHEMA_KEYS = frozenset(
    {"items", "additionalItems", "additionalProperties", "unevaluatedItems", "unevaluatedProperties", "contains",
     "propertyNames", "not", "if", "then", "else", "anyOf", "oneOf", "allOf", "prefixItems"}
)  # fmt: skip
_SUBSCHEMA_MAP_KEYS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})


def _schema_text_bounded(text: str) -> str:
    """A schema's ``description`` or ``title`` as the registry stores it: at most ``TOOL_SCHEMA_TEXT_MAX_CHARS``
    characters, a longer one cut where a reader sees a boundary (``grapheme_cut``) and ending with "…". The same
    text gives the same cut, so the same schema listed again is no change to review."""
    if len(text) <= TOOL_SCHEMA_TEXT_MAX_CHARS:
        return text
    return grapheme_cut(text, TOOL_SCHEMA_TEXT_MAX_CHARS - 1) + "…"


def _schema_texts_bounded(schema: Any, longest: list[int], depth: int = 0) -> Any:
    """``schema`` with every ``description`` and ``title`` of it and of its subschemas (properties, items,
    ``$defs``/``definitions``, ``anyOf``/``oneOf``/``allOf``, ...) cut (``_schema_text_bounded``); every other
    keyword kept as listed, so what the schema allows is unchanged (texts are annotations: no check reads them).
    The length of the longest text cut is appended to ``longest``. Deeper than ``SCHEMA_MAX_DEPTH`` is left as
    it is (such a schema is refused: ``schema_problem``)."""
    if not isinstance(schema, dict) or depth > SCHEMA_MAX_DEPTH:
        return schema
    bounded = dict(schema)
    for key, value in schema.items():
        if key in _SCHEMA_TEXT_KEYS and isinstance(value, str) and len(value) > TOOL_SCHEMA_TEXT_MAX_CHARS:
            bounded[key] = _schema_text_bounded(value)
            longest.append(len(value))
        elif key in _SUBSCHEMA_KEYS and isinstance(value, list):
            bounded[key] = [_schema_texts_bounded(item, longest, depth + 1) for item in value]
        elif key in _SUBSCHEMA_KEYS:
            bounded[key] = _schema_texts_bounded(value, longest, depth + 1)
        elif key in _SUBSCHEMA_MAP_KEYS and isinstance(value, dict):
            bounded[key] = {name: _schema_texts_bounded(item, longest, depth + 1) for name, item in value.items()}
    return bounded


def _with_schema_bounded(listed: dict[str, Any], report: DiscoveryReport) -> dict[str, Any]:
    """A listed tool with its input schema's texts cut (``_schema_texts_bounded``), the cut named in the report, and
    a schema still longer than ``TOOL_SCHEMA_MAX_CHARS`` named too (``_discovery_apply`` stores such a tool off,
    for a review). Cut after the binding's secrets are masked, as the description is."""
    schema = listed.get("inputSchema")
    if not isinstance(schema, dict):
        return listed
    longest: list[int] = []
    bounded = _schema_texts_bounded(schema, longest)
    if longest:
        report.schema_texts_cut.append(
            _("%(tool)s (%(n)d characters)") % {"tool": _shown_name(listed["name"]), "n": max(longest)}
        )
        listed = {**listed, "inputSchema": bounded}
    size = len(json.dumps(bounded, ensure_ascii=False, default=str))
    if size > TOOL_SCHEMA_MAX_CHARS:
        report.schemas_oversized.append(
            _("%(tool)s (%(n)d characters)") % {"tool": _shown_name(listed["name"]), "n": size}
        )
    return listed


def _listing_checked(listing: Any, report: DiscoveryReport) -> Any:
    """The listing as the registry can store it: a tool whose name cannot be one (not a string, empty, longer than
    a name may be, with control characters) is left out, and so is a second tool of a name already listed (the
    first is kept; names compared in NFC: a composed and a decomposed ``직원검색`` are one name to a person and to
    an agent's conflict check, which failed every run of one server listing both), each reported
    (``report.rejected`` and ``schema_errors``, the binding's health); a description longer than
    ``TOOL_DESCRIPTION_MAX_CHARS`` cut (``report.descriptions_cut``), and so is an input schema's description or
    title longer than ``TOOL_SCHEMA_TEXT_MAX_CHARS`` (``report.schema_texts_cut``; a schema longer than
    ``TOOL_SCHEMA_MAX_CHARS`` even so is named in ``report.schemas_oversized``); everything else made storable
    (``_storable``: a NUL character in a description, a schema, a resource, a prompt or the server's info becomes
    U+FFFD)."""
    tools: list[Any] = []
    names: set[str] = set()
    for listed in listing.tools:
        name = listed.get("name") if isinstance(listed, dict) else None
        problem = tool_name_problem(name)
        if not problem and unicodedata.normalize("NFC", name) in names:
            problem = str(_("listed more than once (the first is kept)"))
        if problem:
            entry = f"{_shown_name(name)}: {problem}"
            report.rejected.append(entry)
            report.schema_errors.append(entry)
            continue
        names.add(unicodedata.normalize("NFC", str(name)))
        tools.append(_with_schema_bounded(_with_description_bounded(listed, report), report))
    return replace(
        listing,
        tools=_storable(tools),
        resources=_storable(listing.resources),
        prompts=_storable(listing.prompts),
        server_info=_storable(listing.server_info),
        protocol_version=_storable(listing.protocol_version),
    )


def _secrets_undecryptable_error() -> str:
    """Why a binding whose stored secrets this process cannot decrypt (``McpServer.secrets_readable``) was not
    connected: its env and headers are what a connection sends, so discovery and the health check stop before
    one. The admin's ``unreadable_secrets_text`` says the same on the server's page (the admin imports this
    module, so its text is mirrored here rather than imported)."""
    return str(
        _(
            "the stored secret values cannot be decrypted with this server's keys (SECRETS_ENCRYPTION_KEYS lacks "
            "the key they were encrypted with), so the server was not connected. Add that key back, or tick "
            '"clear all stored secret values" on the server\'s page and enter every value and setting again.'
        )
    )


def _health_error_record(server: McpServer, error: str) -> str:
    """Record ``error`` as the binding's health (an operational field, not a configuration change: unaudited, as
    every health is); returns it, for the report."""
    McpServer.objects.filter(pk=server.pk).update(
        health=McpServer.Health.ERROR, last_error=error, last_checked_at=timezone.now()
    )
    return error


def _with_unread_secrets(server: McpServer, error: str) -> str:
    """A failed connection's error, with the secrets this process could not read named (a server answering 401
    for want of its token said nothing of why), at most 2,000 characters."""
    unread = server.unread_secrets()
    if unread:
        error += " " + _("(not set in this process, so not sent: %(names)s)") % {"names": ", ".join(unread)}
    return error[:2000]


def _record_listing_changes(server: McpServer, *, resources: Any, prompts: Any) -> None:
    """Record, as the server's change, the resources and prompts discovery found changed (by URI and name): the
    resources are what ``read_resource`` may read, and they changed unrecorded. Called in discovery's transaction
    and change scope."""
    stored = McpServer.objects.filter(pk=server.pk).values_list("resources", "prompts").first()
    if stored is None:
        return
    diff: dict[str, Any] = {}
    for name, before, after, key in (
        ("resources", stored[0], resources, "uri"),
        ("prompts", stored[1], prompts, "name"),
    ):
        old = sorted(str(item.get(key, "")) for item in before or [] if isinstance(item, dict))
        new = sorted(str(item.get(key, "")) for item in after or [] if isinstance(item, dict))
        if old != new:
            diff[name] = [old, new]
    if diff:
        config_change_record(obj=server, verb="update", diff=diff)


# Where a server's listing names something rather than states a value: a tool's, prompt's or argument's name, a
# schema's types, required names and references, a resource's URI and media type. Kept as listed (an env value that
# happens to be a tool's name must not rename the tool), except below a value keyword (``_LISTING_VALUE_KEYS``).
_LISTING_NAME_KEYS = frozenset(
    {"name", "type", "required", "format", "uri", "uriTemplate", "mimeType", "$ref", "$schema", "$id", "$anchor",
     "$dynamicRef", "$dynamicAnchor"}
)  # fmt: skip
# A schema's values: everything below them is a value, whatever its key (``{"default": {"name": ...}}``).
_LISTING_VALUE_KEYS = frozenset({"default", "examples", "enum", "const"})
# Text a server writes for people, where a careless server quotes its secret as ``token=…`` too.
_LISTING_PROSE_KEYS = frozenset({"description", "instructions"})


def _listing_without_secrets(listing: Any, secrets: list[str]) -> Any:
    """The server's listing with the binding's secrets masked wherever a value appears (a tool's description, a
    schema's ``enum``, ``const``, ``default``, ``examples``, ``pattern``, title; a resource's or prompt's
    description; the server's instructions), keys never: what discovery stores, audits, exports, shows an admin
    and offers a model (``tenant: Literal[TOKEN, "public-demo"]`` listed the token as an allowed value). Names
    and the schema's structure are kept as listed (``_LISTING_NAME_KEYS``). A number equal to a secret becomes the
    mask too; a masked ``pattern`` holds the mask escaped, so that it stays a regular expression (one that matches
    no secret)."""
    long_secrets = {value for value in secrets if len(value) >= MIN_SECRET_LENGTH}  # as the masker ignores short ones

    def masked(value: Any, key: str, in_value: bool) -> Any:
        if isinstance(value, dict):
            return {
                k: masked(v, k if isinstance(k, str) else "", in_value or k in _LISTING_VALUE_KEYS)
                for k, v in value.items()
            }
        if isinstance(value, list):
            return [masked(item, key, in_value) for item in value]
        if not in_value and key in _LISTING_NAME_KEYS:
            return value
        if isinstance(value, str) and key in _LISTING_PROSE_KEYS and not in_value:
            return mask_text(value, secrets=secrets)
        if isinstance(value, str):
            text = mask_known(value, secrets=secrets)
            return text.replace(MASK, re.escape(MASK)) if key == "pattern" and text != value else text
        if isinstance(value, int | float) and not isinstance(value, bool) and str(value) in long_secrets:
            return MASK
        return value

    return replace(
        listing,
        tools=masked(listing.tools, "", False),
        resources=masked(listing.resources, "", False),
        prompts=masked(listing.prompts, "", False),
        server_info=masked(listing.server_info, "", False),
    )


def _tools_with_masked_schema(listed: list[Any], masked: list[Any]) -> list[str]:
    """The names of the tools whose input schema ``_listing_without_secrets`` changed: the server wrote a secret of
    the binding into what a model reads as the tool's arguments (an allowed value, a default)."""
    return [
        str(after.get("name"))
        for before, after in zip(listed, masked, strict=True)
        if isinstance(before, dict)
        and isinstance(after, dict)
        and before.get("inputSchema") != after.get("inputSchema")
    ]


def _first_contract(
    input_schema: dict[str, Any], annotations: dict[str, Any], *, secret_masked: bool
) -> dict[str, Any]:
    """A discovered tool's first contract (``contract_defaults``). Where its schema had a secret of the binding
    masked (``secret_masked``), an allowed value that holds the mask is left out of the argument's ``allowed``:
    the model is not offered "***" and the gate refuses it (sent, the server refused it or took it as a value);
    the secret itself is never an allowed value (the model must not be given it). An argument whose every value
    was a secret keeps the mask as its one value rather than an empty list: an empty list allows nothing here,
    but the contract editor shows it as an empty box and a save reads that as no limit at all."""
    contract = contract_defaults(input_schema, annotations)
    if secret_masked:
        contract["args"] = {name: _without_masked_values(spec) for name, spec in contract["args"].items()}
    return contract


def _without_masked_values(spec: dict[str, Any]) -> dict[str, Any]:
    """An argument's constraints with the allowed values that hold the mask left out (see ``_first_contract``)."""
    allowed = spec.get("allowed")
    if not isinstance(allowed, list):
        return spec
    kept = [value for value in allowed if not (isinstance(value, str) and MASK in value)]
    return {**spec, "allowed": kept or [MASK]} if len(kept) != len(allowed) else spec


# ---- the classify_request local tool's table ------------------------------------------------------------------


def request_category_create(*, actor: Any, via: str, data: Mapping[str, Any]) -> RequestCategory:
    """Add a department and its keywords to ``classify_request``'s table."""
    return audited_save(RequestCategory(), actor=actor, via=via, data=data)


def request_category_update(
    *, category: RequestCategory, actor: Any, via: str, data: Mapping[str, Any] | None = None
) -> RequestCategory:
    """Change a department's keywords, order or enabled flag (``category`` may already carry the changes)."""
    return audited_save(category, actor=actor, via=via, data=data)


def request_category_delete(*, category: RequestCategory, actor: Any, via: str) -> None:
    audited_delete(category, actor=actor, via=via)


@dataclass
class HealthReport:
    mcp_id: str
    ok: bool
    error: str = ""
    tool_count: int = 0
    latency_ms: float = 0.0
    new: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)


def mcp_server_health_check(*, server: McpServer) -> HealthReport:
    """Connect (or reuse the pooled session) and list the server's tools without changing the registry: records
    the binding's health (an operational field, not a configuration change) and says how the listing differs
    from the registry (tools new on the server, tools the registry has that it no longer lists). Never raises
    for the server's failure.

    The health is the one discovery records for the same listing: an error naming the tools that are never
    offered to a model (not registered, an unusable input schema), else OK. ``report.ok`` is False then too, with
    those problems as ``report.error``, though the server answered (``tool_count`` and the differences are set)."""
    report = HealthReport(mcp_id=server.mcp_id, ok=False)
    if not server.secrets_readable():
        report.error = _health_error_record(server, _secrets_undecryptable_error())
        return report
    scope = server.pool_scope("health")
    from mcpregistry.local_tools import runner_for  # the session pool and the MCP SDK: loaded when one is called

    runner = runner_for(server.transport)
    secrets = discovery_secrets(server)
    register_secrets(secrets)  # the server's stderr, logged at DEBUG, is masked in this process
    started = time.monotonic()
    try:
        listing = runner.list_tools(server.connection_config(), timeout_s=max(server.timeout_s, 30.0), scope=scope)
    except Exception as exc:  # noqa: BLE001 - recorded as the binding's health
        error = _with_unread_secrets(server, mask_text(str(exc) or type(exc).__name__, secrets=secrets))
        report.error = _health_error_record(server, error)
        return report
    finally:
        if scope is not None:
            runner.close_scope(scope)
    report.latency_ms = (time.monotonic() - started) * 1000
    # Masked first, as discovery does: a schema's problem may quote the schema (a pattern holding a secret).
    listed_tools, problems = _listing_health_problems(_listing_without_secrets(listing, secrets), mcp_id=server.mcp_id)
    listed = {t["name"] for t in listed_tools}
    known = set(server.tools.filter(available=True).values_list("name", flat=True))
    report.ok, report.error, report.tool_count = not problems, "; ".join(problems), len(listed)
    report.new, report.missing = sorted(listed - known), sorted(known - listed)
    McpServer.objects.filter(pk=server.pk).update(
        health=McpServer.Health.ERROR if problems else McpServer.Health.OK,
        last_error=report.error,
        last_checked_at=timezone.now(),
    )
    return report


def _listing_health_problems(listing: Any, *, mcp_id: str) -> tuple[list[Any], list[str]]:
    """The tools of ``listing`` (masked) the registry would store, and the problems discovery would record as the
    binding's health for it (``DiscoveryReport.health_problems``): a check that wrote OK over them turned a server
    whose tools are never offered to a model green, with no word of why, until the next discovery."""
    checked = DiscoveryReport(mcp_id=mcp_id, ok=False)
    tools = _listing_checked(listing, checked).tools
    for listed in tools:
        if problem := schema_problem(listed.get("inputSchema") or {}):  # as ``_discovery_apply`` words it
            checked.schema_errors.append(f"{listed['name']}: {problem}")
    return tools, checked.health_problems()
