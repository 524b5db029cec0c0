"""What an audit event's codes mean, in the reader's language.

The record keeps its codes as written (``tool.call``, ``config.tool_contract.update``, ``args:allowed:region``):
stable, the same in every export and whatever language its reader has. The pages people read show them through
:func:`action_label`, :func:`reason_label`, :func:`actor_in_words` and :func:`via_label`, which name the known
codes in words and leave any other code as it is (a code is never hidden: the pages show it beside its words).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

from django.apps import apps
from django.core.management import get_commands
from django.db import models
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.html import format_html, format_html_join
from django.utils.translation import pgettext

from audit.change_guard import policy_of
from audit.changes import CONFIG_ACTION_PREFIX
from audit.models import AuditEvent
from audit.visible import visible_text

_ACTIONS: dict[str, Callable[[], str]] = {
    "tool.call": lambda: pgettext("audit action", "tool call"),
    "tool.fallback": lambda: pgettext("audit action", "handed to the fallback tool"),
    "rule.decision": lambda: pgettext("audit action", "rule decision"),
    "resource.read": lambda: pgettext("audit action", "resource read"),
    "prompt.get": lambda: pgettext("audit action", "prompt fetched"),
    "approval.request": lambda: pgettext("audit action", "approval requested"),
    "approval.approve": lambda: pgettext("audit action", "approved"),
    "approval.reject": lambda: pgettext("audit action", "rejected"),
    "approval.outcome_unknown": lambda: pgettext("audit action", "write outcome unknown"),
    "approval.unused": lambda: pgettext("audit action", "approval left unused"),
    "run.cancel": lambda: pgettext("audit action", "run cancelled"),
    "eval_run.start": lambda: pgettext("audit action", "eval run started"),
    "eval_run.cancel": lambda: pgettext("audit action", "eval run cancelled"),
    "audit.archive": lambda: pgettext("audit action", "events archived and deleted"),
    "run.feedback": lambda: pgettext("audit action", "feedback on a run"),
    "security.lockout": lambda: pgettext("audit action", "sign-in locked"),
    "security.lockout_lift": lambda: pgettext("audit action", "sign-in lock lifted"),
    "security.login": lambda: pgettext("audit action", "signed in"),
    "security.logout": lambda: pgettext("audit action", "signed out"),
    "security.login_failed": lambda: pgettext("audit action", "sign-in failed"),
}

_VERBS: dict[str, Callable[[], str]] = {
    "create": lambda: pgettext("audit change", "created"),
    "update": lambda: pgettext("audit change", "changed"),
    "delete": lambda: pgettext("audit change", "deleted"),
    "import": lambda: pgettext("audit change", "imported"),
    "publish": lambda: pgettext("audit change", "published"),
    "review_approve": lambda: pgettext("audit change", "review approved"),
    "revoke": lambda: pgettext("audit change", "revoked"),
    "rotate_secrets": lambda: pgettext("audit change", "secrets rotated"),
    "password_change": lambda: pgettext("audit change", "password changed"),
    "vanish": lambda: pgettext("audit change", "removed by its server"),
}

# Reasons the gate, the deterministic stage and the approvals write; ``args:<kind>:<argument>`` and
# ``mcp:not_loaded:<server>`` name what they are about.
_REASONS: dict[str, Callable[[], str]] = {
    "args:json": lambda: pgettext("audit reason", "arguments not a JSON object"),
    "args:unknown": lambda: pgettext("audit reason", "an argument the tool does not have"),
    "result:shape": lambda: pgettext("audit reason", "answer of the wrong shape"),
    "result:empty": lambda: pgettext("audit reason", "empty answer"),
    "result:too_big": lambda: pgettext("audit reason", "answer too big"),
    "result:range": lambda: pgettext("audit reason", "a value in the answer out of range"),
    "timeout": lambda: pgettext("audit reason", "no answer in time"),
    "rate_limit": lambda: pgettext("audit reason", "rate limit exceeded"),
    "transport": lambda: pgettext("audit reason", "server unreachable"),
    "protocol": lambda: pgettext("audit reason", "request refused by the server"),
    "tool:error": lambda: pgettext("audit reason", "the tool reported an error"),
    "tool:error_value": lambda: pgettext("audit reason", "the tool answered with its own error report"),
    "tool:unknown": lambda: pgettext("audit reason", "unknown tool"),
    "tool:too_many_calls": lambda: pgettext("audit reason", "too many tool calls in one model turn"),
    "tool:withdrawn": lambda: pgettext("audit reason", "tool withdrawn after repeated invalid arguments"),
    "tool:not_offered": lambda: pgettext("audit reason", "tool not offered to this agent"),
    "circuit:open": lambda: pgettext("audit reason", "server paused after repeated failures"),
    "local:busy": lambda: pgettext("audit reason", "not started: the binding's earlier calls still run"),
    "unexpected": lambda: pgettext("audit reason", "unexpected error"),
    "rule:matched": lambda: pgettext("audit reason", "rule matched"),
    "rule:skipped": lambda: pgettext("audit reason", "rule skipped"),
    "approval:pending": lambda: pgettext("audit reason", "awaiting approval"),
    "approval:approved": lambda: pgettext("audit reason", "approved"),
    "approval:rejected": lambda: pgettext("audit reason", "rejected by a person"),
    "approval:expired": lambda: pgettext("audit reason", "approval expired"),
    "approval:mismatch": lambda: pgettext("audit reason", "arguments differ from the approved ones"),
    "approval:outcome_unknown": lambda: pgettext("audit reason", "write outcome unknown"),
    "approval:unused": lambda: pgettext("audit reason", "the run ended without making this call"),
    "approval:unavailable": lambda: pgettext("audit reason", "no approval possible here"),
    "resource:unknown": lambda: pgettext("audit reason", "unknown resource"),
    "prompt:unknown": lambda: pgettext("audit reason", "unknown prompt"),
    "prompt:arguments": lambda: pgettext("audit reason", "wrong prompt arguments"),
    "flow:error": lambda: pgettext("audit reason", "flow node failed"),
    "flow:too_many_calls": lambda: pgettext("audit reason", "flow made too many tool calls"),
    "flow:too_many_steps": lambda: pgettext("audit reason", "flow ran past its step limit"),
    "eval:timeout": lambda: pgettext("audit reason", "evaluation timed out"),
    "eval:write_blocked": lambda: pgettext("audit reason", "write held back in an evaluation"),
    "eval:cancelled": lambda: pgettext("audit reason", "its eval run was cancelled"),
    "budget:run_ceiling": lambda: pgettext("audit reason", "run budget reached"),
    # How a run ended (its error code), as the runs list and a run's trace name it.
    "deterministic:tool_failed": lambda: pgettext("audit reason", "every deterministic call failed"),
    "deterministic:rule_error": lambda: pgettext("audit reason", "a deterministic rule failed"),
    "deterministic:tool_unknown": lambda: pgettext("audit reason", "a rule named a tool its server lacks"),
    "model:unavailable": lambda: pgettext("audit reason", "the model could not be reached"),
    "model:throttled": lambda: pgettext("audit reason", "the model's provider throttled the call"),
    "model:timeout": lambda: pgettext("audit reason", "the model did not answer in time"),
    "model:connection": lambda: pgettext("audit reason", "the connection to the model failed"),
    "model:validation": lambda: pgettext("audit reason", "the model's provider refused the request"),
    "model:auth": lambda: pgettext("audit reason", "the model's credentials were refused"),
    "model:error": lambda: pgettext("audit reason", "the model call failed"),
    "model:max_tokens": lambda: pgettext("audit reason", "the model's answer was cut off at its token limit"),
    "model:empty": lambda: pgettext("audit reason", "the model gave no answer"),
    "model:context_window": lambda: pgettext("audit reason", "the model's context window was full"),
    "model:content_filter": lambda: pgettext("audit reason", "a content filter stopped the model's answer"),
    "model:malformed": lambda: pgettext("audit reason", "the model's answer or tool call was malformed"),
    "max_iterations": lambda: pgettext("audit reason", "the agent reached its iteration limit"),
    "config:agent": lambda: pgettext("audit reason", "the agent's configuration is not valid"),
    "config:tool_name_conflict": lambda: pgettext("audit reason", "two tools share a name"),
    "config:model_endpoint_changed": lambda: pgettext(
        "audit reason", "the version's model endpoint is no longer the agent's"
    ),
    "cancelled": lambda: pgettext("audit reason", "cancelled"),
    "worker_lost": lambda: pgettext("audit reason", "its worker stopped"),
    "retries_exhausted": lambda: pgettext("audit reason", "an error a retry can fix came back at every pass"),
    "time_limit": lambda: pgettext("audit reason", "time limit reached"),
    "internal": lambda: pgettext("audit reason", "internal error"),
    "config:secret_unreadable": lambda: pgettext("audit reason", "a stored secret cannot be decrypted"),
    "login:failed:password": lambda: pgettext("audit reason", "wrong password"),
    "login:failed:unknown_user": lambda: pgettext("audit reason", "no user of that name"),
    "login:locked:user": lambda: pgettext("audit reason", "too many failed sign-ins for this user"),
    "login:locked:ip": lambda: pgettext("audit reason", "too many failed sign-ins from this address"),
}

_ARGUMENT_REASONS: dict[str, Callable[[str], str]] = {
    "missing": lambda arg: pgettext("audit reason", "argument %(arg)s missing") % {"arg": arg},
    "type": lambda arg: pgettext("audit reason", "argument %(arg)s of the wrong type") % {"arg": arg},
    "range": lambda arg: pgettext("audit reason", "argument %(arg)s out of range") % {"arg": arg},
    "allowed": lambda arg: pgettext("audit reason", "argument %(arg)s not an allowed value") % {"arg": arg},
    "unknown": lambda arg: pgettext("audit reason", "unknown argument %(arg)s") % {"arg": arg},
    "pattern": lambda arg: pgettext("audit reason", "argument %(arg)s does not match its pattern") % {"arg": arg},
    "host": lambda arg: pgettext("audit reason", "argument %(arg)s names a host not allowed") % {"arg": arg},
}


@functools.cache
def _entity_models() -> dict[str, type[models.Model]]:
    """Each configuration entity's model (``tool_contract`` → ToolContract), whose name the pages show."""
    found: dict[str, type[models.Model]] = {}
    for model in apps.get_models():
        entity = getattr(policy_of(model), "entity", None)
        if entity:
            found.setdefault(entity, model)
    return found


