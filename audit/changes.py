"""Every change to the platform's configuration is a service call that writes the change and its audit event in
one transaction (Zulip's pattern), whoever makes it: an admin page, an admin action, a command, the API, an
import.

The pieces, all generic (this module names no model of the other apps; they declare themselves):

* A model whose rows are configuration declares ``change_audit = ChangeAudit(entity=...)`` (fields that are
  operational state, such as a server's health, are listed in ``operational_fields``); a model whose rows are
  not configuration declares ``change_audit = NotConfiguration(reason)``. A test holds every model of the apps
  to one or the other.
* The services (``mcpregistry.services``, ``agents.services``, ``audit.roles``) call :func:`audited_save` /
  :func:`audited_delete` (or :func:`config_change_record` for a change they make themselves) inside
  :func:`change_scope`, which names the actor and the path (``via``: ``admin``, ``api``, ``import_config``,
  ``seed_demo``, ...).
* Configuration models refuse a write made outside a change scope (:class:`UnauditedChangeError`): ``save``,
  ``delete``, the queryset's ``update``/``delete``/``bulk_*`` and many-to-many changes. A write that touches
  only ``operational_fields`` is allowed. So a new path that forgets its service fails at once, in production
  and in the tests, instead of leaving a silent gap in the record.

The event: ``source="admin"`` (a change to the configuration is an administrator's act, whatever the path),
``action="config.<entity>.<verb>"`` (``create``, ``update``, ``delete`` or a named act such as
``review_approve``), ``actor`` (a username, ``api_key:<prefix>`` or ``system:<command>``), ``args`` the masked
diff ``{field: [old, new]}`` (a secret map as ``{field: {"set"|"changed"|"cleared": [NAME, ...]}}``, never a value), and
``result`` ``{"model", "id", "name", "via"}``.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar, cast

from django.apps import apps
from django.contrib.auth.models import Permission
from django.core.exceptions import FieldDoesNotExist
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models, router, transaction
from django.db.models.deletion import Collector, ProtectedError, RestrictedError
from django.utils import translation

from audit.change_guard import (
    ChangeAudit,
    NotConfiguration,
    UnauditedChangeError,
    change_scope,
    changed_since_loaded,
    current_scope,
    policy_of,
    remember_loaded,
    rows_read_only,
    values_differ,
)
from audit.masking import credential_like
from audit.services import audit_event_record

__all__ = [
    "ChangeAudit",
    "NotConfiguration",
    "UnauditedChangeError",
    "audited_delete",
    "audited_save",
    "change_scope",
    "config_change_record",
    "configured_secrets",
    "instance_changes",
]

M = TypeVar("M", bound=models.Model)

SECRET_SET = "set"  # noqa: S105 - the words recorded in place of a secret, not secrets
SECRET_CHANGED = "changed"  # noqa: S105
SECRET_CLEARED = "cleared"  # noqa: S105
# The name recorded for a secret map stored with a key this process lacks (its names cannot be read either).
SECRET_UNREADABLE = "(unreadable)"  # noqa: S105
CONFIG_ACTION_PREFIX = "config."


# --- snapshots and diffs --------------------------------------------------------------------------------------


def is_secret_field(model_field: Any) -> bool:
    """A field whose values are secrets (a binding's env and headers): declared by the field, ``secret = True``."""
    return bool(getattr(model_field, "secret", False))


def recorded_fields(model: type[models.Model]) -> list[str]:
    """The fields a change record covers: the concrete and many-to-many fields, less the primary key, the
    timestamps the database keeps, and the model's operational fields."""
    policy = policy_of(model)
    operational = (
        policy.operational_fields | policy.unrecorded_fields if isinstance(policy, ChangeAudit) else frozenset()
    )
    return [
        f.name
        for f in [*model._meta.concrete_fields, *model._meta.many_to_many]
        if not f.primary_key
        and f.name not in operational
        and not getattr(f, "auto_now", False)
        and not getattr(f, "auto_now_add", False)
    ]


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, cls=DjangoJSONEncoder).encode("utf-8")).hexdigest()


def related_names(rows: Any) -> list[str]:
    """How the record names the rows of a many-to-many field: each by its ``str``, but a permission by its
    language-neutral name, ``app_label.codename`` (``agents.view_approval``, as ``has_perm`` takes it): Django's
    ``str`` of a permission is written in the active language ("에이전트 | 승인 | Can view approval" from a Korean
    page, "Agents | approval | …" from a command), and the record must not depend on who read which page."""
    if getattr(rows, "model", None) is Permission:
        return [f"{p.content_type.app_label}.{p.codename}" for p in rows.select_related("content_type")]
    return [recorded_name(row) for row in rows]


