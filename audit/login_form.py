"""The admin's login form, aware of login lockouts (``audit/logins.py``): a locked username or address is told
so, plainly, instead of "wrong password" (the password is not checked then)."""

from __future__ import annotations

from typing import Any

from django.contrib.admin.forms import AdminAuthenticationForm
from django.core.exceptions import ValidationError

from agent_platform.client_ip import client_ip
from audit.logins import LOGIN_ACTION, login_audit, login_lockout_get


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
