"""Signals the registry sends to the apps built on it, which it must not import (agents → mcpregistry).

``registry_contracts_changed`` is sent **inside the transaction** of a change to what an agent version freezes of
the registry: a tool's contract (created, changed, deleted) or whether a tool can be called at all (enabled,
approved after review, deleted, found changed or gone by discovery). Keyword arguments: ``server_ids`` (the
``McpServer`` primary keys whose tools changed), ``actor`` and ``via`` (as the service was given them). A receiver
that writes (``agents`` publishes the bound agents that publish on save) does so in that same transaction, so the
change and what follows from it commit, or roll back, together; a receiver's exception rolls the change back.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.dispatch import Signal

registry_contracts_changed = Signal()


def registry_contracts_changed_send(*, server_ids: Iterable[Any], actor: Any, via: str) -> None:
    """Tell the receivers that the contracts (or callable tools) of these servers changed."""
    ids = sorted({pk for pk in server_ids if pk is not None})
    if ids:
        registry_contracts_changed.send(sender=None, server_ids=ids, actor=actor, via=via)