def recorded_name(obj: Any) -> str:
    """How the record names a row: its ``str`` in no language (the msgids, English), whoever's page made the
    change: a row's name may be said in its reader's language on the admin's pages (a budget: "API 키 … / 일"),
    and the record must not depend on who read which page."""
    with translation.override(None):
        return str(obj)


def snapshot(obj: models.Model | None, names: list[str]) -> dict[str, Any]:
    """The values of ``names`` on ``obj`` as plain JSON. A secret map is kept as ``{NAME: digest}``, only to
    tell what changed (a digest is never recorded)."""
    if obj is None:
        return {}
    values: dict[str, Any] = {}
    for name in names:
        model_field: Any = obj._meta.get_field(name)
        if is_secret_field(model_field):
            stored = model_field.value_from_object(obj)
            if getattr(stored, "unreadable_secrets", False):  # mcpregistry.crypto.UnreadableSecrets: kept as is
                values[name] = {SECRET_UNREADABLE: _digest(stored.token)}
            else:
                values[name] = {k: _digest(v) for k, v in stored.items()} if isinstance(stored, dict) else {}
        elif model_field.many_to_many:
            values[name] = sorted(related_names(getattr(obj, name).all())) if obj.pk is not None else []
        elif model_field.is_relation:
            related = getattr(obj, name)
            values[name] = str(related) if related is not None else None
        else:
            values[name] = json.loads(json.dumps(model_field.value_from_object(obj), cls=DjangoJSONEncoder))
    return values


def secret_diff(before: Mapping[str, str], after: Mapping[str, str]) -> dict[str, list[str]]:
    """The names of a secret map that were ``set`` (new), ``changed`` or ``cleared``, as lists of names (never a
    value; names are list items, not keys, so that masking by key name does not hide which one changed)."""
    diff: dict[str, list[str]] = {}
    for name in sorted(set(before) | set(after)):
        if name not in before:
            kind = SECRET_SET
        elif name not in after:
            kind = SECRET_CLEARED
        elif before[name] != after[name]:
            kind = SECRET_CHANGED
        else:
            continue
        diff.setdefault(kind, []).append(name)
    return diff


_EMPTY: tuple[Any, ...] = (None, "", [], {})


def _recorded_differ(a: Any, b: Any) -> bool:
    """Whether a field's value changed in what it means: JSON by its text with its keys sorted (``true``, ``1`` and
    ``1.0`` differ; the order of an object's keys, which a re-import or a form may change, does not), anything else
    as ``values_differ`` compares it."""
    if isinstance(a, dict | list) or isinstance(b, dict | list):
        try:
            return json.dumps(a, sort_keys=True, default=str) != json.dumps(b, sort_keys=True, default=str)
        except (TypeError, ValueError):  # keys JSON cannot sort (mixed types): as Python compares them
            return bool(a != b)
    return values_differ(a, b)


def change_diff(
    model: type[models.Model], before: Mapping[str, Any], after: Mapping[str, Any], *, creating: bool = False
) -> dict[str, Any]:
    """``{field: [old, new]}`` for each recorded field that differs (on create: each that is not empty); a
    secret map as ``{field: {set|changed|cleared: [NAME, ...]}}``. Differs as JSON reads it (``_recorded_differ``):
    a JSON value that changes only its type (``1`` → ``true`` → ``1.0``, equal to Python's ``==``) is written, and
    was recorded nowhere."""
    diff: dict[str, Any] = {}
    for name in after.keys() | before.keys():
        old, new = before.get(name), after.get(name)
        if creating and new in _EMPTY:
            continue
        if not _recorded_differ(old, new):
            continue
        if is_secret_field(model._meta.get_field(name)):
            names = secret_diff(old or {}, new or {})
            if names:
                diff[name] = names
        else:
            diff[name] = [old, new]
    return dict(sorted(diff.items()))


# --- recording ------------------------------------------------------------------------------------------------


def _target(obj: models.Model) -> tuple[str, str]:
    target = getattr(obj, "audit_target", None)
    if callable(target):
        mcp_id, tool = target()
        return str(mcp_id or ""), str(tool or "")
    return "", ""


