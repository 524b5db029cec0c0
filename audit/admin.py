"""The admin's user and group pages change roles through ``audit.roles``' services: making someone staff, a
superuser or an auditor (a group) is recorded like any other change of the configuration."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import unquote
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.forms import ReadOnlyPasswordHashWidget, UserChangeForm
from django.contrib.auth.hashers import UNUSABLE_PASSWORD_PREFIX
from django.contrib.auth.models import Group, Permission
from django.core.exceptions import PermissionDenied
from django.db.models import ManyToManyField
from django.forms import ModelMultipleChoiceField
from django.http import HttpRequest, HttpResponse
from django.utils.translation import gettext as _

from agent_platform.model_choices import InRangeModelMultipleChoiceField
from audit.admin_changes import ADMIN_VIA, ServiceAdminMixin
from audit.labels import permission_label
from audit.login_form import LockoutAwareAdminAuthenticationForm
from audit.roles import group_delete, group_save, user_delete, user_password_page, user_update

User = get_user_model()


class PermissionsInWordsMixin:
    """The permission pickers list each permission in the reader's language (``에이전트 | 승인 | 승인 보기``), not
    as Django stored its name (``Can view approval``)."""

    def formfield_for_manytomany(self, db_field: ManyToManyField, request: HttpRequest, **kwargs: Any) -> Any:
        # An id past the database's integer range is an invalid choice, not SQLite's OverflowError (a 500).
        kwargs.setdefault("form_class", InRangeModelMultipleChoiceField)
        field = super().formfield_for_manytomany(db_field, request, **kwargs)  # type: ignore[misc]
        if isinstance(field, ModelMultipleChoiceField) and db_field.related_model is Permission:
            field.label_from_instance = permission_label  # type: ignore[method-assign]
        return field


# What makes a user powerful: only a superuser changes it (anyone else with "change user" could make themselves
# one, or grant themselves any permission), and only a superuser changes a superuser at all.
ROLE_FIELDS = ("is_staff", "is_superuser", "groups", "user_permissions")


class PasswordStateWidget(ReadOnlyPasswordHashWidget):
    """Whether a password is set, and the link to change it: nothing of its hash (Django shows the algorithm, the
    iterations and the first characters of the salt and the hash)."""

    def get_context(self, name: str, value: Any, attrs: Any) -> dict[str, Any]:
        context = super().get_context(name, value, attrs)
        usable = bool(value) and not str(value).startswith(UNUSABLE_PASSWORD_PREFIX)
        context["summary"] = [{"label": _("Password set") if usable else _("No password set."), "value": ""}]
        return context


class PasswordStateChangeForm(UserChangeForm):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "password" in self.fields:
            self.fields["password"].widget = PasswordStateWidget()


def sign_in_settable_by(actor: Any, user: Any) -> bool:
    """Whether ``actor`` may decide how ``user`` signs in on its admin pages, by setting its password or its
    ``is_active``: a superuser anyone's, anyone their own, and anyone else with "change user" only those of a user
    with no power (not staff, no group, no permission). Whoever sets a password signs in as its user, and whoever
    reactivates an account gives its groups and permissions back: "change user" alone must not let a help desk
    become (or revive) a reviewer who decides approvals, or anyone whose powers it could not grant itself
    (``ROLE_FIELDS``), nor lock any member of staff out."""
    if actor.is_superuser or actor.pk == user.pk:
        return True
    powerless = not (user.is_staff or user.is_superuser)
    return powerless and not user.groups.exists() and not user.user_permissions.exists()


class AuditedUserAdmin(ServiceAdminMixin, PermissionsInWordsMixin, UserAdmin):
    form = PasswordStateChangeForm

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = list(super().get_readonly_fields(request, obj))
        if not request.user.is_superuser:
            fields += [name for name in ROLE_FIELDS if name not in fields]
            # Shown, not offered: a read-only field is not in the form, so a posted ``is_active`` is ignored.
            if obj is not None and not sign_in_settable_by(request.user, obj) and "is_active" not in fields:
                fields.append("is_active")
        return fields

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None and obj.is_superuser and not request.user.is_superuser:
            return False  # a superuser's page, password and roles are another superuser's to change
        return bool(super().has_change_permission(request, obj))

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None and obj.is_superuser and not request.user.is_superuser:
            return False
        return bool(super().has_delete_permission(request, obj))

    def service_save(self, *, obj: Any, actor: Any, m2m: dict[str, list[Any]], change: bool) -> None:
        user_update(
            user=obj, actor=actor, via=ADMIN_VIA, groups=m2m.get("groups"), permissions=m2m.get("user_permissions")
        )

    def service_delete(self, *, obj: Any, actor: Any) -> None:
        user_delete(user=obj, actor=actor, via=ADMIN_VIA)

    def user_change_password(self, request: HttpRequest, id: str, form_url: str = "") -> HttpResponse:
        """Django's password page, in a change scope: the change is recorded with this admin as its actor. A 403
        where the user's password is not this admin's to set (``sign_in_settable_by``), decided under the
        configuration's lock that the page takes (the user as the last change left it)."""
        with user_password_page(actor=request.user, via=ADMIN_VIA):
            user = self.get_object(request, unquote(id))
            if user is not None and not sign_in_settable_by(request.user, user):
                raise PermissionDenied
            return super().user_change_password(request, id, form_url)


class AuditedGroupAdmin(ServiceAdminMixin, PermissionsInWordsMixin, GroupAdmin):
    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        # A group's permissions are its members' powers: only a superuser grants them (a member with "change
        # group" could give their own group every permission).
        fields = list(super().get_readonly_fields(request, obj))
        return fields if request.user.is_superuser else [*fields, "permissions"]

    def service_save(self, *, obj: Group, actor: Any, m2m: dict[str, list[Any]], change: bool) -> None:
        group_save(group=obj, actor=actor, via=ADMIN_VIA, permissions=m2m.get("permissions"))

    def service_delete(self, *, obj: Group, actor: Any) -> None:
        group_delete(group=obj, actor=actor, via=ADMIN_VIA)


for model, model_admin in ((User, AuditedUserAdmin), (Group, AuditedGroupAdmin)):
    if admin.site.is_registered(model):
        admin.site.unregister(model)
    admin.site.register(model, model_admin)

# The admin's login refuses locked usernames and addresses with a plain message (audit/logins.py).
admin.site.login_form = LockoutAwareAdminAuthenticationForm
