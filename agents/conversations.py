"""Conversations (A2A's ``contextId``): which runs are one conversation, as every door says it.

A run keeps its conversation's id in ``context.contextId``, composed (``agents.services.run_input_guarded``). A run
kept without one (a REST run sent without a contextId, every MCP ``tools/call`` run) is a conversation of its own,
named by its run id: the A2A server reports that id as its task's ``contextId``. A caller who goes on under that id
(``SendMessage`` with it, or a REST run whose ``context.contextId`` it is) is in that run's conversation, so
``ListTasks`` (``agents.api.a2a_server``) and the history a run is given (``agents.execution.conversation_history``)
find it by the same rule: :func:`in_context`.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.db.models import Q, QuerySet

from agent_platform.text import nfc
from agents.models import Run


def context_id_of(run: Run) -> str:
    """The conversation ``run`` is in: its ``context.contextId``, else its own id."""
    context = run.context if isinstance(run.context, dict) else {}
    return str(context.get("contextId") or run.id)


def same_context(given: str, run: Run) -> bool:
    """Whether a caller's ``given`` contextId is ``run``'s, compared composed: a run stores its context composed,
    and Korean typed on macOS comes decomposed."""
    return nfc(given) == context_id_of(run)


def in_context(runs: QuerySet[Any], context_id: str) -> Q:
    """Which of ``runs`` are in the conversation ``context_id`` (a filter on ``runs``): those that keep it in their
    context, and the one of ``runs`` whose id it is where that run keeps none (its task reports its own id).
    Filtering on the context alone missed that one. Compared composed (``same_context``)."""
    context_id = nfc(context_id)
    matches = Q(context__contextId=context_id)
    try:
        run_id = uuid.UUID(context_id)
    except ValueError:
        return matches
    own = runs.filter(pk=run_id).first()
    if own is not None and same_context(context_id, own):
        matches |= Q(pk=own.pk)
    return matches