def _entity(model: type[models.Model]) -> str:
    policy = policy_of(model)
    return policy.entity if isinstance(policy, ChangeAudit) else (model._meta.model_name or "object")


def _named_fields(model: type[models.Model], diff: Mapping[str, Any]) -> list[str]:
    """The diff's fields masked by their values only, not by a field name that looks secret: those that name
    related rows (by their ``str``), and the secret maps, whose diff holds only the names of what was set, changed
    or cleared (``secret_diff``: an agent's ``model_secrets`` was stored as ``***``, hiding which secret changed)."""
    names = []
    for name in diff:
        try:
            model_field: Any = model._meta.get_field(name)
        except FieldDoesNotExist:
            continue
        if model_field.is_relation or is_secret_field(model_field):
            names.append(name)
    return names


def _holds_credential_like_text(value: Any) -> bool:
    """Whether a change's diff holds a text that may quote a bound secret (as long as ``credential_like`` asks): a
    change of numbers or flags alone is recorded without reading every binding's secrets."""
    if isinstance(value, str):
        return credential_like(value)  # a text that holds such a secret is one too
    if isinstance(value, Mapping):
        return any(_holds_credential_like_text(item) for item in value.values())
    if isinstance(value, list | tuple):
        return any(_holds_credential_like_text(item) for item in value)
    return False


def configured_secrets() -> list[str]:
    """Every secret the configuration binds now that looks like a credential (``credential_like``), read from the
    database: each configuration model with a secret field gives its rows' own (``secret_values()``: a binding's
    env and header values but those marked public, an agent's model key), a row this process cannot decrypt
    (``unreadable_secrets``) none. What masks a change's record and what the auditors are shown, whichever process
    records or shows it: the registered secrets (``audit.masking.register_secrets``) are only those this process
    has used, and a value bound after an event recorded it was in none of them then."""
    found: list[str] = []
    with rows_read_only():
        for model in apps.get_models():
            secret_fields = [f.attname for f in model._meta.concrete_fields if is_secret_field(f)]
            if not secret_fields or not isinstance(policy_of(model), ChangeAudit):
                continue
            if not callable(getattr(model, "secret_values", None)):
                continue
            for row in model._default_manager.all():
                if any(getattr(getattr(row, name), "unreadable_secrets", False) for name in secret_fields):
                    continue
                found += [value for value in cast(Any, row).secret_values() if credential_like(str(value))]
    return list(dict.fromkeys(found))


def config_change_record(
    *,
    obj: models.Model,
    verb: str,
    diff: Mapping[str, Any],
    pk: Any = None,
    target: tuple[str, str] | None = None,
    extra: Mapping[str, Any] | None = None,
    entity: str | None = None,
) -> None:
    """Write the audit event of a change made in the current change scope (which must be open)."""
    scope = current_scope()
    if scope is None:
        raise UnauditedChangeError("config_change_record needs an open change_scope (who, and by which path)")
    mcp_id, tool = target if target is not None else _target(obj)
    audit_event_record(
        source="admin",
        action=f"{CONFIG_ACTION_PREFIX}{entity or _entity(type(obj))}.{verb}",
        mcp_id=mcp_id,
        tool=tool,
        args=dict(diff),
        named_rows=_named_fields(type(obj), diff),
        result={
            "model": obj._meta.label_lower,
            "id": pk if pk is not None else obj.pk,
            "name": recorded_name(obj),
            "via": scope.via,
            **dict(extra or {}),
        },
        actor=scope.actor,
        # Every binding's, not only those this process happened to register; read only where the diff may quote one.
        secrets=configured_secrets() if _holds_credential_like_text(diff) else (),
    )


def _share_loaded_relations(stored: models.Model, obj: models.Model, names: list[str]) -> None:
    """Give the stored row the related objects ``obj`` has already loaded for the same foreign keys, so that the
    "before" snapshot names them (``str``) without reading each again, and through it whatever its ``__str__``
    reads (a tool's server). Both snapshots then name a related row the same way: a foreign key that did not
    change never shows in the diff."""
    for name in names:
        field: Any = obj._meta.get_field(name)
        if (
            (field.many_to_one or field.one_to_one)
            and field.is_cached(obj)
            and getattr(stored, field.attname) == getattr(obj, field.attname)
        ):
            field.set_cached_value(stored, field.get_cached_value(obj))


