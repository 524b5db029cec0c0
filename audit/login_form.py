"""The admin's login form, aware of login lockouts (``audit/logins.py``): a locked username or address is told
so, plainly, instead of "wrong password" (the password is not checked then). So is the admin's own password page,
whose old password is a password check like a login's."""

from __future__ import annotations

from functools import partial
from typing import Any

from django.contrib.admin.forms import AdminAuthenticationForm, AdminPasswordChangeForm
from django.contrib.auth.views import PasswordChangeView
from django.core.exceptions import PermissionDenied, ValidationError

from agent_platform.client_ip import client_ip
from audit.logins import LOGIN_ACTION, login_audit, login_lockout_get, password_check_throttled


class LockoutAwareAdminAuthenticationForm(AdminAuthenticationForm):
    def clean(self) -> dict[str, Any]:
        self._refuse_if_locked()
        try:
            cleaned = super().clean()
        except ValidationError:
            self._refuse_if_locked()  # this failure may have started a lockout: say so
            raise
        user = self.get_user()
        if user is not None:  # a field left empty is the form's own error, and no sign-in
            login_audit(user=user, ip=self._ip(), action=LOGIN_ACTION)
        return cleaned

    def _ip(self) -> str:
        return client_ip(self.request.META) if self.request is not None else "unknown"

    def _refuse_if_locked(self) -> None:
        lockout = login_lockout_get(username=self.cleaned_data.get("username"), ip=self._ip())
        if lockout is not None:
            raise ValidationError(lockout.message(), code="login_locked")


class LockoutAwarePasswordChangeForm(AdminPasswordChangeForm):
    """The admin's own password page (``/admin/password_change/``): its old password is checked under the login
    lockout (``password_check_throttled``), a wrong one written down and counted with the username's logins, and a
    locked username or address told so. Django's form checked it unthrottled and unrecorded: a stolen session could
    guess the password behind it without limit."""

    def __init__(self, user: Any, *args: Any, request: Any = None, **kwargs: Any) -> None:
        super().__init__(user, *args, **kwargs)
        self.request = request

    def clean_old_password(self) -> str:
        old_password: str = self.cleaned_data["old_password"]
        username = self.user.get_username()
        ip = client_ip(self.request.META) if self.request is not None else "unknown"
        path = self.request.path if self.request is not None else ""
        check = partial(self.user.check_password, old_password)
        try:
            right = password_check_throttled(username=username, ip=ip, path=path, check=check)
        except PermissionDenied:
            right = False
        if right:
            return old_password
        lockout = login_lockout_get(username=username, ip=ip)  # this failure may have started one: say so
        if lockout is not None:
            raise ValidationError(lockout.message(), code="login_locked")
        raise ValidationError(self.error_messages["password_incorrect"], code="password_incorrect")


class LockoutAwarePasswordChangeView(PasswordChangeView):
    """Django's password change view with :class:`LockoutAwarePasswordChangeForm`, which needs the request (the
    client's address and the path go into the lockout's counts and the record)."""

    form_class = LockoutAwarePasswordChangeForm

    def get_form_kwargs(self) -> dict[str, Any]:
        return {**super().get_form_kwargs(), "request": self.request}
