"""Django's error reports and debug pages never show credentials: not in the settings, the request's POST data and
frame values (the filter), nor in the GET parameters, the request URL, the exception message or a frame variable
named as a secret (the reporter, ``DEFAULT_EXCEPTION_REPORTER``)."""

from __future__ import annotations

import re
import sys
from urllib.parse import quote, quote_plus

from django.conf import settings as django_settings
from django.test import RequestFactory
from django.utils.module_loading import import_string
from django.views.debug import ExceptionReporter

# Built at run time, so the report's source excerpts (which show this file's lines) cannot contain them.
DB_PASSWORD = "-".join(["hunter2", "db", "password"])
REDIS_PASSWORD = "-".join(["redis", "pass", "9f8e7d"])
FORM_PASSWORD = "-".join(["p@ssw0rd", "form"])
FRAME_TOKEN = "sk-live-" + "abcdefghij" * 2


def fail_with_a_token_in_a_local_variable() -> None:
    api_token = FRAME_TOKEN  # noqa: F841 - a frame variable the report shows
    raise RuntimeError("boom")


def test_an_error_report_hides_database_and_redis_urls_and_masks_frame_values(settings) -> None:
    settings.DATABASE_URL = f"postgres://platform:{DB_PASSWORD}@db.internal:5432/platform"
    settings.REDIS_URL = f"redis://:{REDIS_PASSWORD}@cache.internal:6379/0"
    settings.CELERY_BROKER_URL = settings.REDIS_URL
    request = RequestFactory().post("/api/v1/runs", {"password": FORM_PASSWORD, "query": "김하늘"})
    try:
        fail_with_a_token_in_a_local_variable()
    except RuntimeError:
        reporter = ExceptionReporter(request, *sys.exc_info())
        pages = [reporter.get_traceback_html(), reporter.get_traceback_text()]
    for page in pages:
        for secret in (DB_PASSWORD, REDIS_PASSWORD, FORM_PASSWORD, FRAME_TOKEN):
            assert secret not in page
    assert "DATABASE_URL" in pages[0]  # named, not shown


# What the filter is not asked for: the query string (its table and the request URL), the exception's message, and
# a frame variable named as a secret whose value looks like nothing (the reporter, audit.reporting).
QUERY_TOKEN = "".join(["Zq8vY2p", "Lm4Xr7Tn"])
KOREAN_PASSWORD = "-".join(["hunter2", "한글"])
QUERY_KEY = "sk-live-" + "abcdefgh" + "12345678"
LOCAL_PASSWORD = "-".join(["localpw", "123456"])


def fail_with_a_secret_in_the_message_and_a_password_variable() -> None:
    password = LOCAL_PASSWORD  # noqa: F841 - a frame variable the report shows
    raise ValueError(f"boom with {QUERY_KEY}")


def test_an_error_report_masks_the_query_string_the_exception_message_and_a_password_variable() -> None:
    query = {"token": QUERY_TOKEN, "비밀번호": KOREAN_PASSWORD, "q": QUERY_KEY, "name": "김하늘"}
    request = RequestFactory().get("/api/v1/runs", query)
    try:
        fail_with_a_secret_in_the_message_and_a_password_variable()
    except ValueError:
        reporter = import_string(django_settings.DEFAULT_EXCEPTION_REPORTER)(request, *sys.exc_info())
        pages = {"html": reporter.get_traceback_html(), "text": reporter.get_traceback_text()}
    for kind, page in pages.items():
        for secret in (QUERY_TOKEN, KOREAN_PASSWORD, QUERY_KEY, LOCAL_PASSWORD):
            for form in (secret, quote(secret), quote_plus(secret)):
                assert form not in page, (kind, form)
        assert "boom with ***" in page  # the message, masked
        assert "비밀번호" in page and "김하늘" in page  # Korean text is kept, masked only where secret
    assert "Request URL: http://testserver/api/v1/runs?token=********************&" in pages["text"]
    # The HTML page lists each frame's variables (the text report does not).
    assert re.search(r"<td>password</td>\s*<td class=\"code\"><pre>&#x27;\*{20}&#x27;</pre></td>", pages["html"])


def test_masking_the_query_string_leaves_the_other_headers_as_they_were() -> None:
    """A bare flag (``?a``, rebuilt ``a=``) was replaced wherever its letters stood: the report's User-Agent read
    "Mozilla=/5.0 (Ma=cintosh)"."""
    from audit.reporting import MaskingExceptionReporterFilter

    request = RequestFactory().get("/x?a", HTTP_USER_AGENT="Mozilla/5.0 (Macintosh)", HTTP_HOST="alpha.example")
    meta = MaskingExceptionReporterFilter().get_safe_request_meta(request)
    assert (meta["HTTP_USER_AGENT"], meta["HTTP_HOST"]) == ("Mozilla/5.0 (Macintosh)", "alpha.example")
    secret = RequestFactory().get("/x", {"token": "Zq8vY2pLm4Xr7Tn"}, HTTP_REFERER="https://app/?token=Zq8vY2pLm4Xr7Tn")
    meta = MaskingExceptionReporterFilter().get_safe_request_meta(secret)
    assert "Zq8vY2pLm4Xr7Tn" not in meta["QUERY_STRING"] and "Zq8vY2pLm4Xr7Tn" not in meta["HTTP_REFERER"]
