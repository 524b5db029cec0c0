"""The one error services raise. The API's exception handler maps it to ``{"error": {...}}``."""

from __future__ import annotations

from typing import Any


class ApplicationError(Exception):
    """A failure a caller can act on: ``code`` is stable, ``message`` is for people, ``status`` is HTTP's."""

    def __init__(
        self,
        message: str,
        *,
        code: str,
        status: int = 400,
        fields: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status
        self.fields = fields or {}
        # Response headers the caller needs (e.g. ``Retry-After`` with a 429).
        self.headers = headers or {}
