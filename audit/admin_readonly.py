"""Read-only admin pages answer a write with a 403, never a page that silently did nothing."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse

from audit.admin_changes import history_page


class WritesRefusedMixin:
    """A POST to the list (an action, a bulk edit) by someone who may not change what it lists is a 403: Django
    would otherwise answer 200 and change nothing, which reads as success."""

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if request.method == "POST" and not self.has_change_permission(request):  # type: ignore[attr-defined]
            raise PermissionDenied
        return super().changelist_view(request, extra_context)  # type: ignore[misc]


class ReadOnlyAdminMixin:
    """A page that shows a record: nothing is added, changed or deleted through it (its own actions, if any,
    go through the services)."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def history_view(self, request: HttpRequest, object_id: str, extra_context: Any = None) -> HttpResponse:
        """A record has no history of changes: Django's page said it had none "probably because it was not added
        via this admin site", which reads as a gap in the record."""
        return history_page(self, request, object_id, events=None, extra_context=extra_context)
