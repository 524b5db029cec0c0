"""Signals the registry sends to the apps built on it, which it must not import (agents → mcpregistry).

``registry_contracts_changed`` is sent **inside the transaction** of a change to what an agent version freezes of
the registry: a tool's contract (created, changed, deleted) or whether a tool can be called at all (enabled,
approved after review, deleted, found changed or gone by discovery). Keyword arguments: ``server_ids`` (the
``McpServer`` primary keys whose tools changed), ``actor`` and ``via`` (as the service was given them). A receiver
that writes (``agents`` publishes the bound agents that publish on save) does so in that same transaction, so the
change and what follows from it commit, or roll back, together; a receiver's exception rolls the change back.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from django.dispatch import Signal

registry_contracts_changed = Signal()


# ``registry_contracts_frozen`` is sent before such a change (``registry_contracts_changing``): its receivers answer
# with a mapping of what they hold of the servers now (``agents``: the content each agent that publishes on save
# would freeze), merged and handed to ``registry_contracts_changed``'s receivers as ``before``.
registry_contracts_frozen = Signal()


def registry_contracts_changed_send(
    *, server_ids: Iterable[Any], actor: Any, via: str, before: Mapping[Any, Any] | None = None
) -> None:
    """Tell the receivers that the contracts (or callable tools) of these servers changed (``before``: what
    ``registry_contracts_frozen``'s receivers answered before the change, where the caller asked them)."""
    ids = sorted({pk for pk in server_ids if pk is not None})
    if ids:
        registry_contracts_changed.send(sender=None, server_ids=ids, actor=actor, via=via, before=before)


@contextmanager
def registry_contracts_changing(*, server_ids: Iterable[Any], actor: Any, via: str) -> Iterator[None]:
    """A change to the contracts (or callable tools) of ``server_ids`` made in the block: what the receivers hold of
    them is asked before it, and the change announced after it with that answer, so that a save that changed
    nothing they freeze changes nothing of theirs (an unchanged save after a roll back published the draft)."""
    ids = sorted({pk for pk in server_ids if pk is not None})
    before: dict[Any, Any] = {}
    if ids:
        for _receiver, answer in registry_contracts_frozen.send(sender=None, server_ids=ids):
            before.update(answer or {})
    yield
    registry_contracts_changed_send(server_ids=ids, actor=actor, via=via, before=before)


# ``tool_names_check`` asks (``send``'s answers are lists of problem texts) what a change of the names the model is
# offered would break: a server's tool name prefix changed, or tools switched on. Keyword arguments: ``server_ids``
# (the servers changed), ``prefixes`` (server pk → the new prefix) and ``enabling`` (the pks of the tools switched
# on). ``agents`` answers with the agents that would then be offered two tools of one name (every run of theirs
# would fail, ``config:tool_name_conflict``): a server's or a tool's save refuses it, as an agent's save refuses
# binding two such servers.
tool_names_check = Signal()

_tool_name_checks_deferred: ContextVar[bool] = ContextVar("tool_name_checks_deferred", default=False)


@contextmanager
def tool_name_checks_deferred() -> Iterator[None]:
    """Within: ``tool_name_problems`` finds none; the caller (``import_config``) checks its agents once every entry
    is in (entry by entry, a prefix and the binding it fixes, given in one document, were refused by their order)."""
    token = _tool_name_checks_deferred.set(True)
    try:
        yield
    finally:
        _tool_name_checks_deferred.reset(token)


def tool_name_problems(
    *, server_ids: Iterable[Any], prefixes: Mapping[Any, str] | None = None, enabling: Iterable[Any] = ()
) -> list[str]:
    """Why the servers ``server_ids`` may not take the tool name ``prefixes`` or switch the tools ``enabling``
    on ([]: they may), as the receivers of ``tool_names_check`` say."""
    if _tool_name_checks_deferred.get():
        return []
    return _answers(
        tool_names_check,
        server_ids=sorted(set(server_ids)),
        prefixes=dict(prefixes or {}),
        enabling=frozenset(enabling),
    )


# ``tool_names_taken`` asks which tool names a server would clash on if it started offering them: keyword arguments
# ``server_id`` and ``names`` (the tools' names as the server lists them; its prefix is added). ``agents`` answers
# with a mapping: each of ``names`` that another server already offers an agent binding this one → those agents'
# slugs. Discovery switches such a tool on neither at a binding's first listing nor when it is listed again.
tool_names_taken = Signal()


def tool_names_taken_elsewhere(*, server_id: Any, names: Iterable[str]) -> dict[str, list[str]]:
    """Of ``names``, those another server already offers an agent that binds the server ``server_id`` (name →
    the agents), as the receivers of ``tool_names_taken`` say."""
    wanted = sorted(set(names))
    taken: dict[str, set[str]] = {}
    if not wanted:
        return {}
    for _receiver, answer in tool_names_taken.send(sender=None, server_id=server_id, names=wanted):
        for name, agents in (answer or {}).items():
            taken.setdefault(name, set()).update(agents)
    return {name: sorted(agents) for name, agents in sorted(taken.items())}


# ``contract_rules_check`` asks which stored rules a tool's contract, as saved, leaves refused: keyword argument
# ``tool`` (the ``McpTool``, its contract as stored). ``agents`` answers with texts naming its enabled rules that
# call the tool with fixed parameters the contract refuses (every call of theirs is refused before it is sent). A
# rule's save refuses such parameters; a contract's save, which may tighten them on purpose, names them instead.
contract_rules_check = Signal()


def rules_refused_by_contract(*, tool: Any) -> list[str]:
    """The stored rules ``tool``'s contract now refuses, one text each, as the receivers of
    ``contract_rules_check`` say."""
    return _answers(contract_rules_check, tool=tool)


# ``tool_rules_check`` asks which stored rules would fail the runs they decide for want of a tool: keyword arguments
# ``server_id`` (the ``McpServer``), ``tool_names`` (those of its tools; None: the server itself) and ``deleting``
# (True: they are about to be deleted; False: as stored now). ``agents`` answers with its enabled rules that call
# such a tool (a code rule: that name the server) while it is disabled, deleted or its server disabled, each a text
# (safe HTML) naming the rule with a link to it, its agent and the reason its runs fail
# (``deterministic:tool_unknown``, ``mcp:not_loaded:<id>``). Switching a tool or a server off, or deleting it, is not
# refused for them (the rules stay, as they are); the pages that do it name them.
tool_rules_check = Signal()


def rules_left_failing(*, server_id: Any, tool_names: Iterable[str] | None = None, deleting: bool = False) -> list[str]:
    """The stored rules that fail their runs where the server ``server_id``'s tools ``tool_names`` (None: the
    server itself) are off now, or once deleted, one text each (safe HTML), as the receivers of
    ``tool_rules_check`` say."""
    names = None if tool_names is None else sorted(set(tool_names))
    return _answers(tool_rules_check, server_id=server_id, tool_names=names, deleting=deleting)


# ``secrets_elsewhere`` asks the apps built on the registry for the secrets they keep that a server's listing or
# error may repeat (``agents``: the agents' model keys), for discovery and health checks to mask as runs do
# (``mcpregistry.services.discovery_secrets``). No arguments; each answer is a list of values.
secrets_elsewhere = Signal()


def secrets_kept_elsewhere() -> list[str]:
    """The secrets the receivers of ``secrets_elsewhere`` keep."""
    return _answers(secrets_elsewhere)


def _answers(signal: Signal, **arguments: Any) -> list[Any]:
    """What every receiver of ``signal`` answered (each a list, or nothing), one list in their order."""
    found: list[Any] = []
    for _receiver, answer in signal.send(sender=None, **arguments):
        found.extend(answer or [])
    return found
