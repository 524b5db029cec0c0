"""Conversations (A2A's ``contextId``): which runs are one conversation, as every door says it.

A run keeps its conversation's id in ``context.contextId``, composed (``agents.services.run_input_guarded``). A run
kept without one (a REST run sent without a contextId, every MCP ``tools/call`` run) is a conversation of its own,
named by its run id: the A2A server reports that id as its task's ``contextId``. A caller who goes on under that id
(``SendMessage`` with it, or a REST run whose ``context.contextId`` it is) is in that run's conversation, so
``ListTasks`` (``agents.api.a2a_server``) and the history a run is given (``agents.execution.conversation_history``)
find it by the same rule: :func:`in_context`.

Every door that takes a caller's context (REST's ``context``, MCP's ``arguments.context``, A2A's
``metadata.context``, an eval case's ``context``, ``run_query --context``) reads its ``contextId`` by the same
rule: text, not blank, of at most ``CONTEXT_ID_MAX_CHARS`` characters (:func:`context_id_problem`), and ``null``
as none at all (:func:`context_without_null_id`).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from django.db.models import Q, QuerySet
from django.utils.translation import gettext as _

from agent_platform.text import nfc

if TYPE_CHECKING:  # named in annotations only: the context check is read by modules without models (evals.scoring)
    from agents.models import Run

# A conversation's id (A2A's ``contextId``) is text of at most this many characters, as a message's ids are.
CONTEXT_ID_MAX_CHARS = 200


def context_id_problem(context: Mapping[str, Any], *, field: str) -> str | None:
    """Why ``context``'s ``contextId`` (called ``field`` in the text) cannot name a conversation, or None where it
    can or there is none (absent, or ``null``: no conversation, as it meant before the check, so the run is its
    own): it must be text, not blank, of at most ``CONTEXT_ID_MAX_CHARS`` characters. A number was kept as it came
    and an object as Python's text of it: reported back as the task's contextId ("12345", "{'a': [1]}"), and found
    by nothing (the history compares the JSON number 7 with "7"). Each door words its own error around this text."""
    value = context.get("contextId")
    if value is None:
        return None
    if isinstance(value, str) and value.strip() and len(nfc(value)) <= CONTEXT_ID_MAX_CHARS:  # counted as stored
        return None
    return _("'%(field)s' must be text of 1 to %(max)d characters.") % {"field": field, "max": CONTEXT_ID_MAX_CHARS}


def context_without_null_id(context: Mapping[str, Any]) -> dict[str, Any]:
    """``context`` as a run keeps it: a ``contextId`` of ``null`` left out, as if it had not been sent (the run is
    its own conversation, or A2A's new one), so that no reader mistakes it for a conversation's id and a message's
    own ``contextId`` is not said to differ from it."""
    if "contextId" in context and context["contextId"] is None:
        return {key: value for key, value in context.items() if key != "contextId"}
    return dict(context)


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
