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

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from django.apps import apps
from django.contrib.admin.utils import unquote
from django.contrib.auth.models import Permission
from django.core.exceptions import FieldDoesNotExist, PermissionDenied
from django.db import models, router, transaction
from django.db.models import Min, Q
from django.db.models.options import Options
from django.forms import BaseModelForm, BaseModelFormSet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.text import capfirst, format_lazy
from django.utils.translation import gettext_lazy as _
from django.utils.translation import pgettext

from agent_platform.json import bounded_json_overrides
from audit.change_guard import config_write_lock
from audit.changes import CONFIG_ACTION_PREFIX, configured_secrets
from audit.labels import action_label, permission_label, via_label
from audit.masking import mask_known
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

InlineRowName = Callable[[AuditEvent], str]
"""Which row of an inline an audit event changed, in the reader's language, from what the event recorded (the row
may be gone): "contract of search_employee"."""


@dataclass(frozen=True)
class HistoryEntry:
    """One row of a History page: ``event``, a change of a row of ``opts``' model (its fields are named by that
    model's labels); ``row`` names that row where it is not the page's object but one edited inline on its page,
    "" for the object itself."""

    event: AuditEvent
    opts: Options[Any]
    row: str = ""


def history_page(
    model_admin: Any,
    request: HttpRequest,
    object_id: str,
    *,
    events: Callable[[models.Model], list[HistoryEntry]] | None,
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
    entries = list(events(obj)) if events is not None else []
    # Read once for the page, not per row; none read for a page of no rows.
    secrets = configured_secrets() if entries else []
    rows = [
        {
            "event": entry.event,
            "action": _shown(_change_text(entry), secrets),
            "fields": _shown(
                ", ".join(
                    _field_label(entry.opts, str(name))
                    for name in (entry.event.args or {})
                    if not str(name).startswith("_")
                ),
                secrets,
            ),
            # The path in words, as the event's page names its source ("admin"); the record keeps its code.
            "via": via_label(str(entry.event.result.get("via", ""))) if isinstance(entry.event.result, dict) else "",
            "url": reverse(
                "admin:audit_auditevent_change", args=[entry.event.pk], current_app=model_admin.admin_site.name
            )
            if may_view_events
            else None,
        }
        for entry in entries
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


def _shown(text: str, secrets: list[str]) -> str:
    """A row's text as recorded, masked again with the secrets bound now (``mask_known``): the record was masked
    with those known when it was written, and a value bound as a secret after (a token an eval case's question
    quoted, then given to a server) is in none of them; the row's name is the changed row's ``str`` then."""
    return str(mask_known(text, secrets=secrets))


def _change_text(entry: HistoryEntry) -> str:
    """The change in words; for a row edited inline, which row ("tool contract changed: contract of lookup")."""
    change = action_label(entry.event.action)
    if not entry.row:
        return change
    return pgettext("object history", "%(change)s: %(object)s") % {"change": change, "object": entry.row}


def recorded_row_name(model: type[models.Model], event: AuditEvent) -> str:
    """An inline's row as an event recorded it, for a model whose admin names its rows no better: its model's name
    and the row's ``str`` when it was changed ("eval case 연차 질문")."""
    name = event.result.get("name", "") if isinstance(event.result, dict) else ""
    return pgettext("object history", "%(model)s %(name)s") % {"model": model._meta.verbose_name, "name": name}


def inline_parent_key(inline: Any) -> str | None:
    """The name of the foreign key by which ``inline``'s rows belong to the page's object (its ``fk_name``, or the
    one key to the page's model)."""
    keys = [
        f.name
        for f in inline.model._meta.concrete_fields
        if (f.many_to_one or f.one_to_one)
        and f.remote_field.model is inline.parent_model
        and (inline.fk_name is None or f.name == inline.fk_name)
    ]
    return keys[0] if len(keys) == 1 else None


def _recorded_names(obj: models.Model) -> tuple[set[str], int | None]:
    """The names the record knows ``obj`` by (its ``str`` now and at each of its recorded changes: an agent's slug
    before a rename), and the sequence number of its first recorded change (None where none is left)."""
    own = AuditEvent.objects.filter(
        action__startswith=CONFIG_ACTION_PREFIX, result__model=obj._meta.label_lower, result__id=obj.pk
    )
    names = {str(name) for name in own.values_list("result__name", flat=True).distinct() if name}
    return names | {str(obj)}, own.aggregate(first=Min("seq"))["first"]


def _inline_row_ids(
    obj: models.Model, model: type[models.Model], key: str, names: Iterable[str], since: int | None
) -> set[Any]:
    """The rows of ``model`` that belong, or belonged, to ``obj`` by ``key``: those that point to it now, and those
    whose recorded change set ``key`` to it or away from it (a create, a delete, a move: the record holds the related
    row by its ``str``, ``{key: [old, new]}``), since ``obj``'s first recorded change (an earlier object of the same
    name, a tool discovered again after a delete, is another)."""
    current = set(model._default_manager.filter(**{key: obj}).values_list("pk", flat=True))
    names = list(names)
    recorded = AuditEvent.objects.filter(
        Q(**{f"args__{key}__0__in": names}) | Q(**{f"args__{key}__1__in": names}),
        action__startswith=CONFIG_ACTION_PREFIX,
        result__model=model._meta.label_lower,
    )
    if since is not None:
        recorded = recorded.filter(seq__gte=since)
    return current | set(recorded.values_list("result__id", flat=True).distinct())


def _field_label(opts: Any, name: str) -> str:
    """A recorded field by its label in the reader's language (``system_prompt`` → "시스템 프롬프트"); a name the
    model no longer has as recorded."""
    try:
        return str(opts.get_field(name).verbose_name)
    except FieldDoesNotExist:
        return name


class WritesRefusedMixin:
    """A POST to the list (an action, a bulk edit) by someone who may not change what it lists is a 403: Django
    would otherwise answer 200 and change nothing, which reads as success. An action offered to them is theirs to
    post all the same (its own permissions decided that: "delete" for Django's ``delete_selected``)."""

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if request.method == "POST" and not self._list_post_allowed(request):
            raise PermissionDenied
        return super().changelist_view(request, extra_context)  # type: ignore[misc]

    def _list_post_allowed(self, request: HttpRequest) -> bool:
        if self.has_change_permission(request):  # type: ignore[attr-defined]
            return True
        offered = self.get_actions(request)  # type: ignore[attr-defined]
        chosen = request.POST.get("action")
        # "Go" with no action chosen, where some are offered: Django says "No action selected", not a 403.
        return chosen in offered or (bool(offered) and not chosen and "_save" not in request.POST)


class ServiceAdminMixin(WritesRefusedMixin):
    """Saves and deletes through the entity's services (see the module docstring); a list's POST by someone who may
    neither change its rows nor run the action posted is a 403 (``WritesRefusedMixin``). A model's JSON field is read
    with :class:`agent_platform.json.BoundedJSONField`: text nested too deeply is refused at its field, not a
    server error."""

    formfield_overrides = bounded_json_overrides()

    inline_services: dict[type[models.Model], tuple[InlineSave, InlineDelete]] = {}
    # How the History page names a row of an inline, per inline model; one not named here reads "<its model's
    # name> <the row's str when changed>" (``recorded_row_name``).
    inline_history_names: dict[type[models.Model], InlineRowName] = {}

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
        """The object's changes as the audit record holds them, with those of the rows edited inline on its page
        (a tool's contract, an agent's rules), deleted ones included, each naming its row. Django's page read its
        own log, which is not written (below), and told of every object that it had no history, "probably not
        added via this admin site", beside a full, chained record of its changes; and a change made in an inline
        (a contract's risk), whose model has no page of its own, was on no History page at all."""
        return history_page(
            self, request, object_id, events=lambda obj: self.history_entries(request, obj), extra_context=extra_context
        )

    def history_entries(self, request: HttpRequest, obj: models.Model) -> list[HistoryEntry]:
        """The newest ``HISTORY_ROWS`` changes of ``obj`` and of the rows of the inlines its page shows this reader
        (an inline the reader may not view is left out, as on the page), newest first."""
        belongs = Q(result__model=obj._meta.label_lower, result__id=obj.pk)
        inline_models = self._history_inlines(request, obj)
        if inline_models:
            names, since = _recorded_names(obj)
            for label, (model, key) in inline_models.items():
                ids = _inline_row_ids(obj, model, key, names, since)
                belongs |= Q(result__model=label, result__id__in=list(ids))
        events = AuditEvent.objects.filter(belongs, action__startswith=CONFIG_ACTION_PREFIX).order_by("-seq")
        entries = []
        for event in events[:HISTORY_ROWS]:
            label = event.result.get("model", "") if isinstance(event.result, dict) else ""
            if label not in inline_models:
                entries.append(HistoryEntry(event, obj._meta))
                continue
            model = inline_models[label][0]
            name = self.inline_history_names.get(model)
            row = name(event) if name is not None else recorded_row_name(model, event)
            entries.append(HistoryEntry(event, model._meta, row))
        return entries

    def _history_inlines(self, request: HttpRequest, obj: models.Model) -> dict[str, tuple[type[models.Model], str]]:
        """The inline models this reader sees on ``obj``'s page, by label, with the key that ties them to it."""
        found = {}
        for inline in self.get_inline_instances(request, obj):  # type: ignore[attr-defined]
            key = inline_parent_key(inline)
            if key is not None:
                found[inline.model._meta.label_lower] = (inline.model, key)
        return found

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