def action_label(action: str) -> str:
    """``action`` in words: ``tool.call`` → "tool call", ``config.tool_contract.update`` → "tool contract
    changed"; an unknown code as it is."""
    fixed = _ACTIONS.get(action)
    if fixed is not None:
        return fixed()
    if action.startswith(CONFIG_ACTION_PREFIX):
        entity, _dot, verb = action[len(CONFIG_ACTION_PREFIX) :].rpartition(".")
        model = _entity_models().get(entity)
        verb_name = _VERBS.get(verb)
        if model is not None and verb_name is not None:
            entity_name = str(model._meta.verbose_name)
            return pgettext("audit change", "%(entity)s %(verb)s") % {"entity": entity_name, "verb": verb_name()}
    return action


def reason_label(reason: str) -> str:
    """``reason`` in words (``args:allowed:region`` → "argument region not an allowed value"); "" for none; an
    unknown code as it is. The name a reason quotes (an argument the model wrote, a server) is written with what
    does not show itself written out (``⟦U+202E⟧``, ``audit.visible``): it is a caller's text, shown in words."""
    if not reason:
        return ""
    fixed = _REASONS.get(reason)
    if fixed is not None:
        return fixed()
    kind, _sep, rest = reason.partition(":")
    if kind == "args" and rest:
        check, _sep, argument = rest.partition(":")
        if argument and check in _ARGUMENT_REASONS:
            return _ARGUMENT_REASONS[check](visible_text(argument))
    if reason.startswith("mcp:not_loaded:"):
        return pgettext("audit reason", "server %(server)s not connected") % {
            "server": visible_text(reason.removeprefix("mcp:not_loaded:"))
        }
    # Why a run's tool selection ranked by keywords, not by embeddings (``agents.tool_selection``): none is set
    # up, or the service or its vectors failed (``embedding:<the failure>``, the code beside the words says which).
    if kind == "embedding" and rest:
        if rest == "not_configured":
            return pgettext("audit reason", "no embedding service is configured; tools ranked by keywords")
        return pgettext("audit reason", "the embedding ranker failed; tools ranked by keywords")
    return reason


