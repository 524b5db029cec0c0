"""Changes made in the admin are audited: who created, changed or deleted which binding, tool, tool contract,
rule, agent or API key, and what changed.

Add :class:`AuditedChangesAdminMixin` first among a ``ModelAdmin``'s bases. Each save or delete, and each row
an inline adds, changes or deletes (a tool's contract, an agent's rules), writes one audit event in the same
transaction as the change (the admin's change and delete views run in one; a bulk delete gets its own):

* ``source="admin"``, ``action="<entity>.create|update|delete"`` (``mcp_server``, ``mcp_tool``,
  ``tool_contract``, ``deterministic_rule``, ``agent``, ``api_key``; else the model's name);
* ``actor``: the admin's username;
* ``args``: the diff ``{field: [old, new]}`` of the fields the form changed (on create, every field given;
  on delete, every stored value). Related objects appear by name, many-to-many fields as sorted lists;
* a secret field (an ``EncryptedJSONField``: a binding's ``env`` and ``headers``) appears only as
  ``{"env": "changed"}``: never a value, old or new, nor a digest of one;
* ``mcp_id`` and ``tool``: the server and tool the object concerns, so the audit list's filters find it;
* ``result``: which object (``{"model", "id", "name"}``), and on delete what went with it.

An update that changes nothing is not recorded.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import models, router, transaction
from django.db.models.deletion import Collector, ProtectedError, RestrictedError
from django.forms import BaseModelForm, BaseModelFormSet
from django.http import HttpRequest

from agents.models import DeterministicRule
from audit.services import audit_event_record
from mcpregistry.crypto import EncryptedJSONField
from mcpregistry.models import McpServer, McpTool, ToolContract

SECRET_CHANGED = "changed"  # noqa: S105 - the word recorded in place of a secret, not a secret

ENTITY_NAMES = {
    "mcpregistry.mcpserver": "mcp_server",
    "mcpregistry.mcptool": "mcp_tool",
    "mcpregistry.toolcontract": "tool_contract",
    "agents.deterministicrule": "deterministic_rule",
    "agents.agent": "agent",
    "agents.apikey": "api_key",
}


def entity_name(model: type[models.Model]) -> str:
    return ENTITY_NAMES.get(model._meta.label_lower, model._meta.model_name or "object")


def is_secret_field(field: Any) -> bool:
    return isinstance(field, EncryptedJSONField)


def recorded_fields(model: type[models.Model], names: Any = None) -> list[str]:
    """The fields of ``model`` a change record covers: the editable concrete and many-to-many fields (``names``
    limits them to a form's), plus every secret field, whose changes arrive through other form fields."""
    return [
        field.name
        for field in [*model._meta.concrete_fields, *model._meta.many_to_many]
        if is_secret_field(field)
        or (field.editable and not field.primary_key and (names is None or field.name in names))
    ]


def snapshot(obj: models.Model, names: list[str]) -> dict[str, Any]:
    """The values of ``names`` on ``obj`` as plain JSON; a secret field as a digest, only to tell whether it
    changed (never recorded)."""
    values: dict[str, Any] = {}
    for name in names:
        field = obj._meta.get_field(name)
        if is_secret_field(field):
            raw = json.dumps(field.value_from_object(obj), sort_keys=True, cls=DjangoJSONEncoder)
            values[name] = hashlib.sha256(raw.encode("utf-8")).hexdigest()
        elif field.many_to_many:
            values[name] = sorted(str(o) for o in getattr(obj, name).all()) if obj.pk is not None else []
        elif field.is_relation:
            related = getattr(obj, name)
            values[name] = str(related) if related is not None else None
        else:
            values[name] = json.loads(json.dumps(field.value_from_object(obj), cls=DjangoJSONEncoder))
    return values


def change_diff(
    model: type[models.Model], before: dict[str, Any], after: dict[str, Any], names: list[str]
) -> dict[str, Any]:
    """``{field: [old, new]}`` for each of ``names`` whose value differs; a secret field as ``"changed"``."""
    diff: dict[str, Any] = {}
    for name in names:
        old, new = before.get(name), after.get(name)
        if old == new:
            continue
        diff[name] = SECRET_CHANGED if is_secret_field(model._meta.get_field(name)) else [old, new]
    return diff


def target_of(obj: models.Model) -> tuple[str, str]:
    """The server and tool an admin change concerns (empty where none)."""
    if isinstance(obj, McpServer):
        return obj.mcp_id, ""
    if isinstance(obj, McpTool):
        return obj.server.mcp_id, obj.name
    if isinstance(obj, ToolContract):
        return obj.tool.server.mcp_id, obj.tool.name
    if isinstance(obj, DeterministicRule):
        return (obj.server.mcp_id if obj.server_id else ""), obj.tool_name
    return "", ""


def admin_change_record(
    *,
    request: HttpRequest,
    obj: models.Model,
    verb: str,
    diff: dict[str, Any],
    target: tuple[str, str] | None = None,
    pk: Any = None,
    extra: dict[str, Any] | None = None,
) -> None:
    mcp_id, tool = target if target is not None else target_of(obj)
    audit_event_record(
        source="admin",
        action=f"{entity_name(type(obj))}.{verb}",
        mcp_id=mcp_id,
        tool=tool,
        args=diff,
        result={
            "model": obj._meta.label_lower,
            "id": pk if pk is not None else obj.pk,
            "name": str(obj),
            **(extra or {}),
        },
        actor=request.user.get_username(),
    )


class AuditedChangesAdminMixin:
    """Records every create, update and delete made through this ``ModelAdmin`` (and its inlines) as an audit
    event in the change's transaction. Keeps the admin's own behaviour: each override calls ``super()``, except
    ``save_related``, which repeats ``ModelAdmin.save_related`` (many-to-many, then inlines) to record the object
    between the two."""

    def save_model(self, request: HttpRequest, obj: Any, form: BaseModelForm, change: bool) -> None:
        names = recorded_fields(type(obj), form.fields)
        # The form's instance already holds the new values (set during validation): read the old ones.
        stored = type(obj)._default_manager.filter(pk=obj.pk).first() if change and obj.pk is not None else None
        form._audit_before = snapshot(stored, names) if stored is not None else {}  # type: ignore[attr-defined]
        form._audit_names = names  # type: ignore[attr-defined]
        super().save_model(request, obj, form, change)  # type: ignore[misc]

    def save_related(self, request: HttpRequest, form: BaseModelForm, formsets: Any, change: bool) -> None:
        # ModelAdmin.save_related, with the object's own record between its many-to-many fields and its inlines.
        with transaction.atomic(using=router.db_for_write(form.instance.__class__)):
            form.save_m2m()
            names = getattr(form, "_audit_names", None)
            if names is not None:
                obj = form.instance
                after = snapshot(obj, names)
                before = form._audit_before  # type: ignore[attr-defined]
                diff = change_diff(type(obj), before, after, names) if change else _created_diff(type(obj), after)
                if diff or not change:
                    admin_change_record(request=request, obj=obj, verb="update" if change else "create", diff=diff)
            for formset in formsets:
                self.save_formset(request, form, formset, change=change)  # type: ignore[attr-defined]

    def save_formset(self, request: HttpRequest, form: BaseModelForm, formset: BaseModelFormSet, change: bool) -> None:
        model = formset.model
        names = recorded_fields(model, formset.form.base_fields)
        touched = [f for f in formset.initial_forms if f.instance.pk is not None and f.has_changed()]
        deleted = {id(f.instance): f.instance.pk for f in formset.deleted_forms if f.instance.pk is not None}
        pks = [f.instance.pk for f in touched] + list(deleted.values())
        before = {o.pk: snapshot(o, names) for o in model._default_manager.filter(pk__in=pks)}
        targets = {id(f.instance): target_of(f.instance) for f in formset.deleted_forms if f.instance.pk is not None}
        with transaction.atomic(using=router.db_for_write(model)):
            super().save_formset(request, form, formset, change)  # type: ignore[misc]
            for obj in formset.new_objects:
                diff = _created_diff(model, snapshot(obj, names))
                admin_change_record(request=request, obj=obj, verb="create", diff=diff)
            for obj, _changed in formset.changed_objects:
                diff = change_diff(model, before.get(obj.pk, {}), snapshot(obj, names), names)
                if diff:
                    admin_change_record(request=request, obj=obj, verb="update", diff=diff)
            for obj in formset.deleted_objects:
                pk = deleted.get(id(obj))
                old = before.get(pk, {})
                diff = _deleted_diff(model, old)
                admin_change_record(
                    request=request, obj=obj, verb="delete", diff=diff, target=targets.get(id(obj)), pk=pk
                )

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        record = _deletion_record(obj)
        with transaction.atomic(using=router.db_for_write(type(obj))):
            super().delete_model(request, obj)  # type: ignore[misc]
            admin_change_record(request=request, obj=obj, verb="delete", **record)

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        with transaction.atomic(using=router.db_for_write(queryset.model)):
            records = [(obj, _deletion_record(obj)) for obj in queryset]
            super().delete_queryset(request, queryset)  # type: ignore[misc]
            for obj, record in records:
                admin_change_record(request=request, obj=obj, verb="delete", **record)


_EMPTY_SECRET = hashlib.sha256(b"{}").hexdigest()
_EMPTY_VALUES: tuple[Any, ...] = (None, "", [], {}, _EMPTY_SECRET)


def _created_diff(model: type[models.Model], after: dict[str, Any]) -> dict[str, Any]:
    """A new object's values as ``{field: [None, value]}`` (empty ones left out); a secret as ``"changed"``."""
    return {
        n: (SECRET_CHANGED if is_secret_field(model._meta.get_field(n)) else [None, v])
        for n, v in after.items()
        if v not in _EMPTY_VALUES
    }


def _deleted_diff(model: type[models.Model], before: dict[str, Any]) -> dict[str, Any]:
    """A deleted object's values as ``{field: [value, None]}`` (empty ones left out); a secret as ``"changed"``."""
    return {
        n: (SECRET_CHANGED if is_secret_field(model._meta.get_field(n)) else [v, None])
        for n, v in before.items()
        if v not in _EMPTY_VALUES
    }


def _deletion_record(obj: models.Model) -> dict[str, Any]:
    """What a delete record needs, taken before the row goes: the stored values, the target, the pk, and the
    rows that go with it (cascades), counted per model."""
    model = type(obj)
    diff = _deleted_diff(model, snapshot(obj, recorded_fields(model)))
    cascaded: dict[str, int] = {}
    collector = Collector(using=router.db_for_write(model), origin=obj)
    try:
        collector.collect([obj])
    except (ProtectedError, RestrictedError):
        pass  # the delete itself is refused, with the admin's own message
    else:
        for related_model, instances in collector.data.items():
            count = sum(1 for i in instances if not (related_model is model and i.pk == obj.pk))
            if count and not related_model._meta.auto_created:
                label = related_model._meta.label_lower
                cascaded[label] = cascaded.get(label, 0) + count
        for rows in collector.fast_deletes:
            if not rows.model._meta.auto_created and (count := rows.count()):
                label = rows.model._meta.label_lower
                cascaded[label] = cascaded.get(label, 0) + count
    extra = {"also_deleted": cascaded} if cascaded else {}
    return {"diff": diff, "target": target_of(obj), "pk": obj.pk, "extra": extra}
