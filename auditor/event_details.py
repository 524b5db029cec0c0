"""What an audit event says, as a reader takes it in: a configuration change as a table of its settings (the
setting's name in the reader's language beside its code, the value before and after), what was changed (linked
to its page while it exists), and a rule decision as a sentence (the rule, matched or skipped, and why, in
words). The event's stored JSON is unchanged and shown too: these are readings of it, never replacements.

Anything these readings do not know (a change recorded in another shape, a model since removed) is shown as it
was recorded. Every recorded text is shown through :func:`audit.visible.visible_text`, as the folded JSON is: a
tool's description, a name or a value may hold characters that do not show themselves (tag characters a model
reads, a direction override that makes a name read backwards), written out as ``⟦U+202E⟧``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from django.apps import apps
from django.contrib.auth.models import Permission
from django.core.exceptions import FieldDoesNotExist, ValidationError
from django.db import models
from django.template.loader import render_to_string
from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext, pgettext

from agents.decision_reasons import reason_text
from audit.changes import CONFIG_ACTION_PREFIX
from audit.labels import permission_label
from audit.masking import mask_known
from audit.models import AuditEvent
from audit.visible import visible_text

MASKED_WHEN_SHOWN = ("mcp_id", "args", "result", "tool", "call_id", "reason", "actor")
"""What an auditor is served of an event that may quote a caller's, a model's or a tool's text (or a server's id, which
an admin may have made equal to a token: the metrics and the filters mask it too): masked again when
it is shown or exported (:func:`masked_when_shown`), with the secrets bound now (``audit.changes.configured_secrets``):
an event was masked with those known when it was recorded, and a value bound as a secret after (a token a user had
typed, then given to a server) is in none of them."""

MASKED_AFTER_RECORDING = "masked_after_recording"
"""The member an exported event (the API's JSON, ``?format=jsonl``) carries, ``true``, where masking it when served
changed it: its ``hash`` is of the event as recorded, so the event as exported no longer hashes to it."""


def masked_when_shown(
    values: dict[str, Any], secrets: Iterable[str], *, fields: Iterable[str] = MASKED_WHEN_SHOWN
) -> bool:
    """Mask ``values``'s ``fields`` (an event's, by name) in place with the known ``secrets`` (and the registered
    ones: ``audit.masking.mask_known``, nothing else, so a recorded structure keeps its shape). Returns whether any
    changed."""
    changed = False
    for name in fields:
        if name in values and values[name] is not None:
            shown = mask_known(values[name], secrets=secrets)
            if shown != values[name]:
                values[name] = shown
                changed = True
    return changed


def event_masked_when_shown(
    event: AuditEvent, secrets: Iterable[str], *, fields: Iterable[str] = MASKED_WHEN_SHOWN
) -> bool:
    """:func:`masked_when_shown` on an event loaded to be shown (never saved: the audit record is read-only)."""
    names = list(fields)
    values = {name: getattr(event, name) for name in names}
    if not masked_when_shown(values, secrets, fields=names):
        return False
    for name, value in values.items():
        setattr(event, name, value)
    return True


# What a change of a set of names did (a secret map's names, a user's groups): the kinds the recorders write.
_NAME_CHANGES: dict[str, Callable[[], str]] = {
    "set": lambda: pgettext("audit names", "set"),
    "changed": lambda: pgettext("audit names", "changed"),
    "cleared": lambda: pgettext("audit names", "cleared"),
    "re-encrypted": lambda: pgettext("audit names", "re-encrypted"),
    "add": lambda: pgettext("audit names", "added"),
    "remove": lambda: pgettext("audit names", "removed"),
    "clear": lambda: pgettext("audit names", "all removed"),
}

_EMPTY: tuple[Any, ...] = (None, "", [], {})


def _shown(value: Any) -> str:
    """A recorded value as text a reader sees whole: what does not show itself written out (``⟦U+202E⟧``)."""
    return visible_text(str(value))


@dataclass(frozen=True)
class ChangeRow:
    label: str  # the setting's name in the reader's language ("" when the model no longer has it)
    code: str  # the setting's name as recorded
    before: SafeString
    after: SafeString
    names: bool = False  # a set of names that changed (a secret map's, a user's groups): the names are in after


def is_config_change(event: AuditEvent) -> bool:
    return event.action.startswith(CONFIG_ACTION_PREFIX)


def _verb(event: AuditEvent) -> str:
    return event.action.rpartition(".")[2]


def _model(label: Any) -> type[models.Model] | None:
    try:
        return apps.get_model(str(label))
    except (LookupError, ValueError):
        return None


def _field(model: type[models.Model] | None, name: str) -> Any:
    if model is None:
        return None
    try:
        return model._meta.get_field(name)
    except FieldDoesNotExist:
        return None


def value_html(value: Any, field: Any = None) -> SafeString:
    """One recorded value as people read it: "—" for none, yes/no, a choice's words beside its code, a list one
    item a line, text with its line breaks, anything nested as indented JSON (Korean as it is)."""
    if value in _EMPTY:
        return format_html('<span class="audit-empty">{}</span>', "—")
    if isinstance(value, bool):
        return format_html("{}", gettext("Yes") if value else gettext("No"))
    choices = dict(getattr(field, "flatchoices", None) or ())
    if isinstance(value, (str, int)) and value in choices and str(choices[value]) != str(value):
        return format_html('{} <code class="audit-code">{}</code>', choices[value], _shown(value))
    if isinstance(value, str):
        return format_html('<div class="audit-text">{}</div>', _shown(value))
    if isinstance(value, (int, float)):
        return format_html("{}", value)
    if isinstance(value, list) and all(isinstance(item, (str, int, float)) for item in value):
        return format_html(
            '<ul class="audit-list">{}</ul>', SafeString("".join(format_html("<li>{}</li>", _shown(i)) for i in value))
        )
    return format_html("<pre>{}</pre>", _shown(json.dumps(value, ensure_ascii=False, indent=2)))


def _names_html(change: Mapping[str, Any]) -> SafeString:
    """``{"set": ["TOKEN"], "cleared": ["OLD"]}`` → "set: TOKEN" and "cleared: OLD", a line each (names only:
    a secret's value is never recorded)."""
    lines = [
        format_html(
            "<li>{}: {}</li>",
            _NAME_CHANGES[kind]() if kind in _NAME_CHANGES else _shown(kind),
            _shown(
                ", ".join(str(n) for n in names) if isinstance(names, list) else json.dumps(names, ensure_ascii=False)
            ),
        )
        for kind, names in change.items()
    ]
    return format_html('<ul class="audit-list">{}</ul>', SafeString("".join(lines)))


def _permissions_in_words(value: Any) -> Any:
    """A list of permissions recorded by their language-neutral names (``agents.view_approval``) with each named
    in the reader's language beside it; names of no permission (and older records, written in words) as they
    are."""
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        return None
    known = {
        f"{p.content_type.app_label}.{p.codename}": p
        for p in Permission.objects.select_related("content_type").filter(
            codename__in=[v.partition(".")[2] for v in value]
        )
    }
    return format_html(
        '<ul class="audit-list">{}</ul>',
        SafeString(
            "".join(
                format_html('<li>{} <code class="audit-code">{}</code></li>', permission_label(known[v]), v)
                if v in known
                else format_html("<li>{}</li>", _shown(v))
                for v in value
            )
        ),
    )


def change_rows(event: AuditEvent) -> list[ChangeRow] | None:
    """The settings a configuration change recorded, in the order recorded; ``None`` when its arguments are not
    a change's shape (then the page shows them as recorded)."""
    if not is_config_change(event) or not isinstance(event.args, dict) or not isinstance(event.result, dict):
        return None
    model = _model(event.result.get("model"))
    rows: list[ChangeRow] = []
    for name, change in event.args.items():
        field = _field(model, name)
        label = str(getattr(field, "verbose_name", "") or "")
        if isinstance(change, list) and len(change) == 2:
            before, after = value_html(change[0], field), value_html(change[1], field)
            if getattr(field, "related_model", None) is Permission:
                before = _permissions_in_words(change[0]) or before
                after = _permissions_in_words(change[1]) or after
        elif isinstance(change, dict):
            before, after = value_html(None), _names_html(change)
        else:
            return None
        label = label if label and label != name else ""
        rows.append(ChangeRow(label, _shown(name), before, after, names=isinstance(change, dict)))
    return rows


CanView = Callable[[type[models.Model]], bool]
"""Whether the reader may view a model's pages (an auditor may not view an agent's, say)."""


def _object_html(reference: Mapping[str, Any], *, site_name: str, can_view: CanView) -> SafeString:
    """``{"model": "agents.agent", "id": 1, "name": "company-assistant"}`` → "에이전트 #1 company-assistant",
    linked to its page while it exists, for a reader who may view it (to anyone else: the record's words only,
    which tell nothing of what exists now)."""
    model = _model(reference.get("model"))
    kind = str(model._meta.verbose_name) if model is not None else _shown(reference.get("model") or "")
    text = format_html("{} #{} {}", kind, _shown(reference.get("id", "?")), _shown(reference.get("name", "")))
    if model is None or reference.get("id") is None or not can_view(model):
        return text
    try:
        pk = model._meta.pk.to_python(reference["id"])
        exists = model._default_manager.filter(pk=pk).exists()
        url = reverse(
            f"admin:{model._meta.app_label}_{model._meta.model_name}_change", args=[pk], current_app=site_name
        )
    except (ValueError, TypeError, ValidationError, NoReverseMatch):
        return text  # an id of another shape than the model's key, or a model without an admin page
    if not exists:
        return format_html('{} <span class="audit-empty">({})</span>', text, gettext("no longer exists"))
    return format_html('<a href="{}">{}</a>', url, text)


def change_html(event: AuditEvent, *, site_name: str, can_view: CanView) -> SafeString | None:
    """A configuration change at a glance: what was changed, by which path, with what else (rows deleted with
    it, the deleted row this change follows from), and the table of its settings."""
    rows = change_rows(event)
    if rows is None:
        return None
    result = event.result
    verb = _verb(event)
    also = result.get("also_deleted")
    context = {
        "target": _object_html(result, site_name=site_name, can_view=can_view),
        "via": _shown(result.get("via", "")),
        "deleted_with": _object_html(result["deleted_with"], site_name=site_name, can_view=can_view)
        if isinstance(result.get("deleted_with"), dict)
        else None,
        "also_deleted": [
            format_html("{} × {}", str(m._meta.verbose_name_plural) if (m := _model(label)) else _shown(label), count)
            for label, count in also.items()
        ]
        if isinstance(also, dict)
        else [],
        "rows": rows,
        # A creation has only values, a deletion only the values it had; a change both.
        "single": verb in ("create", "delete"),
        "value_heading": gettext("value when deleted") if verb == "delete" else gettext("value"),
    }
    if context["single"]:
        # A deletion's values are its "before"s; a set of names (its secrets' names, cleared) is always an "after".
        context["rows"] = [
            ChangeRow(r.label, r.code, r.before, r.before if verb == "delete" and not r.names else r.after)
            for r in rows
        ]
    return SafeString(render_to_string("admin/audit/auditevent/change_table.html", context))


def rule_decision_html(event: AuditEvent, *, site_name: str, can_view: CanView) -> SafeString | None:
    """ "Rule «증감 계산» (#7): skipped — the regex did not match", the rule linked to its page."""
    if event.action != "rule.decision" or not isinstance(event.result, dict):
        return None
    result = event.result
    matched = bool(result.get("matched"))
    rule_name = str(result.get("rule", ""))
    rule_id = event.call_id.removeprefix("rule:") if event.call_id.startswith("rule:") else ""
    rule: SafeString = format_html("«{}»", _shown(rule_name))
    if rule_id.isascii() and rule_id.isdigit():
        reference = {"model": "agents.deterministicrule", "id": int(rule_id), "name": f"«{rule_name}»"}
        rule = _object_html(reference, site_name=site_name, can_view=can_view)
    verdict = gettext("matched") if matched else pgettext("rule decision", "skipped")
    reason = str(result.get("reason", ""))
    return format_html(
        "{}: <strong>{}</strong>{}",
        rule,
        verdict,
        format_html(" — {}", _shown(reason_text(reason))) if reason and reason != "matched" else "",
    )