# Who did it, as the record names them (``audit.change_guard.actor_label``, and the runs and approvals that write
# their own): fixed actors, then the kinds whose name follows a colon.
_ACTORS: dict[str, Callable[[], str]] = {
    "system:live": lambda: pgettext("audit actor", "live run (no API key)"),
    "system:eval": lambda: pgettext("audit actor", "eval run"),
    "system:shadow": lambda: pgettext("audit actor", "shadow run"),
    "system:unattributed": lambda: pgettext("audit actor", "unattributed (outside the platform's services)"),
    "system:login_guard": lambda: pgettext("audit actor", "sign-in guard"),
    "eval:timeout": lambda: pgettext("audit actor", "eval case time limit"),
}

_ACTOR_KINDS: dict[str, Callable[[str], str]] = {
    "admin": lambda name: pgettext("audit actor", "%(user)s (admin)") % {"user": name},
    "rule-tester": lambda name: pgettext("audit actor", "%(user)s (rule tester)") % {"user": name},
    "api_key": lambda prefix: pgettext("audit actor", "API key %(prefix)s…") % {"prefix": prefix},
}


def actor_in_words(actor: str) -> str:
    """Who did it, in words: ``admin:alice`` → "alice (admin)", ``api_key:apk_ab12`` → "API key apk_ab12…",
    ``system:live`` → "live run (no API key)", ``system:run_eval`` → "run_eval command"; "" for none; any other
    form (a username, as a change made on the admin pages records it) as it is. What the record adds after a space
    (``api_key:apk_ab12 (client gone)``) follows as recorded. The stored code stays the record's: filters and
    exports use it. The name an actor quotes is written with what does not show itself written out
    (``audit.visible``)."""
    if not actor:
        return ""
    who, space, rest = actor.partition(" ")
    fixed = _ACTORS.get(who)
    kind, _colon, name = who.partition(":")
    if fixed is not None:
        words = fixed()
    elif name and kind in _ACTOR_KINDS:
        words = _ACTOR_KINDS[kind](visible_text(name))
    elif name and kind == "system" and name in get_commands():
        words = pgettext("audit actor", "%(command)s command") % {"command": name}
    else:
        return visible_text(actor)
    return f"{words}{space}{visible_text(rest)}"


