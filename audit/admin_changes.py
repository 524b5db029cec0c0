"""Admin pages change configuration through the services, like every other path.

Put :class:`ServiceAdminMixin` first among a ``ModelAdmin``'s bases and implement ``service_save`` and
``service_delete`` with the entity's services (``mcp_server_update``, ``agent_create``, ...). The mixin routes
the admin's save (with the form's many-to-many values), delete, bulk delete and the rows of its inlines (each
inline model's services are named in ``inline_services``) through them, so an admin change writes the change and
its audit event (``via="admin"``, the admin's username as actor) in one transaction, exactly as an import or a
command does. Nothing here writes a model itself.

A change form's or delete page's POST takes the configuration's lock (``audit.change_guard.config_write_lock``)
before it reads the object: the form is validated against, and saves over, the row as the last change left it
(on SQLite the page's transaction holds the database's write lock from its start already).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.apps import apps
from django.contrib.admin.utils import unquote
from django.contrib.auth.models import Permission
from django.core.exceptions import FieldDoesNotExist, PermissionDenied
from django.db import models, router, transaction
from django.forms import BaseModelForm, BaseModelFormSet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.text import capfirst, format_lazy
from django.utils.translation import gettext_lazy as _

from agent_platform.json import bounded_json_overrides
from audit.change_guard import config_write_lock
from audit.changes import CONFIG_ACTION_PREFIX
from audit.labels import action_label, permission_label
from audit.models import AuditEvent

ADMIN_VIA = "admin"

InlineSave = Callable[..., Any]
"""``save(obj=..., actor=..., via=..., creating=...)`` for a row of an inline."""
InlineDelete = Callable[..., Any]
"""``delete(obj=..., actor=..., via=...)`` for a row of an inline."""


def form_data(obj: models.Model) -> dict[str, Any]:
    """The editable concrete fields of ``obj`` as a form left them (the instance carries the cleaned values)."""
    return {
        f.name: getattr(obj, f.name)
        for f in obj._meta.concrete_fields
        if f.editable and not f.primary_key and not getattr(f, "auto_now", False)
    }


def link_tables_named() -> None:
    """Names the rows of the tables Django makes for many-to-many fields (an agent's servers, a key's agents, a
    user's groups) by their two ends: a delete page listed what goes with a server as "Agent-mcpserver
    relationship: Agent_servers object (1)", in English whatever the reader's language."""
    for model in apps.get_models(include_auto_created=True):
        if not model._meta.auto_created:
            continue
        ends = [f for f in model._meta.concrete_fields if f.is_relation]
        if len(ends) != 2:
            continue
        first, second = (end.remote_field.model._meta for end in ends)
        model._meta.verbose_name = format_lazy(
            _("link between {first} and {second}"), first=first.verbose_name, second=second.verbose_name
        )
        model._meta.verbose_name_plural = format_lazy(
            _("links between {first} and {second}"), first=first.verbose_name, second=second.verbose_name
        )
        model.__str__ = _link_str(ends[0].name, ends[1].name)  # type: ignore[method-assign]


def _link_str(first: str, second: str) -> Callable[[models.Model], str]:
    def link_str(row: models.Model) -> str:
        return f"{_end_text(getattr(row, first))} ↔ {_end_text(getattr(row, second))}"

    return link_str


def _end_text(end: Any) -> str:
    """A link's end as the pages name it: a permission in the reader's language (its stored name, "Can view run",
    is English), anything else by its ``str``."""
    return permission_label(end) if isinstance(end, Permission) else str(end)


HISTORY_ROWS = 200  # the newest; the audit list holds them all


def history_page(
    model_admin: Any,
    request: HttpRequest,
    object_id: str,
    *,
    events: Callable[[models.Model], list[AuditEvent]] | None,
    extra_context: Any = None,
) -> HttpResponse:
    """An object's history page, for whoever may view it: its audit events (``events(obj)``, newest first; each
    linked to its page for whoever may view the audit record), or, for ``events=None``, that a record is never
    changed once written."""
    obj = model_admin.get_object(request, unquote(object_id))
    if obj is None:
        return model_admin._get_obj_does_not_exist_redirect(request, model_admin.model._meta, object_id)
    if not model_admin.has_view_or_change_permission(request, obj):
        raise PermissionDenied
    opts = obj._meta
    audit_admin = model_admin.admin_site._registry.get(AuditEvent)
    may_view_events = audit_admin is not None and audit_admin.has_view_permission(request)
    rows = [
        {
            "event": event,
            "action": action_label(event.action),
            "fields": ", ".join(
                _field_label(opts, str(name)) for name in (event.args or {}) if not str(name).startswith("_")
            ),
            "via": (event.result or {}).get("via", "") if isinstance(event.result, dict) else "",
            "url": reverse("admin:audit_auditevent_change", args=[event.pk], current_app=model_admin.admin_site.name)
            if may_view_events
            else None,
        }
        for event in (events(obj) if events is not None else [])
    ]
    context = {
        **model_admin.admin_site.each_context(request),
        "title": _("History: %(object)s") % {"object": obj},
        "subtitle": None,
        "module_name": str(capfirst(opts.verbose_name_plural)),
        "object": obj,
        "opts": opts,
        "rows": rows,
        "record": events is None,
        "limit": HISTORY_ROWS,
        "preserved_filters": model_admin.get_preserved_filters(request),
        **(extra_context or {}),
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, "admin/audit/object_history.html", context)


def _field_label(opts: Any, name: str) -> str:
    """A recorded field by its label in the reader's language (``system_prompt`` → "시스템 프롬프트"); a name the
    model no longer has as recorded."""
    try:
        return str(opts.get_field(name).verbose_name)
    except FieldDoesNotExist:
        return name


class ServiceAdminMixin:
    """Saves and deletes through the entity's services (see the module docstring). A model's JSON field is read
    with :class:`agent_platform.json.BoundedJSONField`: text nested too deeply is refused at its field, not a
    server error."""

    formfield_overrides = bounded_json_overrides()

    inline_services: dict[type[models.Model], tuple[InlineSave, InlineDelete]] = {}

    def service_save(self, *, obj: Any, actor: Any, m2m: dict[str, list[Any]], change: bool) -> None:
        raise NotImplementedError

    def service_delete(self, *, obj: Any, actor: Any) -> None:
        raise NotImplementedError

    def _under_config_lock(self, request: HttpRequest, view: Callable[[], Any]) -> Any:
        """``view`` (Django's page), where a POST reads its object under the configuration's lock, in its own
        transaction: a form read before another change committed saved over it, or was validated against what no
        longer held."""
        if request.method != "POST":
            return view()
        using = router.db_for_write(self.model)  # type: ignore[attr-defined]
        with transaction.atomic(using=using):
            config_write_lock(using=using)
            return view()

    def changeform_view(
        self, request: HttpRequest, object_id: str | None = None, form_url: str = "", extra_context: Any = None
    ) -> Any:
        parent = super()
        return self._under_config_lock(
            request,
            lambda: parent.changeform_view(request, object_id, form_url, extra_context),  # type: ignore[attr-defined]
        )

    def delete_view(self, request: HttpRequest, object_id: str, extra_context: Any = None) -> Any:
        parent = super()
        return self._under_config_lock(
            request,
            lambda: parent.delete_view(request, object_id, extra_context),  # type: ignore[attr-defined]
        )

    def save_model(self, request: HttpRequest, obj: Any, form: BaseModelForm, change: bool) -> None:
        m2m = {
            f.name: list(form.cleaned_data[f.name])
            for f in obj._meta.many_to_many
            if f.name in form.cleaned_data and f.name in form.fields
        }
        self.service_save(obj=obj, actor=request.user, m2m=m2m, change=change)

    def save_related(self, request: HttpRequest, form: BaseModelForm, formsets: Any, change: bool) -> None:
        # The many-to-many values were saved by the service with the object; then the inlines.
        with transaction.atomic(using=router.db_for_write(form.instance.__class__)):
            for formset in formsets:
                self.save_formset(request, form, formset, change=change)  # type: ignore[attr-defined]

    def save_formset(self, request: HttpRequest, form: BaseModelForm, formset: BaseModelFormSet, change: bool) -> None:
        save, delete = self.inline_services[formset.model]
        with transaction.atomic(using=router.db_for_write(formset.model)):
            instances = formset.save(commit=False)
            for obj in formset.deleted_objects:
                delete(obj=obj, actor=request.user, via=ADMIN_VIA)
            for obj in instances:
                save(obj=obj, actor=request.user, via=ADMIN_VIA, creating=obj.pk is None)

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        self.service_delete(obj=obj, actor=request.user)

    def history_view(self, request: HttpRequest, object_id: str, extra_context: Any = None) -> HttpResponse:
        """The object's changes as the audit record holds them. Django's page read its own log, which is not
        written (below), and told of every object that it had no history, "probably not added via this admin
        site", beside a full, chained record of its changes."""

        def changes(obj: models.Model) -> list[AuditEvent]:
            events = AuditEvent.objects.filter(
                action__startswith=CONFIG_ACTION_PREFIX, result__model=obj._meta.label_lower, result__id=obj.pk
            ).order_by("-seq")
            return list(events[:HISTORY_ROWS])

        return history_page(self, request, object_id, events=changes, extra_context=extra_context)

    # Django's own log (LogEntry) is not written: every change is an audit event, in the chained record; a second,
    # mutable log beside it would say less and could be edited.
    def log_addition(self, request: HttpRequest, obj: Any, message: Any) -> None:
        return None

    def log_change(self, request: HttpRequest, obj: Any, message: Any) -> None:
        return None

    def log_deletion(self, request: HttpRequest, obj: Any, object_repr: str) -> None:
        return None

    def log_deletions(self, request: HttpRequest, queryset: Any) -> None:
        return None

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        with transaction.atomic(using=router.db_for_write(queryset.model)):
            for obj in queryset:
                self.service_delete(obj=obj, actor=request.user)