def instance_changes(obj: models.Model, stored: models.Model) -> set[str]:
    """The concrete fields (by name) that ``obj`` carries as its caller's changes, against ``stored`` (the row as
    it is now): those whose value differs from the one ``obj`` was read with (``AuditedModel`` remembers it),
    or, where that is not known (a row built in code, a model that is not ours), from the stored one. A field
    that ``obj`` holds as it was read is no change, even where the row has moved on since: it is a stale copy."""
    changed: set[str] = set()
    for model_field in obj._meta.concrete_fields:
        if model_field.primary_key or model_field.attname not in obj.__dict__:
            continue
        since_read = changed_since_loaded(obj, model_field.attname)
        if since_read is None:
            since_read = values_differ(getattr(obj, model_field.attname), getattr(stored, model_field.attname))
        if since_read:
            changed.add(model_field.name)
    return changed


def _differing(obj: models.Model, stored: models.Model) -> list[str]:
    """The concrete fields whose value on ``obj`` is not the stored one: what an update writes."""
    return [
        f.name
        for f in obj._meta.concrete_fields
        if not f.primary_key and values_differ(getattr(obj, f.attname), getattr(stored, f.attname))
    ]


def audited_save(
    obj: M,
    *,
    actor: Any,
    via: str,
    data: Mapping[str, Any] | None = None,
    m2m: Mapping[str, Iterable[Any]] | None = None,
    validate: bool = True,
    verb: str | None = None,
    extra: Mapping[str, Any] | None = None,
    only: Iterable[str] | None = None,
) -> M:
    """Create or update ``obj``: apply ``data`` (field → value) and ``m2m`` (field → objects), validate
    (``full_clean``; raises Django's ValidationError, nothing written), save, and record the diff against the
    stored row, all in one transaction. ``obj`` may already carry changes (an admin form's instance). An update
    that changes nothing records nothing. Returns ``obj``.

    An update writes only what this change sets, never a whole row read earlier: the row is read again once the
    change scope holds the configuration's lock (``audit.change_guard.change_scope``: every writer of
    configuration takes it first, so it is the row as the last change committed it), ``obj`` takes the stored
    value of every field its caller did not change (``instance_changes``) and the fields that then differ from the
    stored row (the changes, ``data``, and what ``full_clean`` normalizes) are the only ones saved. So a change
    committed by another path since ``obj`` was read is kept, and the recorded "before" is the row this change
    replaced. ``only``: the fields ``obj``'s own changes may touch (a service that lets its callers change a few);
    its changes to other fields are dropped, ``data`` applies whole. ``obj`` is left as the row now stored."""
    model = type(obj)
    names = recorded_fields(model)
    creating = obj._state.adding or obj.pk is None
    with transaction.atomic(using=router.db_for_write(model)), change_scope(actor=actor, via=via):
        stored = None if creating else model._default_manager.filter(pk=obj.pk).first()
        if stored is not None:
            _share_loaded_relations(stored, obj, names)
            asked = instance_changes(obj, stored)
            if only is not None:
                asked &= set(only)
            for model_field in model._meta.concrete_fields:
                if not model_field.primary_key and model_field.name not in asked:
                    # A copy: a ``clean`` that normalizes a JSON value in place must not change ``stored`` too.
                    setattr(obj, model_field.attname, copy.deepcopy(getattr(stored, model_field.attname)))
        before = snapshot(stored, names)
        for name, value in (data or {}).items():
            setattr(obj, name, value)
        if validate:
            obj.full_clean()
        if stored is None:
            obj.save()  # a new row (or one deleted meanwhile: saved again, as before)
        elif written := _differing(obj, stored):
            timestamps = [f.name for f in model._meta.concrete_fields if getattr(f, "auto_now", False)]
            obj.save(update_fields=sorted({*written, *timestamps}))
        for name, values in (m2m or {}).items():
            getattr(obj, name).set(list(values))
        remember_loaded(obj)
        diff = change_diff(model, before, snapshot(obj, names), creating=creating)
        if creating or diff:
            config_change_record(obj=obj, verb=verb or ("create" if creating else "update"), diff=diff, extra=extra)
    return obj


