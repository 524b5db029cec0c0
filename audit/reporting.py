"""Django's error reports and debug pages, masked like every other output of the platform."""

from __future__ import annotations

import re
from typing import Any

from django.http import HttpRequest, QueryDict
from django.views.debug import ExceptionReporter, SafeExceptionReporterFilter

from audit.masking import MASK, is_secret_key, mask_text, mask_value


class MaskingExceptionReporterFilter(SafeExceptionReporterFilter):
    """Hides settings that carry credentials (``DATABASE_URL``, ``REDIS_URL``, broker URLs, keys) on top of
    Django's own list, and masks secret-looking values in request data (the query string in ``META`` too) and frame
    variables, and every frame variable whose name says it is a secret (``password``), whatever its value."""

    hidden_settings = re.compile(
        "API|TOKEN|KEY|SECRET|PASS|SIGNATURE|HTTP_COOKIE|URL|DSN|BROKER|DATABASES|CACHES|LOCATION", flags=re.I
    )

    def cleanse_setting(self, key: Any, value: Any) -> Any:
        cleansed = super().cleanse_setting(key, value)
        return mask_value(cleansed) if isinstance(cleansed, dict | list | str) else cleansed

    def get_safe_request_meta(self, request: Any) -> Any:
        """``META`` cleansed, with the query string, wherever a value holds it (``QUERY_STRING``, a server's
        ``RAW_URI`` or ``REQUEST_URI``), replaced by the masked one: a secret there is masked by its parameter's name
        too, which the value patterns alone do not see once it is percent-encoded."""
        if not hasattr(request, "META"):
            return {}
        raw, masked = self._query_strings(request)
        return {
            key: self.cleanse_setting(key, _replaced(value, raw, masked) if isinstance(value, str) else value)
            for key, value in request.META.items()
        }

    def get_post_parameters(self, request: Any) -> Any:
        params = super().get_post_parameters(request)
        if not params:
            return params
        cleansed = params.copy()
        for key in cleansed:
            value = cleansed[key]
            cleansed[key] = self.cleansed_substitute if is_secret_key(key) else mask_text(str(value))
        return cleansed

    def get_traceback_frame_variables(self, request: Any, tb_frame: Any) -> Any:
        """Each variable as masked text; one whose name says it is a secret hidden whatever its value, and the
        request's query string (in the request's own repr, ``<WSGIRequest: GET '/path?token=…'>``) masked by name."""
        raw, masked = self._query_strings(request)
        return [
            (name, self.cleansed_substitute if is_secret_key(name) else mask_text(_replaced(str(value), raw, masked)))
            for name, value in super().get_traceback_frame_variables(request, tb_frame)
        ]

    def _query_strings(self, request: Any) -> tuple[str, str]:
        """The request's query string as received, and masked (:func:`masked_query`); ``("", "")`` without one."""
        meta = getattr(request, "META", None)
        raw = meta.get("QUERY_STRING", "") if isinstance(meta, dict) else ""
        if not raw or not isinstance(request, HttpRequest):
            return "", ""
        return raw, masked_query(request, self.cleansed_substitute).urlencode(safe=_SHOWN_AS_IS)


def _replaced(text: str, raw: str, masked: str) -> str:
    """``text`` with the query string ``raw`` replaced by ``masked`` where it is one: the whole text (``QUERY_STRING``)
    or after a ``?`` (a URI, the request's repr). Replaced anywhere, a short query (``?a``, rebuilt ``a=``) rewrote
    every header that held its letters ("Mozilla=/5.0 (Ma=cintosh)")."""
    if not raw or raw == masked:
        return text
    return masked if text == raw else text.replace(f"?{raw}", f"?{masked}")


# The masks stay readable in a rebuilt query string (percent-encoded, "***" would read "%2A%2A%2A").
_SHOWN_AS_IS = "*"


def masked_query(request: HttpRequest, substitute: str) -> QueryDict:
    """The request's GET parameters with every value of a parameter whose name says it is a secret replaced by
    ``substitute``, and the secrets the value patterns find masked in the others (and in the names)."""
    masked = QueryDict(mutable=True)
    for key, values in request.GET.lists():
        secret = is_secret_key(key)
        masked.setlist(mask_text(key), [substitute if secret else mask_text(value) for value in values])
    return masked


class MaskingExceptionReporter(ExceptionReporter):
    """Django's error report (the debug page, the e-mail to ``ADMINS``) with what its filter is not asked for
    masked too: the GET parameters and the request URL's query string (a secret's parameter name hides its value,
    as in POST), the exception's message and notes, the exceptions named as causes, and the source lines shown
    around each frame (a secret written into the code that raised)."""

    def get_traceback_data(self) -> dict[str, Any]:
        data = super().get_traceback_data()
        for frame in data["frames"]:
            if frame.get("exc_cause") is not None:
                frame["exc_cause"] = mask_text(str(frame["exc_cause"]))
            if "context_line" in frame:
                frame["context_line"] = mask_text(frame["context_line"])
                frame["pre_context"] = [mask_text(line) for line in frame["pre_context"]]
                frame["post_context"] = [mask_text(line) for line in frame["post_context"]]
        for name in ("exception_value", "exception_notes"):
            if name in data:
                data[name] = mask_text(data[name])
        if self.request is not None:
            substitute = getattr(self.filter, "cleansed_substitute", MASK)
            query = masked_query(self.request, substitute)
            data["request_GET_items"] = list(query.items())
            address = mask_text(data["request_insecure_uri"].partition("?")[0])
            shown = query.urlencode(safe=_SHOWN_AS_IS)
            data["request_insecure_uri"] = f"{address}?{shown}" if shown else address
        return data
