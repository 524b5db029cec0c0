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


# SQLite's words for a database it cannot reach now (another writer holds it, the file cannot be opened or read);
# any other SQLite OperationalError is the platform's own (a missing table or column: a bug, not an outage).
_SQLITE_UNREACHABLE = ("database is locked", "unable to open database", "disk i/o error")


def database_unreachable(exc: BaseException) -> bool:
    """Whether a database error says the database cannot do this now (the caller may try again: a 503 with
    Retry-After), not that the platform asked it something wrong (a bug: a 500 with its traceback logged).
    PostgreSQL: a failure the client library met before any answer (no SQLSTATE: refused, timed out, the
    connection lost), a connection exception (SQLSTATE class 08), the server shutting down or not yet accepting
    (57P01-57P03), or a transaction it ended to let another through (a deadlock, 40P01; a serialization failure,
    40001: the same request succeeds when sent again); SQLite: a locked or unreadable file. An ``InterfaceError``
    is a connection already closed."""
    from django.db import InterfaceError, OperationalError

    if isinstance(exc, InterfaceError):
        return True
    if not isinstance(exc, OperationalError):
        return False
    cause = exc.__cause__
    if type(cause).__module__ == "sqlite3":
        return str(exc).lower().startswith(_SQLITE_UNREACHABLE)
    sqlstate = getattr(cause, "sqlstate", None)
    if sqlstate is None:
        return cause is None or type(cause).__module__.startswith("psycopg")
    return str(sqlstate).startswith("08") or str(sqlstate) in {"57P01", "57P02", "57P03", "40P01", "40001"}