def audited_delete(obj: models.Model, *, actor: Any, via: str) -> None:
    """Delete ``obj`` and record what went (its stored values and the rows that cascaded with it), in one
    transaction. Raises Django's ProtectedError where the delete is refused; then nothing is recorded.

    What the delete changes in the rows that stay is recorded too, as their own ``update`` events after the
    delete's (with ``deleted_with``, naming the deleted row): a many-to-many link that goes with it (a deleted
    group leaves its members without it, a deleted server leaves the agents that bound it, a deleted agent the
    API keys scoped to it) and a foreign key set to null (an eval set's agent)."""
    model = type(obj)
    with transaction.atomic(using=router.db_for_write(model)), change_scope(actor=actor, via=via):
        names = recorded_fields(model)
        stored = snapshot(obj, names)
        diff = {
            n: secret_diff(v, {}) if is_secret_field(model._meta.get_field(n)) else [v, None]
            for n, v in stored.items()
            if v not in _EMPTY
        }
        target, pk, label = _target(obj), obj.pk, recorded_name(obj)
        collector = _collected(obj)
        cascaded = _cascade(obj, collector)
        staying = _staying_changed(obj, collector)
        before = {key: snapshot(row, recorded_fields(type(row))) for key, row in staying.items()}
        obj.delete()
        config_change_record(
            obj=obj,
            verb="delete",
            diff=diff,
            pk=pk,
            target=target,
            extra={"also_deleted": cascaded} if cascaded else {},
        )
        deleted_with = {"model": model._meta.label_lower, "id": pk, "name": label}
        for row_model, row_pk in staying:
            fresh = row_model._default_manager.filter(pk=row_pk).first()
            if fresh is None:
                continue
            row_diff = change_diff(row_model, before[(row_model, row_pk)], snapshot(fresh, recorded_fields(row_model)))
            if row_diff:
                config_change_record(obj=fresh, verb="update", diff=row_diff, extra={"deleted_with": deleted_with})


def _collected(obj: models.Model) -> Collector | None:
    """Django's own collection of what deleting ``obj`` deletes and updates (None where the delete is refused)."""
    collector = Collector(using=router.db_for_write(type(obj)), origin=obj)
    try:
        collector.collect([obj])
    except (ProtectedError, RestrictedError):
        return None
    return collector


def _cascade(obj: models.Model, collector: Collector | None) -> dict[str, int]:
    """The rows that would be deleted with ``obj``, counted per model."""
    model = type(obj)
    cascaded: dict[str, int] = {}
    if collector is None:
        return cascaded
    for related_model, instances in collector.data.items():
        count = sum(1 for i in instances if not (related_model is model and i.pk == obj.pk))
        if count and not related_model._meta.auto_created:
            label = related_model._meta.label_lower
            cascaded[label] = cascaded.get(label, 0) + count
    for rows in collector.fast_deletes:
        if not rows.model._meta.auto_created and (count := rows.count()):
            label = rows.model._meta.label_lower
            cascaded[label] = cascaded.get(label, 0) + count
    return cascaded


def _staying_changed(obj: models.Model, collector: Collector | None) -> dict[tuple[type[models.Model], Any], Any]:
    """The recorded rows that stay but change with the delete, by (model, pk): the owners of many-to-many links
    deleted with it, and the rows whose foreign key is set to null (or its default)."""
    if collector is None:
        return {}
    deleted = {(m, i.pk) for m, instances in collector.data.items() for i in instances}
    found: dict[type[models.Model], set[Any]] = {}
    link_rows: list[tuple[type[models.Model], Iterable[Any]]] = [
        (m, instances) for m, instances in collector.data.items() if m._meta.auto_created
    ]
    link_rows += [(rows.model, rows) for rows in collector.fast_deletes if rows.model._meta.auto_created]
    for through, rows in link_rows:
        owner: Any = through._meta.auto_created  # the model that declares the many-to-many field
        field = next((f for f in owner._meta.many_to_many if f.remote_field.through is through), None)
        if field is None or field.name not in recorded_fields(owner):
            continue
        column = f"{field.m2m_field_name()}_id"
        for row in rows:
            owner_pk = getattr(row, column)
            if (owner, owner_pk) not in deleted:
                found.setdefault(owner, set()).add(owner_pk)
    for (field, _value), batches in collector.field_updates.items():
        if field.name not in recorded_fields(field.model):
            continue
        for batch in batches:
            found.setdefault(field.model, set()).update(row.pk for row in cast(Iterable[Any], batch))
    staying: dict[tuple[type[models.Model], Any], Any] = {}
    for row_model, pks in found.items():
        if not isinstance(policy_of(row_model), ChangeAudit):
            continue
        for row in row_model._default_manager.filter(pk__in=pks).order_by("pk"):
            staying[(row_model, row.pk)] = row
    return staying
