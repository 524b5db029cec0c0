"""Read-only admin pages answer a write with a 403, never a page that silently did nothing."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse

from audit.admin_changes import WritesRefusedMixin, history_page

__all__ = ["ReadOnlyAdminMixin", "WritesRefusedMixin"]


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