def via_label(via: str) -> str:
    """The path a configuration change took (its ``via``), in words: a path that is an event's source (``admin``,
    ``api``) as the audit list names that source ("admin"), a command's ("seed_demo") as "seed_demo command"; ""
    for none; any other as it is."""
    if not via:
        return ""
    if via in AuditEvent.Source.values:
        return str(AuditEvent.Source(via).label)
    if via == "command":
        return pgettext("audit via", "a command")
    if via == "django":
        return pgettext("audit via", "outside the platform's services")
    if via in get_commands():
        return pgettext("audit actor", "%(command)s command") % {"command": via}
    return visible_text(via)


def breakable(code: str) -> str:
    """``code`` (``config.tool_contract.update``, ``api_key:apk_x``, ``deterministic:tool_failed``) as HTML with
    places to break after its dots, colons and underscores, so a narrow column wraps it there rather than after
    any letter. What does not show itself is written out (``⟦U+202E⟧``, ``audit.visible``): a recorded tool name
    or actor is a server's or a caller's text, and ``get\\u202eeteled`` would read ``getdeleted`` in the column."""
    pieces = re.split(r"(?<=[.:_])", visible_text(code))
    return format_html_join("", "{}<wbr>", ((piece,) for piece in pieces if piece))


def when_cell(moment: Any) -> str:
    """A list cell's time: the local date above the local time with its zone, each kept whole
    (``2026-12-04`` / ``03:32:41 KST``), the same in every list."""
    local = timezone.localtime(moment)
    return format_html(
        '<span class="cell-nowrap">{}</span><br><span class="cell-nowrap">{}</span>',
        date_format(local, "Y-m-d"),
        date_format(local, "H:i:s T"),
    )


_PERMISSIONS: dict[str, Callable[[], str]] = {
    "add": lambda: pgettext("permission", "Can add %(model)s"),
    "change": lambda: pgettext("permission", "Can change %(model)s"),
    "delete": lambda: pgettext("permission", "Can delete %(model)s"),
    "view": lambda: pgettext("permission", "Can view %(model)s"),
}


def permission_label(permission: Any) -> str:
    """A permission as the group and user pages list it, in the reader's language: ``에이전트 | 승인 | 승인 보기``
    (the stored name, ``Can view approval``, is written once in English when the permission is created). A
    permission that is no model's default one is named as stored."""
    content_type = permission.content_type
    model = content_type.model_class()
    if model is None:
        return str(permission)
    action, _sep, model_name = permission.codename.partition("_")
    if (
        model_name != model._meta.model_name
        or action not in model._meta.default_permissions
        or action not in _PERMISSIONS
    ):
        return str(permission)
    app = apps.get_app_config(content_type.app_label).verbose_name
    name = _PERMISSIONS[action]() % {"model": model._meta.verbose_name}
    return f"{app} | {model._meta.verbose_name} | {name}"
